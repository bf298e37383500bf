"""The key loop's columns: an interval's records, the touched keys' rows and their new rows."""

from __future__ import annotations

from functools import cached_property
from itertools import accumulate, chain, repeat
from operator import is_
from typing import Any, cast

from deltawheel.statestore.rowtable.rows import (
    DOMAIN_VALUES,
    DOMAINS,
    Production,
    TimeDomain,
    Timer,
    new_timer,
)
from deltawheel.statestore.writepath.image.idhash import id_hashes

from ...computation import Record, new_record

__all__ = ["Input", "OldRows", "NewRows", "py_list", "constant_or_list", "sort_records", "value_ranks"]

_EVENT = TimeDomain.EVENT_TIME
_PROCESSING = TimeDomain.PROCESSING_TIME


def py_list(arr: Any) -> list[Any]:
    """An Arrow array of a primitive, string or binary type as a Python list, through numpy."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    text = (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
            or pa.types.is_large_binary(t))
    if not (text or pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_floating(t)):
        return cast("list[Any]", arr.to_pylist())  # pyarrow's methods are unannotated
    if arr.null_count and not text:
        vals = pc.fill_null(arr, pa.scalar(0 if not pa.types.is_boolean(t) else False, t))
        valid = pc.is_valid(arr).to_numpy(zero_copy_only=False).tolist()
        return [v if ok else None for v, ok in zip(vals.to_numpy(zero_copy_only=False).tolist(), valid, strict=True)]
    return cast("list[Any]", arr.to_numpy(zero_copy_only=False).tolist())


def constant_or_list(col: Any, n: int) -> list[Any]:
    """The column ``col`` (``n`` rows) as a Python list; a repeated value when it holds only one."""
    import pyarrow.compute as pc

    uniq = pc.unique(col)
    if len(uniq) == 1:
        return [uniq[0].as_py()] * n
    return py_list(col)


# the image task's own columns (``image/task.py``): not needed once an interval's records are picked
_TASK_COLUMNS = ("_bad", "_m", "interval")


def sort_records(recs: Any) -> Any:
    """``recs`` sorted by (key, event time, record id), without the task's own columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    recs = recs.drop_columns([c for c in _TASK_COLUMNS if c in recs.column_names])
    order = [("key", "ascending"), ("timestamp_ms", "ascending"), ("record_id", "ascending")]
    keys, ts = recs.column("key"), recs.column("timestamp_ms")
    if recs.num_rows < 2 or keys.null_count or ts.null_count:
        return recs.sort_by(order)
    t = ts.to_numpy()
    lo = int(t.min())
    ranks, distinct = value_ranks(keys)
    if int(t.max()) - lo >= 1 << 40 or distinct >= 1 << 22:
        return recs.sort_by(order)
    packed = (ranks << 40) | (t - lo)
    idx = pc.sort_indices(pa.table({"k": packed, "r": recs.column("record_id")}),
                          sort_keys=[("k", "ascending"), ("r", "ascending")])
    return recs.take(idx)


def value_ranks(col: Any) -> tuple[Any, int]:
    """(each value's place among ``col``'s distinct values in sorted order, as numpy int64; how many)."""
    import numpy as np
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(col).combine_chunks()
    by_name = pc.sort_indices(enc.dictionary).to_numpy()
    rank = np.empty(len(by_name), dtype=np.int64)
    rank[by_name] = np.arange(len(by_name), dtype=np.int64)
    return rank[enc.indices.to_numpy()], len(by_name)


