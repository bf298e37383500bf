"""The image path's key loop: one interval's touched keys, column-wise, through ``keyrun.UserCode``."""

from __future__ import annotations

import json
from typing import Any, Callable

from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import CodecError
from deltawheel.statestore.rowtable.rows import TimeDomain, Timer
from deltawheel.statestore.writepath.image.summary import SideRecord

from ...computation import Computation, Record, new_record
from ...context import Context
from .columns import Input, NewRows, OldRows
from .keyrun import AS_INPUT, SameAsInput, UserCode, codec_of, state_codec_of
from .vector import KeyRecords, interval_combined, takes_vectorised

__all__ = ["KeyLoop", "context_factory", "records_of"]


class KeyLoop:
    """Runs one interval's touched keys (in key order) and collects the outcome."""

    def __init__(self, comp: Computation, *, wm: int | None, now_ms: int, strong: bool,
                 wm_late: int | None | SameAsInput = AS_INPUT) -> None:
        self.comp = comp
        self.codec = codec_of(comp)
        self.wm = wm
        self.wm_late = wm_late  # the records' watermark (``keyrun.UserCode``)
        self.now_ms = now_ms
        self.strong = strong
        self.rows = NewRows()
        self.unchanged: list[str] = []  # keys kept as they are in the image (record ids untrimmed)
        self.prods: list[Any] = []
        self.side: list[SideRecord] = []  # dead letters (decoding, or user code by its error policy)
        self.id_keys: list[str] = []  # the ids run, when not simply all input records (``all_ran``)
        self.id_values: list[str] = []
        self.all_ran = True  # every input record was run (none seen before, repeated or undecodable)
        self.processed = self.duplicates = self.late = self.fired = self.written = self.keys_expired = 0

    def run(self, touched: list[str], inp: Input, old: OldRows, seen: list[bool] | None) -> None:
        """Run user code for each key of ``touched``; collect its new row, productions and dead letters."""
        comp = self.comp
        wm, now = self.wm, self.now_ms
        exactly_once = comp.exactly_once
        repeats = exactly_once and inp.repeats
        if seen is not None or repeats:
            self.all_ran = False
        add = self.rows.rows.append
        unchanged = self.unchanged.append
        all_prods = self.prods
        index, states, holds, old_pending, seqs = old.index.get, old.states, old.holds, old.pending, old.seqs
        codecs = old.codecs
        old_timers, old_slice = old.timers, old.timer_slice
        runs = inp.runs.get
        # the key's records are a slice of the batch's when there is nothing to decode or skip
        every = inp.records() if inp.no_values and seen is None else None
        strong = self.strong
        new_ctx = context_factory(comp, self.codec, wm, now)
        run_user = UserCode(comp, input_watermark_ms=wm, now_ms=now, combine_per_key=False,
                            record_watermark_ms=self.wm_late).run
        # the vectorised path: one combine over the interval's eligible keys (``vector.py``)
        combined: dict[str, list[tuple[Any, ...]]] | None = None
        read: dict[str, KeyRecords] | None = None
        if takes_vectorised(comp, repeats=inp.repeats):
            combined, read = interval_combined(comp, inp, touched, seen, every, records_of)
        processed = duplicates = late = fired = written = expired = 0
        for key in touched:
            j = index(key)
            ctx = (new_ctx(key, None, {}, None, None, None) if j is None else
                   new_ctx(key, states[j], old_timers(j), holds[j], seqs[j], codecs[j]))
            lo, hi = runs(key, _NO_RUN)
            if every is not None:
                records, n_seen = every[lo:hi], 0
            else:
                records, dead, n_seen = read[key] if read is not None and key in read else records_of(
                    inp, key, lo, hi, seen)
                if dead:
                    self.all_ran = False
                    self.side.extend(dead)
            fresh, n_dups, n_late, dead_letters, n_fired = run_user(
                ctx, records, set() if repeats else None, None if combined is None else combined.get(key))
            if dead_letters:
                pos = {inp.ids[i]: i for i in range(lo, hi)}
                self.side.extend(SideRecord.of_input("dead", inp.row(pos[rec.record_id]), key, err)
                                 for rec, err in dead_letters)
            processed += len(fresh)
            duplicates += n_seen + n_dups
            late += n_late
            fired += n_fired
            state, timers, new_hold, seq, codec, prods = ctx.outcome()
            if prods:
                all_prods.extend(prods)
            if exactly_once and fresh and not self.all_ran:
                self.id_keys += [key] * len(fresh)
                self.id_values += fresh
            seq = seq or 0  # set by the run (a new key: seeded)
            pending = prods if strong else ()
            if ctx.expired:  # the state TTL dropped it: no row (so no record ids either)
                expired += 1
                if pending:
                    add((key, None, (), None, pending, seq, codec))
                    written += 1
                elif j is not None:
                    written += 1
                continue
            if state is None and not timers and not pending and new_hold is None:
                if j is not None:  # nothing left: no row
                    written += 1
                continue
            if (fresh or n_fired or prods or j is None or key in old_pending or new_hold != holds[j]
                    or state != states[j] or timers != old_slice(j) or codec != codecs[j]):
                add((key, state, timers, new_hold, pending, seq, codec))
                written += 1
            else:
                unchanged(key)
        self.processed += processed
        self.duplicates += duplicates
        self.late += late
        self.fired += fired
        self.written += written
        self.keys_expired += expired


