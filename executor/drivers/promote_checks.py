"""What a promotion proves before it commits: that the replay ran every live commit it replaces
(claims, fences, compactions and tools' commits excepted; one without input positions never counts)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from deltawheel.statestore.exceptions import ReplayBehindError
from deltawheel.statestore.inspection.positions import ComputationCommit

from .replay_shared import batch_intervals

__all__ = ["unproven", "prove_caught_up", "behind"]

_NAMED = 5  # versions a refusal names one by one; the rest are counted


def _changes_rows(c: ComputationCommit) -> bool:
    """Whether commit ``c`` can change user rows: a batch, or a commit without positions."""
    return not c.replayable or c.reruns


def unproven(commits: Sequence[ComputationCommit], marker: Mapping[str, Any], *, num_intervals: int,
             intervals: Sequence[int] | None = None, upto: int | None = None) -> list[tuple[ComputationCommit, str]]:
    """The live commits the replay of ``marker`` has not re-run, each with why: those after the seed
    version (up to ``upto``) that change user rows of ``intervals``.

    >>> from deltawheel.statestore.rowtable.inputfiles import commit_entry, no_input_entry
    >>> def c(v, kind="commit", meta=None):
    ...     meta = commit_entry(v, ["f"]) if meta is None else meta
    ...     return ComputationCommit(
    ...         version=v, timestamp_ms=0, kind=kind, batch_id=meta.get("positions", {}).get("batch_id"),
    ...         files=None if "positions" not in meta else tuple(meta["positions"]["files"]),
    ...         input_ms=None, late_ms=None, meta=meta)
    >>> commits = [c(3), c(4, "claim", {}), c(5), c(6, "promote", no_input_entry()), c(7, meta={}), c(8)]
    >>> [(x.version, why) for x, why in unproven(commits, {"from_version": 3, "ran": [5]}, num_intervals=4)]
    [(7, 'records no input positions'), (8, 'not re-run by the replay')]
    """
    seed = marker.get("from_version")
    ran = marker.get("ran")
    done = set() if ran is None else {int(v) for v in ran}
    scope = intervals if intervals is not None else marker.get("intervals")
    out = []
    for c in commits:
        if (seed is not None and c.version <= int(seed)) or (upto is not None and c.version > upto):
            continue
        if not _changes_rows(c) or batch_intervals(c, num_intervals=num_intervals, scope=scope) == ():
            continue
        if not c.replayable:
            out.append((c, "records no input positions"))
        elif ran is None:
            out.append((c, "the replay's marker does not say which live commits it re-ran"))
        elif c.version not in done:
            out.append((c, "not re-run by the replay"))
    return out


def prove_caught_up(commits: Sequence[ComputationCommit], marker: Mapping[str, Any], *, into: str, computation: str,
                    num_intervals: int, intervals: Sequence[int] | None = None, upto: int | None = None) -> None:
    """Raise ReplayBehindError unless the replay re-ran every live commit :func:`unproven` looks at."""
    missing = unproven(commits, marker, num_intervals=num_intervals, intervals=intervals, upto=upto)
    if not missing:
        return
    newest = max(c.version for c in commits if upto is None or c.version <= upto)
    named = "; ".join(f"{c.version} ({_what(c)}: {why})" for c, why in missing[:_NAMED])
    more = f"; and {len(missing) - _NAMED} more" if len(missing) > _NAMED else ""
    if any(why == "records no input positions" for _, why in missing):
        todo = ("a commit without input positions cannot be replayed: replay from the newest such version or "
                "later into an empty folder, then promote that replay")
    elif marker.get("ran") is None:
        todo = ("that replay was made by an older deltawheel: replay again into an empty folder, then promote "
                "that replay")
    else:
        todo = (f"continue the replay into {into} (deltawheel replay with the same arguments) and promote again")
    raise ReplayBehindError(
        f"the replay in {into} has not run {len(missing)} live commits of {computation} up to rows version "
        f"{newest}, the state it would replace: {named}{more}. Promoting it would put keys behind what the live "
        f"store committed; nothing was changed. What to do: {todo}")


def _what(c: ComputationCommit) -> str:
    return f"kind {c.kind}" if c.batch_id is None else f"batch {c.batch_id}" + ("" if c.files else ", without input")


def behind(commits: Sequence[ComputationCommit], reached: int) -> list[ComputationCommit]:
    """The live commits after ``reached`` a catch-up re-runs (or must refuse)."""
    return [c for c in commits if c.version > reached and _changes_rows(c)]
