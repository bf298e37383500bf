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
