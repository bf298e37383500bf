"""The task side of the image write path: one interval image in, one out.

Each Spark task gets the batch's records of some intervals (plus one marker
row per owned interval, so intervals with only due timers get a task too) and,
per interval, the paths of the files that make up the interval's current
partition of the rows table. It

1. loads the image (Parquet, cached per Python worker by file path: files
   are immutable, so a cached image is never stale) and checks the fence row
   carries this writer's sequencer — a takeover is noticed before user code;
2. picks the keys to run: keys with records, keys with due timers;
3. runs user code per key (``keyrun.run_key``: dedup, records in event-time
   order, timers in timestamp order) and clears delivered checkpoints;
4. writes the new image as one Parquet file in the interval's partition
   folder and the new productions as one file per stream in the stream
   table's folder — neither is visible until the driver commits it;
5. returns one summary row per interval (file paths, counts, oldest work).

Nothing here talks to ZooKeeper or the Delta log; the driver commits.
"""

from __future__ import annotations

import gc
import json
import os
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.deltatxn import partition_file_name, write_file
from deltawheel.statestore.exceptions import CodecError
from deltawheel.statestore.rows import _DOMAINS, FENCE_KEY, KeyRow, TimeDomain, make_row, make_timer

from .computation import Computation, Record, make_record
from .keyrun import run_key

__all__ = ["ImageSpec", "image_task_fn", "oldest_work", "next_processing", "SUMMARY_DDL", "STALE_MARK"]

STALE_MARK = "DW_STALE_FENCE"
_SIDE = ("STRUCT<kind: STRING, record_id: STRING, key: STRING, value: BINARY, codec: STRING, timestamp_ms: BIGINT, "
         "stream: STRING, position: STRING, error: STRING>")
SUMMARY_DDL = ("interval INT, new_path STRING, new_size BIGINT, new_rows BIGINT, "
               "prod_files ARRAY<STRUCT<stream: STRING, path: STRING, size: BIGINT, num_rows: BIGINT, min_ts: BIGINT>>, "
               f"side ARRAY<{_SIDE}>, records_in BIGINT, processed BIGINT, duplicates BIGINT, fired BIGINT, "
               "late BIGINT, n_prods BIGINT, n_dead BIGINT, keys_written BIGINT, oldest_ms BIGINT, next_proc_ms BIGINT, "
               "min_ts BIGINT, max_ts BIGINT")
_CACHE: "OrderedDict[tuple[str, ...], Any]" = OrderedDict()
_CACHE_MAX = 64


@dataclass(frozen=True)
class ImageSpec:
    """Everything a task needs, as plain values (pickled to the workers)."""

    comp: Computation
    rows_root: str  # local folder of the rows table
    images: Mapping[int, tuple[str, ...]]  # interval -> relative (decoded) paths of its live files
    sequencers: Mapping[int, int]
    stream_roots: Mapping[str, str]
    wm: int | None
    now_ms: int
    horizon_ms: int | None
    commit_id: str
    rows_schema: Any  # pyarrow schema of the rows files (no partition columns)
    stream_schema: Any
    stream_format_version: int
    route_late: bool
    summary_schema: Any
    strong: bool  # checkpoint the productions in the rows (strong, or a weak batch's straggler re-run)


def image_task_fn(spec: ImageSpec) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from ._worker import freeze_spark_zips

        freeze_spark_zips()
        got = list(batches)
        if not got or not any(b.num_rows for b in got):
            return
        table = pa.Table.from_batches(got)
        # no cyclic garbage collection while the task runs: it allocates ~10 objects per record,
        # which triggers collections that traverse every tracked object (the cached images
        # included), 15-35 % of the task function's time; nearly all of it is freed by reference
        # counting anyway, and the collector resumes (and catches up) when the task ends
        # (the type ignores: mypy, run over the repo's folders, takes gc/ for this builtin module)
        was_enabled = gc.isenabled()  # type: ignore[attr-defined]
        gc.disable()  # type: ignore[attr-defined]
        try:
            if os.environ.get("DELTAWHEEL_TASK_PROFILE"):  # a folder: one cProfile file per task
                import cProfile
                prof = cProfile.Profile()
                out = prof.runcall(_run, spec, table)
                prof.dump_stats(os.path.join(os.environ["DELTAWHEEL_TASK_PROFILE"], f"task-{uuid.uuid4().hex}.prof"))
            else:
                out = _run(spec, table)
        finally:
            if was_enabled:
                gc.enable()  # type: ignore[attr-defined]
        yield pa.RecordBatch.from_pylist(out, schema=spec.summary_schema)

    return fn


