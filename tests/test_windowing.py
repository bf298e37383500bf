"""Unit tests of windows, triggers, combiners, window GC and retractions (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import pytest
from deltawheel.executor.computation import Record
from deltawheel.executor.tasks.usercode.keyrun import UserCodeError, run_key
from deltawheel.executor.windowing.combiners import (
    CombineFn,
    Count,
    Max,
    Mean,
    Min,
    Sum,
    combine_fn_from_spec,
)
from deltawheel.executor.windowing.harness import (
    MemoryBackend,
    assert_panes_equal,
    run_scenario,
    trigger_from_spec,
    window_fn_from_spec,
)
from deltawheel.executor.windowing.panes import AccumulationMode, Pane, PaneInfo, Timing
from deltawheel.executor.windowing.triggers import (
    AfterAll,
    AfterCount,
    AfterEach,
    AfterProcessingTime,
    AfterWatermark,
    DefaultTrigger,
    OrFinally,
    Repeatedly,
    Trigger,
    TriggerContext,
)
from deltawheel.executor.windowing.windowed import WindowedComputation, WindowingStrategy, windowed
from deltawheel.executor.windowing.windows import (
    GLOBAL_WINDOW,
    FixedWindows,
    GlobalWindows,
    Sessions,
    SlidingWindows,
    Window,
    WindowFn,
    WindowingError,
    merge_overlapping,
)
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.rowtable.rows import KeyRow, TimeDomain

from deltawheel.cli import main as cli_main

J = get_codec("json")
SCENARIOS = Path(__file__).parent / "scenarios"


# ------------------------------------------------------------------ windows

def test_fixed_sliding_global_assignment() -> None:
    assert FixedWindows(100).assign(-1) == (Window(-100, 0),)
    assert FixedWindows(60, 15).assign(10) == (Window(-45, 15),)
    assert SlidingWindows(60, 30).assign(30) == (Window(0, 60), Window(30, 90))
    assert SlidingWindows(60, 20).assign(5) == (Window(-40, 20), Window(-20, 40), Window(0, 60))
    assert GlobalWindows().assign(123) == (GLOBAL_WINDOW,)
    assert GLOBAL_WINDOW.is_global and Window.from_wid(GLOBAL_WINDOW.wid) == GLOBAL_WINDOW
    assert Window.from_wid(Window(-5, 7).wid) == Window(-5, 7)


def test_sessions_merge_transitively_and_not_when_touching() -> None:
    s = Sessions(10)
    assert s.merging and s.assign(5) == (Window(5, 15),)
    assert merge_overlapping([Window(0, 10), Window(10, 20)]) == []
    assert merge_overlapping([Window(0, 10), Window(20, 30), Window(8, 22)]) == [
        (Window(0, 30), [Window(0, 10), Window(8, 22), Window(20, 30)])]


def test_window_fn_errors() -> None:
    with pytest.raises(WindowingError, match="must be after its start"):
        Window(5, 5)
    with pytest.raises(WindowingError, match="fixed window size must be > 0"):
        FixedWindows(0)
    with pytest.raises(WindowingError, match="sliding windows need size and period > 0"):
        SlidingWindows(10, 0)
    with pytest.raises(WindowingError, match="session gap must be > 0"):
        Sessions(-1)
    with pytest.raises(WindowingError, match="unknown windowing type 'tumbling'"):
        window_fn_from_spec({"type": "tumbling"})
    with pytest.raises(WindowingError, match="needs a number 'size'"):
        window_fn_from_spec({"type": "fixed"})
    assert window_fn_from_spec({"type": "sliding", "size": 2, "period": 1}) == SlidingWindows(2000, 1000)


# ----------------------------------------------------------------- triggers

def _tc(trigger: Trigger, *, wm: int | None = None, now: int = 0, end: int = 100) -> TriggerContext:
    return TriggerContext(trigger.initial_state(), wm, now, end)


def test_after_count_finishes_and_repeatedly_resets() -> None:
    t = AfterCount(2)
    tc = _tc(t)
    t.on_element(tc, 0)
    assert not t.should_fire(tc, 0)
    t.on_element(tc, 0)
    assert t.should_fire(tc, 0)
    t.on_fire(tc, 0)
    assert t.is_finished(tc, 0)
    r = Repeatedly(AfterCount(1))
    tc = _tc(r)
    for _ in range(3):
        r.on_element(tc, 0)
        assert r.should_fire(tc, 0)
        r.on_fire(tc, 0)
        assert not r.is_finished(tc, 0) and not r.should_fire(tc, 0)


def test_after_processing_time_counts_from_first_element() -> None:
    t = AfterProcessingTime(10)
    tc = _tc(t, now=5)
    t.on_element(tc, 0)
    tc.now_ms = 12
    t.on_element(tc, 0)
    assert tc.states[0]["t"] == 15 and not t.should_fire(tc, 0)
    tc.now_ms = 15
    assert t.should_fire(tc, 0)


def test_after_watermark_early_on_time_late_phases() -> None:
    t = AfterWatermark(early=AfterCount(2), late=AfterCount(1))
    tc = _tc(t, wm=10)
    t.on_element(tc, 0)
    t.on_element(tc, 0)
    assert t.should_fire(tc, 0)
    t.on_fire(tc, 0)  # early firing; the early trigger repeats
    assert tc.states[1] == {} and not t.should_fire(tc, 0)
    t.on_element(tc, 0)
    tc.watermark_ms = 100  # watermark >= end
    assert t.should_fire(tc, 0)
    t.on_fire(tc, 0)  # on time: early phase over
    assert tc.states[0] == {"o": 1} and tc.states[1] == {} and not t.is_finished(tc, 0)
    t.on_element(tc, 0)
    assert t.should_fire(tc, 0)
    t.on_fire(tc, 0)
    assert not t.is_finished(tc, 0)
    plain = AfterWatermark()
    tc = _tc(plain, wm=100)
    plain.on_fire(tc, 0)
    assert plain.is_finished(tc, 0)


def test_default_trigger_fires_from_the_window_end_on_and_never_finishes() -> None:
    t = DefaultTrigger()
    tc = _tc(t, wm=50)
    t.on_element(tc, 0)
    assert not t.should_fire(tc, 0)
    tc.watermark_ms = 100
    for _ in range(3):  # on time, then every late evaluation
        assert t.should_fire(tc, 0)
        t.on_fire(tc, 0)
        assert not t.is_finished(tc, 0)
    assert trigger_from_spec({"type": "default"}) == DefaultTrigger() != AfterWatermark()


def test_after_each_after_all_or_finally() -> None:
    e = AfterEach((AfterCount(1), AfterCount(2)))
    tc = _tc(e)
    e.on_element(tc, 0)
    e.on_fire(tc, 0)
    e.on_element(tc, 0)
    assert not e.should_fire(tc, 0)  # the second one needs two elements of its own
    e.on_element(tc, 0)
    e.on_fire(tc, 0)
    assert e.is_finished(tc, 0)
    a = AfterAll((AfterCount(1), AfterProcessingTime(5)))
    tc = _tc(a)
    a.on_element(tc, 0)
    assert not a.should_fire(tc, 0)
    tc.now_ms = 5
    assert a.should_fire(tc, 0)
    o = OrFinally(Repeatedly(AfterCount(1)), AfterCount(2))
    tc = _tc(o)
    o.on_element(tc, 0)
    o.on_fire(tc, 0)
    assert not o.is_finished(tc, 0)
    o.on_element(tc, 0)
    o.on_fire(tc, 0)
    assert o.is_finished(tc, 0)


def test_trigger_spec_errors() -> None:
    with pytest.raises(WindowingError, match="unknown trigger type 'sometimes'"):
        trigger_from_spec({"type": "sometimes"})
    with pytest.raises(WindowingError, match="trigger 'repeatedly' needs 'trigger'"):
        trigger_from_spec({"type": "repeatedly"})
    with pytest.raises(WindowingError, match="needs a non-empty list 'triggers'"):
        trigger_from_spec({"type": "after_any", "triggers": []})
    with pytest.raises(WindowingError, match="after_count needs count >= 1"):
        trigger_from_spec({"type": "after_count", "count": 0})
    with pytest.raises(WindowingError, match="needs a number 'delay'"):
        trigger_from_spec({"type": "after_processing_time"})
    with pytest.raises(WindowingError, match="needs delay >= 0"):
        AfterProcessingTime(-1)
    with pytest.raises(WindowingError, match="must be an object"):
        trigger_from_spec("never")  # type: ignore[arg-type]


# ---------------------------------------------------------------- combiners

class Concat(CombineFn):
    """A user combiner: the sorted distinct strings seen."""

    def create(self) -> Any:
        return []

    def add(self, acc: Any, value: Any) -> Any:
        return sorted(set(acc) | {value})

    def merge(self, accs: Sequence[Any]) -> Any:
        return sorted(set().union(*accs))

    def extract(self, acc: Any) -> Any:
        return "+".join(acc)


def test_builtin_combiners() -> None:
    def run(fn: CombineFn, values: list[Any]) -> Any:
        accs = [fn.add(fn.create(), v) for v in values]
        return fn.extract(fn.merge(accs)), fn.extract(fn.create())

    assert run(Sum(), [1, 2, 3]) == (6, 0)
    assert run(Count(), ["a", "b"]) == (2, 0)
    assert run(Min(), [3, 1, 2]) == (1, None)
    assert run(Max(), [3, 1, 2]) == (3, None)
    assert run(Mean(), [1, 2]) == (1.5, None)
    assert isinstance(combine_fn_from_spec("mean"), Mean)
    with pytest.raises(WindowingError, match="unknown combine 'median'"):
        combine_fn_from_spec("median")


def _comp(**kw: Any) -> WindowedComputation:
    args: dict[str, Any] = {"name": "w", "inputs": {"events": "k"}, "output": "panes",
                            "windowing": FixedWindows(100)}
    args.update(kw)
    return windowed(**args)


def _run(comp: WindowedComputation, row: KeyRow | None, values: list[tuple[Any, int]], *, wm: int | None = None,
         now: int = 0) -> tuple[KeyRow | None, list[dict[str, Any]]]:
    recs = [Record("k1", v, ts, f"r{ts}-{i}-{v}") for i, (v, ts) in enumerate(values)]
    out = run_key(comp, key="k1", interval=0, row=row, records=recs, input_watermark_ms=wm, now_ms=now)
    panes = [J.decode(p.value) for p in out.productions if p.stream == "panes"]
    row2 = out.row.with_(pending=()) if out.row is not None else None
    return row2, panes


def test_user_combine_fn_and_user_window_fn_through_run_key() -> None:
    class Halves(WindowFn):
        """A user window function: each element in its 100 ms bucket and in the bucket's half."""

        def assign(self, timestamp_ms: int) -> tuple[Window, ...]:
            start = timestamp_ms - timestamp_ms % 100
            half = start + (50 if timestamp_ms % 100 >= 50 else 0)
            return (Window(start, start + 100), Window(half, half + 50))

    comp = _comp(windowing=Halves(), combine=Concat())
    row, panes = _run(comp, None, [("b", 10), ("a", 60), ("b", 70)])
    assert panes == []
    _, panes = _run(comp, row, [], wm=100)
    got = {(p["window_start"], p["window_end"]): p["value"] for p in panes}
    assert got == {(0, 100): "a+b", (0, 50): "b", (50, 100): "a+b"}
    assert {p["timing"] for p in panes} == {"ON_TIME"} and all(p["is_last"] for p in panes)


