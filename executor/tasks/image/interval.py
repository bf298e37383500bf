"""The image path's per-interval run, in the tasks: one interval image in, one out (the driver commits)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deltawheel.statestore.rowtable.bloom import IdBloom
from deltawheel.statestore.rowtable.inputfiles import union_payloads
from deltawheel.statestore.rowtable.rows import FENCE_KEY, ROW_FORMAT_VERSION
from deltawheel.statestore.writepath.image import idsmerge
from deltawheel.statestore.writepath.image.files import (
    next_processing,
    oldest_work,
    write_interval_image,
    write_production_files,
    write_production_table,
)
from deltawheel.statestore.writepath.image.idhash import id_hashes
from deltawheel.statestore.writepath.image.idsfiles import (
    IdsFile,
    emptied,
    load_ids_file,
    pick_ids,
    split_legacy,
    within,
)
from deltawheel.statestore.writepath.image.summary import (
    Fenced,
    ImageFile,
    IntervalSummary,
    ProductionFile,
    SideRecord,
)

from ...computation import Computation
from ..usercode.columnar import ColumnarLoop, key_loop
from ..usercode.columns import Input, OldRows, py_list
from ..usercode.keys import KeyLoop
from .cache import keep_image, load_image
from .dedup import BloomCounts, bloom_paths, carry_bloom, dedup
from .ids import HeldIds, drop_empty, expired_ids, flat_ids, pair_hits, trim_ids, with_ids
from .spec import ImageSpec

__all__ = ["run_interval"]


@dataclass(kw_only=True)
class _Open:
    """An interval as :func:`_open` found it."""

    image: Any  # its state image, the ids an older image held in its rows taken out
    read: bool  # read from the store (this worker held no copy)
    legacy: Any  # those ids (key / record_id / seen_ms), moved to an ids file at the next write
    gone: list[IdsFile]  # its ids files past the dedup horizon: dropped whole
    live: list[IdsFile]  # the others
    dirty: bool  # a takeover's claim left a second fence row: the image is rewritten with one
    routed: list[SideRecord] = field(default_factory=list)  # late records routed to the late-data table


@dataclass(kw_only=True)
class _Ran:
    """What user code made of the interval's keys (:func:`_run_keys`, :func:`_new_image`)."""

    mask: Any  # which rows of the image are the run keys'
    sub: Any  # those rows
    old_ids: HeldIds  # the ids they hold
    loop: KeyLoop | ColumnarLoop
    new_ids: Any  # the ids run (key / record_id; None: not exactly-once)
    bloom: IdBloom | None
    checks: BloomCounts
    image: Any = None  # the new state image


def run_interval(spec: ImageSpec, iv: int, recs: Any) -> IntervalSummary:
    """Run interval ``iv`` of the batch on its records ``recs`` (Arrow, prepared columns)."""
    opened = _open(spec, iv)
    if isinstance(opened, Fenced):
        return IntervalSummary(interval=iv, fenced=opened)
    if iv in spec.late_raised and recs.num_rows:
        recs = late_behind(recs, spec.late_raised[iv])
    if spec.route_late and recs.num_rows:
        recs, opened.routed = _route_late(spec.comp, recs, opened.image, spec.horizon_ms, opened.live, opened.legacy)
    inp = Input(recs)
    run_keys = _keys_to_run(spec, opened.image, inp)
    has_pending = _holds_pending(opened.image)
    # ids past the dedup horizon: the image is rewritten without them even when no key runs
    expired = expired_ids(opened.image, spec.horizon_ms)
    migrate = opened.legacy.num_rows > 0
    if not run_keys and not has_pending and not opened.dirty and not expired and not opened.gone and not migrate:
        return IntervalSummary(interval=iv, side=tuple(opened.routed), images_read=int(opened.read),
                               oldest_ms=oldest_work(opened.image), pending_rows=0,
                               next_proc_ms=_next_proc(opened.image, opened.live, _retention_ms(spec.comp)))
    ran = _run_keys(spec, iv, opened, inp, run_keys, has_pending)
    # (records of the interval in input files to record: the set moves even if all were duplicates)
    rewrite = bool(ran.loop.written or has_pending or opened.dirty or expired or migrate
                   or (spec.input_files and inp.runs))
    written = _write_image(spec, iv, ran.image) if rewrite else None
    ids_all, taken = _write_ids(spec, iv, opened, inp, ran, migrate=migrate)
    if written is not None or ids_all or opened.gone:
        new_hashes = None if ran.new_ids is None else (
            inp.hashes if ran.loop.all_ran and inp.hashes is not None else id_hashes(ran.new_ids.column("record_id")))
        state = (written.path,) if written is not None else spec.state_files(iv)
        carry_bloom(ran.bloom, bloom_paths(spec, iv), tuple(sorted((*state, *(f.path for f in opened.live)))),
                    new_hashes)
    return _summary(spec, iv, opened, ran, written=written, ids_all=ids_all, taken=taken, expired=expired,
                    prods=_write_productions(spec, iv, ran.loop))


