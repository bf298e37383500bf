"""Promote: a replay's state replaces the live computation's, under its leases (``deltawheel promote``).

:func:`promote` on a shadow store made by ``deltawheel replay`` (``replay.py``):

1. **Check** the shadow store is a replay of this store, pipeline and computation
   (:func:`check_replay`; :class:`ReplayTargetError` otherwise, nothing changed).
2. **Take the leases** of every interval of the computation (``statestore/surgery/``): the running
   pipeline finishes its batch in flight (commit and delivery), hands the intervals over at that
   batch boundary and waits; ``wait_s`` bounds the wait, ``no_wait`` refuses at once while an
   owner is live. The old owner's checkpointed productions are delivered first.
3. **Catch up** under the leases: the live input position can no longer move, so the replay is
   continued (``replay.py``, the same shadow folder and code) over the live commits it has not run,
   the in-flight batch's included. ``catch_up=False`` refuses a replay that is behind instead.
4. **Replace** the live rows of the computation with the shadow store's (state, timers, record
   ids, pending productions not yet delivered in the shadow store) in one fenced commit with the
   tool's sequencers, record it in the audit table, give the leases back: the pipeline takes them
   again and goes on from the promoted state. Outputs the live pipeline delivered stay as they are.

:func:`plan_promote` is the dry run (``--plan``): what would be caught up and which keys would
change, against the shadow store as it is now; no lease taken, nothing written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.delta.log import local_table_exists
from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.exceptions import ConfigError, ReplayTargetError
from deltawheel.statestore.inspection.positions import computation_commits
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX, KeyRow, is_user_key
from deltawheel.statestore.surgery.replace import (
    Held,
    Surgery,
    SurgeryResult,
    plan_replacement,
    replace_intervals,
)

from ..computation import Computation
from .replay import plan_replay, read_marker, replay, store_id

# keys written (and deleted) a plan names one by one; the rest are counted
_SHOWN = 5

__all__ = ["PromotePlan", "check_replay", "plan_promote", "promote", "promote_intervals", "shadow_rows"]


@dataclass(frozen=True)
class PromotePlan:
    """What a promotion would do: ``reached`` (the live rows version the replay ran up to),
    ``newest`` (the computation's newest live commit now), ``behind`` (live batches to catch up),
    ``change``: the keys it would write or delete if the replay were caught up as it is."""

    store: str
    into: str
    pipeline: str
    computation: str
    reached: int
    newest: int
    behind: int
    change: SurgeryResult

    def describe(self) -> str:
        """The plan as lines for a terminal."""
        lines = [f"promote the replay in {self.into} to {self.computation} of pipeline {self.pipeline} in {self.store}",
                 f"  the replay reached live rows version {self.reached}; the newest live commit of "
                 f"{self.computation} is {self.newest}" + (f": {self.behind} batches to catch up first, under the "
                                                           "leases" if self.behind else " (caught up)"),
                 f"  would take the leases of intervals {list(self.change.intervals)}, write "
                 f"{len(self.change.upserted)} keys and delete {len(self.change.deleted)} (against the replay as it "
                 "is now), in one fenced commit recorded in the audit table"]
        for r in self.change.upserted[:_SHOWN]:
            lines.append(f"  write  {r.key!r} (interval {r.interval})")
        for iv, k in self.change.deleted[:_SHOWN]:
            lines.append(f"  delete {k!r} (interval {iv})")
        more = max(0, len(self.change.upserted) - _SHOWN) + max(0, len(self.change.deleted) - _SHOWN)
        if more:
            lines.append(f"  ... and {more} more keys: deltawheel diff --store {self.store} --store {self.into} "
                         f"--computation {self.computation} compares them all")
        return "\n".join(lines)


def check_replay(store: StoreLayout, into: StoreLayout, *, pipeline: str, computation: str,
                 spark: Any = None) -> dict[str, Any]:
    """The marker of the replay in ``into``, checked to be of ``store``'s ``pipeline`` and
    ``computation`` (``spark``: its S3 settings reach an ``s3a://`` ``into``; without it, a local
    one only).

    Raises:
        ReplayTargetError: ``into`` is no replay, or one of another store, pipeline or computation,
            or one that never ran.
    """
    if store_id(into) == store_id(store):
        raise ReplayTargetError(f"--from {into.root} is the live store itself: give the folder a `deltawheel "
                                "replay --into` wrote")
    if not into.is_local and spark is None:
        raise ConfigError(f"--from {into.root} is on an object store: its marker is read with a session's S3 "
                          "settings (check_replay(..., spark=spark))")
    m = read_marker(into, spark=spark)
    if m is None:
        raise ReplayTargetError(f"--from {into.root} is not a replay's folder (no _replay.json): run `deltawheel "
                                f"replay --store {store.root} --pipeline {pipeline} --computation {computation} "
                                f"--into {into.root} ...` first")
    for what, want in (("store", store_id(store)), ("pipeline", pipeline), ("computation", computation)):
        if m.get(what) != want:
            raise ReplayTargetError(f"--from {into.root} is a replay of {what} {m.get(what)!r}, not {want!r}: a "
                                    f"replay promotes only into the {what} it replayed")
    if m.get("reached") is None:
        raise ReplayTargetError(f"--from {into.root}: the replay never finished its seeding; run the replay again")
    return m


def promote_intervals(marker: Mapping[str, Any], intervals: Sequence[int] | None, num_intervals: int, *,
                      into: str) -> tuple[int, ...] | None:
    """The intervals a promotion takes and replaces: ``intervals`` (checked), else those the
    replay replayed (its marker's ``intervals``; None: all).

    Raises:
        ConfigError: an interval outside ``0..num_intervals - 1``, or an empty list.
        ReplayTargetError: an interval the (partial) replay did not replay.
    """
    replayed = marker.get("intervals")
    if intervals is None:
        return None if replayed is None else tuple(sorted(int(i) for i in replayed))
    bad = sorted({i for i in intervals if not 0 <= i < num_intervals})
    if not intervals or bad:
        raise ConfigError(f"--intervals {list(intervals)}: the computation has intervals 0..{num_intervals - 1}"
                          + (f"; {bad} out of range" if bad else "; give at least one"))
    other = sorted(set(intervals) - set(replayed)) if replayed is not None else []
    if other and replayed is not None:
        raise ReplayTargetError(f"--intervals {list(intervals)}: the replay in {into} replayed only intervals "
                                f"{sorted(replayed)}, not {other}; promote a subset of them, or replay those "
                                "intervals too (a new replay with --intervals)")
    return tuple(sorted(set(intervals)))


def shadow_rows(spark: Any, into: StoreLayout, computation: str) -> list[KeyRow]:
    """The computation's rows in the shadow store, each with only the pending productions the
    shadow store has not delivered (a promoted checkpoint is delivered by the live pipeline's
    recovery; one delivered in the shadow store was the replay's output, never the live one's)."""
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(into.rows).where((F.col("computation") == computation)
                                                          & (F.col("key") != FENCE_KEY))
    rows = _ids_inline([KeyRow.from_row(r) for r in df.toArrow().to_pylist()])
    held: dict[str, set[str]] = {}
    for r in rows:
        for p in r.pending:
            held.setdefault(p.stream, set()).add(p.production_id)
    delivered: set[tuple[str, str]] = set()
    for stream, ids in held.items():
        if local_table_exists(table_files(spark, into.stream(stream)) or into.stream(stream)):
            got = spark.read.format("delta").load(into.stream(stream)).where(F.col("record_id").isin(sorted(ids)))
            delivered |= {(stream, str(r[0])) for r in got.select("record_id").collect()}
    return [r.with_(pending=tuple(p for p in r.pending if (p.stream, p.production_id) not in delivered))
            if r.pending else r for r in rows]


def _ids_inline(rows: list[KeyRow]) -> list[KeyRow]:
    """``rows`` with the record ids of the image path's ids rows folded into their keys' rows (a
    key with ids alone gets a row for them): the form a surgery commits by key; the image path
    moves them into an ids file when it next writes the interval."""
    by_key = {r.key: r for r in rows if is_user_key(r.key)}
    for r in rows:
        if not r.key.startswith(IDS_KEY_PREFIX) or not r.record_ids:
            continue
        key = r.key[len(IDS_KEY_PREFIX):]
        old = by_key.get(key) or KeyRow(r.computation, key, r.interval, sequencer=r.sequencer,
                                        commit_id=r.commit_id, updated_ms=r.updated_ms)
        by_key[key] = old.with_(record_ids=(*old.record_ids, *r.record_ids))
    return list(by_key.values())


def plan_promote(spark: Any, *, store: StoreLayout, into: StoreLayout, pipeline: str, computation: str,
                 num_intervals: int, intervals: Sequence[int] | None = None) -> PromotePlan:
    """The dry run (see the module docstring); ``intervals`` as :func:`promote`'s.

    Raises:
        ReplayTargetError: as :func:`check_replay` and :func:`promote_intervals`.
    """
    m = check_replay(store, into, pipeline=pipeline, computation=computation, spark=spark)
    ivs = promote_intervals(m, intervals, num_intervals, into=into.root)
    commits = computation_commits(spark, store, computation)
    reached = int(m["reached"])
    change = plan_replacement(spark, store, computation=computation, num_intervals=num_intervals, intervals=ivs,
                              build=lambda held: _within(shadow_rows(spark, into, computation), held.intervals))
    return PromotePlan(store.root, into.root, pipeline, computation, reached, commits[-1].version if commits else -1,
                       sum(1 for c in commits if c.version > reached and (c.reruns or not c.replayable)), change)


def promote(spark: Any, *, store: StoreLayout, into: StoreLayout, client: Any, pipeline: str, code: Computation,
            shadow_zk: ZkConfig | None = None, wait_s: float = 0.0, no_wait: bool = False, catch_up: bool = True,
            progress: Callable[[str], None] | None = None,
            before_commit: Callable[[Mapping[int, int]], None] | None = None,
            intervals: Sequence[int] | None = None) -> SurgeryResult:
    """Promote the replay in ``into`` to ``code``'s computation of the live ``store`` (see the
    module docstring). ``client``: the live pipeline's ZooKeeper; ``shadow_zk``: the shadow
    store's (None: its embedded server), for the catch-up; ``code``: what the catch-up runs (the
    replay's code). ``intervals``: promote only these (their leases only; default: those the
    replay replayed, all for a full replay).

    Raises:
        ReplayTargetError: not a replay of this computation; or ``catch_up=False`` and it is behind
            the live input position. Nothing changed.
        LeaseHeldError: ``no_wait`` and the pipeline holds an interval, or still held after
            ``wait_s``. Nothing changed.
        StaleSequencerError / LeaseLostError: a takeover raced the promotion; nothing changed.
        ConfigError: ``intervals`` out of range. Nothing changed.
    """
    say = progress or (lambda line: None)
    computation = code.name
    m = check_replay(store, into, pipeline=pipeline, computation=computation, spark=spark)
    ivs = promote_intervals(m, intervals, type(code).num_intervals, into=into.root)
    caught_up: list[int] = []

    def behind() -> Sequence[Any]:  # the live batches after the replay's position (claims, fences, tools: no input)
        reached = int(read_marker(into, spark=spark)["reached"])  # type: ignore[index]
        return [c for c in computation_commits(spark, store, computation)
                if c.version > reached and (c.reruns or not c.replayable)]

    if not catch_up and behind():
        raise ReplayTargetError(_not_caught_up(into, len(behind())))

    def build(held: Held) -> list[KeyRow]:
        # the leases are held: no live commit of the computation can land until they are given back
        todo = behind()
        if todo and not catch_up:
            raise ReplayTargetError(_not_caught_up(into, len(todo)))
        if todo:
            say(f"catching up: {len(todo)} live batches the replay has not run")
            fv = m.get("from_version")
            plan = plan_replay(spark, store=store, into=into, pipeline=pipeline, computation=computation,
                               from_version=fv, from_start=fv is None, intervals=m.get("intervals"),
                               num_intervals=type(code).num_intervals)
            replay(spark, plan, code=code, zk=shadow_zk, progress=say, diff=False)
            caught_up.append(len(plan.batches))
        return _within(shadow_rows(spark, into, computation), held.intervals)

    return replace_intervals(
        spark, store, client, pipeline=pipeline, computation=computation, num_intervals=type(code).num_intervals,
        build=build, wait_s=wait_s, no_wait=no_wait, progress=say, before_commit=before_commit, intervals=ivs,
        surgery=Surgery("promote", into.root, detail={"from_version": m.get("from_version"),
                                                      "code": f"{type(code).__module__}:{type(code).__qualname__}",
                                                      "caught_up_batches": caught_up,
                                                      "replayed_intervals": m.get("intervals"),
                                                      "replayed_keys": m.get("keys")}))


def _within(rows: Sequence[KeyRow], intervals: Sequence[int]) -> list[KeyRow]:
    """The rows of ``intervals`` (a promotion of some intervals writes only theirs)."""
    keep = set(intervals)
    return [r for r in rows if r.interval in keep]


def _not_caught_up(into: StoreLayout, n: int) -> str:
    return (f"--from {into.root} is {n} live batches behind the live input position; promote without "
            "--no-catch-up (it continues the replay under the leases), or run `deltawheel replay` into the same "
            "folder again first")
