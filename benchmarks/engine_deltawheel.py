"""The deltawheel engine of the throughput benchmark (WORKLOAD.md, section 2).

Per key, a map ``window_start -> count`` in state and an event-time timer at ``window_end - 1`` that
emits and forgets the window; exactly-once and strong productions are on."""

from __future__ import annotations

import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pyarrow as pa

from .engines_spark import Engine, EngineResult, ProgressFn, SparkSqlEngine, SparkTwsEngine, build_result
from .memory import measured_run_ended
from .workload import WorkloadData

__all__ = ["ENGINES", "DeltaWheelEngine", "window_count", "pipeline_runner"]

WIN = 10_000


def window_count(intervals: int = 4, *, vectorised: bool = False, columnar: bool = False) -> Any:
    """The benchmark's window count over ``intervals`` key intervals (per record, vectorised or columnar)."""
    from deltawheel.executor.computation import RECORD_KEY, Computation

    class WindowCount(Computation):
        name = "window_count"
        inputs = {"events": RECORD_KEY}  # the key column the injector fills (as the Spark engines group by)
        outputs = ("windows",)
        num_intervals = intervals
        codec = "msgpack"

        def process_record(self, ctx: Any, record: Any) -> None:
            if record.late:
                return
            start = record.timestamp_ms - record.timestamp_ms % WIN
            st = ctx.state or {}
            n = st.get(start)
            st[start] = 1 if n is None else n + 1
            ctx.state = st
            if n is None:
                ctx.set_timer(str(start), start + WIN - 1)

        def process_timer(self, ctx: Any, timer: Any) -> None:
            st = dict(ctx.state or {})
            start = int(timer.tag)
            ctx.produce("windows", [ctx.key, start, st.pop(start, 0)], timestamp_ms=start)
            ctx.state = st or None

    if columnar:
        return _columnar(WindowCount)()
    if not vectorised:
        return WindowCount()

    class WindowCountVector(WindowCount):
        def combine(self, records: Any) -> Any:
            ts = records.column("timestamp_ms").to_numpy()
            t = pa.table({"key": records.column("key"), "start": ts - ts % WIN})
            g = t.group_by(["key", "start"], use_threads=False).aggregate([([], "count_all")])
            return g.sort_by([("key", "ascending"), ("start", "ascending")])

        def process_combined(self, ctx: Any, rows: list[tuple[Any, ...]]) -> None:
            st = ctx.state or {}
            for start, n in rows:
                old = st.get(start)
                st[start] = n if old is None else old + n
                if old is None:
                    ctx.set_timer(str(start), start + WIN - 1)
            ctx.state = st

    return WindowCountVector()


def _columnar(base: Any) -> Any:
    """The window count declaring the columnar path (``base``: the per-record class)."""
    from deltawheel.executor.computation import ColumnBatch, ColumnResult
    from deltawheel.statestore.codecs import msgpack_rows

    class WindowCountColumnar(base):  # type: ignore[misc]
        codec = "int64map"  # {window_start: count} as packed int64 pairs; productions as msgpack

        def process_columns(self, batch: ColumnBatch) -> ColumnResult:
            import pyarrow.compute as pc

            recs = batch.records
            ts = recs.column("timestamp_ms").to_numpy()
            new = pa.table({"key": recs.column("key"), "map_key": ts - ts % WIN})
            new = new.group_by(["key", "map_key"], use_threads=False).aggregate([([], "count_all")])
            new = pa.table({"key": new.column("key"), "map_key": new.column("map_key"),
                            "map_value": new.column("count_all").cast(pa.int64())})
            st = pa.concat_tables([batch.state, new]).group_by(["key", "map_key"], use_threads=False) \
                .aggregate([("map_value", "sum")])
            st = pa.table({"key": st.column("key"), "map_key": st.column("map_key"),
                           "map_value": st.column("map_value_sum")})
            ends = pc.add(st.column("map_key"), WIN - 1)
            wm = batch.watermark_ms
            due = pc.less(ends, wm) if wm is not None else pa.repeat(pa.scalar(False), st.num_rows)
            timers = pa.table({"key": st.column("key"), "tag": pc.cast(st.column("map_key"), pa.string()),
                               "time_ms": ends})
            fired = timers.filter(due).sort_by([("key", "ascending"), ("time_ms", "ascending")])
            gone = st.filter(due).sort_by([("key", "ascending"), ("map_key", "ascending")])
            # [key, start, count] per window, the bytes the msgpack codec gives the list (no Python per window)
            values = msgpack_rows(gone.column("key"), gone.column("map_key"), gone.column("map_value"))
            prods = pa.table({"fired": pa.array(range(fired.num_rows), pa.int64()),
                              "stream": pa.repeat(pa.scalar("windows"), fired.num_rows),
                              "value": values, "timestamp_ms": gone.column("map_key")})
            keep = pc.invert(due)
            return ColumnResult(state=st.filter(keep), timers=timers.filter(keep), fired=fired, productions=prods)

    return WindowCountColumnar


