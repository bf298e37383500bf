"""The pipeline runner: bounded inputs run to completion in rounds of ``availableNow`` queries, one per
computation in topological order, then timers flushed, until nothing moves. A re-run resumes.
docs/embedding.md, "Rounds" and "Direct read"."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.delta.jvm import require_classic_session
from deltawheel.statestore.delta.storefs import files_resolver
from deltawheel.statestore.exceptions import DeltaWheelError
from deltawheel.statestore.layout import StoreLayout, validate_name
from deltawheel.statestore.zk.handover import read_handover
from deltawheel.statestore.zk.lease_tools import list_leases
from deltawheel.statestore.zk.leases import LeaseManager
from deltawheel.statestore.zk.members import target
from deltawheel.statestore.zk.refusal import DEFAULT_MAX_PAUSE_S

from ..computation import Computation
from ..protocol.executor import ComputationExecutor
from ..protocol.faults import FaultPoint
from ..protocol.host import BatchInputs
from ..protocol.reports import BatchReport
from ..sources.injector import publish_watermark
from ..tasks import worker as _worker
from .fused import FusedFeed, fused_in_process, refuse_unfused
from .handover import hand_over
from .inputs import direct_source, query_of, stage_input, upstream_caps
from .pipeline import MoveTiming, Pipeline, RunSummary
from .sharing import Sharing, catch_up
from .wiring import Wiring, migrate_store, open_client_planned, wire

if TYPE_CHECKING:
    from deltawheel.gc.background import BackgroundGc

__all__ = ["PipelineRunner"]


class PipelineRunner:
    """Runs a pipeline's bounded inputs to completion. ``max_pause_s``: how long a batch waits while
    ZooKeeper does not serve before ``LeaseSuspendedError`` (None: until the session expires, then
    ``LeaseLostError``); ``wiring``: an engine's ZooKeeper objects to run on, left open."""

    def __init__(self, spark: Any, layout: StoreLayout, pipeline: Pipeline, *, zk: ZkConfig,
                 owner: str | None = None, wait_s: float = 60.0, progress: Callable[[str], None] = print,
                 faults: Callable[[FaultPoint, int], None] | None = None, max_rounds: int = 50,
                 end_of_input: bool = True, write_path: str = "auto", direct_read: bool = True,
                 warm_workers: bool = True, instance: str | None = None,
                 intervals: Sequence[int] | None = None, follow: Callable[[], bool] | None = None,
                 poll_s: float = 1.0, max_pause_s: float | None = DEFAULT_MAX_PAUSE_S,
                 wiring: Wiring | None = None, background_gc: BackgroundGc | None = None) -> None:
        if instance is not None:
            validate_name("instance", instance)
        require_classic_session(spark)
        self.instance, self.intervals = instance, None if intervals is None else tuple(intervals)
        # an instance without a hand-split interval list joins the members and takes its share
        self.auto_assign = instance is not None and intervals is None
        self.follow, self.poll_s, self.max_pause_s = follow, poll_s, max_pause_s
        self.moves: list[MoveTiming] = []
        self.spark, self.layout, self.pipeline, self.zk = spark, layout, pipeline, zk
        self.direct_read, self.write_path, self.warm_workers = direct_read, write_path, warm_workers
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.wait_s, self.progress, self.faults = wait_s, progress, faults
        self.max_rounds, self.end_of_input, self.wiring = max_rounds, end_of_input, wiring
        self.background_gc = background_gc
        if background_gc is not None and background_gc.progress is None:
            background_gc.progress = self.progress
        self._read_upto: dict[str, list[Any]] = {}  # per computation: its inputs' tokens at its last query start
        self._fused = fused_in_process(pipeline, wanted=[c.name for c in pipeline.computations], instance=instance)
        self._sharing: Sharing | None = None

    def run(self) -> RunSummary:
        """Migrate the store (not with ``wiring``), then run at most ``max_rounds`` rounds."""
        warming = _worker.warm_workers(self.spark, on_error=lambda e: self.progress(
            f"warming the Python workers failed (the tasks start them instead): {e!r}")) if self.warm_workers else None
        try:
            if self.wiring is not None:  # an engine's: connected, the store migrated; it closes them
                return self._run(self.wiring, own=False)
            return self._connect_and_run()
        finally:
            if warming is not None:
                warming.join()

    def _connect_and_run(self) -> RunSummary:
        client, planned, release = open_client_planned(self.spark, self.layout, self.zk)
        try:
            # two copies started at once must not migrate the same store concurrently
            migrate_store(self.spark, self.layout, client, pipeline=self.pipeline.name, owner=self.owner,
                          planned=planned)
            wiring = wire(self.spark, self.layout, client, pipeline=self.pipeline.name, owner=self.owner, zk=self.zk,
                          max_pause_s=self.max_pause_s, instance=self.instance)
            return self._run(wiring, own=True)
        finally:
            client.stop()
            client.close()
            release()

    def _run(self, wiring: Wiring, *, own: bool) -> RunSummary:
        """The rounds on ``wiring`` (``own``: the runner's, whose leases it closes at the end)."""
        p = self.pipeline
        leases, authority = wiring.leases, wiring.authority
        self._wiring = wiring
        self._done_reports: dict[str, list[BatchReport]] = {c.name: [] for c in p.computations}
        if self.auto_assign:  # a live member: the intervals are split by the live members
            self._sharing = Sharing(self.spark, self.layout, p, wiring=wiring, instance=str(self.instance),
                                    progress=self.progress, write_path=self.write_path)
            self._sharing.moves = self.moves
            self._sharing.join()
        execs: dict[str, ComputationExecutor | None] = {}
        if self.instance is None:
            refuse_unfused(files_resolver(self.spark), self.layout, p, [c.name for c in p.computations])
        try:
            self._start_all(execs)
            rnd = 0
            while self.follow is not None or rnd < self.max_rounds:
                moved = self._round(execs, authority)
                if moved:
                    self.progress(f"round {rnd} done: {moved} records/timers moved")
                if self.follow is None and not moved:
                    break
                if self.follow is not None:
                    if self.follow():  # a graceful leave: after the round's batches, not after the backlog
                        break
                    if not moved:
                        time.sleep(self.poll_s)  # following the input: look again
                rnd += 1
        except BaseException as exc:
            # the cause is what the caller must see: a failure on the way out is only logged
            self._shutdown(execs, leases if own else None, failing=exc)
            raise
        self._shutdown(execs, leases if own else None, failing=None)
        if self.background_gc is not None:  # its Spark jobs end before the caller stops the session
            self.background_gc.wait()
        return RunSummary.of({name: self._done_reports[name] + (list(ex.reports) if ex is not None else [])
                              for name, ex in execs.items()}, authority)

    def _start_all(self, execs: dict[str, ComputationExecutor | None]) -> None:
        """An executor per computation, in the pipeline's order (auto-assigned: as the members split)."""
        ordered = self.pipeline.ordered()
        for i, comp in enumerate(ordered):
            if self.auto_assign:
                execs[comp.name] = None
                self._rebalance(comp, execs)
            else:
                started = execs[comp.name] = self._start(comp, self.intervals, wait_s=self.wait_s)
                # leases in pipeline order: two copies started at once must not each wait for the other's
                if i < len(ordered) - 1:
                    started.wait_leased()

    def _round(self, execs: dict[str, ComputationExecutor | None], authority: Any) -> int:
        """One round: each computation consumes its input, then flushes; the records and timers moved."""
        p = self.pipeline
        moved = 0
        for comp in p.ordered():
            if self.auto_assign:
                self._rebalance(comp, execs)  # between batches: give back, take free intervals
            else:
                self._hand_over(comp, execs)  # a tool asked for its intervals (promote, repair)
            ex = execs[comp.name]
            if ex is None:
                continue  # holds no interval of it now
            # consume, then flush: never act on a watermark beyond what upstream delivered
            moved += self._consume(comp, ex)
            if self.end_of_input:  # its bounded inputs are fully read: watermark to the end
                for inj in p.injectors:
                    if inj.name in comp.inputs:
                        inj.finish()
                        publish_watermark(authority, inj, instance=self.instance)
            r = ex.flush()
            ex.settle()  # its last delivery lands before the next stage reads
            # its stream tables exist before the next stage reads them, even with no batch
            ex.path.streams_ready()
            moved += r.timers_fired + r.productions
            if self.background_gc is not None:  # a run due by time (its batches count in _consume)
                self.background_gc.batch_done(0)
        return moved

    def _start(self, comp: Computation, intervals: Sequence[int] | None, *, wait_s: float) -> ComputationExecutor:
        """An executor of ``comp`` holding ``intervals`` (None: all), started and caught up."""
        caught: dict[int, int] = {}  # what its estimates record as held: the intervals once caught up on
        ex = self._wiring.stage_executor(
            self.spark, self.layout, self.pipeline, comp, checkpoint=query_of(
                self.layout, self.pipeline.name, comp.name, self.instance)[0], instance=self.instance, caught=caught,
            faults=self.faults, progress=self.progress, write_path=self.write_path, intervals=intervals)
        n = type(comp).num_intervals if intervals is None else len(intervals)
        self.progress(f"{comp.name}: waiting for leases on {n} intervals ...")
        if self.instance is None:
            # nothing to catch up: fence and recovery run while the query starts; its first batch waits
            ex.start_in_background(wait_s=wait_s, then=lambda: self.progress(
                f"{comp.name}: leases held, sequencers {ex.owner.sequencers}"))
            return ex
        ex.start(wait_s=wait_s)
        self.progress(f"{comp.name}: leases held, sequencers {ex.owner.sequencers}")
        catch_up(ex, self.spark, self.pipeline.injectors, instance=self.instance, caps={}, caught=caught,
                 progress=self.progress)
        return ex

    def _rebalance(self, comp: Computation, execs: dict[str, ComputationExecutor | None]) -> None:
        """Between batches: take the free intervals the target gives this instance (``members.py``) but
        a tool asked for; give back, once the delivery settled, those assigned elsewhere."""
        assert self._sharing is not None
        client = self._wiring.client
        shares = target(client, self.pipeline.name, comp.name, type(comp).num_intervals)
        want = set(shares.get(str(self.instance), ()))
        asked = read_handover(client, self.pipeline.name, comp.name)  # a tool's (promote, repair): give back
        want -= set(asked.intervals) if asked is not None else set()
        ex = execs.get(comp.name)
        held = set(ex.owner.intervals) if ex is not None else set()
        owners = {r["interval"]: r["owner"] for r in list_leases(client, pipeline=self.pipeline.name)
                  if r["computation"] == comp.name}
        new = (held & want) | {iv for iv in want - held if owners.get(iv) is None}
        if new != held:
            execs[comp.name] = self._sharing.move(comp, ex, new, stopped=lambda old: self._retire(old, execs),
                                                  start=lambda ivs: self._start(comp, ivs, wait_s=0.0))

    def _hand_over(self, comp: Computation, execs: dict[str, ComputationExecutor | None]) -> None:
        """Between batches: a tool asked for intervals held here (``zk/handover.py``): give every lease
        back once the delivery settled, wait for the tool to finish, then start again on them."""
        ex = execs.get(comp.name)

        def retake() -> ComputationExecutor:
            assert ex is not None
            self._retire(ex, execs)
            started = execs[comp.name] = self._start(comp, self.intervals, wait_s=self.wait_s)
            started.wait_leased()
            return started

        execs[comp.name] = hand_over(ex, self._wiring.client, self.pipeline.name, comp.name,
                                     wait=lambda _s: time.sleep(0.2), stopping=threading.Event(),
                                     wait_s=self.wait_s, log=self.progress, retake=retake)

    def _retire(self, ex: ComputationExecutor, execs: dict[str, ComputationExecutor | None]) -> None:
        """``ex`` stopped: its reports kept for the summary, its computation held by none here."""
        self._done_reports[ex.comp.name] += ex.reports
        execs[ex.comp.name] = None

    def _shutdown(self, execs: dict[str, ComputationExecutor | None], leases: LeaseManager | None, *,
                  failing: BaseException | None) -> None:
        """Stop the executors, close ``leases`` (unless None); raise the first failure unless ``failing``."""
        first: BaseException | None = None
        if self._sharing is not None:
            self._sharing.leave()  # first: the others' target changes as the leases go back
        for ex in execs.values():
            if ex is None:
                continue
            try:
                ex.stop()
            except Exception as exc:
                first = first or exc
                self.progress(f"{ex.comp.name}: stopping failed: {type(exc).__name__}: {exc}")
        if leases is not None:
            leases.close()
        if first is not None and failing is None:
            raise first

    def _consume(self, comp: Computation, ex: ComputationExecutor) -> int:
        """One availableNow query over the computation's inputs; returns records consumed."""
        injectors = {i.name: i for i in self.pipeline.injectors}
        # instances: read before the query pins its upstream snapshot (one advanced after it may cover unread rows)
        capped = self.instance is not None and ex.authority is not None
        caps = upstream_caps(ex.authority, ex.upstream) if capped else {}
        chk, name = query_of(self.layout, self.pipeline.name, comp.name, self.instance)
        if comp.name in self._fused:
            return self._consume_fused(comp, ex, chk)
        last = self._read_upto.get(comp.name)
        if last is not None and self._input_tokens(comp) == last:
            ex.next_batch_inputs(BatchInputs(upstream_caps=caps, direct_source=ex.inputs.direct_source))
            return 0  # every input is as it was when the last query started: it read all of it
        inp = stage_input(self.spark, self.layout, comp, injectors, shared=self.instance is not None)
        # after its stream_df; shared intervals: the skip rule filters the frame, the tasks must not read the files
        direct = self.direct_read and ex.shared is None
        ex.next_batch_inputs(BatchInputs(upstream_caps=caps, direct_source=direct_source(
            comp, injectors, layout=self.layout, checkpoint=None, kafka_checkpoint=chk) if direct else None))
        before = ex.records_in_total
        tokens = self._input_tokens(comp)  # after the frames: building one may create its files
        self._read_upto.pop(comp.name, None)
        failed: list[BaseException] = []

        def batch(df: Any, batch_id: int) -> None:
            try:
                ex.wait_started()  # the start runs while the query starts (_start)
            except BaseException as exc:  # whatever it is, it is the cause the caller must see
                failed.append(exc)
                raise
            try:
                stats = inp.partition_stats(df, ex)
                ex(df, batch_id)
                for inj, st in stats:
                    inj.observe(st())
                    if ex.authority is not None:
                        publish_watermark(ex.authority, inj, instance=self.instance,
                                          held=None if self.instance is None else {comp.name: ex.owner.sequencers})
                if self.background_gc is not None:  # starts a due run in its thread; never waits for one
                    self.background_gc.batch_done()
            except DeltaWheelError as exc:
                failed.append(exc)
                raise

        ex.wait_leased()  # the leases keep a second copy of this job off the query's checkpoint
        q = inp.writer(batch, checkpoint=chk, name=name).trigger(availableNow=True).start()
        try:
            q.awaitTermination()
        except Exception as exc:
            if failed:  # the typed cause (e.g. LeaseLostError), not Spark's wrapper around its text
                raise failed[-1] from exc
            raise
        if ex.metrics is not None:
            # metrics rows are written now, while the next queries run (stop waits for the rest)
            ex.metrics.flush(timeout_s=0)
        if None not in tokens:
            self._read_upto[comp.name] = tokens
        return ex.records_in_total - before

    def _consume_fused(self, comp: Computation, ex: ComputationExecutor, checkpoint: str) -> int:
        """A fused computation's batches over what its upstream delivered (``fused.py``); records consumed."""
        feed = FusedFeed(self.spark, self.layout, comp, checkpoint=checkpoint, files=files_resolver(self.spark),
                         direct_read=self.direct_read)
        before = ex.records_in_total
        while feed.more():
            feed.run(ex, dict)
            if self.background_gc is not None:
                self.background_gc.batch_done()
        return ex.records_in_total - before

    def _input_tokens(self, comp: Computation) -> list[Any]:
        """Per input: its injector's ``input_token()`` or stream table's newest version (None: unknown)."""
        from deltawheel.statestore.delta.log import latest_local_version

        injectors = {i.name: i for i in self.pipeline.injectors}
        out: list[Any] = []
        for s in comp.inputs:
            if s in injectors:
                token = getattr(injectors[s], "input_token", None)
                out.append(token() if callable(token) else None)
            else:
                out.append(latest_local_version(self.layout.stream(s)))
        return out
