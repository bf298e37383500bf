"""A stage's low watermark never passes the input its batch in flight has read.

A continuous stage acts, in each batch, on the upstream watermarks read before Spark planned the
batch, and holds its own low watermark at them for the input after them
(``BatchInputs(hold="from_commit")``). Its low watermark is also published in the middle of a
batch, when the previous batch's delivery settles; that publish must still hold the batch's own
input, which came after the previous batch's upstream watermarks. A chaos run found the hole: a
publish during a batch used the new hold, a later stage fired its windows before that input
reached it, and counted it late."""

from __future__ import annotations

import time
from typing import Any

import pytest
from executor_util import BucketCounter, events, start_executor, stop_executor

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def test_a_publish_during_a_batch_holds_the_input_that_batch_read(spark: Any, migrated_store: Any,
                                                                   zk_config: Any) -> None:
    from deltawheel.executor.protocol.faults import FaultPoint
    from deltawheel.executor.protocol.host import BatchInputs

    t0 = int(time.time() * 1000) - 600_000
    during: dict[int, Any] = {}
    ex: Any = None

    def settle_during(point: FaultPoint, batch_id: int) -> None:
        if point == FaultPoint.AFTER_PREPARE and batch_id == 1:  # what a delivery settling now publishes
            ex._protocol.watermarks.publish()
            during.update(ex.authority.oldest_work("buckets", 4))

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), faults=settle_during,
                                watermarks=True)
    try:
        ex.authority.declare("up", upstream=["injector:events"], num_intervals=1, replace=True)
        ex.authority.declare("buckets", upstream=["computation:up"], num_intervals=4, replace=True)
        ex.upstream = ("computation:up",)
        # batch 0 acts on the upstream's t0 + 1 s
        ex.next_batch_inputs(BatchInputs(upstream_caps={"up": t0 + 1_000}, hold="from_commit"))
        ex.run_batch(events(spark, [("r1", "cats", t0 + 1_500)]), 0)
        assert ex._protocol.watermarks.hold_ms == t0 + 1_000
        # batch 1 acts on t0 + 300 s; its own input came after t0 + 1 s
        ex.next_batch_inputs(BatchInputs(upstream_caps={"up": t0 + 300_000}, hold="from_commit"))
        ex.run_batch(events(spark, [("r2", "dogs", t0 + 2_000), ("r3", "emus", t0 + 250_000)]), 1)
        assert ex._protocol.watermarks.hold_ms == t0 + 300_000  # committed: what comes after t0 + 300 s is held
        after = ex.authority.oldest_work("buckets", 4)
    finally:
        stop_executor(ex, client)
    assert sorted(during) == [0, 1, 2, 3], during
    assert all(w is not None and w["oldest_work_ms"] <= t0 + 1_000 for w in during.values()), during
    # after the commit the intervals hold at most the new caps, and the buckets' timers
    assert all(w is not None and w["oldest_work_ms"] <= t0 + 300_000 for w in after.values()), after
    assert max(w["oldest_work_ms"] for w in after.values()) > t0 + 1_000, after
