"""Continuous pipelines: one unbounded streaming query per computation, live until stopped. A downstream
batch never acts on an upstream low watermark beyond what it read (the upstream caps and the hold of
:class:`.BatchInputs`). docs/continuous.md; one stage: ``stage.py``."""

from __future__ import annotations

import functools
import signal
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.delta.jvm import activate
from deltawheel.statestore.delta.storefs import files_resolver
from deltawheel.statestore.exceptions import (
    ConfigError,
    DeltaWheelError,
    SessionLostError,
)
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.writepath.streams import ensure_stream_table
from deltawheel.statestore.zk.members import member_session
from kazoo.client import KazooState

from ..computation import Computation
from ..exceptions import BatchFailedError
from ..protocol.executor import ComputationExecutor
from ..sources.injector import publish_watermark
from ..tasks import worker as _worker
from .fused import FusedFeed, feed_downstream, fused_batch, fused_in_process, refuse_unfused
from .handover import HandoverWatch, hand_over
from .inputs import direct_source, query_of, stage_input, upstream_caps
from .pipeline import Pipeline, RunSummary, StopReport
from .pools import in_pool, scheduler_mode, warn_unless_fair
from .querystart import await_commit_log, pending_batch
from .restarts import RESTARTS, first_line, restart_delay_s, retryable, store_failed
from .sharing import Sharing
from .stage import Stage
from .triggers import Trigger
from .wiring import Wiring

if TYPE_CHECKING:
    from deltawheel.gc.background import BackgroundGc

__all__ = ["ContinuousRun", "StopReport", "RESTARTS"]


class _Stopping(Exception):
    """Raised in a batch Spark begins while the run stops: nothing of it runs (it runs again at the next start)."""


class _Failed(Exception):
    """What a batch that failed with a typed error raises to Spark; the stage keeps the error itself."""


