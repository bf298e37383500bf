"""Migration 5: column comments on the store's tables: one ``ALTER TABLE ... ALTER COLUMN ... COMMENT``
commit per existing table that lacks them; stream tables created later get theirs on creation."""

from __future__ import annotations

from typing import Any

from deltawheel.statestore import comments
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.writepath.streams import list_streams

__all__ = ["VERSION", "NAME", "describe", "apply"]

VERSION = 5
NAME = "column_comments"


def describe(layout: StoreLayout) -> str:
    """One line saying what :func:`apply` does to ``layout``."""
    return (f"comment the columns of {layout.rows}, {layout.dead_letters}, {layout.late_data} "
            "and of every stream table (what each column means)")


def apply(spark: Any, layout: StoreLayout) -> None:
    """Comment the tables' columns (a table whose comments are all set is left alone)."""
    comments.comment_table(spark, layout.rows, comments.ROWS)
    comments.comment_table(spark, layout.dead_letters, comments.DEAD_LETTERS)
    comments.comment_table(spark, layout.late_data, comments.LATE_DATA)
    for name in list_streams(spark, layout):
        comments.comment_table(spark, layout.stream(name), comments.STREAM)