class Input:
    """One interval's records as Python lists, sorted: each key's records are one contiguous run."""

    def __init__(self, recs: Any) -> None:
        import pyarrow.compute as pc

        recs = sort_records(recs)
        self.table = recs
        n = self.n = recs.num_rows
        self.no_values = recs.column("value").null_count == n  # an injector without value columns: nothing to decode
        # the ids' hashes (the Bloom filters', ``image/dedup.py``): a repeat is looked for among them first
        self.hashes: Any = id_hashes(recs.column("record_id")) if n else None
        self._records: list[Record] | None = None
        self.runs: dict[str, tuple[int, int]] = {}
        if n:
            ree = pc.run_end_encode(recs.column("key").combine_chunks())
            ends = py_list(ree.run_ends)
            self.runs = dict(zip(py_list(ree.values), zip([0, *ends[:-1]], ends, strict=True), strict=True))

    @cached_property
    def repeats(self) -> bool:
        """A record id twice within the batch (then each key's run needs a set of the ids it ran)."""
        import numpy as np
        import pyarrow.compute as pc

        if self.n < 2:
            return False
        h = np.sort(self.hashes)
        return bool((h[1:] == h[:-1]).any()) and pc.count_distinct(self.table.column("record_id")).as_py() < self.n

    # the columns as Python lists, when the key loop asks (the columnar path does not)
    @cached_property
    def keys(self) -> list[str]:
        """The records' keys."""
        return py_list(self.table.column("key"))

    @cached_property
    def ids(self) -> list[str]:
        """The records' ids."""
        return py_list(self.table.column("record_id"))

    @cached_property
    def values(self) -> list[bytes | None]:
        """The records' encoded values (empty: the input has no value columns)."""
        return [] if self.no_values else py_list(self.table.column("value"))

    @cached_property
    def codecs(self) -> list[str | None]:
        """The values' codecs."""
        return constant_or_list(self.table.column("codec"), self.n)

    @cached_property
    def ts(self) -> list[int]:
        """The records' event times."""
        return py_list(self.table.column("timestamp_ms"))

    @cached_property
    def streams(self) -> list[str]:
        """The records' streams."""
        import pyarrow.compute as pc

        return constant_or_list(pc.fill_null(self.table.column("stream"), ""), self.n)

    @cached_property
    def late(self) -> list[bool]:
        """The records' late flags."""
        import pyarrow.compute as pc

        return py_list(pc.fill_null(self.table.column("late"), False))

    def row(self, i: int) -> dict[str, Any]:
        """Record ``i`` (in sorted order) as a dict of every column of the batch table."""
        return {c: self.table.column(c)[i].as_py() for c in self.table.column_names}

    def run_records(self, lo: int, hi: int) -> list[Record]:
        """Records ``lo``..``hi`` (a key's run; no values to decode), built from that slice alone."""
        if self._records is not None:
            return self._records[lo:hi]
        return self._built(self.table.slice(lo, hi - lo))

    def records_at(self, at: Any) -> list[Record]:
        """The records at the places ``at`` (numpy ints; no values to decode)."""
        import pyarrow as pa

        if self._records is not None:
            return [self._records[i] for i in at.tolist()]
        return self._built(self.table.take(pa.array(at, pa.int64())))

    @staticmethod
    def _built(t: Any) -> list[Record]:
        import pyarrow.compute as pc

        return list(map(new_record, zip(py_list(t.column("key")), repeat(None), py_list(t.column("timestamp_ms")),
                                        py_list(t.column("record_id")), py_list(pc.fill_null(t.column("stream"), "")),
                                        py_list(pc.fill_null(t.column("late"), False)))))

    def records(self) -> list[Record]:
        """Every record (no values to decode), built at once in C; a key's are a slice."""
        if self._records is None:
            self._records = self._built(self.table)
        return self._records


class OldRows:
    """The touched keys' current rows, column-wise (pending productions are not read)."""

    def __init__(self, sub: Any, *, with_pending: bool) -> None:
        self.sub = sub  # each column becomes Python lists when first asked (the columnar path asks for few)
        self.n = sub.num_rows
        self.with_pending = with_pending

    @cached_property
    def index(self) -> dict[str, int]:
        """Key -> its row's place."""
        return {k: j for j, k in enumerate(py_list(self.sub.column("key")))}

    @cached_property
    def states(self) -> list[bytes | None]:
        """The rows' state blobs."""
        return py_list(self.sub.column("state"))

    @cached_property
    def codecs(self) -> list[str | None]:
        """The codec column: a state version older than the computation's is upgraded when run."""
        return constant_or_list(self.sub.column("codec"), self.n)

    @cached_property
    def holds(self) -> list[int | None]:
        """The rows' watermark holds."""
        return constant_or_list(self.sub.column("watermark_hold_ms"), self.n)

    @cached_property
    def seqs(self) -> list[int]:
        """The timer firing counters (null: a row written before the counter existed, migration 4, counts from 0)."""
        return [s or 0 for s in py_list(self.sub.column("timer_seq"))]

    @cached_property
    def pending(self) -> set[str]:
        """The keys whose rows hold pending productions (read only when the image has some)."""
        import pyarrow.compute as pc

        if not self.with_pending:
            return set()
        has = pc.fill_null(pc.greater(pc.list_value_length(self.sub.column("pending")), 0), False)
        return set(py_list(self.sub.column("key").filter(has)))

    @cached_property
    def _timer_lists(self) -> tuple[list[Timer], list[tuple[str, TimeDomain]], list[int]]:
        import pyarrow.compute as pc

        timers = self.sub.column("timers").combine_chunks()
        flat = pc.list_flatten(timers)
        tags: list[str] = py_list(flat.field("tag"))
        doms = list(map(DOMAINS.__getitem__, py_list(flat.field("domain"))))
        # every timer at once, in C; a row's are a slice (stored sorted: insertion order is sorted)
        return (list(map(new_timer, zip(py_list(flat.field("time_ms")), tags, doms, strict=True))),
                list(zip(tags, doms, strict=True)), py_list(timers.offsets))

    def timers(self, j: int) -> dict[tuple[str, TimeDomain], Timer]:
        """Row ``j``'s timers as a Context holds them."""
        all_timers, slots, offs = self._timer_lists
        a, b = offs[j], offs[j + 1]
        if b - a == 1:  # the usual row: one timer
            return {slots[a]: all_timers[a]}
        if a == b:
            return {}
        return dict(zip(slots[a:b], all_timers[a:b], strict=True))

    def timer_slice(self, j: int) -> tuple[Timer, ...]:
        """Row ``j``'s timers, sorted (as they were before user code ran)."""
        all_timers, _slots, offs = self._timer_lists
        return tuple(all_timers[offs[j]:offs[j + 1]])


