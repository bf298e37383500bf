"""Stream retention that never undoes exactly-once delivery (``deltawheel gc --stream-retention-hours``).

A strong production is checkpointed in its rows commit, delivered after it, and cleared from the
rows by the interval's next commit. Until then a restart (or a new owner's recovery) redelivers
it; where that redelivery is an insert of the production ids absent from the stream table (the
MERGE path, and the image path when the stream's version cannot tell), a record retention had
removed would be inserted a second time. So retention removes only records whose production no
rows commit still holds checkpointed:

1. the stream's records older than the cutoff are taken from the table's current version ``S``;
2. the productions checkpointed in the rows table are read from its current version, read after
   ``S``: a record in ``S`` was delivered after its commit, so that commit is in this version,
   and either still holds it (kept) or a later commit cleared it (no redelivery will come);
3. those records of ``S`` not held are deleted (a MERGE by record id): a record delivered after
   ``S`` is left for the next run whatever its timestamp.

Records kept this way are removed by a later run, once the next batch of their interval cleared
them (a stopped pipeline keeps its last batch's productions checkpointed until it runs again).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from deltawheel.statestore.layout import StoreLayout

__all__ = ["StreamRetention", "stream_retention"]

_views = itertools.count()


@dataclass(frozen=True)
class StreamRetention:
    """What stream retention found in one stream table: ``removed`` records older than the cutoff
    (deleted when applied), ``held`` older ones kept because their production is still
    checkpointed."""

    removed: int
    held: int


def _version(spark: Any, path: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["version"])


def stream_retention(spark: Any, layout: StoreLayout, path: str, *, stream: str, cutoff_ms: int,
                     rows_table: bool, apply: bool) -> StreamRetention:
    """Remove (``apply``) or count the records of the stream table at ``path`` with a timestamp
    before ``cutoff_ms`` whose production is not checkpointed in the rows table (``rows_table``:
    the store has one)."""
    from pyspark.sql import functions as F

    old = (spark.read.format("delta").option("versionAsOf", _version(spark, path)).load(path)
           .where(F.col("timestamp_ms") < F.lit(int(cutoff_ms))).select("record_id"))
    if rows_table:  # read after the stream's version (see the module's header)
        rows = spark.read.format("delta").option("versionAsOf", _version(spark, layout.rows)).load(layout.rows)
        held_ids = (rows.where(F.size("pending") > 0).select(F.explode("pending").alias("p"))
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
            spark.sql(f"MERGE INTO delta.`{path}` t USING {view} s ON t.record_id = s.record_id "
                      "WHEN MATCHED THEN DELETE")
        finally:
            spark.catalog.dropTempView(view)
    return StreamRetention(removed=int(removed), held=int(held))
