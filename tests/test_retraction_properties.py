"""Properties of accumulating_and_retracting panes over random scenarios (Beam has no such mode to compare with).

* Per window (per key for merging windows), the sum of all pane values, the
  retraction panes counting negatively, equals the discarding run's total.
* Every non-first pane of a window comes right after the retraction of that
  window's previous pane value.
* A session merged away has each of its panes retracted exactly once (its last
  one by the merge); a surviving window has all but its last pane retracted.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any, Mapping

from deltawheel.executor.windowing.harness import run_scenario
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scenario_gen import scenario_from

RETRACTING = ("accumulating_and_retracting",)
SESSIONS = st.sampled_from([5, 10, 15]).map(lambda g: {"type": "sessions", "gap": g})
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _scenario(rng: random.Random, windowing: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return scenario_from(rng, name="property", modes=RETRACTING, settle=rng.random() < 0.5,
                         windowing=dict(windowing) if windowing else None)


def _window(p: Mapping[str, Any]) -> tuple[Any, ...]:
    return (p["key"], p["window_start"], p["window_end"])


def _totals(panes: list[Mapping[str, Any]], per_key: bool) -> dict[tuple[Any, ...], int]:
    out: dict[tuple[Any, ...], int] = defaultdict(int)
    for p in panes:
        out[(p["key"],) if per_key else _window(p)] += p["value"]
    return {k: v for k, v in out.items() if v}


def _sum_equals_discarding_total(sc: dict[str, Any]) -> None:
    retracting = run_scenario(sc)["panes"]
    discarding = run_scenario(dict(sc, accumulation_mode="discarding"))["panes"]
    merging = sc["windowing"]["type"] == "sessions"  # a merge moves values between windows: compare per key
    assert _totals(retracting, merging) == _totals(discarding, merging)
    if merging:
        return
    assert _totals(retracting, False) == _totals(discarding, False)


def _each_pane_follows_the_retraction_of_the_previous(sc: dict[str, Any]) -> None:
    panes = run_scenario(sc)["panes"]
    last: dict[tuple[Any, ...], Any] = {}
    for i, p in enumerate(panes):
        if p["retraction"]:
            continue
        w = _window(p)
        if w in last:
            before = panes[i - 1]
            assert before["retraction"] and _window(before) == w and before["value"] == -last[w], (i, p, before)
        else:
            assert p["is_first"] or i == 0 or not panes[i - 1]["retraction"] or _window(panes[i - 1]) != w
        last[w] = p["value"]


def _merged_sessions_retracted_once(sc: dict[str, Any]) -> None:
    panes = run_scenario(sc)["panes"]
    emitted: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    retracted: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for p in panes:
        (retracted if p["retraction"] else emitted)[_window(p)].append(p["value"])
    for w, values in emitted.items():
        key, start, end = w
        merged_away = any(k == key and s <= start and end <= e and (s, e) != (start, end)
                          for k, s, e in emitted)
        want = values if merged_away else values[:-1]
        assert [-v for v in retracted.get(w, [])] == want, (w, values, retracted.get(w))
    assert set(retracted) <= set(emitted)


@SETTINGS
@given(st.randoms(use_true_random=False))
def test_retracting_sum_equals_discarding_total(rng: random.Random) -> None:
    _sum_equals_discarding_total(_scenario(rng))


@SETTINGS
@given(st.randoms(use_true_random=False), SESSIONS)
def test_retracting_sum_equals_discarding_total_with_sessions(rng: random.Random, sessions: dict[str, Any]) -> None:
    _sum_equals_discarding_total(_scenario(rng, sessions))


@SETTINGS
@given(st.randoms(use_true_random=False))
def test_every_later_pane_follows_the_retraction_of_the_previous(rng: random.Random) -> None:
    _each_pane_follows_the_retraction_of_the_previous(_scenario(rng))


@SETTINGS
@given(st.randoms(use_true_random=False), SESSIONS)
def test_session_merges_retract_each_merged_away_session_once(rng: random.Random, sessions: dict[str, Any]) -> None:
    sc = _scenario(rng, sessions)
    _each_pane_follows_the_retraction_of_the_previous(sc)
    _merged_sessions_retracted_once(sc)