class NewRows:
    """New row images without record ids: a tuple per key, turned into columns once (``table``)."""

    def __init__(self) -> None:
        # (key, state, timers, hold, pending, timer counter, codec column) per key, by ``KeyLoop.run``
        self.rows: list[tuple[str, bytes | None, tuple[Timer, ...], int | None, Any, int, str]] = []

    def table(self, schema: Any, *, sequencer: int, commit_id: str, now_ms: int, format_version: int) -> Any:
        """The Arrow table in ``schema`` (the rows file schema without ``record_ids``)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.rows)
        if n:
            keys, states, timer_lists, holds, pending_lists, seqs, codecs = zip(*self.rows, strict=True)
        else:
            keys = states = timer_lists = holds = pending_lists = seqs = codecs = ()
        flat = list(chain.from_iterable(timer_lists))
        tfield = schema.field("timers")
        offsets = pa.array(list(accumulate(map(len, timer_lists), initial=0)), pa.int32())
        # the timers' fields transposed in C (one tuple per field), not a list per field in Python
        t_times, t_tags, t_doms = zip(*flat, strict=True) if flat else ((), (), ())
        times = pa.array(t_times, pa.int64())
        is_event = np.fromiter(map(is_, repeat(_EVENT), t_doms), dtype=bool, count=len(t_doms))
        # the domain column from the flags (two domains), not a string per timer in Python
        doms = pc.if_else(pa.array(is_event, pa.bool_()), pa.scalar(DOMAIN_VALUES[_EVENT], pa.string()),
                          pa.scalar(DOMAIN_VALUES[_PROCESSING], pa.string()))
        timers = pa.ListArray.from_arrays(
            offsets,
            pa.StructArray.from_arrays([pa.array(t_tags, pa.string()), doms, times],
                                       fields=list(tfield.type.value_type)), type=tfield.type)
        prods = list(chain.from_iterable(pending_lists))
        pfield = schema.field("pending")
        ptype = pfield.type.value_type  # the struct's fields are Production's attributes
        p_cols = dict(zip(Production._fields, zip(*prods, strict=True) if prods else ((),) * len(Production._fields),
                          strict=True))
        pending = pa.ListArray.from_arrays(
            pa.array(list(accumulate(map(len, pending_lists), initial=0)), pa.int32()),
            pa.StructArray.from_arrays([pa.array(p_cols[f.name], f.type) for f in ptype],
                                       fields=list(ptype)), type=pfield.type)
        next_ev, next_proc = _next_timers(offsets, times, is_event, n)
        cols = {"key": keys, "state": states, "codec": codecs, "next_event_timer_ms": next_ev,
                "next_processing_timer_ms": next_proc, "watermark_hold_ms": holds,
                "sequencer": sequencer, "commit_id": commit_id, "updated_ms": now_ms,
                "format_version": format_version, "timer_seq": seqs}
        constant = ("sequencer", "commit_id", "updated_ms", "format_version")
        arrays = [timers if f.name == "timers" else pending if f.name == "pending" else
                  pa.repeat(pa.scalar(cols[f.name], f.type), n) if f.name in constant else
                  cols[f.name] if isinstance(cols[f.name], pa.Array) else pa.array(cols[f.name], f.type)
                  for f in schema]
        return pa.Table.from_arrays(arrays, schema=schema)


def _next_timers(offsets: Any, times: Any, is_event: Any, n: int) -> tuple[Any, Any]:
    """Per row: the earliest event-time and processing-time timer, or null (timers are sorted)."""
    import numpy as np
    import pyarrow as pa

    event = np.asarray(is_event, dtype=bool)
    starts, ts = offsets.to_numpy(), times.to_numpy()
    out = []
    for pick in (event, ~event):
        where = np.flatnonzero(pick)
        rows = np.searchsorted(starts, where, side="right") - 1  # the row of each picked timer
        first_ms = np.zeros(n, dtype=np.int64)
        has = np.zeros(n, dtype=bool)
        if len(where):
            first_rows, first = np.unique(rows, return_index=True)  # first occurrence per row
            first_ms[first_rows] = ts[where[first]]
            has[first_rows] = True
        out.append(pa.array(first_ms, pa.int64(), mask=~has))
    return out[0], out[1]
