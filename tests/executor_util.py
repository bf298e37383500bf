"""Helpers for executor tests: a windowed counter, input batches, and running an executor."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from deltawheel.executor.computation import RECORD_KEY, Computation, ErrorPolicy, LatePolicy
from deltawheel.executor.protocol.executor import ComputationExecutor
from deltawheel.executor.protocol.faults import FaultPoint
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.writepath.streams import stream_schema_ddl
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.leases import LeaseManager
from pyspark import cloudpickle

J = get_codec("json")

# Spark's Python workers cannot import test modules: ship this module's classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class BucketCounter(Computation):
    """Counts records per key and 10 s bucket; emits each bucket once the watermark passes it."""

    name = "buckets"
    inputs = {"events": "q"}
    outputs = ("counts",)
    num_intervals = 4

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        start = record.timestamp_ms - record.timestamp_ms % 10_000
        st = ctx.state or {}
        st[str(start)] = st.get(str(start), 0) + 1
        ctx.state = st
        ctx.set_timer(str(start), start + 9_999)

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        st = dict(ctx.state or {})
        n = st.pop(timer.tag, 0)
        ctx.produce("counts", {"q": ctx.key, "start": int(timer.tag), "n": n}, timestamp_ms=int(timer.tag))
        ctx.state = st or None


class WeakCounter(BucketCounter):
    """The same counter with weak productions; a delivery slower than 0.3 s is a straggler."""

    name = "weak"
    strong_productions = False
    straggler_timeout_s = 0.3


class Picky(BucketCounter):
    """Refuses records flagged "boom" (error_policy set by the test)."""

    name = "picky"

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        if record.value.get("boom"):
            raise ValueError("no booms here")
        super().process_record(ctx, record)


class ByRecordKey(BucketCounter):
    """Keyed by the stream's own key column (``RECORD_KEY``), as the benchmark's computation."""

    name = "by_record_key"
    inputs = {"events": RECORD_KEY}


class RoutedLate(ByRecordKey):
    """Bucket counts keyed by the key column; late records go to the late-data table, and the
    records of key k6 at whole 1.2 s are refused into the dead letters (their source position
    is looked up by the driver)."""

    name = "routed"
    late_policy = LatePolicy.ROUTE
    error_policy = ErrorPolicy.DEAD_LETTER

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        if ctx.key == "k6" and record.timestamp_ms % 1_200 == 0:
            raise ValueError("no k6 at whole 1.2 s")
        super().process_record(ctx, record)


class Copier(Computation):
    """Produces each record once more, to ``copies`` (first stage of a two-stage pipeline)."""

    name = "copier"
    inputs = {"events": RECORD_KEY}
    outputs = ("copies",)
    num_intervals = 2

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.produce("copies", {"id": record.record_id}, timestamp_ms=record.timestamp_ms)


class CopyCounter(Computation):
    """Counts the copies per key (second stage)."""

    name = "copy_counter"
    inputs = {"copies": RECORD_KEY}
    outputs = ()
    num_intervals = 2

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1


def events(spark: Any, items: list[tuple[str, str, int]]) -> Any:
    """A stream-schema DataFrame of (record_id, query, event ms)."""
    rows = [{"record_id": rid, "key": "", "value": J.encode({"q": q}), "codec": "json", "timestamp_ms": ts,
             "event_time": None, "producer": "test", "commit_id": f"pos-{rid}", "format_version": 1}
            for rid, q, ts in items]
    return spark.createDataFrame(rows, schema=stream_schema_ddl().replace(" NOT NULL", ""))


def start_executor(spark: Any, layout: Any, zk_config: Any, comp: Computation, *,
                   faults: Callable[[FaultPoint, int], None] | None = None, writer: str = "w",
                   write_path: str = "auto", watermarks: bool = False, clock: Any = None,
                   positions: Any = None) -> tuple[Any, Any]:
    """An executor holding all its intervals (``watermarks``: publishing to a watermark authority
    of pipeline "test", ``ex.authority``)."""
    from deltawheel.statestore.zk.watermarks import WatermarkAuthority

    client = connect(zk_config)
    leases = LeaseManager(client, pipeline="test", owner=writer)
    owner = IntervalOwner(RowStore(spark, layout, writer=writer), leases, comp.name,
                          num_intervals=type(comp).num_intervals)
    authority = WatermarkAuthority(client, pipeline="test") if watermarks else None
    more = {} if clock is None else {"clock": clock}
    ex = ComputationExecutor(spark, layout, comp, owner=owner, faults=faults, progress=print, write_path=write_path,
                             authority=authority, positions=positions, **more)
    ex.start(wait_s=20)
    return ex, client


def stop_executor(ex: Any, client: Any) -> None:
    """Stop an executor from :func:`start_executor` (settles its delivery, gives its leases back)."""
    ex.stop()
    client.stop()
    client.close()


def stream_rows(spark: Any, layout: Any, stream: str) -> list[tuple[Any, ...]]:
    df = spark.read.format("delta").load(layout.stream(stream))
    return sorted((r["record_id"], r["key"], json.dumps(J.decode(r["value"]), sort_keys=True), r["timestamp_ms"])
                  for r in df.collect())


def store_sql(spark: Any, layout: Any, statement: str) -> list[Any]:
    """``statement``'s rows over the store's views, defined as ``deltawheel sql`` defines them: only
    the views the statement names (``register_views`` defines every view of the store)."""
    from deltawheel.statestore.inspection.views import StoreViews

    StoreViews(spark, layout).for_statement(statement)
    return list(spark.sql(statement).collect())


def state_of(spark: Any, layout: Any, computation: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(layout.rows_of(computation)).where(
        (F.col("computation") == computation) & ~F.col("key").startswith("\x00"))
    return {r["key"]: (None if r["state"] is None else J.decode(r["state"]),
                       sorted((t["tag"], t["time_ms"]) for t in r["timers"])) for r in df.collect()}


def columnar_window_count(batch: Any, win: int) -> tuple[Any, Any, Any, Any, Any]:
    """The tests' columnar window count over a ``ColumnBatch`` (windows of ``win`` ms, a count per
    key and window, a timer at each window's end): (state, timers, due, fired, done) -- the new
    state and timers, which of them the watermark closes, the fired timers and the closed windows'
    state rows, both in key order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ts = batch.records.column("timestamp_ms").to_numpy()
    new = (pa.table({"key": batch.records.column("key"), "map_key": ts - ts % win})
           .group_by(["key", "map_key"], use_threads=False).aggregate([([], "count_all")]))
    new = pa.table({"key": new.column("key"), "map_key": new.column("map_key"),
                    "map_value": new.column("count_all").cast(pa.int64())})
    st = (pa.concat_tables([batch.state, new])
          .group_by(["key", "map_key"], use_threads=False).aggregate([("map_value", "sum")])
          .rename_columns(["key", "map_key", "map_value"]))
    ends = pc.add(st.column("map_key"), win - 1)
    timers = pa.table({"key": st.column("key"), "tag": pc.cast(st.column("map_key"), pa.string()), "time_ms": ends})
    wm = batch.watermark_ms
    due = pc.less(ends, wm) if wm is not None else pa.repeat(pa.scalar(False), st.num_rows)
    fired = timers.filter(due).sort_by([("key", "ascending"), ("time_ms", "ascending")])
    done = st.filter(due).sort_by([("key", "ascending"), ("map_key", "ascending")])
    return st, timers, due, fired, done
