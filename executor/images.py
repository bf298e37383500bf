"""The image write path of the executor (driver side): steps 3-6 of a batch.

Chosen by measurement (README, "Throughput"): a fenced MERGE per batch costs
several Spark jobs (the join that finds the touched files, the rewrite, the
post-commit state) and an insert-only MERGE per delivery the same again. The
image path keeps the single-row-per-key table and its partitioning by
(computation, interval), but replaces whole interval partitions:

- one Spark job per batch: input preparation, a shuffle by interval and the
  user code in ``mapInArrow`` tasks (``_imagetask.py``); the tasks read the
  interval images (cached per Python worker by immutable file path), write
  the new images and the productions as Parquet files, and return summaries;
- one Delta transaction on the rows table (``statestore/deltatxn.py``):
  remove the replaced files, add the new ones. Fenced like every commit: the
  tasks check the fence row's sequencer, the transaction records the
  partitions as read (a concurrent fence fails it) and refuses to go on if a
  commit since this writer's last one touched its partitions;
- one blind append per output stream of the production files, with one
  ``SetTransaction`` per producing interval (version = the rows commit), so a
  repeated delivery is skipped by Delta itself.

A batch rewrites only the intervals it touched; the cost of a batch grows
with the size of those intervals, so computations with many keys should use
more intervals (``Computation.num_intervals``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from deltawheel.statestore.deltalog import commit_info, commit_infos, json_commit_versions
from deltawheel.statestore.deltatxn import (
    FileEntry,
    StaleFilesError,
    TableLog,
    decode_path,
    local_root,
    new_add,
    partition_file_name,
    write_file,
)
from deltawheel.statestore.exceptions import CommitConflictError, StaleSequencerError
from deltawheel.statestore.frames import arrow_schema, spark_type
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.owner import IntervalOwner
from deltawheel.statestore.rows import FENCE_KEY, Production, rows_file_ddl
from deltawheel.statestore.store import raise_if_fenced
from deltawheel.statestore.streams import STREAM_FORMAT_VERSION, stream_schema_ddl

from ._direct import DirectBatch, direct_task_fn, markers_task_fn
from ._imagetask import (
    STALE_MARK,
    SUMMARY_DDL,
    ImageSpec,
    image_task_fn,
    next_processing,
    oldest_work,
    write_production_files,
)
from ._tasks import interval_of_key
from .computation import Computation, LatePolicy

__all__ = ["ImageWriter", "ImagesStale", "PREP_DDL", "spark_partition_of_int"]

_DELIVERY_RETRIES = 20  # conflicts with other deliveries to the same stream, retried with jitter

PREP_DDL = ("record_id STRING, key STRING, value BINARY, codec STRING, timestamp_ms BIGINT, stream STRING, "
            "position STRING, late BOOLEAN, _bad STRING")
_PREP_COLUMNS = [c.split()[0] for c in PREP_DDL.split(", ")]
COMMIT_META_VERSION = 1


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


@dataclass
class Checkpoint:
    """One interval's checkpointed productions of one stream, found by the recovery scan."""

    stream: str
    interval: int
    version: int | None  # the rows commit that checkpointed them (an upper bound unless exact; None: unknown)
    exact: bool  # ``version`` is that commit's own (looked up by ``commit_id``), not a bound
    commit_id: str | None  # that commit's id (what its delivery writes in the stream's commit_id column;
    # None: the rows were written by several commits)
    prods: list[Production]


@dataclass
class Recovery:
    """What :meth:`ImageWriter.recovery` found: per interval the oldest work and the earliest
    processing-time timer, and the checkpoints to deliver: ``appends`` (of known commits,
    :meth:`ImageWriter.redeliver`) and ``merge`` (the rest: insert-only MERGE by record id)."""

    oldest: dict[int, int | None]
    next_processing: dict[int, int | None]
    appends: list[Checkpoint]
    merge: list[Checkpoint]

    def merge_productions(self) -> list[Production]:
        return sorted((p for c in self.merge for p in c.prods), key=lambda p: (p.timestamp_ms, p.production_id))

    def merge_commit_ids(self) -> dict[str, str | None]:
        """production id -> the id of the commit that checkpointed it (None: not known)."""
        return {p.production_id: c.commit_id for c in self.merge for p in c.prods}


