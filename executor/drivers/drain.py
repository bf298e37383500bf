"""Draining a continuous run at the end of its input: the bounded runner finishes it (:func:`drain`)."""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Protocol

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout

from .pipeline import Pipeline, RunSummary
from .runner import PipelineRunner
from .wiring import Wiring

__all__ = ["Drainable", "drain", "STOP_WAIT_S"]

#: How long the drain waits for a batch in flight to end: for as long as it takes.
STOP_WAIT_S = 1e9


class Drainable(Protocol):
    """What :func:`drain` reads of a :class:`~.continuous.ContinuousRun`."""

    spark: Any
    layout: StoreLayout
    pipeline: Pipeline
    wiring: Wiring
    zk: ZkConfig | None
    instance: str | None
    wait_s: float
    write_path: str
    direct_read: bool
    progress: Callable[[str], None] | None

    @property
    def stages(self) -> Mapping[str, Any]:
        """Computation name -> its live stage in this process."""

    def stop(self, *, timeout_s: float = ...) -> Any:
        """Stop the live queries after their batch in flight; give the leases back."""


def drain(run: Drainable) -> RunSummary:
    """Stop ``run`` and run its pipeline to the end of its input; returns the drain rounds' summary.
    Raises ConfigError (not started by ``engine.start_pipeline``, sharing its intervals, or running
    only some computations) or a batch's own typed DeltaWheelError."""
    name = run.pipeline.name
    if run.zk is None:
        raise ConfigError(f"drain: the run of {name} was not started by engine.start_pipeline (it has no ZooKeeper "
                          "settings); start it with engine.start_pipeline, or run the pipeline bounded with "
                          "engine.run_pipeline")
    if run.instance is not None:
        raise ConfigError(f"drain: {name} runs as instance {run.instance!r}, sharing its intervals with other "
                          "instances; a drain reads every source to its end in one process: stop the other "
                          "instances, then start the pipeline without an instance name and drain it")
    missing = sorted({c.name for c in run.pipeline.computations} - set(run.stages))
    if missing:
        raise ConfigError(f"drain: {name} runs only {', '.join(sorted(run.stages))} here, not "
                          f"{', '.join(missing)}; a drain runs every stage to the end: stop the other process "
                          "and start the whole pipeline here (no computations=, no --computation)")
    t0 = time.monotonic()
    run.stop(timeout_s=STOP_WAIT_S)
    log = run.progress or (lambda _line: None)
    log(f"{name}: draining: every source read to its end, watermarks to the end of time ...")
    summary = PipelineRunner(run.spark, run.layout, run.pipeline, zk=run.zk, wait_s=run.wait_s, progress=log,
                             write_path=run.write_path, direct_read=run.direct_read, wiring=run.wiring,
                             end_of_input=True).run()
    log(f"{name}: drained in {time.monotonic() - t0:.1f}s: every source read, every timer fired, every "
        "production delivered; leases given back")
    return summary
