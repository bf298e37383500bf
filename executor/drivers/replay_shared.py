"""Replay of commits written by job instances holding part of the intervals (docs/replay.md)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from deltawheel.statestore.inspection.positions import ComputationCommit
from deltawheel.statestore.rowtable.inputfiles import ran_of

__all__ = ["held", "batch_intervals", "skip_sets", "skipped_files", "seed_marks", "unheld_intervals"]


def held(c: ComputationCommit) -> tuple[int, ...]:
    """The intervals the instance that wrote commit ``c`` held (() without a mark)."""
    late = (c.meta or {}).get("late")
    return tuple(sorted(int(i) for i in late.get("intervals") or ())) if isinstance(late, dict) else ()


def batch_intervals(c: ComputationCommit, *, num_intervals: int,
                    scope: Sequence[int] | None = None) -> tuple[int, ...] | None:
    """The intervals commit ``c``'s replay runs over within ``scope`` (None: all; (): not re-run)."""
    h = held(c)
    if not h or set(h) == set(range(num_intervals)):
        return None if scope is None else tuple(sorted(scope))
    return tuple(i for i in h if scope is None or i in scope)


def unheld_intervals(batches: Sequence[ComputationCommit], *, num_intervals: int,
                     scope: Sequence[int] | None = None) -> tuple[int, ...]:
    """The intervals of ``scope`` no replayed batch runs over (their pending productions stay)."""
    run: set[int] = set()
    for c in batches:
        on = batch_intervals(c, num_intervals=num_intervals, scope=scope)
        run |= set(range(num_intervals) if scope is None else scope) if on is None else set(on)
    return tuple(i for i in (range(num_intervals) if scope is None else sorted(scope)) if i not in run)


def skip_sets(commits: Sequence[ComputationCommit],
              batches: Sequence[ComputationCommit]) -> list[dict[int, frozenset[str]] | None]:
    """Per replayed batch: interval -> the input files earlier commits ran for it (None: no skip rule)."""
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
    """For the plan: what the replay of commit ``c`` drops, as (intervals, files) groups."""
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
    """The lateness marks a seed as of ``version`` carries, oldest first: each interval's newest."""
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
