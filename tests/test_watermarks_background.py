"""Step 7 in the background: an executor called as a streaming query's ``foreachBatch`` function
publishes its watermarks after the batch returned (``executor/protocol/watermarks.py``).

What a user relies on: the watermarks published are those a batch run with ``run_batch`` publishes
(the next batch, ``settle()`` and the reports see them landed), and a failure of the background
publish (a takeover: this executor is a zombie) fails the next batch typed, while a restarted
executor still delivers every window exactly once.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from deltawheel.executor.protocol.executor import ComputationExecutor
from deltawheel.executor.protocol.faults import FaultPoint
from deltawheel.statestore.exceptions import LeaseLostError, StaleSequencerError
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.leases import LeaseManager
from deltawheel.statestore.zk.watermarks import WatermarkAuthority
from executor_util import BucketCounter, events, stream_rows
from pyspark import cloudpickle
from test_leases import expire_session

pytestmark = [pytest.mark.spark, pytest.mark.zk]

# Spark's Python workers cannot import test modules: ship this module's classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

B1 = [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "cats", 12_000), ("r2", "dogs", 2_000)]
B2 = [("r4", "cats", 15_000), ("r5", "dogs", 21_000), ("r1", "cats", 1_000)]
# every window of B1 + B2 once, as (key, value) of the counter's stream
ALL_WINDOWS = sorted([
    ("cats", '{"n": 1, "q": "cats", "start": 0}'), ("cats", '{"n": 2, "q": "cats", "start": 10000}'),
    ("dogs", '{"n": 1, "q": "dogs", "start": 0}'), ("dogs", '{"n": 1, "q": "dogs", "start": 20000}')])


class SyncCounter(BucketCounter):
    """The same counter under another name: its batches run with ``run_batch`` (step 7 inline)."""

    name = "buckets_sync"
    outputs = ("counts_sync",)

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        st = dict(ctx.state or {})
        n = st.pop(timer.tag, 0)
        ctx.produce("counts_sync", {"q": ctx.key, "start": int(timer.tag), "n": n}, timestamp_ms=int(timer.tag))
        ctx.state = st or None


def _executor(spark: Any, layout: Any, zk_config: Any, comp: Any, *, writer: str,
              faults: Any = None) -> tuple[ComputationExecutor, Any, WatermarkAuthority]:
    """An executor of pipeline "test" holding all its intervals, fed by injector "src"."""
    client = connect(zk_config)
    leases = LeaseManager(client, pipeline="test", owner=writer)
    owner = IntervalOwner(RowStore(spark, layout, writer=writer), leases, comp.name,
                          num_intervals=type(comp).num_intervals)
    authority = WatermarkAuthority(client, pipeline="test")
    ex = ComputationExecutor(spark, layout, comp, owner=owner, authority=authority, upstream=["injector:src"],
                             write_path="image", progress=print, faults=faults)
    ex.start(wait_s=30)
    return ex, client, authority


def _close(ex: ComputationExecutor | None, client: Any) -> None:
    try:
        if ex is not None:
            ex.stop()
    finally:
        client.stop()
        client.close()


def _windows(spark: Any, layout: Any, stream: str) -> list[tuple[str, str]]:
    return sorted((k, v) for _, k, v, _ in stream_rows(spark, layout, stream))


@pytest.mark.timeout(600)
def test_background_watermarks_are_those_run_batch_publishes(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """Batch for batch, the foreachBatch executor's published low watermark (read after the next
    batch joined its step 7, and after ``settle()``) and its reports' low watermarks are those of
    the same input run with ``run_batch``, and the windows fire at the same watermarks."""
    bg, bg_client, authority = _executor(spark, migrated_store, zk_config, BucketCounter(), writer="bg")
    sync, sync_client, _ = _executor(spark, migrated_store, zk_config, SyncCounter(), writer="sync")
    try:
        lows: dict[str, list[int | None]] = {"buckets": [], "buckets_sync": []}
        for batch_id, (items, injector_ms) in enumerate([(B1, 11_000), (B2, 22_000)]):
            authority.publish_injector("src", injector_ms)
            bg(events(spark, items), batch_id)  # foreachBatch: returns before its step 7 landed
            sync.run_batch(events(spark, items), batch_id)
            bg.settle()
            sync.settle()
            for name in lows:
                lows[name].append(authority.published_low_watermark(name))
        assert lows["buckets"] == lows["buckets_sync"] and lows["buckets"][-1] is not None
        assert [r.low_watermark_ms for r in bg.reports] == [r.low_watermark_ms for r in sync.reports]
        assert [r.timers_fired for r in bg.reports] == [r.timers_fired for r in sync.reports]
        authority.publish_injector("src", 40_000)
        bg.flush()
        sync.flush()
        bg.settle()
        sync.settle()
        assert authority.published_low_watermark("buckets") == authority.published_low_watermark("buckets_sync")
        assert authority.published_low_watermark("buckets") == 40_000
        assert [r.low_watermark_ms for r in bg.reports] == [r.low_watermark_ms for r in sync.reports]
    finally:
        _close(bg, bg_client)
        _close(sync, sync_client)
    assert _windows(spark, migrated_store, "counts") == _windows(spark, migrated_store, "counts_sync") == ALL_WINDOWS


@pytest.mark.timeout(600)
def test_a_background_publish_refused_by_a_takeover_fails_the_next_batch_typed(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, zk_server) -> None:
    """The executor's session expires and another instance takes its intervals while its batch 1
    runs: that batch's step 7, in the background, is refused (a zombie publishes nothing), the next
    batch fails typed before it commits anything, and the new owner delivers every window once."""
    zombie: list[Any] = []
    taker: list[Any] = []

    def take_over(point: FaultPoint, batch_id: int) -> None:
        if point is FaultPoint.BEFORE_WATERMARK and batch_id == 1:
            expire_session(zombie[0], zk_server.hosts)
            taker.append(_executor(spark, migrated_store, zk_config, BucketCounter(), writer="b"))
            # as the zombie left it: nothing it publishes from now on lands
            low_before.append(taker[0][2].published_low_watermark("buckets"))

    low_before: list[int | None] = []
    ex, client, authority = _executor(spark, migrated_store, zk_config, BucketCounter(), writer="a",
                                      faults=take_over)
    zombie.append(client)
    try:
        authority.publish_injector("src", 11_000)
        ex(events(spark, B1), 0)
        authority.publish_injector("src", 22_000)
        ex(events(spark, B2), 1)  # its commit lands; its step 7 is refused in the background
        # the next batch raises that refusal (step 7's own error), before its step 1 would find the leases gone
        rows_version = ex.path.version
        with pytest.raises((StaleSequencerError, LeaseLostError), match="publishing oldest work of interval"):
            ex(events(spark, [("r9", "cats", 23_000)]), 2)
        assert ex.path.version == rows_version  # batch 2 committed nothing
        new, new_client, new_authority = taker[0]
        # the zombie's refused step 7 left the low watermark as it was when the takeover happened
        assert new_authority.published_low_watermark("buckets") == low_before[0]
        new_authority.publish_injector("src", 40_000)
        new.flush()
        new.settle()
        assert new_authority.published_low_watermark("buckets") is not None
        assert new_authority.published_low_watermark("buckets") > 22_000
    finally:
        try:
            ex.owner.release()
        except Exception:  # (its leases are gone with its session)
            pass
        client.stop()
        client.close()
        if taker:
            _close(taker[0][0], taker[0][1])
    assert _windows(spark, migrated_store, "counts") == ALL_WINDOWS