def late_behind(recs: Any, line: int) -> Any:
    """``recs`` with the records behind ``line`` flagged late too (an interval ahead of the batch's line)."""
    import pyarrow.compute as pc

    i = recs.schema.get_field_index("late")
    late = pc.or_(pc.fill_null(recs.column("late"), False),
                  pc.fill_null(pc.less(recs.column("timestamp_ms"), line), False))
    return recs.set_column(i, recs.schema.field("late"), late)


def _open(spec: ImageSpec, iv: int) -> _Open | Fenced:
    """Phase 1: the interval's image and ids files, its fence checked (:class:`Fenced` if not ours)."""
    image, read = load_image(spec, iv)
    # record ids apart from the state (``idsfiles.py``), and those an older image holds
    image, legacy = split_legacy(image, inline=spec.comp.exactly_once)
    ids_files = [load_ids_file(spec.rows_root, p) for p in spec.ids_files(iv)]
    gone = [f for f in ids_files if spec.horizon_ms is not None and f.written_ms < spec.horizon_ms]
    fenced = _fence(spec, iv, image)
    if isinstance(fenced, Fenced):
        return fenced
    image, dirty = fenced
    return _Open(image=image, read=read, legacy=legacy, gone=gone, live=[f for f in ids_files if f not in gone],
                 dirty=dirty)


def _fence(spec: ImageSpec, iv: int, image: Any) -> tuple[Any, bool] | Fenced:
    """(the image with one fence row carrying our sequencer, whether a second one was dropped)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    fmask = pc.equal(image.column("key"), FENCE_KEY)
    fences = image.filter(fmask)
    fence = fences.column("sequencer").to_pylist()
    mine = spec.sequencers[iv]
    if not fence or max(fence) != mine:
        return Fenced(spec.comp.name, max(fence) if fence else None, mine)
    dirty = len(fence) > 1  # a takeover's claim left a second fence row: keep one
    if not dirty and not spec.input_files:
        return image, False
    kept = fences.slice(pc.index(fences.column("sequencer"), mine).as_py(), 1)
    files = union_payloads(fences.column("state").to_pylist(), spec.input_files)
    kept = kept.set_column(kept.schema.get_field_index("state"), kept.schema.field("state"),
                           pa.array([files], kept.schema.field("state").type))
    return pa.concat_tables([image.filter(pc.invert(fmask)), kept]).combine_chunks(), dirty


def _keys_to_run(spec: ImageSpec, image: Any, inp: Input) -> list[str]:
    """Phase 3: the keys with records and the keys with due timers, merged in key order."""
    import pyarrow.compute as pc

    due = pc.less_equal(image.column("next_processing_timer_ms"), spec.now_ms)
    if spec.wm is not None:
        due = pc.or_kleene(due, pc.less(image.column("next_event_timer_ms"), spec.wm))
    due = pc.fill_null(due, False)
    if not pc.any(due).as_py():
        return list(inp.runs)
    return sorted(set(inp.runs).union(py_list(image.column("key").filter(due))))


def _holds_pending(image: Any) -> bool:
    """Whether a row of ``image`` holds checkpointed productions (the batch clears them)."""
    import pyarrow.compute as pc

    return bool(pc.any(pc.greater(pc.fill_null(pc.list_value_length(image.column("pending")), 0), 0)).as_py())


def _run_keys(spec: ImageSpec, iv: int, opened: _Open, inp: Input, run_keys: list[str], has_pending: bool) -> _Ran:
    """Phase 4: user code per key after the dedup, and the new image (record ids stay in Arrow)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    image = opened.image
    mask = pc.is_in(image.column("key"), value_set=pa.array(run_keys, pa.string()))
    sub = image.filter(mask)
    old_ids = flat_ids(sub, spec.horizon_ms)
    loop = key_loop(spec.comp, inp, sub, wm=spec.wm, wm_late=spec.records_watermark(iv), now_ms=spec.now_ms,
                    strong=spec.strong)
    bloom, seen, checks = dedup(spec, iv, image, inp, old_ids, opened.live, opened.legacy)
    loop.run(run_keys, inp, OldRows(sub, with_pending=has_pending), seen)
    if not spec.comp.exactly_once:
        new_ids = None
    elif loop.all_ran:
        new_ids = inp.table.select(["key", "record_id"])
    else:
        new_ids = pa.table({"key": pa.array(loop.id_keys, pa.string()),
                            "record_id": pa.array(loop.id_values, pa.string())})
    ran = _Ran(mask=mask, sub=sub, old_ids=old_ids, loop=loop, new_ids=new_ids, bloom=bloom, checks=checks)
    ran.image = _new_image(spec, iv, image, ran, has_pending)
    return ran


