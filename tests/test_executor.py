"""The foreachBatch executor on real Spark, Delta and ZooKeeper: exactly-once and timers."""

from __future__ import annotations

import pytest
from executor_util import BucketCounter, events, start_executor, state_of, stream_rows

pytestmark = [pytest.mark.spark, pytest.mark.zk]

B1 = [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "cats", 12_000), ("r2", "dogs", 2_000)]
B2 = [("r4", "cats", 15_000), ("r5", "dogs", 21_000), ("r1", "cats", 1_000)]


@pytest.mark.timeout(600)
def test_batches_timers_and_replay_are_exactly_once(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    try:
        r0 = ex.run_batch(events(spark, B1), 0, input_watermark_ms=None)
        assert (r0.records_in, r0.processed, r0.duplicates, r0.timers_fired) == (4, 3, 1, 0)
        r1 = ex.run_batch(events(spark, B2), 1, input_watermark_ms=11_000)
        # r1 is a replayed id; the [0,10s) buckets of cats and dogs fire (timer 9999 < 11000)
        assert (r1.processed, r1.duplicates, r1.timers_fired) == (2, 1, 2)
        # replaying batch 1 (Spark re-runs a batch after a crash) changes nothing
        again = ex.run_batch(events(spark, B2), 1, input_watermark_ms=11_000)
        assert (again.processed, again.duplicates, again.productions) == (0, 3, 0)
        ex.flush(input_watermark_ms=40_000)
    finally:
        ex.stop()
        client.stop()
        client.close()
    counts = stream_rows(spark, migrated_store, "counts")
    assert [(k, v) for _, k, v, _ in counts] == [
        ("cats", '{"n": 1, "q": "cats", "start": 0}'), ("cats", '{"n": 2, "q": "cats", "start": 10000}'),
        ("dogs", '{"n": 1, "q": "dogs", "start": 0}'), ("dogs", '{"n": 1, "q": "dogs", "start": 20000}'),
    ] or sorted((k, v) for _, k, v, _ in counts) == sorted([
        ("cats", '{"n": 1, "q": "cats", "start": 0}'), ("cats", '{"n": 2, "q": "cats", "start": 10000}'),
        ("dogs", '{"n": 1, "q": "dogs", "start": 0}'), ("dogs", '{"n": 1, "q": "dogs", "start": 20000}')])
    # every key is empty now except the dedup ids: state None, no timers
    st = state_of(spark, migrated_store, "buckets")
    assert all(v == (None, []) for v in st.values()), st


class Crash(Exception):
    """Stands in for the process dying at a protocol step."""


def _run(spark, layout, zk_config, *, crash_at=None):  # type: ignore[no-untyped-def]
    """Batches B1, B2 and a final flush; optionally crash once at a fault point of batch 1, then
    restart (new ZooKeeper session and leases, recovery scan) and let Spark replay batch 1."""
    from deltawheel.executor.batch import FaultPoint

    fired = []

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point == crash_at and batch_id == 1 and not fired:
            fired.append(point)
            raise Crash(point)

    ex, client = start_executor(spark, layout, zk_config, BucketCounter(), faults=faults, writer="first")
    ex.run_batch(events(spark, B1), 0, input_watermark_ms=None)
    try:
        ex.run_batch(events(spark, B2), 1, input_watermark_ms=11_000)
    except Crash:
        client.stop()  # the session dies with the process: its leases go
        client.close()
        ex, client = start_executor(spark, layout, zk_config, BucketCounter(), writer="second")
        ex.run_batch(events(spark, B2), 1, input_watermark_ms=11_000)
    ex.flush(input_watermark_ms=40_000)
    ex.stop()
    client.stop()
    client.close()
    assert fired == ([crash_at] if crash_at else [])
    return stream_rows(spark, layout, "counts"), state_of(spark, layout, "buckets")


@pytest.fixture(scope="module")
def clean_run(spark, zk_server, tmp_path_factory):  # type: ignore[no-untyped-def]
    """The outputs and state of the run that never crashed (computed once)."""
    from deltawheel import migrations
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout

    layout = StoreLayout(str(tmp_path_factory.mktemp("clean") / "store"))
    migrations.apply(spark, layout, dry_run=False)
    want = _run(spark, layout, ZkConfig(hosts=zk_server.hosts, chroot="/clean-run", session_timeout_s=6.0))
    assert len(want[0]) == 4
    return want


@pytest.mark.timeout(900)
@pytest.mark.parametrize("point", ["after_prepare", "after_user_code", "before_commit", "after_commit",
                                   "after_delivery", "before_watermark"])
def test_crash_at_each_step_then_restart_gives_the_same_result(spark, migrated_store, zk_config, clean_run,
                                                               point) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.batch import FaultPoint

    assert _run(spark, migrated_store, zk_config, crash_at=FaultPoint(point)) == clean_run
