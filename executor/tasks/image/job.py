"""The image write path's Spark job (driver side): steps 2-4 of a batch in one job."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.delta.jvm import jsession
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.frames import arrow_schema, spark_type
from deltawheel.statestore.rowtable.rows import rows_file_ddl
from deltawheel.statestore.writepath import StaleViewError
from deltawheel.statestore.writepath.image.path import ImagePath
from deltawheel.statestore.writepath.image.summary import SUMMARY_DDL, BatchOutput, side_frame
from deltawheel.statestore.writepath.streams import STREAM_FORMAT_VERSION, stream_schema_ddl

from ...computation import Computation, LatePolicy
from ..input import (
    PREP_DDL,
    KafkaRead,
    interval_of_key,
    original_text,
    original_texts,
    positions_of,
    prepare_input,
)
from ..job import BatchCounts, BatchRun, Prepared, task_failure
from ..worker import one_worker_pool
from .direct import DirectBatch, DirectSource, batch_files
from .kafkaread import (
    MAX_DIRECT_RECORDS,
    Uncertain,
    batch_ranges,
    partition_maxima,
    prepare_records,
    read_ranges,
    record_texts,
)
from .spec import ImageSpec
from .task import ClaimError, collect, image_task_fn, task_job

__all__ = ["ImageTasks", "place_intervals", "spark_partition_of_int"]

_PREP_COLUMNS = [c.split()[0] for c in PREP_DDL.split(", ")]


def place_intervals(ivs: Sequence[int], work: Mapping[int, float], tasks: int,
                    current: tuple[tuple[int, int], ...] = ()) -> tuple[tuple[int, int], ...]:
    """Which task runs which interval, as ``((interval, task), ...)`` in interval order.

    Busiest interval first, each to the least loaded task; ``current`` is kept unless the new one cuts
    the busiest task's load by over 5 %.

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
    """The partition ``repartition(partitions, col)`` sends an INT ``value`` to (Murmur3, seed 42).

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


class ImageTasks:
    """Plans and runs the image path's batch job over the files of ``path``."""

    def __init__(self, comp: Computation, layout: StoreLayout, path: ImagePath, *, partitions: int,
                 event_ahead_ms: Mapping[str, int]) -> None:
        self.comp = comp
        self.layout = layout
        self.path = path
        self.partitions = partitions
        self.event_ahead_ms = event_ahead_ms
        self._prep_cache: dict[Any, Any] = {}  # input-preparation column expressions (prepare_input)
        self._spread_values: list[int] | None = None
        # caches: ((JVM session, intervals), frame), (intervals, columns, filter), (placement, routing)
        self._marker_frame: tuple[tuple[int, tuple[int, ...]], Any] | None = None
        self._data_cols: tuple[tuple[int, ...], list[Any], Any] | None = None
        self._route: tuple[tuple[tuple[int, int], ...], Any] | None = None
        self._work: dict[int, float] = {}  # per interval: records + timers run, decayed over batches
        self._placement: tuple[tuple[int, int], ...] = ()
        #: the last batch's ``(count, min ms, max ms, per-partition max ms)``, per Kafka input the tasks read directly
        self.kafka_stats: dict[str, tuple[int, int | None, int | None, tuple[tuple[str, int | None], ...]]] = {}

    def prepare(self, df: Any | None, *, wm_late: int | None, now: int, batch_id: int | None = None,
                direct: DirectSource | None = None) -> Prepared:
        """The input, lazily prepared (or the batch's files of ``direct``, for the tasks to read)."""
        batch = None
        self.kafka_stats = {}
        if df is not None and direct is not None:
            bound = self.event_ahead_ms.get(direct.stream)
            ahead = None if bound is None else (now, bound)
            if direct.kafka is not None:
                batch = self._kafka_batch(direct, direct.kafka, batch_id, late_before=wm_late, now=now, ahead=ahead)
            elif (files := batch_files(df, direct, batch_id=batch_id)) is not None:
                batch = DirectBatch(source=direct, files=files, num_intervals=self.comp.num_intervals,
                                    late_before=wm_late, tasks=(), ahead=ahead)
        prep = (prepare_input(df, self.comp, wm_late, cache=self._prep_cache, ahead=(now, self.event_ahead_ms))
                if df is not None and batch is None else None)
        return _Prepared(input=prep, direct=batch, df=df, raw=original_text(df))

    def _kafka_batch(self, direct: DirectSource, read: KafkaRead, batch_id: int | None, *, late_before: int | None,
                     now: int, ahead: tuple[int, int] | None) -> DirectBatch | None:
        """A Kafka batch's offset ranges for the tasks, its statistics in ``kafka_stats`` (None: the JVM
        path); KafkaDataLossError: records of the batch are gone and the injector fails on data loss."""
        ranges = batch_ranges(read, batch_id)
        if ranges is None or sum(hi - lo for _p, lo, hi in ranges) > MAX_DIRECT_RECORDS:
            return None
        try:  # read once here: the per-partition statistics, and a record the tasks cannot prepare exactly
            prep = prepare_records(read, direct.stream, read_ranges(read, ranges))
        except Uncertain:
            return None
        n, lo, hi, parts = partition_maxima(read, prep, now_ms=now, max_event_ahead_ms=None if ahead is None
                                            else ahead[1])
        self.kafka_stats = {direct.stream: (n, lo, hi, parts)}
        return DirectBatch(source=direct, files=(), num_intervals=self.comp.num_intervals, late_before=late_before,
                           tasks=(), ahead=ahead, ranges=ranges)

    def run(self, prepared: Prepared, *, batch_id: int, wm_in: int | None, wm_late: int | None, now: int,
            horizon: int | None, commit_id: str, strong: bool, mark: Callable[[str], None],
            late_raised: Mapping[int, int] | None = None) -> BatchRun[BatchOutput]:
        """Steps 2-4 as one Spark job; the tasks' dead letters and routed late records as frames."""
        assert isinstance(prepared, _Prepared)
        df, prep = prepared.df, prepared.input
        session = df.sparkSession if df is not None else self.path.spark
        frame = self.plan(session, prep, wm=wm_in, wm_late=wm_late, now_ms=now, horizon_ms=horizon,
                          commit_id=commit_id, strong=strong, direct=prepared.direct, late_raised=late_raised)
        mark("plan")
        try:
            out = collect(frame)
        except (StaleViewError, ClaimError):
            raise
        except Exception as exc:
            raise task_failure(exc, self.comp.name, batch_id) from exc
        mark("load_and_user_code")
        dead, late = out.side("dead"), out.side("late")
        counts = _counts(out, dead_letters=len(dead))
        s = out.summaries
        # the tasks' own dead letters: source positions and original text looked up here
        in_tasks = {r.record_id for r in dead if r.position is None and r.record_id is not None}
        kafka = None if prepared.direct is None else prepared.direct.source.kafka
        if kafka is not None and in_tasks:  # the direct read's records: their positions and values from Kafka
            assert prepared.direct is not None
            pos, text = record_texts(kafka, prepared.direct.source.stream, in_tasks)
            dead = [dataclasses.replace(r, position=pos.get(r.record_id), value=text.get(r.record_id, r.value))
                    if r.position is None and r.record_id is not None else r for r in dead]
        elif df is not None and in_tasks:
            pos = positions_of(prep if prep is not None else
                               prepare_input(df, self.comp, wm_late, cache=self._prep_cache,
                                             ahead=(now, self.event_ahead_ms)), in_tasks)
            text = original_texts(prepared.raw, in_tasks) if prepared.raw is not None else {}
            dead = [dataclasses.replace(r, position=pos.get(r.record_id), value=text.get(r.record_id, r.value))
                    if r.position is None and r.record_id is not None else r for r in dead]
        return BatchRun(batch=out, counts=counts, dead=side_frame(session, dead, dead=True) if dead else None,
                        late=side_frame(session, late, dead=False) if late else None,
                        prod_min_ts=out.prod_min_ts(),
                        event_timer_ms=min((x.oldest_ms for x in s if x.oldest_ms is not None), default=None),
                        obs_min=min((x.obs_min for x in s if x.obs_min is not None), default=None),
                        obs_max=max((x.obs_max for x in s if x.obs_max is not None), default=None))

    def checkpoint(self, run: BatchRun[BatchOutput]) -> bool:
        """The tasks wrote the productions as files only: run them again with ``strong``."""
        return False

    def plan(self, session: Any, prep: Any | None, *, wm: int | None, wm_late: int | None, now_ms: int,
             horizon_ms: int | None, commit_id: str, strong: bool | None = None,
             direct: DirectBatch | None = None, late_raised: Mapping[int, int] | None = None) -> Any:
        """The batch's lazy job: the input shuffled to ``mapInArrow`` tasks, or one RDD task per partition."""
        comp = self.comp
        ivs = sorted(self.path.owner.intervals)
        place = self._placement = place_intervals(ivs, self._work, self.partitions, self._placement)
        spec = ImageSpec(
            comp=comp, rows_root=self.path.rows_files,
            images=self.path.images(),
            sequencers=dict(self.path.owner.sequencers),
            stream_roots={s: self.path.stream_files(s) for s in comp.outputs},
            wm=wm, wm_late=wm_late, late_raised=dict(late_raised or {}), now_ms=now_ms, horizon_ms=horizon_ms, commit_id=commit_id, rows_schema=arrow_schema(rows_file_ddl()),
            stream_schema=arrow_schema(stream_schema_ddl()), stream_format_version=STREAM_FORMAT_VERSION,
            route_late=comp.late_policy is LatePolicy.ROUTE, summary_schema=arrow_schema(SUMMARY_DDL),
            strong=comp.strong_productions if strong is None else strong,
            input_files=tuple(self.path.input_files))
        if direct is None and prep is not None:
            return self._shuffled(session, prep, place).mapInArrow(image_task_fn(spec), spark_type(SUMMARY_DDL))
        one_worker_pool(session)  # the RDD tasks in the pool of the SQL tasks (``worker.py``)
        return task_job(session.sparkContext, spec, place, partitions=self.partitions, direct=direct)

    def _shuffled(self, session: Any, prep: Any, place: tuple[tuple[int, int], ...]) -> Any:
        """The owned intervals' input plus a marker row per interval, each sent to its task of ``place``."""
        cols, keep = self._data_columns(place)
        frame = prep.select(*cols)
        if keep is not None:
            frame = frame.where(keep)
        frame = frame.unionByName(self._markers(session, place))
        return frame.repartition(self.partitions, self._spread(session, place, self.partitions))

    def _data_columns(self, place: tuple[tuple[int, int], ...]) -> tuple[list[Any], Any]:
        """The input rows' projection and owned-interval filter (None: all owned), built once per set."""
        from pyspark.sql import functions as F

        ivs = [iv for iv, _t in place]
        if self._data_cols is None or self._data_cols[0] != tuple(ivs):
            iv = interval_of_key(self.comp.num_intervals)
            # source positions are shipped for input-level dead letters only
            cols = [F.when(F.col("_bad").isNotNull(), F.col(c)).alias(c) if c == "position" else F.col(c)
                    for c in _PREP_COLUMNS]
            cols += [iv.alias("interval"), F.lit(False).alias("_m")]
            every = ivs == list(range(self.comp.num_intervals))
            # some intervals are another instance's: its records (and dead letters) are its own
            keep = None if every else F.coalesce(F.col("interval"), F.lit(0)).isin(ivs)
            self._data_cols = (tuple(ivs), cols, keep)
        return self._data_cols[1], self._data_cols[2]

    def _markers(self, session: Any, place: tuple[tuple[int, int], ...]) -> Any:
        """One row per owned interval, made once per session from ``range`` (no Python worker per batch)."""
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

    def observe(self, run: BatchRun[BatchOutput]) -> None:
        """Remember each interval's work in this batch (for the placement of :meth:`plan`)."""
        for iv, s in run.batch.intervals():
            w = float(s.processed + s.fired + s.duplicates)
            self._work[iv] = 0.5 * self._work.get(iv, 0.0) + w

    def _spread(self, session: Any, place: tuple[tuple[int, int], ...], partitions: int) -> Any:
        """The routing expression sending each owned interval to its task in ``place``."""
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


def _counts(out: BatchOutput, *, dead_letters: int) -> BatchCounts:
    """The batch's counts: its tasks' summaries summed, with every dead letter the tasks returned."""
    s = out.summaries
    summed = {c: sum(getattr(x, c) for x in s) for c in _SUMMED}
    return BatchCounts(**summed, dead_letters=dead_letters, timers_fired=sum(x.fired for x in s),
                       productions=sum(x.n_prods for x in s), intervals_run=len(out.intervals()))


#: the counts of BatchCounts that are the same-named counts of the summaries, summed
_SUMMED = ("records_in", "processed", "duplicates", "late", "keys_written", "ids_expired", "keys_expired",
           "bloom_checked", "bloom_maybe", "bloom_false_pos", "bloom_bytes", "images_read")


@dataclass
class _Prepared(Prepared):
    df: Any | None = None  # the micro-batch (the tasks' dead letters look up their positions in it)
