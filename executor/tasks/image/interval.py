"""The task side of the image write path: one interval image in, one out.

Each Spark task gets the batch's records of some intervals (plus one marker
row per owned interval, so intervals with only due timers get a task too) and,
per interval, the paths of the files that make up the interval's current
partition of the rows table. It

1. loads the image (Parquet, cached per Python worker by file path: files
   are immutable, so a cached image is never stale; in local mode the tasks of
   a direct or timers-only batch claim the intervals their worker holds,
   ``claims.py``) and checks the fence row carries this writer's sequencer —
   a takeover is noticed before user code;
2. picks the keys to run: keys with records, keys with due timers;
3. runs user code per key (``_imagekeys``, through ``keyrun.UserCode``:
   dedup, records in event-time order, timers in timestamp order) and clears
   delivered checkpoints; dedup asks the interval's Bloom filter first (kept
   per worker next to the cached image, built from the image on a miss): only
   when a record's id *might* have been seen are the stored ids looked at;
4. writes the new image as one Parquet file in the interval's partition
   folder and the new productions as one file per stream in the stream
   table's folder, with the write path's functions
   (``statestore/writepath/image/``) — neither is visible until the driver
   commits it; on S3 the uploads run in the background and the task waits
   for all of them before it returns its summary;
5. returns one summary row per interval (file paths, counts, oldest work).

Nothing here talks to ZooKeeper or the Delta log; the driver commits.
"""

from __future__ import annotations

import gc
import os
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from deltawheel.statestore.delta.storefs import TableFiles, background_uploads
from deltawheel.statestore.rowtable.bloom import IdBloom
from deltawheel.statestore.rowtable.inputfiles import union_payloads
from deltawheel.statestore.rowtable.rows import FENCE_KEY, ROW_FORMAT_VERSION
from deltawheel.statestore.writepath.image.path import (
    next_processing,
    oldest_work,
    write_interval_image,
    write_production_files,
)

from ...computation import Computation
from .keys import Input, KeyLoop, OldRows, py_list, side_row

__all__ = ["ImageSpec", "holds", "image_task_fn", "run_task", "SUMMARY_DDL", "STALE_MARK"]

STALE_MARK = "DW_STALE_FENCE"
_SIDE = ("STRUCT<kind: STRING, record_id: STRING, key: STRING, value: BINARY, codec: STRING, timestamp_ms: BIGINT, "
         "stream: STRING, position: STRING, error: STRING>")
SUMMARY_DDL = ("interval INT, new_path STRING, new_size BIGINT, new_rows BIGINT, "
               "prod_files ARRAY<STRUCT<stream: STRING, path: STRING, size: BIGINT, num_rows: BIGINT, min_ts: BIGINT>>, "
               f"side ARRAY<{_SIDE}>, records_in BIGINT, processed BIGINT, duplicates BIGINT, fired BIGINT, "
               "late BIGINT, n_prods BIGINT, n_dead BIGINT, keys_written BIGINT, ids_expired BIGINT, oldest_ms BIGINT, "
               "next_proc_ms BIGINT, bloom_checked BIGINT, bloom_maybe BIGINT, bloom_false_pos BIGINT, "
               "bloom_bytes BIGINT, images_read BIGINT, "
               "min_ts BIGINT, max_ts BIGINT")
_CACHE: "OrderedDict[tuple[str, ...], Any]" = OrderedDict()
_CACHE_MAX = 64
# the interval images' Bloom filters of record ids, by the image's file paths (as _CACHE)
_BLOOMS: "OrderedDict[tuple[str, ...], IdBloom]" = OrderedDict()
BLOOM_ERROR_RATE = 0.01  # at the filter's capacity
BLOOM_MIN_CAPACITY = 4_096  # ids; a filter is sized for twice its image's ids, at least this


@dataclass(frozen=True)
class ImageSpec:
    """Everything a task needs, as plain values (pickled to the workers)."""

    comp: Computation
    rows_root: TableFiles  # the rows table's folder
    images: Mapping[int, tuple[str, ...]]  # interval -> relative (decoded) paths of its live files
    sequencers: Mapping[int, int]
    stream_roots: Mapping[str, TableFiles]
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
    input_files: tuple[str, ...] = ()  # the batch's input files: added to each rewritten fence row's set


