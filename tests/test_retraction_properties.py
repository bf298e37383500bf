"""Properties of accumulating_and_retracting panes over random scenarios (Beam has no such mode to compare with).

A retraction pane carries the value of the pane it withdraws, negated where
negation is defined (numbers) and unchanged otherwise, with ``retraction: true``
(docs/windowing.md, "Retractions"), whatever the combiner. Each property runs with the built-in ``sum`` and with a user
combiner whose accumulator is a dict changed in place and whose pane value is
that accumulator itself.

* Per window (per key for merging windows), the total of all pane values, the
  retraction panes counting negatively, equals the discarding run's total.
* Every non-first pane of a window comes right after the retraction of that
  window's previous pane value.
* A session merged away has each of its panes retracted exactly once (its last
  one by the merge); a surviving window has all but its last pane retracted.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any, Mapping, Sequence

import pytest
from deltawheel.executor.windowing.combiners import CombineFn
from deltawheel.executor.windowing.harness import run_scenario
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scenario_gen import scenario_from

RETRACTING = ("accumulating_and_retracting",)
SESSIONS = st.sampled_from([5, 10, 15]).map(lambda g: {"type": "sessions", "gap": g})
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Tally(CombineFn):
    """A user combiner: count and sum in a dict accumulator, changed in place; the pane value is the
    accumulator itself (the default ``extract``)."""

    def create(self) -> Any:
        return {"n": 0, "sum": 0}

    def add(self, acc: Any, value: Any) -> Any:
        acc["n"] += 1
        acc["sum"] += value
        return acc

    def merge(self, accs: Sequence[Any]) -> Any:
        return {"n": sum(a["n"] for a in accs), "sum": sum(a["sum"] for a in accs)}


COMBINERS = pytest.mark.parametrize("combine", ["sum", Tally()], ids=["sum", "user-dict"])


def _scenario(rng: random.Random, combine: Any, windowing: Mapping[str, Any] | None = None) -> dict[str, Any]:
    sc = scenario_from(rng, name="property", modes=RETRACTING, settle=rng.random() < 0.5,
                       windowing=dict(windowing) if windowing else None)
    return dict(sc, combine=combine)


def _window(p: Mapping[str, Any]) -> tuple[Any, ...]:
    return (p["key"], p["window_start"], p["window_end"])


def _withdrawn(p: Mapping[str, Any]) -> Any:
    """The value a retraction pane withdraws (the value of the pane it retracts), by the one rule:
    numbers are carried negated, anything else unchanged."""
    v = p["value"]
    return -v if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def _totals(panes: list[Mapping[str, Any]], per_key: bool) -> dict[tuple[Any, ...], Counter[str]]:
    """Signed totals (a retraction counts negatively), field by field for dict values."""
    out: dict[tuple[Any, ...], Counter[str]] = defaultdict(Counter)
    for p in panes:
        sign = -1 if p["retraction"] else 1
        raw = _withdrawn(p) if p["retraction"] else p["value"]
        value = raw if isinstance(raw, Mapping) else {"": raw}
        for field, v in value.items():
            out[(p["key"],) if per_key else _window(p)][field] += sign * v
    return {k: +c for k, c in out.items() if +c}  # +c: without the fields that total 0


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
            assert before["retraction"] and _window(before) == w and _withdrawn(before) == last[w], (i, p, before)
        else:
            assert p["is_first"] or i == 0 or not panes[i - 1]["retraction"] or _window(panes[i - 1]) != w
        last[w] = p["value"]


def _merged_sessions_retracted_once(sc: dict[str, Any]) -> None:
    panes = run_scenario(sc)["panes"]
    emitted: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    retracted: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for p in panes:
        if p["retraction"]:
            retracted[_window(p)].append(_withdrawn(p))
        else:
            emitted[_window(p)].append(p["value"])
    for w, values in emitted.items():
        key, start, end = w
        merged_away = any(k == key and s <= start and end <= e and (s, e) != (start, end)
                          for k, s, e in emitted)
        want = values if merged_away else values[:-1]
        assert retracted.get(w, []) == want, (w, values, retracted.get(w))
    assert set(retracted) <= set(emitted)


@COMBINERS
@SETTINGS
@given(st.randoms(use_true_random=False))
def test_retracting_sum_equals_discarding_total(combine: Any, rng: random.Random) -> None:
    _sum_equals_discarding_total(_scenario(rng, combine))


@COMBINERS
@SETTINGS
@given(st.randoms(use_true_random=False), SESSIONS)
def test_retracting_sum_equals_discarding_total_with_sessions(combine: Any, rng: random.Random,
                                                              sessions: dict[str, Any]) -> None:
    _sum_equals_discarding_total(_scenario(rng, combine, sessions))


@COMBINERS
@SETTINGS
@given(st.randoms(use_true_random=False))
def test_every_later_pane_follows_the_retraction_of_the_previous(combine: Any, rng: random.Random) -> None:
    _each_pane_follows_the_retraction_of_the_previous(_scenario(rng, combine))


@COMBINERS
@SETTINGS
@given(st.randoms(use_true_random=False), SESSIONS)
def test_session_merges_retract_each_merged_away_session_once(combine: Any, rng: random.Random,
                                                              sessions: dict[str, Any]) -> None:
    sc = _scenario(rng, combine, sessions)
    _each_pane_follows_the_retraction_of_the_previous(sc)
    _merged_sessions_retracted_once(sc)
