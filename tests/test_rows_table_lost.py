"""A computation's rows table lost (deleted by hand, a bad restore) is refused at the next start,
never made again empty: its state, timers and dedup ids would be gone without a word."""

from __future__ import annotations

from typing import Any

import pytest
from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.exceptions import StoreDamagedError
from deltawheel.statestore.rowtable import tables
from executor_util import BucketCounter, WeakCounter, events, start_executor, state_of, stop_executor


def _run_once(spark: Any, layout: Any, zk_config: Any, comp: Any, batch: list[tuple[str, str, int]]) -> None:
    ex, client = start_executor(spark, layout, zk_config, comp)
    try:
        assert ex.run_batch(events(spark, batch), 0).processed == len(batch)
    finally:
        stop_executor(ex, client)


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(600)
def test_a_computation_whose_rows_table_was_deleted_is_refused_not_started_empty(  # type: ignore[no-untyped-def]
        spark, any_migrated_store, zk_config) -> None:
    layout = any_migrated_store
    _run_once(spark, layout, zk_config, BucketCounter(), [("r1", "cats", 1_000), ("r2", "dogs", 2_000)])
    assert set(state_of(spark, layout, "buckets")) == {"cats", "dogs"}
    made = table_files(spark, layout.computations_made)
    assert made is not None and made.read_text("buckets") is not None

    # a store made before the records were kept: the record is written at the next start
    made.delete("buckets")
    tables._made.clear()  # as a new process: nothing remembered
    _run_once(spark, layout, zk_config, BucketCounter(), [("r3", "emus", 3_000)])
    assert made.read_text("buckets") is not None

    # the computation's folder deleted whole, then the pipeline started again
    folder = table_files(spark, layout.computations_root)
    assert folder is not None
    folder.fs.delete_dir(folder.path("buckets"))
    tables._made.clear()
    with pytest.raises(StoreDamagedError, match=r"rows table of computation 'buckets' is gone from "
                                                r".*computations/buckets/rows, though this store made it"):
        _run_once(spark, layout, zk_config, BucketCounter(), [("r4", "cats", 4_000)])
    assert folder.listdir("buckets") in (None, [])  # not made again

    # another computation on the same store starts as any new one does
    _run_once(spark, layout, zk_config, WeakCounter(), [("r5", "cats", 5_000)])
    assert set(state_of(spark, layout, "weak")) == {"cats"}
