"""Recovery after a rewrite of the rows table (``deltawheel gc --apply``'s OPTIMIZE): whether a
checkpoint was delivered is decided by the commit that checkpointed it (its id, recorded in the
rows and in the delivery), not by the version of the commit that last (re)added its file."""

from __future__ import annotations

import pytest
from deltawheel.gc.passes import run_gc
from deltawheel.statestore.delta.log import read_snapshot
from executor_util import BucketCounter, events, start_executor, state_of, stop_executor, stream_rows

pytestmark = [pytest.mark.spark, pytest.mark.zk]

B1 = [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "cats", 12_000), ("r6", "owls", 3_000)]
B2 = [("r4", "cats", 15_000), ("r5", "dogs", 21_000), ("r1", "cats", 1_000)]


def _pipeline(spark, layout, zk_config, write_path, *, crash_and_gc: bool):  # type: ignore[no-untyped-def]
    """B1 (its windows delivered), [a start-up that dies after its claims, then gc --apply],
    then a restart that runs B2 and the final flush. Returns (stream rows, state)."""
    ex, client = start_executor(spark, layout, zk_config, BucketCounter(), write_path=write_path, writer="w1")
    r0 = ex.run_batch(events(spark, B1), 0, input_watermark_ms=11_000)
    assert r0.productions == 3
    stop_executor(ex, client)  # settles the delivery: the checkpoints stay in the rows, delivered
    if crash_and_gc:
        # a start-up that dies once its claims are committed (the session goes with the process)
        ex, client = start_executor(spark, layout, zk_config, BucketCounter(), write_path=write_path, writer="w2")
        client.stop()
        client.close()
        before = read_snapshot(layout.rows_of("buckets"))
        report = run_gc(spark, layout, now_ms=0, apply=True)
        assert any("[done] compact" in line and "computations/buckets/rows" in line for line in report.lines())
        after = read_snapshot(layout.rows_of("buckets"))
        assert before is not None and after is not None
        # OPTIMIZE did rewrite the rows table's files (otherwise this test shows nothing)
        assert {a["path"] for a in after.adds} != {a["path"] for a in before.adds}
    ex, client = start_executor(spark, layout, zk_config, BucketCounter(), write_path=write_path, writer="w3")
    recovered = dict(ex.recovered)
    ex.run_batch(events(spark, B2), 1, input_watermark_ms=22_000)
    ex.flush(input_watermark_ms=40_000)
    stop_executor(ex, client)
    return stream_rows(spark, layout, "counts"), state_of(spark, layout, "buckets"), recovered


@pytest.mark.timeout(600)
def test_a_restart_after_optimize_does_not_give_delivered_checkpoints_again(
        spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """The fast case: a delivered batch, a start-up that dies after its claims (two files per
    interval partition), OPTIMIZE (one file each, added under a newer version), a restart."""
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image", writer="w1")
    assert ex.run_batch(events(spark, B1), 0, input_watermark_ms=11_000).productions == 3
    stop_executor(ex, client)
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image", writer="w2")
    client.stop()
    client.close()
    spark.sql(f"OPTIMIZE delta.`{migrated_store.rows_of('buckets')}`")
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image", writer="w3")
    stop_executor(ex, client)
    assert ex.recovered == {"appended": 0, "merged": 0}
    ids = [r[0] for r in stream_rows(spark, migrated_store, "counts")]
    assert len(ids) == 3 and len(set(ids)) == 3, ids


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("write_path", ["image", "merge"])
def test_gc_between_a_startup_crash_and_a_restart_gives_the_clean_rows_without_duplicates(
        spark, migrated_store, zk_config, tmp_path, write_path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout

    from deltawheel import migrations

    clean_layout = StoreLayout(str(tmp_path / "clean"))
    migrations.apply(spark, clean_layout, dry_run=False)
    clean_zk = ZkConfig(hosts=zk_config.hosts, chroot=zk_config.chroot + "-clean", session_timeout_s=6.0)
    want_streams, want_state, _ = _pipeline(spark, clean_layout, clean_zk, write_path, crash_and_gc=False)
    got_streams, got_state, recovered = _pipeline(spark, migrated_store, zk_config, write_path, crash_and_gc=True)
    ids = [r[0] for r in got_streams]
    assert len(ids) == len(set(ids)), f"duplicate productions: {len(ids) - len(set(ids))}"
    assert got_streams == want_streams
    assert got_state == want_state
    # the delivered checkpoints were recognised as delivered: nothing given again at the restart
    assert recovered == {"appended": 0, "merged": 0} or write_path == "merge"
