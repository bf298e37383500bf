"""State TTL and state versions without Spark: the testing harness (``ComputationTester``) and the
per-key runner the executor's tasks use (``run_key``).

A key not touched for the computation's ``state_ttl`` of event time (its ``state_ttl_processing``
of processing time) is dropped -- state, timers, record ids -- when the watermark (the clock)
moves past it, also when no record of it comes again; a computation of ``state_version`` 2 reads
a version 1 row through ``upgrade_state`` on first touch; the errors are typed.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from deltawheel.executor.context import TTL_TAG
from deltawheel.executor.exceptions import StateUpgradeError
from deltawheel.executor.tasks.usercode.keyrun import run_key
from deltawheel.executor.testkit import ComputationTester
from deltawheel.statestore.rowtable.rows import TimeDomain
from ttl_util import IdleVisits, TotalsV1, TotalsV2, TotalsV2Broken, TotalsV2BrokenDeadLetter, Visits

from deltawheel import ConfigError, FixedWindows, Record, UserCodeError, windowed

MINUTE = 60_000


def test_the_harness_shows_keys_expiring_in_event_time_as_the_watermark_advances() -> None:
    t = ComputationTester(Visits())
    t.add({"user": "ann"}, event_time_ms=1_000, record_id="r1")
    t.add({"user": "bob"}, event_time_ms=2_000)
    t.advance_watermark(30_000)
    t.add({"user": "bob"}, event_time_ms=40_000)  # touched again: its minute counts from 40 s
    assert t.keys() == ["ann", "bob"] and t.timers("ann") == []  # the TTL's timer is not the user's
    t.advance_watermark(61_000)
    assert t.expired == [] and t.keys() == ["ann", "bob"]  # ann's minute ends at 61 s: not yet past
    t.advance_watermark(61_001)
    assert t.expired == ["ann"] and t.keys() == ["bob"] and t.state("ann") is None and t.state("bob") == 2
    # its record ids went with it: the same record again is a new one for a new key
    t.add({"user": "ann"}, event_time_ms=70_000, record_id="r1")
    assert t.state("ann") == 1 and t.duplicates == 0
    t.advance_watermark(100_001)
    assert t.expired == ["ann", "bob"] and t.keys() == ["ann"]


def test_the_harness_shows_keys_expiring_in_processing_time() -> None:
    t = ComputationTester(IdleVisits(), now_ms=0)
    t.add({"user": "ann"}, event_time_ms=1_000)
    t.advance_processing_time(5 * MINUTE)
    t.add({"user": "bob"}, event_time_ms=2_000)
    t.advance_watermark(10**12)  # event time does not matter to a processing-time TTL
    assert t.expired == []
    t.advance_processing_time(10 * MINUTE + 1)
    assert t.expired == ["ann"] and t.keys() == ["bob"]
    t.advance_processing_time(15 * MINUTE + 1)
    assert t.expired == ["ann", "bob"] and t.keys() == []


def test_a_key_left_with_nothing_keeps_no_ttl_timer_and_a_late_record_still_touches() -> None:
    class Once(Visits):
        def process_record(self, ctx: Any, record: Any) -> None:
            ctx.state = None if record.value.get("forget") else (ctx.state or 0) + 1

    t = ComputationTester(Once())
    t.add({"user": "ann", "forget": True}, event_time_ms=1_000)
    row = t._rows.load("ann")
    assert row is not None and row.timers == ()  # only its record id: swept by the dedup retention
    t.add({"user": "bob"}, event_time_ms=1_000)
    t.advance_watermark(50_000)
    t.add({"user": "bob"}, event_time_ms=2_000)  # late, but it touches bob at the watermark
    t.advance_watermark(60_002)
    assert t.expired == [] and t.state("bob") == 2
    t.advance_watermark(110_001)
    assert t.expired == ["bob"]


def test_user_timers_fire_before_the_ttl_drops_the_key_and_the_tag_is_reserved() -> None:
    class Reminder(Visits):
        def process_record(self, ctx: Any, record: Any) -> None:
            ctx.state = (ctx.state or 0) + 1
            ctx.set_timer("remind", record.timestamp_ms + 5 * MINUTE)  # later than the TTL

        def process_timer(self, ctx: Any, timer: Any) -> None:
            ctx.produce("counts", {"user": ctx.key, "n": ctx.state})

    t = ComputationTester(Reminder())
    t.add({"user": "ann"}, event_time_ms=0)
    assert [x.tag for x in t.timers("ann")] == ["remind"]
    t.advance_watermark(10 * MINUTE)
    assert t.expired == ["ann"] and t.output() == []  # dropped with its timer, which never fired

    class Sneaky(Visits):
        def process_record(self, ctx: Any, record: Any) -> None:
            ctx.set_timer(TTL_TAG, 0, domain=TimeDomain.PROCESSING_TIME)

    with pytest.raises(UserCodeError, match="reserved for the executor's own timers"):
        ComputationTester(Sneaky()).add({"user": "ann"}, event_time_ms=0)


@pytest.mark.parametrize("attr", ["state_ttl", "state_ttl_processing"])
@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-5), 60])
def test_a_ttl_of_zero_negative_or_not_a_timedelta_is_refused(attr: str, ttl: Any) -> None:
    comp = type("Bad", (Visits,), {attr: ttl})
    with pytest.raises(ConfigError, match=f"{attr} must be a positive timedelta"):
        comp.validate()
    with pytest.raises(ConfigError, match=f"{attr} must be a positive timedelta"):
        ComputationTester(comp())


def test_a_windowed_ttl_shorter_than_the_allowed_lateness_is_warned_about_at_start(caplog: Any) -> None:
    def build(ttl: timedelta) -> Any:
        return windowed(name="w", inputs={"clicks": "user"}, output="panes", windowing=FixedWindows(MINUTE),
                        allowed_lateness_ms=10 * MINUTE, state_ttl=ttl)

    with caplog.at_level(logging.WARNING):
        ComputationTester(build(timedelta(minutes=5)))
    assert "state_ttl (300000 ms) is shorter than the allowed lateness (600000 ms)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ComputationTester(build(timedelta(minutes=30)))
    assert "allowed lateness" not in caplog.text
    with pytest.raises(ConfigError, match="state_ttl must be a positive timedelta"):
        build(timedelta(0))


def test_a_windowed_computation_closes_windows_within_its_ttl_and_loses_those_longer() -> None:
    w = windowed(name="w", inputs={"clicks": "user"}, output="panes", windowing=FixedWindows(10 * MINUTE),
                 combine="count", state_ttl=timedelta(minutes=5))
    t = ComputationTester(w)
    t.add({"user": "ann"}, event_time_ms=1_000)
    t.add({"user": "bob"}, event_time_ms=1_000)
    t.advance_watermark(4 * MINUTE)
    t.add({"user": "bob"}, event_time_ms=5 * MINUTE)  # bob is touched again, ann is not
    t.advance_watermark(6 * MINUTE)
    assert t.expired == ["ann"]  # its window (open until 10 min) went with it
    t.advance_watermark(10 * MINUTE)  # bob's TTL ends at 10 min, its window closes just before
    assert [(o.key, o.value["value"]) for o in t.output("panes")] == [("bob", 2)] and t.expired == ["ann"]


# ------------------------------------------------------------------ state versions (run_key)


def test_version_1_rows_are_upgraded_on_first_touch_and_written_as_version_2() -> None:
    v1 = run_key(TotalsV1(), key="ann", interval=0, row=None, records=[_rec("ann", "a1")], input_watermark_ms=None,
                 now_ms=0).row
    assert v1 is not None and v1.codec == "json" and v1.state == b"1"
    out = run_key(TotalsV2(), key="ann", interval=0, row=v1, records=[_rec("ann", "a2", ts=7)],
                  input_watermark_ms=None, now_ms=0)
    assert out.row is not None and out.row.codec == "json@2"
    assert out.row.state == b'{"last":7,"n":2}'
    assert [p.value for p in out.productions] == [b'{"n":2,"user":"ann"}']
    # a v2 row read by the v1 code is refused, not misread
    with pytest.raises(UserCodeError, match="newer than this code's 1") as err:
        run_key(TotalsV1(), key="ann", interval=0, row=out.row, records=[_rec("ann", "a3")],
                input_watermark_ms=None, now_ms=0)
    assert isinstance(err.value.__cause__, StateUpgradeError)


def test_an_upgrade_that_raises_fails_the_batch_or_dead_letters_the_keys_records() -> None:
    v1 = run_key(TotalsV1(), key="bob", interval=0, row=None, records=[_rec("bob", "b1"), _rec("bob", "b2")],
                 input_watermark_ms=None, now_ms=0).row
    assert v1 is not None and v1.state == b"2"
    with pytest.raises(UserCodeError, match="upgrade_state of totals from state_version 1 to 2 failed") as err:
        run_key(TotalsV2Broken(), key="bob", interval=0, row=v1, records=[_rec("bob", "b3")],
                input_watermark_ms=None, now_ms=0)
    assert isinstance(err.value.__cause__, StateUpgradeError)
    assert "cannot upgrade a count of 2" in str(err.value)
    out = run_key(TotalsV2BrokenDeadLetter(), key="bob", interval=0, row=v1, records=[_rec("bob", "b3")],
                  input_watermark_ms=None, now_ms=0)
    assert [(r.record_id, "StateUpgradeError" in why) for r, why in out.dead_letters] == [("b3", True)]
    assert out.row is not None and (out.row.state, out.row.codec) == (b"2", "json")  # left as it was
    assert out.productions == () and [s.record_id for s in out.row.record_ids] == ["b1", "b2", "b3"]


def test_the_harness_runs_version_1_rows_with_the_version_2_code() -> None:
    old = ComputationTester(TotalsV1())
    for user in ("ann", "ann", "bob", "cy", "cy"):
        old.add({"user": user}, event_time_ms=1_000)
    new = old.with_computation(TotalsV2())
    new.add({"user": "ann"}, event_time_ms=5_000)
    assert [o.value for o in new.output()] == [{"user": "ann", "n": 3}]
    assert (new.state("ann"), new.state("bob")) == ({"n": 3, "last": 5_000}, 1)  # bob not touched: v1
    with pytest.raises(UserCodeError, match="cannot upgrade a count of 2"):
        new.with_computation(TotalsV2Broken()).add({"user": "cy"}, event_time_ms=6_000)
    dl = new.with_computation(TotalsV2BrokenDeadLetter())
    dl.add({"user": "cy"}, event_time_ms=6_000)
    dl.add({"user": "bob"}, event_time_ms=6_000)
    assert [(r.key, "StateUpgradeError" in why) for r, why in dl.dead_letters] == [("cy", True)]
    assert (dl.state("cy"), dl.state("bob")) == (2, {"n": 2, "last": 6_000})
    with pytest.raises(ConfigError, match="'visits' is not 'totals'"):
        new.with_computation(Visits())


@pytest.mark.slow
def test_the_harness_upgrades_a_stores_version_1_rows_on_first_touch(spark: Any, tmp_path: Any) -> None:
    store = str(tmp_path / "store")
    old = ComputationTester(TotalsV1(), spark=spark, store=store)
    for i, user in enumerate(("ann", "ann", "bob")):
        old.add({"user": user}, event_time_ms=1_000, record_id=f"old-{i}")
    assert (old.state("ann"), old.state("bob")) == (2, 1)
    new = ComputationTester(TotalsV2(), spark=spark, store=store)
    new.add({"user": "ann"}, event_time_ms=5_000, record_id="new-0")
    assert [o.value for o in new.output()] == [{"user": "ann", "n": 3}]
    assert new.state("ann") == {"n": 3, "last": 5_000}
    new.reload()
    rows = {r.key: r for r in new._rows.store.scan_intervals("totals", range(TotalsV2.num_intervals))}  # type: ignore[union-attr]
    assert (rows["ann"].codec, rows["bob"].codec) == ("json@2", "json")  # bob was not touched: still v1
    broken = ComputationTester(TotalsV2Broken(), spark=spark, store=store)
    broken.add({"user": "bob"}, event_time_ms=6_000, record_id="new-1")  # count 1: upgrades
    assert broken.state("bob") == {"n": 2, "last": 6_000}


@pytest.mark.parametrize("version", [0, -1, True, "2"])
def test_a_state_version_that_is_not_a_whole_number_from_1_is_refused(version: Any) -> None:
    comp = type("Bad", (TotalsV2,), {"state_version": version})
    with pytest.raises(ConfigError, match="state_version must be a whole number >= 1"):
        comp.validate()


def test_a_version_2_computation_without_upgrade_state_says_what_to_define() -> None:
    class NoUpgrade(TotalsV1):
        state_version = 2

    v1 = run_key(TotalsV1(), key="cy", interval=0, row=None, records=[_rec("cy", "c1")], input_watermark_ms=None,
                 now_ms=0).row
    with pytest.raises(UserCodeError, match=r"define upgrade_state\(self, state, from_version\)"):
        run_key(NoUpgrade(), key="cy", interval=0, row=v1, records=[_rec("cy", "c2")], input_watermark_ms=None,
                now_ms=0)


def _rec(key: str, rid: str, *, ts: int = 1) -> Record:
    return Record(key=key, value={"user": key}, timestamp_ms=ts, record_id=rid, stream="clicks")



def test_the_example_in_embedding_md_runs_as_written() -> None:
    """docs/embedding.md's "State TTL and state versions" block: its v2 class reads a v1 tester's
    bare counts through ``upgrade_state`` and forgets a user idle for an hour of event time."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "embedding.md").read_text(encoding="utf-8")
    rest = text[text.index("### State TTL and state versions"):]
    block = re.findall(r"```python\n(.*?)```", rest, flags=re.S)[0]
    ns: dict[str, Any] = {"__name__": "embedding_ttl"}
    exec(compile(block, "docs/embedding.md:state-ttl", "exec"), ns)
    visits = ns["Visits"]

    class VisitsV1(visits):  # type: ignore[misc, valid-type]
        state_version = 1

        def process_record(self, ctx: Any, record: Any) -> None:
            ctx.state = (ctx.state or 0) + 1

    old = ComputationTester(VisitsV1())
    old.add({"user": "ann"}, event_time_ms=0)
    old.add({"user": "bob"}, event_time_ms=0)
    t = old.with_computation(visits())
    t.add({"user": "ann"}, event_time_ms=30 * MINUTE)
    assert [o.value for o in t.output("counts")] == [{"user": "ann", "n": 2}]
    assert (t.state("ann"), t.state("bob")) == ({"n": 2}, 1)
    t.advance_watermark(61 * MINUTE)  # bob: idle for an hour
    assert t.expired == ["bob"] and t.keys() == ["ann"]
    t.advance_watermark(91 * MINUTE)
    assert t.expired == ["bob", "ann"]


