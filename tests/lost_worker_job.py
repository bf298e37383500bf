"""A one-batch job whose user code blocks inside a Spark task, for the lost-worker test
(``test_cluster.py``): the task processing key ``BLOCK_KEY`` writes ``running-<pid>`` into a
marker folder and waits until ``go`` appears there. Run as a script it is the driver of a batch
on a cluster (``--master spark://...``); imported, :func:`run_batch` runs it on any session.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

sys.path.insert(0, str(Path(__file__).parent))
from executor_util import BucketCounter, events

# Spark's Python workers cannot import test modules: ship this module's classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

BLOCK_KEY = "cats"
ITEMS = [(f"r{i}", q, ts) for i, (q, ts) in enumerate(
    [("cats", 1_000), ("dogs", 2_000), ("cats", 12_000), ("emus", 3_000), ("dogs", 14_000), ("owls", 5_000),
     ("cats", 21_000), ("owls", 25_000), ("emus", 16_000), ("yaks", 7_000), ("yaks", 18_000), ("dogs", 29_000)])]
ITEMS.append(("r1", "dogs", 2_000))  # a duplicate: dropped once, however often the batch's tasks run


def blocking_counter(markers: str) -> BucketCounter:
    """The bucket counter, blocking in ``process_record`` of :data:`BLOCK_KEY` until ``markers/go`` exists."""

    class Blocking(BucketCounter):
        name = "blocking"
        marker_dir = markers

        def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
            if ctx.key == BLOCK_KEY:
                folder = Path(self.marker_dir)
                (folder / f"running-{os.getpid()}").write_text(f"I am running in pid {os.getpid()}\n")
                deadline = time.monotonic() + 900
                while not (folder / "go").exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
            super().process_record(ctx, record)

    return Blocking()


def run_batch(spark: Any, store: str, zk_hosts: str, chroot: str, markers: str) -> None:
    """Migrate the store, take every interval, run the one batch (input watermark past every
    bucket: every window is produced) and give the intervals back."""
    from deltawheel.executor.protocol.executor import ComputationExecutor
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager

    from deltawheel import migrations

    layout = StoreLayout(store)
    migrations.apply(spark, layout, dry_run=False)
    client = connect(ZkConfig(hosts=zk_hosts, chroot=chroot))
    try:
        comp = blocking_counter(markers)
        owner = IntervalOwner(RowStore(spark, layout, writer="w"), LeaseManager(client, pipeline="lost", owner="w"),
                              comp.name, num_intervals=comp.num_intervals)
        ex = ComputationExecutor(spark, layout, comp, owner=owner, progress=print, write_path="image",
                                 manual_watermarks=True)
        ex.start(wait_s=30)
        ex.run_batch(events(spark, ITEMS), 0, input_watermark_ms=100_000)
        ex.stop()
    finally:
        client.stop()
        client.close()


def main() -> int:
    from deltawheel.executor.session import build_spark
    from deltawheel.statestore.session.sparkenv import SparkSettings

    ap = argparse.ArgumentParser()
    for name in ("--master", "--store", "--zk", "--chroot", "--markers"):
        ap.add_argument(name, required=True)
    args = ap.parse_args()
    spark = build_spark(SparkSettings(master=args.master, app_name="lost-worker"))
    try:
        run_batch(spark, args.store, args.zk, args.chroot, args.markers)
    finally:
        spark.stop()
    print("lost-worker job: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
