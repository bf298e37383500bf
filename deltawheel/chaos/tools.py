"""The operator tools a chaos run starts beside its pipeline, one at a time, their exit codes and last
lines recorded: a refusal is an outcome; the streams show any damage (docs/reliability.md)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from .bank import ACCOUNTS, PIPELINE
from .faults import PlannedFault

__all__ = ["tool_fault", "CODE", "SOURCE"]

SOURCE = "deltawheel.chaos.bank:pipeline"
CODE = {"bank": "deltawheel.chaos.bank:Bank", "ledger": "deltawheel.chaos.bank:Ledger"}
WAIT_S = "60"  # the hand-over wait an operator gives (the tools' default)


class _Harness(Protocol):
    """What the tools use of the run's harness (``harness.py`` imports this module, not the reverse)."""

    s: Any  # its ChaosSettings: seed, master
    run: Any  # its ChaosRun: the phases' times
    data: Path
    logs: Path
    store_url: str
    stopping: threading.Event

    def tool(self, name: str, *args: str) -> int: ...

    def zk_args(self) -> list[str]: ...


def _run(h: _Harness, name: str, *args: str) -> str:
    """Run tool ``name`` (``deltawheel name args``); ``rc N: last line``."""
    rc = h.tool(name, name, *args)
    try:
        lines = [ln.strip() for ln in (h.logs / f"tool-{name}.log").read_text(errors="replace").splitlines()]
    except OSError:
        lines = []
    return f"{name} rc {rc}: {next((ln[:200] for ln in reversed(lines) if ln), '')}"


def tool_fault(h: _Harness, f: PlannedFault) -> tuple[str, str]:
    """Run the tool of fault ``f``; returns (target, note)."""
    store, zk, spark = ["--store", h.store_url], h.zk_args(), ["--master", h.s.master, "--driver-memory", "1g"]
    live = [*store, "--pipeline", PIPELINE, "--computation", f.target, *zk]
    if f.kind == "gc":
        return f.target, f"rc {h.tool('gc', 'gc', *store, '--apply', *zk, '--master', h.s.master)}"
    if f.kind == "status":
        return f.target, f"rc {h.tool('status', 'status', *store, *zk)}"
    if f.kind == "rebalance":  # the computation's intervals 0-2 to a, 3 to b; then back to the members' split
        move = ["--pipeline", PIPELINE, "--computation", f.target, *zk]
        rc = h.tool("rebalance", "rebalance", *move, "--assign", "a=0-2", "--assign", "b=3")
        h.stopping.wait(f.duration_s)
        return f.target, f"rc {rc}, {h.tool('rebalance', 'rebalance', *move, '--clear')}"
    if f.kind == "repair":
        key = f"a{f.rng(h.s.seed).randrange(ACCOUNTS):02d}"
        change = "to_json(named_struct('n', 0, 'out', 0))" if f.target == "bank" else "state_json"
        statement = f"UPDATE state SET state_json = {change} WHERE key = '{key}'"
        return f"{f.target}/{key}", _run(h, "repair", *live, "--wait", WAIT_S, *spark, statement)
    if f.kind == "upgrade-state":
        return f.target, _run(h, "upgrade-state", *live, "--code", CODE[f.target], "--wait", WAIT_S, *spark)
    # promote of an unchanged replay: from the chaos phase's start (a time the operator picks)
    shadow = h.data / "replays" / f"{f.target}-{f.at:.1f}"
    since = str(int(h.run.phases["chaos"] * 1000))
    replayed = _run(h, "replay", *live, "--from-timestamp", since, "--source", SOURCE, "--into", str(shadow),
                    *spark)
    if not replayed.startswith("replay rc 0:"):
        return f.target, replayed
    return f.target, f"{replayed}; {_run(h, 'promote', *live, '--from', str(shadow), '--wait', WAIT_S, *spark)}"
