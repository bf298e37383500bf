"""Dedup retention is a processing time (``Computation.dedup_retention``), not a number of
batches: a producer's retry many batches later, or after a restart, is still a duplicate;
ids past the horizon leave the rows also for keys never touched again."""

from __future__ import annotations

import sys
from datetime import timedelta

import pytest
from deltawheel.statestore.clock import ManualClock
from deltawheel.statestore.rowtable.rows import IDS_KEY_PREFIX
from executor_util import BucketCounter, events, start_executor, stop_executor
from pyspark import cloudpickle

pytestmark = [pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

T0 = 1_700_000_000_000


def _ids(spark, layout, key):  # type: ignore[no-untyped-def]
    """The record ids buckets' rows table holds for ``key`` of the buckets computation (None: no row):
    in the key's row, or in the record-ids rows of the image path's ids files."""
    from pyspark.sql import functions as F

    rows = spark.read.format("delta").load(layout.rows_of("buckets")).where(
        (F.col("computation") == "buckets")
        & F.col("key").isin(key, IDS_KEY_PREFIX + key)).select("record_ids").collect()
    return None if not rows else sorted(i["record_id"] for r in rows for i in r["record_ids"] or ())


@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])
def test_retry_six_batches_later_and_after_restart_is_a_duplicate(spark, migrated_store, zk_config,
                                                                  write_path) -> None:  # type: ignore[no-untyped-def]
    """A producer retries record r1 six batches (a few seconds) after it was processed, and again
    after the executor restarted: both are dropped; 11 minutes later (past the default 10 min
    retention) the ids of a key that never saw another record are gone, and so is its row."""
    clock = ManualClock(T0)
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path=write_path,
                                clock=clock)
    try:
        r0 = ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 0, input_watermark_ms=None)
        assert r0.processed == 1
        for b in range(1, 7):  # six batches of other records, a second apart
            clock.advance(1_000)
            ex.run_batch(events(spark, [(f"d{b}", "dogs", 1_000 + b)]), b, input_watermark_ms=None)
        clock.advance(1_000)
        retry = ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 7, input_watermark_ms=None)
        assert (retry.processed, retry.duplicates) == (0, 1)
        if write_path == "image":  # the Bloom filter said "maybe": the stored ids were looked up
            assert retry.bloom_checked == 1 and retry.bloom_maybe == 1 and retry.bloom_false_pos == 0
            assert retry.bloom_bytes > 0
        else:  # the MERGE path checks the row it read anyway
            assert retry.bloom_checked == 0
    finally:
        stop_executor(ex, client)
    clock.advance(60_000)
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path=write_path,
                                clock=clock, writer="w2")
    try:
        again = ex.run_batch(events(spark, [("r1", "cats", 1_000), ("d1", "dogs", 1_001)]), 8,
                             input_watermark_ms=None)
        assert (again.processed, again.duplicates) == (0, 2)
        assert _ids(spark, migrated_store, "cats") == ["r1"]
        # the buckets' event-time timers fire: the keys keep nothing but their ids
        ex.flush(input_watermark_ms=20_000)
        assert _ids(spark, migrated_store, "cats") == ["r1"]
        clock.advance(11 * 60_000)
        swept = ex.flush(input_watermark_ms=20_000)  # no records: only the sweep has work
        assert swept.ids_expired == 7  # r1 and d1..d6
        assert _ids(spark, migrated_store, "cats") is None and _ids(spark, migrated_store, "dogs") is None
        # past the horizon a retry is new again (MillWheel: no sender retries that late)
        late = ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 10, input_watermark_ms=None)
        assert late.processed == 1
    finally:
        stop_executor(ex, client)


class ShortMemory(BucketCounter):
    name = "short"
    dedup_retention = timedelta(seconds=5)


@pytest.mark.timeout(600)
def test_retention_is_a_time_not_a_batch_count(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """With a 5 s retention, an id is kept for 5 s however many batches run (here one), and
    dropped after 5 s even when no batch ran in between."""
    clock = ManualClock(T0)
    ex, client = start_executor(spark, migrated_store, zk_config, ShortMemory(), clock=clock)
    try:
        ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 0, input_watermark_ms=None)
        clock.advance(5_000)
        assert ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 1, input_watermark_ms=None).duplicates == 1
        clock.advance(1)
        assert ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 2, input_watermark_ms=None).processed == 1
    finally:
        stop_executor(ex, client)


def test_the_old_batch_count_setting_is_refused() -> None:
    from deltawheel.statestore.exceptions import ConfigError

    class Old(BucketCounter):
        name = "old"
        dedup_retention_batches = 3

    class Bad(BucketCounter):
        name = "bad"
        dedup_retention = 600  # type: ignore[assignment]

    with pytest.raises(ConfigError, match="dedup_retention_batches was replaced by dedup_retention"):
        Old.validate()
    with pytest.raises(ConfigError, match="dedup_retention must be a positive timedelta"):
        Bad.validate()
