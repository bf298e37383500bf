"""Replays every scenario of tests/scenarios/ on the memory backend and compares with its expected output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltawheel.executor.windowing.harness import assert_panes_equal, run_scenario

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.json"))


def test_scenarios_exist() -> None:
    assert len(SCENARIOS) >= 15


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    scenario = json.loads(path.read_text())
    assert_panes_equal(run_scenario(scenario), scenario["expected"])


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_scenario_on_delta_gives_the_same_panes(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """All scenarios through the Delta rows table, in lockstep: one fenced commit per step."""
    from deltawheel.executor.windowing.harness import DeltaBackend, run_scenarios_lockstep
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.rowtable.store import RowStore

    scenarios = [json.loads(p.read_text()) for p in SCENARIOS]
    backend = DeltaBackend(spark, StoreLayout(str(tmp_path / "store")))
    results = run_scenarios_lockstep(scenarios, backend=backend)
    for path, scenario, on_delta in zip(SCENARIOS, scenarios, results, strict=True):
        assert on_delta == run_scenario(scenario), path.stem
        assert_panes_equal(on_delta, scenario["expected"])
    # end of input: every window expired, so the rows table keeps no window state and no timers
    rows = RowStore(spark, backend._store.layout, writer="check").scan_intervals("scenario", [0])
    assert rows, "the scenarios wrote rows"
    assert all(not r.timers for r in rows), [(r.key, r.timers) for r in rows]
    assert all(r.state is None or not json.loads(r.state).get("w") for r in rows)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_alone_on_delta(spark, tmp_path: Path, path: Path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.windowing.harness import DeltaBackend

    scenario = json.loads(path.read_text())
    on_delta = run_scenario(scenario, backend=DeltaBackend(spark, StoreLayout_(tmp_path)))
    assert on_delta == run_scenario(scenario)


def StoreLayout_(tmp_path: Path):  # type: ignore[no-untyped-def]
    from deltawheel.statestore.layout import StoreLayout

    return StoreLayout(str(tmp_path / "store"))
