"""Idempotent writes of productions, dead letters and late records: an insert-only MERGE by record id."""

from __future__ import annotations

import itertools
import random
import time
from typing import Any, Iterable, Mapping, Sequence

from ..delta.maintenance import note_merge
from ..exceptions import CommitConflictError
from ..layout import StoreLayout
from ..rowtable.fencing import translate_commit_error
from ..rowtable.frames import local_frame
from ..rowtable.rows import Production
from .streams import STREAM_FORMAT_VERSION, ensure_stream_table

__all__ = ["deliver_frame", "deliver_productions", "undelivered", "record_dead_letters", "record_late"]

_ids = itertools.count()
_PROD_DDL = ("production_id STRING, stream STRING, key STRING, value BINARY, timestamp_ms BIGINT, codec STRING, "
             "commit_id STRING")


def _insert_missing(target: str, src: Any, *, on: str, retries: int = 20) -> None:
    view = f"dw_ins_{next(_ids)}"
    # foreachBatch frames belong to the query's cloned session: view and MERGE must live there too
    spark = src.sparkSession
    src.createOrReplaceTempView(view)
    sql = f"MERGE INTO delta.`{target}` t USING {view} s ON {on} WHEN NOT MATCHED THEN INSERT *"
    try:
        for attempt in itertools.count(1):
            try:
                spark.sql(sql)
                note_merge(spark, target)  # its log checkpoint, if due: in the background
                return
            except Exception as exc:
                err = translate_commit_error(exc, sequencers={})
                if not isinstance(err, CommitConflictError) or attempt > retries:
                    raise
                time.sleep(random.uniform(0.02, 0.05 * min(attempt, 8)))
    finally:
        spark.catalog.dropTempView(view)


def deliver_frame(spark: Any, layout: StoreLayout, prods: Any, *, streams: Sequence[str], producer: str,
                  commit_id: str | None = None) -> None:
    """Deliver productions to their stream tables; ``commit_id``: when ``prods`` has no such column."""
    from pyspark.sql import functions as F

    # one output stream (the common case): no extra job to find which streams got records
    present = list(streams) if len(streams) == 1 else [
        r["stream"] for r in prods.select("stream").distinct().collect()]
    for stream in present:
        if stream not in streams:
            continue
        path = ensure_stream_table(spark, layout, stream)
        src = prods.where(F.col("stream") == stream).select(
            F.col("production_id").alias("record_id"), "key", "value", "codec", "timestamp_ms",
            F.timestamp_millis("timestamp_ms").alias("event_time"), F.lit(producer).alias("producer"),
            (F.col("commit_id") if "commit_id" in prods.columns else F.lit(commit_id).cast("string")
             ).alias("commit_id"),
            F.lit(STREAM_FORMAT_VERSION).alias("format_version"))
        _insert_missing(path, src, on="t.record_id = s.record_id")


def deliver_productions(spark: Any, layout: StoreLayout, prods: Iterable[Production], *, producer: str,
                        commit_ids: Mapping[str, str | None] | None = None) -> int:
    """Deliver checkpointed productions (the recovery path); returns how many were given.
    ``commit_ids``: production id -> the id of the rows commit that checkpointed it."""
    ids = commit_ids or {}
    rows = [{**p.to_row(), "commit_id": ids.get(p.production_id)} for p in prods]
    if not rows:
        return 0
    df = local_frame(spark, rows, _PROD_DDL)
    deliver_frame(spark, layout, df, streams=sorted({r["stream"] for r in rows}), producer=producer)
    return len(rows)


def undelivered(spark: Any, layout: StoreLayout, prods: Sequence[Production]) -> list[Production]:
    """``prods`` without those already in their stream (where Python reads the files; else all)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from ..delta.deletionvectors import live_table
    from ..delta.log import read_snapshot
    from ..delta.storefs import table_files
    from ..delta.txn import decode_path

    landed: set[str] = set()
    unknown: set[str] = set()
    for stream in sorted({p.stream for p in prods}):
        files = table_files(spark, layout.stream(stream))
        snap = None if files is None else read_snapshot(files)
        if files is None or snap is None:
            unknown.add(stream)
            continue
        ids = pa.array(sorted({p.production_id for p in prods if p.stream == stream}), pa.string())
        for add in snap.adds:
            dv = add.get("deletionVector")
            col = live_table(files, decode_path(str(add["path"])), dict(dv) if dv else None,
                             columns=["record_id"]).column(0)
            landed.update(col.filter(pc.is_in(col, value_set=ids)).to_pylist())
    return [p for p in prods if p.stream in unknown or p.production_id not in landed]


#: a dead letter's identity (a retry adds no second row): its record id, else stream and source position
_DEAD_LETTER_ID = ("coalesce(nullif({t}.record_id, ''), "
                   "concat('no record_id ', {t}.stream, ' ', {t}.source_position))")


def record_dead_letters(spark: Any, layout: StoreLayout, frame: Any, *, computation: str, batch_id: int) -> None:
    """Write dead letters (input with ``_bad``, or the tasks'), idempotent by :data:`_DEAD_LETTER_ID`."""
    from pyspark.sql import functions as F

    if "_bad" in frame.columns:
        frame = frame.select("record_id", "key", F.col("value").alias("raw_value"), F.col("_bad").alias("error"),
                             "position", F.col("timestamp_ms").alias("event_time_ms"), "stream")
    src = frame.select(F.lit(computation).alias("computation"), "stream", "record_id",
                       F.when(F.col("key").startswith("\x00"), None).otherwise(F.col("key")).alias("key"),
                       "raw_value", "error", F.col("position").alias("source_position"), "event_time_ms",
                       *_recorded(batch_id))
    _insert_missing(layout.dead_letters, src,
                    on=f"t.computation = s.computation AND {_DEAD_LETTER_ID.format(t='t')} = "
                       f"{_DEAD_LETTER_ID.format(t='s')}")


def _recorded(batch_id: int) -> list[Any]:
    from pyspark.sql import functions as F

    return [F.lit(batch_id).cast("bigint").alias("batch_id"),
            F.lit(int(time.time() * 1000)).cast("bigint").alias("recorded_ms"),
            F.lit(1).alias("format_version")]


def record_late(spark: Any, layout: StoreLayout, frame: Any, *, computation: str, watermark_ms: int | None,
                batch_id: int) -> int:
    """Write records behind the watermark to ``late_data``; returns how many."""
    from pyspark.sql import functions as F

    src = frame.select(F.lit(computation).alias("computation"), "stream", "record_id", "key", "value", "codec",
                       F.col("timestamp_ms").alias("event_time_ms"),
                       F.lit(watermark_ms).cast("bigint").alias("watermark_ms"),
                       F.lit("behind the input low watermark").alias("reason"), *_recorded(batch_id))
    n = src.count()
    _insert_missing(layout.late_data, src, on="t.computation = s.computation AND t.record_id = s.record_id")
    return int(n)
