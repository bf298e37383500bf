"""The one place the engine's objects are composed: kazoo client, leases, watermark authority,
row store, and per computation an :class:`IntervalOwner` and its :class:`ComputationExecutor`.
Each driver closes what it opened, in its own order."""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.zk.client import connect, digest_acls
from deltawheel.statestore.zk.leases import LeaseManager
from deltawheel.statestore.zk.refusal import DEFAULT_MAX_PAUSE_S
from deltawheel.statestore.zk.watermarks import WatermarkAuthority

from ..computation import Computation
from ..protocol.executor import ComputationExecutor
from ..protocol.hooks import InjectorHook
from ..protocol.rescale import SharedInput, kafka_input, shared_input
from ..protocol.starting import beside
from ..sources.injector import Injector
from .inputs import event_bounds
from .pipeline import Pipeline

if TYPE_CHECKING:
    from deltawheel.migrations import PlannedMigration

__all__ = ["positions_recorder", "shared_positions", "Wiring", "wire", "open_client", "open_client_planned",
           "migrate_store", "record_held"]


@dataclass(frozen=True)
class Wiring:
    """The ZooKeeper client and the objects on it that a driver's executors run on."""

    client: Any
    leases: LeaseManager
    authority: WatermarkAuthority
    store: RowStore
    acls: Any = None  # the ACLs of the znodes a driver creates itself (a job instance's member znode)

    def owner(self, computation: Computation) -> IntervalOwner:
        """The interval owner of ``computation`` (its leases on this wiring's pipeline)."""
        return IntervalOwner(self.store, self.leases, computation.name, num_intervals=type(computation).num_intervals)

    def executor(self, spark: Any, layout: StoreLayout, computation: Computation, *,
                 owner: IntervalOwner | None = None, **options: Any) -> ComputationExecutor:
        """An executor of ``computation`` (not started) on ``owner`` (default: a new :meth:`owner`)."""
        return ComputationExecutor(spark, layout, computation, owner=self.owner(computation) if owner is None else owner,
                                   authority=self.authority, **options)

    def stage_executor(self, spark: Any, layout: StoreLayout, pipeline: Pipeline, computation: Computation, *,
                       checkpoint: str, instance: str | None = None, caught: Mapping[int, int] | None = None,
                       **options: Any) -> ComputationExecutor:
        """A stage's executor (not started) on its query's ``checkpoint``: injectors' watermarks published
        after each batch, input positions recorded in each commit. ``instance``: sharing the intervals, it
        publishes its own estimates, holding the intervals in ``caught`` (those caught up on)."""
        injectors = {i.name: i for i in pipeline.injectors}
        feeding = [injectors[s] for s in computation.inputs if s in injectors]
        held = None if instance is None else lambda: {computation.name: dict(caught or {})}
        hook = InjectorHook(self.authority, feeding, checkpoint=checkpoint, instance=instance,
                            held=held) if feeding else None
        if instance is None:  # each commit records its batch's input files (replay); inputs without files: none
            options["positions"] = positions_recorder(computation, injectors, layout=layout, checkpoint=checkpoint,
                                                      spark=spark)
        else:  # instances share the intervals: positions per input file
            options["shared"] = shared_positions(spark, layout, computation, injectors, checkpoint=checkpoint)
        return self.executor(spark, layout, computation, upstream=pipeline.upstream(computation), on_batch_end=hook,
                             event_ahead_ms=event_bounds(computation, injectors), **options)


def wire(spark: Any, layout: StoreLayout, client: Any, *, pipeline: str, owner: str, zk: ZkConfig,
         max_pause_s: float | None = DEFAULT_MAX_PAUSE_S, instance: str | None = None) -> Wiring:
    """The leases, the watermark authority and the row store of ``pipeline`` on ``client``; ``zk``
    gives the znodes' ACLs; ``max_pause_s`` and ``instance`` as :func:`~.engine.connect`'s."""
    acls = digest_acls(zk)
    # each checks ZooKeeper's layout znodes (round trips of their own): both at once
    making = beside(lambda: WatermarkAuthority(client, pipeline=pipeline, acls=acls, max_pause_s=max_pause_s),
                    name="authority")
    try:
        leases = LeaseManager(client, pipeline=pipeline, owner=owner, acls=acls, max_pause_s=max_pause_s,
                              instance=instance)
    except BaseException:
        concurrent.futures.wait([making])
        if making.exception() is None:
            making.result().close()
        raise
    try:
        authority = making.result()
    except BaseException:
        leases.close()
        raise
    return Wiring(client, leases, authority, RowStore(spark, layout, writer=owner), acls)


