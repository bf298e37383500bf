"""Replay of commits written by job instances holding part of a computation's intervals
(``drivers/replay.py``; docs/replay.md, "Instances sharing intervals").

Each live batch commit records the intervals its instance held (its lateness mark,
``protocol/lateness.py``). A replayed batch runs over exactly those intervals (an executor holding
them, as the live instance was): the records of other intervals are not processed, their timers do
not fire, their rows and pending productions are not written (so a commit clears only the pending
productions of the intervals it held, as the live instance's next commit did). The lateness mark
each instance judged lateness against is its own intervals' newest: the seed of a replay from a
version carries the newest mark of every interval (:func:`seed_marks`).

An interval moved between instances (or taken by an instance reading its input from the start)
made its new owner skip the records of the input files an earlier commit had processed for it
(``protocol/rescale.py``'s skip rule, by the positions committed per interval). The replay drops
the same records before running the batch: the sets the live instance skipped by are rebuilt
from the commit log (:func:`skip_sets`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from deltawheel.statestore.inspection.positions import ComputationCommit
from deltawheel.statestore.rowtable.inputfiles import ran_of

__all__ = ["held", "batch_intervals", "skip_sets", "skipped_files", "seed_marks", "unheld_intervals"]


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


def unheld_intervals(batches: Sequence[ComputationCommit], *, num_intervals: int,
                     scope: Sequence[int] | None = None) -> tuple[int, ...]:
    """The intervals of ``scope`` (None: all) that no replayed batch of ``batches`` runs over: their
    pending productions stay as the live commit before the replay's start left them (the seed
    leaves them out; the diff compares them as the live store's at the seed version)."""
    run: set[int] = set()
    for c in batches:
        on = batch_intervals(c, num_intervals=num_intervals, scope=scope)
        run |= set(range(num_intervals) if scope is None else scope) if on is None else set(on)
    return tuple(i for i in (range(num_intervals) if scope is None else sorted(scope)) if i not in run)


def skip_sets(commits: Sequence[ComputationCommit],
              batches: Sequence[ComputationCommit]) -> list[dict[int, frozenset[str]] | None]:
    """Per replayed batch of ``batches`` (in their order), what its live instance's skip rule
    dropped: interval -> the input files the commits before it (any of ``commits``, the seeded ones
    too) ran for that interval (``inputfiles.ran_of``: each interval its batch held ran each of
    its files). None for a batch whose instance ran without the skip rule (a single instance:
    its commit names no intervals), which never skips.

    The live set of an interval is the union of these records (docs/rescaling.md, "why a move
    stays exact": a set grows only in a commit of a batch that held the interval; a name gc added
    is one such a commit ran; a name gc dropped is a gone file, refused by the replay's read).
    A record is dropped by its interval's set, and a file with no record of an interval changes
    nothing, so the replayed batch drops exactly what the live one did (a Spark re-run of a
    committed batch too: everything)."""
    ran = sorted(((c.version, got) for c in commits if (got := ran_of(c.meta)) is not None), key=lambda r: r[0])
    sets: dict[int, frozenset[str]] = {}
    out: dict[int, dict[int, frozenset[str]] | None] = {}
    i = 0
    for c in sorted(batches, key=lambda c: c.version):
        while i < len(ran) and ran[i][0] < c.version:
            ivs, files = ran[i][1]
            for iv in ivs:
                sets[iv] = sets.get(iv, frozenset()) | frozenset(files)
            i += 1
        out[c.version] = dict(sets) if ran_of(c.meta) is not None else None
    return [out[c.version] for c in batches]


def skipped_files(c: ComputationCommit, done: Mapping[int, frozenset[str]] | None, *,
                  scope: Sequence[int] | None = None) -> tuple[tuple[tuple[int, ...], tuple[str, ...]], ...]:
    """What the replay of batch commit ``c`` drops (``done``: its :func:`skip_sets` entry), for the
    plan: (intervals, the files of ``c`` whose records of those intervals an earlier commit ran),
    grouped by intervals; () when it drops nothing. ``scope``: a partial replay's intervals.

    The batch runs over the intervals its instance held within ``scope`` (:func:`batch_intervals`:
    every interval when it held them all, which for the skip are those ``done`` names)."""
    if not done:
        return ()
    h = held(c)
    on = [i for i in h if scope is None or i in scope] if h else list(scope if scope is not None else sorted(done))
    by_ivs: dict[tuple[int, ...], list[str]] = {}
    for f in c.files or ():
        ivs = tuple(i for i in sorted(on) if f in done.get(i, frozenset()))
        if ivs:
            by_ivs.setdefault(ivs, []).append(f)
    return tuple((ivs, tuple(sorted(files))) for ivs, files in sorted(by_ivs.items()))


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
