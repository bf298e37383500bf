"""Running user code for one key in one batch: pure Python, no Spark, no I/O.

A key's run: 1. drop records already seen; 2. ``process_record`` on the rest in event-time order;
3. fire due timers in timestamp order (event time before the input low watermark, processing
time up to now); 4. build the new row image."""

from __future__ import annotations

import hashlib
from enum import Enum
from operator import attrgetter
from typing import Any, NamedTuple, Sequence

from deltawheel.statestore.codecs import Codec, codec_version, get_codec, versioned_name
from deltawheel.statestore.rowtable.rows import (
    DOMAIN_VALUES,
    KeyRow,
    Production,
    SeenId,
    make_row,
    updated_row,
)

from ...computation import Computation, ErrorPolicy, Record
from ...context import TTL_TAG, Context, TimerCause
from ...exceptions import StateUpgradeError, UserCodeError
from .combine import combined_rows, late_prefix, records_table

__all__ = ["AS_INPUT", "SameAsInput", "KeyOutcome", "run_key", "UserCode", "codec_of", "UserCodeError",
           "MAX_TIMER_ROUNDS", "first_timer_seq", "first_timer_seqs", "state_codec_of"]

MAX_TIMER_ROUNDS = 10_000


class SameAsInput(Enum):
    """The type of :data:`AS_INPUT`."""

    AS_INPUT = "as_input"


#: ``record_watermark_ms`` default: records run under the input watermark itself.
AS_INPUT = SameAsInput.AS_INPUT
#: (ids run, duplicates, late, dead letters) of a key's records
_RecordsRan = tuple[list[str], int, int, list[tuple[Record, str]]]


class KeyOutcome(NamedTuple):
    """What one key's run produced (a named tuple: one is built per key of every batch)."""

    row: KeyRow | None  # new image; None = the key is empty now (delete its row)
    changed: bool
    productions: tuple[Production, ...]  # new in this run
    processed: int
    duplicates: int
    timers_fired: int
    late: int
    dead_letters: tuple[tuple[Record, str], ...]
    new_record_ids: tuple[str, ...] = ()  # ids of the records processed or dead-lettered in this run
    ids_expired: int = 0  # the row's record ids dropped: seen before the dedup horizon
    keys_expired: int = 0  # 1: the state TTL dropped the key


def run_key(comp: Computation, *, key: str, interval: int, row: KeyRow | None, records: Sequence[Record],
            input_watermark_ms: int | None, now_ms: int, dedup_horizon_ms: int | None = None,
            fire_timers: bool = True, presorted: bool = False, keep_ids: bool = True,
            strong: bool | None = None, record_watermark_ms: int | None | SameAsInput = AS_INPUT) -> KeyOutcome:
    """Run ``comp``'s user code for ``key`` over ``records`` and its due timers. ``presorted``:
    already in (event time, record id) order; ``keep_ids``: False only reports new ids;
    ``strong``: checkpoint the productions in the row (default: ``comp.strong_productions``)."""
    codec = codec_of(comp)
    ctx = Context(computation=comp.name, key=key, state_bytes=row.state if row else None, codec=codec,
                  timers=row.timers if row else (), outputs=comp.outputs,
                  input_watermark_ms=input_watermark_ms, now_ms=now_ms,
                  watermark_hold_ms=row.watermark_hold_ms if row else None,
                  timer_seq=row.timer_seq if row else None, row_codec=row.codec if row else None,
                  state_codec=state_codec_of(comp))
    # Phases 1-3 (the ids seen before the dedup horizon no longer count: they leave the row below)
    exactly_once = comp.exactly_once
    horizon = _NEVER if dedup_horizon_ms is None else dedup_horizon_ms
    seen = {s.record_id for s in row.record_ids if s.seen_ms >= horizon} if (row and exactly_once) else set()
    user = UserCode(comp, input_watermark_ms=input_watermark_ms, now_ms=now_ms, fire_timers=fire_timers,
                    record_watermark_ms=record_watermark_ms)
    fresh, dups, late, dead, fired = user.run(ctx, records if presorted else sorted(records, key=_ORDER),
                                              seen if exactly_once else None)
    # Phase 4: the new row image.
    old_ids = row.record_ids if row else ()
    if not exactly_once or ctx.expired:
        ids: tuple[SeenId, ...] = ()
    elif keep_ids:
        ids = old_ids + tuple(SeenId(rid, now_ms) for rid in fresh)
    else:
        ids = old_ids
    expired = 0
    if dedup_horizon_ms is not None and ids:
        kept = tuple(s for s in ids if s.seen_ms >= dedup_horizon_ms)
        expired, ids = len(ids) - len(kept), kept
    prods = tuple(ctx.productions)
    strong = comp.strong_productions if strong is None else strong
    pending = (row.pending if row else ()) + (prods if strong else ())
    state = ctx.encoded_state()
    timers = ctx.stored_timers
    hold = ctx.watermark_hold_ms
    changed = bool(fresh or fired or prods) or ids != old_ids or (
        row is not None and (state != row.state or timers != row.timers))
    empty = state is None and not timers and not pending and not ids and hold is None
    new_row = None if empty else updated_row(row or make_row(comp.name, key, interval, None, codec.name, (), None),
                                             state, ctx.stored_codec(), timers, ids, pending, hold, ctx.timer_seq)
    return KeyOutcome(row=new_row, changed=changed or (row is not None and empty), productions=prods,
                      processed=len(fresh), duplicates=dups, timers_fired=fired, late=late, dead_letters=tuple(dead),
                      new_record_ids=tuple(fresh) if exactly_once else (), ids_expired=expired,
                      keys_expired=int(ctx.expired))


