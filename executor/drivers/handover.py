"""A running stage's side of a tool's hand-over request (``statestore/zk/handover.py``): it gives its
intervals back at its next batch boundary. While SUSPENDED no watch fires and it keeps what it holds."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from deltawheel.statestore.zk.handover import handover_path, read_handover
from kazoo.recipe.watchers import DataWatch

from ..protocol.executor import ComputationExecutor

__all__ = ["HandoverWatch", "hand_over"]


class HandoverWatch:
    """Which of ``computations`` have an open hand-over request; ``wake`` is set on each change."""

    def __init__(self, client: Any, pipeline: str, computations: Sequence[str], *,
                 wake: threading.Event | None = None, stopping: threading.Event | None = None) -> None:
        self.wake = wake or threading.Event()
        self._stopping = stopping or threading.Event()
        self._asked: set[str] = set()
        self._lock = threading.Lock()
        for name in computations:
            DataWatch(client, handover_path(pipeline, name), self._watcher(name))

    def _watcher(self, name: str) -> Callable[..., bool]:
        def changed(data: bytes | None, stat: Any, *_: Any) -> bool:
            with self._lock:
                if stat is None:
                    self._asked.discard(name)
                else:
                    self._asked.add(name)
            self.wake.set()
            return not self._stopping.is_set()  # False: kazoo drops the watch
        return changed

    def asked(self, computation: str) -> bool:
        """Whether a request for ``computation`` is open (as the last watch event said)."""
        with self._lock:
            return computation in self._asked

    def wait(self, timeout_s: float) -> None:
        """Until a request appears or goes (or :attr:`wake` is set otherwise), at most ``timeout_s``."""
        self.wake.wait(timeout_s)
        self.wake.clear()


def hand_over(ex: ComputationExecutor | None, client: Any, pipeline: str, computation: str, *,
              wait: Callable[[float], object], stopping: threading.Event, wait_s: float,
              log: Callable[[str], None], retake: Callable[[], ComputationExecutor | None] | None = None
              ) -> ComputationExecutor | None:
    """Between batches: give the leases a tool asked for back, ``wait(seconds)`` until its request goes,
    retake them (``retake``; None: ``ex`` retakes all within ``wait_s``); returns the executor to go on."""
    if ex is None:
        return None  # an instance holding none of this computation's intervals: nothing to hand over
    asked = read_handover(client, pipeline, computation)
    if asked is None or not set(asked.intervals) & set(ex.owner.intervals):
        return ex
    t0 = time.monotonic()
    log(f"{computation}: handing intervals over to {asked.tool} by {asked.by}")
    ex.stop()  # settles its delivery, then gives every lease back
    t_given = time.monotonic()
    while read_handover(client, pipeline, computation) is not None:
        if stopping.is_set():
            return ex  # the run stops: nothing to take again
        wait(1.0)
    t_back = time.monotonic()
    if retake is None:
        ex.start(wait_s=wait_s)
        now: ComputationExecutor | None = ex
    else:
        now = retake()
    held = list(now.owner.intervals) if now is not None else []
    log(f"{computation}: intervals taken again after {asked.tool} ({time.monotonic() - t0:.1f}s: given back in "
        f"{t_given - t0:.1f}s, the tool held them {t_back - t_given:.1f}s, taken again in "
        f"{time.monotonic() - t_back:.1f}s; holding {held})")
    return now