# ---------------------------------------------------------------- window GC

def test_window_gc_removes_state_and_timers_from_the_row() -> None:
    comp = _comp(allowed_lateness_ms=50, trigger=AfterWatermark(late=AfterCount(1)))
    row, _ = _run(comp, None, [(1, 10), (2, 150)])
    assert row is not None
    state = J.decode(row.state)  # type: ignore[arg-type]
    assert set(state["w"]) == {"0,100", "100,200"}
    assert {t.tag for t in row.timers} == {"w:0,100", "w:100,200"}
    row, panes = _run(comp, row, [], wm=120)  # [0,100) fires ON_TIME, kept for late data
    assert [(p["value"], p["timing"]) for p in panes] == [(1, "ON_TIME")]
    assert "0,100" in J.decode(row.state)["w"]  # type: ignore[union-attr, arg-type]
    assert next(t for t in row.timers if t.tag == "w:0,100").time_ms == 149  # type: ignore[union-attr]
    row, panes = _run(comp, row, [(5, 20)], wm=149)  # late, within lateness
    assert [(p["value"], p["timing"], p["pane_index"]) for p in panes] == [(5, "LATE", 1)]
    row, panes = _run(comp, row, [], wm=150)  # end + allowed lateness: collected
    assert panes == []
    assert row is not None
    assert set(J.decode(row.state)["w"]) == {"100,200"}  # type: ignore[arg-type]
    assert all("0,100" not in t.tag for t in row.timers)
    row, _ = _run(comp, row, [], wm=10_000)
    assert row is not None and row.state is None and row.timers == ()


