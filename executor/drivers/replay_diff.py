"""The diff of a replay's shadow store against the live store (docs/replay.md, "Read the diff")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Collection, Mapping, Sequence

from deltawheel.statestore.exceptions import ConfigError, ReplayTargetError
from deltawheel.statestore.inspection.diff import StoreDiff, diff_stores
from deltawheel.statestore.inspection.positions import (
    ComputationCommit,
    commits_after,
    computation_commits,
    outside_commit_ids,
    tool_changes,
)
from deltawheel.statestore.layout import StoreLayout

from .replay_marker import read_marker, store_id
from .replay_shared import unheld_intervals

__all__ = ["ReplayOf", "replay_diff", "replay_of", "diff_replay"]


def replay_diff(spark: Any, store: StoreLayout, into: StoreLayout, *, computation: str, from_version: int | None,
                to_version: int, num_intervals: int, streams: Collection[str],
                intervals: Sequence[int] | None = None, keys: Sequence[str] | None = None,
                commits: Sequence[ComputationCommit] | None = None) -> StoreDiff:
    """The diff of the replay into ``into`` against the live ``store`` up to ``to_version``."""
    if commits is None:
        commits = computation_commits(spark, store, computation)
    replayed = commits_after(commits, from_version, to_version=to_version)
    batch_ids = {c.batch_id for c in replayed if c.batch_id is not None}
    # intervals no replayed commit held: compared as the live store's at the start
    unheld = () if from_version is None else \
        unheld_intervals(replayed, num_intervals=num_intervals, scope=intervals)
    d = diff_stores(spark, store, into, computation, version_a=to_version, streams=streams, batch_ids=batch_ids,
                    keys=keys, intervals=intervals, num_intervals=num_intervals,
                    exclude_commits=outside_commit_ids(commits, from_version, to_version=to_version),
                    seed_version=from_version if unheld else None, seed_intervals=unheld)
    notes = tuple(t.describe() for t in tool_changes(commits, from_version, to_version=to_version))
    return dataclasses.replace(d, notes=notes)


@dataclass(frozen=True, kw_only=True)
class ReplayOf:
    """What a shadow store's marker says of its replay (``num_intervals`` None: an old marker)."""

    from_version: int | None
    reached: int
    num_intervals: int | None
    outputs: tuple[str, ...] | None
    intervals: tuple[int, ...] | None
    keys: tuple[str, ...] | None

    @classmethod
    def from_marker(cls, m: Mapping[str, Any]) -> ReplayOf:
        """The marker's fields (``_replay.json``)."""
        def tup(v: Any) -> Any:
            return None if v is None else tuple(v)

        return cls(from_version=None if m.get("from_version") is None else int(m["from_version"]),
                   reached=int(m["reached"]) if m.get("reached") is not None else -1,
                   num_intervals=None if m.get("num_intervals") is None else int(m["num_intervals"]),
                   outputs=tup(m.get("outputs")), intervals=tup(m.get("intervals")), keys=tup(m.get("keys")))

    def describe(self) -> str:
        """One line: what B replays."""
        start = "the start" if self.from_version is None else f"rows version {self.from_version}"
        part = "" if self.intervals is None else f", intervals {list(self.intervals)}" + \
            (f" (keys {list(self.keys)})" if self.keys else "")
        return f"a replay from {start} up to rows version {self.reached}{part}"


def replay_of(spark: Any, a: StoreLayout, b: StoreLayout, computation: str) -> ReplayOf | None:
    """What B replays when its marker names A's store and ``computation``; None otherwise."""
    try:
        m = read_marker(b, spark=spark)
    except ReplayTargetError:  # B is on a scheme a shadow store is never on
        return None
    if m is None or m.get("store") != store_id(a) or m.get("computation") != computation:
        return None
    return ReplayOf.from_marker(m)


def diff_replay(spark: Any, a: StoreLayout, b: StoreLayout, of: ReplayOf, *, computation: str,
                version_a: int | None = None, version_b: int | None = None,
                streams: Collection[str] = ()) -> StoreDiff:
    """``deltawheel diff`` of the live store ``a`` against its replay ``b``; ConfigError for bad versions."""
    if of.num_intervals is None or of.outputs is None:  # an older deltawheel's marker
        d = diff_stores(spark, a, b, computation, version_a=version_a, version_b=version_b, streams=streams)
        return dataclasses.replace(d, notes=(
            f"B is {of.describe()}, but its marker (_replay.json, an older deltawheel's) does not record the "
            "computation's intervals and outputs: compared as two plain stores, so `pending` counts the keys of "
            "intervals no replayed commit held; continuing the replay into B records them",))
    plain = "; or give --plain to compare the two stores as they are"
    if of.reached < 0:
        raise ConfigError(f"store B is {of.describe()} that has not replayed a batch yet: continue the replay "
                          f"(the same deltawheel replay command), then diff{plain}")
    if version_a is not None and version_a != of.reached:
        raise ConfigError(f"store B is {of.describe()}: its state is store A's input position as of rows version "
                          f"{of.reached}, so the diff compares A as of that version; leave --as-of out (or give "
                          f"--as-of {of.reached}){plain}")
    if version_b is not None:
        raise ConfigError(f"store B is {of.describe()}: the replay's diff compares B's newest state (the one its "
                          f"marker describes); leave --as-of-b out{plain}")
    return replay_diff(spark, a, b, computation=computation, from_version=of.from_version, to_version=of.reached,
                       num_intervals=of.num_intervals, streams=streams or of.outputs,
                       intervals=of.intervals, keys=of.keys)
