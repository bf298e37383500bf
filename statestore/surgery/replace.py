"""A tool's fenced replacing write of some intervals of a live computation: hand-over, leases and
recovery, one fenced commit, leases back, audit record; :func:`plan_replacement` is its dry run."""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..delta.log import batch_metas, newest_commit_info, user_metadata
from ..delta.storefs import table_files
from ..exceptions import LeaseHeldError
from ..layout import StoreLayout
from ..ownership.owner import IntervalOwner
from ..rowtable.inputfiles import no_input_entry
from ..rowtable.recovery import RecoveredIntervals
from ..rowtable.rows import KeyRow, is_user_key
from ..rowtable.store import RowStore
from ..writepath.delivery import deliver_productions, undelivered
from ..zk.handover import clear_handover, request_handover
from ..zk.lease_tools import list_leases
from ..zk.leases import LeaseManager
from .audit import AuditRecord, append_audit, commit_meta, recover_audit, who
from .timeline import Timeline

__all__ = ["Surgery", "Held", "SurgeryResult", "holds_nothing", "row_changes", "replace_intervals",
           "plan_replacement", "refuse_live_owners"]

#: the fields of a row a replacement compares (the writer's bookkeeping is not content)
_CONTENT = ("state", "codec", "timers", "record_ids", "pending", "watermark_hold_ms", "timer_seq")


@dataclass(frozen=True)
class Surgery:
    """Who changes what (``tool``, ``source``: as :class:`.audit.AuditRecord`), recorded with the commit."""

    tool: str
    source: str
    who: str = field(default_factory=who)
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Held:
    """What ``build`` gets: the tool's sequencers and the intervals' rows now (no fence rows)."""

    intervals: tuple[int, ...]
    sequencers: Mapping[int, int]
    rows: tuple[KeyRow, ...]


@dataclass(frozen=True, kw_only=True)
class SurgeryResult:
    """What a replacement did (or, ``planned``, would do); ``before``: the changed keys' old rows."""

    computation: str
    intervals: tuple[int, ...]
    sequencers: Mapping[int, int]
    upserted: tuple[KeyRow, ...]
    deleted: tuple[tuple[int, str], ...]
    before: Mapping[str, KeyRow]
    version: int | None
    audit_id: str | None
    planned: bool

    @property
    def rows_changed(self) -> int:
        """Keys written or deleted."""
        return len(self.upserted) + len(self.deleted)


def holds_nothing(row: KeyRow) -> bool:
    """Whether ``row`` holds no state, timers, checkpointed productions or watermark hold."""
    return row.state is None and not row.timers and not row.pending and row.watermark_hold_ms is None


def row_changes(before: Sequence[KeyRow], after: Sequence[KeyRow]) -> tuple[list[KeyRow], list[tuple[int, str]]]:
    """The rows of ``after`` that differ from ``before`` (empty new keys left out), and the keys dropped."""
    old = {r.key: r for r in before if is_user_key(r.key)}
    new = {r.key: r for r in after if is_user_key(r.key) and (r.key in old or not holds_nothing(r))}
    ups = [r for k, r in sorted(new.items())
           if k not in old or any(getattr(r, f) != getattr(old[k], f) for f in _CONTENT)]
    dels = [(r.interval, k) for k, r in sorted(old.items()) if k not in new]
    return ups, dels


def _intervals(intervals: Sequence[int] | None, num_intervals: int) -> tuple[int, ...]:
    return tuple(sorted(set(range(num_intervals) if intervals is None else intervals)))


def plan_replacement(spark: Any, layout: StoreLayout, *, computation: str, num_intervals: int,
                     intervals: Sequence[int] | None = None,
                     build: Callable[[Held], Sequence[KeyRow]]) -> SurgeryResult:
    """The dry run of :func:`replace_intervals`: ``build`` over the rows now; no lease, no write."""
    ivs = _intervals(intervals, num_intervals)
    rows = tuple(RowStore(spark, layout, writer="plan").scan_intervals(computation, ivs))
    ups, dels = row_changes(rows, build(Held(ivs, {}, rows)))
    return SurgeryResult(computation=computation, intervals=ivs, sequencers={}, upserted=tuple(ups),
                         deleted=tuple(dels), before=_before(rows, ups, dels), version=None, audit_id=None,
                         planned=True)


