"""The per-batch protocol: :class:`BatchProtocol` runs DESIGN's seven steps (``# Step N``) on one
micro-batch; steps 3-5 rerun while the write path's view of the rows is stale. docs/exactly-once.md."""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, SupportsInt

from deltawheel.statestore.rowtable.inputfiles import commit_entry
from deltawheel.statestore.writepath.delivery import record_dead_letters, record_late

from ..tasks.job import BatchCounts, BatchRun
from .batchstate import BatchState, BatchStatus, retry_stale_view
from .exporter import active_exporter
from .faults import FaultPoint
from .lateness import ActedMark, interval_lines, judged, newest_marks
from .metrics import batch_row, state_size
from .reports import BatchReport, format_report
from .sparkprogress import show_input_rows
from .watermarks import BatchWatermarks

if TYPE_CHECKING:
    from .host import BatchHost

JOB_DESCRIPTION = "spark.job.description"  # Spark's local property behind setJobDescription
STALE_VIEW_ATTEMPTS = 3  # runs of steps 3-5 while the write path's view of the rows went stale

__all__ = ["BatchProtocol", "BatchState", "JOB_DESCRIPTION", "STALE_VIEW_ATTEMPTS", "retry_stale_view"]

#: A lateness watermark before every event time: no record is late.
NOTHING_LATE = -(2**62)


