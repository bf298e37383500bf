"""The columnar path in the image task: one ``process_columns`` call over an interval's keys."""

from __future__ import annotations

from typing import Any

from deltawheel.statestore.codecs import INT64MAP_HEADER, int64map_blobs
from deltawheel.statestore.rowtable.rows import DOMAIN_VALUES, TimeDomain
from deltawheel.statestore.writepath.image.files import columns_table, production_table

from ...computation import ColumnBatch, ColumnResult, Computation, ErrorPolicy
from ...exceptions import UserCodeError
from .coltables import (
    LateFirst,
    check_result,
    old_columns,
    packed_pairs,
    per_key,
    same_rows,
    sorted_timers,
    with_late_first,
)
from .columns import Input, OldRows, py_list
from .keyrun import UserCode, codec_of, first_timer_seqs, state_codec_of
from .keys import KeyLoop, context_factory

__all__ = ["takes_columnar", "ColumnarLoop", "key_loop"]

_EVENT = DOMAIN_VALUES[TimeDomain.EVENT_TIME]


def takes_columnar(comp: Computation, inp: Input) -> bool:
    """Does this interval batch of ``comp`` take the columnar path (declared, and exact here)?"""
    return (comp.columnar() and comp.codec == "int64map" and comp.error_policy is not ErrorPolicy.DEAD_LETTER
            and type(comp).state_ttl_ms() == (None, None) and comp.state_version == 1
            and inp.no_values and not (comp.exactly_once and inp.repeats))


def key_loop(comp: Computation, inp: Input, sub: Any, *, wm: int | None, wm_late: int | None, now_ms: int,
             strong: bool) -> "KeyLoop | ColumnarLoop":
    """The loop for an interval's keys: columnar where :func:`takes_columnar`, else the key loop.
    ``sub``: the touched keys' rows; ``wm``: the timers' watermark, ``wm_late``: the records'."""
    if takes_columnar(comp, inp):
        return ColumnarLoop(comp, sub, wm=wm, wm_late=wm_late, now_ms=now_ms, strong=strong)
    return KeyLoop(comp, wm=wm, wm_late=wm_late, now_ms=now_ms, strong=strong)


class _Rows:
    """``KeyLoop.rows`` of the columnar loop: the key loop's new rows and the columnar ones."""

    def __init__(self, loop: KeyLoop) -> None:
        self.loop = loop
        self.columnar: Any = None  # the columnar keys' new rows (Arrow, without the constant columns)

    def table(self, schema: Any, *, sequencer: int, commit_id: str, now_ms: int, format_version: int) -> Any:
        import pyarrow as pa

        per_key = self.loop.rows.table(schema, sequencer=sequencer, commit_id=commit_id, now_ms=now_ms,
                                       format_version=format_version)
        if self.columnar is None or not self.columnar.num_rows:
            return per_key
        t = self.columnar
        n = t.num_rows
        const = {"sequencer": sequencer, "commit_id": commit_id, "updated_ms": now_ms, "format_version": format_version}
        arrays = [pa.repeat(pa.scalar(const[f.name], f.type), n) if f.name in const else
                  t.column(f.name).cast(f.type) for f in schema]
        return pa.concat_tables([per_key, pa.Table.from_arrays(arrays, schema=schema)])


