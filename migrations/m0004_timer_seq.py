"""Migration 4: the rows table's ``timer_seq`` column (row format version 2), numbering a key's timer
firings, from which their productions take record ids: a timer firing again produces under new ids, a
replay under the same ones. Older rows read null (0)."""

from __future__ import annotations

from typing import Any

from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import ROW_FORMAT_VERSION

__all__ = ["VERSION", "NAME", "COLUMN", "describe", "apply"]

VERSION = 4
NAME = "timer_seq"
COLUMN = "timer_seq"


def describe(layout: StoreLayout) -> str:
    """One line saying what :func:`apply` does to ``layout``."""
    return (f"add the column {COLUMN} BIGINT (per-key timer firing counter) to {layout.rows}; "
            f"row format version {ROW_FORMAT_VERSION}")


def apply(spark: Any, layout: StoreLayout) -> None:
    """Add the column unless the table has it, then record the row format version in its properties."""
    from delta.tables import DeltaTable

    names = DeltaTable.forPath(spark, layout.rows).toDF().columns
    if COLUMN not in names:
        spark.sql(f"ALTER TABLE delta.`{layout.rows}` ADD COLUMNS ({COLUMN} BIGINT)")
    spark.sql(f"ALTER TABLE delta.`{layout.rows}` SET TBLPROPERTIES "
              f"('deltawheel.format_version' = '{ROW_FORMAT_VERSION}')")
