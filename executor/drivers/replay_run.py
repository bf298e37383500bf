"""A replay into a shadow store, open; ``promote`` keeps one open across its hand-over."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, SupportsInt

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import ReplayUnavailableError
from deltawheel.statestore.inspection.positions import ComputationCommit
from deltawheel.statestore.layout import StoreLayout

from ..computation import Computation
from ..protocol.reports import BatchReport
from ..sources.injector import Injector
from .replay_inputs import check_files, replay_input
from .replay_kafka import check_kafka, mixed_df
from .replay_marker import into_files, store_id, write_marker
from .replay_shared import batch_intervals, skip_sets

if TYPE_CHECKING:
    from ..protocol.executor import ComputationExecutor

__all__ = ["ReplayRun", "code_spec_of"]


def code_spec_of(code: Computation) -> str | None:
    """``MODULE:CLASS`` naming ``code``'s class when that imports back to it, else None."""
    import importlib

    cls = type(code)
    try:
        obj: Any = importlib.import_module(cls.__module__)
        for part in cls.__qualname__.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return f"{cls.__module__}:{cls.__qualname__}" if obj is cls else None


class ReplayRun:
    """An open replay of ``code`` from the live ``store`` into ``into``; a context manager."""

    def __init__(self, spark: Any, plan: Any, *, code: Computation, zk: ZkConfig | None,
                 injectors: Sequence[Injector], write_path: str, progress: Callable[[str], None] | None,
                 seed: Callable[[], None], old: Mapping[str, Any] | None = None, source: str | None = None,
                 code_spec: str | None = None) -> None:
        self.spark, self.plan, self.code, self.zk, self.write_path = spark, plan, code, zk, write_path
        self.say, self._lines, self._seed = progress or (lambda line: None), progress, seed
        self.store, self.into = StoreLayout(plan.store), StoreLayout(plan.into)
        self.inputs = replay_input(spark, self.store, self.into, code, injectors)
        self.target = into_files(spark, self.into)
        if code_spec is None:  # an earlier replay's record, else the class if it imports back
            code_spec = old.get("code") if old is not None else code_spec_of(code)
        self.code_spec = code_spec
        self.marker = self._marker(old, source)
        self.engine: Any = None
        # an executor per interval set the live commits ran on: instances sharing the intervals commit
        # in turn, and a start per batch (leases, fence, recovery) made a catch-up slower than the live run
        self._held: dict[tuple[int, ...] | None, ComputationExecutor] = {}

    def _marker(self, old: Mapping[str, Any] | None, source: str | None) -> dict[str, Any]:
        plan, code = self.plan, self.code
        seeded = plan.from_version if plan.from_version is not None else -1
        if old is None or old.get("reached") == seeded:
            ran: list[int] | None = []  # nothing re-run yet
        else:  # an older deltawheel's marker names no commits it ran: left unknown
            ran = None if old.get("ran") is None else [int(v) for v in old["ran"]]
        return {"store": store_id(self.store), "pipeline": plan.pipeline, "computation": plan.computation,
                "from_version": plan.from_version, "reached": plan.resume_after,
                "started_ms": int(time.time() * 1000),
                "code": self.code_spec,  # what promote continues with (None: the source pipeline's class)
                "source": source or (old or {}).get("source"),  # the live pipeline (its injectors), for promote
                "intervals": None if plan.intervals is None else list(plan.intervals),
                "keys": None if plan.keys is None else list(plan.keys),
                # what `deltawheel diff` of the live store against this one needs to compare as the replay does
                "num_intervals": type(code).num_intervals, "outputs": list(code.outputs), "ran": ran}

    def check(self, commits: Sequence[ComputationCommit], batches: Sequence[ComputationCommit]) -> None:
        """Raise InputGoneError for ``batches`` whose input is gone, before anything is written."""
        if self.inputs.kafka:
            check_kafka(self.spark, self.inputs, commits, batches)
        check_files(self.inputs, batches)

    def __enter__(self) -> ReplayRun:
        from .engine import connect

        plan, zk = self.plan, self.zk
        if self.target.is_local:
            os.makedirs(self.into.root, exist_ok=True)
        where: dict[str, Any] = {} if zk is None else {"zk": zk.hosts, "zk_chroot": zk.chroot,
                                                       "zk_digest": zk.digest}
        self.engine = connect(self.spark, store=self.into.root, pipeline=plan.pipeline, **where)
        self.engine.progress = self._lines if self._lines is not None else True  # its executors' lines
        try:
            if plan.resume_after is None:
                if plan.from_version is not None:
                    self.say(f"seeding {self.into.root} with {plan.computation}'s rows as of version {plan.from_version}")
                    self._seed()
                self.marker["reached"] = plan.from_version if plan.from_version is not None else -1
                write_marker(self.target, self.marker)
        except BaseException as exc:
            self.engine.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.engine.__exit__(*exc)

    def run(self, batches: Sequence[ComputationCommit], commits: Sequence[ComputationCommit]) -> list[BatchReport]:
        """Re-run the live commits ``batches`` in order as their live runs did, the marker after each."""
        plan, code, inputs = self.plan, self.code, self.inputs
        reports: list[BatchReport] = []
        n = type(code).num_intervals
        # what each batch's live run skipped (intervals moved between instances): dropped before it runs
        for c, done in zip(batches, skip_sets(commits, batches), strict=True):
            run_on = batch_intervals(c, num_intervals=n, scope=plan.intervals)
            if run_on == ():  # an instance of intervals outside a partial replay's
                self._reached(c.version, ran=False)
                continue
            ex = self._executor(run_on)
            files = tuple(c.files or ())
            if inputs.kafka and c.kafka is None:
                raise ReplayUnavailableError(f"live batch {c.batch_id} (rows version {c.version}) of {plan.computation} "
                                             "records no Kafka offsets: replay from a later version")
            check_files(inputs, (c,))  # gone since the start: refused with the replay's advice, not files_df's
            df = mixed_df(self.spark, inputs, c.kafka, files) if inputs.kafka else \
                inputs.files_df(self.spark, files) if files else None
            skipped: SupportsInt = 0
            if df is not None and done is not None:
                inputs.done = done  # the live SharedInput.apply, without its checkpoint log
                df, skipped = inputs.skip_frame(df, files, range(n) if run_on is None else run_on)
            reports.append(ex.run_batch(df, int(c.batch_id if c.batch_id is not None else -2),
                                        input_watermark_ms=c.input_ms, use_authority=False, input_files=files,
                                        late_watermark_ms=c.late_ms, late_raised=c.late_raised))
            ex.settle()
            self._reached(c.version, ran=True)
            self.say(f"batch {c.batch_id} (live version {c.version}): {reports[-1].records_in} records"
                     + (f" ({int(skipped)} skipped as live: run before for their intervals)" if int(skipped) else ""))
        return reports

    def _executor(self, run_on: tuple[int, ...] | None) -> ComputationExecutor:
        """The executor holding ``run_on`` (None: every interval of the replay), started if needed; one
        holding any of those intervals otherwise is stopped first (its delivery settled, its leases back)."""
        if (ex := self._held.get(run_on)) is not None:
            return ex
        every = set(range(type(self.code).num_intervals))
        want = every if run_on is None else set(run_on)
        for on, other in list(self._held.items()):
            if want & (every if on is None else set(on)):
                other.stop()
                self.engine.executors.remove(other)
                del self._held[on]
        made: ComputationExecutor = self.engine.executor(self.code, write_path=self.write_path, intervals=run_on,
                                                         manual_watermarks=True, positions=self.inputs)
        self._held[run_on] = made
        return made

    def _reached(self, version: int, *, ran: bool) -> None:
        self.marker["reached"] = version
        if ran and self.marker.get("ran") is not None:
            self.marker["ran"].append(version)
        write_marker(self.target, self.marker)

    def finish(self, to_version: int) -> None:
        """The replay reached live version ``to_version`` (the shadow store is started even with no batch)."""
        if not self._held:
            self._executor(self.plan.intervals)
        self.marker["reached"] = max(to_version, int(self.marker.get("reached") or -1))
        write_marker(self.target, self.marker)
