"""Replay of commits written by job instances holding part of a computation's intervals
(``drivers/replay.py``; docs/replay.md, "Instances sharing intervals").

Each live batch commit records the intervals its instance held (its lateness mark,
``protocol/lateness.py``). A replayed batch runs over exactly those intervals (an executor holding
them, as the live instance was): the records of other intervals are not processed, their timers do
not fire, their rows and pending productions are not written (so a commit clears only the pending
productions of the intervals it held, as the live instance's next commit did). The lateness mark
each instance judged lateness against is its own intervals' newest: the seed of a replay from a
version carries the newest mark of every interval (:func:`seed_marks`).

An interval moved between instances (a commit holding it with other intervals than the commit
before it that held it) is refused (:func:`refuse_moved`): its new owner skipped the records its
earlier owner had processed (``protocol/rescale.py``'s skip rule, by the positions committed per
interval), which the replay does not re-derive.
"""

from __future__ import annotations

from typing import Any, Sequence

from deltawheel.statestore.exceptions import ReplayUnavailableError
from deltawheel.statestore.inspection.positions import ComputationCommit

__all__ = ["held", "batch_intervals", "refuse_moved", "seed_marks"]


def held(c: ComputationCommit) -> tuple[int, ...]:
    """The intervals the instance that wrote commit ``c`` held (its lateness mark's; () when the
    commit has no mark: a claim, a tool's)."""
    late = (c.meta or {}).get("late")
    return tuple(sorted(int(i) for i in late.get("intervals") or ())) if isinstance(late, dict) else ()


def batch_intervals(c: ComputationCommit, *, num_intervals: int,
                    scope: Sequence[int] | None = None) -> tuple[int, ...] | None:
    """The intervals the replay of batch commit ``c`` runs over: those its instance held, within
    ``scope`` (a partial replay's intervals; None: all). None: every interval of ``scope`` (the
    commit of an instance holding every interval, or one recording none); () : none of ``scope``
    (the batch is not re-run)."""
    h = held(c)
    if not h or set(h) == set(range(num_intervals)):
        return None if scope is None else tuple(sorted(scope))
    return tuple(i for i in h if scope is None or i in scope)


def refuse_moved(computation: str, commits: Sequence[ComputationCommit],
                 batches: Sequence[ComputationCommit]) -> None:
    """Refuse a replay of a batch whose instance took an interval another set of intervals held
    before (the newest earlier commit holding one of its intervals held other intervals).

    Raises:
        ReplayUnavailableError: naming the two commits and their intervals, and the version from
            which a replay is possible (the first commit after the move).
    """
    marked = [c for c in commits if held(c)]
    replayed = {c.version for c in batches}
    moved: tuple[ComputationCommit, ComputationCommit] | None = None
    for i, c in enumerate(marked):
        mine = set(held(c))
        prev = next((p for p in reversed(marked[:i]) if mine & set(held(p))), None)
        if prev is not None and set(held(prev)) != mine:
            if c.version in replayed:
                moved = (prev, c)
    if moved is None:
        return
    prev, c = moved
    raise ReplayUnavailableError(
        f"{computation}: rows version {c.version} was committed by a job instance holding intervals {list(held(c))}, "
        f"and the commit before it on some of those intervals (version {prev.version}) by one holding "
        f"{list(held(prev))}: intervals moved between instances. The new owner skipped the records its earlier "
        "owner had processed (by the input positions committed per interval), which a replay does not re-derive. "
        f"Replay from rows version {c.version} or later (--from-version), once the intervals stayed with their "
        "instances")


def seed_marks(commits: Sequence[ComputationCommit], version: int) -> list[dict[str, Any]]:
    """The lateness marks (commit metadata ``late`` entries) a seed as of rows ``version`` carries,
    oldest first: the newest mark up to ``version`` of every interval (one when a single instance
    held them all), so each replayed instance judges lateness against its own intervals' mark."""
    covered: set[int] = set()
    out: list[dict[str, Any]] = []
    for c in reversed([c for c in commits if c.version <= version and isinstance(c.meta.get("late"), dict)]):
        h = set(held(c))
        if not h:  # a mark naming no intervals (an older deltawheel's): it held them all
            if not out:
                out.append(dict(c.meta["late"]))
            break
        if h - covered:
            out.append(dict(c.meta["late"]))
            covered |= h
    return out[::-1]
