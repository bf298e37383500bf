"""A store the image write path ran keeps its record ids in ids files, which the MERGE path does not
read: starting an exactly-once computation of it with ``write_path="merge"`` is refused with
:class:`WritePathSwitchError` naming the store, before any row or stream record is written (run
on the MERGE path, a producer's retry of a record already processed would run again)."""

from __future__ import annotations

import re
import sys

import pytest
from deltawheel.executor.protocol.executor import ComputationExecutor
from deltawheel.statestore.exceptions import WritePathSwitchError
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.leases import LeaseManager
from executor_util import BucketCounter, events, start_executor, state_of, stop_executor, stream_rows
from pyspark import cloudpickle

pytestmark = [pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules


@pytest.mark.timeout(1500)
def test_an_image_path_store_started_on_the_merge_path_is_refused(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """Record r1 runs on the image path; the same computation started with write_path="merge"
    raises WritePathSwitchError naming the store's path, holds no lease and changed no state or
    stream record; back on the image path, a retry of r1 is a duplicate."""
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image")
    try:
        assert ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 0, input_watermark_ms=None).processed == 1
        assert ex.flush(input_watermark_ms=20_000).productions == 1
    finally:
        stop_executor(ex, client)
    state, counts = state_of(spark, migrated_store, "buckets"), stream_rows(spark, migrated_store, "counts")
    client = connect(zk_config)
    try:
        leases = LeaseManager(client, pipeline="test", owner="w2")
        comp = BucketCounter()
        owner = IntervalOwner(RowStore(spark, migrated_store, writer="w2"), leases, comp.name,
                              num_intervals=comp.num_intervals)
        ex = ComputationExecutor(spark, migrated_store, comp, owner=owner, progress=print, write_path="merge")
        with pytest.raises(WritePathSwitchError, match=re.escape(migrated_store.root) + ".*write_path='image'"):
            ex.start(wait_s=20)
        assert owner.intervals == ()  # the leases were given back
    finally:
        client.stop()
        client.close()
    assert state_of(spark, migrated_store, "buckets") == state and stream_rows(spark, migrated_store, "counts") == counts
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image", writer="w3")
    try:
        retry = ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 2, input_watermark_ms=None)
        assert (retry.processed, retry.duplicates) == (0, 1)
    finally:
        stop_executor(ex, client)
