"""One batch's state through the protocol's steps, its status, and the stale-view retry."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, SupportsInt, TypeVar

from deltawheel.statestore.writepath import StaleViewError

from ..tasks.job import Prepared
from .faults import BatchFailedError
from .inflight import OpenDelivery
from .lateness import ActedMark

__all__ = ["BatchState", "BatchStatus", "retry_stale_view"]

T = TypeVar("T")


def retry_stale_view(attempt: Callable[[], T], *, reload: Callable[[], object], attempts: int, failed: str) -> T:
    """``attempt()``, again while the view of the rows is stale; BatchFailedError after ``attempts``."""
    for _ in range(attempts):
        try:
            return attempt()
        except StaleViewError:
            reload()
    raise BatchFailedError(failed)


class BatchStatus(enum.Enum):
    """Where a batch is: started -> prepared -> committed -> delivered, and any of them -> failed."""

    STARTED = "started"
    PREPARED = "prepared"  # step 2 done: the input prepared, dead letters recorded
    COMMITTED = "committed"  # step 5 done: the fenced commit returned
    DELIVERED = "delivered"  # step 6 done (or handed to the background delivery)
    FAILED = "failed"


_NEXT = {BatchStatus.STARTED: BatchStatus.PREPARED, BatchStatus.PREPARED: BatchStatus.COMMITTED,
         BatchStatus.COMMITTED: BatchStatus.DELIVERED}


@dataclass(eq=False, kw_only=True)
class BatchState:
    """One batch as :meth:`BatchProtocol.run` goes through its steps (``wm_late``: its lateness watermark)."""

    batch_id: int
    df: Any | None
    started: float  # time.monotonic() at the batch's start
    now: int  # the batch's processing time (ms, the executor's clock)
    wm_in: int | None
    wm_late: int | None
    late_raised: Mapping[int, int] = field(default_factory=dict)  # intervals judged against a higher line
    acted: ActedMark
    horizon: int | None
    commit_id: str
    strong: bool
    skipped: SupportsInt = 0  # records an earlier owner processed (``rescale.SkipCount``: counted by the batch's job)
    files: tuple[str, ...] = ()
    prepared: Prepared | None = None  # step 2's
    straggler: OpenDelivery | None = None  # the weak delivery that outlived straggler_timeout_s
    late_routed: int = 0  # late records routed to late_data (not in the tasks' ``late``)
    injectors: dict[str, tuple[int, int]] = field(default_factory=dict)  # the estimates step 7 publishes
    commit_s: float = 0.0
    steps_s: list[tuple[str, float]] = field(default_factory=list)  # seconds per step, in order
    status: BatchStatus = BatchStatus.STARTED
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self._last = self.started

    def advance(self, to: BatchStatus) -> None:
        """Move to ``to``: the next status, or FAILED; any other move raises RuntimeError."""
        failing = to is BatchStatus.FAILED and self.status is not BatchStatus.FAILED
        if not failing and _NEXT.get(self.status) is not to:
            raise RuntimeError(f"batch {self.batch_id}: {to.value} after {self.status.value}: the protocol's "
                               "steps ran out of order")
        self.status = to

    def mark(self, step: str) -> None:
        """Record the seconds since the last mark as ``step``'s (the report's ``steps_s``)."""
        t = time.monotonic()
        self.steps_s.append((step, round(t - self._last, 3)))
        self._last = t
