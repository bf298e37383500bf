"""The image write path's Spark job (driver side): steps 2-4 of a batch in one job.

The writes are the write path's (``statestore/writepath/image/``); this module plans the
one Spark job per batch that runs user code: input preparation, a shuffle by interval and
the user code in ``mapInArrow`` tasks (``_imagetask.py``). The tasks read the interval
images the write path names (cached per Python worker by immutable file path), write the
new images and the productions as Parquet files (through the write path's functions), and
return one summary per interval, which the write path commits and delivers.

A batch rewrites only the intervals it touched; the cost of a batch grows
with the size of those intervals, so computations with many keys should use
more intervals (``Computation.num_intervals``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.delta.jvm import jsession
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.frames import arrow_schema, spark_type
from deltawheel.statestore.rowtable.rows import rows_file_ddl
from deltawheel.statestore.writepath import StaleViewError
from deltawheel.statestore.writepath.delivery import fill_positions, side_frame
from deltawheel.statestore.writepath.image.path import BatchOutput, ImagePath
from deltawheel.statestore.writepath.streams import STREAM_FORMAT_VERSION, stream_schema_ddl

from ...computation import Computation, LatePolicy
from ...runtime.faults import BatchFailedError
from ..input import PREP_DDL, RAW_COLUMN, interval_of_key, original_text, prepare_input
from ..job import BatchRun, Prepared, user_error_message
from .claims import ClaimBoard, ClaimError, claim_board, drop_board
from .direct import (
    DirectBatch,
    DirectSource,
    batch_files,
    direct_task_fn,
    markers_task_fn,
)
from .interval import STALE_MARK, SUMMARY_DDL, ImageSpec, image_task_fn

__all__ = ["ImageTasks", "place_intervals", "spark_partition_of_int"]

_PREP_COLUMNS = [c.split()[0] for c in PREP_DDL.split(", ")]


def place_intervals(ivs: Sequence[int], work: Mapping[int, float], tasks: int,
                    current: tuple[tuple[int, int], ...] = ()) -> tuple[tuple[int, int], ...]:
    """Which task runs which interval, as ``((interval, task), ...)`` in interval order.

    The busiest interval first, each to the least loaded task so far (by ``work``: the records
    and timers each interval ran lately); round-robin while nothing was measured. ``current``
    is kept unless the new placement cuts the busiest task's load by more than 5 %: a new
    placement costs a rebuild of the plan's columns.

    >>> place_intervals([0, 1, 2, 3], {0: 40, 1: 25, 2: 20, 3: 15}, 2)
    ((0, 0), (1, 1), (2, 1), (3, 0))
    """
    ivs = sorted(ivs)
    loads_of = [work.get(iv, 0.0) for iv in ivs]
    if not any(loads_of):
        return tuple((iv, rank % tasks) for rank, iv in enumerate(ivs))
    loads = [0.0] * tasks
    task: dict[int, int] = {}
    for w, iv in sorted(zip(loads_of, ivs, strict=True), key=lambda x: (-x[0], x[1])):
        t = loads.index(min(loads))
        task[iv] = t
        loads[t] += w
    if [iv for iv, _t in current] == ivs and all(0 <= t < tasks for _iv, t in current):
        kept = [0.0] * tasks
        for (_iv, t), w in zip(current, loads_of, strict=True):
            kept[t] += w
        if max(loads) > 0.95 * max(kept):
            return current
    return tuple((iv, task[iv]) for iv in ivs)


_M32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def spark_partition_of_int(value: int, partitions: int) -> int:
    """The partition ``repartition(partitions, col)`` sends an INT ``value`` to: Spark's
    ``pmod(hash(value), partitions)``, i.e. Murmur3 x86_32 of the int with seed 42.

    >>> [spark_partition_of_int(v, 2) for v in range(4)]
    [1, 1, 0, 1]
    """
    k = (value & _M32) * 0xCC9E2D51 & _M32
    k = _rotl32(k, 15) * 0x1B873593 & _M32
    h = _rotl32(42 ^ k, 13)
    h = (h * 5 + 0xE6546B64) & _M32
    h ^= 4  # fmix with the length in bytes
    h ^= h >> 16
    h = h * 0x85EBCA6B & _M32
    h ^= h >> 13
    h = h * 0xC2B2AE35 & _M32
    h ^= h >> 16
    signed = h - (1 << 32) if h & 0x80000000 else h
    return signed % partitions  # Python's % of a positive modulus is Spark's pmod


@dataclass(frozen=True)
class TaskJob:
    """A batch whose tasks need no input rows from Spark (``plan`` with ``direct``, or timers only):
    one RDD task per partition, its index naming its intervals. Through the RDD API, not
    ``range().mapInArrow``: no Catalyst planning or Arrow framing of the task indices and
    summaries — a trivial two-task job costs ~0.08 s there against ~0.15-0.2 s."""

    rdd: Any
    board: ClaimBoard | None = None  # the tasks claim their intervals (``claims.py``); removed after the job
    intervals: tuple[int, ...] = ()  # with a board: each must have exactly one summary



class ImageTasks:
    """Plans and runs the image path's batch job over the files of ``path``.

    Args:
        comp: the computation.
        layout: the store.
        path: the image write path (its view of the interval images, its sequencers).
        partitions: tasks per batch.
        event_ahead_ms: per input stream, how far a record's event time may be ahead of the clock.
    """

    def __init__(self, comp: Computation, layout: StoreLayout, path: ImagePath, *, partitions: int,
                 event_ahead_ms: Mapping[str, int]) -> None:
        self.comp = comp
        self.layout = layout
        self.path = path
        self.partitions = partitions
        self.event_ahead_ms = event_ahead_ms
        self.direct_source: DirectSource | None = None  # set by the pipeline runner (``_direct.py``)
        self._prep_cache: dict[Any, Any] = {}  # input-preparation column expressions (prepare_input)
        self._spread_values: list[int] | None = None
        # ((JVM session, intervals), frame), (intervals, columns, filter), (placement, routing
        # expression); a placement is ((interval, task), ...) over the owned intervals
        self._marker_frame: tuple[tuple[int, tuple[int, ...]], Any] | None = None
        self._data_cols: tuple[tuple[int, ...], list[Any], Any] | None = None
        self._route: tuple[tuple[tuple[int, int], ...], Any] | None = None
        self._work: dict[int, float] = {}  # per interval: records + timers run, decayed over batches
        self._placement: tuple[tuple[int, int], ...] = ()
        # local mode: the tasks of a direct or timers-only batch claim the intervals their worker
        # holds (``claims.py``); DELTAWHEEL_TASK_CLAIMS=0 keeps the placement (for comparisons)
        self.claims = os.environ.get("DELTAWHEEL_TASK_CLAIMS", "1") != "0"

    # ------------------------------------------------------------------ the job

    def prepare(self, df: Any | None, *, wm_late: int | None, now: int) -> Prepared:
        """The input, lazily prepared (or the batch's files, read by the tasks themselves)."""
        direct = None
        if df is not None and self.direct_source is not None:
            files = batch_files(df, self.direct_source)
            if files is not None:
                bound = self.event_ahead_ms.get(self.direct_source.stream)
                direct = DirectBatch(self.direct_source, files, self.comp.num_intervals, wm_late, (),
                                     None if bound is None else (now, bound))
        prep = (prepare_input(df, self.comp, wm_late, cache=self._prep_cache, ahead=(now, self.event_ahead_ms))
                if df is not None and direct is None else None)
        return _Prepared(prep, direct=direct, df=df, raw=original_text(df))

    def run(self, prepared: Prepared, *, batch_id: int, wm_in: int | None, wm_late: int | None, now: int,
            horizon: int | None, commit_id: str, strong: bool, mark: Callable[[str], None]) -> BatchRun[BatchOutput]:
        """Steps 2-4 as one Spark job; the tasks' dead letters and routed late records as frames."""
        assert isinstance(prepared, _Prepared)
        df, prep = prepared.df, prepared.input
        session = df.sparkSession if df is not None else self.path.spark
        frame = self.plan(session, prep, wm=wm_in, now_ms=now, horizon_ms=horizon, commit_id=commit_id,
                          strong=strong, direct=prepared.direct)
        mark("plan")
        try:
            out = self.collect(frame)
        except (StaleViewError, ClaimError):
            raise
        except Exception as exc:  # noqa: BLE001 - user code errors surface here
            raise BatchFailedError(user_error_message(exc, self.comp.name, batch_id)) from exc
        mark("load_and_user_code")
        dead, late_rows = out.side("dead"), out.side("late")
        in_tasks = [r for r in dead if r["position"] is None]  # user code's, not input-level ones
        if df is not None and in_tasks:
            fill_positions(prep if prep is not None else
                           prepare_input(df, self.comp, wm_late, cache=self._prep_cache,
                                                ahead=(now, self.event_ahead_ms)), dead)
        if in_tasks and prepared.raw is not None:
            _original_values(prepared.raw, in_tasks)
        t = out.total
        mins = [s["min_ts"] for s in out.summaries if s["min_ts"] is not None]
        maxs = [s["max_ts"] for s in out.summaries if s["max_ts"] is not None]
        counts = {"records_in": t("records_in"), "processed": t("processed"), "duplicates": t("duplicates"),
                  "late": t("late"), "dead_letters": len(dead), "timers_fired": t("fired"),
                  "productions": t("n_prods"), "keys_written": t("keys_written"), "ids_expired": t("ids_expired"),
                  "bloom_checked": t("bloom_checked"), "bloom_maybe": t("bloom_maybe"),
                  "bloom_false_pos": t("bloom_false_pos"), "bloom_bytes": t("bloom_bytes"),
                  "images_read": t("images_read"),
                  "intervals_run": sum(1 for s in out.summaries if s.get("interval") is not None)}
        return BatchRun(out, counts,
                        dead=side_frame(session, dead, dead=True) if dead else None,
                        late=side_frame(session, late_rows, dead=False) if late_rows else None,
                        prod_min_ts=_prod_min_ts(out),
                        event_timer_ms=min((s["oldest_ms"] for s in out.summaries if s.get("oldest_ms") is not None),
                                           default=None),
                        obs_min=min(mins) if mins else None, obs_max=max(maxs) if maxs else None)

    def checkpoint(self, run: BatchRun[BatchOutput]) -> bool:
        """The tasks wrote the productions as files only: run them again with ``strong``."""
        return False

    # ------------------------------------------------------------------ steps 3 + 4

    def plan(self, session: Any, prep: Any | None, *, wm: int | None, now_ms: int,
             horizon_ms: int | None, commit_id: str, strong: bool | None = None,
             direct: DirectBatch | None = None) -> Any:
        """The batch's DataFrame (lazy; one Spark job when collected): shuffle by interval, user code
        per interval image, files written. Few plan nodes, since each one is analyzed eagerly.
        ``direct``: the tasks read the batch's files themselves (``_direct.py``; ``prep`` unused)."""

        comp = self.comp
        ivs = sorted(self.path.owner.intervals)
        partitions = self.partitions
        place = self._place(ivs, partitions)
        spec = ImageSpec(
            comp=comp, rows_root=self.path.rows_files,
            images=self.path.images(),
            sequencers=dict(self.path.owner.sequencers),
            stream_roots={s: self.path.stream_files(s) for s in comp.outputs},
            wm=wm, now_ms=now_ms, horizon_ms=horizon_ms, commit_id=commit_id, rows_schema=arrow_schema(rows_file_ddl()),
            stream_schema=arrow_schema(stream_schema_ddl()), stream_format_version=STREAM_FORMAT_VERSION,
            route_late=comp.late_policy is LatePolicy.ROUTE, summary_schema=arrow_schema(SUMMARY_DDL),
            strong=comp.strong_productions if strong is None else strong,
            input_files=tuple(self.path.input_files))
        if direct is not None or prep is None:
            # one task per partition index, each with its intervals of `place`: the tasks read the
            # batch's files themselves, or there is no input (due timers only): one stage
            tasks = tuple(tuple(iv for iv, t in place if t == i) for i in range(partitions))
            sc = session.sparkContext
            board = claim_board(sc.master, ivs) if self.claims else None
            fn = (direct_task_fn(spec, dataclasses.replace(direct, tasks=tasks), board) if direct is not None
                  else markers_task_fn(spec, tasks, board))
            return TaskJob(sc.parallelize(range(partitions), partitions).mapPartitionsWithIndex(fn, preservesPartitioning=True),
                           board, tuple(ivs))
        cols, keep = self._data_columns(place)
        frame = prep.select(*cols)
        if keep is not None:
            frame = frame.where(keep)
        frame = frame.unionByName(self._markers(session, place))
        return frame.repartition(partitions, self._spread(session, place, partitions)).mapInArrow(
            image_task_fn(spec), spark_type(SUMMARY_DDL))

    def _data_columns(self, place: tuple[tuple[int, int], ...]) -> tuple[list[Any], Any]:
        """The input rows' projection (interval, marker flag) and the filter on owned intervals
        (None when all are owned; a record without key, a dead letter, counts as interval 0's):
        built once per set of intervals (each column is a py4j call)."""
        from pyspark.sql import functions as F

        ivs = [iv for iv, _t in place]
        key = tuple(ivs)
        if self._data_cols is None or self._data_cols[0] != key:
            iv = interval_of_key(self.comp.num_intervals)
            # the source position is a long string per record and only needed for dead letters:
            # shipped for input-level ones; the driver looks it up for the tasks' (rare) ones
            cols = [F.when(F.col("_bad").isNotNull(), F.col(c)).alias(c) if c == "position" else F.col(c)
                    for c in _PREP_COLUMNS]
            cols += [iv.alias("interval"), F.lit(False).alias("_m")]
            every = ivs == list(range(self.comp.num_intervals))
            # some intervals are another instance's: its records (and dead letters) are its own
            keep = None if every else F.coalesce(F.col("interval"), F.lit(0)).isin(ivs)
            self._data_cols = (key, cols, keep)
        return self._data_cols[1], self._data_cols[2]

    def collect(self, out: Any) -> BatchOutput:
        """Run the batch's tasks and gather their summary rows; a fenced task raises StaleViewError."""
        try:
            rows = out.rdd.collect() if isinstance(out, TaskJob) else out.toArrow().to_pylist()
        except Exception as exc:  # noqa: BLE001 - the fence check in the tasks
            if STALE_MARK in str(exc):
                raise StaleViewError(str(exc).split(STALE_MARK, 1)[1].splitlines()[0]) from exc
            raise
        finally:
            if isinstance(out, TaskJob):
                drop_board(out.board)
        if isinstance(out, TaskJob) and out.board is not None:
            got = sorted(r["interval"] for r in rows if r.get("interval") is not None)
            if got != list(out.intervals):
                raise ClaimError(f"the tasks that claimed their intervals returned summaries of intervals {got}, "
                                 f"expected each of {list(out.intervals)} once (nothing was committed)")
        return BatchOutput(rows)

    def _markers(self, session: Any, place: tuple[tuple[int, int], ...]) -> Any:
        """One row per owned interval (so every interval gets a task), made once per session.

        Built from ``range`` in one partition: a frame from Python rows (``createDataFrame``)
        would start a Python worker per partition in every batch's map stage (~0.35 s each)."""
        from pyspark.sql import functions as F

        # the JVM session's identity: foreachBatch hands each batch a new Python wrapper
        ivs = tuple(iv for iv, _t in place)
        key = (jsession(session).hashCode(), ivs)
        if self._marker_frame is None or self._marker_frame[0] != key:
            cols = [F.lit(None).cast(t).alias(c) for c, t in (d.split() for d in PREP_DDL.split(", "))]
            pick = F.element_at(F.array(*[F.lit(i) for i in ivs]), (F.col("id") + 1).cast("int"))
            df = session.range(0, len(ivs), 1, 1).select(*cols, pick.alias("interval"), F.lit(True).alias("_m"))
            self._marker_frame = (key, df)
        return self._marker_frame[1]

    def _place(self, ivs: list[int], partitions: int) -> tuple[tuple[int, int], ...]:
        self._placement = place_intervals(ivs, self._work, partitions, self._placement)
        return self._placement

    def observe(self, run: BatchRun[BatchOutput]) -> None:
        """Remember each interval's work in this batch (for :meth:`_place`)."""
        for s in run.batch.summaries:
            if s.get("interval") is not None:
                iv = int(s["interval"])
                w = float((s.get("processed") or 0) + (s.get("fired") or 0) + (s.get("duplicates") or 0))
                self._work[iv] = 0.5 * self._work.get(iv, 0.0) + w

    def _spread(self, session: Any, place: tuple[tuple[int, int], ...], partitions: int) -> Any:
        """The routing expression (of the ``interval`` column) whose hash sends each owned interval
        to its task in ``place``; built once per placement.

        ``repartition(n, expr)`` places a row by ``pmod(hash(expr), n)``; hashing the interval
        itself can put most intervals in one task. Per task, the smallest int that hashes there
        (:func:`spark_partition_of_int`, no Spark job)."""
        from pyspark.sql import functions as F

        if self._spread_values is None or len(self._spread_values) != partitions:
            first: dict[int, int] = {}
            n = 0
            while len(first) < partitions:
                first.setdefault(spark_partition_of_int(n, partitions), n)
                n += 1
            self._spread_values = [first[p] for p in range(partitions)]
            self._route = None
        if self._route is None or self._route[0] != place:
            interval = F.col("interval")
            col = None
            for iv, t in place:
                v = F.lit(self._spread_values[t])
                col = F.when(interval == iv, v) if col is None else col.when(interval == iv, v)
            assert col is not None
            self._route = (place, col.otherwise(F.lit(self._spread_values[0])).cast("int"))
        return self._route[1]


@dataclass
class _Prepared(Prepared):
    df: Any | None = None  # the micro-batch (the tasks' dead letters look up their positions in it)


def _original_values(raw: Any, dead: list[dict[str, Any]]) -> None:
    """The tasks' dead letters' values replaced by their records' original text (``raw``:
    :func:`~.merge.original_text` of the micro-batch), where it has one."""
    from pyspark.sql import functions as F

    ids = sorted({r["record_id"] for r in dead})
    text = {r["record_id"]: bytes(r[RAW_COLUMN]) for r in raw.where(F.col("record_id").isin(ids)).select(
        "record_id", RAW_COLUMN).collect() if r[RAW_COLUMN] is not None}
    for r in dead:
        r["value"] = text.get(r["record_id"], r["value"])


def _prod_min_ts(out: BatchOutput) -> int | None:
    """The oldest timestamp among a batch's production files (holds the low watermark)."""
    return min((int(p["min_ts"]) for s in out.summaries for p in s.get("prod_files") or ()
                if p.get("min_ts") is not None), default=None)