class ImagesStale(Exception):
    """The writer's view of its partitions is out of date (reload and run the batch again)."""


@dataclass(frozen=True)
class BatchOutput:
    summaries: list[dict[str, Any]]

    def total(self, name: str) -> int:
        return sum(int(s.get(name) or 0) for s in self.summaries)

    def side(self, kind: str) -> list[dict[str, Any]]:
        return [x for s in self.summaries for x in (s.get("side") or ()) if x["kind"] == kind]


@dataclass(frozen=True)
class TaskJob:
    """A batch whose tasks need no input rows from Spark (``plan`` with ``direct``, or timers only):
    one RDD task per partition, its index naming its intervals. Through the RDD API, not
    ``range().mapInArrow``: no Catalyst planning or Arrow framing of the task indices and
    summaries — a trivial two-task job costs ~0.08 s there against ~0.15-0.2 s."""

    rdd: Any


class ImageWriter:
    """Holds the file lists of one computation's owned interval partitions."""

    def __init__(self, spark: Any, layout: StoreLayout, comp: Computation, owner: IntervalOwner) -> None:
        self.spark = spark
        self.layout = layout
        self.comp = comp
        self.owner = owner
        self.log = TableLog(spark, layout.rows)
        self.files: dict[int, list[FileEntry]] = {}
        self.version = -1
        self._streams: dict[str, TableLog] = {}
        self._delivered: dict[tuple[str, str], int] = {}
        self._spread_values: list[int] | None = None
        # ((JVM session, intervals), frame), (intervals, columns, filter), (placement, routing
        # expression); a placement is ((interval, task), ...) over the owned intervals
        self._marker_frame: tuple[tuple[int, tuple[int, ...]], Any] | None = None
        self._data_cols: tuple[tuple[int, ...], list[Any], Any] | None = None
        self._route: tuple[tuple[tuple[int, int], ...], Any] | None = None
        self._work: dict[int, float] = {}  # per interval: records + timers run, decayed over batches
        self._placement: tuple[tuple[int, int], ...] = ()

    def _pred(self, ivs: Sequence[int]) -> str:
        return f"computation = '{self.comp.name}' AND interval IN ({', '.join(str(i) for i in ivs)})"

    def load(self) -> None:
        """Read the live files of the owned partitions (a full snapshot read; after a takeover or
        a conflict). Files carrying deletion vectors (left by MERGE commits) are purged first, so
        every image is plain Parquet."""
        ivs = sorted(self.owner.intervals)
        name, wanted = self.comp.name, {str(iv) for iv in ivs}
        version, files = self.log.files(
            self._pred(ivs), where=lambda pv: pv.get("computation") == name and pv.get("interval") in wanted)
        self.files = {iv: [] for iv in ivs}
        for f in files:
            self.files.setdefault(int(f.part("interval") or -1), []).append(f)
        self.version = version
        dirty = sorted({iv for iv, fs in self.files.items() if any(f.has_deletion_vector for f in fs)})
        if dirty:  # a stale owner must not rewrite (the images' rows are not all live: ask Delta)
            self.owner.store.check_fences(self.comp.name, self.owner.sequencers)
            self._rewrite(dirty)

    def recovery(self) -> Recovery:
        """The recovery scan from the loaded images (read here, in the driver): the oldest work
        per interval (event-time timers, watermark holds), the earliest processing-time timer per
        interval, and the checkpointed productions still to deliver (those whose strong delivery
        already landed are left out, see below).

        Raises :class:`StaleSequencerError` first if a fence row of an image carries a greater
        sequencer than this writer's (an even newer owner took the interval)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        root = local_root(self.layout.rows)
        cols = ["key", "sequencer", "next_event_timer_ms", "next_processing_timer_ms", "watermark_hold_ms", "pending",
                "commit_id", "record_ids"]
        out = Recovery({}, {}, [], [])
        checkpoints: list[Checkpoint] = []
        for iv, files in sorted(self.files.items()):
            parts = [pq.read_table(os.path.join(root, decode_path(f.path)), columns=cols) for f in files]
            if not parts:
                out.oldest[iv] = out.next_processing[iv] = None
                continue
            image = pa.concat_tables(parts, promote_options="permissive")
            fence = pc.max(image.filter(pc.equal(image.column("key"), FENCE_KEY)).column("sequencer")).as_py()
            if fence is not None:
                raise_if_fenced(self.comp.name, {iv: fence}, {iv: self.owner.sequencers[iv]})
            out.oldest[iv] = oldest_work(image)
            out.next_processing[iv] = next_processing(
                image, self.comp.dedup_retention_ms() if self.comp.exactly_once else None)
            found: dict[str, Checkpoint] = {}
            for f, part in zip(files, parts, strict=True):
                has = pc.fill_null(pc.greater(pc.list_value_length(part.column("pending")), 0), False)
                held = part.filter(has)
                for lst, cid in zip(held.column("pending").to_pylist(), held.column("commit_id").to_pylist(),
                                    strict=True):
                    for row in lst:
                        prod = Production.from_row(row)
                        c = found.get(prod.stream)
                        if c is None:
                            c = found[prod.stream] = Checkpoint(prod.stream, iv, f.added_at, False, cid, [])
                        else:
                            if c.commit_id != cid:
                                c.commit_id = None  # rows of several commits (not written by this path)
                            c.version = None if c.version is None or f.added_at is None else \
                                max(c.version, f.added_at)
                        c.prods.append(prod)
            checkpoints += found.values()
        # Productions already delivered are left out. A strong delivery records, per interval, the
        # version of the rows commit whose productions it carries (and that commit's id in its
        # rows), and a commit is only made once the previous batch's delivery landed (settled).
        # Each held row carries the id of the commit that checkpointed it; that commit is at or
        # before the newest add of a file holding the row (``version``, an upper bound: OPTIMIZE,
        # a purge or any rewrite re-adds the rows under a newer version). So: delivered once the
        # stream's version for the interval reached that bound; else the checkpointing commit is
        # looked up by its id among the commits in between (:meth:`_resolve`).
        for stream in sorted({c.stream for c in checkpoints if c.version is not None}):
            self._read_delivered(stream, [self._app(c.interval) for c in checkpoints
                                          if c.stream == stream and c.version is not None])
        for c in checkpoints:
            delivered = -1 if c.version is None else self._delivered[(c.stream, self._app(c.interval))]
            if c.version is not None and delivered >= c.version:
                continue
            todo = self._resolve(c, delivered)
            if todo is not None:
                (out.appends if todo else out.merge).append(c)
        return out

    def _resolve(self, c: Checkpoint, delivered: int) -> bool | None:
        """Whether checkpoint ``c`` (not known to be delivered by its bound) is still to deliver:
        None (no: delivered), True (yes, as its commit's own delivery: ``c.version`` becomes that
        commit's version, ``c.exact``), False (yes, by insert-only MERGE by record id: the commit
        is not found in the log, or was not made by this path).

        Its commit is looked up by id in the rows table's log between the stream's version for
        the interval and the bound. Not there while every commit of that range is: the commit is
        at or before the delivered version, i.e. delivered (a later commit of the interval clears
        the checkpoints of earlier ones)."""
        if c.version is None or c.commit_id is None:
            return False
        present = set(json_commit_versions(self.layout.rows) or ())
        for v in range(c.version, delivered, -1):  # newest first: usually the bound itself
            if v not in present:
                return False  # the log was cleaned up past it: cannot tell
            try:
                meta = json.loads((commit_info(self.layout.rows, v) or {}).get("userMetadata") or "{}")
            except ValueError:
                continue
            if isinstance(meta, dict) and meta.get("commit_id") == c.commit_id:
                if meta.get("kind") == "commit" and meta.get("write_path") == "image" \
                        and meta.get("computation") == self.comp.name:
                    c.version, c.exact = v, True
                    return True
                return False
        return None if delivered >= 0 else False

    def redeliver(self, checkpoints: Sequence[Checkpoint]) -> int:
        """Deliver checkpoints of known commits as their own deliveries would have: an append
        per stream recording the interval's application version = that commit's (so a zombie's
        late delivery of the same commit and this one cannot both land). Returns how many
        productions were given."""
        n = 0
        for c in checkpoints:
            assert c.version is not None
            files = write_production_files(
                c.prods, producer=self.comp.name, commit_id=c.commit_id, iv=c.interval,
                roots={c.stream: local_root(self.layout.stream(c.stream))},
                schema=arrow_schema(stream_schema_ddl()), format_version=STREAM_FORMAT_VERSION)
            adds = [new_add(p["path"], {}, p["size"], p["num_rows"]) for p in files]
            self._deliver_strong(c.stream, self._stream_log(c.stream), {self._app(c.interval): adds}, c.version)
            n += len(c.prods)
        return n

    def _app(self, iv: int) -> str:
        """The application id an interval's strong deliveries record in a stream table."""
        return f"deltawheel.{self.comp.name}.{iv}"

    def _stream_log(self, stream: str) -> TableLog:
        log = self._streams.get(stream)
        if log is None:
            log = self._streams[stream] = TableLog(self.spark, self.layout.stream(stream))
        return log

    def _read_delivered(self, stream: str, apps: Sequence[str]) -> None:
        """Remember the versions ``stream`` records for those of ``apps`` not known yet (one log read)."""
        unknown = [app for app in apps if (stream, app) not in self._delivered]
        if unknown:
            for app, v in self._stream_log(stream).txn_versions(unknown).items():
                self._delivered[(stream, app)] = v

    def _rewrite(self, ivs: list[int]) -> None:
        """Replace the files of ``ivs`` by one plain Parquet file each, same rows (Delta's
        ``REORG ... APPLY (PURGE)`` fails on this Spark/Delta pair)."""
        import pyarrow as pa
        from pyspark.sql import functions as F

        name = self.comp.name
        schema = arrow_schema(rows_file_ddl())
        data = (self.spark.read.format("delta").option("versionAsOf", self.version).load(self.layout.rows)
                .where((F.col("computation") == name) & F.col("interval").isin(ivs)).toArrow())
        adds, new = [], {}
        for iv in ivs:
            part = data.filter(pa.compute.equal(data.column("interval"), iv)).select(schema.names).cast(schema)
            rel = partition_file_name(name, iv, "dw")
            size = write_file(part, local_root(self.layout.rows), rel)
            add = new_add(rel, {"computation": name, "interval": str(iv)}, size, part.num_rows)
            adds.append(add)
            new[iv] = [FileEntry(rel, (("computation", name), ("interval", str(iv))), size, False, add)]
        removes = [f for iv in ivs for f in self.files.get(iv, ())]
        version = self.log.commit(
            remove=removes, add=adds, read_partitions=[f"computation = '{name}' AND interval = {iv}" for iv in ivs],
            untouched_since=(self.version, [{"computation": name, "interval": str(iv)} for iv in ivs]),
            user_metadata=json.dumps({"deltawheel": COMMIT_META_VERSION, "kind": "compact", "computation": name,
                                      "write_path": "image"}, sort_keys=True))
        assert version is not None
        self.files.update(new)
        self.version = version

    # ------------------------------------------------------------------ steps 3 + 4

    def plan(self, session: Any, prep: Any | None, *, wm: int | None, now_ms: int,
             horizon_ms: int | None, commit_id: str, partitions: int, strong: bool | None = None,
             direct: DirectBatch | None = None) -> Any:
        """The batch's DataFrame (lazy; one Spark job when collected): shuffle by interval, user code
        per interval image, files written. Few plan nodes, since each one is analyzed eagerly.
        ``direct``: the tasks read the batch's files themselves (``_direct.py``; ``prep`` unused)."""

        comp = self.comp
        ivs = sorted(self.owner.intervals)
        place = self._place(ivs, partitions)
        spec = ImageSpec(
            comp=comp, rows_root=local_root(self.layout.rows),
            images={i: tuple(decode_path(f.path) for f in self.files.get(i, ())) for i in ivs},
            sequencers=dict(self.owner.sequencers),
            stream_roots={s: local_root(self.layout.stream(s)) for s in comp.outputs},
            wm=wm, now_ms=now_ms, horizon_ms=horizon_ms, commit_id=commit_id, rows_schema=arrow_schema(rows_file_ddl()),
            stream_schema=arrow_schema(stream_schema_ddl()), stream_format_version=STREAM_FORMAT_VERSION,
            route_late=comp.late_policy is LatePolicy.ROUTE, summary_schema=arrow_schema(SUMMARY_DDL),
            strong=comp.strong_productions if strong is None else strong)
        if direct is not None or prep is None:
            # one task per partition index, each with its intervals of `place`: the tasks read the
            # batch's files themselves, or there is no input (due timers only): one stage
            tasks = tuple(tuple(iv for iv, t in place if t == i) for i in range(partitions))
            fn = (direct_task_fn(spec, dataclasses.replace(direct, tasks=tasks)) if direct is not None
                  else markers_task_fn(spec, tasks))
            return TaskJob(session.sparkContext.parallelize(range(partitions), partitions)
                           .mapPartitionsWithIndex(fn, preservesPartitioning=True))
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
        try:
            rows = out.rdd.collect() if isinstance(out, TaskJob) else out.toArrow().to_pylist()
        except Exception as exc:  # noqa: BLE001 - the fence check in the tasks
            if STALE_MARK in str(exc):
                raise ImagesStale(str(exc).split(STALE_MARK, 1)[1].splitlines()[0]) from exc
            raise
        return BatchOutput(rows)

    def _markers(self, session: Any, place: tuple[tuple[int, int], ...]) -> Any:
        """One row per owned interval (so every interval gets a task), made once per session.

        Built from ``range`` in one partition: a frame from Python rows (``createDataFrame``)
        would start a Python worker per partition in every batch's map stage (~0.35 s each)."""
        from pyspark.sql import functions as F

        # the JVM session's identity: foreachBatch hands each batch a new Python wrapper
        ivs = tuple(iv for iv, _t in place)
        key = (session._jsparkSession.hashCode(), ivs)
        if self._marker_frame is None or self._marker_frame[0] != key:
            cols = [F.lit(None).cast(t).alias(c) for c, t in (d.split() for d in PREP_DDL.split(", "))]
            pick = F.element_at(F.array(*[F.lit(i) for i in ivs]), (F.col("id") + 1).cast("int"))
            df = session.range(0, len(ivs), 1, 1).select(*cols, pick.alias("interval"), F.lit(True).alias("_m"))
            self._marker_frame = (key, df)
        return self._marker_frame[1]

    def _place(self, ivs: list[int], partitions: int) -> tuple[tuple[int, int], ...]:
        self._placement = place_intervals(ivs, self._work, partitions, self._placement)
        return self._placement

    def observe(self, out: BatchOutput) -> None:
        """Remember each interval's work in this batch (for :meth:`_place`)."""
        for s in out.summaries:
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

    # ------------------------------------------------------------------ step 5

    def commit(self, out: BatchOutput, *, commit_id: str, writer: str,
               meta: Mapping[str, Any] | None = None) -> int | None:
        """The fenced commit of the new images; returns the rows table version (None: nothing to do).
        ``meta``: more entries for the commit's metadata (the watermark the batch acted on)."""
        name = self.comp.name
        new = [s for s in out.summaries if s.get("new_path")]
        if not new:
            return None
        ivs = sorted(int(s["interval"]) for s in new)
        seqs = self.owner.sequencers
        info = json.dumps({**(meta or {}), "deltawheel": COMMIT_META_VERSION, "kind": "commit", "writer": writer,
                           "computation": name, "commit_id": commit_id, "write_path": "image",
                           "sequencers": {str(iv): seqs[iv] for iv in ivs}}, sort_keys=True)
        parts = [{"computation": name, "interval": str(iv)} for iv in ivs]
        adds = {int(s["interval"]): new_add(s["new_path"], {"computation": name, "interval": str(s["interval"])},
                                            s["new_size"], s["new_rows"]) for s in new}
        removes = [f for iv in ivs for f in self.files.get(iv, ())]
        try:
            version = self.log.commit(remove=removes, add=list(adds.values()), user_metadata=info,
                                      read_partitions=[f"computation = '{name}' AND interval = {iv}" for iv in ivs],
                                      untouched_since=(self.version, parts))
        except StaleFilesError as exc:
            raise ImagesStale(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - Delta's conflict exceptions
            from deltawheel.statestore.fencing import translate_commit_error

            err = translate_commit_error(exc, sequencers=seqs)
            if err is None:
                raise
            if isinstance(err, StaleSequencerError):
                raise err from exc
            raise ImagesStale(f"concurrent commit on {name}'s partitions: {err}") from exc
        assert version is not None
        for s in new:
            iv = int(s["interval"])
            self.files[iv] = [FileEntry(s["new_path"], (("computation", name), ("interval", str(iv))),
                                        int(s["new_size"]), False, adds[iv])]
        self.version = version
        return version

    def check_fences(self) -> None:
        """After a conflict: a newer fence on an owned interval means this writer is a zombie."""
        self.owner.store.check_fences(self.comp.name, self.owner.sequencers)

    # ------------------------------------------------------------------ step 6

    def deliver(self, out: BatchOutput, *, version: int | None) -> int:
        """Append the production files to their streams; once per (interval, version)."""
        by_stream: dict[str, dict[str, list[str]]] = {}
        n = 0
        for s in out.summaries:
            for p in s.get("prod_files") or ():
                app = self._app(int(s["interval"]))
                by_stream.setdefault(p["stream"], {}).setdefault(app, []).append(
                    new_add(p["path"], {}, p["size"], p["num_rows"]))
                n += int(p["num_rows"])
        for stream, files in sorted(by_stream.items()):
            log = self._stream_log(stream)
            if version is None:  # weak productions: blind append, consumers dedup by record id
                log.commit(add=[a for adds in files.values() for a in adds])
                continue
            self._deliver_strong(stream, log, files, version)
        return n

    def _deliver_strong(self, stream: str, log: TableLog, files: dict[str, list[str]], version: int) -> None:
        """Append once per (app id, version), unless this writer was taken over since ``version``.

        A zombie whose commit landed just before a takeover may still be delivering it while
        the new owner redelivers the same checkpoint (an insert-only MERGE by record id). So
        the append is not blind: it records the whole stream as read (a MERGE that inserted
        after the append's snapshot makes it fail; a MERGE that read before the append landed
        fails and re-reads), and once its snapshot is taken it looks for a claim or fence of
        this computation committed after ``version`` (then the new owner redelivers: raise)."""
        from deltawheel.statestore.fencing import translate_commit_error

        for attempt in itertools.count(1):
            self._read_delivered(stream, list(files))  # read once (one replay for all app ids), then remembered
            todo = {app: adds for app, adds in files.items() if self._delivered[(stream, app)] < version}
            if not todo:
                return
            try:
                log.commit(add=[a for adds in todo.values() for a in adds], app_versions={a: version for a in todo},
                           read_partitions=["true"], check=lambda: self._not_taken_over_since(version))
            except StaleSequencerError:
                raise
            except Exception as exc:  # noqa: BLE001 - Delta's conflict exceptions
                err = translate_commit_error(exc, sequencers={})
                if not isinstance(err, CommitConflictError) or attempt >= _DELIVERY_RETRIES:
                    raise
                for app in todo:  # another delivery landed meanwhile: read the versions again
                    self._delivered.pop((stream, app), None)
                time.sleep(random.uniform(0.01, 0.02 * min(attempt, 10)))
                continue
            for app in todo:
                self._delivered[(stream, app)] = version
            return

    def _not_taken_over_since(self, version: int) -> None:
        """Raise StaleSequencerError if the rows table holds a claim or fence of this computation
        with a newer sequencer on an owned interval, committed after ``version``."""
        mine = self.owner.sequencers
        for _v, info in commit_infos(self.layout.rows, after=version) or ():
            try:
                meta = json.loads(info.get("userMetadata") or "{}")
            except ValueError:
                continue
            if not isinstance(meta, dict) or meta.get("kind") not in ("claim", "fence") \
                    or meta.get("computation") != self.comp.name:
                continue
            newer = {int(iv): int(seq) for iv, seq in (meta.get("sequencers") or {}).items()
                     if int(iv) in mine and int(seq) > mine[int(iv)]}
            if newer:
                raise_if_fenced(self.comp.name, newer, mine)