def test_a_windowing_scenario_with_a_state_ttl_lists_the_keys_it_drops_as_the_watermark_advances() -> None:
    from deltawheel.executor.windowing.harness import run_scenario

    scenario = {"name": "ttl", "windowing": {"type": "fixed", "size": 600}, "combine": "count", "state_ttl": 120,
                "steps": [{"key": "ann", "value": 1, "event_time": 10}, {"key": "bob", "value": 1, "event_time": 20},
                          {"watermark": 100}, {"key": "bob", "value": 1, "event_time": 110},
                          {"watermark": 131}, {"watermark": 600}]}
    out = run_scenario(scenario)
    assert out["expired"] == [{"key": "ann", "after_step": 4}, {"key": "bob", "after_step": 5}]
    assert out["panes"] == []  # both windows (open until 600 s) went with their keys
    no_ttl = run_scenario({k: v for k, v in scenario.items() if k != "state_ttl"})
    assert "expired" not in no_ttl and [p["value"] for p in no_ttl["panes"]] == [1, 2]


def test_a_versioned_codec_column_decodes_everywhere_and_a_malformed_one_is_refused() -> None:
    from deltawheel.statestore.codecs import codec_version, get_codec, versioned_name
    from deltawheel.statestore.exceptions import CodecError
    from deltawheel.statestore.inspection.sqlviews import decode_value

    assert versioned_name("msgpack", 2) == "msgpack@2" and codec_version("msgpack@2") == 2
    assert get_codec("json@3").decode(b'{"n":1}') == {"n": 1}
    assert decode_value("json@2", b'{"n":1}') == {"n": 1}  # what the SQL views show
    with pytest.raises(CodecError, match="names state version 'x', not a whole number >= 1"):
        get_codec("json@x")
    with pytest.raises(CodecError, match="the pickle codec runs code"):
        get_codec("pickle@2")
