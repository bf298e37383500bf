"""The computation settings given to ``windowed(...)`` act: each one changes what the computation
does, through the testing harness where that is where the setting acts (the per-key runner), and
through real Spark batches for those the executor's driver and tasks read (intervals, codec, the
dedup horizon, weak productions and their timeouts)."""

from __future__ import annotations

import sys
import threading
from datetime import timedelta
from typing import Any

import pytest
from deltawheel.executor.computation import ErrorPolicy, LatePolicy
from deltawheel.executor.tasks.usercode.keyrun import UserCodeError
from deltawheel.executor.windowing.settings import SETTINGS
from deltawheel.executor.windowing.triggers import AfterCount, Repeatedly
from deltawheel.executor.windowing.windowed import WindowedComputation, windowed
from deltawheel.executor.windowing.windows import FixedWindows
from deltawheel.statestore.exceptions import CodecError, ConfigError
from pyspark import cloudpickle

from deltawheel.testing import ComputationTester

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

T0 = 1_700_000_000_000


def _counts(**settings: Any) -> WindowedComputation:
    """Clicks per user and 10 s window."""
    return windowed(name="clicks", inputs={"clicks": "user"}, output="panes", windowing=FixedWindows(10_000),
                    combine="count", **settings)


def _pane_values(t: ComputationTester) -> list[Any]:
    return [o.value["value"] for o in t.output("panes")]


# ------------------------------------------------------- the per-key runner

@pytest.mark.parametrize("settings, counted", [({}, 1), ({"dedup_retention": timedelta(seconds=5)}, 2)],
                         ids=["default-10min", "5s"])
def test_dedup_retention_decides_whether_a_retry_is_a_duplicate(settings: dict[str, Any], counted: int) -> None:
    """A producer retries a record 6 s after it was processed: within the default 10 min it is a
    duplicate; past a 5 s retention its id has left the row, and it counts again."""
    t = ComputationTester(_counts(**settings))
    t.add({"user": "ann"}, event_time_ms=1_000, record_id="r1")
    t.advance_processing_time(6_000)
    t.add({"user": "ann"}, event_time_ms=1_000, record_id="r1")
    t.finish()
    assert _pane_values(t) == [counted]


@pytest.mark.parametrize("exactly_once, counted", [(True, 1), (False, 2)])
def test_exactly_once_off_counts_a_redelivered_record_twice(exactly_once: bool, counted: int) -> None:
    t = ComputationTester(_counts(exactly_once=exactly_once))
    for _ in range(2):
        t.add({"user": "ann"}, event_time_ms=1_000, record_id="r1")
    t.finish()
    assert _pane_values(t) == [counted]
    assert t.duplicates == 2 - counted


@pytest.mark.parametrize("late_policy", [LatePolicy.PROCESS, "route"])
def test_late_policy_route_sends_late_records_to_late_data_instead_of_the_windows(late_policy: Any) -> None:
    """PROCESS (the default): the windowed computation judges a late record itself (behind the
    allowed lateness: dropped to ``panes_dropped``); ROUTE: it never sees it, late_data has it."""
    t = ComputationTester(_counts(late_policy=late_policy))
    t.add({"user": "ann"}, event_time_ms=11_000)
    t.advance_watermark(20_000)
    t.add({"user": "ann"}, event_time_ms=1_000)  # [0, 10 s) ended 10 s before the watermark
    dropped = [(o.value["reason"], o.value["event_time"]) for o in t.output("panes_dropped")]
    if late_policy is LatePolicy.PROCESS:
        assert dropped == [("too_late", 1_000)] and t.late_data == []
    else:
        assert dropped == [] and [r.timestamp_ms for r in t.late_data] == [1_000]


def test_error_policy_dead_letter_keeps_the_window_going_past_a_bad_record() -> None:
    """The ``value`` function fails on a record without a count: the default fails the run naming
    the key and record; with DEAD_LETTER the record becomes a dead letter and the others count."""
    def build(**settings: Any) -> WindowedComputation:
        return windowed(name="sums", inputs={"clicks": "user"}, output="panes", windowing=FixedWindows(10_000),
                        value=lambda v: v["n"], **settings)

    strict = ComputationTester(build())
    with pytest.raises(UserCodeError, match=r"sums: user code failed for key 'ann' on record 'bad'.*KeyError"):
        strict.add({"user": "ann"}, event_time_ms=1_000, record_id="bad")
    t = ComputationTester(build(error_policy=ErrorPolicy.DEAD_LETTER))
    t.add({"user": "ann", "n": 2}, event_time_ms=1_000)
    t.add({"user": "ann"}, event_time_ms=2_000, record_id="bad")
    t.add({"user": "ann", "n": 3}, event_time_ms=3_000)
    t.finish()
    assert _pane_values(t) == [5]
    assert [(r.record_id, err.split(":")[0]) for r, err in t.dead_letters] == [("bad", "KeyError")]


# --------------------------------------------------------------- refusals

def test_an_unknown_setting_is_refused_naming_the_accepted_ones() -> None:
    with pytest.raises(ConfigError, match=r"windowed computation 'clicks': unknown setting 'dedup_retention_ms', "
                                          r"'event_time_timers'; windowed\(\.\.\.\) accepts the computation settings "
                                          r"num_intervals, codec, allow_pickle, exactly_once, dedup_retention, "
                                          r"strong_productions, straggler_timeout_s, delivery_timeout_s, late_policy, "
                                          r"error_policy, state_ttl, state_ttl_processing and the arguments name, inputs, .*combine, value"):
        _counts(dedup_retention_ms=5_000, event_time_timers=False)


