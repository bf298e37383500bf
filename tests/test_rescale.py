"""Intervals moving between job instances: the skip rule and catch-up keep a move exact.

Instances here are pipeline runners with their own instance name (own query checkpoint, own
ZooKeeper session), run one after the other in this process on the shared Spark session.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.computation import RECORD_KEY, Computation
from deltawheel.executor.runtime.pipeline import Pipeline, PipelineRunner
from deltawheel.executor.runtime.rescale import CATCH_UP_BATCH, source_log_files
from deltawheel.executor.runtime.sources import ParquetInjector
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import interval_of
from deltawheel.statestore.rowtable.store import RowStore
from executor_util import state_of
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.zk]


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


KEYS = [f"k{i}" for i in range(12)]


def write_file(folder: Path, n: int) -> dict[str, int]:
    """Input file ``n``: each key ``n + 1`` times (so every file moves every count); returns the counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = [k for k in KEYS for _ in range(n + 1)]
    times = [1_000_000 + n * 10_000 + i for i in range(len(keys))]
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"key": keys, "t": pa.array(times, pa.int64())}), folder / f"part-{n:05d}.parquet")
    return {k: n + 1 for k in KEYS}


def runner(spark: Any, layout: StoreLayout, folder: Path, zk_config: Any, *, instance: str | None,
           intervals: list[int] | None, write_path: str) -> PipelineRunner:
    inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="t",
                          watermark_delay_ms=1_000, max_files_per_trigger=1, max_event_ahead_ms=None)
    return PipelineRunner(spark, layout, Pipeline("moves", (inj,), (KeyCount(),)), zk=zk_config, wait_s=20,
                          instance=instance, intervals=intervals, write_path=write_path, warm_workers=False)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", "merge"])
def test_a_moved_interval_is_neither_skipped_nor_processed_twice(spark: Any, zk_config: Any, tmp_path: Path,
                                                                  write_path: str) -> None:
    folder, layout = tmp_path / "in", StoreLayout(str(tmp_path / "store"))
    expected: dict[str, int] = {}

    def add(n: int) -> None:
        for k, c in write_file(folder, n).items():
            expected[k] = expected.get(k, 0) + c

    def run(instance: str, intervals: list[int] | None) -> Any:
        return runner(spark, layout, folder, zk_config, instance=instance, intervals=intervals,
                      write_path=write_path).run().reports["key_count"]

    add(0)
    run("a", [0, 1])
    run("b", [2, 3])
    add(1)
    run("b", [2, 3])  # b's query is now one file ahead of a's
    # b takes 0 and 1: its query consumed part-00001, which their committed files lack: caught up
    reports = run("b", None)
    catch = [r for r in reports if r.batch_id == CATCH_UP_BATCH]
    assert [r.processed for r in catch] == [sum(2 for k in KEYS if interval_of(k, 4) in (0, 1))]
    files = RowStore(spark, layout, writer="check").input_files("key_count")
    assert files == {iv: frozenset({"part-00000.parquet", "part-00001.parquet"}) for iv in range(4)}
    add(2)
    # a takes everything back: its query is one file behind; part-00001 is skipped for every
    # interval (processed by b), part-00002 processed
    reports = run("a", None)
    assert sum(r.skipped_moved for r in reports) == 2 * len(KEYS)
    assert {k: s for k, (s, _) in state_of(spark, layout, "key_count").items()} == expected
    logged = source_log_files(str(tmp_path / "store" / "_checkpoints" / "moves" / "key_count" / "a"))
    assert sorted(f for fs in logged.values() for f in fs) == [f"part-{n:05d}.parquet" for n in range(3)]


def test_sharing_needs_a_parquet_injector_keyed_by_its_key_column(spark: Any, zk_config: Any, tmp_path: Path) -> None:
    class ByField(KeyCount):
        name = "by_field"
        inputs = {"events": "key"}

    folder, layout = tmp_path / "in", StoreLayout(str(tmp_path / "store"))
    write_file(folder, 0)
    inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="t", watermark_delay_ms=1_000)
    r = PipelineRunner(spark, layout, Pipeline("moves", (inj,), (ByField(),)), zk=zk_config, instance="a",
                       warm_workers=False)
    with pytest.raises(ConfigError, match="only when it reads one Parquet injector keyed by"):
        r.run()
