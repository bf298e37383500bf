"""The executor as ``batch.py`` and ``watermarks.py`` see it, and what a driver hands it: :class:`BatchInputs`."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Protocol

from deltawheel.statestore.clock import Clock
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.writepath import WritePath
from deltawheel.statestore.zk.watermarks import WatermarkAuthority

from ..computation import Computation
from ..tasks.image.direct import DirectSource
from ..tasks.job import UserJob
from .faults import FaultPoint
from .inflight import InFlight
from .metrics import BatchMetrics
from .reports import BatchReport
from .rescale import SharedInput

__all__ = ["BatchHost", "BatchInputs"]


@dataclass(frozen=True, kw_only=True)
class BatchInputs:
    """What a driver hands the executor for its next batches (``ComputationExecutor.next_batch_inputs``):
    ``upstream_caps`` cap the input watermark; ``hold``: when the low watermark holds at them
    (:attr:`hold_ms`): from the next batch's commit on, at most the previous hold until then (its
    input is read, not committed yet), ``"now"`` (a timers-only batch reads no input), or as it is."""

    # upstream computation -> its low watermark read before the query's snapshot (None: unknown)
    upstream_caps: Mapping[str, int | None] = field(default_factory=dict)
    hold: Literal["kept", "now", "from_commit"] = "kept"
    direct_source: DirectSource | None = None  # the files the image tasks read themselves (``image/direct.py``)

    @property
    def hold_ms(self) -> int | None:
        """The minimum of the caps, 0 if one is unknown; None: no cap (no upstream computation)."""
        return min((0 if c is None else c) for c in self.upstream_caps.values()) if self.upstream_caps else None


class BatchHost(Protocol):
    """An executor as its batches see it."""

    spark: Any
    layout: StoreLayout
    comp: Computation
    owner: IntervalOwner
    authority: WatermarkAuthority | None
    upstream: tuple[str, ...]
    inputs: BatchInputs
    manual_watermarks: bool
    clock: Clock
    faults: Callable[[FaultPoint, int], None] | None
    on_batch_end: Callable[[int | None, int | None], None] | None
    progress: Callable[[str], None] | None
    reports: collections.deque[BatchReport]
    records_in_total: int
    metrics: BatchMetrics | None
    inflight: InFlight
    write_path: str
    path: WritePath[Any]
    job: UserJob[Any]
    shared: SharedInput | None  # the input of instances sharing the intervals; None: not shared
    positions: SharedInput | None  # records each batch's input positions in its commit; None: none

    def settle(self) -> bool:
        """Wait for the last delivery in flight and publish its watermark; whether there was one."""