@pytest.mark.parametrize("settings, message", [
    ({"exactly_once": "yes"}, "exactly_once must be True or False, got 'yes'"),
    ({"strong_productions": 0}, "strong_productions must be True or False, got 0"),
    ({"straggler_timeout_s": -1}, r"straggler_timeout_s must be a number of seconds >= 0, got -1"),
    ({"delivery_timeout_s": "10"}, r"delivery_timeout_s must be a number of seconds >= 0, got '10'"),
    ({"late_policy": "drop"}, r"late_policy must be one of process, route \(or LatePolicy\), got 'drop'"),
    ({"error_policy": "skip"}, r"error_policy must be one of fail, dead_letter \(or ErrorPolicy\), got 'skip'"),
    ({"num_intervals": 0}, "clicks: num_intervals must be 1..4096, got 0"),
    ({"dedup_retention": 600}, "clicks: dedup_retention must be a positive timedelta, got 600"),
])
def test_a_bad_setting_is_refused(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _counts(**settings)


def test_pickle_needs_allow_pickle() -> None:
    with pytest.raises(CodecError, match="the pickle codec runs code when it decodes; pass allow_pickle=True"):
        _counts(codec="pickle")
    assert type(_counts(codec="pickle", allow_pickle=True)).codec == "pickle"


@pytest.mark.parametrize("attr", SETTINGS)
def test_a_setting_set_on_the_built_computation_is_refused(attr: str) -> None:
    """Set on the returned object, a setting would reach the parts of the executor that read the
    instance and not those that read the class: it is given to windowed(...) instead."""
    comp = _counts()
    with pytest.raises(ConfigError, match=rf"clicks: {attr} of a windowed computation is given where it is built, "
                                          rf"windowed\(\.\.\., {attr}=\.\.\.\)"):
        setattr(comp, attr, getattr(comp, attr))
    comp.note = "other attributes are the user's"  # type: ignore[attr-defined]


# ------------------------------------------------------- real Spark batches

@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(600)
def test_settings_act_in_real_spark_batches(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """One windowed computation with non-default settings, run by the executor on the image path:

    * ``num_intervals=2``: its rows are in intervals crc32(key) mod 2;
    * ``codec="msgpack"``: its rows and its panes are msgpack;
    * ``dedup_retention=5 s``: a retry 5 s later is a duplicate, 1 ms later it counts again, and
      the id then leaves the rows;
    * ``strong_productions=False`` with ``straggler_timeout_s=0.3``: a delivery still running after
      0.3 s makes the batch a straggler (the default waits 5 s);
    * ``delivery_timeout_s=1.0``: the next batch gives up on that delivery after 1 s.
    """
    from deltawheel.executor.protocol.executor import ComputationExecutor
    from deltawheel.executor.protocol.faults import BatchFailedError, FaultPoint
    from deltawheel.statestore.clock import ManualClock
    from deltawheel.statestore.codecs import get_codec
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.rows import interval_of
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager
    from executor_util import events

    comp = windowed(name="wsettings", inputs={"events": "q"}, output="panes", windowing=FixedWindows(10_000),
                    trigger=Repeatedly(AfterCount(1)), accumulation="accumulating", combine="count",
                    num_intervals=2, codec="msgpack",
                    dedup_retention=timedelta(seconds=5), strong_productions=False, straggler_timeout_s=0.3,
                    delivery_timeout_s=1.0)
    gate = threading.Event()

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point is FaultPoint.IN_WEAK_DELIVERY and batch_id == 2:
            assert gate.wait(120)  # the stream table hangs

    clock = ManualClock(T0)
    client = connect(zk_config)
    owner = IntervalOwner(RowStore(spark, migrated_store, writer="w"), LeaseManager(client, pipeline="test", owner="w"),
                          comp.name, num_intervals=2)
    ex = ComputationExecutor(spark, migrated_store, comp, owner=owner, clock=clock, faults=faults, write_path="image",
                             manual_watermarks=True, progress=print)
    ex.start(wait_s=20)

    def rows() -> dict[str, Any]:
        df = spark.read.format("delta").load(migrated_store.rows_of("wsettings")).where("computation = 'wsettings'")
        return {r["key"]: r for r in df.collect() if not r["key"].startswith("\x00")}  # no fence rows

    try:
        b0 = ex.run_batch(events(spark, [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "emus", 3_000)]), 0)
        assert b0.processed == 3
        got = rows()
        assert {k: r["interval"] for k, r in got.items()} == {k: interval_of(k, 2) for k in ("cats", "dogs", "emus")}
        assert {r["codec"] for r in got.values()} == {"msgpack"}
        assert get_codec("msgpack").decode(got["cats"]["state"])["w"]["0,10000"]["a"] == 1

        clock.advance(5_000)
        assert ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 1).duplicates == 1
        # batch 0's weak delivery has landed (had it straggled on a busy machine, batch 1 settled it)
        panes = spark.read.format("delta").load(migrated_store.stream("panes")).collect()
        assert {p["codec"] for p in panes} == {"msgpack"} and len(panes) == 3
        assert sorted(get_codec("msgpack").decode(p["value"])["key"] for p in panes) == ["cats", "dogs", "emus"]
        clock.advance(1)
        b2 = ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 2)  # its delivery hangs
        assert b2.processed == 1 and b2.straggled  # 0.3 s, not the default 5 s
        assert not rows()["dogs"]["record_ids"]  # r2 left dogs' row too (seen 5.001 s ago)
        with pytest.raises(BatchFailedError, match=r"still running after delivery_timeout_s=1.0s"):
            ex.run_batch(events(spark, [("r4", "cats", 4_000)]), 3)
    finally:
        gate.set()
        if ex.inflight.open is not None:
            ex.inflight.open.thread.join(60)
        client.stop()  # the process ends: its leases go
        client.close()