def test_processing_time_timer_is_set_and_removed() -> None:
    comp = _comp(trigger=AfterWatermark(early=AfterProcessingTime(30)), allowed_lateness_ms=0)
    row, _ = _run(comp, None, [(1, 10)], now=100)
    assert row is not None
    assert [(t.tag, t.time_ms, t.domain) for t in row.timers if t.domain is TimeDomain.PROCESSING_TIME] == [
        ("p:0,100", 130, TimeDomain.PROCESSING_TIME)]
    row, panes = _run(comp, row, [], now=130)
    assert [(p["value"], p["timing"]) for p in panes] == [(1, "EARLY")]
    assert row is not None and all(t.domain is TimeDomain.EVENT_TIME for t in row.timers)


# ------------------------------------------------------ retractions, merges

def test_late_data_merging_two_sessions_retracts_both() -> None:
    comp = _comp(windowing=Sessions(10), accumulation="accumulating_and_retracting", allowed_lateness_ms=1000,
                 trigger=AfterWatermark(late=AfterCount(1)))
    row, _ = _run(comp, None, [(1, 0), (2, 15)])
    row, panes = _run(comp, row, [], wm=100)
    assert sorted((p["window_start"], p["value"]) for p in panes) == [(0, 1), (15, 2)]
    row, panes = _run(comp, row, [(4, 8)], wm=100)  # [8,18) bridges [0,10) and [15,25)
    assert [(p["window_start"], p["window_end"], p["value"], p["retraction"]) for p in panes] == [
        (0, 10, -1, True), (15, 25, -2, True), (0, 25, 7, False)]
    assert panes[-1]["pane_index"] == 0 and panes[-1]["is_first"] and panes[-1]["timing"] == "LATE"
    assert set(J.decode(row.state)["w"]) == {"0,25"}  # type: ignore[union-attr, arg-type]
    assert {t.tag for t in row.timers} == {"w:0,25"}  # type: ignore[union-attr]