@contextmanager
def pipeline_runner(spark: Any, data: WorkloadData, comp: Any, folder: Path, *, store: str | None = None,
                    subdir: str = "", pipeline: str = "bench", watermark_percentile: float | None = None,
                    **runner: Any) -> Iterator[tuple[Any, Any]]:
    """A fresh store below ``folder`` (or ``store``/``subdir``) with its own ZooKeeper, and a
    ``PipelineRunner`` of ``comp`` over the workload's files, one per batch: (layout, runner). The
    ZooKeeper stops on leaving."""
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.process import free_ports

    from deltawheel import migrations
    from deltawheel.servers.zookeeper import EmbeddedZooKeeper

    folder.mkdir(parents=True, exist_ok=True)
    local = tempfile.mkdtemp(prefix="store-", dir=folder)
    layout = StoreLayout(local if store is None else f"{store}/{subdir}/{Path(local).name}")
    zk = EmbeddedZooKeeper(Path(local) / "_zk", port=free_ports(1)[0])
    zk.start()
    try:
        if store is not None and store.startswith("s3a://"):  # commits arbitrated by this ZooKeeper
            from deltawheel.statestore.objectstore.logstore import configure_log_store

            configure_log_store(spark, zk.hosts, chroot="/bench-logstore")
        migrations.apply(spark, layout, dry_run=False)
        inj = ParquetInjector("events", str(data.input_dir), key_column="key", event_time_column="event_time",
                              value_columns=[], record_id_column="record_id", max_files_per_trigger=1,
                              watermark_delay_ms=10_000, watermark_percentile=watermark_percentile)
        yield layout, PipelineRunner(spark, layout, Pipeline(pipeline, (inj,), (comp,)),
                                     zk=ZkConfig(hosts=zk.hosts, chroot=f"/{pipeline}"), end_of_input=False,
                                     **runner)
    finally:
        zk.stop()


class DeltaWheelEngine:
    """The image write path (the default): interval images + one Delta transaction per batch."""

    name = "deltawheel"
    write_path = "auto"  # the image path, on a local folder and on s3a:// alike
    direct_read = True
    vectorised = False  # the computation declares the vectorised path (combine + process_combined)
    columnar = False  # the computation declares the columnar path (process_columns)
    takes_store = True  # run(store=...) puts the store (and its streaming checkpoint) there

    def run(self, data: WorkloadData, *, out_dir: Path, spark: Any, progress: ProgressFn | None = None,
            store: str | None = None) -> EngineResult:
        """Run the window count through a deltawheel pipeline (the store below ``store`` or ``out_dir``)."""
        from deltawheel.executor.tasks.paths import choose_write_path
        from deltawheel.statestore.codecs import get_codec

        # as many key intervals as Spark SQL's state partitions, to split state the same way
        intervals = int(spark.conf.get("spark.sql.shuffle.partitions"))
        comp = window_count(intervals, vectorised=self.vectorised, columnar=self.columnar)
        with pipeline_runner(spark, data, comp, Path(out_dir) / self.name, store=store, subdir=self.name,
                             progress=progress or (lambda _s: None), write_path=self.write_path,
                             direct_read=self.direct_read) as (layout, runner):
            t0 = time.monotonic()
            summary = runner.run()
            wall = time.monotonic() - t0
            measured_run_ended()  # reading the output to check it is not the run's memory
            written = rows_bytes_per_batch(layout.rows_of("window_count"))
            # read while ZooKeeper runs: on s3a:// Delta lists the log through the log store's ZooKeeper
            codec = get_codec("int64map" if self.columnar else "msgpack")  # int64map reads msgpack too
            rows = [codec.decode(r["value"]) for r in
                    spark.read.format("delta").load(layout.stream("windows")).select("value").collect()]
            from pyspark.sql import functions as F

            state = (spark.read.format("delta").load(layout.rows_of("window_count"))
                     .where((F.col("computation") == "window_count") & F.col("state").isNotNull())
                     .select("state").collect())
        reports = summary.reports["window_count"]
        out = pa.table({"key": [r[0] for r in rows], "window_start_ms": pa.array([r[1] for r in rows], pa.int64()),
                        "count": pa.array([r[2] for r in rows], pa.int64())})
        open_events = sum(sum(codec.decode(r["state"]).values()) for r in state)
        late = sum(r.late for r in reports)
        settings = {"exactly_once": True, "strong_productions": True, "num_intervals": type(comp).num_intervals,
                    "user_code": ("process_columns per interval and batch (Arrow group-bys)" if self.columnar else
                                  "combine (an Arrow group-by per key and window) + process_combined per key"
                                  if self.vectorised else "process_record per record"),
                    "codec": "int64map" if self.columnar else "msgpack",
                    "store": layout.root if store is not None else "local folder",
                    "record_value": "none (value_columns=[]: the computation reads key and event time only)",
                    "write_path": _WRITE_PATHS[choose_write_path(self.write_path, layout.root)[0]],
                    "input_read": (f"the files of {sum(r.direct for r in reports if r.records_in)} of "
                                   f"{sum(1 for r in reports if r.records_in)} batches with input read by the image "
                                   "tasks with pyarrow, the others through Spark's scan + shuffle"),
                    "trigger": "availableNow", "maxFilesPerTrigger": 1, "master": spark.sparkContext.master,
                    # per batch commit: bytes of the state files and of the ids files it added
                    "rows_state_bytes_per_batch": None if written is None else [w[0] for w in written],
                    "rows_ids_bytes_per_batch": None if written is None else [w[1] for w in written]}
        return build_result(self.name, data, output=out, wall_s=wall, settings=settings, late_dropped=late,
                            open_events_at_end=open_events, batches=len(reports),
                            batch_s=[r.wall_s for r in reports],
                            notes=["wall_s includes lease acquisition, fencing and the final timers-only step"])


