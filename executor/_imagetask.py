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

import os
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.deltatxn import partition_file_name, write_file
from deltawheel.statestore.exceptions import CodecError
from deltawheel.statestore.rows import _DOMAINS, FENCE_KEY, KeyRow, Production, TimeDomain, Timer

from .computation import Computation, Record
from .keyrun import run_key

__all__ = ["ImageSpec", "image_task_fn", "SUMMARY_DDL", "STALE_MARK"]

STALE_MARK = "DW_STALE_FENCE"
_SIDE = ("STRUCT<kind: STRING, record_id: STRING, key: STRING, value: BINARY, codec: STRING, timestamp_ms: BIGINT, "
         "stream: STRING, position: STRING, error: STRING>")
SUMMARY_DDL = ("interval INT, new_path STRING, new_size BIGINT, new_rows BIGINT, "
               "prod_files ARRAY<STRUCT<stream: STRING, path: STRING, size: BIGINT, num_rows: BIGINT>>, "
               f"side ARRAY<{_SIDE}>, records_in BIGINT, processed BIGINT, duplicates BIGINT, fired BIGINT, "
               "late BIGINT, n_prods BIGINT, n_dead BIGINT, keys_written BIGINT, oldest_ms BIGINT, "
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


def image_task_fn(spec: ImageSpec) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        rows: list[dict[str, Any]] = []
        for b in batches:
            rows.extend(b.to_pylist())
        if not rows:
            return
        if os.environ.get("DELTAWHEEL_TASK_PROFILE"):  # a folder: one cProfile file per task
            import cProfile
            prof = cProfile.Profile()
            out = prof.runcall(_run, spec, rows)
            prof.dump_stats(os.path.join(os.environ["DELTAWHEEL_TASK_PROFILE"], f"task-{uuid.uuid4().hex}.prof"))
        else:
            out = _run(spec, rows)
        yield pa.RecordBatch.from_pylist(out, schema=spec.summary_schema)

    return fn


def _run(spec: ImageSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_iv: dict[int, list[dict[str, Any]]] = {}
    side: list[dict[str, Any]] = []
    counted = 0
    lo = hi = None
    for r in rows:
        if r["_m"]:
            by_iv.setdefault(int(r["interval"]), [])
            continue
        counted += 1
        ts = r["timestamp_ms"]
        if ts is not None:
            lo = ts if lo is None or ts < lo else lo
            hi = ts if hi is None or ts > hi else hi
        if r["_bad"] is not None:
            side.append(_side("dead", r, r["key"], r["_bad"]))
        elif spec.route_late and r["late"]:
            side.append(_side("late", r, r["key"], None))
        else:
            by_iv.setdefault(int(r["interval"]), []).append(r)
    out = [_interval(spec, iv, recs) for iv, recs in sorted(by_iv.items()) if iv in spec.sequencers]
    # the task's input counts and its dead / late records ride on its first summary row
    head: dict[str, Any] = out[0] if out else {"interval": None, "side": []}
    head.update(records_in=counted, min_ts=lo, max_ts=hi, side=side + head["side"])
    return out or [head]


def _interval(spec: ImageSpec, iv: int, recs: list[dict[str, Any]]) -> dict[str, Any]:
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
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_key.setdefault(r["key"], []).append(r)
    touched = set(by_key) | set(image.filter(due).column("key").to_pylist())
    has_pending = bool(pc.any(pc.greater(pc.fill_null(pc.list_value_length(image.column("pending")), 0), 0))
                       .as_py())
    summary: dict[str, Any] = {"interval": iv, "new_path": None, "new_size": None, "new_rows": None,
                               "prod_files": [], "side": [], "records_in": 0, "processed": 0, "duplicates": 0,
                               "fired": 0, "late": 0, "n_prods": 0, "n_dead": 0, "keys_written": 0,
                               "min_ts": None, "max_ts": None}
    if not touched and not has_pending and not dirty:
        summary["oldest_ms"] = _oldest(image)
        return summary
    # Step 3: user code per key. Record ids (the bulk of a row) stay in Arrow: the duplicates
    # are found with one vectorized lookup, the new lists are assembled column-wise below.
    mask = pc.is_in(keys, value_set=pa.array(sorted(touched), pa.string()))
    sub = image.filter(mask)
    old_ids = _flat_ids(sub, spec.horizon_ms)
    old = _key_rows(sub, name, iv, with_pending=has_pending)
    rest = image.filter(pc.invert(mask))
    if has_pending:
        rest = _without_pending(rest)
    seen = _already_seen(comp, recs, old_ids)
    new_rows: list[KeyRow] = []
    unchanged: list[str] = []
    new_ids: list[tuple[str, str, int]] = []
    prods: list[Any] = []
    written = 0
    for key in sorted(touched):
        row = old.get(key)
        cleared = bool(row and row.pending)
        if cleared:
            row = row.with_(pending=())  # type: ignore[union-attr]  # delivered by the previous batch
        key_recs = by_key.get(key, ())
        fresh = [x for x in key_recs if (key, x["record_id"]) not in seen] if seen else key_recs
        summary["duplicates"] += len(key_recs) - len(fresh)
        records, dead = _records(key, fresh)
        o = run_key(comp, key=key, interval=iv, row=row, records=records, input_watermark_ms=spec.wm,
                    now_ms=spec.now_ms, dedup_horizon_ms=spec.horizon_ms)
        by_id = {x["record_id"]: x for x in fresh}
        dead += [_side("dead", by_id[rec.record_id], key, err) for rec, err in o.dead_letters]
        summary["side"].extend(dead)
        for k in ("processed", "duplicates", "late"):
            summary[k] += getattr(o, k)
        summary["fired"] += o.timers_fired
        summary["n_dead"] += len(dead)
        prods.extend(o.productions)
        if o.row is None:
            if key in old_ids.keys:  # no state left, but its recent record ids still guard replays
                new_rows.append(KeyRow(name, key, iv))
            written += int(row is not None)
            continue
        if o.changed or cleared or row is None:
            if comp.exactly_once:
                new_ids.extend((key, sid.record_id, sid.seen_ms) for sid in o.row.record_ids)
            new_rows.append(o.row)
            written += 1
        else:
            unchanged.append(key)  # kept as it is in the image (record ids untrimmed)
    summary["n_prods"] = len(prods)
    summary["keys_written"] = written
    fresh_tbl = _with_ids(_rows_table(new_rows, spec, mine), old_ids, new_ids, spec.rows_schema)
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
    summary["oldest_ms"] = _oldest(new_image)
    return summary


def _without_pending(t: Any) -> Any:
    import pyarrow as pa

    idx = t.schema.get_field_index("pending")
    return t.set_column(idx, t.schema.field(idx), pa.array([[]] * t.num_rows, t.schema.field(idx).type))


def _key_rows(sub: Any, name: str, iv: int, *, with_pending: bool) -> dict[str, KeyRow]:
    """The touched rows as KeyRows, column-wise (record ids stay in Arrow; sequencer, commit id
    and update time are rewritten on output, so they are not read)."""
    import pyarrow.compute as pc

    keys = sub.column("key").to_pylist()
    states = sub.column("state").to_pylist()
    codecs = _constant_or_list(sub.column("codec"), len(keys))
    holds = _constant_or_list(sub.column("watermark_hold_ms"), len(keys))
    timers = sub.column("timers").combine_chunks()
    flat = pc.list_flatten(timers)
    tags, doms, times = (flat.field("tag").to_pylist(), flat.field("domain").to_pylist(),
                         flat.field("time_ms").to_pylist())
    offs = timers.offsets.to_pylist()
    pend = sub.column("pending").to_pylist() if with_pending else None
    out = {}
    for i, key in enumerate(keys):
        lo, hi = offs[i], offs[i + 1]
        out[key] = KeyRow(
            name, key, iv, state=states[i], codec=codecs[i] or "json",
            timers=tuple(Timer(times[j], tags[j], _DOMAINS[doms[j]]) for j in range(lo, hi)),
            pending=tuple(Production.from_row(p) for p in pend[i] or ()) if pend is not None else (),
            watermark_hold_ms=holds[i])
    return out


def _constant_or_list(col: Any, n: int) -> Any:
    import pyarrow.compute as pc

    uniq = pc.unique(col)
    if len(uniq) == 1:
        return [uniq[0].as_py()] * n
    return col.to_pylist()


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
    cols = {
        "key": [r.key for r in rows],
        "state": [r.state for r in rows],
        "codec": [r.codec for r in rows],
        "next_event_timer_ms": [min((t.time_ms for t in r.timers if t.domain is ev), default=None) for r in rows],
        "next_processing_timer_ms": [min((t.time_ms for t in r.timers if t.domain is not ev), default=None)
                                     for r in rows],
        "pending": [[p.to_row() for p in r.pending] for r in rows],
        "watermark_hold_ms": [r.watermark_hold_ms for r in rows],
        "sequencer": [sequencer] * n,
        "commit_id": [spec.commit_id] * n,
        "updated_ms": [spec.now_ms] * n,
        "format_version": [r.format_version for r in rows],
    }
    arrays = [timers if f.name == "timers" else pa.array(cols[f.name], f.type) for f in schema]
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
    return _Ids(table, set(pc.unique(table.column("key")).to_pylist()))


def _already_seen(comp: Computation, recs: list[dict[str, Any]], ids: _Ids) -> set[tuple[str, str]]:
    """(key, record id) of the records whose id the key's row already holds."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not comp.exactly_once or ids.table.num_rows == 0 or not recs:
        return set()
    pairs = pa.array([f"{x['key']}\x00{x['record_id']}" for x in recs], pa.string())
    old = pc.binary_join_element_wise(ids.table.column("key"), ids.table.column("record_id"), "\x00")
    hit = pc.is_in(pairs, value_set=old).to_pylist()
    return {(x["key"], x["record_id"]) for x, h in zip(recs, hit, strict=True) if h}


def _with_ids(rows: Any, old: _Ids, new: list[tuple[str, str, int]], schema: Any) -> Any:
    """``rows`` (without record ids) + the record_ids column: retained old ids, then the new ones."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    field = schema.field("record_ids")
    ids = pa.concat_tables([old.table, pa.table({
        "key": pa.array([k for k, _, _ in new], pa.string()),
        "record_id": pa.array([r for _, r, _ in new], pa.string()),
        "seen_ms": pa.array([t for _, _, t in new], pa.int64())})])
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


def _records(key: str, recs: Any) -> tuple[list[Record], list[dict[str, Any]]]:
    out: list[Record] = []
    dead: list[dict[str, Any]] = []
    for x in recs:
        try:
            value = get_codec(x["codec"]).decode(x["value"])
        except CodecError as exc:
            dead.append(_side("dead", x, key, f"CodecError: {exc}"))
            continue
        out.append(Record(key, value, int(x["timestamp_ms"]), x["record_id"], x["stream"] or "", bool(x["late"])))
    return out, dead


def _side(kind: str, x: Mapping[str, Any], key: str | None, error: str | None) -> dict[str, Any]:
    return {"kind": kind, "record_id": x.get("record_id"), "key": key, "value": x.get("value"),
            "codec": x.get("codec"), "timestamp_ms": x.get("timestamp_ms"), "stream": x.get("stream"),
            "position": x.get("position"), "error": error}


def _oldest(image: Any) -> int | None:
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
        out.append({"stream": stream, "path": rel, "size": size, "num_rows": table.num_rows})
    return out
