"""The view of :class:`~.executor.ComputationExecutor` that ``batch.py`` and ``watermarks.py`` import."""

from __future__ import annotations

import collections
from typing import Any, Callable, Protocol

from deltawheel.statestore.clock import Clock
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.writepath import WritePath
from deltawheel.statestore.zk.watermarks import WatermarkAuthority

from ..computation import Computation
from ..tasks.job import UserJob
from .faults import FaultPoint
from .inflight import InFlight
from .metrics import BatchMetrics
from .reports import BatchReport
from .rescale import SharedInput

__all__ = ["BatchHost"]


class BatchHost(Protocol):
    """An executor as its batches see it."""

    spark: Any
    layout: StoreLayout
    comp: Computation
    owner: IntervalOwner
    authority: WatermarkAuthority | None
    upstream: tuple[str, ...]
    upstream_caps: dict[str, int | None]
    input_hold_ms: int | None
    next_input_hold: tuple[int | None] | None
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

    @property
    def shared(self) -> SharedInput | None:
        """The input of instances sharing the intervals; None: not shared."""

    @property
    def positions(self) -> SharedInput | None:
        """Records each batch's input positions in its commit; None: none recorded."""

    def settle(self) -> bool:
        """Wait for the last delivery in flight and publish its watermark; whether there was one."""
