"""Migration 4: the rows table's ``timer_seq`` column (row format version 2).

A key's timer firings are numbered by a counter kept in its row; a timer's
productions take their record ids from it, so a timer that fires again at the
same time and tag (re-set after a late record re-opened its window) produces
under new ids, and a replayed batch under the same ones. Rows written before
this migration read the column as null, which counts from 0 (their earlier
firings had ids without a number, so none repeats).
"""

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
    """Add the column unless the table has it (a store created by this code's migration 1 has it,
    as has one whose earlier run of this step died after the ALTER), then record the row format
    version in the table's properties (setting it again changes nothing)."""
    from delta.tables import DeltaTable

    names = DeltaTable.forPath(spark, layout.rows).toDF().columns
    if COLUMN not in names:
        spark.sql(f"ALTER TABLE delta.`{layout.rows}` ADD COLUMNS ({COLUMN} BIGINT)")
    spark.sql(f"ALTER TABLE delta.`{layout.rows}` SET TBLPROPERTIES "
              f"('deltawheel.format_version' = '{ROW_FORMAT_VERSION}')")
