"""The image path's per-interval run, in the tasks: one interval image in, one out.

A task (``task.py``) hands :func:`run_task` the batch's prepared records of some intervals (plus
one marker row per interval it runs, so intervals with only due timers run too) and the
:class:`ImageSpec` of the batch. Per interval it

1. loads the image (Parquet, cached per Python worker by file path: files
   are immutable, so a cached image is never stale) and checks the fence row
   carries this writer's sequencer — a takeover is noticed before user code: the
   interval's summary says so (``fenced``) and the task runs nothing more;
2. picks the keys to run: keys with records, keys with due timers;
3. runs user code per key (the key loop, ``keys.py``, through ``keyrun.UserCode``:
   dedup, records in event-time order, timers in timestamp order) and clears
   delivered checkpoints; dedup asks the interval's Bloom filter first (kept
   per worker next to the cached image, built from the image on a miss): only
   when a record's id *might* have been seen are the stored ids looked at
   (``ids.py``);
4. writes the new image as one Parquet file in the interval's partition
   folder — with delta files on (``spec.deltas``), only the rows of the keys the batch changed,
   the older rows of those keys marked deleted in the older files (``deltas.py``), unless the
   compaction rule says to rewrite the interval whole — and the new productions as one file per stream in the stream
   table's folder, with the write path's writers
   (``statestore/writepath/image/files.py``) — neither is visible until the driver
   commits it; on S3 the uploads run in the background and the task waits
   for all of them before it returns its summaries;
5. returns one :class:`~deltawheel.statestore.writepath.image.summary.IntervalSummary`
   per interval (new files, counts, oldest work; or the fence it met: the driver's
   ``collect`` raises StaleViewError for it).

Nothing here talks to ZooKeeper or the Delta log; the driver commits. The phases of one
interval's run are here; the file layout is in ``deltas.py``, the dedup (Bloom filters, exact
lookup) in ``dedup.py``, the record ids in ``ids.py`` / ``idsfiles.py``, the batch's ids files and
their compaction in ``idsmerge.py``.
"""

from __future__ import annotations

import gc
import json
import os
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from deltawheel.statestore.delta.storefs import TableFiles, background_uploads
from deltawheel.statestore.rowtable.inputfiles import union_payloads
from deltawheel.statestore.rowtable.rows import FENCE_KEY, ROW_FORMAT_VERSION
from deltawheel.statestore.writepath.image.files import (
    is_ids_path,
    next_processing,
    oldest_work,
    write_interval_image,
    write_production_files,
)
from deltawheel.statestore.writepath.image.summary import (
    Fenced,
    ImageFile,
    IntervalSummary,
    ProductionFile,
    SideRecord,
)

from ...computation import Computation
from ..keyrun import AS_INPUT, SameAsInput
from . import idsmerge
from .cache import ImageCache, image_facts, max_bytes_from_env, trace, traced_folder
from .capture import capture, capture_folder
from .columnar import ColumnarLoop, key_loop
from .dedup import _BLOOMS, bloom_key, cached_bloom, dedup, remember_bloom
from .deltas import Placement, changed_keys, plan_delta, read_state, token, whole_placement
from .idhash import id_hashes
from .ids import drop_empty, expired_ids, flat_ids, trim_ids, with_ids
from .idsfiles import (
    IdsFile,
    ids_apart,
    load_ids_file,
    pick_ids,
    split_legacy,
    within,
)
from .keys import Input, OldRows, py_list
from .prodcols import write_production_table

__all__ = ["ImageSpec", "holds", "run_task", "bloom_paths", "cached_bloom", "remember_bloom"]

# the worker's images, bounded by bytes and evicted window-aware (``cache.py``)
_CACHE = ImageCache(max_bytes_from_env())
_TRACED = traced_folder()  # DELTAWHEEL_IMAGE_CACHE_TRACE: record the lookups (``deltawheel bench cache --trace``)


