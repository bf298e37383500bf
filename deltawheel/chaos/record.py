"""What a finished chaos run is judged on beside its streams: the drivers' own exits (a supervisor
started each again), and ``--recheck``, the check of a run's folder again from its ``faults.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltawheel.statestore.exceptions import ConfigError

from .checker import CheckResult, FaultRecord, Violation, check_run

__all__ = ["DriverExit", "EXPECTED_EXITS", "UNREACHABLE", "exit_violations", "exits_note", "recheck"]


@dataclass(frozen=True)
class DriverExit:
    """A driver that stopped by itself: when, its exit code and error line (it was started again)."""

    driver: str
    code: int
    at: float
    error: str


def exits_note(exits: list[DriverExit], driver: str, watched_s: float) -> str:
    """What ``driver`` did while a fault's watch of ``watched_s`` saw ``exits``: its exits, or that it ran on."""
    mine = [e for e in exits if e.driver == driver]
    if mine:
        return "the driver exited " + ", ".join(f"with {e.code} ({e.error[:160]})" for e in mine)
    return f"the driver ran on for {watched_s:.0f}s"


#: The exit codes a driver may stop with under these faults, to be started again: 4 (a lease lost
#: with an expired session: a ``session-expiry``, a ``net-cut`` past the session timeout; a lease
#: another process still holds), 9 (a failed batch, a conflict).
EXPECTED_EXITS = (4, 9)
#: On an object-store run also 5 with this error: a driver started while S3Proxy is down.
UNREACHABLE = "ObjectStoreUnreachableError"


def exit_violations(exits: list[DriverExit], *, object_store: bool = False) -> list[Violation]:
    """A driver exit with a code outside :data:`EXPECTED_EXITS` is a violation; on an object-store
    run an unreachable store (:data:`UNREACHABLE`) is not."""
    return [Violation("driver-exit", f"driver {e.driver} exited with {e.code}: {e.error}") for e in exits
            if e.code not in EXPECTED_EXITS and not (object_store and e.code == 5 and e.error.startswith(UNREACHABLE))]


def recheck(data: Path, *, bound_s: float = 600.0) -> tuple[dict[str, Any], CheckResult]:
    """The check of an earlier run's folder (its input, streams and ``faults.json``) again.

    Raises:
        ConfigError: ``data`` holds no finished chaos run."""
    try:
        saved = json.loads((data / "faults.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"chaos --recheck {data}: no faults.json of a finished run ({exc})") from exc
    faults = [FaultRecord(**f) for f in saved["faults"]]
    result = check_run(data / saved.get("store", "store"), data / "input", faults, bound_s=bound_s, end=saved["phases"].get("drained"))
    result.violations += exit_violations([DriverExit(**e) for e in saved.get("exits", [])],
                                         object_store=bool(saved.get("object_store")))
    return saved, result