def open_client(spark: Any, layout: StoreLayout, zk: ZkConfig) -> tuple[Any, Callable[[], None]]:
    """A started kazoo client of ``zk`` arbitrating an object store's commits, and the release to call after."""
    release = _arbitrate_commits(spark, layout, zk)
    try:
        return connect(zk), release
    except BaseException:
        release()
        raise


def _arbitrate_commits(spark: Any, layout: StoreLayout, zk: ZkConfig) -> Callable[[], None]:
    """``zk`` arbitrates an object store's commits until the release returned; ConfigError: other settings."""
    if layout.is_local:
        return lambda: None
    from deltawheel.statestore.objectstore.logstore import hold_log_store

    return hold_log_store(spark, zk.hosts, chroot=zk.chroot, digest=zk.digest)


def open_client_planned(spark: Any, layout: StoreLayout,
                        zk: ZkConfig) -> tuple[Any, list[PlannedMigration], Callable[[], None]]:
    """:func:`open_client`, with the store's migrations planned meanwhile (for :func:`migrate_store`);
    raises what connecting raises, else what planning raises (the client closed)."""
    import deltawheel.migrations as migrations

    release = _arbitrate_commits(spark, layout, zk)  # before the plan reads the store
    try:
        planning = beside(lambda: migrations.plan(spark, layout), name="plan-migrations")
        try:
            client = connect(zk)
        finally:
            concurrent.futures.wait([planning])  # its own failure is not the cause when connecting failed
        try:
            return client, planning.result(), release
        except BaseException:
            client.stop()
            client.close()
            raise
    except BaseException:
        release()
        raise


def migrate_store(spark: Any, layout: StoreLayout, client: Any, *, pipeline: str, owner: str,
                  planned: list[PlannedMigration] | None = None) -> None:
    """Create or migrate the store, one process at a time; ``planned``: :func:`open_client_planned`'s."""
    import deltawheel.migrations as migrations
    from deltawheel.migrations.live import refuse_while_running

    def check(pending: list[migrations.PlannedMigration]) -> None:  # not under a running pipeline of the store
        table_id = migrations.rows_table_id(spark, layout) if pending else None
        if table_id is not None:
            refuse_while_running(client, layout, rows_table_id=table_id, pending=pending)

    migrations.apply_when_pending(spark, layout, lambda: client.Lock(f"/locks/migrate/{pipeline}", owner), check=check,
                                  planned=planned)


def record_held(authority: WatermarkAuthority, injectors: Sequence[Injector], *, instance: str, comp: Computation,
                sequencers: Mapping[int, int]) -> None:
    """Record, beside ``instance``'s estimate of each injector feeding ``comp``, the intervals it holds now
    (interval -> sequencer; ``{}``: none): those it let go hold the watermark back until caught up on."""
    for inj in injectors:
        if inj.name in comp.inputs:
            authority.record_held(inj.name, instance, {comp.name: dict(sequencers)})


def positions_recorder(computation: Computation, injectors: Mapping[str, Injector], *, layout: StoreLayout,
                       checkpoint: str, spark: Any = None) -> SharedInput | None:
    """The executor's ``positions``, recording each commit's input positions (docs/replay.md); None for
    inputs without positions or a checkpoint the readers cannot reach."""
    from deltawheel.statestore.delta.storefs import files_resolver, supports
    from deltawheel.statestore.exceptions import ConfigError

    remote = "://" in checkpoint and not checkpoint.startswith("file:")
    if remote and (spark is None or not supports(checkpoint)):
        return None
    got: SharedInput | None
    try:
        got = shared_input(computation, injectors, table_of=layout.stream, checkpoint=checkpoint)
    except ConfigError:
        got = kafka_input(computation, injectors, checkpoint=checkpoint, table_of=layout.stream)
    if got is not None and remote:
        got.files_of = files_resolver(spark)
    return got


def shared_positions(spark: Any, layout: StoreLayout, comp: Computation, injectors: Mapping[str, Injector], *,
                     checkpoint: str) -> SharedInput:
    """The input positions of an instance sharing ``comp``'s intervals (``protocol/rescale.py``)."""
    from deltawheel.statestore.delta.storefs import files_resolver

    return shared_input(comp, injectors, table_of=layout.stream, checkpoint=checkpoint,
                        files_of=None if layout.is_local else files_resolver(spark))