class ContinuousRun:
    """A pipeline's computations running unbounded; made (and started) by ``engine.start_pipeline``.
    ``triggers``: per computation name, over ``trigger``; ``computations``: those this process runs
    (default: all); ``tick_s``: how often an idle query looks for due timers; ``instance``: this job
    instance's name when instances share the intervals (``sharing.py``); ``standby``: that instance holds
    no interval while an instance that is not a standby lives; ``restarts``: :data:`RESTARTS`."""

    def __init__(self, spark: Any, layout: StoreLayout, pipeline: Pipeline, *, wiring: Wiring,
                 trigger: str | float | Trigger | None = None,
                 triggers: Mapping[str, str | float | Trigger | None] | None = None,
                 computations: Sequence[str] | None = None, wait_s: float = 60.0,
                 progress: Callable[[str], None] | None = None, write_path: str = "auto", direct_read: bool = True,
                 tick_s: float = 1.0, instance: str | None = None, background_gc: BackgroundGc | None = None,
                 zk: ZkConfig | None = None, restarts: int = RESTARTS, standby: bool = False) -> None:
        ordered = pipeline.ordered()  # a stream nothing produces, or a cycle: refused before anything starts
        names = [c.name for c in ordered]
        wanted = list(names) if computations is None else list(computations)
        unknown = sorted((set(wanted) | set(triggers or {})) - set(names))
        if unknown:
            raise ConfigError(f"pipeline {pipeline.name} has no computation {', '.join(map(repr, unknown))} (it has "
                              f"{', '.join(names)})")
        if not wanted:
            raise ConfigError(f"pipeline {pipeline.name}: no computation to run (computations=[])")
        self._fused = fused_in_process(pipeline, wanted=wanted, instance=instance)
        if standby and instance is None:
            raise ConfigError(f"pipeline {pipeline.name}: standby=True needs an instance name (a standby is an "
                              "instance sharing the intervals that holds none while another instance lives)")
        if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 0:
            raise ConfigError(f"restarts={restarts!r}: a stage's restarts in its driver are a whole number >= 0 "
                              "(0: a failed stage stops the run)")
        default = Trigger.parse(trigger)
        self._triggers = {n: Trigger.parse((triggers or {})[n]) if n in (triggers or {}) else default for n in names}
        self.spark, self.layout, self.pipeline, self.wiring = spark, layout, pipeline, wiring
        self._files = files_resolver(spark)  # a stream table's files, local or on the object store (_consumed)
        self._comps = [c for c in ordered if c.name in wanted]
        self.wait_s, self.progress, self.write_path, self.direct_read = wait_s, progress, write_path, direct_read
        self.tick_s, self.instance, self.zk, self.restarts = tick_s, instance, zk, restarts
        self._restarters: list[threading.Thread] = []
        self._sharing = None if instance is None else Sharing(
            spark, layout, pipeline, wiring=wiring, instance=instance, progress=self._log, write_path=write_path,
            standby=standby)
        self.stages: dict[str, Stage] = {}
        self._stopping = threading.Event()
        self._wake = threading.Event()  # the ticks wait on it: a tool's hand-over request, or the stop
        self._handover: HandoverWatch | None = None
        self._ticker: threading.Thread | None = None
        self._stopped: StopReport | None = None
        self.background_gc = background_gc
        if background_gc is not None and background_gc.progress is None:
            background_gc.progress = self._log

    @property
    def queries(self) -> dict[str, Any]:
        """Computation name -> its Spark ``StreamingQuery``."""
        return {n: s.query for n, s in self.stages.items() if s.query is not None}

    @property
    def executors(self) -> dict[str, ComputationExecutor]:
        """Computation name -> its executor (``reports``, ``settle()``, ...)."""
        return {n: s.ex for n, s in self.stages.items() if s.ex is not None}

    def start(self) -> ContinuousRun:
        """Create the stream tables read, start the executors, queries (upstream first) and ticks; on a
        failure, what started is stopped and its leases given back before it is raised."""
        _worker.warm_workers(self.spark, on_error=lambda e: self._log(
            f"warming the Python workers failed (the tasks start them instead): {e!r}"))
        try:
            for comp in self.pipeline.ordered():  # any stage may read an upstream's watermark before it started
                self.wiring.authority.declare(comp.name, upstream=self.pipeline.upstream(comp),
                                              num_intervals=type(comp).num_intervals)
            warn_unless_fair(scheduler_mode(self.spark), len(self._comps), self._log)
            if self.instance is None:
                refuse_unfused(self._files, self.layout, self.pipeline, [c.name for c in self._comps])
            for comp in self._comps:
                for s in comp.inputs:
                    if s not in {i.name for i in self.pipeline.injectors}:
                        ensure_stream_table(self.spark, self.layout, s)  # read before anything is delivered
            if self._sharing is not None:
                self._sharing.join()
            self._handover = HandoverWatch(self.wiring.client, self.pipeline.name, [c.name for c in self._comps],
                                           wake=self._wake, stopping=self._stopping)
            if self._sharing is not None:
                self._sharing.watch(self._wake, self._stopping)  # a join or leave wakes the ticks
            for comp in self._comps:
                try:
                    self._start_stage(comp)
                except Exception as exc:  # the store not serving yet: the stage starts again (check())
                    typed = exc if isinstance(exc, DeltaWheelError) else self._store_failure(exc)
                    if typed is None or not self.restarts or not retryable(typed):
                        raise
                    stage = self.stages[comp.name]
                    self._stop_stage(stage)
                    stage.failed.append(typed)
        except BaseException:
            self._stopping.set()
            self._shutdown(timeout_s=60.0)
            raise
        self._ticker = threading.Thread(target=self._tick_loop, name=f"deltawheel-ticks-{self.pipeline.name}",
                                        daemon=True)
        self._ticker.start()
        self._log(f"{self.pipeline.name}: running {', '.join(f'{n} ({s.trigger})' for n, s in self.stages.items())}"
                  "; stop with Ctrl-C or SIGTERM")
        return self

    def check(self) -> None:
        """Raise the typed error of a failed batch or tick, or Spark's error of a query that ended by itself,
        unless the stage starts again in this driver (a retryable error, at most :attr:`restarts` in a row)."""
        for stage in list(self.stages.values()):
            if stage.failed and not stage.restarting:
                self._restart_or_raise(stage, stage.failed[-1])
        if self._stopping.is_set():
            return
        for name, stage in list(self.stages.items()):
            q = stage.query
            if q is not None and not stage.restarting and not stage.failed and not q.isActive:  # failed: above, next
                exc = q.exception()
                ended = BatchFailedError(f"{self.pipeline.name}: the query of {name} ended by itself"
                                         + (f": {exc}" if exc is not None else "")
                                         + "; the same command again resumes it from its checkpoint")
                typed = None if exc is None else self._store_failure(exc)
                if typed is None:
                    raise ended  # stopped from outside, or an error of Spark's own: not ours to retry
                self._restart_or_raise(stage, typed)

    def _store_failure(self, exc: BaseException) -> DeltaWheelError | None:
        return store_failed(exc, self.layout.root, self.pipeline.name)

    def _restart_or_raise(self, stage: Stage, exc: BaseException) -> None:
        """Start ``stage`` again in a thread of its own if ``exc`` is retryable and restarts are left, else raise."""
        if not retryable(exc) or stage.restarts >= self.restarts or self._stopping.is_set():
            raise exc  # a lease taken over, a fenced sequencer, or no restart left: the run stops
        stage.restarting = True
        t = threading.Thread(target=self._restart, args=(stage, exc), daemon=True,
                             name=f"deltawheel-restart-{stage.comp.name}")
        self._restarters.append(t)
        t.start()

    def _restart(self, old: Stage, exc: BaseException) -> None:
        """Stop ``old`` (its query, then its executor: the leases go back), wait, start its computation again
        as a start of the process would (leases, fence, recovery, the query from its checkpoint). A start that
        fails is the new stage's failure, for :meth:`check` to restart or raise."""
        activate(self.spark)  # this thread's commits (the fence, a catch-up): Delta needs a session on it
        name, n = old.comp.name, old.restarts + 1
        delay = restart_delay_s(n)
        self._log(f"{name}: {first_line(exc)}; starting the stage again in this driver in {delay:.0f}s (restart "
                  f"{n} of at most {self.restarts} without a committed batch)")
        self._stop_stage(old)
        if self._stopping.wait(delay):
            return
        if isinstance(exc, SessionLostError) and not self._new_session(name):
            old.restarts, old.restarting = self.restarts, False  # check() raises ``exc``
            return
        t0 = time.monotonic()
        try:
            self._start_stage(old.comp, restarts=n)
        except BaseException as failed:
            new = self.stages[name]
            self._stop_stage(new)
            typed = failed if isinstance(failed, DeltaWheelError) else self._store_failure(failed)
            new.restarts = n
            new.failed.append(failed if typed is None else typed)  # untyped: check() raises it
            return
        self._log(f"{name}: started again in this driver in {time.monotonic() - t0:.1f}s (restart {n})")

    def _new_session(self, name: str) -> bool:
        """After this process's ZooKeeper session expired: wait for kazoo's new session and join the
        members again under it (an instance); False: none within ``wait_s``, or another process runs
        this instance now (its member znode is another live session's: that process goes on)."""
        client, deadline = self.wiring.client, time.monotonic() + self.wait_s
        while client.state != KazooState.CONNECTED:
            if self._stopping.wait(0.5) or time.monotonic() > deadline:
                return False
        if self._sharing is None or self.instance is None:
            return True
        owner = member_session(client, self.pipeline.name, self.instance)
        if owner is not None and owner != client.client_id[0]:
            self._log(f"{name}: instance {self.instance} runs in another process now (its member znode is another "
                      "session's): this one does not take its leases back")
            return False
        self._sharing.join()
        return True

    def _stop_stage(self, stage: Stage) -> None:
        """Stop a failed stage's query and executor (its delivery settles if it can; its leases go back)."""
        with stage.lock:
            if stage.query is not None:
                try:
                    stage.query.stop()
                except Exception as exc:
                    self._log(f"{stage.comp.name}: stopping its query failed: {first_line(exc)}")
            if stage.ex is not None:
                try:
                    stage.ex.stop()
                except Exception as exc:
                    self._log(f"{stage.comp.name}: stopping it failed ({first_line(exc)}); its leases were "
                              "given back")

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Until the run is stopped or a query fails (raised by :meth:`check`); False after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._stopped is None:
            self.check()
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
        return True

    def run_until_stopped(self, *, seconds: float | None = None, drain: bool = False) -> StopReport:
        """Block until SIGTERM, Ctrl-C, ``seconds`` or a failure, then :meth:`stop` (or :meth:`drain`);
        a batch's own typed DeltaWheelError is raised after the run was stopped."""
        asked = threading.Event()
        old: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                old[sig] = signal.signal(sig, lambda signum, _frame: asked.set())
        deadline = None if seconds is None else time.monotonic() + seconds
        try:
            while not asked.wait(0.25):
                self.check()
                if deadline is not None and time.monotonic() >= deadline:
                    break
        except BaseException:
            self.stop()
            raise
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
        if drain:
            self.drain()
        return self.stop()

    def drain(self) -> RunSummary:
        """The input has ended: run every stage to its end; returns and raises as :func:`.drain.drain`."""
        from .drain import drain

        return drain(self)

    def stop(self, *, timeout_s: float = 120.0) -> StopReport:
        """Stop gracefully (idempotent); returns what was done. ``timeout_s`` bounds each batch's wait."""
        if self._stopped is not None:
            return self._stopped
        t0 = time.monotonic()
        self._stopping.set()
        self._wake.set()
        unfinished = self._shutdown(timeout_s=timeout_s)
        if self.background_gc is not None and not self.background_gc.wait(timeout_s):  # its Spark jobs end first
            self._log("background gc still running after the stop's timeout (its next run is at the next start)")
        self._stopped = StopReport(pipeline=self.pipeline.name, queries=len(self.queries),
                                   batches=sum(s.batches for s in self.stages.values()),
                                   records_in=sum(s.records_in for s in self.stages.values()),
                                   seconds=time.monotonic() - t0, unfinished=tuple(unfinished))
        self._log(str(self._stopped))
        return self._stopped

    def summary(self) -> RunSummary:
        """Per computation its batch reports (this run's), published low watermark and lag."""
        reports = {n: list(s.ex.reports) if s.ex is not None else [] for n, s in self.stages.items()}
        return RunSummary.of(reports, self.wiring.authority)

    def _shutdown(self, *, timeout_s: float) -> list[str]:
        """End the ticks, every query after its batch in flight (at most ``timeout_s``) and every executor;
        returns the queries still running."""
        if self._ticker is not None:
            self._ticker.join()
        if self._sharing is not None:
            self._sharing.leave()  # first: the others' target changes as the leases go back
        deadline = time.monotonic() + timeout_s
        for t in self._restarters:  # a stage starting again is stopped below once started
            t.join(max(0.0, deadline - time.monotonic()))
        stoppers = {name: threading.Thread(target=self._stop_query, args=(stage, deadline), daemon=True,
                                           name=f"deltawheel-stop-{name}")
                    for name, stage in self.stages.items() if stage.query is not None and stage.query.isActive}
        for t in stoppers.values():
            t.start()
        unfinished = []
        for name, t in stoppers.items():
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                unfinished.append(name)
        for name, stage in reversed(list(self.stages.items())):
            try:
                with stage.lock:  # a tick that began is over (the ticker ended); a batch refused
                    if stage.ex is not None:
                        stage.ex.stop()  # the delivery lands, the leases go back
            except Exception as exc:
                self._log(f"{name}: stopping failed: {type(exc).__name__}: {exc}")
        return unfinished

    @staticmethod
    def _stop_query(stage: Stage, deadline: float) -> None:
        """Stop the query once the batch in flight ended (Spark's stop would cancel its jobs)."""
        held = stage.lock.acquire(timeout=max(0.0, deadline - time.monotonic()))
        try:
            await_commit_log(stage.query, stage.done_batch, deadline)
            stage.query.stop()
        except Exception:
            pass
        finally:
            if held:
                stage.lock.release()

    def _start_stage(self, comp: Computation, *, restarts: int = 0) -> None:
        p, authority = self.pipeline, self.wiring.authority
        injectors = {i.name: i for i in p.injectors}
        sharing = self._sharing
        chk, name = query_of(self.layout, p.name, comp.name, self.instance)  # an instance: its own checkpoint
        stage = self.stages[comp.name] = Stage(comp=comp, ex=None, checkpoint=chk, trigger=self._triggers[comp.name],
                                               restarts=restarts)
        if sharing is not None:  # instances share the intervals: a query and a checkpoint per instance
            stage.replay_id = pending_batch(chk)
            unknown = dict.fromkeys(upstream_caps(authority, p.upstream(comp)))
            stage.ex = sharing.start(comp, chk, wait_s=self.wait_s, caps=unknown)
        else:
            ex = stage.ex = self.wiring.stage_executor(self.spark, self.layout, p, comp, checkpoint=chk,
                                                       progress=self.progress, write_path=self.write_path)
            self._log(f"{comp.name}: waiting for leases on {type(comp).num_intervals} intervals ...")
            ex.start_in_background(wait_s=self.wait_s, then=lambda: self._log(
                f"{comp.name}: leases held, sequencers {ex.owner.sequencers}"))
            ex.wait_leased()  # the leases keep a second copy of this job off the query's checkpoint
            stage.replay_id = pending_batch(chk)
        if comp.name in self._fused:  # no query: its upstream's batches run it (fused.py)
            stage.fused = FusedFeed(self.spark, self.layout, comp, checkpoint=chk, files=self._files,
                                    direct_read=self.direct_read)
            stage.replay_id, stage.next_caps = None, upstream_caps(authority, p.upstream(comp))
            return
        inp = stage_input(self.spark, self.layout, comp, injectors, shared=sharing is not None)
        if sharing is None and self.direct_read:  # after stage_input: an injector knows its files once it streams
            stage.direct = direct_source(comp, injectors, layout=self.layout, checkpoint=chk)
        stage.next_caps = upstream_caps(authority, p.upstream(comp))

        def batch(df: Any, batch_id: int) -> None:
            while not stage.lock.acquire(timeout=0.1):  # a tick runs, or the stop (or a restart) holds it
                if self._stopping.is_set() or stage.restarting:
                    raise _Stopping(f"{comp.name} batch {batch_id}: the run (or the stage) is stopping")
            try:
                if self._stopping.is_set() or stage.restarting:
                    raise _Stopping(f"{comp.name} batch {batch_id}: the run (or the stage) is stopping")
                try:
                    self._hand_over(stage)  # a tool's request that came between batches
                    replay = stage.replay_id is not None and batch_id <= stage.replay_id
                    caps = dict.fromkeys(stage.next_caps) if replay else dict(stage.next_caps)
                    if sharing is not None:  # the target may have changed: give back, take free intervals
                        stage.ex, _ = sharing.rebalance(comp, chk, stage.ex, caps=caps)
                        if stage.ex is None:
                            sharing.idle_batch(comp, chk, df, batch_id)
                            stage.replay_id = None
                            stage.next_caps = upstream_caps(authority, p.upstream(comp))
                            stage.done_batch = batch_id
                            return
                    ex = stage.ex
                    assert ex is not None
                    ex.wait_started()
                    ex.next_batch_inputs(stage.inputs(caps, "from_commit"))
                    stats = inp.partition_stats(df, ex)
                    before = ex.records_in_total
                    ex(df, batch_id)
                    stage.acted_caps = caps
                    stage.replay_id = None
                    stage.batches += 1
                    stage.restarts = 0
                    stage.records_in += ex.records_in_total - before
                    stage.done_batch = batch_id
                    if self.background_gc is not None:  # starts a due run in its thread; never waits for one
                        self.background_gc.batch_done()
                    for inj, st in stats:
                        inj.observe(st())
                        publish_watermark(authority, inj)
                    if not self._stopping.is_set():  # a tool's request, at this boundary (a tick may never
                        self._hand_over(stage)  # find the lock free between batches that follow each other)
                    # read before Spark plans the next micro-batch (its snapshot of the stream tables)
                    stage.next_caps = upstream_caps(authority, p.upstream(comp))
                    ex.next_batch_inputs(stage.inputs(stage.next_caps))
                    self._hand_over(stage)  # a tool's request that came during the batch: at its end
                    feed_downstream(self.stages, self._fused, comp.name, authority=authority, pipeline=p,
                                    failed=self._fused_failed)
                except Exception as exc:  # the store failed under Spark's or pyarrow's call: typed here
                    typed = exc if isinstance(exc, DeltaWheelError) else self._store_failure(exc)
                    if typed is None:
                        raise
                    stage.failed.append(typed)
                    # the driver holds the typed error: Spark's query gets one short line, not Py4J's
                    # nested tracebacks (Spark's regexes overflow a thread's stack on such text)
                    raise _Failed(f"{comp.name} batch {batch_id}: {first_line(typed)[:200]}") from None
            finally:
                stage.lock.release()

        writer = inp.writer(batch, checkpoint=chk, name=name)
        with in_pool(self.spark, name):  # its micro-batches' jobs: a FAIR pool of its own (pools.py)
            stage.query = stage.trigger.apply(writer).start()

    def _fused_failed(self, stage: Stage, exc: BaseException) -> None:
        typed = exc if isinstance(exc, DeltaWheelError) else self._store_failure(exc)
        stage.failed.append(exc if typed is None else typed)  # check() restarts it or raises
        self._log(f"{stage.comp.name}: its fused batch failed: {first_line(exc)}")

    def _log(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def _tick_loop(self) -> None:
        assert self._handover is not None
        activate(self.spark)  # a tick's timer batch commits from this thread
        while not self._stopping.is_set():
            self._handover.wait(self.tick_s)  # a tick, or woken by a tool's request (or the stop)
            if self._stopping.is_set():
                break
            if self.background_gc is not None:
                self.background_gc.batch_done(0)  # a run due by time while the stages are idle
            for stage in list(self.stages.values()):
                if self._stopping.is_set() or stage.failed or stage.restarting:
                    continue
                if stage.fused is None and (stage.query is None or not stage.query.isActive
                                            or stage.query.lastProgress is None):
                    continue  # its first micro-batch (a replay, or the input waiting) fires what is due first
                if not stage.lock.acquire(blocking=False):
                    continue  # a batch runs: it fires what is due
                try:
                    if not self._stopping.is_set() and stage.ex is not None:
                        self._hand_over(stage)
                    moved = False
                    if not self._stopping.is_set() and self._sharing is not None and stage.replay_id is None:
                        caps = stage.acted_caps or {u: None for u in stage.next_caps}  # none acted on: unknown
                        stage.ex, moved = self._sharing.rebalance(stage.comp, stage.checkpoint, stage.ex, caps=caps)
                    # intervals just taken: the query's next micro-batch (often waiting for this lock, a
                    # failover's first) fires what is due; else the next tick does
                    if not self._stopping.is_set() and stage.ex is not None and not moved:
                        with in_pool(self.spark, stage.query.name if stage.query is not None else "default"):
                            if stage.fused is not None:  # what a delivery after its upstream's batch brought
                                fused_batch(stage, self.wiring.authority, self.pipeline)
                            stage.tick(self.wiring.authority, self.pipeline, layout=self.layout, files=self._files)
                            feed_downstream(self.stages, self._fused, stage.comp.name, authority=self.wiring.authority,
                                            pipeline=self.pipeline, failed=self._fused_failed)
                except DeltaWheelError as exc:
                    stage.failed.append(exc)
                    self._log(f"{stage.comp.name}: {type(exc).__name__}: {exc}")
                except Exception as exc:
                    self._log(f"{stage.comp.name}: looking for due timers failed: {type(exc).__name__}: {exc}")
                finally:
                    stage.lock.release()

    def _hand_over(self, stage: Stage) -> None:
        """At a batch boundary: give the intervals a tool asked for back, retake them once it is done."""
        if self._handover is not None and self._handover.asked(stage.comp.name):
            sharing = self._sharing  # retakes the free ones of its share: another instance may have taken some
            retake = None if sharing is None else functools.partial(
                sharing.retake, stage.comp, stage.checkpoint, caps=dict.fromkeys(stage.next_caps))
            stage.ex = hand_over(stage.ex, self.wiring.client, self.pipeline.name, stage.comp.name,
                                 wait=self._handover.wait, stopping=self._stopping, wait_s=self.wait_s,
                                 log=self._log, retake=retake)
