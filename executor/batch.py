"""One computation's micro-batches on Spark ``foreachBatch``: the per-batch protocol.

For each micro-batch (``ComputationExecutor.run_batch``):

1. Check the leases of the owned intervals (a lost or suspended ZooKeeper
   session stops the batch before anything happens).
2. Prepare the input in the JVM: key extraction, dead letters for records
   without a usable key, the late flag (event time behind the watermark the
   last committed batch acted on, recorded with its commit: ``lateness.py``).
   (With the pipeline runner's direct read the image tasks compute the same
   from the batch's files themselves: ``_direct.py``.)
3. Load the rows of the batch's keys and of keys with due timers or
   delivered-but-not-cleared productions (one join against the rows table).
4. Run user code in Spark tasks, one task per group of intervals, per key:
   dedup against the key's stored record ids, then (``LatePolicy.ROUTE``) the
   late records that are no duplicates go to the late-data table, records in
   event-time order, due timers in timestamp order (``keyrun.run_key``). The
   result (new row images, productions, dead letters, routed records) is
   materialized once.
5. Commit all changed rows in one fenced Delta transaction (``RowStore``),
   recording the watermarks the batch acted on.
6. Deliver the productions to their stream tables idempotently (insert if the
   record id is absent). Checkpoints are cleared by the next batch's commit:
   every production still in a row at the start of a batch was delivered.
7. Publish the intervals' oldest work and advance the low watermark.

Weak productions (``strong_productions = False``) are appended to their
streams before step 5, without a checkpoint, by a thread the batch waits on
for ``straggler_timeout_s``. A delivery still running then is a *straggler*
(MillWheel's straggler checkpointing): the batch checkpoints its productions
in the rows after all (the image path runs the batch's user code once more,
the MERGE path writes the productions it already has into ``pending``),
commits and goes on; the low watermark is held at the straggled productions
until the next batch has *settled* the straggler (joined it, and redelivered
from the checkpoint if it failed) before its commit clears the checkpoint.

On the image write path step 6 is asynchronous: the productions are checkpointed
in the committed rows, so the batch returns once their delivery has started,
and the next batch's user code overlaps it. The low watermark is held at the
undelivered productions meanwhile, and the delivery is *settled* like a
straggler (joined; redelivered from the checkpoint if it failed) before the
next commit clears that checkpoint, before a timers-only batch decides it has
nothing to do, and on ``settle()`` / ``stop()``. Both kinds of open delivery are
kept by :class:`~deltawheel.executor.inflight.InFlight`.

A crash between or inside any steps followed by a restart (recovery scan +
redelivery of checkpointed productions + Spark replaying the batch) gives the
same rows and stream records as a run without the crash.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.clock import Clock, SystemClock
from deltawheel.statestore.damage import check_store
from deltawheel.statestore.deltatxn import is_local
from deltawheel.statestore.exceptions import ConfigError, StaleSequencerError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.owner import IntervalOwner
from deltawheel.statestore.rows import Production
from deltawheel.statestore.watermarks import WatermarkAuthority

from . import _tasks
from ._direct import DirectBatch, DirectSource, batch_files
from ._tasks import DEFAULT_MAX_EVENT_AHEAD_MS
from .computation import Computation
from .delivery import (
    deliver_frame,
    deliver_productions,
    fill_positions,
    record_dead_letters,
    record_late,
    side_frame,
)
from .faults import BatchFailedError, FaultPoint
from .images import ImagesStale, ImageWriter
from .inflight import InFlight, OpenDelivery
from .lateness import ActedMark, read_mark
from .reports import BatchReport, format_report

WRITE_PATHS = ("auto", "image", "merge")
_LOG = logging.getLogger(__name__)

__all__ = ["ComputationExecutor", "BatchReport", "FaultPoint", "BatchFailedError"]


class ComputationExecutor:
    """Runs one computation's batches; pass it to ``writeStream.foreachBatch``.

    Args:
        spark: the session (``df.sparkSession`` inside foreachBatch is the same one).
        layout: the store.
        computation: the user's computation (instance).
        owner: holds the computation's intervals (leases + fenced commits).
        authority: the watermark authority; None runs without event-time progress
            (event-time timers then fire only when :meth:`run_batch` / :meth:`flush` are given
            ``input_watermark_ms``).
        upstream: ``"injector:NAME"`` / ``"computation:NAME"`` entries feeding it (their
            watermarks make the input low watermark; none: no event-time progress either).
        manual_watermarks: the caller fires event-time timers itself by passing
            ``input_watermark_ms``: a computation declaring ``event_time_timers`` may then run
            without a watermark source (otherwise :meth:`start` refuses with ``ConfigError``), and
            no warning is logged when event-time timers are set without one.
        on_batch_end: called with each micro-batch's observed max event time (injectors
            use it to move their watermark estimate).
        write_path: ``"image"`` (interval images + one Delta transaction per batch,
            ``images.py``; local or ``file:`` stores), ``"merge"`` (a fenced MERGE per batch,
            any store), or ``"auto"`` (image when the store is local, else merge).
        intervals: the key intervals this instance takes (default: all). Several instances
            (e.g. Spark applications) may split a computation's intervals: each reads the
            whole input and processes the records of its own intervals; a record that becomes
            a dead letter is written by the owner of its key's interval (interval 0 when it
            has no key).
        event_ahead_ms: per input stream, how far (ms) a record's event time may be ahead of the
            clock; a record further ahead is a dead letter (with the reason) and moves no
            watermark. Default: one day for every input ({} turns the check off).
    """

    def __init__(self, spark: Any, layout: StoreLayout, computation: Computation, *, owner: IntervalOwner,
                 authority: WatermarkAuthority | None = None, upstream: Sequence[str] = (),
                 clock: Clock = SystemClock(), faults: Callable[[FaultPoint, int], None] | None = None,
                 on_batch_end: Callable[[int | None, int | None], None] | None = None,
                 progress: Callable[[str], None] | None = None, partitions: int | None = None,
                 write_path: str = "auto", intervals: Sequence[int] | None = None,
                 event_ahead_ms: Mapping[str, int] | None = None, manual_watermarks: bool = False) -> None:
        type(computation).validate()
        if intervals is not None:
            bad = sorted(set(intervals) - set(range(computation.num_intervals)))
            if bad or not intervals:
                raise ConfigError(f"{computation.name}: intervals must be a non-empty subset of 0.."
                                  f"{computation.num_intervals - 1}, got {sorted(set(intervals))}")
        self._wanted = None if intervals is None else tuple(sorted(set(intervals)))
        if write_path not in WRITE_PATHS:
            raise ConfigError(f"write_path must be one of {', '.join(WRITE_PATHS)}, not {write_path!r}")
        if write_path == "auto":
            write_path = "image" if is_local(layout.rows) else "merge"
        elif write_path == "image" and not is_local(layout.rows):
            raise ConfigError(f"write_path='image' writes the interval images with pyarrow and supports local "
                              f"(or file:) stores only; {layout.root} is remote: use write_path='merge' or 'auto'")
        self.write_path = write_path
        self._images: ImageWriter | None = None
        self._oldest_iv: dict[int, int | None] = {}
        self._next_proc_iv: dict[int, int | None] = {}  # image path: earliest processing-time timer
        self.spark = spark
        self.layout = layout
        self.comp = computation
        self.owner = owner
        self.authority = authority
        self.upstream = tuple(upstream)
        self.manual_watermarks = manual_watermarks
        self._warned_no_watermark = False
        self.clock = clock
        self.faults = faults
        self.on_batch_end = on_batch_end
        self.progress = progress
        self.partitions = partitions or max(1, min(computation.num_intervals,
                                                   spark.sparkContext.defaultParallelism))
        self.reports: list[BatchReport] = []
        self._mark: ActedMark | None = None  # the newest committed batch's (``lateness.py``)
        self._oldest: dict[int, dict[str, int]] = {}
        self._started = False
        self.start_s: dict[str, float] = {}
        self.recovered: dict[str, int] = {}  # checkpointed productions the start delivered: appended / merged
        self._wm_lock = threading.Lock()
        self.inflight = InFlight(computation, fault=self._fault, log=self._log,
                                 published=self._publish_watermarks if authority is not None else None)
        self._prep_cache: dict[Any, Any] = {}  # input-preparation column expressions (prepare_input)
        # set by the pipeline runner when the input is a Parquet injector its tasks can read
        # themselves (image path only; ``_direct.py``); a batch that did says so in its report
        self.direct_source: DirectSource | None = None
        # input stream -> how far (ms) a record's event time may be ahead of the processing clock;
        # later records are dead letters and move no watermark (the pipeline runner sets the bound
        # of each injector it reads, ``max_event_ahead_ms``); default: one day for every input
        self.event_ahead_ms: Mapping[str, int] = (
            {s: DEFAULT_MAX_EVENT_AHEAD_MS for s in computation.inputs} if event_ahead_ms is None
            else dict(event_ahead_ms))

    # ------------------------------------------------------------- lifecycle

    def start(self, *, wait_s: float = 0.0) -> None:
        """Acquire the intervals, fence them, run the recovery scan, redeliver checkpoints."""
        from deltawheel.statestore.streams import ensure_stream_table

        if self.comp.event_time_timers and not self.manual_watermarks and not self._has_watermark_source():
            raise ConfigError(
                f"{self.comp.name} uses event-time timers, but its executor has no watermark source "
                f"({'no upstream' if self.authority is not None else 'authority=None'}), so they would never "
                "fire. Give it one: ComputationExecutor(..., authority=WatermarkAuthority(client, pipeline=...), "
                "upstream=['injector:NAME'], on_batch_end=<a hook publishing the injector's watermark with "
                "publish_watermark>) (README, 'Embedding it in your Spark job'), or pass manual_watermarks=True "
                "if you fire them yourself with flush(input_watermark_ms=...)")
        t_start = time.monotonic()
        check_store(self.layout)  # a lost or torn commit refuses the start (statestore/damage.py)
        image = self.write_path == "image"
        # the image path fences with the claim alone and recovers from the images it loads
        # (and checks the fence rows there too: ImageWriter.recovery)
        rec = self.owner.acquire(self._wanted, wait_s=wait_s, claim_only=image, scan=not image,
                                 check_fences=not image)
        t_acq = time.monotonic()
        for s in self.comp.outputs:  # created by the owner, after the leases are held
            ensure_stream_table(self.spark, self.layout, s)
        if self.authority is not None:
            self.authority.declare(self.comp.name, upstream=self.upstream, num_intervals=self.comp.num_intervals)
        self._mark = read_mark(self.spark, self.layout.rows, self.comp.name, self.owner.intervals)
        # oldest work per interval, kept from the rows we write (authoritative while we hold the lease)
        self._oldest = {iv: {} for iv in self.owner.intervals}
        for r in rec.rows.values():
            self._note_oldest(r.interval, r.key, r.next_event_timer_ms, r.watermark_hold_ms, deleted=False)
        pending: list[Production] = [p for _, p in rec.pending]
        # the commit that checkpointed each (the row's commit id: kept by any rewrite of the table)
        commit_ids = {p.production_id: rec.rows[k].commit_id if k in rec.rows else None for k, p in rec.pending}
        appended = 0
        if image:
            self._images = ImageWriter(self.spark, self.layout, self.comp, self.owner)
            try:
                self._images.load()
                found = self._images.recovery()
                self._oldest_iv, self._next_proc_iv = found.oldest, found.next_processing
                pending, commit_ids = found.merge_productions(), found.merge_commit_ids()
                appended = self._images.redeliver(found.appends)
            except StaleSequencerError:
                self.owner.release()
                raise
        self.start_s = {"acquire_fence_recover": round(t_acq - t_start, 3),
                        "total": round(time.monotonic() - t_start, 3)}
        if appended:
            self._log(f"{self.comp.name}: recovery delivered {appended} checkpointed productions of the last "
                      "commit (its delivery had not landed)")
        if pending:
            deliver_productions(self.spark, self.layout, pending, producer=self.comp.name, commit_ids=commit_ids)
            self._log(f"{self.comp.name}: recovery redelivered {len(pending)} checkpointed productions "
                      "(records already in their streams are skipped)")
        self.recovered = {"appended": appended, "merged": len(pending)}
        self.start_s["total"] = round(time.monotonic() - t_start, 3)
        self._log(f"{self.comp.name}: started in {self.start_s['total']:.1f}s (leases, fence and recovery scan "
                  f"{self.start_s['acquire_fence_recover']:.1f}s)")
        self._started = True

    def stop(self) -> None:
        try:
            self.inflight.settle()
        finally:
            self.owner.release()
        self._started = False

    def __call__(self, df: Any, batch_id: int) -> None:
        self.run_batch(df, batch_id)

    # ----------------------------------------------------------- the batch

    def input_watermark(self) -> int | None:
        """min over upstream low watermarks (None until all are known)."""
        if self.authority is None or not self.upstream:
            return None
        marks = []
        for u in self.upstream:
            kind, _, name = u.partition(":")
            wm = (self.authority.injector_watermark(name) if kind == "injector"
                  else self.authority.advance_low_watermark(name))
            if wm is None:
                return None
            marks.append(wm)
        return min(marks)

    def run_batch(self, df: Any | None, batch_id: int, *, input_watermark_ms: int | None = None,
                  use_authority: bool = True) -> BatchReport:
        """Run the protocol on one micro-batch (``df`` None: timers only)."""
        from pyspark.sql import functions as F

        if not self._started:
            self.start()
        started = time.monotonic()
        marks: list[tuple[str, float]] = []
        last = [started]

        def mark(step: str) -> None:
            t = time.monotonic()
            marks.append((step, round(t - last[0], 3)))
            last[0] = t

        comp = self.comp
        # Step 1: leases.
        self.owner.check()
        wm_in = self.input_watermark() if use_authority and input_watermark_ms is None else input_watermark_ms
        now = self.clock.now_ms()
        # ids seen before the horizon are dropped: a processing time back from now (each id
        # carries when it was seen, so a restart keeps the horizon: Computation.dedup_retention)
        horizon = now - comp.dedup_retention_ms() if comp.exactly_once else None
        # Step 2: input preparation in the JVM.
        # A record is late when it is behind the watermark this computation already acted on
        # (the newest committed batch's: its timers fired up to there); timers now fire with
        # wm_in. A replay of that batch decides as its first attempt did.
        wm_late, wm_in = self._lateness(df, batch_id, wm_in)
        acted = ActedMark(batch_id if df is not None else None, wm_late, wm_in, tuple(sorted(self.owner.intervals)))
        if self._images is not None and df is None:
            self.settle()  # the previous batch's delivery: a timers-only batch may have nothing to do
            if self._nothing_due(wm_in, now):
                return self._skipped(batch_id, wm_in, started)
        if self._images is not None:
            return self._image_batch(df, batch_id, wm_in=wm_in, wm_late=wm_late, now=now, horizon=horizon,
                                     started=started, marks=marks, mark=mark, acted=acted)
        prep = (_tasks.prepare_input(df, comp, wm_late, cache=self._prep_cache, ahead=(now, self.event_ahead_ms))
                if df is not None else None)
        records_in = late_routed = dead_in = 0
        obs_max = obs_min = None
        if prep is not None:
            if len(self.owner.intervals) < comp.num_intervals:  # the records of our intervals only
                iv = _tasks.interval_of_key(comp.num_intervals)
                prep = prep.where(F.coalesce(iv, F.lit(0)).isin(list(self.owner.intervals)))
            prep = prep.localCheckpoint(eager=True)
            ok_ts = F.when(F.col("_bad").isNull(), F.col("timestamp_ms"))  # dead letters move no watermark
            agg = prep.agg(F.count(F.lit(1)).alias("n"), F.max(ok_ts).alias("mx"), F.min(ok_ts).alias("mn"),
                           F.sum(F.when(F.col("_bad").isNotNull(), 1).otherwise(0)).alias("bad")).collect()[0]
            records_in, obs_max, obs_min = int(agg["n"]), agg["mx"], agg["mn"]
            dead_in = int(agg["bad"] or 0)
            if dead_in:
                record_dead_letters(self.spark, self.layout, prep.where(F.col("_bad").isNotNull()),
                                    computation=comp.name, batch_id=batch_id)
            # late records are routed by the tasks, after dedup (a retry of a record run on time
            # is a duplicate, not late data)
            prep = prep.where(F.col("_bad").isNull())
        mark("prepare")
        self._fault(FaultPoint.AFTER_PREPARE, batch_id)
        # Step 3 + 4: load rows, run user code in tasks, materialize once.
        commit_id = f"{comp.name}:{batch_id}:{now}"
        out = _tasks.run_in_tasks(self.spark, self.layout, comp, prep, intervals=self.owner.intervals,
                                  input_watermark_ms=wm_in, now_ms=now, dedup_horizon_ms=horizon,
                                  partitions=self.partitions, sequencers=self.owner.sequencers,
                                  commit_id=commit_id)
        try:
            out = out.localCheckpoint(eager=True)
        except Exception as exc:  # noqa: BLE001 - user code errors surface here
            raise BatchFailedError(_tasks.user_error_message(exc, comp.name, batch_id)) from exc
        stats = out.agg(*[F.sum(c).alias(c) for c in ("processed", "duplicates", "fired", "late", "n_prods",
                                                       "n_dead", "n_routed", "ids_expired")],
                        F.sum(F.when(F.col("_op") != "none", 1).otherwise(0)).alias("written"),
                        F.min(F.when(F.col("_op") != "delete", F.col("next_event_timer_ms"))).alias("event_timer")
                        ).collect()[0]
        st = {k: int(v or 0) for k, v in stats.asDict().items() if k != "event_timer"}
        self._warn_if_no_watermark(wm_in, stats["event_timer"])
        mark("load_and_user_code")
        self._fault(FaultPoint.AFTER_USER_CODE, batch_id)
        if st["n_dead"]:
            record_dead_letters(self.spark, self.layout, _tasks.dead_letter_frame(out), computation=comp.name,
                                batch_id=batch_id)
        if st["n_routed"]:
            late_routed = record_late(self.spark, self.layout, _tasks.routed_frame(out), computation=comp.name,
                                      watermark_ms=wm_late, batch_id=batch_id)
        prods = _tasks.productions_frame(out)
        deliver = functools.partial(deliver_frame, self.spark, self.layout, prods, streams=comp.outputs,
                                    producer=comp.name)  # idempotent: insert if the record id is absent
        straggler = None
        if not comp.strong_productions and st["n_prods"]:
            straggler = self.inflight.weak(deliver, batch_id)
        rows_out = out.where(F.col("_op") != "none")
        straggler_ts = None
        if straggler is not None:  # checkpoint: each row's new productions become its pending ones
            rows_out = rows_out.withColumn("pending", F.col("new_prods"))
            straggler_ts = prods.agg(F.min("timestamp_ms")).collect()[0][0]
        rows_out = rows_out.select(*_tasks.ROW_COLUMNS)
        # Step 5: the fenced commit (a straggler of the previous batch is settled first: the
        # commit clears its checkpoint).
        self.inflight.settle()
        self._fault(FaultPoint.BEFORE_COMMIT, batch_id)
        t0 = time.monotonic()
        if st["written"]:
            self.owner.store.commit_frame(comp.name, rows_out,
                                          sequencers=self.owner.sequencers, intervals=self.owner.intervals,
                                          commit_id=commit_id, lease_check=self.owner.check, meta=acted.to_meta())
            self._mark = acted
        commit_s = time.monotonic() - t0
        if st["written"] and self.authority is not None:
            for r in (out.where(F.col("_op") != "none")
                      .select("interval", "key", "next_event_timer_ms", "watermark_hold_ms", "_op")
                      .toArrow().to_pylist()):
                self._note_oldest(r["interval"], r["key"], r["next_event_timer_ms"], r["watermark_hold_ms"],
                                  deleted=r["_op"] == "delete")
        mark("dead_letters_and_commit")
        if straggler is not None:
            self.inflight.adopt(straggler, redeliver=deliver, min_ts=straggler_ts)
        self._fault(FaultPoint.AFTER_COMMIT, batch_id)
        # Step 6: deliver (idempotent); checkpoints are cleared by the next commit.
        if comp.strong_productions and st["n_prods"]:
            deliver()
        mark("deliver")
        self._fault(FaultPoint.AFTER_DELIVERY, batch_id)
        # Step 7: watermarks.
        self._fault(FaultPoint.BEFORE_WATERMARK, batch_id)
        if self.on_batch_end is not None:
            self.on_batch_end(obs_min, obs_max)
        low = self._publish_watermarks() if self.authority is not None else None
        mark("watermarks")
        report = BatchReport(batch_id, records_in, st["processed"], st["duplicates"], st["late"], late_routed,
                             st["n_dead"] + dead_in, st["fired"], st["n_prods"], st["written"], wm_in, low,
                             commit_s, time.monotonic() - started, tuple(marks), straggled=straggler is not None,
                             ids_expired=st["ids_expired"])
        self.reports.append(report)
        self._log(format_report(comp.name, report, now_ms=self.clock.now_ms()))
        return report

    def _image_batch(self, df: Any | None, batch_id: int, *, wm_in: int | None, wm_late: int | None, now: int,
                     horizon: int | None, started: float, marks: list[tuple[str, float]],
                     mark: Callable[[str], None], acted: ActedMark) -> BatchReport:
        """Steps 2-7 on the image write path (``images.py``)."""
        comp = self.comp
        images = self._images
        assert images is not None
        commit_id = f"{comp.name}:{batch_id}:{now}"
        self._fault(FaultPoint.AFTER_PREPARE, batch_id)
        strong = comp.strong_productions
        straggler: OpenDelivery | None = None
        direct = None
        if df is not None and self.direct_source is not None:
            files = batch_files(df, self.direct_source)
            if files is not None:
                bound = self.event_ahead_ms.get(self.direct_source.stream)
                direct = DirectBatch(self.direct_source, files, comp.num_intervals, wm_late, (),
                                     None if bound is None else (now, bound))
        attempt = 0
        while True:
            attempt += 1
            # Step 2-4: input preparation, the interval images, user code: one Spark job.
            session = df.sparkSession if df is not None else self.spark
            prep = (_tasks.prepare_input(df, comp, wm_late, cache=self._prep_cache, ahead=(now, self.event_ahead_ms))
                    if df is not None and direct is None else None)
            frame = images.plan(session, prep, wm=wm_in, now_ms=now, horizon_ms=horizon, commit_id=commit_id,
                                partitions=self.partitions, strong=strong, direct=direct)
            mark("plan")
            try:
                out = images.collect(frame)
            except ImagesStale:
                out = None
            except Exception as exc:  # noqa: BLE001 - user code errors surface here
                raise BatchFailedError(_tasks.user_error_message(exc, comp.name, batch_id)) from exc
            if out is not None:
                mark("load_and_user_code")
                self._fault(FaultPoint.AFTER_USER_CODE, batch_id)
                dead, late_rows = out.side("dead"), out.side("late")
                if df is not None and any(r["position"] is None for r in dead):
                    fill_positions(prep if prep is not None else
                                   _tasks.prepare_input(df, comp, wm_late, cache=self._prep_cache,
                                                        ahead=(now, self.event_ahead_ms)), dead)
                if dead:
                    record_dead_letters(session, self.layout, side_frame(session, dead, dead=True),
                                        computation=comp.name, batch_id=batch_id)
                if late_rows:
                    record_late(session, self.layout, side_frame(session, late_rows, dead=False),
                                computation=comp.name, watermark_ms=wm_late, batch_id=batch_id)
                if not strong and out.total("n_prods"):
                    straggler = self.inflight.weak(functools.partial(images.deliver, out, version=None), batch_id)
                    if straggler is not None:  # checkpoint after all: the same user code once more
                        strong = True
                        attempt -= 1
                        continue
                # Step 5: the fenced commit (the previous batch's delivery is settled first: the
                # commit clears its checkpoint).
                self.inflight.settle()
                mark("settle")
                self._fault(FaultPoint.BEFORE_COMMIT, batch_id)
                self.owner.check()
                t0 = time.monotonic()
                try:
                    version = images.commit(out, commit_id=commit_id, writer=self.owner.store.writer,
                                            meta=acted.to_meta())
                    if version is not None:
                        self._mark = acted
                    break
                except ImagesStale:
                    pass
            # someone touched our partitions: a takeover (-> StaleSequencerError) or a reload
            images.check_fences()
            images.load()
            if attempt == 3:
                raise BatchFailedError(f"{comp.name} batch {batch_id}: the interval images kept changing "
                                       "under this writer; restart the query")
        assert out is not None
        commit_s = time.monotonic() - t0
        mark("commit")
        if straggler is not None:
            self.inflight.adopt(straggler, redeliver=functools.partial(images.deliver, out, version=version),
                                min_ts=_prod_min_ts(out))
        images.observe(out)
        self._warn_if_no_watermark(wm_in, min((s["oldest_ms"] for s in out.summaries
                                               if s.get("oldest_ms") is not None), default=None))
        for s in out.summaries:  # the committed images' oldest work (before the delivery thread publishes)
            if s["interval"] is not None:
                self._oldest_iv[int(s["interval"])] = s["oldest_ms"]
                self._next_proc_iv[int(s["interval"])] = s["next_proc_ms"]
        self._fault(FaultPoint.AFTER_COMMIT, batch_id)
        # Step 6: deliver (idempotent per interval and rows version), asynchronously: the
        # productions are checkpointed in the rows just committed; cleared by the next commit.
        if comp.strong_productions and out.total("n_prods"):
            self.inflight.start(functools.partial(images.deliver, out, version=version), batch_id,
                                _prod_min_ts(out))
        else:
            self._fault(FaultPoint.AFTER_DELIVERY, batch_id)
        mark("deliver")
        # Step 7: watermarks.
        self._fault(FaultPoint.BEFORE_WATERMARK, batch_id)
        mins = [s["min_ts"] for s in out.summaries if s["min_ts"] is not None]
        maxs = [s["max_ts"] for s in out.summaries if s["max_ts"] is not None]
        if self.on_batch_end is not None:
            self.on_batch_end(min(mins) if mins else None, max(maxs) if maxs else None)
        low = self._publish_watermarks() if self.authority is not None else None
        mark("watermarks")
        t = out.total
        report = BatchReport(batch_id, t("records_in"), t("processed"), t("duplicates"), t("late"),
                             len(out.side("late")), len(out.side("dead")), t("fired"), t("n_prods"),
                             t("keys_written"), wm_in, low, commit_s, time.monotonic() - started, tuple(marks),
                             straggled=straggler is not None, direct=direct is not None,
                             ids_expired=t("ids_expired"), bloom_checked=t("bloom_checked"),
                             bloom_maybe=t("bloom_maybe"), bloom_false_pos=t("bloom_false_pos"),
                             bloom_bytes=t("bloom_bytes"))
        self.reports.append(report)
        self._log(format_report(comp.name, report, now_ms=self.clock.now_ms()))
        return report

    def flush(self, *, input_watermark_ms: int | None = None) -> BatchReport:
        """A batch without input: fire what the (given or published) watermark makes due."""
        bid = (self.reports[-1].batch_id + 1) if self.reports else 0
        return self.run_batch(None, bid, input_watermark_ms=input_watermark_ms)

    # -------------------------------------------------------------- helpers

    def _has_watermark_source(self) -> bool:
        return self.authority is not None and bool(self.upstream)

    def _warn_if_no_watermark(self, wm_in: int | None, event_timer_ms: int | None) -> None:
        """Once: event-time timers were set, and no watermark source will ever make them due."""
        if (event_timer_ms is None or wm_in is not None or self.manual_watermarks or self._warned_no_watermark
                or self._has_watermark_source()):
            return
        self._warned_no_watermark = True
        msg = (f"WARNING {self.comp.name}: event-time timers are set (the earliest at {event_timer_ms}), but this "
               "executor has no watermark source (a WatermarkAuthority and upstream injectors or computations), "
               "so they fire only when run_batch/flush is given input_watermark_ms; otherwise they never fire "
               "and the keys' state grows. Give the executor authority=..., upstream=[...] (README, 'Embedding "
               "it in your Spark job'), or pass manual_watermarks=True to say the caller moves the watermark")
        _LOG.warning(msg)
        self._log(msg)

    def _lateness(self, df: Any | None, batch_id: int, wm_in: int | None) -> tuple[int | None, int | None]:
        """(the watermark the batch judges lateness against, its input watermark): the newest
        committed batch's acted watermark and ``wm_in``, or for a replay of that very batch
        (Spark re-runs it after a crash) the values its first attempt used (``lateness.py``)."""
        m = self._mark
        if m is None:
            return None, wm_in
        if df is not None and m.batch_id == batch_id:
            return m.late_ms, m.input_ms
        return m.acted_ms, wm_in

    def _note_oldest(self, interval: int, key: str, timer: int | None, hold: int | None, *, deleted: bool) -> None:
        per = self._oldest.setdefault(interval, {})
        marks = [t for t in (timer, hold) if t is not None]
        if deleted or not marks:
            per.pop(key, None)
        else:
            per[key] = min(marks)

    def _nothing_due(self, wm_in: int | None, now: int) -> bool:
        """A timers-only batch has nothing to do: the last batch of this instance ran under the
        same input watermark (so it fired every event-time timer before it, including ones set
        while firing), no processing-time timer is due, and no straggler is open."""
        if not self.reports or self.reports[-1].input_watermark_ms != wm_in or self.inflight.open is not None:
            return False
        return all(t is None or t > now for t in self._next_proc_iv.values())

    def _skipped(self, batch_id: int, wm_in: int | None, started: float) -> BatchReport:
        last = self.reports[-1]
        report = BatchReport(batch_id, 0, 0, 0, 0, 0, 0, 0, 0, 0, wm_in, last.low_watermark_ms, 0.0,
                             time.monotonic() - started, (("skipped: nothing due", 0.0),))
        self.reports.append(report)
        self._log(format_report(self.comp.name, report, now_ms=self.clock.now_ms()))
        return report

    def settle(self) -> bool:
        """Wait for the last batch's delivery still in flight (asynchronous, or a straggler);
        redeliver from its checkpoint if it failed, then publish the low watermark it held.
        Returns whether there was one. The pipeline runner calls it after each flush, so the
        next stage reads every production of this one."""
        if self.inflight.open is None:
            return False
        self.inflight.settle()
        if self.authority is not None:
            self._publish_watermarks()
        return True

    def _publish_watermarks(self) -> int | None:
        assert self.authority is not None
        with self._wm_lock:  # the batch and its delivery thread both publish
            held = self.inflight.held_ts()
            works: dict[int, tuple[int | None, int]] = {}
            for iv, seq in self.owner.sequencers.items():
                if self._images is not None:
                    oldest = self._oldest_iv.get(iv)
                else:
                    per = self._oldest.get(iv) or {}
                    oldest = min(per.values()) if per else None
                if held is not None:  # undelivered (straggling) productions hold the watermark
                    oldest = held if oldest is None else min(oldest, held)
                works[iv] = (oldest, seq)
            self.authority.publish_oldest_works(self.comp.name, works)  # one ZooKeeper transaction
            return self.authority.advance_low_watermark(self.comp.name)

    def _fault(self, point: FaultPoint, batch_id: int) -> None:
        if self.faults is not None:
            self.faults(point, batch_id)

    def _log(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)


def _prod_min_ts(out: Any) -> int | None:
    """The oldest timestamp among a batch's production files (holds the low watermark)."""
    return min((int(p["min_ts"]) for s in out.summaries for p in s.get("prod_files") or ()
                if p.get("min_ts") is not None), default=None)
