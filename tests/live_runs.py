"""Continuous runs of ``balance_pipeline`` interrupted at random: each run a ``deltawheel run`` child
process, ended by SIGKILL (a crash) or SIGTERM (a graceful stop) after some batches, the same command
started again, while input files keep arriving; the last run reads everything and stops gracefully.

:func:`interrupted_runs` plays a :class:`Scenario` (from a seed: :func:`scenario`) and returns the
store; the property tests (``test_replay_property.py``) then replay and promote from it. A step
waits for batch lines in the child's output (events, not durations); the random delay after them
only picks where in a batch the signal lands.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from test_continuous import Child as ContinuousChild

TESTS = Path(__file__).parent
PER_FILE = 40


@dataclass(frozen=True)
class Stop:
    """End a run with ``signal`` (``"kill"``: SIGKILL, ``"term"``: SIGTERM) after ``batches`` more
    committed batches of ``balance`` and ``delay_s`` more."""

    signal: str
    batches: int
    delay_s: float


@dataclass(frozen=True)
class Scenario:
    """The stops of the runs (the last run after them reads everything and stops gracefully)."""

    seed: int
    stops: tuple[Stop, ...]
    files: int


def scenario(seed: int, *, runs: int, files: int) -> Scenario:
    """``runs`` interrupted runs, each ended by a SIGKILL or a SIGTERM at random (at least one of each
    when ``runs`` >= 2) after 1-4 batches and up to a second more."""
    rng = random.Random(seed)
    kinds = [rng.choice(("kill", "term")) for _ in range(runs)]
    if runs >= 2 and len(set(kinds)) == 1:
        kinds[rng.randrange(runs)] = "term" if kinds[0] == "kill" else "kill"
    return Scenario(seed, tuple(Stop(k, rng.randint(1, 4), round(rng.uniform(0, 1.0), 2)) for k in kinds), files)


class Child(ContinuousChild):
    """A ``deltawheel run`` child process (``test_continuous.Child``: its output lines collected as
    they come), counted in batches and ended by a signal."""

    def batches(self, computation: str = "balance") -> int:
        """Batches with input the child's ``computation`` committed so far."""
        return sum(1 for ln in list(self.lines) if re.search(rf"\] {computation} batch \d+: [1-9]\d* in", ln))

    def wait_batches(self, n: int, *, timeout_s: float = 900.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.batches() < n:
            if self.proc.poll() is not None:
                raise AssertionError(f"the run exited with {self.proc.returncode}:\n" + "\n".join(self.lines[-40:]))
            if time.monotonic() > deadline:
                raise AssertionError(f"not {n} batches within {timeout_s:.0f}s:\n" + "\n".join(self.lines[-40:]))
            time.sleep(0.3)

    def end(self, how: str) -> None:
        """SIGKILL (``kill``) or SIGTERM (``term``: a graceful stop, exit status 0) and wait for the exit."""
        os.killpg(self.proc.pid, signal.SIGKILL if how == "kill" else signal.SIGTERM)
        rc = self.proc.wait(timeout=600)
        self._reader.join(10)
        if how == "term" and rc != 0:
            raise AssertionError(f"SIGTERM: exit status {rc}:\n" + "\n".join(self.lines[-40:]))


def interrupted_runs(sc: Scenario, base: Path, zk_config: Any, spark: Any) -> dict[str, Any]:
    """Play ``sc`` in ``base`` (input folder, store) on ``zk_config``; returns ``store``, ``folder``,
    ``payments`` (file name -> rows) once the last run delivered a balance for every payment and
    stopped."""
    from balance_pipeline import INPUT_ENV, payment_rows, write_payments
    from deltawheel.statestore.layout import StoreLayout

    folder, store = base / "input", base / "store"
    first_mtime = int(time.time()) - 3600
    payments: dict[str, list[dict[str, Any]]] = {}

    def add(i: int) -> None:
        rows = payment_rows(i * PER_FILE, PER_FILE, seed=sc.seed)
        write_payments(folder, i, rows)
        name = f"payments-{i:05d}.parquet"
        os.utime(folder / name, (first_mtime + i, first_mtime + i))  # read in this order
        payments[name] = rows

    for i in range(2):
        add(i)
    done = threading.Event()

    def writer() -> None:
        for i in range(2, sc.files):
            if done.wait(0.8):
                return
            add(i)

    env = {**os.environ, INPUT_ENV: str(folder),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "deltawheel.cli", "run", "balance_pipeline:pipeline", "--store", str(store),
           "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot, "--zk-session-timeout", "6",
           "--trigger", "200 milliseconds"]
    feeding = threading.Thread(target=writer, name="input-writer")
    feeding.start()
    try:
        for stop in sc.stops:
            child = Child(cmd, env)
            child.wait_batches(stop.batches)
            time.sleep(stop.delay_s)  # where in the batch the signal lands
            child.end(stop.signal)
        feeding.join()
        child = Child(cmd, env)
        layout = StoreLayout(str(store))
        total = sum(len(rows) for rows in payments.values())
        deadline = time.monotonic() + 900
        while spark.read.format("delta").load(layout.stream("balances")).count() < total:  # a balance per payment
            assert child.proc.poll() is None, "\n".join(child.lines[-40:])
            assert time.monotonic() < deadline, "\n".join(child.lines[-40:])
            time.sleep(1.0)
        child.end("term")
    finally:
        done.set()
        feeding.join()
    return {"store": store, "folder": folder, "payments": payments}
