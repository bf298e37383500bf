"""The continuous job ``deltawheel bench restart`` kills and restarts (``benchmarks/restart.py``).

    python -m deltawheel.benchmarks.restart_job STORE INPUT ZK_HOSTS CHROOT INSTANCE SESSION_TIMEOUT_S [standby]

Runs until killed (INSTANCE ``-``: no instance name; ``standby``: a standby instance), printing ``STEP <name> <unix seconds>`` as
each step of its start ends and ``BATCH <json>`` per committed input batch."""

from __future__ import annotations

import time

STARTED = time.time()  # before the imports: they are a step of the start

import json  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

from deltawheel.executor.computation import RECORD_KEY, Computation  # noqa: E402

PIPELINE = "restartbench"
KEYS = 64
PER_FILE = 200


class RunningCount(Computation):
    """Each key's running count, one production per record (a record processed twice or lost shows)."""

    name = "counts"
    inputs = {"events": RECORD_KEY}
    outputs = ("counts",)
    num_intervals = 4

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        """Count, and produce the running count."""
        n = (ctx.state or 0) + 1
        ctx.state = n
        ctx.produce("counts", {"n": n}, timestamp_ms=record.timestamp_ms)


def write_input(folder: str, files: int) -> int:
    """``files`` Parquet files of PER_FILE records, every key in each; returns the records."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    for n in range(files):
        keys = [f"k{i % KEYS}" for i in range(PER_FILE)]
        times = [1_000_000 + n * 10_000 + i for i in range(PER_FILE)]
        tmp, path = os.path.join(folder, f".part-{n:05d}.parquet"), os.path.join(folder, f"part-{n:05d}.parquet")
        pq.write_table(pa.table({"key": keys, "t": pa.array(times, pa.int64())}), tmp)
        os.replace(tmp, path)
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))  # the file source's order
    return files * PER_FILE


def pipeline(folder: str) -> Any:
    """The one-computation pipeline over ``folder``."""
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.sources.parquet import ParquetInjector

    inj = ParquetInjector("events", folder, key_column="key", event_time_column="t", watermark_delay_ms=1_000,
                          max_files_per_trigger=1, max_event_ahead_ms=None)
    return Pipeline(PIPELINE, (inj,), (RunningCount(),))


def step(name: str, at: float | None = None) -> None:
    """Print that step ``name`` ended (now, or at ``at``)."""
    print(f"STEP {name} {time.time() if at is None else at:.3f}", flush=True)


def main(argv: list[str]) -> int:
    """Run the job until killed (see the module docstring)."""
    from deltawheel.executor.session import build_spark
    from deltawheel.statestore.session.sparkenv import SparkSettings

    import deltawheel

    store, folder, hosts, chroot, instance, timeout_s = argv[:6]
    standby = argv[6:7] == ["standby"]
    step("started", STARTED)
    step("imported")
    spark = build_spark(SparkSettings(master="local[2]", app_name="restartbench", driver_memory="1g"))
    step("spark")
    engine = deltawheel.connect(spark, store=store, zk=hosts, zk_chroot=chroot, pipeline=PIPELINE,
                                instance=None if instance == "-" else instance, wait_s=300,
                                zk_session_timeout_s=float(timeout_s))
    step("connected")
    seen: set[str] = set()

    def progress(line: str) -> None:
        print(line, flush=True)
        for marker, name in (("leases held", "leases"), (": started in", "executor"), ("stop with Ctrl-C", "running"),
                             ("warmed Delta's commit path", "warmed")):
            if marker in line and name not in seen:
                seen.add(name)
                step(name)
        if line.startswith("counts batch"):
            step("commit")  # any batch, a timers-only one too
            ex = run.executors.get("counts") if run is not None else None
            if ex is not None and ex.reports and ex.reports[-1].records_in + ex.reports[-1].skipped_moved > 0:
                r = ex.reports[-1]
                step("batch")  # a micro-batch of input
                print("BATCH " + json.dumps({"batch_id": r.batch_id, "records": r.records_in,
                                             "skipped_moved": r.skipped_moved, "wall_s": r.wall_s,
                                             "steps_s": dict(r.steps_s)}), flush=True)

    run = None
    engine.progress = progress
    run = engine.start_pipeline(pipeline(folder), standby=standby)
    run.await_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