def replace_intervals(spark: Any, layout: StoreLayout, client: Any, *, pipeline: str, computation: str,
                      num_intervals: int, build: Callable[[Held], Sequence[KeyRow]], surgery: Surgery,
                      intervals: Sequence[int] | None = None, wait_s: float = 0.0, no_wait: bool = False,
                      progress: Callable[[str], None] | None = None,
                      before_commit: Callable[[Mapping[int, int]], None] | None = None,
                      skip_delivery: frozenset[str] = frozenset(),
                      before_audit: Callable[[int | None], None] | None = None,
                      input_sets: Callable[[Mapping[int, frozenset[str]]], Mapping[int, frozenset[str]]] | None = None,
                      timeline: Timeline | None = None) -> SurgeryResult:
    """Take ``intervals`` (None: all), commit ``build``'s rows in their place, give them back, record it.

    ``before_commit`` / ``before_audit``: test hooks; ``skip_delivery``: checkpointed productions not
    delivered; ``input_sets``: the intervals' input-file sets -> those replacing them in the same commit.

    Raises:
        LeaseHeldError: ``no_wait`` and a live owner holds an interval, still held after ``wait_s``,
            or another tool's request is open. Nothing changed.
        StaleSequencerError / LeaseLostError: a takeover raced the tool; nothing changed.
        CoordinatorStateLostError, StoreMismatchError: as every owner's acquire.
    """
    say = progress or (lambda line: None)
    tl = timeline or Timeline()
    ivs = _intervals(intervals, num_intervals)
    if no_wait:
        refuse_live_owners(client, pipeline=pipeline, computation=computation, intervals=ivs)
    with tl.phase("audit rows left by earlier tool runs"):
        for r in recover_audit(spark, layout):
            say(f"audit: appended the missing row {r.audit_id} of the {r.tool} commit at rows version "
                f"{r.commit_version} (an earlier tool run stopped before recording it)")
    writer = f"deltawheel-{surgery.tool}:{surgery.who}"
    request_handover(client, pipeline=pipeline, computation=computation, intervals=ivs, tool=surgery.tool,
                     by=surgery.who)
    leases = LeaseManager(client, pipeline=pipeline, owner=writer)
    audit_id = uuid.uuid4().hex
    commit_id = None
    try:
        store = RowStore(spark, layout, writer=writer)
        owner = IntervalOwner(store, leases, computation, num_intervals=num_intervals)
        say(f"{computation}: waiting up to {wait_s:g}s for intervals {list(ivs)} (running owners hand them over "
            "at their next batch boundary)")
        t0 = time.monotonic()
        phase = [tl.begin("the hand-over: the live stage ends its batch in flight and gives the intervals back")]

        def on_granted() -> None:  # the live stage waits from here on
            tl.end(phase[0])
            tl.paused_from()
            phase[0] = tl.begin("the leases taken: fence and recovery scan (the old owner's checkpoints delivered)")

        owner.on_granted = on_granted
        try:
            rec = _acquire(spark, layout, owner, ivs, wait_s=wait_s, computation=computation, skip=skip_delivery)
        finally:
            tl.end(phase[0])
        seqs = dict(owner.sequencers)
        t_held = time.monotonic()
        say(f"{computation}: intervals held after {t_held - t0:.1f}s, sequencers {seqs}")
        rows = tuple(r for r in rec.rows.values() if is_user_key(r.key))
        new_rows = build(Held(ivs, seqs, rows))
        ups, dels = row_changes(rows, new_rows)
        # the old owner's checkpoints are all in their streams now: a row written drops them
        landed = {p.production_id for _, p in rec.pending} - skip_delivery
        ups = [r.with_(pending=tuple(p for p in r.pending if p.production_id not in landed))
               if any(p.production_id in landed for p in r.pending) else r for r in ups]
        sets: Mapping[int, frozenset[str]] = {}
        if input_sets is not None:  # read under the leases: no commit of another writer can change them now
            now_sets = store.input_files(computation)
            sets = {iv: fs for iv, fs in input_sets({iv: now_sets.get(iv, frozenset()) for iv in ivs}).items()
                    if iv in ivs and fs != now_sets.get(iv, frozenset())}
        if before_commit is not None:
            before_commit(seqs)
        record = AuditRecord(
            audit_id=audit_id, recorded_ms=int(time.time() * 1000), who=surgery.who, tool=surgery.tool,
            pipeline=pipeline, computation=computation, source=surgery.source, intervals=ivs,
            rows_upserted=len(ups), rows_deleted=len(dels), commit_version=None, sequencers=seqs,
            detail=surgery.detail)
        if ups or dels or sets:
            with tl.phase(f"fenced commit: {len(ups)} keys written, {len(dels)} deleted"):
                commit_id = f"{writer}:{audit_id}"
                store.commit(computation, ups, sequencers=seqs, deletes=dels, num_intervals=num_intervals,
                             commit_id=commit_id, lease_check=owner.check, kind=surgery.tool,
                             meta={**commit_meta(record), **no_input_entry()}, input_sets=sets or None)
        else:
            say(f"{computation}: nothing to change (no commit)")
    finally:
        with tl.phase("the intervals given back"):
            leases.close()  # gives the intervals back: the pipeline's instances take them again
            clear_handover(client, pipeline, computation)
        t_back = time.monotonic()
        tl.paused_until()
    with tl.phase("the audit record"):
        version = None if commit_id is None else _version_of(spark, layout, computation, commit_id)
        if commit_id is not None:
            say(f"{computation}: committed {len(ups)} rows written, {len(dels)} deleted"
                + (f", the input-file sets of intervals {sorted(sets)} replaced" if sets else "")
                + f" at rows version {version}; intervals given back after {t_back - t0:.1f}s "
                f"(held {t_back - t_held:.1f}s)")
        if before_audit is not None:
            before_audit(version)
        append_audit(spark, layout, dataclasses.replace(record, commit_version=version,
                                                        recorded_ms=int(time.time() * 1000)))
    return SurgeryResult(computation=computation, intervals=ivs, sequencers=seqs, upserted=tuple(ups),
                         deleted=tuple(dels), before=_before(rows, ups, dels), version=version,
                         audit_id=audit_id, planned=False)


