"""Stream retention and checkpointed productions: a production that was delivered, is still
checkpointed in the rows (a stopped pipeline keeps its last batch's productions there) and is
past ``deltawheel gc --stream-retention-hours`` is delivered at most once: gc keeps the records
whose productions a restart may still redeliver, and removes them once a later commit cleared
them."""

from __future__ import annotations

import sys
import time

import pytest
from deltawheel.gc.streamretention import stream_retention
from executor_util import BucketCounter, events, start_executor, stop_executor, stream_rows
from pyspark import cloudpickle

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules


def _gc(root: str) -> None:
    # event times of 1970: every stream record is past a one-hour retention
    assert main(["gc", "--store", root, "--apply", "--skip-zk", "--stream-retention-hours", "1"]) == 0


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])  # merge: slow suite (time)
def test_a_restart_after_stream_retention_does_not_resurrect_a_delivered_record(
        spark, migrated_store, zk_config, write_path) -> None:  # type: ignore[no-untyped-def]
    """The bucket of "cats" is emitted and delivered, the executor stops (its production stays
    checkpointed), ``deltawheel gc`` runs stream retention, the executor restarts: the stream holds
    the record once, as before (on the MERGE path the restart redelivers it by insert-if-absent:
    deleted, it came back). Once a batch cleared the checkpoint, retention removes it."""
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path=write_path)
    try:
        ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 0, input_watermark_ms=None)
        assert ex.flush(input_watermark_ms=20_000).productions == 1
    finally:
        stop_executor(ex, client)
    delivered = stream_rows(spark, migrated_store, "counts")
    assert len(delivered) == 1
    _gc(migrated_store.root)
    assert stream_rows(spark, migrated_store, "counts") == delivered  # still redeliverable: kept
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path=write_path,
                                writer="w2")
    try:
        assert stream_rows(spark, migrated_store, "counts") == delivered
        ex.flush(input_watermark_ms=20_000)  # its commit clears the checkpoint
    finally:
        stop_executor(ex, client)
    cutoff = int(time.time() * 1000) - 3_600_000
    found = stream_retention(spark, migrated_store, migrated_store.stream("counts"), stream="counts",
                             cutoff_ms=cutoff, rows_table=True, apply=True)
    assert (found.removed, found.held) == (1, 0)
    assert stream_rows(spark, migrated_store, "counts") == []
