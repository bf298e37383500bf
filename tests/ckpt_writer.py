"""A writer process for the background checkpoint kill test: commits until killed, its log
checkpointed in the background after every commit.

Usage: python ckpt_writer.py TABLE
Prints "DONE v" after each commit of version v.
"""

from __future__ import annotations

import sys

from deltawheel.executor.session import build_spark
from deltawheel.statestore.delta.maintenance import COMMIT_CHECKPOINT_INTERVAL, checkpointer
from deltawheel.statestore.delta.txn import TableLog, new_add
from deltawheel.statestore.session.sparkenv import SparkSettings


def main() -> None:
    path = sys.argv[1]
    spark = build_spark(SparkSettings(app_name="ckpt-writer"))
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, p INT) USING DELTA PARTITIONED BY (p) "
              f"TBLPROPERTIES ('delta.checkpointInterval' = '{COMMIT_CHECKPOINT_INTERVAL}')")
    cp = checkpointer(spark)
    cp.every, cp.rest = 1, 0.0  # a checkpoint after every commit, back to back: one is nearly always being written
    log = TableLog(spark, path)
    i = 0
    while True:
        adds = [new_add(f"p={i % 7}/part-{i}-{j}.parquet", {"p": str(i % 7)}, 100, 1) for j in range(50)]
        v = log.commit(add=adds, app_versions={"writer": i})
        print(f"DONE {v}", flush=True)
        i += 1


if __name__ == "__main__":
    main()
