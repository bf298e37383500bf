"""Migration 6: Delta log checkpoints written in the background, not inside the commits: sets
``delta.checkpointInterval`` to 2^31 - 1 on the rows, side and existing stream tables."""

from __future__ import annotations

from typing import Any

from deltawheel.statestore.delta.maintenance import COMMIT_CHECKPOINT_INTERVAL
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.sqltext import sql_path
from deltawheel.statestore.writepath.streams import list_streams

__all__ = ["VERSION", "NAME", "describe", "apply", "tables"]

VERSION = 6
NAME = "background_log_checkpoints"
_KEY = "delta.checkpointInterval"


def tables(spark: Any, layout: StoreLayout) -> list[str]:
    """The tables whose logs are checkpointed in the background: rows, dead letters, late data, streams."""
    return [layout.rows, layout.dead_letters, layout.late_data,
            *(layout.stream(s) for s in list_streams(spark, layout))]


def describe(layout: StoreLayout) -> str:
    """One line saying what :func:`apply` does to ``layout``."""
    return (f"set {_KEY} = {COMMIT_CHECKPOINT_INTERVAL} on {layout.rows}, {layout.dead_letters}, "
            f"{layout.late_data} and every stream table: their log checkpoints are written in the "
            "background, not inside the commits")


def apply(spark: Any, layout: StoreLayout) -> None:
    """Set the property where it differs (a table that has it is left alone)."""
    for path in tables(spark, layout):
        props = {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {sql_path(path)}").collect()}
        if props.get(_KEY) != str(COMMIT_CHECKPOINT_INTERVAL):
            spark.sql(f"ALTER TABLE {sql_path(path)} SET TBLPROPERTIES ('{_KEY}' = '{COMMIT_CHECKPOINT_INTERVAL}')")