def _new_image(spec: ImageSpec, iv: int, image: Any, ran: _Ran, has_pending: bool) -> Any:
    """The interval's new image; ids past the horizon, empty rows and delivered checkpoints dropped."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rest = trim_ids(image.filter(pc.invert(ran.mask)), spec.horizon_ms)
    if has_pending:
        rest = emptied(rest, "pending")
    schema = spec.rows_schema
    new_rows = ran.loop.rows.table(schema.remove(schema.get_field_index("record_ids")), sequencer=spec.sequencers[iv],
                                   commit_id=spec.commit_id, now_ms=spec.now_ms, format_version=ROW_FORMAT_VERSION)
    parts = [drop_empty(rest), with_ids(new_rows, ran.old_ids, schema)]
    if ran.loop.unchanged:
        sub = ran.sub
        same = trim_ids(sub.filter(pc.is_in(sub.column("key"), value_set=pa.array(ran.loop.unchanged, pa.string()))),
                        spec.horizon_ms)
        parts.append(drop_empty(emptied(same, "pending") if has_pending else same))
    return pa.concat_tables(parts).combine_chunks()


def _write_image(spec: ImageSpec, iv: int, image: Any) -> ImageFile:
    """Phase 5: the new image as one file (invisible until the driver's commit), kept by this worker."""
    written = write_interval_image(image, spec.rows_root, spec.comp.name, iv)
    keep_image((written.path,), image, spec.comp.name, iv, written=True)
    return written


def _write_ids(spec: ImageSpec, iv: int, opened: _Open, inp: Input, ran: _Ran, *,
               migrate: bool) -> tuple[list[tuple[ImageFile, IdsFile]], list[IdsFile]]:
    """Phase 5: the batch's ids file, the next compaction prepared; (files written, live files taken in)."""
    batch = idsmerge.IdsBatch(rows_root=spec.rows_root, schema=spec.rows_schema, computation=spec.comp.name,
                              interval=iv, sequencer=spec.sequencers[iv], commit_id=spec.commit_id,
                              now_ms=spec.now_ms, horizon_ms=spec.horizon_ms)
    retention = _retention_ms(spec.comp)
    ids_all: list[tuple[ImageFile, IdsFile]] = []
    taken: list[IdsFile] = []
    fresh = ran.new_ids if ran.new_ids is not None and ran.new_ids.num_rows else None
    if fresh is not None or migrate:
        # the input's hashes are the batch's own ids' (in their order) when every record ran
        hashes = inp.hashes if fresh is not None and ran.loop.all_ran else None
        ids_all, left = idsmerge.write_batch_ids(batch, fresh, opened.legacy, opened.live, retention, hashes)
        taken = [f for f in opened.live if f not in left]
        opened.live = [*left, *(f for _, f in ids_all)]
    idsmerge.prepare_next(batch, opened.live, retention)
    return ids_all, taken


def _write_productions(spec: ImageSpec, iv: int, loop: KeyLoop | ColumnarLoop) -> tuple[list[ProductionFile], int]:
    """Phase 5: the productions, one file per stream; (the files, how many productions)."""
    common: dict[str, Any] = {"producer": spec.comp.name, "commit_id": spec.commit_id, "iv": iv,
                              "roots": spec.stream_roots, "schema": spec.stream_schema,
                              "format_version": spec.stream_format_version}
    if isinstance(loop, ColumnarLoop):  # the columnar path's productions: a table, no tuple per production
        return write_production_table(loop.prod_table, **common), loop.prod_table.num_rows
    return write_production_files(loop.prods, **common), len(loop.prods)


def _summary(spec: ImageSpec, iv: int, opened: _Open, ran: _Ran, *, written: ImageFile | None,
             ids_all: list[tuple[ImageFile, IdsFile]], taken: list[IdsFile], expired: int,
             prods: tuple[list[ProductionFile], int]) -> IntervalSummary:
    """Phase 6: what the task returns for the interval."""
    loop, checks = ran.loop, ran.checks
    return IntervalSummary(interval=iv, image=written, ids_file=ids_all[0][0] if ids_all else None,
                           ids_merged=ids_all[1][0] if len(ids_all) > 1 else None,
                           ids_removed=tuple(f.path for f in (*opened.gone, *taken)),
                           prod_files=tuple(prods[0]), side=(*opened.routed, *loop.side),
                           processed=loop.processed, duplicates=loop.duplicates, fired=loop.fired,
                           late=loop.late, n_prods=prods[1], n_dead=len(loop.side), keys_written=loop.written,
                           ids_expired=expired + sum(f.flat.num_rows for f in opened.gone),
                           keys_expired=loop.keys_expired, oldest_ms=oldest_work(ran.image),
                           next_proc_ms=_next_proc(ran.image, opened.live, _retention_ms(spec.comp)),
                           pending_rows=int(_holds_pending(ran.image)), images_read=int(opened.read),
                           bloom_checked=checks.checked,
                           bloom_maybe=checks.maybe, bloom_false_pos=checks.false_pos,
                           bloom_bytes=checks.nbytes)


def _route_late(comp: Computation, recs: Any, image: Any, horizon_ms: int | None,
                live: list[IdsFile], legacy: Any) -> tuple[Any, list[SideRecord]]:
    """Phase 2 (``LatePolicy.ROUTE``): (the records to run, the late ones routed; retries stay)."""
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
        apart = pick_ids(live, lids, id_hashes(lids), legacy)
        if apart.num_rows:
            held = pa.concat_tables([held, within(apart, horizon_ms)])
        if held.num_rows:
            route = pc.and_(late, pc.invert(pair_hits(recs, held)))
    side: list[SideRecord] = []
    ids: set[str] = set()
    for r in recs.filter(route).to_pylist():
        if r["record_id"] not in ids:
            ids.add(r["record_id"])
            side.append(SideRecord.of_input("late", r, r["key"], None))
    return recs.filter(pc.invert(route)), side


def _retention_ms(comp: Computation) -> int | None:
    return comp.dedup_retention_ms() if comp.exactly_once else None


def _next_proc(image: Any, live: list[IdsFile], retention_ms: int | None) -> int | None:
    """:func:`next_processing` of the state image and the ids files (each leaves the horizon whole)."""
    first = next_processing(image, retention_ms)
    if retention_ms is not None and live:
        drop = min(f.written_ms for f in live) + retention_ms + 1
        first = drop if first is None else min(first, drop)
    return first
