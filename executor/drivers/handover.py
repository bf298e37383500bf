"""A running stage's side of a tool's hand-over request (``statestore/zk/handover.py``: repair,
promote, upgrade-state, gc's input-set pruning).

:class:`HandoverWatch` watches the request znode of each computation a run runs (kazoo data
watches): a request that appears wakes the run at once, so the stage gives its intervals back at
its next batch boundary (the end of the batch in flight, or at once when none runs) instead of at
the next tick that finds the stage idle; one that goes wakes the stage waiting to take them again.

ZooKeeper connection states: while the run's connection is SUSPENDED no watch fires, and the
stage goes on with what it holds (the tool waits for the leases, up to its ``--wait``); the watches
are set again by kazoo when the session reconnects, and fire with the state the znode has then. A
LOST session ends the run's leases anyway (its batches fail with ``LeaseLostError``).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from deltawheel.statestore.zk.handover import handover_path, read_handover
from kazoo.recipe.watchers import DataWatch

from ..protocol.executor import ComputationExecutor

__all__ = ["HandoverWatch", "hand_over"]


class HandoverWatch:
    """Which of ``computations`` have an open hand-over request, kept by ZooKeeper watches;
    ``wake`` is set whenever one appears or goes (and by whoever else wants the waiter up). The
    watches end at the first event after ``stopping`` is set (the run's client outlives the run)."""

    def __init__(self, client: Any, pipeline: str, computations: Sequence[str], *,
                 wake: threading.Event | None = None, stopping: threading.Event | None = None) -> None:
        self.client, self.pipeline = client, pipeline
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


def hand_over(ex: ComputationExecutor | None, watch: HandoverWatch, computation: str, *, stopping: threading.Event,
              wait_s: float, log: Callable[[str], None]) -> None:
    """Between batches (no batch of the stage runs): if a tool asked for intervals ``ex`` holds,
    settle its delivery and give the leases back, wait until the tool's request is gone (the tool
    gives the leases back before it deletes it), then take them again (fence, recovery: the tool's
    rows). Returns at once when no request names an interval ``ex`` holds, and without taking the
    leases again when the run stops meanwhile."""
    if ex is None:
        return  # an instance holding none of this computation's intervals: nothing to hand over
    asked = read_handover(watch.client, watch.pipeline, computation)
    if asked is None or not set(asked.intervals) & set(ex.owner.intervals):
        return
    t0 = time.monotonic()
    log(f"{computation}: handing intervals over to {asked.tool} by {asked.by}")
    ex.stop()  # settles its delivery, then gives every lease back
    t_given = time.monotonic()
    while read_handover(watch.client, watch.pipeline, computation) is not None:
        if stopping.is_set():
            return  # the run stops: nothing to take again
        watch.wait(1.0)  # woken when the request goes
    t_back = time.monotonic()
    ex.start(wait_s=wait_s)
    log(f"{computation}: intervals taken again after {asked.tool} ({time.monotonic() - t0:.1f}s: given back in "
        f"{t_given - t0:.1f}s, the tool held them {t_back - t_given:.1f}s, taken again in "
        f"{time.monotonic() - t_back:.1f}s)")
