"""The chaos run's fault schedule, drawn from a seed: faults of different targets overlap, a target
has one at a time (docs/reliability.md)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Collection

__all__ = ["PlannedFault", "KINDS", "TOOLS", "plan", "INSTANCES"]

INSTANCES = ("a", "b")

#: kind -> (weight, shortest and longest duration in seconds; the tools but ``rebalance`` heal at
#: their exit, this is how long the plan expects them; ``worker-kill``'s is how long the harness
#: watches what the driver does after it). ``session-expiry``'s pause adds the session timeout.
KINDS: dict[str, tuple[int, float, float]] = {
    "driver-kill": (3, 2.0, 8.0),
    "driver-pause": (3, 1.0, 4.0),
    "session-expiry": (2, 2.0, 6.0),
    "worker-kill": (2, 5.0, 15.0),
    "zk-kill": (2, 3.0, 10.0),
    "zk-leader-kill": (2, 3.0, 10.0),
    "disk-full": (2, 5.0, 20.0),
    "s3proxy-kill": (2, 3.0, 10.0),
    "net-cut": (2, 2.0, 20.0),
    "gc": (1, 60.0, 60.0),
    "rebalance": (2, 5.0, 15.0),
    "status": (1, 10.0, 10.0),
    "repair": (2, 10.0, 10.0),
    "upgrade-state": (1, 10.0, 10.0),
    "promote": (2, 15.0, 15.0),
}

#: The operator tools: one at a time in the "tools" slot, but a promote in a slot of its own (its
#: replay and catch-up take minutes beside a busy pipeline: the other tools run beside it).
TOOLS = ("gc", "rebalance", "status", "repair", "upgrade-state", "promote")


@dataclass(frozen=True)
class PlannedFault:
    """One fault of the schedule: ``at`` seconds into the chaos phase, lasting ``duration_s``."""

    at: float
    kind: str
    target: str
    duration_s: float

    @property
    def slot(self) -> str:
        """What one fault at a time holds: a driver, the ensemble, the disk, S3Proxy or the tools."""
        if self.target in INSTANCES:
            return self.target
        return "zk" if self.kind.startswith("zk") else {"disk-full": "disk", "s3proxy-kill": "s3",
                                                        "promote": "promote"}.get(self.kind, "tools")

    def rng(self, seed: int) -> random.Random:
        """This fault's own draws (a worker, a key), fixed by the run's seed."""
        return random.Random(f"{seed}:{self.at}:{self.kind}:{self.target}")


def _target(rng: random.Random, kind: str) -> str:
    if kind.startswith("driver") or kind in ("session-expiry", "worker-kill", "net-cut"):
        return rng.choice(INSTANCES)
    if kind == "zk-kill":
        return f"zk{rng.randrange(1, 4)}"
    if kind == "zk-leader-kill":
        return "leader"
    if kind == "rebalance":
        return rng.choice(("bank", "ledger", "window_sums"))
    if kind in ("repair", "upgrade-state", "promote"):  # the computations whose class a tool imports
        return rng.choice(("bank", "ledger"))
    return "s3proxy" if kind == "s3proxy-kill" else "store"


def plan(seed: int, seconds: float, *, mean_gap_s: float = 5.0, session_timeout_s: float = 6.0,
         settle_s: float = 4.0, kinds: Collection[str] | None = None) -> list[PlannedFault]:
    """The faults of a chaos phase of ``seconds``, a random gap apart (exponential, mean ``mean_gap_s``);
    a fault whose slot is busy (until ``settle_s`` after its last heal) moves after it; all heal before
    the phase ends. ``kinds``: those drawn from (default: all of :data:`KINDS`)."""
    rng = random.Random(seed)
    kinds = sorted(KINDS if kinds is None else set(kinds) & set(KINDS))
    weights = [KINDS[k][0] for k in kinds]
    busy: dict[str, float] = {}
    out: list[PlannedFault] = []
    t = rng.uniform(1.0, mean_gap_s)
    while t < seconds:
        kind = rng.choices(kinds, weights)[0]
        _, low, high = KINDS[kind]
        duration = round(rng.uniform(low, high), 1)
        if kind == "session-expiry":
            duration = round(session_timeout_s + duration, 1)
        target = _target(rng, kind)
        fault = PlannedFault(round(t, 1), kind, target, duration)
        start = round(max(fault.at, busy.get(fault.slot, 0.0)), 1)  # rounded before the check: healed in time
        if start + duration < seconds:
            fault = PlannedFault(start, kind, target, duration)
            out.append(fault)
            busy[fault.slot] = start + duration + settle_s
        t += rng.expovariate(1.0 / mean_gap_s)
    return sorted(out, key=lambda f: f.at)
