"""Every command exits quietly when its output pipe closes early (``deltawheel zk status | head``):
exit status 141 (128 + SIGPIPE, as a tool killed by the signal), no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "deltawheel.cli"]
SIGPIPE_STATUS = 141


def big_scenario(path: Path) -> Path:
    """A windowing scenario whose panes print as ~170 KB of JSON: more than a pipe holds."""
    steps: list[dict[str, object]] = [{"key": f"k{i}", "value": 1, "event_time": i} for i in range(800)]
    steps.append({"watermark": 1_000_000})
    path.write_text(json.dumps({"name": "big", "windowing": {"type": "fixed", "size": 120},
                                "trigger": {"type": "default"}, "allowed_lateness": 0,
                                "accumulation_mode": "discarding", "combine": "sum", "steps": steps}))
    return path


def quiet(stderr: str) -> bool:
    return not any(w in stderr for w in ("Traceback", "BrokenPipeError", "Exception ignored"))


def test_a_command_piped_into_head_exits_quietly(tmp_path: Path) -> None:
    """``deltawheel scenario FILE | head -1`` in a shell: head reads one line and exits while the
    command is still writing."""
    scenario = big_scenario(tmp_path / "big.json")
    cmd = " ".join(map(str, [*CLI, "scenario", scenario])) + f" 2>{tmp_path / 'err'} | head -1; echo \"${{PIPESTATUS[0]}}\""
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120, cwd=REPO)
    first, status = out.stdout.splitlines()
    err = (tmp_path / "err").read_text()
    assert first == "{"
    assert int(status) == SIGPIPE_STATUS and quiet(err), (status, err[-2000:])


@pytest.mark.zk
@pytest.mark.parametrize("args", [
    ["scenario", "{scenario}"],
    ["zk", "status", "--data-dir", "{tmp}"],
    ["leases", "show", "--zk", "{zk}", "--zk-chroot", "{chroot}"],
    ["status", "--store", "{tmp}", "--zk", "{zk}", "--zk-chroot", "{chroot}"],
], ids=["scenario", "zk-status", "leases-show", "status"])
def test_every_command_exits_quietly_on_a_closed_pipe(args: list[str], tmp_path: Path, zk_config) -> None:  # type: ignore[no-untyped-def]
    """The reader of its output is gone before the command writes anything: its first write fails."""
    values = {"scenario": str(big_scenario(tmp_path / "big.json")), "tmp": str(tmp_path / "store"),
              "zk": zk_config.hosts, "chroot": zk_config.chroot}
    (tmp_path / "store").mkdir()
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run([*CLI, *(a.format(**values) for a in args)], stdout=write, stderr=subprocess.PIPE,
                             text=True, timeout=120, cwd=REPO)
    finally:
        os.close(write)
    assert out.returncode == SIGPIPE_STATUS and quiet(out.stderr), (out.returncode, out.stderr[-2000:])