@dataclass(frozen=True)
class ImageSpec:
    """Everything a task needs, as plain values (pickled to the workers)."""

    comp: Computation
    rows_root: TableFiles  # the rows table's folder
    images: Mapping[int, tuple[str, ...]]  # interval -> relative (decoded) paths of its live files
    sequencers: Mapping[int, int]
    stream_roots: Mapping[str, TableFiles]
    wm: int | None  # the timers' watermark
    now_ms: int
    horizon_ms: int | None
    commit_id: str
    rows_schema: Any  # pyarrow schema of the rows files (no partition columns)
    stream_schema: Any
    stream_format_version: int
    route_late: bool
    summary_schema: Any  # pyarrow schema of the summaries (``SUMMARY_DDL``)
    strong: bool  # checkpoint the productions in the rows (strong, or a weak batch's straggler re-run)
    input_files: tuple[str, ...] = ()  # the batch's input files: added to each rewritten fence row's set
    dvs: Mapping[str, Any] = field(default_factory=dict)  # path -> its deletion vector (files that have one)
    deltas: bool = False  # write only the changed rows of an interval (``deltas.py``), else whole images
    # the records' watermark: the one before the batch's input (lateness; ``keyrun.UserCode``)
    wm_late: int | None | SameAsInput = AS_INPUT


def run_task(spec: ImageSpec, table: Any) -> list[IntervalSummary]:
    """:func:`_run` without cyclic garbage collection (and with a profile when asked)."""
    # no cyclic garbage collection while the task runs: it allocates ~10 objects per record,
    # which triggers collections that traverse every tracked object (the cached images
    # included), 15-35 % of the task function's time; nearly all of it is freed by reference
    # counting anyway, and the collector resumes (and catches up) when the task ends
    folder = capture_folder()  # DELTAWHEEL_TASK_CAPTURE: the task's spec and input, to replay it
    if folder:
        capture(folder, spec, table)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if os.environ.get("DELTAWHEEL_TASK_PROFILE"):  # a folder: one cProfile file per task
            import cProfile
            prof = cProfile.Profile()
            out = prof.runcall(_run, spec, table)
            os.makedirs(os.environ["DELTAWHEEL_TASK_PROFILE"], exist_ok=True)
            prof.dump_stats(os.path.join(os.environ["DELTAWHEEL_TASK_PROFILE"], f"task-{uuid.uuid4().hex}.prof"))
        else:
            out = _run(spec, table)
    finally:
        if was_enabled:
            gc.enable()
    return out


def _run(spec: ImageSpec, table: Any) -> list[IntervalSummary]:
    """One task: the input rows (Arrow, prepared columns + interval + marker flag) of some intervals."""
    import pyarrow.compute as pc

    marker = pc.fill_null(table.column("_m"), False)
    ivs = set(table.column("interval").filter(marker).to_pylist())
    records = table.num_rows - len(ivs)
    if not pc.any(marker.slice(0, records)).as_py():  # the markers trail the records (the direct read's
        data = table.slice(0, records)                # tables): the records without a copy
    else:
        data = table.filter(pc.invert(marker))
    counted = data.num_rows
    lo = hi = None
    bad = pc.is_valid(data.column("_bad"))
    any_bad = bool(counted) and pc.any(bad).as_py()
    if counted:  # the event times the injectors' watermarks see: of the records that are no dead letters
        ts = data.column("timestamp_ms")
        mm = pc.min_max(ts.filter(pc.invert(bad)) if any_bad else ts)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
    side: list[SideRecord] = []
    if any_bad:
        side += [SideRecord.of_input("dead", r, r["key"], r["_bad"]) for r in data.filter(bad).to_pylist()]
        data = data.filter(pc.invert(bad))
    with_data: list[int] = py_list(pc.unique(data.column("interval"))) if data.num_rows else []
    ivs |= set(with_data)
    out = []
    # the S3 PUTs of each interval's files overlap the next interval's work; the summary (and
    # so the driver's commit naming the files) waits for all of them at the block's end
    with background_uploads():
        for iv in sorted(i for i in ivs if i in spec.sequencers):
            if len(with_data) == 1:  # the usual task: one interval's records, nothing to filter
                recs = data if iv == with_data[0] else data.slice(0, 0)
            else:
                recs = data.filter(pc.equal(data.column("interval"), iv)) if data.num_rows else data
            out.append(_interval(spec, iv, recs))
            if out[-1].fenced is not None:  # taken over: the batch cannot commit, run nothing more
                break
    # the task's input counts and its dead / late records ride on its first summary
    head = out[0] if out else IntervalSummary(None)
    return [replace(head, records_in=counted, obs_min=lo, obs_max=hi, side=(*side, *head.side)), *out[1:]]


