"""Job instances sharing a continuous run's intervals (docs/rescaling.md)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.delta.warm import refresh, warm_commits
from deltawheel.statestore.exceptions import LeaseHeldError, LeaseSuspendedError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.zk.client import zk_errors
from deltawheel.statestore.zk.lease_tools import list_leases
from deltawheel.statestore.zk.members import Membership, members_path, target
from deltawheel.statestore.zk.turns import CommitTurns
from kazoo.recipe.watchers import ChildrenWatch

from ..computation import Computation
from ..protocol.executor import ComputationExecutor
from ..protocol.host import BatchInputs
from ..protocol.rescale import CATCH_UP_BATCH, SharedInput
from ..sources.injector import Injector
from .pipeline import MoveTiming, Pipeline
from .wiring import Wiring, record_held, shared_positions

__all__ = ["Sharing", "LOOK_AGAIN_S", "catch_up"]

#: How long a starting instance waits for a lease of its share before it looks at the target again.
LOOK_AGAIN_S = 10.0


class Sharing:
    """One job instance's part in sharing a run's intervals."""

    def __init__(self, spark: Any, layout: StoreLayout, pipeline: Pipeline, *, wiring: Wiring, instance: str,
                 progress: Callable[[str], None], write_path: str, standby: bool = False) -> None:
        self.spark, self.layout, self.pipeline, self.wiring = spark, layout, pipeline, wiring
        self.instance, self.progress, self.write_path = instance, progress, write_path
        self.member = Membership(wiring.client, pipeline=pipeline.name, instance=instance, acls=wiring.acls,
                                 standby=standby)
        self.moves: list[MoveTiming] = []
        # the instances commit to one rows table per computation: they take turns instead of racing
        wiring.store.turns = CommitTurns(wiring.client, pipeline=pipeline.name, writer=instance, acls=wiring.acls).turn
        self._idle: dict[str, SharedInput] = {}  # per computation held by none: its batches' positions

    def join(self) -> None:
        """Join the members (replacing this instance's dead predecessor's member znode)."""
        self.member.join()
        if self.member.replaced:
            self.progress(f"instance {self.instance}: replaced its predecessor's member znode (a restart)")

    def watch(self, wake: threading.Event, stopping: threading.Event) -> None:
        """Set ``wake`` at each join and leave of an instance: the ticks look at the target at once (a
        standby takes a dead instance's intervals when its session expires, not at its next tick)."""
        def changed(_members: list[str]) -> bool:
            wake.set()
            return not stopping.is_set()  # False: kazoo drops the watch

        ChildrenWatch(self.wiring.client, members_path(self.pipeline.name), changed)

    def leave(self) -> None:
        """Leave the members (first, so that the others' target changes as the leases go back)."""
        try:
            self.member.leave()
        except Exception as exc:
            self.progress(f"leaving the members failed: {type(exc).__name__}: {exc}")

    def wanted(self, comp: Computation) -> tuple[set[int], set[int]]:
        """(the intervals the target gives this instance, those of them free to take now)."""
        want = self._target(comp)
        with self._reading(comp):
            rows = [r for r in list_leases(self.wiring.client, pipeline=self.pipeline.name)
                    if r["computation"] == comp.name]
        holders = {r["interval"]: r for r in rows}
        free = {iv for iv in want if holders.get(iv) is None or holders[iv]["owner"] is None
                or holders[iv].get("instance") == self.instance}  # its dead predecessor's: taken over at once
        return want, free

    def _reading(self, comp: Computation) -> Any:
        return zk_errors(f"{comp.name}: reading the intervals instance {self.instance} should hold",
                         expired="its leases are lost; start the instance again (it takes them back under its name)",
                         lost="ZooKeeper does not answer")

    def _target(self, comp: Computation) -> set[int]:
        """The intervals the target gives this instance (LeaseSuspendedError: ZooKeeper does not answer)."""
        with self._reading(comp):
            n = type(comp).num_intervals
            return set(target(self.wiring.client, self.pipeline.name, comp.name, n).get(self.instance, ()))

    def start(self, comp: Computation, checkpoint: str, *, wait_s: float,
              caps: Mapping[str, int | None]) -> ComputationExecutor | None:
        """The executor of ``comp`` on this instance's free share of the target (None: none free); a share
        still held after :data:`LOOK_AGAIN_S` is looked at again, and after ``wait_s`` LeaseHeldError."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                _, free = self.wanted(comp)
            except LeaseSuspendedError as exc:  # a ZooKeeper server gone: the client moves to another
                if time.monotonic() >= deadline:
                    raise
                self.progress(f"{exc}; looking again")
                time.sleep(1.0)
                continue
            if not free:
                self.progress(f"{comp.name}: instance {self.instance} holds no interval now")
                self._stand_by(comp)
                return None
            t0 = time.monotonic()
            left = deadline - t0
            try:
                return self._executor(comp, checkpoint, sorted(free), wait_s=max(0.0, min(left, LOOK_AGAIN_S)),
                                      caps=caps)
            except LeaseHeldError as exc:
                if left <= LOOK_AGAIN_S:
                    raise
                self.progress(f"{comp.name}: intervals {sorted(free)} not all free ({exc}); looking at the target again")
                time.sleep(max(0.0, t0 + LOOK_AGAIN_S - time.monotonic()))  # (a refusal that came at once)

    def retake(self, comp: Computation, checkpoint: str, *, caps: Mapping[str, int | None]
               ) -> ComputationExecutor | None:
        """After a tool's hand-over: :meth:`start` without waiting for the others; None: none free."""
        try:
            return self.start(comp, checkpoint, wait_s=0.0, caps=caps)
        except LeaseHeldError as exc:  # taken meanwhile by another instance: the next rebalance looks again
            self.progress(f"{comp.name}: not all intervals of instance {self.instance}'s share free ({exc}); "
                          "trying again")
            return None

    def rebalance(self, comp: Computation, checkpoint: str, ex: ComputationExecutor | None, *,
                  caps: Mapping[str, int | None]) -> tuple[ComputationExecutor | None, bool]:
        """Between micro-batches: (the executor to go on with, whether it changed); LeaseLostError if lost."""
        held = set(ex.owner.intervals) if ex is not None else set()
        try:
            if ex is not None:  # a lost session first: its member znode is gone, the target would give nothing
                for iv in ex.owner.intervals:
                    self.wiring.leases.check_valid(comp.name, iv)
            want = self._target(comp)
            if want == held:
                return ex, False
            new = (held & want) | ((self.wanted(comp)[1] - held) if want - held else set())
        except LeaseSuspendedError:
            return ex, False  # no look at the target while ZooKeeper does not serve: the batch's lease check waits
        if new == held:
            return ex, False  # what it lacks is still held by another instance: a later look
        return self.move(comp, ex, new, start=lambda ivs: self._executor(comp, checkpoint, ivs, wait_s=0.0,
                                                                         caps=caps)), True

    def move(self, comp: Computation, ex: ComputationExecutor | None, new: set[int], *,
             start: Callable[[list[int]], ComputationExecutor],
             stopped: Callable[[ComputationExecutor], None] | None = None) -> ComputationExecutor | None:
        """Stop ``ex`` (its delivery settles, its leases go back; then ``stopped(ex)``), then
        ``start(sorted(new))``; None: ``new`` is empty, or another instance took some meanwhile."""
        held = sorted(ex.owner.intervals) if ex is not None else []
        t0 = time.monotonic()
        if ex is not None:
            ex.stop()
            record_held(self.wiring.authority, self.pipeline.injectors, instance=self.instance, comp=comp,
                        sequencers={})
            if stopped is not None:
                stopped(ex)
        if not new:
            self.progress(f"{comp.name}: instance {self.instance} holds no interval now")
            self._stand_by(comp)
            return None
        try:
            nex = start(sorted(new))
        except LeaseHeldError as exc:  # taken meanwhile by another instance: a later look
            self.progress(f"{comp.name}: intervals {sorted(new)} not all free ({exc}); trying again")
            return None
        took = time.monotonic() - t0
        self.moves.append(MoveTiming(comp.name, tuple(held), tuple(sorted(new)), round(took, 3)))
        self.progress(f"{comp.name}: instance {self.instance} moved from intervals {held} to {sorted(new)} "
                      f"in {took:.1f}s (leases, fence, recovery"
                      f"{', catch-up' if any(r.batch_id == CATCH_UP_BATCH for r in nex.reports) else ''})")
        return nex

    def idle_batch(self, comp: Computation, checkpoint: str, df: Any, batch_id: int) -> None:
        """A micro-batch while this instance holds no interval of ``comp``: its positions are logged, and
        the JVM's snapshot of the rows table kept current for a takeover's claim."""
        shared = self._idle.get(comp.name)
        if shared is None:
            shared = self._idle[comp.name] = shared_positions(
                self.spark, self.layout, comp, {i.name: i for i in self.pipeline.injectors}, checkpoint=checkpoint)
        shared.apply(df, batch_id, ())
        refresh(self.spark, self.layout.rows_of(comp.name))

    def _stand_by(self, comp: Computation) -> None:
        """Holding none of ``comp``'s intervals: warm Delta's commit path in the background (once per
        process), then load the rows table's snapshot, so a takeover's claim is not the JVM's first."""
        def warm() -> None:
            took = warm_commits(self.spark)
            refresh(self.spark, self.layout.rows_of(comp.name))
            if took is not None:
                self.progress(f"{comp.name}: instance {self.instance} warmed Delta's commit path in {took:.1f}s "
                              "(standing by)")

        threading.Thread(target=warm, name=f"deltawheel-warm-{comp.name}", daemon=True).start()

    def _executor(self, comp: Computation, checkpoint: str, intervals: Sequence[int], *, wait_s: float,
                  caps: Mapping[str, int | None]) -> ComputationExecutor:
        """An executor of ``comp`` on ``intervals``, caught up (acting on ``caps``) by :func:`catch_up`."""
        caught: dict[int, int] = {}  # what its estimates record as held: the intervals once caught up on
        ex = self.wiring.stage_executor(self.spark, self.layout, self.pipeline, comp, checkpoint=checkpoint,
                                        instance=self.instance, caught=caught, progress=self.progress,
                                        write_path=self.write_path, intervals=intervals)
        self.progress(f"{comp.name}: instance {self.instance} waiting for leases on intervals {list(intervals)} ...")
        ex.start(wait_s=wait_s)
        self.progress(f"{comp.name}: leases held, sequencers {ex.owner.sequencers}")
        try:
            catch_up(ex, self.spark, self.pipeline.injectors, instance=self.instance, caps=caps, caught=caught,
                     progress=self.progress)
        except BaseException:
            ex.stop()
            raise
        return ex


def catch_up(ex: ComputationExecutor, spark: Any, injectors: Sequence[Injector], *, instance: str,
             caps: Mapping[str, int | None], caught: dict[int, int], progress: Callable[[str], None]) -> None:
    """An instance's started executor catches up on what its query read before and the intervals' earlier
    owners did not process (one batch acting on ``caps``, ``rescale.py``); then the injectors' hold moves to it."""
    comp, owner, shared, authority = ex.comp, ex.owner, ex.shared, ex.authority
    assert shared is not None and authority is not None
    # what this instance held before (a restart's earlier run) stays released until caught up
    record_held(authority, injectors, instance=instance, comp=comp, sequencers={})
    files = shared.missing(owner.intervals)
    if files:
        progress(f"{comp.name}: catching up on {len(files)} input files for intervals taken over")
        ex.next_batch_inputs(BatchInputs(upstream_caps=dict(caps), hold="now"))
        ex.catch_up(shared.files_df(spark, files), CATCH_UP_BATCH, input_files=files)
    # caught up: a gone earlier holder no longer holds the injectors' watermarks back
    authority.record_caught_up(comp.name, owner.sequencers)
    caught.update(owner.sequencers)
    record_held(authority, injectors, instance=instance, comp=comp, sequencers=owner.sequencers)
