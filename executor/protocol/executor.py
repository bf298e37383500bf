"""A computation's executor: the lifecycle around the per-batch protocol (``batch.py``)."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import time
from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.clock import Clock, SystemClock
from deltawheel.statestore.delta.jvm import activate, require_classic_session
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.inspection.damage import check_store
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.zk.watermarks import WatermarkAuthority

from ..computation import Computation, check_instance
from ..tasks.input import DEFAULT_MAX_EVENT_AHEAD_MS
from ..tasks.paths import PATHS, choose_write_path
from .batch import JOB_DESCRIPTION, BatchProtocol
from .faults import FaultPoint
from .host import BatchInputs
from .inflight import InFlight
from .metrics import BatchMetrics
from .reports import BatchReport
from .rescale import SharedInput
from .starting import BackgroundStart, beside

REPORTS_KEPT = 10_000  # reports an executor keeps in memory (``ComputationExecutor.reports``)
_LOG = logging.getLogger(__name__)

__all__ = ["ComputationExecutor", "REPORTS_KEPT"]


class ComputationExecutor:
    """Runs one computation's batches; pass it to ``writeStream.foreachBatch``. ``authority`` None: only
    a given ``input_watermark_ms`` fires timers; ``upstream``: ``"injector:NAME"`` / ``"computation:NAME"``
    entries making the input watermark; ``manual_watermarks``: the caller gives ``input_watermark_ms``;
    ``write_path``: ``"image"``, ``"merge"`` or ``"auto"``; ``event_ahead_ms``: per input stream, how far
    event time may be ahead of the clock ({}: no check)."""

    def __init__(self, spark: Any, layout: StoreLayout, computation: Computation, *, owner: IntervalOwner,
                 authority: WatermarkAuthority | None = None, upstream: Sequence[str] = (),
                 clock: Clock = SystemClock(), faults: Callable[[FaultPoint, int], None] | None = None,
                 on_batch_end: Callable[[int | None, int | None], None] | None = None,
                 progress: Callable[[str], None] | None = None, partitions: int | None = None,
                 write_path: str = "auto", intervals: Sequence[int] | None = None,
                 event_ahead_ms: Mapping[str, int] | None = None, manual_watermarks: bool = False,
                 shared: SharedInput | None = None, positions: SharedInput | None = None) -> None:
        require_classic_session(spark)
        type(computation).validate()
        check_instance(computation)
        if intervals is not None:
            bad = sorted(set(intervals) - set(range(computation.num_intervals)))
            if bad or not intervals:
                raise ConfigError(f"{computation.name}: intervals must be a non-empty subset of 0.."
                                  f"{computation.num_intervals - 1}, got {sorted(set(intervals))}")
        self._wanted = None if intervals is None else tuple(sorted(set(intervals)))
        self.write_path, self.write_path_reason = choose_write_path(write_path, layout.root)
        self.spark, self.layout, self.comp = spark, layout, computation
        self.owner, self.authority, self.upstream = owner, authority, tuple(upstream)
        for warning in computation.start_warnings():
            _LOG.warning("%s", warning)
        self.inputs = BatchInputs()  # the driver's, for the next batches (:meth:`next_batch_inputs`)
        self.manual_watermarks, self.clock, self.faults = manual_watermarks, clock, faults
        self.on_batch_end, self.progress = on_batch_end, progress
        self.partitions = partitions or max(1, min(computation.num_intervals,
                                                   spark.sparkContext.defaultParallelism))
        self.reports: collections.deque[BatchReport] = collections.deque(maxlen=REPORTS_KEPT)
        self.records_in_total = 0
        self.metrics: BatchMetrics | None = BatchMetrics(spark, layout, computation.name)  # its metrics rows (None: off)
        self.shared = shared  # the input of instances sharing the intervals (``rescale.py``); None: none
        self.positions = positions  # records each batch's input positions in its commit (replay); None: none
        self._protocol = BatchProtocol(self)  # the seven steps of each batch (``batch.py``)
        self._started = False
        self._starting: BackgroundStart | None = None  # start_in_background's
        self.start_s: dict[str, float] = {}
        self.recovered: dict[str, int] = {}  # checkpointed productions the start delivered: appended / merged
        self.inflight = InFlight(computation, fault=self._protocol.fault, log=self._protocol.log,
                                 published=self._protocol.watermarks.publish if authority is not None else None,
                                 on_thread=functools.partial(activate, spark))
        ahead: Mapping[str, int] = ({s: DEFAULT_MAX_EVENT_AHEAD_MS for s in computation.inputs}
                                    if event_ahead_ms is None else dict(event_ahead_ms))
        self.path, self.job = PATHS[self.write_path](
            spark, layout, computation, owner, partitions=self.partitions, event_ahead_ms=ahead,
            watermarks=authority is not None)

    @property
    def event_ahead_ms(self) -> Mapping[str, int]:
        """Input stream -> how far (ms) event time may be ahead of the clock."""
        return self.job.event_ahead_ms

    def start(self, *, wait_s: float = 0.0, streams_ready: bool = True) -> None:
        """Acquire, fence, recover and redeliver; ``streams_ready``: wait for the output tables too."""
        activate(self.spark)  # a start in a thread of its own commits (the fence) through Delta's JVM API
        self._protocol.watermarks.require_source()
        t_start = time.monotonic()
        authority = self.authority
        # the topology is declared while the leases are taken; a refusal fails the start
        declaring = None if authority is None else beside(functools.partial(
            authority.declare, self.comp.name, upstream=self.upstream, num_intervals=self.comp.num_intervals),
            name=f"declare-{self.comp.name}")
        try:
            check_store(self.layout)  # a lost or torn commit refuses the start (statestore/inspection/damage.py)
            try:
                rec = self.path.acquire(self._wanted, wait_s=wait_s)
                if streams_ready:  # (else a batch waits for them where it needs one)
                    self.path.streams_ready()
            except BaseException:  # a failed recovery too (a store not serving): the process may go on
                with contextlib.suppress(Exception):
                    self.owner.release()
                raise
        finally:
            if declaring is not None:
                concurrent.futures.wait([declaring])
        t_acq = time.monotonic()
        if declaring is not None:
            declaring.result()
        self._protocol.opened()
        log, name = self._protocol.log, self.comp.name
        if rec.appended:
            log(f"{name}: recovery delivered {rec.appended} checkpointed productions of the last commit (its "
                "delivery had not landed)")
        if rec.merged:
            log(f"{name}: recovery redelivered {rec.merged} checkpointed productions (records already in "
                "their streams are skipped)")
        self.recovered = {"appended": rec.appended, "merged": rec.merged}
        self.start_s = {"acquire_fence_recover": round(t_acq - t_start, 3),
                        "total": round(time.monotonic() - t_start, 3), **dict(rec.steps_s)}
        steps = "".join(f", {k.replace('_', ' ')} {v:.2f}" for k, v in rec.steps_s)
        log(f"{name}: started in {self.start_s['total']:.1f}s (leases, fence and recovery scan "
            f"{self.start_s['acquire_fence_recover']:.1f}s{steps}); write path {self.write_path_reason}")
        if self.write_path == "merge" and self.write_path_reason.startswith("auto"):
            _LOG.warning("%s: write path %s", self.comp.name, self.write_path_reason)
        self._started = True

    def start_in_background(self, *, wait_s: float = 0.0, then: Callable[[], None] | None = None) -> None:
        """:meth:`start` in a thread; start the query only after :meth:`wait_leased`."""
        if self._started or self._starting is not None:
            return
        self._starting = BackgroundStart(functools.partial(self.start, wait_s=wait_s, streams_ready=False),
                                         owner=self.owner, name=self.comp.name, then=then)
        self._starting.begin()

    def wait_leased(self) -> None:
        """Wait until a background start holds its leases; raise what the start raised if it ended."""
        starting = self._starting
        if starting is None:
            return
        starting.leased.wait()
        if starting.failed():
            self.wait_started()  # raises it

    def wait_started(self) -> None:
        """Wait for a background start; raise what it raised (once)."""
        starting = self._starting
        if starting is None:
            return
        try:
            starting.done.result()
        finally:
            self._starting = None

    def stop(self) -> None:
        """Settle the delivery in flight, then give the intervals back (even if settling fails)."""
        try:
            self.wait_started()
        except Exception as exc:
            _LOG.warning("%s: the start had failed: %s: %s", self.comp.name, type(exc).__name__, exc)
        try:
            try:
                self._protocol.watermarks.join()  # the last batch's step 7, if it runs in the background
            finally:
                self.inflight.settle()
        finally:
            self.owner.release()
            if self.metrics is not None:
                self.metrics.flush()
        self._started = False

    def __call__(self, df: Any, batch_id: int) -> None:
        """The ``foreachBatch`` entry point: :meth:`run_batch` with step 7 in the background."""
        self.run_batch(df, batch_id, background=True)

    def input_watermark(self) -> int | None:
        """min over upstream low watermarks (None until all are known), capped by the inputs' ``upstream_caps``."""
        return self._protocol.watermarks.input()

    def run_batch(self, df: Any | None, batch_id: int, *, input_watermark_ms: int | None = None,
                  use_authority: bool = True, input_files: Sequence[str] | None = None,
                  background: bool = False, late_watermark_ms: int | None = None,
                  late_raised: Mapping[int, int] | None = None) -> BatchReport:
        """Run DESIGN's seven steps on one micro-batch (``df`` None: timers only), starting if needed;
        ``background``: step 7 in the background (joined before the next batch reads a watermark);
        ``late_watermark_ms`` / ``late_raised``: a replay's, as the live batch judged lateness."""
        sc = self.spark.sparkContext
        before = sc.getLocalProperty(JOB_DESCRIPTION)
        sc.setLocalProperty(JOB_DESCRIPTION, f"deltawheel {self.comp.name} batch {batch_id}")
        try:
            self.wait_started()
            if not self._started:
                self.start()
            return self._protocol.run(df, batch_id, input_watermark_ms=input_watermark_ms,
                                      use_authority=use_authority, input_files=input_files, background=background,
                                      late_watermark_ms=late_watermark_ms, late_raised=late_raised)
        finally:
            sc.setLocalProperty(JOB_DESCRIPTION, before)  # None removes it: the caller's jobs are not ours

    def catch_up(self, df: Any, batch_id: int, *, input_files: Sequence[str]) -> BatchReport:
        """A catch-up batch of intervals taken over: lateness judged per interval, no upstream timers."""
        protocol = self._protocol
        self.wait_started()
        before = protocol.acted, protocol.lines
        unknown = dict.fromkeys(u.partition(":")[2] for u in self.upstream if u.startswith("computation:"))
        given, self.inputs = self.inputs, dataclasses.replace(self.inputs, upstream_caps=unknown, hold="kept")
        protocol.catching_up = True
        try:
            return self.run_batch(df, batch_id, input_files=input_files)
        finally:
            (protocol.acted, protocol.lines), self.inputs, protocol.catching_up = before, given, False

    def report(self, batch_id: int) -> BatchReport | None:
        """The report of batch ``batch_id``; None when not kept (the newest :data:`REPORTS_KEPT` are)."""
        return next((r for r in reversed(self.reports) if r.batch_id == batch_id), None)

    def flush(self, *, input_watermark_ms: int | None = None) -> BatchReport:
        """A batch without input: fire what the (given or published) watermark makes due."""
        bid = (self.reports[-1].batch_id + 1) if self.reports else 0
        return self.run_batch(None, bid, input_watermark_ms=input_watermark_ms)

    def next_batch_inputs(self, inputs: BatchInputs) -> None:
        """What the next batches read and act on (:class:`BatchInputs`), handed over between batches."""
        self.inputs = inputs
        self._protocol.watermarks.hold(inputs)

    def settle(self) -> bool:
        """Wait for the last delivery in flight and publish its watermark; returns whether there was one."""
        self.wait_started()
        self._protocol.watermarks.join()  # the last batch's step 7, if it runs in the background
        st = self.inflight.open
        if st is None:
            return False
        self.inflight.settle()
        if self.authority is not None:
            self._protocol.watermarks.settled(st.batch_id)
        return True
