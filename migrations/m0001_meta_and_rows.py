"""Migration 1: the ``_meta`` table (applied migrations) and the rows table."""

from __future__ import annotations

from typing import Any

from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import ROW_FORMAT_VERSION, rows_schema_ddl

from ._ddl import create_table

__all__ = ["VERSION", "NAME", "META_COLUMNS", "describe", "apply"]

VERSION = 1
NAME = "meta_and_rows"
META_COLUMNS = "version INT NOT NULL, name STRING, applied_ms BIGINT, deltawheel_version STRING"


def describe(layout: StoreLayout) -> str:
    """One line saying what :func:`apply` does to ``layout``."""
    return (f"create the migrations table {layout.meta} and the rows table {layout.rows} "
            "(partitioned by computation, interval; deletion vectors on)")


def apply(spark: Any, layout: StoreLayout) -> None:
    """Create both tables; tables that already exist are left alone (idempotent)."""
    create_table(spark, layout.meta, META_COLUMNS, properties={"deltawheel.table": "meta"})
    create_table(spark, layout.rows, rows_schema_ddl(), partitioned_by=("computation", "interval"),
                 properties={"delta.enableDeletionVectors": "true", "deltawheel.table": "rows",
                             "deltawheel.format_version": str(ROW_FORMAT_VERSION)})
