"""Intervals of a computation that reads a Delta stream table, moving between job instances.

A two-stage pipeline: a Parquet injector -> ``relay`` (produces every record to the stream table
``relayed``, under another key) -> ``group_count`` (reads ``relayed``, keyed by a field of the
value, not the record's key). Instances are pipeline runners with their own instance name, run
one after the other in this process on the shared Spark session (as in test_rescale.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.computation import RECORD_KEY, Computation
from deltawheel.executor.drivers.pipeline import Pipeline
from deltawheel.executor.drivers.runner import PipelineRunner
from deltawheel.executor.protocol.rescale import CATCH_UP_BATCH, positions_log
from deltawheel.executor.sources.delta import DeltaTableInjector
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import interval_of
from executor_util import state_of
from pyspark import cloudpickle
from rescale_instance import KEYS, write_file

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def group_of(key: str) -> str:
    return f"g{int(key[1:]) % 5}"


class Relay(Computation):
    """Every input record, produced once to ``relayed`` under the key ``r-{key}``, its group in the value."""

    name = "relay"
    inputs = {"events": RECORD_KEY}
    outputs = ("relayed",)
    num_intervals = 4
    exactly_once = False

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.produce("relayed", {"group": group_of(ctx.key)}, key=f"r-{ctx.key}")


class GroupCount(Computation):
    """Counts the relayed records per group (a field of the value), without record-id dedup: a
    record processed twice, or never, changes the count."""

    name = "group_count"
    inputs = {"relayed": "group"}
    outputs = ()
    num_intervals = 4
    exactly_once = False

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1


def pipeline(folder: Path) -> Pipeline:
    inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="t",
                          watermark_delay_ms=1_000, max_files_per_trigger=1, max_event_ahead_ms=None)
    return Pipeline("stages", (inj,), (Relay(), GroupCount()))


@pytest.mark.timeout(600)
def test_a_moved_interval_of_a_stream_table_reader_is_neither_skipped_nor_processed_twice(
        spark: Any, zk_config: Any, tmp_path: Path, migrated_at: Any) -> None:
    folder, layout = tmp_path / "in", migrated_at(tmp_path / "store")  # a migrated copy: connect migrating a new store runs in test_connect.py
    expected: dict[str, int] = {}

    def add(n: int) -> None:
        for k, c in write_file(folder, n).items():  # each key n % 5 + 1 times
            expected[group_of(k)] = expected.get(group_of(k), 0) + c

    def run(instance: str, intervals: list[int] | None) -> Any:
        return PipelineRunner(spark, layout, pipeline(folder), zk=zk_config, wait_s=20, instance=instance,
                              intervals=intervals, warm_workers=False).run().reports["group_count"]

    def counts() -> dict[str, int]:
        return {k: s for k, (s, _) in state_of(spark, layout, "group_count").items()}

    add(0)
    run("a", [0, 1])  # a's group_count query reads only what a's relay delivered
    run("b", [2, 3])  # b's reads both deliveries: ahead of a's
    # b takes 0 and 1: its query consumed stream files their committed positions lack: caught up
    reports = run("b", None)
    # what it caught up on: b's relay deliveries (relay intervals 2, 3) of group_count's intervals 0, 1
    caught = sum(1 for k in KEYS if interval_of(k, 4) in (2, 3) and interval_of(group_of(k), 4) in (0, 1))
    assert caught and [r.processed for r in reports if r.batch_id == CATCH_UP_BATCH] == [caught]
    assert counts() == expected
    # `deltawheel gc`'s compaction rewrites the stream table's files: a rewritten file must not look new
    spark.sql(f"OPTIMIZE delta.`{layout.stream('relayed')}`")
    add(1)
    # a takes everything back: its query is behind; what b processed is skipped, the new file processed
    reports = run("a", None)
    # a's group_count query had not read b's relay deliveries of file 0: processed by b, skipped
    assert sum(r.skipped_moved for r in reports) == sum(1 for k in KEYS if interval_of(k, 4) in (2, 3))
    assert counts() == expected
    # a new instance: its query reads the stream from its first version (the files deliveries
    # added, not the compacted one), all processed already
    reports = run("c", None)
    assert sum(r.skipped_moved for r in reports) == sum(expected.values())
    assert sum(r.processed for r in reports) == 0
    logged = positions_log(str(tmp_path / "store" / "_checkpoints" / "stages" / "group_count" / "c"))
    assert logged and all(p.startswith("relayed/part-") for ps in logged.values() for p in ps)
    assert counts() == expected  # the rows of one instance reading every record once


def test_sharing_refuses_inputs_without_file_positions(spark: Any, zk_config: Any, tmp_path: Path) -> None:
    class FromTable(GroupCount):
        name = "from_table"
        inputs = {"table": "group"}

    spark.createDataFrame([("a", "g1", 1)], "record_id STRING, group STRING, t BIGINT").write.format(
        "delta").save(str(tmp_path / "table"))
    inj = DeltaTableInjector("table", str(tmp_path / "table"), key_column=None, event_time_column="t",
                             watermark_delay_ms=0)
    r = PipelineRunner(spark, StoreLayout(str(tmp_path / "store")), Pipeline("refused", (inj,), (FromTable(),)),
                       zk=zk_config, instance="a", warm_workers=False)
    with pytest.raises(ConfigError, match="inputs give file positions.*'table' is a DeltaTableInjector"):
        r.run()