def _before(rows: Sequence[KeyRow], ups: Sequence[KeyRow],
            dels: Sequence[tuple[int, str]]) -> dict[str, KeyRow]:
    """The rows the changed keys had (a new key: absent)."""
    by_key = {r.key: r for r in rows}
    return {r.key: by_key[r.key] for r in ups if r.key in by_key} | {k: by_key[k] for _, k in dels}


def refuse_live_owners(client: Any, *, pipeline: str, computation: str, intervals: Sequence[int]) -> None:
    """``--no-wait``: refuse at once (LeaseHeldError) while a live owner holds one of ``intervals``."""
    live = {r["interval"]: r["owner"] for r in list_leases(client, pipeline=pipeline)
            if r["computation"] == computation and r["interval"] in intervals and r["owner"] is not None}
    if live:
        raise LeaseHeldError(
            f"--no-wait: intervals {sorted(live)} of {pipeline}/{computation} are held by a running owner "
            f"({', '.join(sorted(set(map(str, live.values()))))}); nothing was changed. Give --wait SECONDS to "
            "let it hand them over at its next batch boundary, or stop the pipeline first")


def _acquire(spark: Any, layout: StoreLayout, owner: IntervalOwner, ivs: Sequence[int], *, wait_s: float,
             computation: str, skip: frozenset[str] = frozenset()) -> RecoveredIntervals:
    """Take, fence (a claim), deliver the undelivered checkpoints but ``skip``; the recovery scan."""
    rec = owner.acquire(ivs, wait_s=wait_s, claim_only=True)
    pending = [(k, p) for k, p in rec.pending if p.production_id not in skip]
    todo = {p.production_id for p in undelivered(spark, layout, [p for _, p in pending])}
    pending = [(k, p) for k, p in pending if p.production_id in todo]
    commit_ids = {p.production_id: rec.rows[k].commit_id if k in rec.rows else None for k, p in pending}
    if pending:
        deliver_productions(spark, layout, [p for _, p in pending], producer=computation, commit_ids=commit_ids)
    return rec


def _version_of(spark: Any, layout: StoreLayout, computation: str, commit_id: str) -> int | None:
    """The version of ``computation``'s rows table whose metadata carries ``commit_id`` (newest first)."""
    rows_table = layout.rows_of(computation)
    files = table_files(spark, rows_table)
    if files is not None:
        try:
            found = newest_commit_info(files, lambda info: _holds(info.get("userMetadata"), commit_id))
        except ValueError:
            found = None
        if found is not None:
            return found[0]
    for r in spark.sql(f"DESCRIBE HISTORY delta.`{rows_table}` LIMIT 200").select("version", "userMetadata").collect():
        if _holds(r["userMetadata"], commit_id):
            return int(r["version"])
    return None


def _holds(meta: object, commit_id: str) -> bool:
    """The commit with ``meta`` holds the batch ``commit_id`` (a group commit's batches each)."""
    return any(b.get("commit_id") == commit_id for b in batch_metas(user_metadata(meta)))
