"""One stage of a continuous run: a computation's live query, what its batches and ticks share, its tick."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Protocol

from deltawheel.statestore.delta.log import latest_local_version, local_path
from deltawheel.statestore.layout import StoreLayout

from ..computation import Computation
from ..protocol.executor import ComputationExecutor
from ..protocol.host import BatchInputs
from ..tasks.image.direct import DirectSource
from .pipeline import Pipeline
from .querystart import delta_end_version
from .triggers import Trigger

__all__ = ["Stage", "FusedInput"]


class FusedInput(Protocol):
    """A fused stage's input and position, as its tick reads it (``fused.FusedFeed``)."""

    def consumed(self, version: int) -> bool:
        """Whether every version up to ``version`` of its input table was read by a finished batch."""


@dataclass(eq=False, kw_only=True)
class Stage:
    """One computation's live query and what its batches and ticks share."""

    comp: Computation
    ex: ComputationExecutor | None  # None: an instance sharing the intervals holds none of this computation now
    checkpoint: str
    trigger: Trigger
    lock: threading.Lock = field(default_factory=threading.Lock)  # a batch or a tick, never both
    query: Any = None
    replay_id: int | None = None  # a batch id the checkpoint planned before this start (-1: unknown)
    direct: DirectSource | None = None  # the input files the tasks read themselves (``inputs.direct_source``)
    next_caps: dict[str, int | None] = field(default_factory=dict)  # read before the next batch's snapshot
    acted_caps: dict[str, int | None] = field(default_factory=dict)  # the last batch or tick acted with
    failed: list[BaseException] = field(default_factory=list)
    records_in: int = 0
    batches: int = 0
    done_batch: int = -1  # the last micro-batch this run's function returned from
    restarts: int = 0  # how often it was started again in this driver since its last committed batch
    restarting: bool = False  # a thread stops it and starts it again (``ContinuousRun._restart``)
    fused: FusedInput | None = None  # run in its upstream's batches, with no query (``fused.py``)

    def inputs(self, caps: Mapping[str, int | None], hold: Literal["kept", "now", "from_commit"] = "kept"
               ) -> BatchInputs:
        """What its executor's next batches act on: ``caps``, held at as ``hold`` says."""
        return BatchInputs(upstream_caps=caps, hold=hold, direct_source=self.direct)

    def tick(self, authority: Any, pipeline: Pipeline, *, layout: StoreLayout,
             files: Callable[[str], Any]) -> None:
        """Between batches: a timers-only batch if something became due (an upstream's watermark acted on
        once the query read every version of its stream tables)."""
        ex = self.ex
        if ex is None or self.replay_id is not None:  # a batch Spark replays decides first, as its first
            return  # attempt did (``lateness.py``)
        caps: dict[str, int | None] = {}
        for kind, _, name in (u.partition(":") for u in ex.upstream):
            if kind != "computation":
                continue
            wm = authority.advance_low_watermark(name)  # first: then every row before it is in a version read below
            outputs = next((tuple(c.outputs) for c in pipeline.computations if c.name == name), ())
            streams = [s for s in self.comp.inputs if s in outputs]
            caps[name] = wm if all(self._consumed(layout.stream(s), files) for s in streams) \
                else self.acted_caps.get(name)
        ex.next_batch_inputs(self.inputs(caps))
        try:
            wm_in = ex.input_watermark()
            now = ex.clock.now_ms()
            nexts = ex.path.next_processing()
            processing_due = nexts is not None and any(t is not None and t <= now for t in nexts.values())
            last = ex.reports[-1].input_watermark_ms if ex.reports else None
            if not processing_due and (wm_in is None or wm_in == last):
                return
            ex.next_batch_inputs(self.inputs(caps, "now"))  # a timers-only batch reads no input
            ex.flush()
            self.acted_caps = caps
        finally:
            ex.next_batch_inputs(self.inputs(self.next_caps))

    def _consumed(self, path: str, files: Callable[[str], Any]) -> bool:
        """Whether the query's last progress shows it read every version the table at ``path`` has now."""
        version = latest_local_version(files(path) or path)  # a local folder or the object store
        if version is None:
            return False  # unreadable: not known
        if version == 0:
            return True
        if self.fused is not None:
            return self.fused.consumed(version)
        end = delta_end_version(self.query, local_path(path) or path)
        return end is not None and end > version

