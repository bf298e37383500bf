"""One computation's micro-batches on Spark ``foreachBatch``: the per-batch protocol.

:meth:`ComputationExecutor.run_batch` runs DESIGN's seven steps once, whatever the write
path; the write path (``statestore/writepath``: the image path or the MERGE path, picked by
``write_path`` from ``tasks/paths.py``) makes every write of the rows and stream tables, and its
user job (``tasks/job.py``) runs steps 2-4 in Spark tasks. The steps, as the body's ``# Step N``
comments number them:

1. Check the leases of the owned intervals (a lost ZooKeeper session stops the
   batch before anything happens; while the connection is suspended -- a server
   down, the ensemble without quorum -- this and every later ZooKeeper call of the
   batch pause and resume once ZooKeeper serves: ``LeaseManager.await_valid``,
   ``WatermarkAuthority``, bounded by their ``max_pause_s``).
2. Drop duplicates: prepare the input in the JVM (key extraction, dead letters for
   records without a usable key, the late flag: event time behind the watermark the last
   committed batch acted on, recorded with its commit: ``lateness.py``); the tasks then
   dedup against the key's Bloom filter / stored record ids, and (``LatePolicy.ROUTE``)
   route the late records that are no duplicates to the late-data table.
3. Load the rows of the batch's keys and of keys with due timers or
   delivered-but-not-cleared productions (the image path: the interval images; the MERGE
   path: one join against the rows table).
4. Run user code in Spark tasks, per key: records in event-time order, due timers in
   timestamp order (``keyrun.run_key``); the new row images, productions, dead letters and
   routed records are materialized once.
5. Commit all changed rows in one fenced Delta transaction (``WritePath.commit``),
   recording the watermarks the batch acted on and the injector watermarks its step 7
   publishes (``lateness.py``; what ``deltawheel reseed`` restores after ZooKeeper lost them).
6. Deliver the productions to their stream tables idempotently
   (``WritePath.deliver``). Checkpoints are cleared by the next batch's commit: every
   production still in a row at the start of a batch was delivered.
7. Publish the intervals' oldest work and advance the low watermark.

Weak productions (``strong_productions = False``) are appended to their
streams before step 5, without a checkpoint, by a thread the batch waits on
for ``straggler_timeout_s``. A delivery still running then is a *straggler*
(MillWheel's straggler checkpointing): the batch checkpoints its productions
in the rows after all (``UserJob.checkpoint``: the image path runs the batch's user code
once more, the MERGE path writes the productions it already has into ``pending``),
commits and goes on; the low watermark is held at the straggled productions
until the next batch has *settled* the straggler (joined it, and redelivered
from the checkpoint if it failed) before its commit clears the checkpoint.

Where the write path allows it (``deliver_in_background``: the image path) step 6 is
asynchronous: the productions are checkpointed in the committed rows, so the batch returns
once their delivery has started, and the next batch's user code overlaps it. The low
watermark is held at the undelivered productions meanwhile, and the delivery is *settled*
like a straggler (joined; redelivered from the checkpoint if it failed) before the next
commit clears that checkpoint, before a timers-only batch decides it has nothing to do, and
on ``settle()`` / ``stop()``. Both kinds of open delivery are kept by
:class:`~deltawheel.executor.runtime.inflight.InFlight`.

A crash between or inside any steps followed by a restart (``WritePath.acquire``:
recovery + redelivery of checkpointed productions, then Spark replaying the batch) gives
the same rows and stream records as a run without the crash.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.clock import Clock, SystemClock
from deltawheel.statestore.delta.jvm import require_classic_session
from deltawheel.statestore.delta.storefs import supports
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.inspection.damage import check_store
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.writepath import StaleViewError, WritePath
from deltawheel.statestore.writepath.delivery import record_dead_letters, record_late
from deltawheel.statestore.zk.watermarks import WatermarkAuthority

from ..computation import Computation
from ..tasks.image.direct import DirectSource
from ..tasks.input import DEFAULT_MAX_EVENT_AHEAD_MS
from ..tasks.job import BatchRun, UserJob
from ..tasks.paths import PATHS
from .faults import BatchFailedError, FaultPoint
from .hooks import InjectorHook
from .inflight import InFlight, OpenDelivery
from .lateness import ActedMark, read_mark
from .metrics import BatchMetrics, batch_row, state_size
from .reports import BatchReport, format_report, format_watermark
from .rescale import SharedInput

WRITE_PATHS = ("auto", *PATHS)  # "auto": choose_write_path picks one
JOB_DESCRIPTION = "spark.job.description"  # Spark's local property behind setJobDescription
REPORTS_KEPT = 10_000  # reports an executor keeps in memory (``ComputationExecutor.reports``)
_LOG = logging.getLogger(__name__)

__all__ = ["ComputationExecutor", "BatchReport", "FaultPoint", "BatchFailedError", "choose_write_path"]


def choose_write_path(requested: str, root: str) -> tuple[str, str]:
    """(the write path, why) for ``write_path=requested`` on the store at ``root``.

    ``"auto"`` takes the image path wherever Python reaches the store's files (a local folder,
    ``file:`` or ``s3a://``: ``statestore/delta/storefs.py``) and the MERGE path elsewhere.

    >>> choose_write_path("auto", "s3a://bucket/store")[0], choose_write_path("auto", "abfss://c@a/s")
    ('image', ('merge', 'auto: the image path reads and writes files with pyarrow on local, file: and s3a:// stores only; abfss://c@a/s is none of those, so batches take the fenced MERGE path (slower)'))

    Raises:
        ConfigError: an unknown path, or ``"image"`` on a store the image path cannot reach.
    """
    if requested not in WRITE_PATHS:
        raise ConfigError(f"write_path must be one of {', '.join(WRITE_PATHS)}, not {requested!r}")
    fast = supports(root)
    if requested == "image" and not fast:
        raise ConfigError(f"write_path='image' reads and writes the interval images with pyarrow and supports "
                          f"local, file: and s3a:// stores only; {root} is none of those: use write_path='merge' "
                          f"or 'auto'")
    if requested != "auto":
        return requested, f"{requested}: as asked"
    if fast:
        return "image", "auto: the store's files are reachable from Python"
    return "merge", (f"auto: the image path reads and writes files with pyarrow on local, file: and s3a:// stores "
                     f"only; {root} is none of those, so batches take the fenced MERGE path (slower)")


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
            ``statestore/writepath/image/``; local, ``file:`` and ``s3a://`` stores), ``"merge"`` (a fenced
            MERGE per batch, any store), or ``"auto"`` (image where it can, else merge:
            :func:`choose_write_path`; the start's log line says which and why).
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
        require_classic_session(spark)
        type(computation).validate()
        if intervals is not None:
            bad = sorted(set(intervals) - set(range(computation.num_intervals)))
            if bad or not intervals:
                raise ConfigError(f"{computation.name}: intervals must be a non-empty subset of 0.."
                                  f"{computation.num_intervals - 1}, got {sorted(set(intervals))}")
        self._wanted = None if intervals is None else tuple(sorted(set(intervals)))
        write_path, self.write_path_reason = choose_write_path(write_path, layout.root)
        self.write_path = write_path
        self.spark = spark
        self.layout = layout
        self.comp = computation
        self.owner = owner
        self.authority = authority
        self.upstream = tuple(upstream)
        # upstream computation -> the low watermark read before the current query took its
        # snapshot of that computation's stream table (job instances: PipelineRunner sets it)
        self.upstream_caps: dict[str, int | None] = {}
        # a hold on the low watermark for input not read yet (a continuous downstream stage: the
        # upstream watermark its last batch acted on; ``continuous.py``); None: none
        self.input_hold_ms: int | None = None
        self.manual_watermarks = manual_watermarks
        self._warned_no_watermark = False
        self.clock = clock
        self.faults = faults
        self.on_batch_end = on_batch_end
        self.progress = progress
        self.partitions = partitions or max(1, min(computation.num_intervals,
                                                   spark.sparkContext.defaultParallelism))
        # the newest REPORTS_KEPT batches' reports (a long-running job must not grow without bound);
        # ``records_in_total`` counts over every batch of this executor
        self.reports: collections.deque[BatchReport] = collections.deque(maxlen=REPORTS_KEPT)
        self.records_in_total = 0
        # one row of figures per committed batch in the store's _metrics/batches (None: off)
        self.metrics: BatchMetrics | None = BatchMetrics(spark, layout)
        # set by the pipeline runner when instances share the intervals (``rescale.py``: the skip
        # rule, the input files each commit records, catch-up)
        self.shared: SharedInput | None = None
        self._mark: ActedMark | None = None  # the newest committed batch's (``lateness.py``)
        self._injectors_read: dict[str, int] = {}  # the injector watermarks the batch's start read
        self._started = False
        self._starting: concurrent.futures.Future[None] | None = None  # start_in_background's
        self._leased = threading.Event()
        self.start_s: dict[str, float] = {}
        self.recovered: dict[str, int] = {}  # checkpointed productions the start delivered: appended / merged
        self._wm_lock = threading.Lock()
        self._low: int | None = None  # the low watermark this executor last published
        self.inflight = InFlight(computation, fault=self._fault, log=self._log,
                                 published=self._publish_watermarks if authority is not None else None)
        # input stream -> how far (ms) a record's event time may be ahead of the processing clock;
        # later records are dead letters and move no watermark (the pipeline runner sets the bound
        # of each injector it reads, ``max_event_ahead_ms``); default: one day for every input
        ahead: Mapping[str, int] = ({s: DEFAULT_MAX_EVENT_AHEAD_MS for s in computation.inputs}
                                    if event_ahead_ms is None else dict(event_ahead_ms))
        # the write path (every write of the rows and stream tables) and the Spark job whose
        # output it commits and delivers (``tasks/paths.py``)
        self.path: WritePath[Any]
        self.job: UserJob[Any]
        self.path, self.job = PATHS[write_path](spark, layout, computation, owner, partitions=self.partitions,
                                                event_ahead_ms=ahead, watermarks=authority is not None)

    @property
    def direct_source(self) -> DirectSource | None:
        """Set by the pipeline runner when the input is a Parquet injector the image path's tasks
        can read themselves (``tasks/image/direct.py``); a batch that did says so in its report."""
        return self.job.direct_source

    @direct_source.setter
    def direct_source(self, source: DirectSource | None) -> None:
        self.job.direct_source = source

    @property
    def event_ahead_ms(self) -> Mapping[str, int]:
        """Input stream -> how far (ms) a record's event time may be ahead of the processing
        clock; later records are dead letters and move no watermark (the pipeline runner sets
        the bound of each injector it reads, ``max_event_ahead_ms``)."""
        return self.job.event_ahead_ms

    @event_ahead_ms.setter
    def event_ahead_ms(self, bounds: Mapping[str, int]) -> None:
        self.job.event_ahead_ms = dict(bounds)

    # ------------------------------------------------------------- lifecycle

    def start(self, *, wait_s: float = 0.0) -> None:
        """Acquire the intervals, fence them, run the recovery scan, redeliver checkpoints."""
        if self.comp.event_time_timers and not self.manual_watermarks and not self._has_watermark_source():
            raise ConfigError(
                f"{self.comp.name} uses event-time timers, but its executor has no watermark source "
                f"({'no upstream' if self.authority is not None else 'authority=None'}), so they would never "
                "fire. Give it one: ComputationExecutor(..., authority=WatermarkAuthority(client, pipeline=...), "
                "upstream=['injector:NAME'], on_batch_end=<a hook publishing the injector's watermark with "
                "publish_watermark>) (README, 'Embedding it in your Spark job'), or pass manual_watermarks=True "
                "if you fire them yourself with flush(input_watermark_ms=...)")
        t_start = time.monotonic()
        check_store(self.layout)  # a lost or torn commit refuses the start (statestore/inspection/damage.py)
        rec = self.path.acquire(self._wanted, wait_s=wait_s)
        t_acq = time.monotonic()
        if self.authority is not None:
            self.authority.declare(self.comp.name, upstream=self.upstream, num_intervals=self.comp.num_intervals)
        self._mark = read_mark(self.spark, self.layout.rows, self.comp.name, self.owner.intervals)
        if self.shared is not None:  # the input files committed for the intervals taken (the skip rule)
            held = set(self.owner.intervals)
            self.shared.done = {iv: fs for iv, fs in self.owner.store.input_files(self.comp.name).items()
                                if iv in held}
        if rec.appended:
            self._log(f"{self.comp.name}: recovery delivered {rec.appended} checkpointed productions of the last "
                      "commit (its delivery had not landed)")
        if rec.merged:
            self._log(f"{self.comp.name}: recovery redelivered {rec.merged} checkpointed productions "
                      "(records already in their streams are skipped)")
        self.recovered = {"appended": rec.appended, "merged": rec.merged}
        self.start_s = {"acquire_fence_recover": round(t_acq - t_start, 3),
                        "total": round(time.monotonic() - t_start, 3)}
        self._log(f"{self.comp.name}: started in {self.start_s['total']:.1f}s (leases, fence and recovery scan "
                  f"{self.start_s['acquire_fence_recover']:.1f}s); write path {self.write_path_reason}")
        if self.write_path == "merge" and self.write_path_reason.startswith("auto"):
            _LOG.warning("%s: write path %s", self.comp.name, self.write_path_reason)
        self._started = True

    def start_in_background(self, *, wait_s: float = 0.0, then: Callable[[], None] | None = None) -> None:
        """:meth:`start` in a thread, so that the part after the leases (fence, recovery, the
        stream tables) overlaps what the caller does next. The pipeline runner starts the
        streaming query meanwhile (its checkpoint, first offsets, the first batch's planning),
        but only once the leases are held (:meth:`wait_leased`): the leases are what keeps a
        second copy of the job off the query's checkpoint. The first batch (and :meth:`flush`,
        :meth:`settle`, :meth:`stop`) waits for the whole start and raises what it raised
        (:meth:`wait_started`). ``then`` runs in the thread after a successful start."""
        if self._started or self._starting is not None:
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        leased = threading.Event()  # set when the leases are granted, or when the start ended

        def run() -> None:
            self.owner.on_granted = leased.set
            try:
                self.start(wait_s=wait_s)
                if then is not None:
                    then()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                done.set_exception(exc)
            else:
                done.set_result(None)
            finally:
                self.owner.on_granted = None
                leased.set()

        self._starting, self._leased = done, leased
        threading.Thread(target=run, name=f"deltawheel-start-{self.comp.name}", daemon=True).start()

    def wait_leased(self) -> None:
        """Wait until a :meth:`start_in_background` holds its leases (the rest of the start may
        still run); raise what the start raised if it ended before (e.g. :class:`LeaseHeldError`)."""
        done = self._starting
        if done is None:
            return
        self._leased.wait()
        if done.done() and done.exception() is not None:
            self.wait_started()  # raises it

    def wait_started(self) -> None:
        """Wait for a :meth:`start_in_background` still running; raise what the start raised (once:
        a later batch then calls :meth:`start` itself)."""
        done = self._starting
        if done is None:
            return
        try:
            done.result()
        finally:
            self._starting = None

    def stop(self) -> None:
        """Settle the delivery still in flight, then give the intervals back (even if settling fails);
        wait for the batches' metrics rows. A start still running in the background is waited for
        first (its failure was the first batch's to raise: here it is only logged)."""
        try:
            self.wait_started()
        except Exception as exc:  # noqa: BLE001 - the leases it took are given back below
            _LOG.warning("%s: the start had failed: %s: %s", self.comp.name, type(exc).__name__, exc)
        try:
            self.inflight.settle()
        finally:
            self.owner.release()
            if self.metrics is not None:
                self.metrics.flush()
        self._started = False

    def __call__(self, df: Any, batch_id: int) -> None:
        """The ``foreachBatch`` entry point: :meth:`run_batch` on the micro-batch ``df``."""
        self.run_batch(df, batch_id)

    # ----------------------------------------------------------- the batch

    def input_watermark(self) -> int | None:
        """min over upstream low watermarks (None until all are known).

        An upstream computation in :attr:`upstream_caps` counts with at most its capped value:
        the watermark it had before this query took its snapshot of the computation's stream
        table. Another process (a job instance) may deliver rows and advance that watermark
        after the snapshot; acting on the newer value would find those rows late when they
        arrive with the next query.
        """
        if self.authority is None or not self.upstream:
            return None
        marks = []
        for u in self.upstream:
            kind, _, name = u.partition(":")
            wm = (self.authority.injector_watermark(name) if kind == "injector"
                  else self.authority.advance_low_watermark(name))
            if kind == "injector" and wm is not None:
                self._injectors_read[name] = wm
            if kind == "computation" and name in self.upstream_caps:
                cap = self.upstream_caps[name]
                wm = None if wm is None or cap is None else min(wm, cap)
            if wm is None:
                return None
            marks.append(wm)
        return min(marks)

    def run_batch(self, df: Any | None, batch_id: int, *, input_watermark_ms: int | None = None,
                  use_authority: bool = True, input_files: Sequence[str] | None = None) -> BatchReport:
        """Run the per-batch protocol on one micro-batch (``df`` None: timers only).

        1. Hold valid leases for the intervals being processed.
        2. Drop duplicates (input prepared in the JVM; the tasks dedup by Bloom filter, then
           the key's stored record ids).
        3. Load the rows of the keys in the batch and of keys with due timers.
        4. Run user code per key in event-time order; fire due timers in timestamp order;
           collect new row images and productions.
        5. Commit all rows in one fenced Delta transaction.
        6. Deliver productions to their stream tables idempotently; the checkpoints are
           cleared by the next commit.
        7. Publish the new low watermark for the intervals.

        With :attr:`shared` set (instances share the intervals, ``rescale.py``), step 1 also drops
        the records an earlier owner of their interval processed (by input position: ``input_files``,
        default those of the query's micro-batch ``batch_id``), and step 5 records the batch's.

        Steps 2-4 are one Spark job (``self.job``); if the write path's view of the rows went
        stale (:class:`StaleViewError`: someone else committed to the partitions), the path
        reloads it (failing typed on a takeover) and steps 2-5 run again, at most three times.

        The Spark jobs the batch starts are described "deltawheel <computation> batch <id>" (from
        the commit on with the batch's figures), so Spark's UI names them; the caller's own job
        description is restored afterwards.
        """
        sc = self.spark.sparkContext
        before = sc.getLocalProperty(JOB_DESCRIPTION)
        sc.setLocalProperty(JOB_DESCRIPTION, f"deltawheel {self.comp.name} batch {batch_id}")
        try:
            return self._run_batch(df, batch_id, input_watermark_ms=input_watermark_ms,
                                   use_authority=use_authority, input_files=input_files)
        finally:
            sc.setLocalProperty(JOB_DESCRIPTION, before)  # None removes it: the caller's jobs are not ours

    def _run_batch(self, df: Any | None, batch_id: int, *, input_watermark_ms: int | None,
                   use_authority: bool, input_files: Sequence[str] | None) -> BatchReport:
        self.wait_started()
        if not self._started:
            self.start()
        started = time.monotonic()
        marks: list[tuple[str, float]] = []
        last = [started]

        def mark(step: str) -> None:
            t = time.monotonic()
            marks.append((step, round(t - last[0], 3)))
            last[0] = t

        comp, path = self.comp, self.path
        # Step 1: leases (and, with shared intervals, what earlier owners already processed).
        self.owner.check()
        skipped, files = 0, tuple[str, ...]()
        if self.shared is not None and df is not None:
            df, skipped, files = self.shared.apply(df, batch_id, self.owner.intervals, input_files)
        path.input_files = files
        self._injectors_read = {}  # filled by input_watermark(): the injector watermarks read now
        wm_in = self.input_watermark() if use_authority and input_watermark_ms is None else input_watermark_ms
        now = self.clock.now_ms()
        # ids seen before the horizon are dropped: a processing time back from now (each id
        # carries when it was seen, so a restart keeps the horizon: Computation.dedup_retention)
        horizon = now - comp.dedup_retention_ms() if comp.exactly_once else None
        # A record is late when it is behind the watermark this computation already acted on
        # (the newest committed batch's: its timers fired up to there); timers now fire with
        # wm_in. A replay of that batch decides as its first attempt did.
        wm_late, wm_in = self._lateness(df, batch_id, wm_in)
        acted = ActedMark(batch_id if df is not None else None, wm_late, wm_in, tuple(sorted(self.owner.intervals)))
        if df is None and path.next_processing() is not None:
            self.settle()  # the previous batch's delivery: a timers-only batch may have nothing to do
            if self._nothing_due(wm_in, now):
                return self._skipped(batch_id, wm_in, started)
        # Step 2: drop duplicates: the input prepared in the JVM (its dead letters recorded), the
        # dedup itself in the tasks of steps 3-4.
        prepared = self.job.prepare(df, wm_late=wm_late, now=now)
        if prepared.dead is not None:
            record_dead_letters(self.spark, self.layout, prepared.dead, computation=comp.name, batch_id=batch_id)
        if df is not None:
            mark("prepare")
        self._fault(FaultPoint.AFTER_PREPARE, batch_id)
        commit_id = f"{comp.name}:{batch_id}:{now}"
        strong = comp.strong_productions
        straggler: OpenDelivery | None = None
        attempt = 0
        while True:
            attempt += 1
            run: BatchRun[Any] | None = None
            try:
                # Step 3 + 4: load the rows, run user code in tasks (with step 2's dedup), materialize once.
                run = self.job.run(prepared, batch_id=batch_id, wm_in=wm_in, wm_late=wm_late, now=now,
                                   horizon=horizon, commit_id=commit_id, strong=strong, mark=mark)
                self._warn_if_no_watermark(wm_in, run.event_timer_ms)
                self._describe_jobs(batch_id, run.counts)
                self._fault(FaultPoint.AFTER_USER_CODE, batch_id)
                if run.dead is not None:
                    record_dead_letters(self.spark, self.layout, run.dead, computation=comp.name, batch_id=batch_id)
                late_routed = (record_late(self.spark, self.layout, run.late, computation=comp.name,
                                           watermark_ms=wm_late, batch_id=batch_id) if run.late is not None else 0)
                if not strong and run.counts["productions"]:
                    straggler = self.inflight.weak(functools.partial(path.deliver, run.batch, strong=False), batch_id)
                    if straggler is not None and not self.job.checkpoint(run):
                        strong = True  # checkpoint after all: the same user code once more
                        attempt -= 1
                        continue
                # Step 5: the fenced commit (the previous batch's delivery is settled first: the
                # commit clears its checkpoint), recording the injector watermarks step 7 publishes.
                injectors = self._observe_injectors(run.obs_min, run.obs_max)
                acted = dataclasses.replace(acted, injectors={
                    n: max(wm, self._injectors_read.get(n, wm)) for n, (wm, _) in injectors.items()})
                self.inflight.settle()
                mark("settle")
                self._fault(FaultPoint.BEFORE_COMMIT, batch_id)
                t0 = time.monotonic()
                if path.commit(run.batch, commit_id=commit_id, meta=acted.to_meta()):
                    self._mark = acted
                break
            except StaleViewError:
                pass
            # someone touched our partitions: a takeover (-> StaleSequencerError) or a reload
            path.load()
            if attempt == 3:
                raise BatchFailedError(f"{comp.name} batch {batch_id}: the interval images kept changing "
                                       "under this writer; restart the query")
        assert run is not None
        commit_s = time.monotonic() - t0
        if self.shared is not None and files:
            self.shared.committed(files, self.owner.intervals)
        mark("commit")
        redeliver = functools.partial(path.deliver, run.batch, strong=True)
        if straggler is not None:
            self.inflight.adopt(straggler, redeliver=redeliver, min_ts=run.prod_min_ts)
        self.job.observe(run)
        self._fault(FaultPoint.AFTER_COMMIT, batch_id)
        # Step 6: deliver (idempotent); the checkpoints are cleared by the next commit. In the
        # background where the path allows it (the next batch settles it before its commit).
        if comp.strong_productions and run.counts["productions"] and path.deliver_in_background:
            self.inflight.start(redeliver, batch_id, run.prod_min_ts)
        else:
            if comp.strong_productions and run.counts["productions"]:
                redeliver()
            self._fault(FaultPoint.AFTER_DELIVERY, batch_id)
        mark("deliver")
        # Step 7: watermarks (the injector estimates observed before the commit are published in
        # the step's transaction; a hook that publishes itself runs now).
        self._fault(FaultPoint.BEFORE_WATERMARK, batch_id)
        hook = self.on_batch_end
        if hook is not None and not self._hook_observes_early():
            hook(run.obs_min, run.obs_max)
        low = self._publish_watermarks(injectors) if self.authority is not None else None
        mark("watermarks")
        c = run.counts
        # ``late`` counts every late record: those user code saw or dropped (the tasks' count) and
        # those routed to late_data (taken out before user code, so not in the tasks' count)
        report = BatchReport(batch_id, c["records_in"], c["processed"], c["duplicates"], c["late"] + late_routed,
                             late_routed,
                             c["dead_letters"], c["timers_fired"], c["productions"], c["keys_written"], wm_in, low,
                             commit_s, time.monotonic() - started, tuple(marks), straggled=straggler is not None,
                             direct=prepared.direct is not None, ids_expired=c["ids_expired"],
                             bloom_checked=c.get("bloom_checked", 0), bloom_maybe=c.get("bloom_maybe", 0),
                             bloom_false_pos=c.get("bloom_false_pos", 0), bloom_bytes=c.get("bloom_bytes", 0),
                             intervals_run=c.get("intervals_run", 0), images_read=c.get("images_read", 0),
                             skipped_moved=skipped)
        self.reports.append(report)
        self.records_in_total += report.records_in
        self._log(format_report(comp.name, report, now_ms=self.clock.now_ms()))
        self._record_metrics(report, now, pending=c["productions"] if self.inflight.open is not None else 0)
        return report

    def report(self, batch_id: int) -> BatchReport | None:
        """The report of batch ``batch_id`` (its last run, e.g. a replay), None when this executor
        did not run it or no longer keeps it (the newest :data:`REPORTS_KEPT` are kept). A
        ``StreamingQueryListener`` looks up ``event.progress.batchId`` here (docs/watching.md)."""
        for r in reversed(self.reports):
            if r.batch_id == batch_id:
                return r
        return None

    def flush(self, *, input_watermark_ms: int | None = None) -> BatchReport:
        """A batch without input: fire what the (given or published) watermark makes due."""
        bid = (self.reports[-1].batch_id + 1) if self.reports else 0
        return self.run_batch(None, bid, input_watermark_ms=input_watermark_ms)

    # -------------------------------------------------------------- helpers

    def _describe_jobs(self, batch_id: int, counts: Mapping[str, int]) -> None:
        """The batch's figures in the description of its remaining Spark jobs (the commit and the
        delivery, where the write path runs them in Spark): Spark's UI lists them by it."""
        self.spark.sparkContext.setLocalProperty(
            JOB_DESCRIPTION, f"deltawheel {self.comp.name} batch {batch_id}: {counts['records_in']:,} in, "
                             f"{counts['processed']:,} processed, {counts['duplicates']:,} duplicates, "
                             f"{counts['late']:,} late, {counts['dead_letters']:,} dead letters, "
                             f"{counts['productions']:,} productions")

    def _hook_observes_early(self) -> bool:
        """The end-of-batch hook is this authority's :class:`InjectorHook` whose estimates step 7
        publishes in its own transaction (not a job instance's, which publishes them itself after
        the commit): it observes the batch before the commit, which records the estimates."""
        hook = self.on_batch_end
        return isinstance(hook, InjectorHook) and hook.authority is self.authority and hook.instance is None

    def _observe_injectors(self, mn: int | None, mx: int | None) -> dict[str, tuple[int, int]]:
        """The injectors' estimates after this batch's event-time range (step 7 publishes them);
        {} when the hook publishes them itself."""
        hook = self.on_batch_end
        if not self._hook_observes_early():
            return {}
        assert isinstance(hook, InjectorHook)
        return hook.observe(mn, mx)

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

    def _nothing_due(self, wm_in: int | None, now: int) -> bool:
        """A timers-only batch has nothing to do: the last batch of this instance ran under the
        same input watermark (so it fired every event-time timer before it, including ones set
        while firing), no processing-time timer is due, and no straggler is open."""
        if not self.reports or self.reports[-1].input_watermark_ms != wm_in or self.inflight.open is not None:
            return False
        nexts = self.path.next_processing()
        return nexts is not None and all(t is None or t > now for t in nexts.values())

    def _skipped(self, batch_id: int, wm_in: int | None, started: float) -> BatchReport:
        last = self.reports[-1]
        # the low watermark as published now: a delivery that landed since the last batch moved it
        low = last.low_watermark_ms if self._low is None else self._low
        report = BatchReport(batch_id, 0, 0, 0, 0, 0, 0, 0, 0, 0, wm_in, low, 0.0,
                             time.monotonic() - started, (("skipped: nothing due", 0.0),))
        self.reports.append(report)
        self._log(format_report(self.comp.name, report, now_ms=self.clock.now_ms()))
        return report

    def settle(self) -> bool:
        """Wait for the last batch's delivery still in flight (asynchronous, or a straggler);
        redeliver from its checkpoint if it failed, then publish the low watermark it held.
        Returns whether there was one. The pipeline runner calls it after each flush, so the
        next stage reads every production of this one."""
        self.wait_started()
        st = self.inflight.open
        if st is None:
            return False
        self.inflight.settle()
        if self.authority is not None:
            low = self._publish_watermarks()
            shown = self.reports[-1].low_watermark_ms if self.reports else None
            if low != shown:  # the last batch line showed the watermark its delivery held
                self._log(f"{self.comp.name}: batch {st.batch_id}'s delivery landed; low watermark "
                          f"{format_watermark(low, now_ms=self.clock.now_ms())}")
        return True

    def _publish_watermarks(self, injectors: Mapping[str, tuple[int, int]] | None = None) -> int | None:
        """Publish the intervals' oldest work and advance the low watermark (with ``injectors``:
        publish these injector estimates in the same transaction)."""
        assert self.authority is not None
        with self._wm_lock:  # the batch and its delivery thread both publish
            held = self.inflight.held_ts()
            if self.input_hold_ms is not None:  # input not read yet holds it too
                held = self.input_hold_ms if held is None else min(held, self.input_hold_ms)
            works: dict[int, tuple[int | None, int]] = {}
            path_oldest = self.path.oldest_work()
            for iv, seq in self.owner.sequencers.items():
                oldest = path_oldest.get(iv)
                if held is not None:  # undelivered (straggling) productions hold the watermark
                    oldest = held if oldest is None else min(oldest, held)
                works[iv] = (oldest, seq)
            # the oldest work and the low watermark computed from it: one round of reads, one transaction
            low = self.authority.publish_and_advance(self.comp.name, works, injectors=injectors)
            if low is not None:
                self._low = low
            return low

    def _record_metrics(self, report: BatchReport, started_ms: int, *, pending: int) -> None:
        """Hand the batch's row to the metrics writer (in the background; never fails the batch: ``metrics.py``)."""
        if self.metrics is None:
            return
        leases = self.owner.leases
        self.metrics.submit(batch_row(report, pipeline=getattr(leases, "pipeline", None), computation=self.comp.name,
                                      instance=getattr(leases, "owner", None), write_path=self.write_path,
                                      started_ms=started_ms, pending_productions=pending,
                                      state=state_size(getattr(self.path, "files", None))))

    def _fault(self, point: FaultPoint, batch_id: int) -> None:
        if self.faults is not None:
            self.faults(point, batch_id)

    def _log(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)