class BatchProtocol:
    """DESIGN's seven steps over one executor's parts; keeps the newest lateness mark and watermarks."""

    def __init__(self, executor: BatchHost) -> None:
        self.ex = executor
        self.acted: ActedMark | None = None  # the newest committed batch's (``lateness.py``)
        self.lines: dict[int, int | None] = {}  # each held interval's lateness line (its own newest mark)
        self.catching_up = False  # a catch-up batch: no injector part, no replay of a mark (``catch_up``)
        self.watermarks = BatchWatermarks(executor)

    def run(self, df: Any | None, batch_id: int, *, input_watermark_ms: int | None, use_authority: bool,
            input_files: Sequence[str] | None, background: bool = False,
            late_watermark_ms: int | None = None, late_raised: Mapping[int, int] | None = None) -> BatchReport:
        """The seven steps on the micro-batch ``df`` (None: timers only; ``background``: step 7 too)."""
        ex = self.ex
        started = time.monotonic()
        self.watermarks.join()  # the previous batch's step 7 (raising its failure) before any watermark is read
        # Step 1: leases (and, with shared intervals, what earlier owners already processed).
        ex.owner.check()
        df, skipped, files = self._skip_processed(df, batch_id, input_files)
        self.watermarks.injectors_read = {}  # filled by input(): the injector watermarks read now
        self.watermarks.computations_read = None
        wm_in = (self.watermarks.input() if use_authority and input_watermark_ms is None
                 else input_watermark_ms)
        b = self._open(df, batch_id, started=started, skipped=skipped, files=files, wm_in=wm_in,
                       wm_late=late_watermark_ms, late_raised=late_raised)
        try:
            return self._steps(b, background=background)
        except BaseException:
            b.advance(BatchStatus.FAILED)
            raise

    def _steps(self, b: BatchState, *, background: bool) -> BatchReport:
        """Steps 2-7 of the batch ``b`` step 1 opened."""
        ex, df, batch_id = self.ex, b.df, b.batch_id
        if df is None and ex.path.next_processing() is not None:
            ex.settle()  # the previous batch's delivery: a timers-only batch may have nothing to do
            if self._nothing_due(b):
                return self._skipped(b)
        # Step 2: drop duplicates (input prepared in the JVM; the dedup runs in the tasks).
        b.prepared = ex.job.prepare(df, wm_late=b.wm_late, now=b.now, batch_id=batch_id,
                                    direct=ex.inputs.direct_source)
        self._record_dead_letters(b, b.prepared.dead)
        b.advance(BatchStatus.PREPARED)
        if df is not None:
            b.mark("prepare")
        self.fault(FaultPoint.AFTER_PREPARE, batch_id)
        # steps 3-5, from step 3 again while the write path's view of the rows is stale
        run = retry_stale_view(functools.partial(self._run_and_commit, b), reload=ex.path.load,
                               attempts=STALE_VIEW_ATTEMPTS,
                               failed=f"{ex.comp.name} batch {batch_id}: the interval images kept changing "
                                      "under this writer; restart the query")
        redeliver = self._committed(b, run)
        # Step 6: deliver (idempotent); in the background where the path allows it.
        if ex.comp.strong_productions and run.counts.productions and ex.path.deliver_in_background:
            ex.inflight.start(redeliver, batch_id, run.prod_min_ts)
        else:
            if ex.comp.strong_productions and run.counts.productions:
                redeliver()
            self.fault(FaultPoint.AFTER_DELIVERY, batch_id)
        b.advance(BatchStatus.DELIVERED)
        b.mark("deliver")
        # Step 7: watermarks (with the injector estimates observed before the commit).
        self.fault(FaultPoint.BEFORE_WATERMARK, batch_id)
        hook = ex.on_batch_end
        if hook is not None and not self.watermarks.hook_observes_early():
            hook(run.obs_min, run.obs_max)
        if ex.authority is not None and background and df is not None:
            b.mark("watermarks")
            report = self._finish(b, run, self.watermarks.low, pending=True)
            self.watermarks.publish_later(b.injectors,
                                          landed=functools.partial(self._landed, report, b.now, run.counts.productions))
            return report
        low = self.watermarks.publish(b.injectors) if ex.authority is not None else None
        b.mark("watermarks")
        return self._finish(b, run, low)

    def _run_and_commit(self, b: BatchState) -> BatchRun[Any]:
        """Steps 3-5 once (user code twice when a straggling weak delivery needs a checkpoint)."""
        ex = self.ex
        # Step 3 + 4: load the rows, run user code in tasks (with step 2's dedup), materialize once.
        run = self._user_code(b)
        if self._straggled(b, run):
            b.strong = True  # checkpoint after all: the same user code once more
            run = self._user_code(b)
        # Step 5: the fenced commit, after settling the previous batch's delivery.
        b.injectors = self.watermarks.observe_injectors(run.obs_min, run.obs_max)
        read = self.watermarks.injectors_read
        b.acted = dataclasses.replace(b.acted, injectors={
            n: max(wm, read.get(n, wm)) for n, (wm, _) in b.injectors.items()})
        ex.inflight.settle()
        b.mark("settle")
        self.fault(FaultPoint.BEFORE_COMMIT, b.batch_id)
        t0 = time.monotonic()
        meta = b.acted.to_meta()
        if ex.shared is not None or ex.positions is not None:  # the batch's input positions (replay)
            # a batch without input (a flush) read no offsets: its id may be the query's next batch's
            kafka = ex.positions.kafka_ranges(b.batch_id) \
                if ex.shared is None and ex.positions is not None and b.df is not None else None
            if b.df is None and ex.shared is None and ex.positions is not None and ex.positions.kafka:
                kafka = {}  # no Kafka record read (told apart from a commit that records no ranges)
            if ex.shared is not None or ex.positions is None or b.batch_id not in ex.positions.unknown:
                # shared: the intervals the batch held have all run its files (gc's input_sets pass)
                held = sorted(ex.owner.intervals) if ex.shared is not None else None
                meta.update(commit_entry(b.batch_id, b.files, kafka=kafka, intervals=held))  # (unknown: none recorded)
        if ex.path.commit(run.batch, commit_id=b.commit_id, meta=meta):
            self.acted = b.acted
            self.lines = {iv: b.acted.line_of(iv) for iv in ex.owner.intervals}
        b.advance(BatchStatus.COMMITTED)
        b.commit_s = time.monotonic() - t0
        return run

    def _skip_processed(self, df: Any | None, batch_id: int,
                        input_files: Sequence[str] | None) -> tuple[Any | None, SupportsInt, tuple[str, ...]]:
        """Shared intervals: (the input without what earlier owners processed, how many, its files)."""
        ex = self.ex
        skipped: SupportsInt = 0
        files = tuple[str, ...]()
        if ex.shared is not None and df is not None:
            df, skipped, files = ex.shared.apply(df, batch_id, ex.owner.intervals, input_files)
        ex.path.input_files = files
        if ex.shared is None and ex.positions is not None and df is not None:
            # recorded in the commit's metadata only (replay, ``inputfiles.commit_entry``)
            files = tuple(input_files) if input_files is not None else ex.positions.record(df, batch_id)
        return df, skipped, files

    def _open(self, df: Any | None, batch_id: int, *, started: float, skipped: SupportsInt, files: tuple[str, ...],
              wm_in: int | None, wm_late: int | None = None,
              late_raised: Mapping[int, int] | None = None) -> BatchState:
        """The batch's clock, dedup horizon and watermarks (``wm_late``, ``late_raised``: a replay's live batch's)."""
        comp = self.ex.comp
        now = self.ex.clock.now_ms()
        # ids seen before the horizon are dropped (Computation.dedup_retention)
        horizon = now - comp.dedup_retention_ms() if comp.exactly_once else None
        # late: behind the watermark each interval's newest committed batch acted on (lateness.py)
        raised = dict(late_raised or {})
        if wm_late is None:
            wm_late, wm_in, computations, raised = self._lateness(df, batch_id, wm_in)
        else:  # a replay of a live batch: lateness as that batch judged it
            computations = None
        acted = ActedMark(batch_id=batch_id if df is not None else None, late_ms=wm_late, input_ms=wm_in,
                          intervals=tuple(sorted(self.ex.owner.intervals)), computations_ms=computations,
                          raised=raised, query=self._query())
        return BatchState(batch_id=batch_id, df=df, started=started, now=now, wm_in=wm_in, wm_late=wm_late,
                          late_raised=raised,
                          acted=acted, horizon=horizon, commit_id=f"{comp.name}:{batch_id}:{now}",
                          strong=comp.strong_productions, skipped=skipped, files=files)

    def opened(self) -> None:
        """After the start: the newest lateness mark, and the taken intervals' committed input files."""
        ex = self.ex
        marks = newest_marks(ex.spark, ex.layout.rows_of(ex.comp.name), ex.comp.name, sorted(ex.owner.intervals))
        self.acted = marks[0] if marks else None  # the newest of any held interval (its injector watermarks)
        self.lines = interval_lines(marks, ex.owner.intervals)
        if ex.authority is not None and self.acted is not None and self.watermarks.hook_observes_early():
            # the newest batch's step 7 may not have landed: publish its injector watermarks again
            for name, wm in sorted(self.acted.injectors.items()):
                ex.authority.publish_injector(name, wm)
        if ex.shared is not None:
            held, sets = set(ex.owner.intervals), ex.owner.store.input_files(ex.comp.name)
            ex.shared.done = {iv: fs for iv, fs in sets.items() if iv in held}
            ex.shared.recorded = frozenset().union(*sets.values())  # every interval's: the catch-up's pruned rule

    def _query(self) -> str | None:
        """The query the batches come from, when instances share the intervals (each has its own)."""
        return None if self.ex.shared is None else self.ex.shared.checkpoint

    def _lateness(self, df: Any | None, batch_id: int,
                  wm_in: int | None) -> tuple[int | None, int | None, int | None, dict[int, int]]:
        """(lateness watermark, input watermark, upstream computations' part, the intervals judged
        against a higher line); a replay's as first run. Each interval is judged by its own newest mark."""
        m = self.acted
        wms = self.watermarks
        held = set(self.ex.owner.intervals)
        if not self.catching_up and m is not None and df is not None and m.replayed_by(batch_id, held, self._query()):
            return m.late_ms, m.input_ms, m.computations_ms, {iv: ms for iv, ms in m.raised.items() if iv in held}
        late, raised = judged({iv: self.lines.get(iv) for iv in held})
        if self.catching_up:  # its backlog is behind the injectors' watermarks, and not late
            return (NOTHING_LATE if late is None else late), wm_in, None, raised
        injectors = wms.injector_part() if wm_in is not None else None
        if injectors is not None:
            if wms.has_computation_upstream():  # mixed: the computations' part as the last batch acted on it
                before = m.computations_ms if m is not None else None
                injectors = None if before is None else min(injectors, before)
            if injectors is not None:
                late = injectors if late is None else max(late, injectors)
        return late, wm_in, wms.computations_read, {iv: ms for iv, ms in raised.items() if late is None or ms > late}

    def _nothing_due(self, b: BatchState) -> bool:
        """A timers-only batch has nothing to do (no due timer, no straggler)."""
        ex = self.ex
        if not ex.reports or ex.inflight.open is not None:
            return False
        nexts = ex.path.next_processing()
        if nexts is None or any(t is not None and t <= b.now for t in nexts.values()):
            return False
        return ex.reports[-1].input_watermark_ms == b.wm_in or self._moved_past_nothing(b)

    def _moved_past_nothing(self, b: BatchState) -> bool:
        """The watermark moved past no interval's event-time timer or hold: the batch changes no row."""
        ex = self.ex
        if b.wm_in is None or ex.comp.event_time_timers:
            return False
        if ex.on_batch_end is not None and not self.watermarks.hook_observes_early():
            return False  # a hook of its own (a job instance's) runs at every batch's end
        if not all(o is None or o > b.wm_in for o in ex.path.oldest_work().values()):
            return False
        read = self.watermarks.injectors_read
        return all(read.get(n) is not None and wm <= read[n]
                   for n, (wm, _seq) in self.watermarks.observe_injectors(None, None).items())

    def _skipped(self, b: BatchState) -> BatchReport:
        """The report of a timers-only batch with nothing due."""
        ex = self.ex
        last = ex.reports[-1]
        moved = last.input_watermark_ms != b.wm_in and ex.authority is not None
        if moved:
            self.watermarks.publish()
        # the low watermark as published now: a delivery that landed since the last batch moved it
        low = last.low_watermark_ms if self.watermarks.low is None else self.watermarks.low
        step = "skipped: nothing due, low watermark published" if moved else "skipped: nothing due"
        report = BatchReport.empty(b.batch_id, input_watermark_ms=b.wm_in, low_watermark_ms=low,
                                   wall_s=time.monotonic() - b.started, steps_s=((step, 0.0),), timers_only=b.df is None)
        self.ex.reports.append(report)
        self.log(format_report(self.ex.comp.name, report, now_ms=self.ex.clock.now_ms()))
        return report

    def _user_code(self, b: BatchState) -> BatchRun[Any]:
        """Steps 3-4 in the tasks (with step 2's dedup), then the side writes of their output."""
        ex = self.ex
        assert b.prepared is not None
        run = ex.job.run(b.prepared, batch_id=b.batch_id, wm_in=b.wm_in, wm_late=b.wm_late, now=b.now,
                         horizon=b.horizon, commit_id=b.commit_id, strong=b.strong, mark=b.mark,
                         late_raised=b.late_raised)
        self.watermarks.warn_if_none(b.wm_in, run.event_timer_ms)
        self._describe_jobs(b.batch_id, run.counts)
        self.fault(FaultPoint.AFTER_USER_CODE, b.batch_id)
        self._record_dead_letters(b, run.dead)
        b.late_routed = (record_late(ex.spark, ex.layout, run.late, computation=ex.comp.name,
                                     watermark_ms=b.wm_late, batch_id=b.batch_id) if run.late is not None else 0)
        if run.dead is not None or run.late is not None:
            b.mark("dead_and_late")  # their tables' commits, apart from the settle that follows
        return run

    def _straggled(self, b: BatchState, run: BatchRun[Any]) -> bool:
        """Start the weak productions' delivery; True when it straggles and needs a second user run."""
        if b.strong or not run.counts.productions:
            return False
        ex = self.ex
        b.straggler = ex.inflight.weak(functools.partial(ex.path.deliver, run.batch, strong=False), b.batch_id)
        return b.straggler is not None and not ex.job.checkpoint(run)

    def _record_dead_letters(self, b: BatchState, dead: Any | None) -> None:
        if dead is not None:
            record_dead_letters(self.ex.spark, self.ex.layout, dead, computation=self.ex.comp.name,
                                batch_id=b.batch_id)

    def _describe_jobs(self, batch_id: int, counts: BatchCounts) -> None:
        """The batch's figures in its remaining Spark jobs' description (Spark's UI)."""
        self.ex.spark.sparkContext.setLocalProperty(
            JOB_DESCRIPTION, f"deltawheel {self.ex.comp.name} batch {batch_id}: {counts.records_in:,} in, "
                             f"{counts.processed:,} processed, {counts.duplicates:,} duplicates, "
                             f"{counts.late:,} late, {counts.dead_letters:,} dead letters, "
                             f"{counts.productions:,} productions")

    def _committed(self, b: BatchState, run: BatchRun[Any]) -> Callable[[], object]:
        """After the commit: record input files, keep a straggler open; returns the strong delivery."""
        ex = self.ex
        self.watermarks.input_committed()
        if ex.shared is not None and b.files:
            ex.shared.committed(b.files, ex.owner.intervals)
        b.mark("commit")
        redeliver = functools.partial(ex.path.deliver, run.batch, strong=True)
        if b.straggler is not None:
            ex.inflight.adopt(b.straggler, redeliver=redeliver, min_ts=run.prod_min_ts)
        ex.job.observe(run)
        self.fault(FaultPoint.AFTER_COMMIT, b.batch_id)
        return redeliver

    def _finish(self, b: BatchState, run: BatchRun[Any], low: int | None, *, pending: bool = False) -> BatchReport:
        """The batch's report: kept, logged, metrics row handed over (``pending``: step 7 still runs)."""
        ex, c = self.ex, run.counts
        assert b.prepared is not None
        # ``late``: the tasks' count plus the records routed to late_data before user code
        report = BatchReport(
            **{**dataclasses.asdict(c), "late": c.late + b.late_routed}, batch_id=b.batch_id,
            late_routed=b.late_routed, input_watermark_ms=b.wm_in, low_watermark_ms=low, commit_s=b.commit_s,
            wall_s=time.monotonic() - b.started, steps_s=tuple(b.steps_s), straggled=b.straggler is not None,
            direct=b.prepared.direct is not None,
            direct_ranges=b.prepared.direct is not None and b.prepared.direct.source.kafka is not None, skipped_moved=int(b.skipped), timers_only=b.df is None)
        ex.reports.append(report)
        ex.records_in_total += report.records_in
        if report.direct:  # the batch's DataFrame never ran: Spark's progress would show 0 input rows
            show_input_rows(ex.spark, report.records_in)
        if not pending:
            self._logged(report, b.now, c.productions)
        return report

    def _landed(self, report: BatchReport, started_ms: int, productions: int, low: int | None) -> None:
        """Step 7 landed in the background: the kept report gets ``low``, then is logged."""
        ex = self.ex
        report = dataclasses.replace(report, low_watermark_ms=low)
        if ex.reports and ex.reports[-1].batch_id == report.batch_id:  # (no batch runs before the join)
            ex.reports[-1] = report
        self._logged(report, started_ms, productions)

    def _logged(self, report: BatchReport, started_ms: int, productions: int) -> None:
        """Log the batch's line; hand its row to the metrics writer (in the background, never failing)."""
        ex = self.ex
        self.log(format_report(ex.comp.name, report, now_ms=ex.clock.now_ms()))
        exporter = active_exporter()  # the process's Prometheus endpoint (``exporter.py``), if started
        if ex.metrics is None and exporter is None:
            return
        leases, pending = ex.owner.leases, productions if ex.inflight.open is not None else 0
        row = batch_row(report, pipeline=getattr(leases, "pipeline", None), computation=ex.comp.name,
                        instance=getattr(leases, "owner", None), write_path=ex.write_path,
                        started_ms=started_ms, pending_productions=pending,
                        state=state_size(getattr(ex.path, "files", None)))
        if ex.metrics is not None:
            ex.metrics.submit(row)
        if exporter is not None:
            exporter.observe(row, ex)

    def fault(self, point: FaultPoint, batch_id: int) -> None:
        """The executor's fault injector (tests) at ``point``, if it has one."""
        if self.ex.faults is not None:
            self.ex.faults(point, batch_id)

    def log(self, line: str) -> None:
        """A progress line, if the executor has a ``progress`` callback."""
        if self.ex.progress is not None:
            self.ex.progress(line)
