"""Deliveries still running after their batch committed (a weak straggler or an asynchronous delivery):
at most one per computation; it holds the low watermark and is settled before the next commit."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from ..computation import Computation
from .faults import BatchFailedError, FaultPoint

__all__ = ["InFlight", "OpenDelivery"]


@dataclass(kw_only=True)
class OpenDelivery:
    """A delivery still running after its batch committed."""

    batch_id: int
    thread: threading.Thread
    box: dict[str, BaseException] = field(default_factory=dict)  # "error": the delivery failed
    redeliver: Callable[[], object] | None = None  # strong delivery from the checkpoint
    min_ts: int | None = None  # the productions' oldest timestamp: holds the low watermark
    kind: str = "straggling"
    delivered: bool = False  # the delivery succeeded: the hold is released


class InFlight:
    """The open delivery of one computation's executor; ``published``: called when one landed."""

    def __init__(self, comp: Computation, *, fault: Callable[[FaultPoint, int], None], log: Callable[[str], None],
                 published: Callable[[], object] | None, on_thread: Callable[[], object] = lambda: None) -> None:
        self.comp, self.computation = comp, comp.name
        self._fault, self._log, self._published = fault, log, published
        self._on_thread = on_thread  # first in each delivery thread (its JVM thread's active session)
        self.open: OpenDelivery | None = None

    def held_ts(self) -> int | None:
        """The timestamp the open, undelivered productions hold the low watermark at (None: no hold)."""
        st = self.open
        return st.min_ts if st is not None and not st.delivered else None

    def weak(self, deliver: Callable[[], object], batch_id: int) -> OpenDelivery | None:
        """Run a weak delivery in a thread up to ``straggler_timeout_s``; None if done, else the straggler."""
        box: dict[str, BaseException] = {}

        def run() -> None:
            try:
                self._on_thread()
                self._fault(FaultPoint.IN_WEAK_DELIVERY, batch_id)
                deliver()
            except BaseException as exc:
                box["error"] = exc

        name = f"deltawheel-weak-{self.computation}-{batch_id}"
        thread = threading.Thread(target=run, name=name, daemon=True)
        st = OpenDelivery(batch_id=batch_id, thread=thread, box=box)
        st.thread.start()
        st.thread.join(max(0.0, float(self.comp.straggler_timeout_s)))
        if st.thread.is_alive():
            self._log(f"{self.computation} batch {batch_id}: weak delivery still running after "
                      f"{self.comp.straggler_timeout_s}s: checkpointing the productions (straggler)")
            return st
        if "error" in st.box:
            raise st.box["error"]
        return None

    def adopt(self, st: OpenDelivery, *, redeliver: Callable[[], object], min_ts: int | None) -> None:
        """A straggler whose productions the batch has now committed as checkpoints."""
        st.redeliver, st.min_ts = redeliver, min_ts
        self.open = st

    def start(self, deliver: Callable[[], object], batch_id: int, min_ts: int | None) -> None:
        """Deliver committed productions in a thread; the next batch settles it before its commit."""
        box: dict[str, BaseException] = {}

        def run() -> None:
            try:
                self._on_thread()
                deliver()
            except BaseException as exc:
                box["error"] = exc
                return
            try:
                self._fault(FaultPoint.AFTER_DELIVERY, batch_id)
            except BaseException as exc:
                box["crash"] = exc
                return
            st.delivered = True
            if self._published is not None:
                try:
                    self._published()
                except BaseException as exc:
                    self._log(f"{self.computation}: publishing the low watermark after batch {batch_id}'s "
                              f"delivery failed ({type(exc).__name__}: {exc}); the next batch retries")

        name = f"deltawheel-deliver-{self.computation}-{batch_id}"
        thread = threading.Thread(target=run, name=name, daemon=True)
        st = OpenDelivery(batch_id=batch_id, thread=thread, box=box, redeliver=deliver, min_ts=min_ts,
                          kind="asynchronous")
        self.open = st
        st.thread.start()

    def settle(self) -> None:
        """Wait for the open delivery, redelivering a failed one; BatchFailedError after the timeout."""
        st = self.open
        if st is None:
            return
        st.thread.join(max(0.0, float(self.comp.delivery_timeout_s)))
        if st.thread.is_alive():
            raise BatchFailedError(
                f"{self.computation}: the {st.kind} delivery of batch {st.batch_id} is still running after "
                f"delivery_timeout_s={self.comp.delivery_timeout_s}s; its productions are checkpointed in "
                "the committed rows: restart the query (the recovery redelivers them) once the stream "
                "tables are reachable")
        self.open = None
        if "crash" in st.box:  # an injected crash after the delivery: the process "dies" here
            raise st.box["crash"]
        if "error" in st.box:
            self._log(f"{self.computation}: the {st.kind} delivery of batch {st.batch_id} failed "
                      f"({type(st.box['error']).__name__}: {st.box['error']}); delivering from the checkpoint")
            assert st.redeliver is not None
            self.open = st  # still undelivered (watermark held) until the redelivery succeeds
            st.redeliver()
            self.open = None
