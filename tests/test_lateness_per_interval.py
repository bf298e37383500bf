"""Lateness is judged per key interval: an instance that takes over intervals with different histories
drops no on-time record of the interval that is behind, and reopens no window of the one ahead.

Two instances share a windowed computation's two intervals. The one on interval 0 runs ahead and
closes its window; the one on interval 1 is behind (its window is open). Then one instance holds both
(a restart after a crash, or a rebalance) and reads a record of each interval behind interval 0's
watermark: interval 1's is on time (its window still counts it), interval 0's is late (its window
closed). Found by a 60-minute chaos run: the new holder judged every interval against the newest
interval's watermark and dropped the backlog of the one behind as too late."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from deltawheel.executor.windowing.windowed import windowed
from deltawheel.executor.windowing.windows import FixedWindows
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

T0 = 1_700_000_000_000


def _keys() -> tuple[str, str]:
    """A key of interval 0 and one of interval 1 (of two)."""
    from deltawheel.statestore.rowtable.rows import interval_of

    names = [f"user-{i}" for i in range(50)]
    return (next(k for k in names if interval_of(k, 2) == 0), next(k for k in names if interval_of(k, 2) == 1))


@pytest.mark.zk
@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])
def test_a_holder_of_intervals_with_different_watermarks_judges_each_by_its_own(
        spark, migrated_store, zk_config, write_path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.protocol.executor import ComputationExecutor
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager
    from executor_util import J, events

    comp = windowed(name="wlate", inputs={"events": "q"}, output="panes", windowing=FixedWindows(10_000),
                    combine="count", num_intervals=2)
    ahead, behind = _keys()
    clients = []

    def executor(name: str, intervals: list[int] | None) -> Any:
        client = connect(zk_config)
        clients.append(client)
        owner = IntervalOwner(RowStore(spark, migrated_store, writer=name),
                              LeaseManager(client, pipeline="test", owner=name), comp.name, num_intervals=2)
        ex = ComputationExecutor(spark, migrated_store, comp, owner=owner, write_path=write_path,
                                 manual_watermarks=True, intervals=intervals)
        ex.start(wait_s=30)
        return ex

    try:
        b = executor("b", [1])  # behind: its window [T0, T0+10 s) stays open
        b.run_batch(events(spark, [("b1", behind, T0 + 1_000)]), 0, input_watermark_ms=T0 + 500)
        b.stop()
        a = executor("a", [0])  # ahead: its window closes at T0+25 s
        a.run_batch(events(spark, [("a1", ahead, T0 + 1_000)]), 0)
        a.run_batch(None, 1, input_watermark_ms=T0 + 25_000)
        a.stop()

        both = executor("c", None)  # one instance now holds both (its own query: its own batch ids)
        got = both.run_batch(events(spark, [("b2", behind, T0 + 2_000), ("a2", ahead, T0 + 3_000)]), 7)
        assert got.processed == 2
        both.run_batch(None, 8, input_watermark_ms=T0 + 25_000)
        # once more: the marks the takeover's batches left judge the same way (interval 0 stays ahead)
        both.run_batch(events(spark, [("a3", ahead, T0 + 4_000)]), 9)
        both.stop()
    finally:
        for client in clients:
            client.stop()
            client.close()

    def stream(name: str) -> list[dict[str, Any]]:
        return [J.decode(r["value"]) for r in spark.read.format("delta").load(migrated_store.stream(name)).collect()]

    panes = {(p["key"], p["window_start"]): p["value"] for p in stream("panes")}
    assert panes == {(behind, T0): 2, (ahead, T0): 1}  # b2 counted on time; a2, a3 reopened nothing
    dropped = sorted((d["key"], d["reason"], d["event_time"]) for d in stream("panes_dropped"))
    assert dropped == [(ahead, "too_late", T0 + 3_000), (ahead, "too_late", T0 + 4_000)]