def codec_of(comp: Computation) -> Codec:
    """The computation's state / production codec (looked up once per codec)."""
    codec = _CODECS.get((comp.codec, comp.allow_pickle))
    if codec is None:
        codec = _CODECS[(comp.codec, comp.allow_pickle)] = get_codec(comp.codec, allow_pickle=comp.allow_pickle)
    return codec


def state_codec_of(comp: Computation) -> str:
    """The codec column of state the computation writes: its codec, with its state version."""
    version = comp.state_version
    return codec_of(comp).name if version == 1 else versioned_name(codec_of(comp).name, version)


class UserCode:
    """Phases 1-3 for the keys of one batch: the one implementation of user-code semantics."""

    def __init__(self, comp: Computation, *, input_watermark_ms: int | None, now_ms: int,
                 fire_timers: bool = True, combine_per_key: bool = True,
                 record_watermark_ms: int | None | SameAsInput = AS_INPUT) -> None:
        self.comp = comp
        self.batch = comp.batches_records()
        self.dead_letter = comp.error_policy is ErrorPolicy.DEAD_LETTER
        # the vectorised path, one combine per key (``combine_per_key``)
        self.per_key_combine = combine_per_key and comp.vectorised() and not self.dead_letter
        self.wm = input_watermark_ms if input_watermark_ms is not None else _NEVER
        self.now_ms = now_ms
        self.fire_timers = fire_timers
        self._timer_id = f"timer:{comp.name}:"
        self.known_wm = input_watermark_ms
        self.record_wm = input_watermark_ms if isinstance(record_watermark_ms, SameAsInput) else record_watermark_ms
        cls = type(comp)
        ttls = _TTLS.get(cls)
        if ttls is None:  # run_key builds one per key: look the class's TTLs up once
            ttls = _TTLS[cls] = cls.state_ttl_ms()
        self.ttl_event_ms, self.ttl_processing_ms = ttls
        self.ttl = self.ttl_event_ms is not None or self.ttl_processing_ms is not None

    def run(self, ctx: Context, records: Sequence[Record], seen: set[str] | None,
            combined: list[tuple[Any, ...]] | None = None) -> tuple[list[str], int, int, list[tuple[Record, str]], int]:
        """(ids run, duplicates, late, dead letters, timers fired) for one key; ``combined``: its rows of
        ``combine`` (vectorised path). The ids run include dead-lettered ones: never retried."""
        comp = self.comp
        dups = late = 0
        dead: list[tuple[Record, str]] = []
        fresh: list[str]
        ctx.input_watermark_ms = self.record_wm  # records: the watermark before the batch's input
        if ctx.needs_upgrade():
            err = self._upgrade(ctx)
            if err is not None:  # dead-letter policy: the key's records go, its row stays as it was
                todo, dups = _unseen(records, seen)
                return list(map(_RECORD_ID, todo)), dups, sum(map(_LATE, todo)), [(r, err) for r in todo], 0
        if combined is not None or self.per_key_combine:
            fresh, dups, late, dead = self._run_combined(ctx, records, seen, combined)
        elif self.batch:
            fresh, dups, late, dead = self._run_batch(ctx, records, seen)
        elif seen is None and not self.dead_letter:
            # no dedup, and any user error fails the batch: the loop does only what user code needs
            process = comp.process_record
            r: Record | None = None
            try:
                for r in records:
                    ctx.cause = r  # names what is processed: production ids derive from it
                    process(ctx, r)
            except Exception as exc:
                assert r is not None
                raise UserCodeError(comp.name, ctx.key, f"record {r.record_id!r} (event time {r.timestamp_ms})",
                                    exc) from exc
            fresh = list(map(_RECORD_ID, records))
            late = sum(map(_LATE, records))
        else:
            fresh, dups, late, dead = self._run_each(ctx, records, seen)
        seq = ctx.timer_seq
        if seq is None:  # a new key (no row): its firings are numbered from its first record
            seq = ctx.timer_seq = first_timer_seq(fresh[0] if fresh else ctx.key)
        ttl = self.ttl
        if ttl and fresh:  # touched: its TTL counts from its latest record (or the watermark, if later)
            last = records[-1].timestamp_ms
            wm0 = self.known_wm
            ctx.touch(last if wm0 is None or last > wm0 else wm0, self.ttl_event_ms, self.now_ms,
                      self.ttl_processing_ms)
        if not (self.fire_timers and ctx.has_timers):
            if ttl and ctx.holds_nothing():
                ctx.drop_ttl_timers()
            return fresh, dups, late, dead, 0
        fired = 0
        wm, now = self.wm, self.now_ms
        ctx.input_watermark_ms = self.known_wm  # timers: the watermark they fire under
        for _ in range(MAX_TIMER_ROUNDS):
            t = ctx.pop_due_timer(wm, now)
            if t is None:
                break
            if t.tag == TTL_TAG:  # not touched for the TTL: the key goes (its earlier timers fired first)
                ctx.expire()
                return fresh, dups, late, dead, fired
            # numbered by the key's firing counter, as a replayed batch numbers them too
            ctx.cause = TimerCause(
                f"{self._timer_id}{ctx.key}:{DOMAIN_VALUES[t.domain]}:{t.tag}:{t.time_ms}:{seq}", t.time_ms)
            seq += 1
            ctx.timer_seq = seq
            try:
                comp.process_timer(ctx, t)
            except Exception as exc:
                raise UserCodeError(comp.name, ctx.key, f"timer {t.tag!r} at {t.time_ms} ({t.domain.value})",
                                    exc) from exc
            fired += 1
            if ttl:  # a timer of the key fired: touched
                ctx.touch(self.known_wm, self.ttl_event_ms, now, self.ttl_processing_ms)
            if not ctx.has_timers:  # the usual end: nothing left that could be due
                break
        if ttl and ctx.holds_nothing():
            ctx.drop_ttl_timers()
        return fresh, dups, late, dead, fired

    def _upgrade(self, ctx: Context) -> str | None:
        """Upgrade the key's older state; None when done, the error if dead-lettered (else UserCodeError)."""
        comp = self.comp
        row_codec = ctx.row_codec or ""
        try:
            version = codec_version(row_codec)
            if version == comp.state_version:  # another codec, same version: decoded as before
                return None
            if version > comp.state_version:
                raise StateUpgradeError(
                    f"the state of key {ctx.key!r} is of state_version {version}, newer than this code's "
                    f"{comp.state_version}: run the code that wrote it (a downgrade is not done)")
            old = get_codec(row_codec, allow_pickle=comp.allow_pickle).decode(ctx.stored_state or b"")
            try:
                new = comp.upgrade_state(old, version)
                codec_of(comp).encode(new)
            except Exception as exc:
                raise StateUpgradeError(
                    f"upgrade_state of {comp.name} from state_version {version} to {comp.state_version} failed "
                    f"for key {ctx.key!r}: {type(exc).__name__}: {exc}; fix upgrade_state (the key's row is "
                    f"unchanged)") from exc
        except Exception as exc:
            if self.dead_letter:
                return f"{type(exc).__name__}: {exc}"
            raise UserCodeError(comp.name, ctx.key, f"its stored state ({row_codec})", exc) from exc
        ctx.set_upgraded(new)
        return None

    def _run_each(self, ctx: Context, records: Sequence[Record], seen: set[str] | None) -> _RecordsRan:
        """``process_record`` per record, with dedup and / or the dead-letter policy."""
        comp = self.comp
        process = comp.process_record
        fresh: list[str] = []
        dead: list[tuple[Record, str]] = []
        late = 0
        todo, dups = _unseen(records, seen)
        for r in todo:
            rid = r.record_id
            fresh.append(rid)
            if r.late:
                late += 1
            ctx.cause = r
            try:
                process(ctx, r)
            except Exception as exc:
                if self.dead_letter:
                    ctx.drop_productions_of(r)  # drop what this record produced
                    dead.append((r, f"{type(exc).__name__}: {exc}"))
                    continue
                raise UserCodeError(comp.name, ctx.key, f"record {rid!r} (event time {r.timestamp_ms})",
                                    exc) from exc
        return fresh, dups, late, dead

    def _run_combined(self, ctx: Context, records: Sequence[Record], seen: set[str] | None,
                      rows: list[tuple[Any, ...]] | None) -> _RecordsRan:
        """The vectorised path: one ``process_combined`` call with the key's ``rows`` (None: combine here)."""
        comp = self.comp
        todo, dups = _unseen(records, seen)
        if not todo:
            return [], dups, 0, []
        per_record = self._run_batch if self.batch else self._run_each
        # (given ``rows``, the image path combined the records after the late ones it checked lead)
        n_late = 0 if rows is not None and not todo[0].late else late_prefix(list(map(_LATE, todo)))
        table = None
        if n_late >= 0 and rows is None and n_late < len(todo):
            table = records_table(todo[n_late:])
        if n_late < 0 or n_late == len(todo) or (rows is None and table is None):
            fresh, more, late, dead = per_record(ctx, todo, None)
            return fresh, dups + more, late, dead
        fresh, late, dead = [], 0, []
        if n_late:  # the late ones first, per record (``rows``: the combine of the others)
            fresh, _none, late, dead = per_record(ctx, todo[:n_late], None)
            todo = todo[n_late:]
        if rows is None:
            rows = combined_rows(comp, table, [ctx.key])[ctx.key]
        first, last = todo[0], todo[-1]
        fresh += map(_RECORD_ID, todo)
        ctx.cause = TimerCause(f"{comp.name}:{first.record_id}", last.timestamp_ms)
        try:
            comp.process_combined(ctx, rows)
        except Exception as exc:
            raise UserCodeError(comp.name, ctx.key, f"process_combined over {len(todo)} records {first.record_id!r}.."
                                f"{last.record_id!r} (event time {first.timestamp_ms}..{last.timestamp_ms})",
                                exc) from exc
        return fresh, dups, late, dead

    def _run_batch(self, ctx: Context, records: Sequence[Record], seen: set[str] | None) -> _RecordsRan:
        """``process_records``: one call with the key's new records (none: no call)."""
        comp = self.comp
        unseen, dups = _unseen(records, seen)
        if not unseen:
            return [], dups, 0, []
        todo = unseen if isinstance(unseen, list) else list(unseen)
        first, last = todo[0], todo[-1]
        # taken before the call: user code may change its list
        fresh = list(map(_RECORD_ID, todo))
        late = sum(map(_LATE, todo))
        given = tuple(todo) if self.dead_letter else ()
        produced = ctx.productions
        before = len(produced)
        # ids from the first record (prefixed with the computation, as a record's), time from the last
        ctx.cause = TimerCause(f"{comp.name}:{first.record_id}", last.timestamp_ms)
        try:
            comp.process_records(ctx, todo)
        except Exception as exc:
            what = (f"{len(todo)} records {first.record_id!r}..{last.record_id!r} "
                    f"(event time {first.timestamp_ms}..{last.timestamp_ms})")
            if not self.dead_letter:
                raise UserCodeError(comp.name, ctx.key, what, exc) from exc
            del produced[before:]  # drop what the call produced
            err = f"{type(exc).__name__}: {exc} (process_records over {what})"
            return fresh, dups, late, [(r, err) for r in given]
        return fresh, dups, late, []


