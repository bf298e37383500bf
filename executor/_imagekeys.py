"""The image path's key loop: one interval's touched keys, column-wise.

``_imagetask`` hands over the interval's input records (Arrow, one run per key)
and the touched keys' current rows (Arrow); this module runs user code per key
through :func:`keyrun.run_user_code` — the one implementation of what user
code sees (dedup, record order, error policy, timer firing) — and writes the
new row images straight into column lists. Nothing per key is built that the
Parquet file does not need: no ``KeyRow``, no ``KeyOutcome``, no record-id
tuples (ids stay in Arrow: ``_imagetask`` attaches them).

Step 4 of ``run_key`` as the image path does it, per key:

* a key whose run leaves nothing (no state, timers, pending productions,
  watermark hold) keeps a row only for its record ids: the ids it had within
  the dedup horizon and, with exactly-once, the ids it ran now;
* a key that changed (ran records, fired timers, produced, or had its
  previous checkpoint cleared) gets its new row;
* any other key keeps its row as it is in the image.
"""

from __future__ import annotations

import json
from operator import attrgetter
from typing import Any, Mapping

from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import CodecError
from deltawheel.statestore.rows import _DOMAINS, TimeDomain, Timer, make_timer

from .computation import Computation, Record, make_record
from .context import Context
from .keyrun import codec_of, run_user_code

__all__ = ["Input", "OldRows", "KeyLoop", "side_row", "py_list", "constant_or_list"]


def py_list(arr: Any) -> list[Any]:
    """An Arrow array of a primitive, string or binary type as a Python list: through numpy,
    an order of magnitude faster than ``to_pylist`` (which builds a scalar per value). Integer
    arrays with nulls keep exact values (numpy would make them floats)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_floating(t) or pa.types.is_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t)):
        return arr.to_pylist()  # type: ignore[no-any-return]
    if arr.null_count and not (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
                               or pa.types.is_large_binary(t)):
        vals = pc.fill_null(arr, pa.scalar(0 if not pa.types.is_boolean(t) else False, t))
        valid = pc.is_valid(arr).to_numpy(zero_copy_only=False).tolist()
        return [v if ok else None for v, ok in zip(vals.to_numpy(zero_copy_only=False).tolist(), valid, strict=True)]
    return arr.to_numpy(zero_copy_only=False).tolist()  # type: ignore[no-any-return]


def constant_or_list(col: Any, n: int) -> Any:
    import pyarrow.compute as pc

    uniq = pc.unique(col)
    if len(uniq) == 1:
        return [uniq[0].as_py()] * n
    return py_list(col)


class Input:
    """One interval's records of the batch as Python lists, sorted by (key, event time,
    record id): each key's records are one contiguous, already ordered run."""

    def __init__(self, recs: Any) -> None:
        import pyarrow.compute as pc

        recs = recs.sort_by([("key", "ascending"), ("timestamp_ms", "ascending"), ("record_id", "ascending")])
        self.table = recs
        n = recs.num_rows
        self.keys: list[str] = py_list(recs.column("key"))
        self.ids: list[str] = py_list(recs.column("record_id"))
        vcol = recs.column("value")
        self.no_values = vcol.null_count == n  # an injector without value columns: nothing to decode
        self.values: list[bytes | None] = [] if self.no_values else py_list(vcol)
        self.codecs: list[str | None] = constant_or_list(recs.column("codec"), n) if n else []
        self.ts: list[int] = py_list(recs.column("timestamp_ms"))
        self.streams: list[str | None] = constant_or_list(recs.column("stream"), n) if n else []
        self.late: list[bool | None] = py_list(recs.column("late"))
        self.runs: dict[str, tuple[int, int]] = {}
        # a record id twice within the batch (a source that repeats itself): only then does
        # each key's run need a set of the ids it ran
        self.repeats = bool(n) and pc.count_distinct(recs.column("record_id")).as_py() < n
        if n:
            ree = pc.run_end_encode(recs.column("key").combine_chunks())
            start = 0
            for key, end in zip(py_list(ree.values), py_list(ree.run_ends), strict=True):
                self.runs[key] = (start, end)
                start = end

    def row(self, i: int) -> dict[str, Any]:
        return {c: self.table.column(c)[i].as_py() for c in self.table.column_names}


