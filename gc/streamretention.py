"""Stream retention that never undoes exactly-once delivery: a record whose production a rows commit still
holds checkpointed is kept. The rows tables are read after the stream's version ``S``: a record in ``S``
was delivered after its commit, which either still holds it or was cleared by a later one."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import reduce
from typing import Any

from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.fencing import on_conflict_again
from deltawheel.statestore.rowtable.tables import rows_tables

__all__ = ["StreamRetention", "stream_retention"]

_views = itertools.count()


@dataclass(frozen=True)
class StreamRetention:
    """One stream table's ``removed`` records older than the cutoff, and ``held`` ones still checkpointed."""

    removed: int
    held: int


def _version(spark: Any, path: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["version"])


def stream_retention(spark: Any, layout: StoreLayout, path: str, *, stream: str, cutoff_ms: int,
                     rows_table: bool, apply: bool) -> StreamRetention:
    """Remove (``apply``) or count the records before ``cutoff_ms`` whose production is not checkpointed
    in a computation's rows table (``rows_table`` False: none checked, the store has no rows)."""
    from pyspark.sql import functions as F

    old = (spark.read.format("delta").option("versionAsOf", _version(spark, path)).load(path)
           .where(F.col("timestamp_ms") < F.lit(int(cutoff_ms))).select("record_id"))
    # listed and read after the stream's version (see the module's header)
    tables = list(rows_tables(spark, layout).values()) if rows_table else []
    if tables:
        frames = [spark.read.format("delta").option("versionAsOf", _version(spark, t)).load(t)
                  .where(F.size("pending") > 0).select(F.explode("pending").alias("p")) for t in tables]
        held_ids = (reduce(lambda a, b: a.unionByName(b), frames)
                    .where(F.col("p.stream") == stream).select(F.col("p.production_id").alias("record_id")))
        doomed = old.join(held_ids.distinct(), "record_id", "left_anti").localCheckpoint(eager=True)
    else:
        doomed = old.localCheckpoint(eager=True)
    removed = doomed.count()
    held = old.count() - removed
    if apply and removed:
        view = f"dw_gc_retention_{next(_views)}"
        doomed.createOrReplaceTempView(view)
        try:
            on_conflict_again(lambda: spark.sql(f"MERGE INTO delta.`{path}` t USING {view} s "
                                                "ON t.record_id = s.record_id WHEN MATCHED THEN DELETE"))
        finally:
            spark.catalog.dropTempView(view)
    return StreamRetention(removed=int(removed), held=int(held))