def rows_bytes_per_batch(rows: str) -> list[tuple[int, int]] | None:
    """(state bytes, ids bytes) each rows table batch commit added, oldest first (None: not a local table)."""
    import json

    from deltawheel.statestore.delta.storefs import local_path
    from deltawheel.statestore.writepath.image.files import is_ids_path

    if (local := local_path(rows)) is None:
        return None
    out = []
    for f in sorted(Path(local, "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        try:
            meta = json.loads(info.get("userMetadata") or "{}")
        except ValueError:
            continue
        if not isinstance(meta, dict) or meta.get("kind") not in ("commit", "group"):
            continue
        # a re-added file (a MERGE's new deletion vector) writes no data: only new files count
        adds = [a["add"] for a in actions if "add" in a and not a["add"].get("deletionVector")]
        out.append((sum(int(a["size"]) for a in adds if not is_ids_path(a["path"])),
                    sum(int(a["size"]) for a in adds if is_ids_path(a["path"]))))
    return out


class DeltaWheelMergeEngine(DeltaWheelEngine):
    """The same computation on the MERGE write path (kept to decide the write path by measurement)."""

    name = "deltawheel_merge"
    write_path = "merge"


_WRITE_PATHS = {
    "image": "interval images written by the tasks, one Delta transaction per batch (remove + add) "
             "+ blind-append delivery with SetTransaction per interval",
    "merge": "fenced Delta MERGE per batch + insert-only MERGE delivery",
}


class DeltaWheelJvmReadEngine(DeltaWheelEngine):
    """The image path with the input read by Spark instead of by the tasks."""

    name = "deltawheel_jvm_read"
    direct_read = False


class DeltaWheelVectorEngine(DeltaWheelEngine):
    """The image path declaring the vectorised path (late records still go through ``process_record``)."""

    name = "deltawheel_vector"
    vectorised = True


class DeltaWheelColumnarEngine(DeltaWheelEngine):
    """The image path declaring the columnar path (keys with late records run per record)."""

    name = "deltawheel_columnar"
    columnar = True


#: the throughput benchmark's engines by name: Spark's own operators and deltawheel's write paths
ENGINES: dict[str, Callable[[], Engine]] = {
    "spark_sql": SparkSqlEngine, "spark_tws": SparkTwsEngine, "deltawheel": DeltaWheelEngine,
    "deltawheel_merge": DeltaWheelMergeEngine, "deltawheel_jvm_read": DeltaWheelJvmReadEngine,
    "deltawheel_vector": DeltaWheelVectorEngine, "deltawheel_columnar": DeltaWheelColumnarEngine}