def _run(spec: ImageSpec, table: Any) -> list[dict[str, Any]]:
    """One task: the input rows (Arrow, prepared columns + interval + marker flag) of some intervals."""
    import pyarrow.compute as pc

    marker = pc.fill_null(table.column("_m"), False)
    ivs = set(table.filter(marker).column("interval").to_pylist())
    data = table.filter(pc.invert(marker))
    counted = data.num_rows
    lo = hi = None
    if counted:
        mm = pc.min_max(data.column("timestamp_ms"))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
    side: list[dict[str, Any]] = []
    bad = pc.is_valid(data.column("_bad"))
    if counted and pc.any(bad).as_py():
        side += [_side("dead", r, r["key"], r["_bad"]) for r in data.filter(bad).to_pylist()]
        data = data.filter(pc.invert(bad))
    if spec.route_late and data.num_rows:
        late = pc.fill_null(data.column("late"), False)
        if pc.any(late).as_py():
            side += [_side("late", r, r["key"], None) for r in data.filter(late).to_pylist()]
            data = data.filter(pc.invert(late))
    if data.num_rows:
        ivs |= set(_py(pc.unique(data.column("interval"))))
    out = []
    for iv in sorted(i for i in ivs if i in spec.sequencers):
        recs = data.filter(pc.equal(data.column("interval"), iv)) if data.num_rows else data
        out.append(_interval(spec, iv, recs))
    # the task's input counts and its dead / late records ride on its first summary row
    head: dict[str, Any] = out[0] if out else {"interval": None, "side": []}
    head.update(records_in=counted, min_ts=lo, max_ts=hi, side=side + head["side"])
    return out or [head]


class _Input:
    """One interval's records of the batch as Python lists, sorted by (key, event time,
    record id): each key's records are one contiguous, already ordered run."""

    def __init__(self, recs: Any) -> None:
        import pyarrow.compute as pc

        recs = recs.sort_by([("key", "ascending"), ("timestamp_ms", "ascending"), ("record_id", "ascending")])
        self.table = recs
        n = recs.num_rows
        self.keys: list[str] = _py(recs.column("key"))
        self.ids: list[str] = _py(recs.column("record_id"))
        vcol = recs.column("value")
        self.no_values = vcol.null_count == n  # an injector without value columns: nothing to decode
        self.values: list[bytes | None] = [] if self.no_values else _py(vcol)
        self.codecs: list[str | None] = _constant_or_list(recs.column("codec"), n) if n else []
        self.ts: list[int] = _py(recs.column("timestamp_ms"))
        self.streams: list[str | None] = _constant_or_list(recs.column("stream"), n) if n else []
        self.late: list[bool | None] = _py(recs.column("late"))
        self.runs: dict[str, tuple[int, int]] = {}
        if n:
            ree = pc.run_end_encode(recs.column("key").combine_chunks())
            start = 0
            for key, end in zip(_py(ree.values), _py(ree.run_ends), strict=True):
                self.runs[key] = (start, end)
                start = end

    def row(self, i: int) -> dict[str, Any]:
        return {c: self.table.column(c)[i].as_py() for c in self.table.column_names}