def context_factory(comp: Computation, codec: Any, wm: int | None, now: int
                    ) -> Callable[[str, bytes | None, dict[tuple[str, TimeDomain], Timer], int | None, int | None,
                                   str | None], Context]:
    """``Context(...)`` for each key of one batch, copying the batch-wide attributes from a template."""
    base = dict(Context(computation=comp.name, key="", state_bytes=None, codec=codec, timers=(),
                        outputs=comp.outputs, input_watermark_ms=wm, now_ms=now, watermark_hold_ms=None,
                        state_codec=state_codec_of(comp)).__dict__)
    new = object.__new__

    def make(key: str, state_b: bytes | None, timers: dict[tuple[str, TimeDomain], Timer],
             hold: int | None, timer_seq: int | None, row_codec: str | None) -> Context:
        ctx = new(Context)
        ctx.__dict__ = {**base, "timer_seq": timer_seq, "_row_codec": row_codec, "key": key, "_state_bytes": state_b,
                        "_timers": timers, "_productions": [], "_hold": hold}
        return ctx

    return make


_NO_RUN = (0, 0)
_JSON_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _decode(codec: str | None, data: bytes | None) -> Any:
    """The record's value: compact JSON by the C scanner, anything else by the codec."""
    if data is None:  # an injector without value columns
        return None
    if codec == "json" or codec is None:
        try:
            text = data.decode("utf-8")
            value, end = _JSON_SCAN(text, 0)
            if end == len(text):
                return value
        except (StopIteration, UnicodeDecodeError, ValueError, AttributeError):
            pass
        return get_codec("json").decode(data)
    return get_codec(codec).decode(data)


def records_of(inp: Input, key: str, lo: int, hi: int,
               seen: list[bool] | None) -> tuple[list[Record], list[SideRecord], int]:
    """The key's records not already seen (in order), its undecodable ones, and how many were seen."""
    out: list[Record] = []
    dead: list[SideRecord] = []
    n_seen = 0
    ids, values, codecs, ts, streams, late = inp.ids, inp.values, inp.codecs, inp.ts, inp.streams, inp.late
    if inp.no_values:
        every = inp.records()[lo:hi]
        if seen is None:
            return every, [], 0
        return [r for r, s in zip(every, seen[lo:hi], strict=True) if not s], [], sum(seen[lo:hi])
    for i in range(lo, hi):
        if seen is not None and seen[i]:
            n_seen += 1
            continue
        try:
            value = _decode(codecs[i], values[i])
        except CodecError as exc:
            dead.append(SideRecord.of_input("dead", inp.row(i), key, f"CodecError: {exc}"))
            continue
        out.append(new_record((key, value, ts[i], ids[i], streams[i], late[i])))
    return out, dead, n_seen