def _interval(spec: ImageSpec, iv: int, recs: Any) -> IntervalSummary:
    import pyarrow as pa
    import pyarrow.compute as pc

    comp = spec.comp
    name = comp.name
    read = not holds(spec, iv) and bool(_state_paths(spec, iv))
    image, place = _load(spec, iv)
    apart = comp.exactly_once and ids_apart()
    # record ids apart from the state (``idsfiles.py``): the interval's ids files, and the ids an
    # older image holds in its state (moved to an ids file when the interval is next written)
    image, legacy = split_legacy(image, inline=apart)
    ids_files = [load_ids_file(spec.rows_root, p) for p in sorted(spec.images.get(iv, ())) if is_ids_path(p)]
    gone = [f for f in ids_files if spec.horizon_ms is not None and f.written_ms < spec.horizon_ms]
    live = [f for f in ids_files if f not in gone]
    # Phase 1: the fence row must carry our sequencer.
    keys = image.column("key")
    fence = image.filter(pc.equal(keys, FENCE_KEY)).column("sequencer").to_pylist()
    mine = spec.sequencers[iv]
    if not fence or max(fence) != mine:
        return IntervalSummary(iv, fenced=Fenced(name, max(fence) if fence else None, mine))
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
    routed: list[SideRecord] = []
    if spec.route_late and recs.num_rows:
        recs, routed = _route_late(comp, recs, image, spec.horizon_ms, live, legacy)
    # Phase 2: keys to run.
    due = pc.less_equal(image.column("next_processing_timer_ms"), spec.now_ms)
    if spec.wm is not None:
        due = pc.or_kleene(due, pc.less(image.column("next_event_timer_ms"), spec.wm))
    due = pc.fill_null(due, False)
    inp = Input(recs)
    touched = set(inp.runs)
    run_keys = list(inp.runs)  # sorted (the input is sorted by key), then the due keys without records
    if pc.any(due).as_py():
        more = sorted(set(py_list(keys.filter(due))) - touched)  # the key column alone, not the rows
        if more:
            touched.update(more)
            run_keys += more
            run_keys.sort()  # two sorted runs: merged in one pass
    has_pending = bool(pc.any(pc.greater(pc.fill_null(pc.list_value_length(image.column("pending")), 0), 0))
                       .as_py())
    # ids past the dedup horizon: the image is rewritten without them even when none of its keys
    # runs (a key never seen again must not keep its ids, nor its row for them, forever)
    expired = expired_ids(image, spec.horizon_ms)
    retention = _retention_ms(comp)
    migrate = legacy.num_rows > 0
    if not touched and not has_pending and not dirty and not expired and not gone and not migrate:
        return IntervalSummary(iv, side=tuple(routed), images_read=int(read), oldest_ms=oldest_work(image),
                               next_proc_ms=_next_proc(image, live, retention))
    # Phase 3: user code per key (the key loop). Record ids (the bulk of a row) stay in Arrow:
    # the duplicates are found with one vectorized lookup, the new lists are assembled below.
    mask = pc.is_in(keys, value_set=pa.array(run_keys, pa.string()))
    sub = image.filter(mask)
    old_ids = flat_ids(sub, spec.horizon_ms)
    old = OldRows(sub, with_pending=has_pending)
    rest = trim_ids(image.filter(pc.invert(mask)), spec.horizon_ms)
    if has_pending:
        rest = _without_pending(rest)
    rest = drop_empty(rest)
    wm_late = spec.wm if isinstance(spec.wm_late, SameAsInput) else spec.wm_late
    loop = key_loop(comp, inp, sub, wm=spec.wm, wm_late=wm_late, now_ms=spec.now_ms, strong=spec.strong,
                    id_rows=not apart)
    bloom, seen, checks = dedup(spec, iv, image, inp, old_ids, live, legacy, state_paths=_state_paths(spec, iv))
    loop.run(run_keys, inp, old, seen, old_ids.keys)
    if not comp.exactly_once:
        new_ids = None
    elif loop.all_ran:
        new_ids = inp.table.select(["key", "record_id"])
    else:
        new_ids = pa.table({"key": pa.array(loop.id_keys, pa.string()),
                            "record_id": pa.array(loop.id_values, pa.string())})
    new_rows = loop.rows.table(spec.rows_schema.remove(spec.rows_schema.get_field_index("record_ids")),
                               sequencer=mine, commit_id=spec.commit_id,
                               now_ms=spec.now_ms, format_version=ROW_FORMAT_VERSION)
    fresh_tbl = with_ids(new_rows, old_ids, None if apart else new_ids, spec.now_ms, spec.rows_schema)
    parts = [rest, fresh_tbl]
    if loop.unchanged:
        same = sub.filter(pc.is_in(sub.column("key"), value_set=pa.array(loop.unchanged, pa.string())))
        same = trim_ids(same, spec.horizon_ms)
        parts.append(drop_empty(_without_pending(same) if has_pending else same))
    new_image = pa.concat_tables(parts).combine_chunks()
    # Phase 4: write the files (invisible until the driver's commit).
    # (records of the interval in input files to record: the set moves even if all were duplicates)
    written: ImageFile | None = None
    dvs: tuple[tuple[str, dict[str, Any]], ...] = ()
    delta = False
    state_paths = _state_paths(spec, iv)
    if loop.written or has_pending or dirty or expired or migrate or (spec.input_files and inp.runs):
        # with delta files on: only the changed keys' rows (new rows, cleared checkpoints, the
        # fence row); rows whose inline ids expire or move out are not tracked: rewritten whole
        plan = None if not spec.deltas or expired or migrate else \
            plan_delta(place, new_image, changed_keys(fresh_tbl, image, has_pending, dirty or bool(spec.input_files)))
        if plan is None:
            written = write_interval_image(new_image, spec.rows_root, name, iv)
            place = whole_placement(written.path, new_image)
        else:
            delta, dvs = True, plan.write_vectors(spec.rows_root)
            if plan.rows.num_rows:
                written = write_interval_image(plan.rows, spec.rows_root, name, iv)
            place = plan.placement(written.path if written is not None else None)
        now_dvs = {**spec.dvs, **dict(dvs)}
        state_paths = tuple(sorted(token(p, None if plan is None else now_dvs.get(p)) for p in place.files))
        _remember(state_paths, new_image, place, name, iv, written=True)
    ids_written, taken = None, []
    ids_all: list[tuple[ImageFile, IdsFile]] = []
    fresh_ids = new_ids if apart and new_ids is not None and new_ids.num_rows else None
    if fresh_ids is not None or migrate:
        # the input's hashes are the batch's own ids' (in their order) when every record ran
        fresh_hashes = inp.hashes if fresh_ids is not None and loop.all_ran else None
        ids_all, live = idsmerge.write_batch_ids(spec, iv, fresh_ids, legacy, live, retention, fresh_hashes)
        ids_written = ids_all[0]
        taken = [f for f in ids_files if f not in gone and f not in live]
        live = [*live, *(f for _, f in ids_all)]
    if apart:
        idsmerge.prepare_next(spec, iv, live, retention)
    if bloom is None and (written is not None or ids_written is not None or gone):
        # no input: no new id, the new files hold a subset of the old files' ids (expired ones
        # leave): the old files' filter (if this worker has it) serves them, not rebuilt next batch
        bloom = _BLOOMS.get(tuple(sorted((*_state_paths(spec, iv), *(f.path for f in ids_files)))))
    if bloom is not None and (written is not None or ids_written is not None or gone):
        # the new files' ids: the old ones (a superset) and the new ones
        if new_ids is not None and loop.all_ran and inp.hashes is not None:  # new_ids: the input's, in its order
            bloom.add_many(inp.hashes, hashes=inp.hashes)
        elif new_ids is not None:
            hashes = id_hashes(new_ids.column("record_id"))
            bloom.add_many(hashes, hashes=hashes)
        if not bloom.full():
            remember_bloom(tuple(sorted((*state_paths, *(f.path for f in live)))), bloom)
    if isinstance(loop, ColumnarLoop):  # the columnar path's productions: a table, no tuple per production
        prod_files = write_production_table(loop.prod_table, producer=name, commit_id=spec.commit_id, iv=iv,
                                            roots=spec.stream_roots, schema=spec.stream_schema,
                                            format_version=spec.stream_format_version)
        n_prods = loop.prod_table.num_rows
    else:
        prod_files, n_prods = _write_productions(spec, iv, loop.prods), len(loop.prods)
    return IntervalSummary(
        iv, image=written, delta=delta, dvs=tuple((p, json.dumps(d)) for p, d in dvs), ids_file=ids_written[0] if ids_written else None,
        ids_merged=ids_all[1][0] if ids_written and len(ids_all) > 1 else None,
        ids_removed=tuple(f.path for f in (*gone, *taken)), prod_files=tuple(prod_files),
        side=(*routed, *loop.side), processed=loop.processed,
        duplicates=loop.duplicates, fired=loop.fired, late=loop.late, n_prods=n_prods, n_dead=len(loop.side),
        keys_written=loop.written, ids_expired=expired + sum(f.flat.num_rows for f in gone),
        keys_expired=loop.keys_expired, oldest_ms=oldest_work(new_image),
        next_proc_ms=_next_proc(new_image, live, retention), images_read=int(read), bloom_checked=checks.checked,
        bloom_maybe=checks.maybe, bloom_false_pos=checks.false_pos, bloom_bytes=checks.nbytes)