class ColumnarLoop:
    """Runs an interval's touched keys: ``process_columns`` where it can, else the key loop."""

    def __init__(self, comp: Computation, sub: Any, *, wm: int | None, wm_late: int | None, now_ms: int,
                 strong: bool) -> None:
        self.comp = comp
        self.sub = sub
        self.wm = wm
        self.wm_late = wm_late
        self.now_ms = now_ms
        self.strong = strong
        self.per_key = KeyLoop(comp, wm=wm, wm_late=wm_late, now_ms=now_ms, strong=strong)
        self.rows = _Rows(self.per_key)
        self._pre: dict[str, LateFirst] = {}
        self._ptable: Any = None  # the columnar keys' productions (``production_table``), in key order
        self._n_prods: Any = None  # per columnar key, how many
        self.unchanged: list[str] = []
        self.prod_table: Any = None  # all productions, the key loop's first (``production_table``): no tuple per production
        self.side: list[Any] = []
        self.all_ran = True
        self.id_keys: list[str] = []
        self.id_values: list[str] = []
        self.processed = self.duplicates = self.fired = self.written = self.late = self.keys_expired = 0

    def run(self, touched: list[str], inp: Input, old: OldRows, seen: list[bool] | None) -> None:
        """Run ``touched``; the outputs are the key loop's attributes (productions as :attr:`prod_table`)."""
        import pyarrow as pa

        self._run(touched, inp, old, seen)
        k = self.per_key
        self.unchanged = k.unchanged + self.unchanged
        mine = self._ptable
        self.prod_table = (production_table(k.prods) if mine is None else
                           mine if not k.prods else pa.concat_tables([production_table(k.prods), mine]))
        self.side = k.side
        self.all_ran = k.all_ran and self.all_ran
        self.id_keys = k.id_keys + self.id_keys
        self.id_values = k.id_values + self.id_values
        for count in ("processed", "duplicates", "fired", "written", "late"):
            setattr(self, count, getattr(self, count) + getattr(k, count))
        self.keys_expired = k.keys_expired

    def _run(self, touched: list[str], inp: Input, old: OldRows, seen: list[bool] | None) -> None:
        """Run ``touched``: the keys the columnar call cannot take through the key loop first."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        sub = self.sub
        # keys whose row is not in the shape the columnar call reads, or with a late record
        odd = pc.fill_null(pc.not_equal(sub.column("codec"), "int64map"), True)
        odd = pc.or_(odd, pc.is_valid(sub.column("watermark_hold_ms")))
        odd = pc.or_(odd, pc.is_valid(sub.column("next_processing_timer_ms")))
        slow = set(py_list(sub.column("key").filter(odd)))
        t = inp.table
        late = None
        if t.num_rows:
            late = pc.fill_null(t.column("late"), False)
            if pc.any(late).as_py():
                # a key's late records (leading its new ones) run per record first, before the call
                slow |= self._late_first(sorted(set(py_list(pc.unique(t.column("key").filter(late)))) - slow),
                                         inp, seen)
            else:
                late = None
        packed = packed_pairs(sub, slow)  # the other keys' state as pairs (decoded once)
        if packed is None:  # some state that is not packed pairs: the whole interval per key
            slow = set(touched)
            self._pre, self.late = {}, 0
        if slow:
            self.per_key.run([k for k in touched if k in slow], inp, old, seen)
        keys = [k for k in touched if k not in slow]
        if not keys:
            return
        karr = pa.array(keys, pa.string())
        take = pc.is_in(t.column("key"), value_set=karr) if slow else None
        if late is not None:  # those ran per record (``_late_first``)
            take = pc.invert(late) if take is None else pc.and_(take, pc.invert(late))
        if seen is not None:
            fresh_mask = pa.array(~np.asarray(seen, dtype=bool))
            take = fresh_mask if take is None else pc.and_(take, fresh_mask)
            self.duplicates = int(np.asarray(seen, dtype=bool)[
                np.asarray(pc.is_in(t.column("key"), value_set=karr).to_numpy(zero_copy_only=False), dtype=bool)].sum())
        recs = t if take is None else t.filter(take)
        records = pa.table({"key": recs.column("key"), "timestamp_ms": recs.column("timestamp_ms"),
                            "record_id": recs.column("record_id"),
                            "stream": pc.fill_null(recs.column("stream"), "")})
        pre = self._pre
        self.processed = records.num_rows + sum(len(p.fresh) for p in pre.values())
        self.all_ran = seen is None
        if not (self.per_key.all_ran and self.all_ran):
            self.id_keys = py_list(records.column("key"))
            self.id_values = py_list(records.column("record_id"))
            for key, p in pre.items():
                self.id_keys += [key] * len(p.fresh)
                self.id_values += p.fresh
        mine = sub.filter(pc.is_in(sub.column("key"), value_set=karr)) if slow else sub
        state, timers = old_columns(mine, packed)
        if pre:  # the state and timers the late records left
            state, timers = with_late_first(state, timers, pre)
        batch = ColumnBatch(keys=karr, records=records, state=state, timers=timers, watermark_ms=self.wm)
        what = f"process_columns over {records.num_rows} records of {len(keys)} keys"
        try:
            out = self.comp.process_columns(batch)
        except Exception as exc:
            raise UserCodeError(self.comp.name, keys[0], what, exc) from exc
        check_result(self.comp, keys[0], what, out)
        self._finish(keys, karr, records, mine, out)

    def _late_first(self, keys: list[str], inp: Input, seen: list[bool] | None) -> set[str]:
        """Run ``keys``' late records per record first; returns the keys that must run per record instead."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        out: set[str] = set()
        if not keys:
            return out
        comp = self.comp
        # only these keys' rows and records become Python objects (not the interval's)
        old = OldRows(self.sub.filter(pc.is_in(self.sub.column("key"), value_set=pa.array(keys, pa.string()))),
                      with_pending=False)
        new_ctx = context_factory(comp, codec_of(comp), self.wm, self.now_ms)
        run_user = UserCode(comp, input_watermark_ms=self.wm, now_ms=self.now_ms, fire_timers=False,
                            combine_per_key=False, record_watermark_ms=self.wm_late).run
        # the late flags and the seen marks as arrays: only a key's late records become Python records
        late = pc.fill_null(inp.table.column("late"), False).to_numpy(zero_copy_only=False).astype(bool)
        unseen = None if seen is None else ~np.asarray(seen, dtype=bool)
        for key in keys:
            lo, hi = inp.runs[key]
            at = np.arange(lo, hi) if unseen is None else lo + np.flatnonzero(unseen[lo:hi])
            flags = late[at]
            n = len(flags) if flags.all() else int(np.argmin(flags))  # the late ones leading the run
            if flags[n:].any():  # a late record after an on-time one: the key runs per record
                out.add(key)
                continue
            recs = inp.run_records(lo, lo + n) if unseen is None else inp.records_at(at[:n])
            j = old.index.get(key)
            ctx = (new_ctx(key, None, {}, None, None, None) if j is None else
                   new_ctx(key, old.states[j], old.timers(j), old.holds[j], old.seqs[j], old.codecs[j]))
            fresh, _dups, n_late, _dead, _fired = run_user(ctx, recs, None)
            state, timers, hold, seq, _codec, prods = ctx.outcome()
            if (hold is not None or any(tm.domain is not TimeDomain.EVENT_TIME for tm in timers)
                    or (state is not None and state[:8] != INT64MAP_HEADER)):
                out.add(key)
                continue
            self._pre[key] = LateFirst(fresh=fresh, late=n_late, state=state, timers=timers, seq=seq or 0, prods=prods)
            self.late += n_late
        return out

    def _finish(self, keys: list[str], karr: Any, records: Any, mine: Any, out: ColumnResult) -> None:
        """The keys' new rows, productions and counts from the call's result."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(keys)
        comp = self.comp
        # per key (in ``keys`` order): its row in the image (-1: a new key), its new records
        old_at = np.full(n, -1, dtype=np.int64)
        if mine.num_rows:
            pos = pc.index_in(mine.column("key"), value_set=karr).to_numpy(zero_copy_only=False)
            old_at[pos] = np.arange(mine.num_rows)
        n_recs = per_key(records.column("key"), karr, n)
        # the new state, as blobs (sorted by the keys' places: ``keys`` is sorted, so that is key order)
        st_rows = pc.index_in(out.state.column("key"), value_set=karr).to_numpy(zero_copy_only=False)
        mk, mv = out.state.column("map_key").to_numpy(), out.state.column("map_value").to_numpy()
        by = np.lexsort((mk, st_rows))
        blobs = int64map_blobs(st_rows[by], mk[by], mv[by], n)
        tm, tm_rows = sorted_timers(out.timers, karr)
        n_timers = np.bincount(tm_rows, minlength=n) if len(tm_rows) else np.zeros(n, np.int64)
        offsets = np.concatenate([[0], np.cumsum(n_timers)]).astype(np.int32)
        first_ev = np.zeros(n, dtype=np.int64)
        has_timer = n_timers > 0
        first_ev[has_timer] = tm.column("time_ms").to_numpy()[offsets[:-1][has_timer]]
        # timer firing numbers: an old row's counter; a new key's seeded from its first record's id or name
        seqs = np.zeros(n, dtype=np.int64)
        if mine.num_rows:
            old_seq = pc.fill_null(mine.column("timer_seq"), 0).to_numpy()
            seqs[old_at >= 0] = old_seq[old_at[old_at >= 0]]
        new_keys = np.flatnonzero(old_at < 0)
        if len(new_keys):
            first_rec = np.concatenate([[0], np.cumsum(n_recs)])[:-1]
            with_rec = new_keys[n_recs[new_keys] > 0]
            firsts = py_list(records.column("record_id").take(pa.array(first_rec[with_rec], pa.int64())))
            seqs[with_rec] = first_timer_seqs(firsts)
            without = new_keys[n_recs[new_keys] == 0]
            if len(without):
                seqs[without] = first_timer_seqs([keys[i] for i in without.tolist()])
        pre = self._pre
        pre_fresh = np.zeros(n, dtype=np.int64)
        if pre:
            at = dict(zip(keys, range(n), strict=True))
            for key, p in pre.items():
                i = at[key]
                seqs[i] = p.seq  # a new key's counter is seeded from its first record, a late one
                pre_fresh[i] = len(p.fresh)
        n_recs = n_recs + pre_fresh
        fired = out.fired
        f_rows = pc.index_in(fired.column("key"), value_set=karr).to_numpy(zero_copy_only=False)
        n_fired = np.bincount(f_rows, minlength=n) if len(f_rows) else np.zeros(n, np.int64)
        n_prods = self._n_prods = self._productions(keys, fired, f_rows, seqs, out.productions, n)
        new_seqs = seqs + n_fired
        # which keys get a row: the key loop's rule (``keys.py``), per column
        has_state = pc.is_valid(blobs).to_numpy(zero_copy_only=False)
        pend = n_prods > 0 if self.strong else np.zeros(n, dtype=bool)
        empty = ~has_state & ~has_timer & ~pend
        is_new = old_at < 0
        had_pending = np.zeros(n, dtype=bool)
        if mine.num_rows:
            lens = pc.fill_null(pc.list_value_length(mine.column("pending")), 0).to_numpy(zero_copy_only=False)
            had_pending[old_at >= 0] = lens[old_at[old_at >= 0]] > 0
        changed = (n_recs > 0) | (n_fired > 0) | (n_prods > 0) | is_new | had_pending
        maybe_same = ~changed & ~empty
        if maybe_same.any():  # keys that ran nothing: the same state and timers as before?
            changed |= maybe_same & ~same_rows(mine, old_at, blobs, tm, offsets, maybe_same)
        write = ~empty & changed
        self.fired = int(n_fired.sum())
        self.written = int((write | (empty & ~is_new)).sum())
        self.unchanged = [keys[i] for i in np.flatnonzero(~empty & ~changed).tolist()]
        rows = np.flatnonzero(write)
        if not len(rows):
            return
        idx = pa.array(rows)
        state_col = blobs.take(idx)
        counts = n_timers[rows]
        sel_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        # each written row's timers: its first timer's place + 0, 1, ... (one arange, not one per row)
        flat_take = (np.repeat(offsets[:-1][rows].astype(np.int64) - sel_off[:-1], counts)
                     + np.arange(int(sel_off[-1]), dtype=np.int64))
        flat_t = tm.take(pa.array(flat_take, pa.int64()))
        timers_arr = pa.ListArray.from_arrays(
            pa.array(sel_off, pa.int32()),
            pa.StructArray.from_arrays([flat_t.column("tag").combine_chunks(),
                                        pa.repeat(pa.scalar(_EVENT, pa.string()), flat_t.num_rows),
                                        flat_t.column("time_ms").combine_chunks().cast(pa.int64())],
                                       names=["tag", "domain", "time_ms"]))
        next_ev = pa.array(first_ev[rows], pa.int64(), mask=~has_timer[rows])
        pending = self._pending(rows)
        self.rows.columnar = pa.table({
            "key": karr.take(idx), "state": state_col,
            "codec": pa.repeat(pa.scalar(state_codec_of(comp), pa.string()), len(rows)),
            "timers": timers_arr, "next_event_timer_ms": next_ev,
            "next_processing_timer_ms": pa.nulls(len(rows), pa.int64()),
            "watermark_hold_ms": pa.nulls(len(rows), pa.int64()), "pending": pending,
            "timer_seq": pa.array(new_seqs[rows], pa.int64())})

    def _productions(self, keys: list[str], fired: Any, f_rows: Any, seqs: Any, prods: Any, n: int) -> Any:
        """The productions as one table in key order; returns how many per key."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        counts = np.zeros(n, dtype=np.int64)
        parts, places = [], []
        if self._pre:  # the late records' productions come first (records run before timers fire)
            place_of = dict(zip(keys, range(n), strict=True))
            pre = [(place_of[key], p) for key, pk in self._pre.items() for p in pk.prods]
            if pre:
                parts.append(production_table([p for _k, p in pre]))
                places.append(np.fromiter((k for k, _p in pre), dtype=np.int64, count=len(pre)))
        if prods.num_rows:
            codec = codec_of(self.comp)
            # each firing's number: its key's counter + its place among the key's firings
            order = np.argsort(f_rows, kind="stable")
            place = np.empty(len(f_rows), dtype=np.int64)
            sorted_rows = f_rows[order]
            place[order] = np.arange(len(f_rows)) - np.searchsorted(sorted_rows, sorted_rows, side="left")
            f_seq = seqs[f_rows] + place
            m = prods.num_rows
            which = pc.fill_null(prods.column("fired"), -1).to_numpy().astype(np.int64)
            if (which < 0).any() or (which >= len(f_rows)).any():
                raise UserCodeError(self.comp.name, keys[0], "process_columns", ValueError(
                    f"ColumnResult.productions.fired must name rows of ColumnResult.fired (0..{len(f_rows) - 1})"))
            bad = pc.invert(pc.is_in(prods.column("stream"), value_set=pa.array(list(self.comp.outputs), pa.string())))
            if pc.any(bad).as_py():
                stream = prods.column("stream").filter(bad)[0].as_py()
                raise UserCodeError(self.comp.name, keys[0], "process_columns", ValueError(
                    f"a production to {stream!r}, which is not among the outputs {list(self.comp.outputs)}; "
                    "add it to `outputs`"))
            pk = f_rows[which]
            # in firing order per key (``fired``'s order), each firing's in the table's order
            at = np.lexsort((np.arange(m), which, pk))
            w, k_of = which[at], pk[at]
            new_firing = np.concatenate([[True], w[1:] != w[:-1]]) if m else np.zeros(0, bool)
            nth = np.arange(m) - np.maximum.accumulate(np.where(new_firing, np.arange(m), 0)) + 1
            idx = pa.array(w)
            key_col = pa.array(keys, pa.string()).take(pa.array(k_of))
            times = fired.column("time_ms").combine_chunks().take(idx)
            pid = pc.binary_join_element_wise(
                pc.binary_join_element_wise(f"timer:{self.comp.name}", key_col, _EVENT,
                                            fired.column("tag").combine_chunks().take(idx),
                                            pc.cast(times, pa.string()), pa.array(f_seq[w]).cast(pa.string()), ":"),
                pa.array(nth).cast(pa.string()), "#")
            vcol = prods.column("value").combine_chunks().take(pa.array(at))
            values = vcol if pa.types.is_binary(vcol.type) else pa.array(
                [codec.encode(v) for v in vcol.to_pylist()], pa.binary())
            ts = (pc.fill_null(prods.column("timestamp_ms").combine_chunks().take(pa.array(at)).cast(pa.int64()),
                               times) if "timestamp_ms" in prods.column_names else times)
            streams = prods.column("stream").combine_chunks().take(pa.array(at))
            parts.append(columns_table(pid, streams, key_col, values, ts,
                                       pa.repeat(pa.scalar(codec.name, pa.string()), m)))
            places.append(k_of)
        if not parts:
            return counts
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        k_all = np.concatenate(places) if len(places) > 1 else places[0]
        if len(parts) > 1:  # the late records' and the firings' productions, each key's together (stable)
            table = table.take(pa.array(np.argsort(k_all, kind="stable")))
        self._ptable = table
        np.add.at(counts, k_all, 1)
        return counts

    def _pending(self, rows: Any) -> Any:
        """The written rows' ``pending`` column: a key's productions when strong."""
        import numpy as np
        import pyarrow as pa

        ptype = self.sub.schema.field("pending").type
        if self.strong and self._ptable is not None:
            t = self._ptable
            struct = pa.StructArray.from_arrays([t.column(f.name).combine_chunks().cast(f.type)
                                                 for f in ptype.value_type], fields=list(ptype.value_type))
            ends = np.concatenate([[0], np.cumsum(self._n_prods[rows])]).astype(np.int32)
            return pa.ListArray.from_arrays(pa.array(ends), struct, type=ptype)
        struct = pa.StructArray.from_arrays([pa.array([], f.type) for f in ptype.value_type],
                                            fields=list(ptype.value_type))
        return pa.ListArray.from_arrays(pa.array(np.zeros(len(rows) + 1, dtype=np.int32)), struct, type=ptype)