def _interval(spec: ImageSpec, iv: int, recs: Any) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.compute as pc

    comp = spec.comp
    name = comp.name
    image = _load(spec, iv)
    # Step 1: the fence row must carry our sequencer.
    keys = image.column("key")
    fence = image.filter(pc.equal(keys, FENCE_KEY)).column("sequencer").to_pylist()
    mine = spec.sequencers[iv]
    if not fence or max(fence) != mine:
        raise RuntimeError(f"{STALE_MARK}: interval {iv} of {name} is fenced by sequencer "
                           f"{max(fence) if fence else None}, this writer holds {mine}")
    dirty = len(fence) > 1  # a takeover's claim left a second fence row: keep one
    if dirty:
        fmask = pc.equal(keys, FENCE_KEY)
        fences = image.filter(fmask)
        best = pc.index(fences.column("sequencer"), mine).as_py()
        image = pa.concat_tables([image.filter(pc.invert(fmask)), fences.slice(best, 1)]).combine_chunks()
        keys = image.column("key")
    # Step 2: keys to run.
    due = pc.less_equal(image.column("next_processing_timer_ms"), spec.now_ms)
    if spec.wm is not None:
        due = pc.or_kleene(due, pc.less(image.column("next_event_timer_ms"), spec.wm))
    due = pc.fill_null(due, False)
    inp = _Input(recs)
    touched = set(inp.runs) | set(_py(image.filter(due).column("key")))
    has_pending = bool(pc.any(pc.greater(pc.fill_null(pc.list_value_length(image.column("pending")), 0), 0))
                       .as_py())
    summary: dict[str, Any] = {"interval": iv, "new_path": None, "new_size": None, "new_rows": None,
                               "prod_files": [], "side": [], "records_in": 0, "processed": 0, "duplicates": 0,
                               "fired": 0, "late": 0, "n_prods": 0, "n_dead": 0, "keys_written": 0,
                               "min_ts": None, "max_ts": None}
    if not touched and not has_pending and not dirty:
        summary["oldest_ms"], summary["next_proc_ms"] = oldest_work(image), next_processing(image)
        return summary
    # Step 3: user code per key. Record ids (the bulk of a row) stay in Arrow: the duplicates
    # are found with one vectorized lookup, the new lists are assembled column-wise below.
    mask = pc.is_in(keys, value_set=pa.array(sorted(touched), pa.string()))
    sub = image.filter(mask)
    old_ids = _flat_ids(sub, spec.horizon_ms)
    old, had_pending = _key_rows(sub, name, iv, with_pending=has_pending)
    rest = image.filter(pc.invert(mask))
    if has_pending:
        rest = _without_pending(rest)
    seen = _already_seen(comp, inp, old_ids)
    new_rows: list[KeyRow] = []
    unchanged: list[str] = []
    id_keys: list[str] = []
    id_values: list[str] = []
    prods: list[Any] = []
    written = processed = dups = late = fired = 0
    side = summary["side"]
    for key in sorted(touched):
        row = old.get(key)
        cleared = key in had_pending  # delivered by the previous batch: dropped from the new image
        lo, hi = inp.runs.get(key, (0, 0))
        records, dead, n_seen = _records(inp, key, lo, hi, seen)
        dups += n_seen
        o = run_key(comp, key=key, interval=iv, row=row, records=records, input_watermark_ms=spec.wm,
                    now_ms=spec.now_ms, dedup_horizon_ms=spec.horizon_ms, presorted=True, keep_ids=False,
                    strong=spec.strong)
        if o.dead_letters:
            pos = {inp.ids[i]: i for i in range(lo, hi)}
            dead += [_side("dead", inp.row(pos[rec.record_id]), key, err) for rec, err in o.dead_letters]
        side.extend(dead)
        processed += o.processed
        dups += o.duplicates
        late += o.late
        fired += o.timers_fired
        summary["n_dead"] += len(dead)
        prods.extend(o.productions)
        if o.row is None:
            if key in old_ids.keys:  # no state left, but its recent record ids still guard replays
                new_rows.append(KeyRow(name, key, iv))
            written += int(row is not None)
            continue
        if o.changed or cleared or row is None:
            if o.new_record_ids:
                id_keys += [key] * len(o.new_record_ids)
                id_values += o.new_record_ids
            new_rows.append(o.row)
            written += 1
        else:
            unchanged.append(key)  # kept as it is in the image (record ids untrimmed)
    summary.update(processed=processed, duplicates=dups, late=late, fired=fired, n_prods=len(prods),
                   keys_written=written)
    fresh_tbl = _with_ids(_rows_table(new_rows, spec, mine), old_ids, id_keys, id_values, spec.now_ms,
                          spec.rows_schema)
    parts = [rest, fresh_tbl]
    if unchanged:
        same = sub.filter(pc.is_in(sub.column("key"), value_set=pa.array(unchanged, pa.string())))
        parts.append(_without_pending(same) if has_pending else same)
    new_image = pa.concat_tables(parts).combine_chunks()
    # Step 4: write the files (invisible until the driver's commit).
    if written or has_pending or dirty:
        rel = partition_file_name(name, iv, "dw")
        size = write_file(new_image, spec.rows_root, rel)
        _remember((rel,), new_image)
        summary.update(new_path=rel, new_size=size, new_rows=new_image.num_rows)
    summary["prod_files"] = _write_productions(spec, iv, prods)
    summary["oldest_ms"], summary["next_proc_ms"] = oldest_work(new_image), next_processing(new_image)
    return summary


