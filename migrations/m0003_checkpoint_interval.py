"""Migration 3: Delta checkpoints of the rows table every 100 commits instead of 10 (docs/performance.md)."""

from __future__ import annotations

from typing import Any

from deltawheel.statestore.layout import StoreLayout

__all__ = ["VERSION", "NAME", "CHECKPOINT_INTERVAL", "describe", "apply"]

VERSION = 3
NAME = "checkpoint_interval"
CHECKPOINT_INTERVAL = 100


def describe(layout: StoreLayout) -> str:
    """One line saying what :func:`apply` does to ``layout``."""
    return f"set delta.checkpointInterval = {CHECKPOINT_INTERVAL} on {layout.rows}"


def apply(spark: Any, layout: StoreLayout) -> None:
    """Set the table property (idempotent: setting it again changes nothing)."""
    spark.sql(f"ALTER TABLE delta.`{layout.rows}` SET TBLPROPERTIES "
              f"('delta.checkpointInterval' = '{CHECKPOINT_INTERVAL}')")
