"""What a batch pays outside the user's per-key work (docs/performance.md, "Where a batch's time
goes"): the input positions a commit records read from the query's log alone, and Python workers
whose collections skip what the daemon preloaded."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest


def _recorder(chk: Path) -> Any:
    from deltawheel.executor.computation import Computation
    from deltawheel.executor.protocol.rescale import shared_input
    from deltawheel.executor.sources.parquet import ParquetInjector

    class Counter(Computation):
        name = "counter"
        inputs = {"queries": "query"}

        def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
            pass

    (chk.parent / "in").mkdir()
    inj = ParquetInjector("queries", str(chk.parent / "in"), key_column="query", event_time_column="t",
                          watermark_delay_ms=0)
    return shared_input(Counter(), {"queries": inj}, table_of=lambda s: str(chk.parent / "store" / s),
                        checkpoint=str(chk))


def test_a_batchs_positions_come_from_a_local_checkpoints_file_source_log_without_its_frame(tmp_path: Path) -> None:
    # the replay's record of a Parquet-fed batch: the file source log names its files, so the
    # frame is never touched (adding the position column to it cost ~45 py4j calls and an
    # analysis per batch); ``None`` stands for a frame that must not be used
    chk = tmp_path / "chk"
    (chk / "sources" / "0").mkdir(parents=True)
    (chk / "offsets").mkdir()
    for b in range(2):
        (chk / "sources" / "0" / str(b)).write_text(
            f'v1\n{{"path":"file:///x/in/part-{b:05d}.parquet","timestamp":{b},"batchId":{b},"action":"add"}}\n')
        (chk / "offsets" / str(b)).write_text(f'v1\n{{}}\n{{"logOffset":{b}}}\n')  # the query's offsets
    rec = _recorder(chk)
    assert rec.record(None, 0) == ("part-00000.parquet",)
    assert rec.record(None, 1) == ("part-00001.parquet",) and not rec.unknown
    # a batch the logs do not have: no positions recorded for it (its commit records none, as an
    # older deltawheel's; a replay cannot start before it), and the batch goes on
    assert rec.record(None, 2) == () and rec.unknown == {2}


def _worker_gc(_i: int) -> tuple[int, int]:
    import gc as _gc
    import sys

    return _gc.get_freeze_count(), int("deltawheel.executor.tasks.image.interval" in sys.modules)


@pytest.mark.spark
def test_python_workers_collect_without_walking_what_the_daemon_preloaded(spark: Any) -> None:
    # PySpark's daemon runs a full gc.collect() in a reused worker after every task: the preloaded
    # modules' objects are frozen in the daemon before it forks, so that collection skips them
    got = spark.sparkContext.parallelize(range(2), 2).map(_worker_gc).collect()
    assert len(got) == 2
    for frozen, preloaded in got:
        assert preloaded == 1
        assert frozen > 10_000, f"only {frozen} objects frozen in the worker"
    assert gc.get_freeze_count() == 0  # the driver's own process is left alone