class OldRows:
    """The touched keys' current rows, column-wise (record ids stay in Arrow; sequencer, commit
    id and update time are rewritten on output, so they are not read; pending productions are
    not read either: on this path they are always the previous batch's, delivered before this
    batch can commit, so they are only cleared)."""

    def __init__(self, sub: Any, *, with_pending: bool) -> None:
        import pyarrow.compute as pc

        keys = py_list(sub.column("key"))
        n = len(keys)
        self.index = {k: j for j, k in enumerate(keys)}
        self.states: list[bytes | None] = py_list(sub.column("state"))
        self.holds: list[int | None] = constant_or_list(sub.column("watermark_hold_ms"), n) if n else []
        timers = sub.column("timers").combine_chunks()
        flat = pc.list_flatten(timers)
        self._tags: list[str] = py_list(flat.field("tag"))
        self._doms: list[str] = py_list(flat.field("domain"))
        self._times: list[int] = py_list(flat.field("time_ms"))
        self._offs: list[int] = py_list(timers.offsets)
        self.pending: set[str] = set()
        if with_pending:
            has = pc.fill_null(pc.greater(pc.list_value_length(sub.column("pending")), 0), False)
            self.pending = set(py_list(sub.column("key").filter(has)))

    def timers(self, j: int) -> dict[tuple[str, TimeDomain], Timer]:
        """Row ``j``'s timers as a Context holds them (stored sorted: insertion order is sorted)."""
        tags, doms, times = self._tags, self._doms, self._times
        out = {}
        for x in range(self._offs[j], self._offs[j + 1]):
            d = _DOMAINS[doms[x]]
            out[(tags[x], d)] = make_timer(times[x], tags[x], d)
        return out


class NewRows:
    """New row images (without record ids) collected column by column."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.states: list[bytes | None] = []
        self.codecs: list[str] = []
        self.holds: list[int | None] = []
        self.next_ev: list[int | None] = []
        self.next_proc: list[int | None] = []
        self.t_offs = [0]
        self.t_tags: list[str] = []
        self.t_doms: list[str] = []
        self.t_times: list[int] = []
        self.p_offs = [0]
        self.prods: list[Any] = []

    def add(self, key: str, state: bytes | None, codec: str, timers: tuple[Timer, ...], hold: int | None,
            pending: list[Any] | tuple[Any, ...]) -> None:
        self.keys.append(key)
        self.states.append(state)
        self.codecs.append(codec)
        self.holds.append(hold)
        ev = proc = None
        for t in timers:  # sorted by time: the first of each domain is its earliest
            self.t_tags.append(t.tag)
            self.t_doms.append(t.domain.value)
            self.t_times.append(t.time_ms)
            if t.domain is _EVENT:
                if ev is None:
                    ev = t.time_ms
            elif proc is None:
                proc = t.time_ms
        self.next_ev.append(ev)
        self.next_proc.append(proc)
        self.t_offs.append(len(self.t_tags))
        self.prods.extend(pending)
        self.p_offs.append(len(self.prods))

    def table(self, schema: Any, *, sequencer: int, commit_id: str, now_ms: int, format_version: int) -> Any:
        """The Arrow table in ``schema`` (the rows file schema without ``record_ids``)."""
        import pyarrow as pa

        n = len(self.keys)
        tfield = schema.field("timers")
        timers = pa.ListArray.from_arrays(pa.array(self.t_offs, pa.int32()), pa.StructArray.from_arrays(
            [pa.array(self.t_tags, pa.string()), pa.array(self.t_doms, pa.string()),
             pa.array(self.t_times, pa.int64())], fields=list(tfield.type.value_type)), type=tfield.type)
        pfield = schema.field("pending")
        ptype = pfield.type.value_type  # the struct's fields are Production's attributes
        pending = pa.ListArray.from_arrays(pa.array(self.p_offs, pa.int32()), pa.StructArray.from_arrays(
            [pa.array(list(map(attrgetter(f.name), self.prods)), f.type) for f in ptype], fields=list(ptype)),
            type=pfield.type)
        cols = {"key": self.keys, "state": self.states, "codec": self.codecs, "next_event_timer_ms": self.next_ev,
                "next_processing_timer_ms": self.next_proc, "watermark_hold_ms": self.holds,
                "sequencer": [sequencer] * n, "commit_id": [commit_id] * n, "updated_ms": [now_ms] * n,
                "format_version": [format_version] * n}
        arrays = [timers if f.name == "timers" else pending if f.name == "pending" else
                  pa.array(cols[f.name], f.type) for f in schema]
        return pa.Table.from_arrays(arrays, schema=schema)


class KeyLoop:
    """Runs one interval's touched keys (in key order) and collects the outcome."""

    def __init__(self, comp: Computation, *, wm: int | None, now_ms: int, strong: bool) -> None:
        self.comp = comp
        self.codec = codec_of(comp)
        self.wm = wm
        self.now_ms = now_ms
        self.strong = strong
        self.rows = NewRows()
        self.unchanged: list[str] = []  # keys kept as they are in the image (record ids untrimmed)
        self.prods: list[Any] = []
        self.side: list[dict[str, Any]] = []  # dead letters (decoding, or user code by its error policy)
        self.id_keys: list[str] = []  # the ids run, when not simply all input records (``all_ran``)
        self.id_values: list[str] = []
        self.all_ran = True  # every input record was run (none seen before, repeated or undecodable)
        self.processed = self.duplicates = self.late = self.fired = self.written = 0

    def run(self, touched: list[str], inp: Input, old: OldRows, seen: list[bool] | None,
            old_id_keys: set[str]) -> None:
        comp = self.comp
        name, codec, outputs, wm, now = comp.name, self.codec, comp.outputs, self.wm, self.now_ms
        cname = codec.name
        exactly_once = comp.exactly_once
        repeats = exactly_once and inp.repeats
        keep_ids = exactly_once
        if seen is not None or repeats:
            self.all_ran = False
        rows = self.rows
        for key in touched:
            j = old.index.get(key)
            if j is None:
                state_b, tdict, hold = None, {}, None
            else:
                state_b, tdict, hold = old.states[j], old.timers(j), old.holds[j]
            ctx = Context(computation=name, key=key, state_bytes=state_b, codec=codec, timers=(), outputs=outputs,
                          input_watermark_ms=wm, now_ms=now, watermark_hold_ms=hold)
            old_timers = tuple(tdict.values())
            ctx._timers = tdict
            lo, hi = inp.runs.get(key, (0, 0))
            records, dead, n_seen = records_of(inp, key, lo, hi, seen)
            if dead:
                self.all_ran = False
            ran = run_user_code(comp, ctx, records, seen=set() if repeats else None, input_watermark_ms=wm,
                                now_ms=now)
            if ran.dead_letters:
                pos = {inp.ids[i]: i for i in range(lo, hi)}
                dead += [side_row("dead", inp.row(pos[rec.record_id]), key, err) for rec, err in ran.dead_letters]
            self.side.extend(dead)
            fresh = ran.fresh
            self.processed += len(fresh)
            self.duplicates += n_seen + ran.duplicates
            self.late += ran.late
            self.fired += ran.timers_fired
            prods = ctx._productions
            self.prods.extend(prods)
            if keep_ids and not self.all_ran and fresh:
                self.id_keys += [key] * len(fresh)
                self.id_values += fresh
            state = ctx._encoded_state()
            timers = ctx.timers
            new_hold = ctx._hold
            pending = prods if self.strong else ()
            if state is None and not timers and not pending and new_hold is None:
                # nothing left: the row stays only for its record ids (old ones still within the
                # horizon, the ones run now)
                if key in old_id_keys or (keep_ids and fresh):
                    rows.add(key, None, cname, (), None, ())
                    self.written += 1
                else:
                    self.written += int(j is not None)
                continue
            if (fresh or ran.timers_fired or prods or j is None or key in old.pending or state != state_b
                    or timers != old_timers or new_hold != hold):
                rows.add(key, state, cname, timers, new_hold, pending)
                self.written += 1
            else:
                self.unchanged.append(key)


