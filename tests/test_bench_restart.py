"""``deltawheel bench restart`` at a tiny scale: a continuous job SIGKILLed after its first batch
and restarted under its instance name; the JSON holds the seconds to its first committed batch
and the restarted job's steps, in the order they happen."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from deltawheel.statestore.exceptions import ConfigError

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def test_bench_restart_refuses_an_unknown_case(tmp_path: Path) -> None:
    from deltawheel.benchmarks.restart import run_from_args

    args = argparse.Namespace(out=str(tmp_path), cases="with_instance,sideways", files=2, kill_after=1,
                              session_timeout=20.0, timeout=60.0)
    with pytest.raises(ConfigError, match=r"bench restart: unknown case 'sideways'; the cases are with_instance, "
                                          r"without_instance"):
        run_from_args(args)
    assert not (tmp_path / "restart.json").exists()


@pytest.mark.slow  # ~80 s (two Spark applications); a restart under the instance name: test_restart.py
@pytest.mark.timeout(900)
def test_bench_restart_reports_the_restart_to_the_first_committed_batch(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.cli import main

    assert main(["bench", "restart", "--out", str(tmp_path), "--files", "5", "--kill-after", "1",
                 "--cases", "with_instance", "--session-timeout", "20"]) == 0
    data = json.loads((tmp_path / "restart.json").read_text(encoding="utf-8"))
    assert sorted(data["cases"]) == ["with_instance"] and len(data["load_avg_before"]) == 3
    case = data["cases"]["with_instance"]
    steps = case["restart_steps_s"]
    assert case["instance"] == "a"
    order = ["started", "imported", "spark", "connected", "batch"]
    assert [steps[s] for s in order] == sorted(steps[s] for s in order), steps
    assert {"leases", "executor", "running"} <= set(steps) and max(steps.values()) == steps["batch"], steps
    assert case["restart_to_first_batch_s"] == steps["batch"] > 0
    # the batch Spark replays: its records, or (committed by the killed process) skipped as processed
    first = case["first_batch"]
    assert first["records"] + first["skipped_moved"] > 0 and first["steps_s"], first
    out = capsys.readouterr().out
    assert "with_instance: restart to first committed batch" in out and "wrote" in out