def image_task_fn(spec: ImageSpec) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The image job's ``mapInArrow`` function: :func:`run_task` on a task's rows, yields its summary."""
    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from ..worker import freeze_spark_zips

        freeze_spark_zips()
        got = list(batches)
        if not got or not any(b.num_rows for b in got):
            return
        out = run_task(spec, pa.Table.from_batches(got))
        yield pa.RecordBatch.from_pylist(out, schema=spec.summary_schema)

    return fn


def run_task(spec: ImageSpec, table: Any) -> list[dict[str, Any]]:
    """:func:`_run` without cyclic garbage collection (and with a profile when asked)."""
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
    return out


def _run(spec: ImageSpec, table: Any) -> list[dict[str, Any]]:
    """One task: the input rows (Arrow, prepared columns + interval + marker flag) of some intervals."""
    import pyarrow.compute as pc

    marker = pc.fill_null(table.column("_m"), False)
    ivs = set(table.filter(marker).column("interval").to_pylist())
    data = table.filter(pc.invert(marker))
    counted = data.num_rows
    lo = hi = None
    bad = pc.is_valid(data.column("_bad"))
    if counted:  # the event times the injectors' watermarks see: of the records that are no dead letters
        mm = pc.min_max(data.filter(pc.invert(bad)).column("timestamp_ms"))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
    side: list[dict[str, Any]] = []
    if counted and pc.any(bad).as_py():
        side += [side_row("dead", r, r["key"], r["_bad"]) for r in data.filter(bad).to_pylist()]
        data = data.filter(pc.invert(bad))
    if data.num_rows:
        ivs |= set(py_list(pc.unique(data.column("interval"))))
    out = []
    # the S3 PUTs of each interval's files overlap the next interval's work; the summary (and
    # so the driver's commit naming the files) waits for all of them at the block's end
    with background_uploads():
        for iv in sorted(i for i in ivs if i in spec.sequencers):
            recs = data.filter(pc.equal(data.column("interval"), iv)) if data.num_rows else data
            out.append(_interval(spec, iv, recs))
    # the task's input counts and its dead / late records ride on its first summary row
    head: dict[str, Any] = out[0] if out else {"interval": None, "side": []}
    head.update(records_in=counted, min_ts=lo, max_ts=hi, side=side + head["side"])
    return out or [head]


def _interval(spec: ImageSpec, iv: int, recs: Any) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.compute as pc

    comp = spec.comp
    name = comp.name
    read = not holds(spec, iv) and bool(spec.images.get(iv))
    image = _load(spec, iv)
    # Step 1: the fence row must carry our sequencer.
    keys = image.column("key")
    fence = image.filter(pc.equal(keys, FENCE_KEY)).column("sequencer").to_pylist()
    mine = spec.sequencers[iv]
    if not fence or max(fence) != mine:
        raise RuntimeError(f"{STALE_MARK}: interval {iv} of {name} is fenced by sequencer "
                           f"{max(fence) if fence else None}, this writer holds {mine}")
    dirty = len(fence) > 1  # a takeover's claim left a second fence row: keep one
    if dirty or spec.input_files:
        # the kept fence row carries the union of the input-file sets (``inputfiles.py``; a claim's
        # row has none) plus this batch's files; written only if the image is rewritten below
        fmask = pc.equal(keys, FENCE_KEY)
        fences = image.filter(fmask)
        best = pc.index(fences.column("sequencer"), mine).as_py()
        kept = fences.slice(best, 1)
        files = union_payloads(fences.column("state").to_pylist(), spec.input_files)
        kept = kept.set_column(kept.schema.get_field_index("state"), kept.schema.field("state"),
                               pa.array([files], kept.schema.field("state").type))
        image = pa.concat_tables([image.filter(pc.invert(fmask)), kept]).combine_chunks()
        keys = image.column("key")
    routed: list[dict[str, Any]] = []
    if spec.route_late and recs.num_rows:
        recs, routed = _route_late(comp, recs, image, spec.horizon_ms)
    # Step 2: keys to run.
    due = pc.less_equal(image.column("next_processing_timer_ms"), spec.now_ms)
    if spec.wm is not None:
        due = pc.or_kleene(due, pc.less(image.column("next_event_timer_ms"), spec.wm))
    due = pc.fill_null(due, False)
    inp = Input(recs)
    touched = set(inp.runs) | set(py_list(image.filter(due).column("key")))
    has_pending = bool(pc.any(pc.greater(pc.fill_null(pc.list_value_length(image.column("pending")), 0), 0))
                       .as_py())
    summary: dict[str, Any] = {"interval": iv, "new_path": None, "new_size": None, "new_rows": None,
                               "prod_files": [], "side": [], "records_in": 0, "processed": 0, "duplicates": 0,
                               "fired": 0, "late": 0, "n_prods": 0, "n_dead": 0, "keys_written": 0, "ids_expired": 0,
                               "bloom_checked": 0, "bloom_maybe": 0, "bloom_false_pos": 0, "bloom_bytes": 0,
                               "images_read": int(read), "min_ts": None, "max_ts": None}
    summary["side"] = routed
    # ids past the dedup horizon: the image is rewritten without them even when none of its keys
    # runs (a key never seen again must not keep its ids, nor its row for them, forever)
    expired = expired_ids(image, spec.horizon_ms)
    retention = _retention_ms(comp)
    if not touched and not has_pending and not dirty and not expired:
        summary["oldest_ms"], summary["next_proc_ms"] = oldest_work(image), next_processing(image, retention)
        return summary
    # Step 3: user code per key (``_imagekeys``). Record ids (the bulk of a row) stay in Arrow:
    # the duplicates are found with one vectorized lookup, the new lists are assembled below.
    mask = pc.is_in(keys, value_set=pa.array(sorted(touched), pa.string()))
    sub = image.filter(mask)
    old_ids = flat_ids(sub, spec.horizon_ms)
    old = OldRows(sub, with_pending=has_pending)
    rest = _trim_ids(image.filter(pc.invert(mask)), spec.horizon_ms)
    if has_pending:
        rest = _without_pending(rest)
    rest = _drop_empty(rest)
    loop = KeyLoop(comp, wm=spec.wm, now_ms=spec.now_ms, strong=spec.strong)
    bloom, seen, bstats = _dedup(spec, iv, image, inp, old_ids)
    summary.update(bstats)
    loop.run(sorted(touched), inp, old, seen, old_ids.keys)
    summary["side"] = routed + loop.side
    summary.update(processed=loop.processed, duplicates=loop.duplicates, late=loop.late, fired=loop.fired,
                   n_prods=len(loop.prods), n_dead=len(loop.side), keys_written=loop.written, ids_expired=expired)
    if not comp.exactly_once:
        new_ids = None
    elif loop.all_ran:
        new_ids = inp.table.select(["key", "record_id"])
    else:
        new_ids = pa.table({"key": pa.array(loop.id_keys, pa.string()),
                            "record_id": pa.array(loop.id_values, pa.string())})
    new_rows = loop.rows.table(spec.rows_schema.remove(spec.rows_schema.get_field_index("record_ids")),
                               codec=loop.codec.name, sequencer=mine, commit_id=spec.commit_id,
                               now_ms=spec.now_ms, format_version=ROW_FORMAT_VERSION)
    fresh_tbl = _with_ids(new_rows, old_ids, new_ids, spec.now_ms, spec.rows_schema)
    parts = [rest, fresh_tbl]
    if loop.unchanged:
        same = sub.filter(pc.is_in(sub.column("key"), value_set=pa.array(loop.unchanged, pa.string())))
        same = _trim_ids(same, spec.horizon_ms)
        parts.append(_drop_empty(_without_pending(same) if has_pending else same))
    new_image = pa.concat_tables(parts).combine_chunks()
    # Step 4: write the files (invisible until the driver's commit).
    # (records of the interval in input files to record: the set moves even if all were duplicates)
    if loop.written or has_pending or dirty or expired or (spec.input_files and inp.runs):
        rel, size = write_interval_image(new_image, spec.rows_root, name, iv)
        _remember((rel,), new_image)
        if bloom is not None:  # the new image's ids: the old image's (a superset) and the new ones
            bloom.add_many(py_list(new_ids.column("record_id")) if new_ids is not None else [])
            if not bloom.full():
                _remember_bloom((rel,), bloom)
        summary.update(new_path=rel, new_size=size, new_rows=new_image.num_rows)
    summary["prod_files"] = _write_productions(spec, iv, loop.prods)
    summary["oldest_ms"], summary["next_proc_ms"] = oldest_work(new_image), next_processing(new_image, retention)
    return summary


def _route_late(comp: Computation, recs: Any, image: Any,
                horizon_ms: int | None) -> tuple[Any, list[dict[str, Any]]]:
    """``LatePolicy.ROUTE``, after dedup: (the records to run, the late records routed to the
    late-data table as side rows). A late record whose id its key's row holds (seen within the dedup
    horizon, as the key loop's dedup decides) is a retry of a
    record run on time: it stays, and the key loop drops it as a duplicate. A record twice in the
    batch is routed once."""
    import pyarrow.compute as pc

    late = pc.fill_null(recs.column("late"), False)
    if not pc.any(late).as_py():
        return recs, []
    route = late
    if comp.exactly_once:
        lkeys = pc.unique(recs.filter(late).column("key"))
        held = flat_ids(image.filter(pc.is_in(image.column("key"), value_set=lkeys)), horizon_ms).table
        if held.num_rows:
            pairs = pc.binary_join_element_wise(recs.column("key"), recs.column("record_id"), "\x00")
            old = pc.binary_join_element_wise(held.column("key"), held.column("record_id"), "\x00")
            route = pc.and_(late, pc.invert(pc.is_in(pairs, value_set=old)))
    side: list[dict[str, Any]] = []
    ids: set[str] = set()
    for r in recs.filter(route).to_pylist():
        if r["record_id"] not in ids:
            ids.add(r["record_id"])
            side.append(side_row("late", r, r["key"], None))
    return recs.filter(pc.invert(route)), side


def _without_pending(t: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    idx = t.schema.get_field_index("pending")
    field = t.schema.field(idx)
    empty = pa.ListArray.from_arrays(pa.array(np.zeros(t.num_rows + 1, dtype=np.int32)),
                                     pa.array([], field.type.value_type), type=field.type)
    return t.set_column(idx, field, empty)


def _trim_ids(t: Any, horizon_ms: int | None) -> Any:
    """``t`` with the record ids seen before ``horizon_ms`` dropped: the rows of keys not run in
    this batch keep only what the dedup horizon still needs, as the run keys' new rows do (no
    sender retries an older id). Vectorized; ``t`` itself when there is nothing to drop."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if horizon_ms is None or t.num_rows == 0:
        return t
    idx = t.schema.get_field_index("record_ids")
    field = t.schema.field(idx)
    lst = t.column(idx).combine_chunks()
    flat = pc.list_flatten(lst)
    if len(flat) == 0:
        return t
    keep = pc.greater_equal(flat.field("seen_ms"), horizon_ms)
    if pc.all(keep).as_py():
        return t
    parents = pc.list_parent_indices(lst).filter(keep).to_numpy()
    col = pa.ListArray.from_arrays(_offsets(parents, t.num_rows), flat.filter(keep), type=field.type,
                                   mask=lst.is_null() if lst.null_count else None)
    return t.set_column(idx, field, col)


