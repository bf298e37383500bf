"""One run of ``deltawheel bench state`` in a process of its own (``benchmarks/largestate.py``).

    python -m deltawheel.benchmarks.largestate_job SPEC.json RESULT.json

SPEC's ``engine``: ``deltawheel`` (every file of ``input`` through a pipeline into the store ``store``,
its ZooKeeper's data in ``store/_zk``) or ``spark_sql`` (``groupBy(key)`` with RocksDB state). A
deltawheel run over a store that already holds the earlier files is a restart: the query resumes
at its checkpoint and runs the new ones. The image cache's bound and trace come from the
environment the parent gives (``DELTAWHEEL_IMAGE_CACHE_BYTES``, ``DELTAWHEEL_IMAGE_CACHE_TRACE``)."""

from __future__ import annotations

import time

STARTED = time.time()  # before the imports: a restart's seconds count from the process's start

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from deltawheel.executor.computation import RECORD_KEY, Computation  # noqa: E402

PIPELINE = "statebench"
INPUT_DDL = "record_id string, key string, event_time timestamp"  # UTC instants in the files


class KeyTotals(Computation):
    """Each key's record count and latest event time, kept for ever (no timer, no production)."""

    name = "totals"
    inputs = {"events": RECORD_KEY}
    outputs = ()
    num_intervals = 16
    codec = "msgpack"

    def process_record(self, ctx: Any, record: Any) -> None:
        """Count the record; remember its event time."""
        st = ctx.state
        ctx.state = [1 if st is None else st[0] + 1, record.timestamp_ms]


def _totals(intervals: int) -> KeyTotals:
    """KeyTotals over ``intervals`` intervals (a class attribute: the framework reads the class's)."""
    cls: type[KeyTotals] = type("KeyTotals", (KeyTotals,), {"num_intervals": intervals, "__doc__": KeyTotals.__doc__})
    return cls()


def run_deltawheel(spec: dict[str, Any], spark: Any) -> dict[str, Any]:
    """The pipeline over the input folder, to its end; per batch seconds, and when each committed."""
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.process import free_ports

    from deltawheel import migrations
    from deltawheel.servers.zookeeper import EmbeddedZooKeeper

    store = Path(spec["store"])
    store.mkdir(parents=True, exist_ok=True)
    layout = StoreLayout(str(store))
    zk = EmbeddedZooKeeper(store / "_zk", port=free_ports(1)[0])
    zk.start()
    marks: list[tuple[float, str]] = []

    def progress(line: str) -> None:
        marks.append((time.time(), line))
        if spec.get("verbose") or os.environ.get("DELTAWHEEL_BENCH_VERBOSE"):
            print(line, flush=True)

    try:
        migrations.apply(spark, layout, dry_run=False)
        inj = ParquetInjector("events", spec["input"], key_column="key", event_time_column="event_time",
                              value_columns=[], record_id_column="record_id", max_files_per_trigger=1,
                              watermark_delay_ms=10_000, max_event_ahead_ms=None)
        comp = _totals(int(spec["intervals"]))
        runner = PipelineRunner(spark, layout, Pipeline(PIPELINE, (inj,), (comp,)),
                                zk=ZkConfig(hosts=zk.hosts, chroot=f"/{PIPELINE}"), end_of_input=False,
                                progress=progress)
        t0 = time.time()
        summary = runner.run()
        t1 = time.time()
        reports = [r for r in summary.reports["totals"] if not r.timers_only]
        total = _state_total(spark, layout) if spec.get("check", True) else None
        live = spark.sql(f"DESCRIBE DETAIL delta.`{layout.rows_of('totals')}`").first()["sizeInBytes"]
    finally:
        zk.stop()
    batch_ends = [t for t, line in marks if line.startswith("totals batch ")]
    first_batch = batch_ends[0] if batch_ends else None
    started = next((t for t, line in marks if ": started in" in line), None)
    return {"wall_s": round(t1 - t0, 3), "records": sum(r.records_in for r in reports),
            "duplicates": sum(r.duplicates for r in reports),
            "batches": [{"records": r.records_in, "wall_s": round(r.wall_s, 3), "commit_s": round(r.commit_s, 3),
                         "intervals_run": r.intervals_run, "images_read": r.images_read, "direct": r.direct,
                         "steps_s": dict(r.steps_s)} for r in reports],
            "state_records": total, "rows_live_bytes": int(live),  # the rows table's current files
            # a restart's start: seconds from the process's start to each step
            "executor_started_s": None if started is None else round(started - STARTED, 3),
            "first_batch_s": None if first_batch is None else round(first_batch - STARTED, 3),
            "run_started_s": round(t0 - STARTED, 3),
            # the driver's lines up to the first batch, seconds from the process's start
            "lines": [(round(t - STARTED, 3), line[:200]) for t, line in marks
                      if first_batch is None or t <= first_batch][:60]}