def test_retraction_precedes_replacing_pane_in_same_window() -> None:
    comp = _comp(accumulation=AccumulationMode.ACCUMULATING_AND_RETRACTING, allowed_lateness_ms=100,
                 trigger=AfterWatermark(late=AfterCount(1)))
    row, panes = _run(comp, None, [(7, 10)], wm=None)
    row, panes = _run(comp, row, [], wm=100)
    row, panes = _run(comp, row, [(3, 20)], wm=100)
    assert [(p["value"], p["retraction"], p["pane_index"]) for p in panes] == [(-7, True, 1), (10, False, 1)]


class Tally(CombineFn):
    """A user combiner with a dict accumulator changed in place; its pane value is the accumulator itself."""

    def create(self) -> Any:
        return {"n": 0, "sum": 0}

    def add(self, acc: Any, value: Any) -> Any:
        acc["n"] += 1
        acc["sum"] += value
        return acc

    def merge(self, accs: Sequence[Any]) -> Any:
        return {"n": sum(a["n"] for a in accs), "sum": sum(a["sum"] for a in accs)}


class Spread(CombineFn):
    """A user combiner with a numeric pane value: the largest minus the smallest value."""

    def create(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        return [value, value] if acc is None else [min(acc[0], value), max(acc[1], value)]

    def merge(self, accs: Sequence[Any]) -> Any:
        present = [a for a in accs if a is not None]
        return [min(a[0] for a in present), max(a[1] for a in present)] if present else None

    def extract(self, acc: Any) -> Any:
        return 0 if acc is None else acc[1] - acc[0]


@pytest.mark.parametrize("combine", ["sum", "count", "min", "max", "mean", Tally(), Spread()],
                         ids=["sum", "count", "min", "max", "mean", "user-dict", "user-number"])
def test_a_retraction_carries_the_withdrawn_value_by_one_rule_whatever_the_combiner(combine: Any) -> None:
    """One rule for every combiner: a retraction pane's value is the value of the pane it withdraws,
    as that pane carried it, negated where negation is defined (a number) and unchanged otherwise,
    flagged ``retraction: true``. Three records of the key in one run (one batch), so a combiner
    changing its accumulator in place cannot change what is retracted."""
    comp = _comp(accumulation="accumulating_and_retracting", trigger=Repeatedly(AfterCount(1)), combine=combine)
    _, panes = _run(comp, None, [(3, 10), (5, 20), (4, 30)])
    assert [p["retraction"] for p in panes] == [False, True, False, True, False]
    emitted = [p["value"] for p in panes if not p["retraction"]]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in emitted)
    want = [-v for v in emitted[:-1]] if numeric else emitted[:-1]
    assert [p["value"] for p in panes if p["retraction"]] == want
    fn = combine_fn_from_spec(combine)
    assert emitted == [fn.extract(fn.merge([fn.add(fn.create(), v) for v in vs]))
                       for vs in ([3], [3, 5], [3, 5, 4])]