def _offsets(parents: Any, n: int) -> Any:
    """List offsets for ``n`` lists from the (ascending) list index of each value (numpy ints)."""
    import numpy as np
    import pyarrow as pa

    counts = np.bincount(parents, minlength=n) if len(parents) else np.zeros(n, dtype=np.int64)
    return pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32), pa.int32())


@dataclass
class _Ids:
    """Flattened record ids of the touched rows: parallel key / record_id / seen_ms arrays.

    ``held``: all the rows hold; ``table``: those within the dedup horizon (the dedup lookup
    uses these, as ``run_key`` does, and the new rows keep them), of the ``keys``."""

    held: Any
    table: Any
    keys: set[str]


def flat_ids(sub: Any, horizon_ms: int | None) -> _Ids:
    """The record ids the rows ``sub`` hold, flattened (``.table``: those seen at ``horizon_ms`` or later)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lst = sub.column("record_ids").combine_chunks()
    if len(lst) == 0:
        empty = pa.table({"key": pa.array([], pa.string()), "record_id": pa.array([], pa.string()),
                          "seen_ms": pa.array([], pa.int64())})
        return _Ids(empty, empty, set())
    parents = pc.list_parent_indices(lst)
    flat = pc.list_flatten(lst)
    held = pa.table({"key": sub.column("key").combine_chunks().take(parents),
                     "record_id": flat.field("record_id"), "seen_ms": flat.field("seen_ms")})
    table = held if horizon_ms is None else held.filter(pc.greater_equal(held.column("seen_ms"), horizon_ms))
    return _Ids(held, table, set(py_list(pc.unique(table.column("key")))))


def _dedup(spec: ImageSpec, iv: int, image: Any, inp: Input,
           ids: _Ids) -> tuple[IdBloom | None, list[bool] | None, dict[str, int]]:
    """Step 1 of dedup (MillWheel's): the batch's record ids of this interval against the
    image's Bloom filter; only if one might have been seen, the exact lookup in the stored ids
    (:func:`already_seen`). Returns the filter, per input record whether its key's row holds
    its id (None: none does), and the filter's counts for the batch report."""
    stats = {"bloom_checked": 0, "bloom_maybe": 0, "bloom_false_pos": 0, "bloom_bytes": 0}
    if not spec.comp.exactly_once or not inp.keys:
        return None, None, stats
    bloom = _bloom(spec, iv, image)
    flags = bloom.might_contain_many(inp.ids)
    maybe = int(flags.sum())
    stats.update(bloom_checked=len(inp.ids), bloom_maybe=maybe, bloom_bytes=bloom.nbytes)
    if not maybe:  # certain: none of them was seen; the stored ids are not looked at
        return bloom, None, stats
    seen = already_seen(spec.comp, inp, ids, maybe=flags)
    stats["bloom_false_pos"] = maybe - (sum(seen) if seen else 0)
    return bloom, seen, stats


def _bloom(spec: ImageSpec, iv: int, image: Any) -> IdBloom:
    """The interval image's filter: cached in this worker, else built from the image's ids."""
    import pyarrow.compute as pc

    paths = tuple(sorted(spec.images.get(iv, ())))
    hit = _BLOOMS.get(paths)
    if hit is not None:
        _BLOOMS.move_to_end(paths)
        return hit
    ids = py_list(pc.struct_field(pc.list_flatten(image.column("record_ids")), "record_id"))
    bloom = IdBloom(max(2 * len(ids), BLOOM_MIN_CAPACITY), error_rate=BLOOM_ERROR_RATE)
    bloom.add_many(ids)
    _remember_bloom(paths, bloom)
    return bloom


def _remember_bloom(paths: tuple[str, ...], bloom: IdBloom) -> None:
    _BLOOMS[paths] = bloom
    _BLOOMS.move_to_end(paths)
    while len(_BLOOMS) > _CACHE_MAX:
        _BLOOMS.popitem(last=False)


def already_seen(comp: Computation, inp: Input, ids: _Ids, *, maybe: Any = None) -> list[bool] | None:
    """Per input record (in ``inp`` order): does the key's row already hold its id?

    ``maybe``: per input record, whether the Bloom filter might hold its id (a filter has no
    false negatives: the others were not seen). Given and few, the stored ids are scanned for
    those candidates alone (a hash set of a few ids, not of every stored one)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    held = ids.table  # within the dedup horizon
    if not comp.exactly_once or held.num_rows == 0 or not inp.keys:
        return None
    if maybe is not None and int(maybe.sum()) * 8 < held.num_rows:
        cand = np.flatnonzero(maybe).tolist()
        hit = pc.is_in(held.column("record_id"), value_set=pa.array([inp.ids[i] for i in cand], pa.string()))
        if not pc.any(hit).as_py():
            return None
        hits = held.filter(hit)
        pairs = set(zip(py_list(hits.column("key")), py_list(hits.column("record_id")), strict=True))
        seen = [False] * len(inp.ids)
        for i in cand:
            if (inp.keys[i], inp.ids[i]) in pairs:
                seen[i] = True
        return seen if any(seen) else None
    # ids alone first (no replays: the usual case), then (key, id) pairs
    if not pc.any(pc.is_in(inp.table.column("record_id"), value_set=held.column("record_id"))).as_py():
        return None
    pairs = pc.binary_join_element_wise(inp.table.column("key"), inp.table.column("record_id"), "\x00")
    old = pc.binary_join_element_wise(held.column("key"), held.column("record_id"), "\x00")
    hit = pc.is_in(pairs, value_set=old)
    return py_list(hit) if pc.any(hit).as_py() else None


def _with_ids(rows: Any, old: _Ids, new: Any | None, seen_ms: int, schema: Any) -> Any:
    """``rows`` (without record ids) + the record_ids column: retained old ids, then the ``new``
    ones (a key / record_id table; None: none)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    field = schema.field("record_ids")
    parts = [old.table]
    if new is not None and new.num_rows:
        parts.append(pa.table({"key": new.column("key"), "record_id": new.column("record_id"),
                               "seen_ms": pa.array(np.full(new.num_rows, seen_ms, dtype=np.int64))}))
    ids = pa.concat_tables(parts)
    pos = pc.index_in(ids.column("key"), value_set=rows.column("key"))
    ids = ids.append_column("pos", pos).append_column("seq", pa.array(np.arange(ids.num_rows), pa.int64()))
    ids = ids.filter(pc.is_valid(pos))
    ids = ids.take(pc.sort_indices(ids, sort_keys=[("pos", "ascending"), ("seq", "ascending")]))
    offsets = _offsets(ids.column("pos").to_numpy(), rows.num_rows)
    values = pa.StructArray.from_arrays([ids.column("record_id").combine_chunks(),
                                         ids.column("seen_ms").combine_chunks()], fields=list(field.type.value_type))
    col = pa.ListArray.from_arrays(offsets, values, type=field.type)
    out = rows.add_column(schema.get_field_index("record_ids"), field, col)
    return out.select(schema.names).cast(schema)


def expired_ids(image: Any, horizon_ms: int | None) -> int:
    """How many record ids of ``image`` were seen before ``horizon_ms`` (they leave it)."""
    import pyarrow.compute as pc

    if horizon_ms is None or image.num_rows == 0:
        return 0
    seen = pc.struct_field(pc.list_flatten(image.column("record_ids")), "seen_ms")
    return int(pc.sum(pc.less(seen, horizon_ms)).as_py() or 0)


def _retention_ms(comp: Computation) -> int | None:
    return comp.dedup_retention_ms() if comp.exactly_once else None


def _drop_empty(t: Any) -> Any:
    """``t`` without the rows that hold nothing any more (no state, timers, checkpointed
    productions, watermark hold or record ids): a key kept only for its ids, once they expired."""
    import pyarrow.compute as pc

    if t.num_rows == 0:
        return t
    empty = pc.and_kleene(pc.is_null(t.column("state")), pc.is_null(t.column("watermark_hold_ms")))
    for col in ("timers", "pending", "record_ids"):
        empty = pc.and_kleene(empty, pc.equal(pc.fill_null(pc.list_value_length(t.column(col)), 0), 0))
    empty = pc.and_kleene(empty, pc.not_equal(t.column("key"), FENCE_KEY))
    empty = pc.fill_null(empty, False)
    return t.filter(pc.invert(empty)) if pc.any(empty).as_py() else t


def holds(spec: ImageSpec, iv: int) -> bool:
    """Whether this worker holds interval ``iv``'s current image (no read from the store)."""
    return tuple(sorted(spec.images.get(iv, ()))) in _CACHE


def _load(spec: ImageSpec, iv: int) -> Any:
    import pyarrow as pa

    paths = tuple(sorted(spec.images.get(iv, ())))
    hit = _CACHE.get(paths)
    if hit is not None:
        _CACHE.move_to_end(paths)
        return hit
    parts = [_read_rows_file(spec.rows_root, p, spec.rows_schema) for p in paths]
    table = pa.concat_tables(parts) if parts else spec.rows_schema.empty_table()
    _remember(paths, table)
    return table


def _read_rows_file(root: TableFiles, rel: str, schema: Any) -> Any:
    """One rows file in ``schema``; a column the file does not have (written before the migration
    that added it, e.g. ``timer_seq``) is read as nulls, as Delta reads it."""
    import pyarrow as pa

    if root.is_local:
        have = set(root.read_schema(rel).names)
        t = root.read_parquet(rel, columns=[n for n in schema.names if n in have])
    else:  # one read of the object: its footer and the columns
        pf = root.parquet_file(rel)
        have = set(pf.schema_arrow.names)
        t = pf.read(columns=[n for n in schema.names if n in have])
    for i, f in enumerate(schema):
        if f.name not in have:
            t = t.add_column(i, f.name, pa.nulls(t.num_rows, f.type))
    return t.select(schema.names).cast(schema)


def _remember(paths: tuple[str, ...], table: Any) -> None:
    _CACHE[paths] = table
    _CACHE.move_to_end(paths)
    while len(_CACHE) > _CACHE_MAX:
        _CACHE.popitem(last=False)


def _write_productions(spec: ImageSpec, iv: int, prods: list[Any]) -> list[dict[str, Any]]:
    return write_production_files(prods, producer=spec.comp.name, commit_id=spec.commit_id, iv=iv,
                                  roots=spec.stream_roots, schema=spec.stream_schema,
                                  format_version=spec.stream_format_version)