def _route_late(comp: Computation, recs: Any, image: Any, horizon_ms: int | None,
                live: list[IdsFile], legacy: Any) -> tuple[Any, list[SideRecord]]:
    """``LatePolicy.ROUTE``, after dedup: (the records to run, the late records routed to the
    late-data table as side records). A late record whose id its key's row holds (seen within the dedup
    horizon, as the key loop's dedup decides) is a retry of a
    record run on time: it stays, and the key loop drops it as a duplicate. A record twice in the
    batch is routed once."""
    import pyarrow as pa
    import pyarrow.compute as pc

    late = pc.fill_null(recs.column("late"), False)
    if not pc.any(late).as_py():
        return recs, []
    route = late
    if comp.exactly_once:
        lrecs = recs.filter(late)
        lkeys = pc.unique(lrecs.column("key"))
        held = flat_ids(image.filter(pc.is_in(image.column("key"), value_set=lkeys)), horizon_ms).table
        # of the ids files, only the rows of the late records' ids can match (their hash buckets)
        lids = lrecs.column("record_id").combine_chunks()
        apart = pick_ids(live, lids, id_hashes(lids))
        if legacy.num_rows:
            apart = pa.concat_tables([apart, legacy.filter(pc.is_in(legacy.column("record_id"), value_set=lids))])
        if apart.num_rows:
            held = pa.concat_tables([held, within(apart, horizon_ms)])
        if held.num_rows:
            pairs = pc.binary_join_element_wise(recs.column("key"), recs.column("record_id"), "\x00")
            old = pc.binary_join_element_wise(held.column("key"), held.column("record_id"), "\x00")
            route = pc.and_(late, pc.invert(pc.is_in(pairs, value_set=old)))
    side: list[SideRecord] = []
    ids: set[str] = set()
    for r in recs.filter(route).to_pylist():
        if r["record_id"] not in ids:
            ids.add(r["record_id"])
            side.append(SideRecord.of_input("late", r, r["key"], None))
    return recs.filter(pc.invert(route)), side


