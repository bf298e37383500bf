"""Embedding in one call: :func:`connect` and the :class:`Engine` it returns (docs/embedding.md).
On a lost ZooKeeper session :meth:`Engine.close` still stops everything it started."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import socket
from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.delta.jvm import require_classic_session
from deltawheel.statestore.exceptions import ConfigError, DeltaWheelError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.session.sparkenv import check_session
from deltawheel.statestore.zk.refusal import DEFAULT_MAX_PAUSE_S

from deltawheel.servers.embedded import ensure_zookeeper

from ..computation import RECORD_KEY, Computation
from ..protocol.executor import ComputationExecutor
from ..protocol.hooks import InjectorHook
from ..protocol.host import BatchInputs
from ..protocol.reports import BatchReport
from ..sources.injector import Injector, publish_watermark
from .continuous import ContinuousRun
from .inputs import StageInput, event_bounds, query_of, with_offset_log
from .pipeline import Pipeline, RunSummary
from .runner import PipelineRunner
from .triggers import Trigger
from .wiring import migrate_store, open_client, wire

__all__ = ["connect", "Engine"]

Upstream = Injector | str
Progress = bool | Callable[[str], None] | None  # True: print the lines; False / None: none; a callable: each line


def _lines(progress: Progress) -> Callable[[str], None] | None:
    return functools.partial(print, flush=True) if progress is True else progress or None


def _listed(upstream: Upstream | Sequence[Upstream]) -> list[Upstream]:
    return [upstream] if isinstance(upstream, (str, Injector)) else list(upstream)


def connect(spark: Any, *, store: str, zk: str | None = None, pipeline: str = "default", owner: str | None = None,
            zk_chroot: str = "/deltawheel", zk_digest: str | None = None, wait_s: float = 60.0,
            max_pause_s: float | None = DEFAULT_MAX_PAUSE_S, instance: str | None = None,
            zk_session_timeout_s: float | None = None) -> Engine:
    """Check ``spark``, reach ZooKeeper, migrate ``store`` (a folder or URI); returns the :class:`Engine` to
    close. ``zk`` None: a local store's embedded server; ``pipeline``: the name leases and watermarks live
    under; ``owner``: the name on its leases (default ``host:pid``); ``instance``: this job's name across
    restarts (a restart takes its predecessor's leases at once); ``wait_s``: how long an executor's start
    waits for leases held elsewhere; ``max_pause_s``: how long a batch pauses while ZooKeeper does not
    serve (None: while the session lives). Raises SparkConnectSessionError, SessionConfigError, ConfigError
    (``zk`` None for a store not in a local folder), ZooKeeperServerError (the embedded server did not
    start), MigrationError, SchemaTooNewError or StoreMismatchError (from the store's migrations)."""
    require_classic_session(spark)
    layout = StoreLayout(os.path.abspath(store) if "://" not in store else store)
    if zk is None and not layout.is_local:
        raise ConfigError(f"store {store} is not a local folder, so there is no embedded ZooKeeper for it: pass "
                          "zk='host:port[,host:port]' (the ZooKeeper every process of this pipeline uses)")
    check_session(spark, layout.root)
    cfg = ZkConfig(hosts=zk, chroot=zk_chroot, digest=zk_digest) if zk is not None else \
        ZkConfig(chroot=zk_chroot, digest=zk_digest)
    if zk_session_timeout_s is not None:
        cfg = dataclasses.replace(cfg, session_timeout_s=zk_session_timeout_s)
    server = ensure_zookeeper(cfg, layout, own=True) if zk is None else None
    if server is not None:
        cfg = server.config
    with contextlib.ExitStack() as undo:  # on a failure: undone in reverse
        if server is not None:
            undo.callback(server.release)
        client, release = open_client(spark, layout, cfg)
        for step in (release, client.close, client.stop):
            undo.callback(step)
        engine = Engine(spark, layout, cfg, client, pipeline=pipeline, owner=owner or f"{socket.gethostname()}:{os.getpid()}",
                        wait_s=wait_s, max_pause_s=max_pause_s, server=server, instance=instance)
        undo.pop_all()
    engine.release_log_store = release
    try:
        engine.migrate()
    except BaseException:
        engine.close()
        raise
    return engine


class Engine:
    """A store, its pipeline's ZooKeeper objects and the executors started on them (:func:`connect`).
    :attr:`progress`: True prints the executors' lines, a callable gets each line."""

    progress: Progress = True

    def __init__(self, spark: Any, layout: StoreLayout, zk: ZkConfig, client: Any, *, pipeline: str, owner: str,
                 wait_s: float = 60.0, max_pause_s: float | None = DEFAULT_MAX_PAUSE_S,
                 server: Any | None = None, instance: str | None = None) -> None:
        self.spark, self.layout, self.zk, self.client = spark, layout, zk, client
        self.pipeline, self.owner, self.wait_s = pipeline, owner, wait_s
        self.server = server  # the embedded ZooKeeper connect() started, if any
        self.wiring = wire(spark, layout, client, pipeline=pipeline, owner=owner, zk=zk, max_pause_s=max_pause_s,
                           instance=instance)
        self.leases, self.authority, self.store = self.wiring.leases, self.wiring.authority, self.wiring.store
        self.executors: list[ComputationExecutor] = []
        self._feeding: dict[int, list[Injector]] = {}  # id(executor) -> the injectors whose watermark it moves
        self._queries: list[tuple[Any, ComputationExecutor, list[DeltaWheelError]]] = []
        self._runs: list[ContinuousRun] = []  # start_pipeline's, stopped by close()
        self.release_log_store: Callable[[], None] = lambda: None  # connect()'s hold of the object-store log store
        self._closed = False

    def migrate(self) -> None:
        """Create the store or run its pending migrations (one process at a time per pipeline)."""
        migrate_store(self.spark, self.layout, self.client, pipeline=self.pipeline, owner=self.owner)

    def executor(self, computation: Computation, *, upstream: Upstream | Sequence[Upstream] = (),
                 checkpoint: str | None = None, wait_s: float | None = None, **options: Any) -> ComputationExecutor:
        """A started executor of ``computation`` for ``writeStream.foreachBatch``; ``upstream``: injectors
        and/or ``"injector:NAME"``. ConfigError (event-time timers without a watermark source, bad
        options), LeaseHeldError after ``wait_s``."""
        self._check_open()
        items = _listed(upstream)
        feeding = [u for u in items if not isinstance(u, str)]
        names = sorted({u if isinstance(u, str) else f"injector:{u.name}" for u in items})
        hook = InjectorHook(self.authority, feeding, checkpoint=checkpoint) if feeding else None
        options["progress"] = _lines(options.get("progress", self.progress))
        if "event_ahead_ms" not in options and any(inj.name in computation.inputs for inj in feeding):
            options["event_ahead_ms"] = event_bounds(computation, {inj.name: inj for inj in feeding})
        ex = self.wiring.executor(self.spark, self.layout, computation, upstream=names, on_batch_end=hook, **options)
        ex.start(wait_s=self.wait_s if wait_s is None else wait_s)
        self.executors.append(ex)
        self._feeding[id(ex)] = feeding
        return ex

    def start(self, source: Any, computation: Computation, *, checkpoint: str | None = None,
              available_now: bool = False, upstream: Upstream | Sequence[Upstream] = (),
              trigger: str | float | Trigger | None = None, **options: Any) -> Any:
        """Start a streaming query of ``source`` (an injector or a stream-table DataFrame); ``available_now``:
        read what is there and stop. ConfigError for a bad ``trigger`` or one with ``available_now``."""
        when = Trigger.parse(trigger)
        if available_now and when.interval_ms is not None:
            raise ConfigError(f"start: trigger={trigger!r} and available_now=True: an availableNow query reads what "
                              "is there now and stops; give one or the other")
        default, name = query_of(self.layout, self.pipeline, computation.name)
        chk = checkpoint or default
        ups = _listed(upstream)
        df, ups = (source.stream_df(self.spark), [source, *ups]) if isinstance(source, Injector) else (source, ups)
        ex = self.executor(computation, upstream=ups, checkpoint=chk, **options)
        direct = getattr(source, "direct_source", None)  # the tasks read an injector's files or ranges themselves
        if callable(direct) and list(computation.inputs.values()) == [RECORD_KEY]:
            ex.next_batch_inputs(BatchInputs(direct_source=with_offset_log(direct(), chk)))
        failed: list[DeltaWheelError] = []

        def batch(frame: Any, batch_id: int) -> None:
            try:
                ex(frame, batch_id)
            except DeltaWheelError as exc:
                failed.append(exc)
                raise

        writer = StageInput(df, ()).writer(batch, checkpoint=chk, name=name)
        writer = writer.trigger(availableNow=True) if available_now else when.apply(writer)
        query = writer.start()
        self._queries.append((query, ex, failed))  # failed: the batches' typed errors, for run()
        return query

    def run(self, source: Any, computation: Computation, *, checkpoint: str | None = None,
            upstream: Upstream | Sequence[Upstream] = (), **options: Any) -> list[BatchReport]:
        """Run ``computation`` over all ``source`` holds now; the reports, or a batch's own typed error."""
        self.start(source, computation, checkpoint=checkpoint, available_now=True, upstream=upstream, **options)
        query, ex, failed = self._queries[-1]
        try:
            query.awaitTermination()
        except Exception as exc:
            if failed:
                raise failed[-1] from exc
            raise
        self.finish(ex)
        self._stop(ex)
        return list(ex.reports)

    def run_pipeline(self, pipeline: Pipeline, *, wait_s: float | None = None, continuous: bool = False,
                     trigger: str | float | Trigger | None = None, triggers: Mapping[str, Any] | None = None,
                     seconds: float | None = None, **options: Any) -> RunSummary:
        """Run ``pipeline`` over everything its injectors hold now, stage after stage; returns the summary.
        ``continuous=True``: run it unbounded (:meth:`start_pipeline`) until stopped or ``seconds``.
        Raises ConfigError (another pipeline name, an option the engine sets, a stream nothing
        produces, a cycle) or a batch's own typed DeltaWheelError."""
        self._check_open()
        if continuous:
            run = self.start_pipeline(pipeline, trigger=trigger, triggers=triggers, wait_s=wait_s, **options)
            run.run_until_stopped(seconds=seconds)
            return run.summary()
        if trigger is not None or triggers is not None or seconds is not None:
            raise ConfigError("run_pipeline: trigger, triggers and seconds are for continuous=True (a bounded run "
                              "reads what is there now with availableNow queries)")
        lines = self._prepare(pipeline, options)
        return PipelineRunner(self.spark, self.layout, pipeline, zk=self.zk, owner=self.owner,
                              wait_s=self.wait_s if wait_s is None else wait_s,
                              progress=lines if lines is not None else (lambda _line: None),
                              wiring=self.wiring, **options).run()

    def start_pipeline(self, pipeline: Pipeline, *, trigger: str | float | Trigger | None = None,
                       triggers: Mapping[str, Any] | None = None, computations: Sequence[str] | None = None,
                       wait_s: float | None = None, **options: Any) -> ContinuousRun:
        """Start ``pipeline`` unbounded; returns the :class:`.ContinuousRun` (docs/continuous.md).
        Raises ConfigError as :meth:`run_pipeline`, for a bad trigger, an unknown computation name,
        or an ``instance`` other than :func:`connect`'s."""
        lines = self._prepare(pipeline, options)
        named = self.wiring.leases.instance
        options["instance"] = instance = options.get("instance", named)
        if named is not None and instance != named:
            raise ConfigError(f"start_pipeline: instance {instance!r} on an engine connected as instance {named!r}: "
                              f"an instance's leases carry its name; connect with deltawheel.connect(..., "
                              f"instance={instance!r}) or leave instance= out")
        run = ContinuousRun(self.spark, self.layout, pipeline, wiring=self.wiring, trigger=trigger,
                            triggers=triggers, computations=computations,
                            wait_s=self.wait_s if wait_s is None else wait_s, progress=lines, zk=self.zk, **options)
        run.start()
        self._runs.append(run)
        return run

    def _prepare(self, pipeline: Pipeline, options: dict[str, Any]) -> Callable[[str], None] | None:
        """Check ``pipeline`` and ``options`` (ConfigError), turn ``gc_every`` into ``background_gc``, start
        the Prometheus endpoint of ``metrics_port``; returns the progress lines' callable (popped)."""
        self._check_open()
        if pipeline.name != self.pipeline:
            raise ConfigError(f"pipeline {pipeline.name!r} given to an engine connected for pipeline {self.pipeline!r}: "
                              f"its leases and watermarks live under the engine's; connect with "
                              f"deltawheel.connect(..., pipeline={pipeline.name!r}) or name the Pipeline "
                              f"{self.pipeline!r}")
        fixed = sorted({"zk", "owner", "max_pause_s", "wiring"} & set(options))
        if fixed:
            raise ConfigError(f"run_pipeline: {', '.join(fixed)} {'is' if len(fixed) == 1 else 'are'} the engine's "
                              "(give them to deltawheel.connect)")
        pipeline.ordered()  # a stream nothing produces, or a cycle: refused before anything starts
        every = options.pop("gc_every", None)
        if every is not None:
            if options.get("background_gc") is not None:
                raise ConfigError("gc_every and background_gc both given: give one (gc_every=N builds "
                                  "BackgroundGc.every(spark, layout, N) with gc's defaults)")
            from deltawheel.gc.background import BackgroundGc

            options["background_gc"] = BackgroundGc.every(self.spark, self.layout, every)
        lines = _lines(options.pop("progress", self.progress))
        port = options.pop("metrics_port", None)
        if port is not None:
            from ..protocol.exporter import start_metrics_server

            exporter = start_metrics_server(int(port))
            if lines is not None:
                lines(f"metrics for Prometheus: http://{socket.gethostname()}:{exporter.port}/metrics")
        return lines

    def finish(self, executor: ComputationExecutor) -> BatchReport:
        """End ``executor``'s bounded input: watermarks to the end, due timers fired, delivery landed."""
        for inj in self._feeding.get(id(executor), ()):
            inj.finish()
            publish_watermark(self.authority, inj)
        report = executor.flush()
        executor.settle()
        return report

    def close(self) -> None:
        """Stop everything started, close leases and client; the first failure is raised after."""
        if self._closed:
            return
        self._closed = True
        first: BaseException | None = None
        steps: list[Callable[[], object]] = [run.stop for run in self._runs]  # gracefully: see ContinuousRun.stop
        steps += [q.stop for q, _ex, _failed in self._queries if q.isActive]
        steps += [functools.partial(self._stop, ex) for ex in list(self.executors)]
        steps += [self.authority.close, self.leases.close, self.client.stop, self.client.close, self.release_log_store]
        if self.server is not None:  # the last process using the store's server stops it
            steps.append(self.server.release)
        for step in steps:
            try:
                step()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop(self, ex: ComputationExecutor) -> None:
        if ex in self.executors:
            self.executors.remove(ex)
            ex.stop()

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this engine is closed: call deltawheel.connect(...) again")