def _state_total(spark: Any, layout: Any) -> dict[str, int]:
    """The keys in the store and the sum of their counts (each record counted once: the check)."""
    from deltawheel.statestore.codecs import get_codec

    codec = get_codec("msgpack")
    df = spark.read.format("delta").load(layout.rows_of("totals")).where("state IS NOT NULL").select("state")
    keys = counted = 0
    for batch in df.toArrow().to_batches():
        col = batch.column(0)
        keys += len(col) - col.null_count
        counted += sum(codec.decode(v)[0] for v in col.to_pylist() if v is not None)
    return {"keys": keys, "counted": counted}


def run_spark_sql(spec: dict[str, Any], spark: Any) -> dict[str, Any]:
    """``groupBy(key).agg(count, max(event_time))`` in update mode, RocksDB state, into a no-op sink."""
    from pyspark.sql import functions as F

    from .engines_spark import ROCKSDB_PROVIDER

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
    spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    spark.conf.set("spark.sql.shuffle.partitions", str(spec["intervals"]))
    ckpt = str(Path(spec["store"]) / "checkpoint")
    agg = (spark.readStream.schema(INPUT_DDL).option("maxFilesPerTrigger", 1).parquet(spec["input"])
           .groupBy("key").agg(F.count("*").alias("n"), F.max("event_time").alias("last")))
    batch_s: list[float] = []

    def sink(df: Any, _batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    t0 = time.time()
    q = (agg.writeStream.outputMode("update").foreachBatch(sink).option("checkpointLocation", ckpt)
         .trigger(availableNow=True).queryName("statebench_sql").start())
    q.awaitTermination()
    t1 = time.time()
    for p in q.recentProgress:
        d = p.get("durationMs", {}) if isinstance(p, dict) else {}
        if p.get("numInputRows", 0):
            batch_s.append(round(d.get("triggerExecution", 0) / 1000, 3))
    rows = [p for p in q.recentProgress if p.get("numInputRows", 0)]
    total = None
    if spec.get("check", True):
        st = spark.read.format("statestore").load(ckpt)
        got = st.selectExpr("count(*) AS k", "coalesce(sum(value.`count`), 0) AS s").first()
        total = {"keys": int(got["k"]), "counted": int(got["s"])}
    return {"wall_s": round(t1 - t0, 3), "records": sum(int(p["numInputRows"]) for p in rows),
            "batches": [{"wall_s": s} for s in batch_s], "state_records": total,
            "progress_kept": len(q.recentProgress)}


def main(argv: list[str]) -> int:
    """Run the spec's engine; write its result (with the session's start seconds) as JSON."""
    from deltawheel.benchmarks.isolated import build_bench_session

    spec = json.loads(Path(argv[0]).read_text())
    spark, session_s = build_bench_session({"spark.sql.shuffle.partitions": str(spec["intervals"]),
                                            **spec.get("conf", {})}, app_name="deltawheel-bench-state")
    out = (run_deltawheel if spec["engine"] == "deltawheel" else run_spark_sql)(spec, spark)
    out["session_s"] = session_s
    Path(argv[1]).write_text(json.dumps(out))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
