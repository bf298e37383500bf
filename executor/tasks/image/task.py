"""The image path's Spark tasks: what each task runs, and which of the batch's intervals.

On a ``local`` master the tasks claim intervals one at a time, preferring those their worker caches."""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from deltawheel.statestore.delta.storefs import background_uploads
from deltawheel.statestore.writepath import StaleViewError
from deltawheel.statestore.writepath.image.summary import BatchOutput, IntervalSummary, SideRecord

from ..usercode.columns import py_list
from .cache import holds
from .capture import capture, capture_folder
from .direct import BatchReader, DirectBatch, marker_rows
from .interval import run_interval
from .kafkaread import KafkaRows
from .spec import ImageSpec

__all__ = ["TaskJob", "image_task_fn", "task_job", "collect", "run_task", "run_intervals",
           "ClaimBoard", "ClaimError", "claim_board", "claimed_intervals", "drop_board"]


@dataclass(frozen=True)
class TaskJob:
    """A batch whose tasks need no input rows from Spark: one RDD task per partition."""

    rdd: Any
    board: ClaimBoard | None = None  # the tasks claim their intervals (below); removed after the job
    intervals: tuple[int, ...] = ()  # with a board: each must have exactly one summary


def image_task_fn(spec: ImageSpec) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The image job's ``mapInArrow`` function: :func:`run_task` on a task's rows."""
    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from ..worker import freeze_spark_zips

        freeze_spark_zips()
        got = list(batches)
        if not got or not any(b.num_rows for b in got):
            return
        out = run_task(spec, pa.Table.from_batches(got))
        yield pa.RecordBatch.from_pylist([s.to_row() for s in out], schema=spec.summary_schema)

    return fn


def task_job(sc: Any, spec: ImageSpec, place: tuple[tuple[int, int], ...], *, partitions: int,
             direct: DirectBatch | None) -> TaskJob:
    """The RDD job of a batch without Spark input rows: one task per partition index."""
    ivs = [iv for iv, _t in place]
    tasks = tuple(tuple(iv for iv, t in place if t == i) for i in range(partitions))
    board = claim_board(sc.master, ivs)
    if direct is not None:  # each task reads its intervals' rows of the batch's files
        batch = dataclasses.replace(direct, tasks=tasks)
        fn = _per_task_fn(spec, tasks, lambda: (KafkaRows(batch) if batch.source.kafka is not None
                                                else BatchReader(batch)).rows_of, board)
    else:  # no input: each task gets its intervals' marker rows
        fn = _per_task_fn(spec, tasks, lambda: marker_rows, board)
    return TaskJob(sc.parallelize(range(partitions), partitions).mapPartitionsWithIndex(fn, preservesPartitioning=True),
                   board, tuple(ivs))


def collect(out: Any) -> BatchOutput:
    """Run the batch's tasks and gather their summaries (StaleViewError: fenced; ClaimError: claims)."""
    try:
        rows = out.rdd.collect() if isinstance(out, TaskJob) else out.toArrow().to_pylist()
    finally:
        if isinstance(out, TaskJob):
            drop_board(out.board)
    summaries = [IntervalSummary.from_row(r) for r in rows]
    fenced = BatchOutput(summaries).fenced()
    if fenced is not None:
        iv, f = fenced
        raise StaleViewError(f.message(iv), interval=iv, sequencer=f.sequencer, ours=f.ours)
    if isinstance(out, TaskJob) and out.board is not None:
        got = sorted(r["interval"] for r in rows if r.get("interval") is not None)
        if got != list(out.intervals):
            raise ClaimError(f"the tasks that claimed their intervals returned summaries of intervals {got}, "
                             f"expected each of {list(out.intervals)} once (nothing was committed)")
    return BatchOutput(summaries)


