"""Helpers for testing your own computations: :class:`ComputationTester` runs one without Spark,
:func:`run_scenario` runs a windowing scenario.

Example (fixed 10 s windows, the default trigger, a sum per window)::

    >>> from deltawheel.testing import run_scenario
    >>> out = run_scenario({
    ...     "windowing": {"type": "fixed", "size": 10}, "trigger": {"type": "default"},
    ...     "allowed_lateness": 0, "accumulation_mode": "discarding", "combine": "sum",
    ...     "steps": [{"key": "k", "value": 2, "event_time": 3},
    ...               {"key": "k", "value": 5, "event_time": 7},
    ...               {"watermark": 10}]})
    >>> [(p["window_start"], p["window_end"], p["value"], p["timing"]) for p in out["panes"]]
    [(0, 10, 7, 'ON_TIME')]
"""

from __future__ import annotations

from deltawheel.executor.computation import make_record
from deltawheel.executor.testkit import ComputationTester, Output
from deltawheel.executor.windowing.harness import (
    Backend,
    DeltaBackend,
    MemoryBackend,
    Scenario,
    assert_panes_equal,
    load_scenario,
    run_scenario,
    run_scenarios_lockstep,
)
from deltawheel.servers.zookeeper import EmbeddedZooKeeper
from deltawheel.statestore.clock import ManualClock

__all__ = ["Backend", "ComputationTester", "DeltaBackend", "EmbeddedZooKeeper", "ManualClock",
           "MemoryBackend", "Output", "Scenario", "assert_panes_equal", "load_scenario", "make_record",
           "run_scenario", "run_scenarios_lockstep"]