def _without_pending(t: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    idx = t.schema.get_field_index("pending")
    field = t.schema.field(idx)
    empty = pa.ListArray.from_arrays(pa.array(np.zeros(t.num_rows + 1, dtype=np.int32)),
                                     pa.array([], field.type.value_type), type=field.type)
    return t.set_column(idx, field, empty)


def bloom_paths(spec: ImageSpec, iv: int) -> tuple[str, ...]:
    """What interval ``iv``'s Bloom filter is cached by (``dedup.bloom_key``): its state and ids files."""
    return bloom_key(_state_paths(spec, iv), spec.images.get(iv, ()))


def _retention_ms(comp: Computation) -> int | None:
    return comp.dedup_retention_ms() if comp.exactly_once else None


def holds(spec: ImageSpec, iv: int) -> bool:
    """Whether this worker holds interval ``iv``'s current image (no read from the store)."""
    return _state_paths(spec, iv) in _CACHE


def _state_files(spec: ImageSpec, iv: int) -> tuple[str, ...]:
    """The interval's live files but its ids files: its state image."""
    return tuple(sorted(p for p in spec.images.get(iv, ()) if not is_ids_path(p)))


def _state_paths(spec: ImageSpec, iv: int) -> tuple[str, ...]:
    """The interval's state files with their deletion vectors (:func:`~.deltas.token`): the cache key."""
    return tuple(token(p, spec.dvs.get(p)) for p in _state_files(spec, iv))


def _next_proc(image: Any, live: list[IdsFile], retention_ms: int | None) -> int | None:
    """:func:`next_processing` of the state image and the ids files (each leaves the horizon whole)."""
    first = next_processing(image, retention_ms)
    if retention_ms is not None and live:
        drop = min(f.written_ms for f in live) + retention_ms + 1
        first = drop if first is None else min(first, drop)
    return first


def _load(spec: ImageSpec, iv: int) -> tuple[Any, Placement]:
    """The interval's state image (its files' live rows) and where its rows sit (cached per worker)."""
    paths = _state_paths(spec, iv)
    name = spec.comp.name
    _CACHE.observe(name, spec.wm)
    hit = _CACHE.get(paths, slot=(name, iv), count=bool(paths))
    if hit is None:
        table, place = read_state(spec.rows_root, _state_files(spec, iv), spec.dvs, read=_read_rows_file,
                                  schema=spec.rows_schema)
        _remember(paths, table, place, name, iv)
    else:
        table, place = hit
    if _TRACED:
        trace({"op": "get", "comp": name, "iv": iv, "paths": list(paths), "hit": hit is not None, "wm": spec.wm,
               "bytes": table.nbytes, "next_ev": image_facts(table)}, traced=_TRACED)
    return table, place


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


def _remember(paths: tuple[str, ...], table: Any, place: Placement, comp: str, iv: int, *,
              written: bool = False) -> None:
    next_ev = image_facts(table)
    _CACHE.put(paths, (table, place), nbytes=table.nbytes + place.nbytes, next_ev=next_ev, slot=(comp, iv),
               group=comp)
    if written:
        trace({"op": "put", "comp": comp, "iv": iv, "paths": list(paths), "bytes": table.nbytes, "next_ev": next_ev},
              traced=_TRACED)


def _write_productions(spec: ImageSpec, iv: int, prods: list[Any]) -> list[ProductionFile]:
    return write_production_files(prods, producer=spec.comp.name, commit_id=spec.commit_id, iv=iv,
                                  roots=spec.stream_roots, schema=spec.stream_schema,
                                  format_version=spec.stream_format_version)
