"""Runs test_direct's pipeline with the direct read in its own Spark session (the master given:
``local-cluster[2,1,1024]`` in the test) and prints each batch's direct flag.

Usage: direct_cluster.py INPUT_FOLDER STORE ZK_HOSTS CHROOT MASTER
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from deltawheel.executor.drivers.pipeline import Pipeline
from deltawheel.executor.drivers.runner import PipelineRunner
from deltawheel.executor.session import build_spark
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.session.sparkenv import SparkSettings
from executor_util import RoutedLate


def main() -> None:
    folder, store, hosts, chroot, master = sys.argv[1:6]
    spark = build_spark(SparkSettings(master=master, app_name="deltawheel-direct-cluster"))
    inj = ParquetInjector("events", folder, key_column="key", event_time_column="event_time", value_columns=[],
                          record_id_column="record_id", watermark_delay_ms=2_000, max_files_per_trigger=1)
    summary = PipelineRunner(spark, StoreLayout(store), Pipeline("direct", (inj,), (RoutedLate(),)),
                             zk=ZkConfig(hosts=hosts, chroot=chroot), progress=print, end_of_input=False).run()
    flags = [r.direct for r in summary.reports["routed"] if r.records_in]
    print("DIRECT", " ".join(str(f) for f in flags), "MASTER", spark.sparkContext.master, flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
