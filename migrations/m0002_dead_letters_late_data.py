"""Migration 2: the ``dead_letters`` and ``late_data`` tables."""

from __future__ import annotations

from typing import Any

from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.tabledefs import DEAD_LETTERS_COLUMNS, LATE_DATA_COLUMNS

from ._ddl import create_table

__all__ = ["VERSION", "NAME", "DEAD_LETTERS_COLUMNS", "LATE_DATA_COLUMNS", "describe", "apply"]

VERSION = 2
NAME = "dead_letters_late_data"


def describe(layout: StoreLayout) -> str:
    """One line saying what :func:`apply` does to ``layout``."""
    return f"create the tables {layout.dead_letters} and {layout.late_data}"


def apply(spark: Any, layout: StoreLayout) -> None:
    """Create both tables; tables that already exist are left alone (idempotent)."""
    create_table(spark, layout.dead_letters, DEAD_LETTERS_COLUMNS,
                 properties={"deltawheel.table": "dead_letters", "deltawheel.format_version": "1"})
    create_table(spark, layout.late_data, LATE_DATA_COLUMNS,
                 properties={"deltawheel.table": "late_data", "deltawheel.format_version": "1"})
