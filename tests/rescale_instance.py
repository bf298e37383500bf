"""One job instance of the rescaling tests' pipeline, as its own process and Spark application.

    python rescale_instance.py STORE INPUT ZK_HOSTS CHROOT INSTANCE STOP_FILE WRITE_PATH

It joins the pipeline's members, takes its share of the intervals and follows the input folder
until STOP_FILE exists (a graceful leave); SIGKILL it to test a death.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from deltawheel.executor.computation import RECORD_KEY, Computation
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

KEYS = [f"k{i}" for i in range(12)]


class KeyCount(Computation):
    """Counts every record of its key, without record-id dedup: a record processed twice, or
    never, changes the count (the rule under test must do the work, not the dedup)."""

    name = "key_count"
    inputs = {"events": RECORD_KEY}
    outputs = ()
    num_intervals = 4
    exactly_once = False

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1


def write_file(folder: Path, n: int) -> dict[str, int]:
    """Input file ``n``: each key ``n % 5 + 1`` times (every file moves every count); returns the counts.
    Written under a hidden name, then renamed: Spark's file source never sees half a file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    per = n % 5 + 1
    keys = [k for k in KEYS for _ in range(per)]
    times = [1_000_000 + n * 10_000 + i for i in range(len(keys))]
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".part-{n:05d}.parquet"
    pq.write_table(pa.table({"key": keys, "t": pa.array(times, pa.int64())}), tmp)
    os.replace(tmp, folder / f"part-{n:05d}.parquet")
    # Spark's file source takes files in modification-time order: files written within one tick
    # of the clock come in any order (file 2 read before file 0 makes file 0's records late)
    os.utime(folder / f"part-{n:05d}.parquet", (1_700_000_000 + n, 1_700_000_000 + n))
    return {k: per for k in KEYS}


def injector(folder: Path):  # type: ignore[no-untyped-def]
    from deltawheel.executor.sources.parquet import ParquetInjector

    return ParquetInjector("events", str(folder), key_column="key", event_time_column="t",
                           watermark_delay_ms=1_000, max_files_per_trigger=4, max_event_ahead_ms=None)


def main(argv: list[str]) -> int:
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.session import build_spark
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.session.sparkenv import SparkSettings

    store, folder, hosts, chroot, instance, stop, write_path = argv
    spark = build_spark(SparkSettings(master="local[1]", app_name=f"rescale-{instance}", driver_memory="1g"))
    zk = ZkConfig(hosts=hosts, chroot=chroot, session_timeout_s=6.0)
    runner = PipelineRunner(spark, StoreLayout(store), Pipeline("moves", (injector(Path(folder)),), (KeyCount(),)),
                            zk=zk, wait_s=30, instance=instance, write_path=write_path, warm_workers=False,
                            end_of_input=False, follow=lambda: os.path.exists(stop), poll_s=0.5,
                            progress=lambda line: print(f"[{instance}] {line}", flush=True))
    runner.run()
    for m in runner.moves:
        print(f"[{instance}] MOVE {m.computation} {list(m.before)} -> {list(m.after)} {m.seconds:.2f}s", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