_EVENT = TimeDomain.EVENT_TIME
_JSON_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _decode(codec: str | None, data: bytes | None) -> Any:
    """The record's value; compact JSON (what injectors write) is read by the C scanner
    directly, anything else by the codec (which raises CodecError for bad bytes)."""
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
               seen: list[bool] | None) -> tuple[list[Record], list[dict[str, Any]], int]:
    """The key's records not already seen (in order), its undecodable ones, and how many were seen."""
    out: list[Record] = []
    dead: list[dict[str, Any]] = []
    n_seen = 0
    ids, values, codecs, ts, streams, late = inp.ids, inp.values, inp.codecs, inp.ts, inp.streams, inp.late
    if inp.no_values:
        return ([make_record(key, None, ts[i], ids[i], streams[i] or "", bool(late[i]))
                 for i in range(lo, hi) if seen is None or not seen[i]],
                [], 0 if seen is None else sum(seen[lo:hi]))
    for i in range(lo, hi):
        if seen is not None and seen[i]:
            n_seen += 1
            continue
        try:
            value = _decode(codecs[i], values[i])  # type: ignore[arg-type]
        except CodecError as exc:
            dead.append(side_row("dead", inp.row(i), key, f"CodecError: {exc}"))
            continue
        out.append(make_record(key, value, ts[i], ids[i], streams[i] or "", bool(late[i])))
    return out, dead, n_seen


def side_row(kind: str, x: Mapping[str, Any], key: str | None, error: str | None) -> dict[str, Any]:
    return {"kind": kind, "record_id": x.get("record_id"), "key": key, "value": x.get("value"),
            "codec": x.get("codec"), "timestamp_ms": x.get("timestamp_ms"), "stream": x.get("stream"),
            "position": x.get("position"), "error": error}