def _py(arr: Any) -> list[Any]:
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


def _without_pending(t: Any) -> Any:
    import pyarrow as pa

    idx = t.schema.get_field_index("pending")
    return t.set_column(idx, t.schema.field(idx), pa.array([[]] * t.num_rows, t.schema.field(idx).type))


def _key_rows(sub: Any, name: str, iv: int, *, with_pending: bool) -> tuple[dict[str, KeyRow], set[str]]:
    """The touched rows as KeyRows, column-wise, and the keys that had pending productions.

    Record ids stay in Arrow; sequencer, commit id and update time are rewritten on output, so
    they are not read; pending productions are not read either: on this path they are always the
    previous batch's, delivered before this batch can commit, so they are only cleared."""
    import pyarrow.compute as pc

    keys = _py(sub.column("key"))
    states = _py(sub.column("state"))
    codecs = _constant_or_list(sub.column("codec"), len(keys))
    holds = _constant_or_list(sub.column("watermark_hold_ms"), len(keys))
    timers = sub.column("timers").combine_chunks()
    flat = pc.list_flatten(timers)
    tags, doms, times = (_py(flat.field("tag")), _py(flat.field("domain")), _py(flat.field("time_ms")))
    offs = _py(timers.offsets)
    pending: set[str] = set()
    if with_pending:
        has = pc.fill_null(pc.greater(pc.list_value_length(sub.column("pending")), 0), False)
        pending = set(_py(sub.column("key").filter(has)))
    out = {}
    for i, key in enumerate(keys):
        lo, hi = offs[i], offs[i + 1]
        out[key] = make_row(name, key, iv, states[i], codecs[i] or "json",
                            tuple([make_timer(times[j], tags[j], _DOMAINS[doms[j]]) for j in range(lo, hi)]),
                            holds[i])
    return out, pending


def _constant_or_list(col: Any, n: int) -> Any:
    import pyarrow.compute as pc

    uniq = pc.unique(col)
    if len(uniq) == 1:
        return [uniq[0].as_py()] * n
    return _py(col)