def _per_task_fn(spec: ImageSpec, tasks: tuple[tuple[int, ...], ...],
                 reader: Callable[[], Callable[[tuple[int, ...]], Any]],
                 board: ClaimBoard | None) -> Callable[[int, Iterator[Any]], Iterator[Any]]:
    """The ``mapPartitionsWithIndex`` function: task ``t`` runs its intervals and yields its summaries."""

    def fn(t: int, _rows: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from ..worker import freeze_spark_zips

        freeze_spark_zips()
        planned = tasks[t] if t < len(tasks) else ()
        if board is None:
            out = run_task(spec, reader()(planned)) if planned else []
        else:
            rows_of = reader()
            out = []
            # one upload block: an interval's PUTs overlap the next one's work
            with background_uploads():
                for iv in claimed_intervals(board, t, planned, lambda iv: holds(spec, iv)):
                    out += run_task(spec, rows_of((iv,)))
                    if any(s.fenced is not None for s in out):  # taken over: claim nothing more
                        break
        if out:
            yield from pa.Table.from_pylist([s.to_row() for s in out], schema=spec.summary_schema).to_pylist()

    return fn


def run_task(spec: ImageSpec, table: Any) -> list[IntervalSummary]:
    """:func:`run_intervals` without cyclic garbage collection (a large share of a task's time otherwise),
    captured or profiled when asked."""
    folder = capture_folder()  # DELTAWHEEL_TASK_CAPTURE: the task's spec and input, to replay it
    if folder:
        capture(folder, spec, table)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        profile = os.environ.get("DELTAWHEEL_TASK_PROFILE")  # a folder: one cProfile file per task
        if not profile:
            return run_intervals(spec, table)
        import cProfile

        prof = cProfile.Profile()
        out: list[IntervalSummary] = prof.runcall(run_intervals, spec, table)
        os.makedirs(profile, exist_ok=True)
        prof.dump_stats(os.path.join(profile, f"task-{uuid.uuid4().hex}.prof"))
        return out
    finally:
        if was_enabled:
            gc.enable()


def run_intervals(spec: ImageSpec, table: Any) -> list[IntervalSummary]:
    """One task: each interval of the input rows run (:func:`~.interval.run_interval`); a summary each."""
    import pyarrow.compute as pc

    marker = pc.fill_null(table.column("_m"), False)
    ivs = set(table.column("interval").filter(marker).to_pylist())
    records = table.num_rows - len(ivs)
    if not pc.any(marker.slice(0, records)).as_py():  # the markers trail the records (the direct read's
        data = table.slice(0, records)                # tables): the records without a copy
    else:
        data = table.filter(pc.invert(marker))
    counted = data.num_rows
    data, side, (lo, hi) = _dead_letters(data)
    with_data: list[int] = py_list(pc.unique(data.column("interval"))) if data.num_rows else []
    ivs |= set(with_data)
    out = []
    # the summaries wait for every interval's S3 PUTs at the block's end
    with background_uploads():
        for iv in sorted(i for i in ivs if i in spec.sequencers):
            if len(with_data) == 1:  # the usual task: one interval's records, nothing to filter
                recs = data if iv == with_data[0] else data.slice(0, 0)
            else:
                recs = data.filter(pc.equal(data.column("interval"), iv)) if data.num_rows else data
            out.append(run_interval(spec, iv, recs))
            if out[-1].fenced is not None:  # taken over: the batch cannot commit, run nothing more
                break
    # the task's input counts and its dead / late records ride on its first summary
    head = out[0] if out else IntervalSummary(interval=None)
    return [dataclasses.replace(head, records_in=counted, obs_min=lo, obs_max=hi, side=(*side, *head.side)),
            *out[1:]]


def _dead_letters(data: Any) -> tuple[Any, list[SideRecord], tuple[int | None, int | None]]:
    """(the input without dead letters, those as side records, the others' event-time range)."""
    import pyarrow.compute as pc

    if not data.num_rows:
        return data, [], (None, None)
    bad = pc.is_valid(data.column("_bad"))
    side = []
    if pc.any(bad).as_py():
        side = [SideRecord.of_input("dead", r, r["key"], r["_bad"]) for r in data.filter(bad).to_pylist()]
        data = data.filter(pc.invert(bad))
    mm = pc.min_max(data.column("timestamp_ms"))
    return data, side, (mm["min"].as_py(), mm["max"].as_py())


class ClaimError(RuntimeError):
    """A job's tasks returned no summary, or more than one, for one of its intervals."""


@dataclass(frozen=True)
class ClaimBoard:
    """One job's claim folder (a local path every task of the job reaches) and its intervals."""

    folder: str
    intervals: tuple[int, ...]


def claim_board(master: str, intervals: Sequence[int], *, root: str | None = None) -> ClaimBoard | None:
    """A new board for one job; None off a ``local`` master or with fewer than two intervals."""
    if not master.startswith("local") or master.startswith("local-cluster") or len(intervals) < 2:
        return None
    folder = tempfile.mkdtemp(prefix="deltawheel-claims-", dir=root)
    return ClaimBoard(folder, tuple(sorted(intervals)))


def drop_board(board: ClaimBoard | None) -> None:
    """Remove a board's folder (after its job ended, also when it failed)."""
    if board is not None:
        shutil.rmtree(board.folder, ignore_errors=True)


def _holder(board: ClaimBoard, iv: int) -> int | None:
    try:
        with open(os.path.join(board.folder, str(iv)), encoding="ascii") as f:
            return int(f.read())
    except FileNotFoundError:
        return None


def _claim(board: ClaimBoard, iv: int, task: int) -> bool:
    """Claim ``iv`` for partition ``task``; False when another partition holds it."""
    tmp = os.path.join(board.folder, f".{task}-{uuid.uuid4().hex}")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(str(task))
    try:
        os.link(tmp, os.path.join(board.folder, str(iv)))
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def claimed_intervals(board: ClaimBoard, task: int, planned: Sequence[int],
                      held: Callable[[int], bool]) -> Iterator[int]:
    """The intervals partition ``task`` runs, claimed one at a time in order of preference."""
    for iv in board.intervals:  # a retry: its partition's earlier claims
        if _holder(board, iv) == task:
            yield iv
    order = {iv: rank for rank, iv in enumerate(planned)}
    while True:
        free = [iv for iv in board.intervals if not os.path.exists(os.path.join(board.folder, str(iv)))]
        if not free:
            return
        free.sort(key=lambda iv: (not held(iv), iv not in order, order.get(iv, 0), iv))
        for iv in free:
            if _claim(board, iv, task):
                yield iv
                break