# ------------------------------------------------------------ errors, misc

def test_strategy_and_state_errors() -> None:
    with pytest.raises(WindowingError, match="allowed lateness must be >= 0"):
        WindowingStrategy(FixedWindows(10), AfterCount(1), Sum(), allowed_lateness_ms=-1)
    with pytest.raises(WindowingError, match="unknown accumulation mode 'replace'"):
        AccumulationMode.parse("replace")
    with pytest.raises(ConfigError, match="computation name 'bad name'"):
        _comp(name="bad name")
    comp = _comp()
    old = KeyRow(computation="w", key="k1", interval=0, state=J.encode({"v": 99, "w": {}}))
    with pytest.raises(UserCodeError, match="has version 99, this code reads version 1"):
        _run(comp, old, [(1, 1)])


def test_pane_round_trip() -> None:
    p = Pane("k", Window(0, 10), 3, PaneInfo(Timing.LATE, 2, False, True), retraction=True)
    assert Pane.from_dict(p.to_dict()) == p
    g = Pane("k", GLOBAL_WINDOW, 1, PaneInfo(Timing.ON_TIME, 0, True, True))
    assert g.to_dict()["window_start"] is None and Pane.from_dict(g.to_dict()) == g


def test_harness_errors_and_comparison() -> None:
    base = {"windowing": {"type": "fixed", "size": 10}, "steps": [{"key": "a", "value": 1, "event_time": 1}]}
    with pytest.raises(WindowingError, match="has no 'windowing'"):
        run_scenario({"steps": []})
    with pytest.raises(WindowingError, match="step 0 must be exactly one of"):
        run_scenario(dict(base, steps=[{"watermark": 1, "processing_time": 2}]))
    with pytest.raises(WindowingError, match="watermark 1 does not increase"):
        run_scenario(dict(base, steps=[{"watermark": 2}, {"watermark": 1}]))
    with pytest.raises(WindowingError, match="processing time 3 does not increase"):
        run_scenario(dict(base, steps=[{"processing_time": 5}, {"processing_time": 3}]))
    with pytest.raises(WindowingError, match="must be a number of seconds"):
        run_scenario(dict(base, steps=[{"key": "a", "value": 1, "event_time": "noon"}]))
    with pytest.raises(WindowingError, match="unknown backend 'disk'"):
        run_scenario(base, backend="disk")
    out = run_scenario(base, backend=MemoryBackend())
    assert [(p["value"], p["window_end"], p["after_step"]) for p in out["panes"]] == [(1, 10, 1)]
    wrong = {"panes": [dict(out["panes"][0], value=2)], "dropped": []}
    with pytest.raises(AssertionError, match="panes of key 'a' window"):
        assert_panes_equal(out, wrong)
    with pytest.raises(AssertionError, match="dropped differ"):
        assert_panes_equal(out, {"panes": out["panes"], "dropped": [{"step": 0}]})


def test_panes_of_different_windows_may_interleave() -> None:
    a = {"key": "k", "window_start": 0, "window_end": 10, "value": 1, "timing": "ON_TIME", "pane_index": 0,
         "is_first": True, "is_last": True, "retraction": False}
    b = dict(a, window_start=10, window_end=20)
    assert_panes_equal({"panes": [a, b]}, {"panes": [b, a]})


def test_cli_prints_output(capsys: pytest.CaptureFixture[str]) -> None:
    path = SCENARIOS / "trigger_after_all.json"
    assert cli_main(["scenario", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert_panes_equal(out, json.loads(path.read_text())["expected"])


@pytest.mark.spark
def test_cli_on_the_delta_backend_prints_the_same_panes(spark, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    path = SCENARIOS / "trigger_after_all.json"
    assert cli_main(["scenario", str(path), "--backend", "delta"]) == 0
    assert json.loads(capsys.readouterr().out) == run_scenario(json.loads(path.read_text()))
