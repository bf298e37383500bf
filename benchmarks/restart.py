"""``deltawheel bench restart``: seconds from restarting a SIGKILLed continuous job to its first
committed micro-batch, with an instance name (its predecessor's leases taken at once) and without
(waiting for the dead session to expire), and from the SIGKILL of an active instance to the first
batch a running standby commits (``standby``); each step's seconds into ``restart.json``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .args import pick_names

__all__ = ["run_from_args", "measure"]

JOB = "deltawheel.benchmarks.restart_job"
CASES = {"with_instance": "a", "without_instance": "-", "standby": "s"}


class _Job:
    """A ``restart_job`` child process; its STEP and BATCH lines read as they come."""

    def __init__(self, store: Path, folder: Path, hosts: str, chroot: str, instance: str, timeout_s: float,
                 *, standby: bool = False) -> None:
        self.t0 = time.time()
        self.proc = subprocess.Popen([sys.executable, "-m", JOB, str(store), str(folder), hosts, chroot, instance,
                                      str(timeout_s), *(["standby"] if standby else [])], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.steps: dict[str, float] = {}
        self.batches: list[dict[str, Any]] = []
        self.tail: list[str] = []
        self.lines: list[str] = []  # the job's own lines, after the seconds since its start

    def until(self, *, batches: int, timeout_s: float, step: str | None = None) -> None:
        """Read lines until ``batches`` micro-batches committed (with ``step``: until that step ended)."""
        assert self.proc.stdout is not None
        if step is not None and step in self.steps:
            return
        deadline = time.monotonic() + timeout_s
        for line in self.proc.stdout:
            self.tail = (self.tail + [line.rstrip()])[-40:]
            parts = line.split()
            if not line.startswith(("STEP ", "BATCH ")):
                self.lines.append(f"{time.time() - self.t0:7.2f} {line.rstrip()}")
            if len(parts) == 3 and parts[0] == "STEP":
                self.steps.setdefault(parts[1], float(parts[2]) - self.t0)
                if parts[1] == step:
                    return
            elif line.startswith("BATCH "):
                self.batches.append(json.loads(line[6:]))
                if len(self.batches) >= batches:
                    return
            if time.monotonic() > deadline:
                break
        self.kill()
        raise RuntimeError(f"the job did not commit {batches} batches within {timeout_s:.0f}s:\n" + "\n".join(self.tail))

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)


def measure(out: Path, *, hosts: str, case: str, files: int, kill_after: int, session_timeout_s: float,
            timeout_s: float) -> dict[str, Any]:
    """One case: start, kill after ``kill_after`` batches, restart; the restarted job's steps."""
    from deltawheel.benchmarks.restart_job import write_input

    base = out / case
    store, folder = base / "store", base / "input"
    write_input(str(folder), files)
    chroot = f"/restartbench-{uuid.uuid4().hex[:8]}"
    if case == "standby":
        return _standby(store, folder, hosts, chroot, kill_after=kill_after, session_timeout_s=session_timeout_s,
                        timeout_s=timeout_s)
    first = _Job(store, folder, hosts, chroot, CASES[case], session_timeout_s)
    try:
        first.until(batches=kill_after, timeout_s=timeout_s)
    finally:
        first.kill()
    again = _Job(store, folder, hosts, chroot, CASES[case], session_timeout_s)
    try:
        again.until(batches=1, timeout_s=timeout_s)
    finally:
        again.kill()
    return {"instance": None if CASES[case] == "-" else CASES[case],
            "first_run": {k: round(v, 2) for k, v in first.steps.items()},
            "restart_to_first_batch_s": round(again.steps["batch"], 2),
            "restart_steps_s": {k: round(v, 2) for k, v in sorted(again.steps.items(), key=lambda kv: kv[1])},
            "first_batch": again.batches[0],
            "restart_lines": [ln for ln in again.lines if "jars ready" not in ln][-30:]}


def _standby(store: Path, folder: Path, hosts: str, chroot: str, *, kill_after: int, session_timeout_s: float,
             timeout_s: float) -> dict[str, Any]:
    """Instance ``a`` runs, standby ``s`` starts beside it (holding nothing); ``a`` is SIGKILLed after
    ``kill_after`` batches: seconds from the kill to each step of ``s``'s takeover and its first batch."""
    active = _Job(store, folder, hosts, chroot, "a", session_timeout_s)
    standby = None
    try:
        active.until(batches=1, timeout_s=timeout_s)
        standby = _Job(store, folder, hosts, chroot, CASES["standby"], session_timeout_s, standby=True)
        standby.until(batches=0, step="running", timeout_s=timeout_s)  # its query runs, holding nothing
        standby.until(batches=0, step="warmed", timeout_s=timeout_s)  # as a standby that ran a while
        active.until(batches=kill_after, timeout_s=timeout_s)
        killed = time.time()
        active.kill()
        standby.until(batches=1, timeout_s=timeout_s)
    finally:
        active.kill()
        if standby is not None:
            standby.kill()
    after = {k: round(standby.t0 + v - killed, 2) for k, v in standby.steps.items() if standby.t0 + v > killed}
    return {"instance": "s (standby) after a's SIGKILL",
            "kill_to_first_batch_s": after["batch"],
            "kill_steps_s": dict(sorted(after.items(), key=lambda kv: kv[1])),
            "first_batch": standby.batches[0],
            "standby_lines": [ln for ln in standby.lines if "jars ready" not in ln][-30:]}


def run_from_args(args: argparse.Namespace) -> int:
    """Run the cases of ``args`` on one embedded ZooKeeper; writes ``restart.json``.

    Raises:
        ConfigError: an unknown case.
    """
    from deltawheel.statestore.process import free_ports

    from deltawheel.servers.zookeeper import EmbeddedZooKeeper

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = pick_names(args.cases, tuple(CASES), "case", "restart")
    zk = EmbeddedZooKeeper(out / f"_zk-{uuid.uuid4().hex[:6]}", port=free_ports(1)[0])
    zk.start()
    result: dict[str, Any] = {"files": args.files, "kill_after_batches": args.kill_after,
                              "session_timeout_s": args.session_timeout, "load_avg_before": os.getloadavg(),
                              "cpus": os.cpu_count(), "cases": {}}
    try:
        for case in cases:
            print(f"{case}: starting, killing after {args.kill_after} batches, restarting ...", flush=True)
            got = result["cases"][case] = measure(out, hosts=zk.hosts, case=case, files=args.files,
                                                  kill_after=args.kill_after, session_timeout_s=args.session_timeout,
                                                  timeout_s=args.timeout)
            if case == "standby":
                steps = "  ".join(f"{k} {v:.1f}" for k, v in got["kill_steps_s"].items())
                print(f"{case}: SIGKILL of the active instance to the standby's first committed batch "
                      f"{got['kill_to_first_batch_s']:.1f}s  ({steps})", flush=True)
                continue
            steps = "  ".join(f"{k} {v:.1f}" for k, v in got["restart_steps_s"].items())
            print(f"{case}: restart to first committed batch {got['restart_to_first_batch_s']:.1f}s  ({steps})",
                  flush=True)
    finally:
        zk.stop()
    result["load_avg_after"] = os.getloadavg()
    (out / "restart.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out / 'restart.json'} (load average before {result['load_avg_before'][0]:.1f}, after "
          f"{result['load_avg_after'][0]:.1f})", flush=True)
    return 0