_RECORD_ID = attrgetter("record_id")
_LATE = attrgetter("late")
_ORDER = attrgetter("timestamp_ms", "record_id")  # a key's records in event-time order
_CODECS: dict[tuple[str, bool], Codec] = {}
_TTLS: dict[type, tuple[int | None, int | None]] = {}  # computation class -> its state TTLs (ms)
_NEVER = -(2**63)  # no input low watermark yet: no event-time timer is due


def first_timer_seq(record_id: str) -> int:
    """A new row's first timer firing number: a 40-bit hash of its creating record's id << 23.

    A key back after its row was deleted starts a new range, so production ids do not repeat.

    >>> first_timer_seq("r1") == first_timer_seq("r1") != first_timer_seq("r2")
    True
    """
    digest = hashlib.blake2b(record_id.encode("utf-8", "surrogatepass"), digest_size=5).digest()
    return int.from_bytes(digest, "big") << 23


def first_timer_seqs(record_ids: Sequence[str]) -> Any:
    """:func:`first_timer_seq` of each of ``record_ids``, as a numpy int64 array.

    >>> first_timer_seqs(["r1", "r2"]).tolist() == [first_timer_seq("r1"), first_timer_seq("r2")]
    True
    """
    import numpy as np

    if not len(record_ids):
        return np.zeros(0, dtype=np.int64)
    b2 = hashlib.blake2b
    raw = b"".join([b2(r.encode("utf-8", "surrogatepass"), digest_size=5).digest() for r in record_ids])
    d = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 5).astype(np.int64)
    return ((d[:, 0] << 32) | (d[:, 1] << 24) | (d[:, 2] << 16) | (d[:, 3] << 8) | d[:, 4]) << 23


def _unseen(records: Sequence[Record], seen: set[str] | None) -> tuple[Sequence[Record], int]:
    """The records whose ids ``seen`` lacks (added as they pass; None: all), and how many were duplicates."""
    if seen is None:
        return records, 0
    todo: list[Record] = []
    dups = 0
    for r in records:
        rid = r.record_id
        if rid in seen:
            dups += 1
            continue
        seen.add(rid)
        todo.append(r)
    return todo, dups