def _rows_table(rows: list[KeyRow], spec: ImageSpec, sequencer: int) -> Any:
    """New row images (without record ids) as an Arrow table, column-wise."""
    import pyarrow as pa

    schema = spec.rows_schema.remove(spec.rows_schema.get_field_index("record_ids"))
    n = len(rows)
    ev = TimeDomain.EVENT_TIME
    offs, tags, doms, times = [0], [], [], []
    for r in rows:
        for t in r.timers:
            tags.append(t.tag)
            doms.append(t.domain.value)
            times.append(t.time_ms)
        offs.append(len(tags))
    tfield = schema.field("timers")
    timers = pa.ListArray.from_arrays(pa.array(offs, pa.int32()), pa.StructArray.from_arrays(
        [pa.array(tags, pa.string()), pa.array(doms, pa.string()), pa.array(times, pa.int64())],
        fields=list(tfield.type.value_type)), type=tfield.type)
    pfield = schema.field("pending")
    ptype = pfield.type.value_type  # the struct's fields are Production's attributes
    poffs = [0]
    pcols: dict[str, list[Any]] = {f.name: [] for f in ptype}
    for r in rows:
        for p in r.pending:
            for f, col in pcols.items():
                col.append(getattr(p, f))
        poffs.append(len(pcols["key"]))
    pending = pa.ListArray.from_arrays(pa.array(poffs, pa.int32()), pa.StructArray.from_arrays(
        [pa.array(pcols[f.name], f.type) for f in ptype], fields=list(ptype)), type=pfield.type)
    cols = {
        "key": [r.key for r in rows],
        "state": [r.state for r in rows],
        "codec": [r.codec for r in rows],
        "next_event_timer_ms": [min((t.time_ms for t in r.timers if t.domain is ev), default=None) for r in rows],
        "next_processing_timer_ms": [min((t.time_ms for t in r.timers if t.domain is not ev), default=None)
                                     for r in rows],
        "watermark_hold_ms": [r.watermark_hold_ms for r in rows],
        "sequencer": [sequencer] * n,
        "commit_id": [spec.commit_id] * n,
        "updated_ms": [spec.now_ms] * n,
        "format_version": [r.format_version for r in rows],
    }
    arrays = [timers if f.name == "timers" else pending if f.name == "pending" else pa.array(cols[f.name], f.type)
              for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


@dataclass
class _Ids:
    """Flattened record ids of the touched rows: parallel key / record_id / seen_ms arrays."""

    table: Any
    keys: set[str]


def _flat_ids(sub: Any, horizon_ms: int | None) -> _Ids:
    import pyarrow as pa
    import pyarrow.compute as pc

    lst = sub.column("record_ids").combine_chunks()
    if len(lst) == 0:
        return _Ids(pa.table({"key": pa.array([], pa.string()), "record_id": pa.array([], pa.string()),
                              "seen_ms": pa.array([], pa.int64())}), set())
    parents = pc.list_parent_indices(lst)
    flat = pc.list_flatten(lst)
    table = pa.table({"key": sub.column("key").combine_chunks().take(parents),
                      "record_id": flat.field("record_id"), "seen_ms": flat.field("seen_ms")})
    if horizon_ms is not None:
        table = table.filter(pc.greater_equal(table.column("seen_ms"), horizon_ms))
    return _Ids(table, set(_py(pc.unique(table.column("key")))))


def _already_seen(comp: Computation, inp: _Input, ids: _Ids) -> list[bool] | None:
    """Per input record (in ``inp`` order): does the key's row already hold its id?"""
    import pyarrow.compute as pc

    if not comp.exactly_once or ids.table.num_rows == 0 or not inp.keys:
        return None
    pairs = pc.binary_join_element_wise(inp.table.column("key"), inp.table.column("record_id"), "\x00")
    old = pc.binary_join_element_wise(ids.table.column("key"), ids.table.column("record_id"), "\x00")
    hit = pc.is_in(pairs, value_set=old)
    return _py(hit) if pc.any(hit).as_py() else None


def _with_ids(rows: Any, old: _Ids, new_keys: list[str], new_ids: list[str], seen_ms: int, schema: Any) -> Any:
    """``rows`` (without record ids) + the record_ids column: retained old ids, then the new ones."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    field = schema.field("record_ids")
    ids = pa.concat_tables([old.table, pa.table({
        "key": pa.array(new_keys, pa.string()), "record_id": pa.array(new_ids, pa.string()),
        "seen_ms": pa.array(np.full(len(new_ids), seen_ms, dtype=np.int64))})])
    pos = pc.index_in(ids.column("key"), value_set=rows.column("key"))
    ids = ids.append_column("pos", pos).append_column("seq", pa.array(np.arange(ids.num_rows), pa.int64()))
    ids = ids.filter(pc.is_valid(pos))
    ids = ids.take(pc.sort_indices(ids, sort_keys=[("pos", "ascending"), ("seq", "ascending")]))
    counts = np.bincount(ids.column("pos").to_numpy(), minlength=rows.num_rows) if ids.num_rows else \
        np.zeros(rows.num_rows, dtype=np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32), pa.int32())
    values = pa.StructArray.from_arrays([ids.column("record_id").combine_chunks(),
                                         ids.column("seen_ms").combine_chunks()], fields=list(field.type.value_type))
    col = pa.ListArray.from_arrays(offsets, values, type=field.type)
    out = rows.add_column(schema.get_field_index("record_ids"), field, col)
    return out.select(schema.names).cast(schema)


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


def _records(inp: _Input, key: str, lo: int, hi: int,
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
            dead.append(_side("dead", inp.row(i), key, f"CodecError: {exc}"))
            continue
        out.append(make_record(key, value, ts[i], ids[i], streams[i] or "", bool(late[i])))
    return out, dead, n_seen


def _side(kind: str, x: Mapping[str, Any], key: str | None, error: str | None) -> dict[str, Any]:
    return {"kind": kind, "record_id": x.get("record_id"), "key": key, "value": x.get("value"),
            "codec": x.get("codec"), "timestamp_ms": x.get("timestamp_ms"), "stream": x.get("stream"),
            "position": x.get("position"), "error": error}


def next_processing(image: Any) -> int | None:
    """The earliest processing-time timer of an image (None: none)."""
    import pyarrow.compute as pc

    return pc.min(image.column("next_processing_timer_ms")).as_py()  # type: ignore[no-any-return]


def oldest_work(image: Any) -> int | None:
    import pyarrow.compute as pc

    user = image.filter(pc.not_equal(image.column("key"), FENCE_KEY))
    marks = [pc.min(user.column(c)).as_py() for c in ("next_event_timer_ms", "watermark_hold_ms")]
    marks = [m for m in marks if m is not None]
    return min(marks) if marks else None


def _load(spec: ImageSpec, iv: int) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = tuple(sorted(spec.images.get(iv, ())))
    hit = _CACHE.get(paths)
    if hit is not None:
        _CACHE.move_to_end(paths)
        return hit
    names = spec.rows_schema.names
    parts = [pq.read_table(os.path.join(spec.rows_root, p), columns=names) for p in paths]
    table = pa.concat_tables([t.cast(spec.rows_schema) for t in parts]) if parts else spec.rows_schema.empty_table()
    _remember(paths, table)
    return table


def _remember(paths: tuple[str, ...], table: Any) -> None:
    _CACHE[paths] = table
    _CACHE.move_to_end(paths)
    while len(_CACHE) > _CACHE_MAX:
        _CACHE.popitem(last=False)


def _write_productions(spec: ImageSpec, iv: int, prods: list[Any]) -> list[dict[str, Any]]:
    import pyarrow as pa

    out = []
    for stream in sorted({p.stream for p in prods}):
        ps = [p for p in prods if p.stream == stream]
        ts = pa.array([p.timestamp_ms for p in ps], pa.int64())
        table = pa.table({
            "record_id": pa.array([p.production_id for p in ps], pa.string()),
            "key": pa.array([p.key for p in ps], pa.string()),
            "value": pa.array([bytes(p.value) for p in ps], pa.binary()),
            "codec": pa.array([p.codec for p in ps], pa.string()),
            "timestamp_ms": ts,
            "event_time": ts.cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
            "producer": pa.array([spec.comp.name] * len(ps), pa.string()),
            "commit_id": pa.array([spec.commit_id] * len(ps), pa.string()),
            "format_version": pa.array([spec.stream_format_version] * len(ps), pa.int32()),
        }).cast(spec.stream_schema)
        rel = f"part-{uuid.uuid4().hex}-dw-{spec.comp.name}-{iv}.snappy.parquet"
        size = write_file(table, spec.stream_roots[stream], rel)
        out.append({"stream": stream, "path": rel, "size": size, "num_rows": table.num_rows,
                    "min_ts": min(p.timestamp_ms for p in ps)})
    return out
