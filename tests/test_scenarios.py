"""Replays every scenario of tests/scenarios/ on the memory backend and compares with its expected output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltawheel.executor.harness import assert_panes_equal, run_scenario

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.json"))


def test_scenarios_exist() -> None:
    assert len(SCENARIOS) >= 15


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    scenario = json.loads(path.read_text())
    assert_panes_equal(run_scenario(scenario), scenario["expected"])


DELTA_DEFAULT = {"s102_table1_retracting", "s102_sessions_retracting", "s102_allowed_lateness"}


@pytest.mark.spark
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", [pytest.param(p, marks=() if p.stem in DELTA_DEFAULT else pytest.mark.slow)
                                  for p in SCENARIOS], ids=[p.stem for p in SCENARIOS])
def test_scenario_on_delta_gives_the_same_panes(spark, tmp_path: Path, path: Path) -> None:  # type: ignore[no-untyped-def]
    """The same scenario through the Delta rows table (one fenced commit per step)."""
    from deltawheel.executor.harness import DeltaBackend
    from deltawheel.statestore.layout import StoreLayout

    scenario = json.loads(path.read_text())
    backend = DeltaBackend(spark, StoreLayout(str(tmp_path / "store")))
    on_delta = run_scenario(scenario, backend=backend)
    assert on_delta == run_scenario(scenario)
    assert_panes_equal(on_delta, scenario["expected"])
    # end of input: every window expired, so the rows table keeps no window state and no timers
    from deltawheel.statestore.store import RowStore

    rows = RowStore(spark, backend._store.layout, writer="check").scan_intervals("scenario", [0])
    assert all(not r.timers for r in rows), [(r.key, r.timers) for r in rows]
    assert all(r.state is None or not json.loads(r.state).get("w") for r in rows)
