"""The batch protocol's side of the watermark authority (:class:`BatchWatermarks`): step 1 reads the
input watermark; step 7 publishes the oldest work, the low watermark and the injector estimates in one
ZooKeeper transaction, for a streaming query in the background."""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING, Callable, Mapping

from deltawheel.statestore.exceptions import ConfigError

from .hooks import InjectorHook
from .reports import format_watermark

if TYPE_CHECKING:
    from .host import BatchHost, BatchInputs

_LOG = logging.getLogger(__name__)

__all__ = ["BatchWatermarks"]


class BatchWatermarks:
    """The watermarks of one executor's batches; ``low``: the low watermark last published."""

    def __init__(self, executor: BatchHost) -> None:
        self.ex = executor
        self.low: int | None = None
        self.injectors_read: dict[str, int] = {}
        self.computations_read: int | None = None  # min over the upstream computations :meth:`input` read
        self.hold_ms: int | None = None  # input not read yet holds the low watermark here (:meth:`hold`)
        self._next_hold: tuple[int | None] | None = None  # the hold from the next commit on
        self._warned = False
        self._lock = threading.Lock()
        # step 7 running in the background: (set when it is done, where it leaves its failure)
        self._pending: tuple[threading.Event, dict[str, BaseException]] | None = None
        self._worker = _Worker(f"deltawheel-watermarks-{executor.comp.name}")

    def injector_part(self) -> int | None:
        """The minimum of the injector watermarks :meth:`input` read (None: not all known, or none)."""
        ex = self.ex
        names = [name for kind, _, name in (u.partition(":") for u in ex.upstream) if kind == "injector"]
        if not names or any(n not in self.injectors_read for n in names):
            return None
        return min(self.injectors_read[n] for n in names)

    def has_computation_upstream(self) -> bool:
        """An upstream computation feeds the executor."""
        return any(u.startswith("computation:") for u in self.ex.upstream)

    def has_source(self) -> bool:
        """An authority and upstream entries: the input watermark can become known."""
        return self.ex.authority is not None and bool(self.ex.upstream)

    def require_source(self) -> None:
        """At the start: raise ConfigError for event-time timers without a watermark source."""
        ex = self.ex
        if ex.comp.event_time_timers and not ex.manual_watermarks and not self.has_source():
            raise ConfigError(
                f"{ex.comp.name} uses event-time timers, but its executor has no watermark source "
                f"({'no upstream' if ex.authority is not None else 'authority=None'}), so they would never "
                "fire. Give it one: ComputationExecutor(..., authority=WatermarkAuthority(client, pipeline=...), "
                "upstream=['injector:NAME'], on_batch_end=<a hook publishing the injector's watermark with "
                "publish_watermark>) (README, 'Embedding it in your Spark job'), or pass manual_watermarks=True "
                "if you fire them yourself with flush(input_watermark_ms=...)")

    def input(self) -> int | None:
        """min over upstream low watermarks (None until all are known), capped by the inputs' ``upstream_caps``."""
        ex = self.ex
        self.computations_read = None
        if ex.authority is None or not ex.upstream:
            return None
        marks = []
        computations = []
        for u in ex.upstream:
            kind, _, name = u.partition(":")
            wm = (ex.authority.injector_watermark(name) if kind == "injector"
                  else ex.authority.advance_low_watermark(name))
            if kind == "injector" and wm is not None:
                self.injectors_read[name] = wm
            if kind == "computation" and name in ex.inputs.upstream_caps:
                cap = ex.inputs.upstream_caps[name]
                wm = None if wm is None or cap is None else min(wm, cap)
            if wm is None:
                return None
            marks.append(wm)
            if kind == "computation":
                computations.append(wm)
        self.computations_read = min(computations) if computations else None
        return min(marks)

    def hold(self, inputs: BatchInputs) -> None:
        """Hold the low watermark at ``inputs.hold_ms`` as ``inputs.hold`` says (:class:`BatchInputs`)."""
        hold, now = inputs.hold_ms, inputs.hold == "now"
        if inputs.hold != "kept":  # (no hold yet: from the commit on, hold everything until then)
            self.hold_ms = hold if now or hold is None else min(hold, self.hold_ms or 0)
            self._next_hold = None if now else (hold,)

    def input_committed(self) -> None:
        """The batch's input is in its commit: hold what comes after it."""
        if self._next_hold is not None:
            (self.hold_ms,), self._next_hold = self._next_hold, None

    def warn_if_none(self, wm_in: int | None, event_timer_ms: int | None) -> None:
        """Once: event-time timers were set, and no watermark source will ever make them due."""
        ex = self.ex
        if (event_timer_ms is None or wm_in is not None or ex.manual_watermarks or self._warned
                or self.has_source()):
            return
        self._warned = True
        msg = (f"WARNING {ex.comp.name}: event-time timers are set (the earliest at {event_timer_ms}), but this "
               "executor has no watermark source (a WatermarkAuthority and upstream injectors or computations), "
               "so they fire only when run_batch/flush is given input_watermark_ms; otherwise they never fire "
               "and the keys' state grows. Give the executor authority=..., upstream=[...] (README, 'Embedding "
               "it in your Spark job'), or pass manual_watermarks=True to say the caller moves the watermark")
        _LOG.warning(msg)
        if ex.progress is not None:
            ex.progress(msg)

    def hook_observes_early(self) -> bool:
        """The end-of-batch hook is an :class:`InjectorHook` whose estimates step 7 publishes."""
        hook = self.ex.on_batch_end
        return isinstance(hook, InjectorHook) and hook.authority is self.ex.authority and hook.instance is None

    def observe_injectors(self, mn: int | None, mx: int | None) -> dict[str, tuple[int, int]]:
        """The injectors' estimates after this batch ({} when the hook publishes them itself)."""
        hook = self.ex.on_batch_end
        if not self.hook_observes_early():
            return {}
        assert isinstance(hook, InjectorHook)
        return hook.observe(mn, mx)

    def publish(self, injectors: Mapping[str, tuple[int, int]] | None = None) -> int | None:
        """Publish the intervals' oldest work and advance the low watermark (and ``injectors``)."""
        with self._lock:  # the batch and its delivery thread both publish
            return self._send(self._works(), injectors)

    def _works(self) -> dict[int, tuple[int | None, int]]:
        """interval -> (its oldest work, our sequencer), as the executor holds them now (under the lock)."""
        ex = self.ex
        held = ex.inflight.held_ts()
        if self.hold_ms is not None:  # input not read yet holds it too
            held = self.hold_ms if held is None else min(held, self.hold_ms)
        works: dict[int, tuple[int | None, int]] = {}
        path_oldest = ex.path.oldest_work()
        for iv, seq in ex.owner.sequencers.items():
            oldest = path_oldest.get(iv)
            if held is not None:  # undelivered (straggling) productions hold the watermark
                oldest = held if oldest is None else min(oldest, held)
            works[iv] = (oldest, seq)
        return works

    def _send(self, works: Mapping[int, tuple[int | None, int]],
              injectors: Mapping[str, tuple[int, int]] | None) -> int | None:
        """The oldest work and the low watermark computed from it: one round of reads, one transaction."""
        assert self.ex.authority is not None
        low = self.ex.authority.publish_and_advance(self.ex.comp.name, works, injectors=injectors)
        if low is not None:
            self.low = low
        return low

    def publish_later(self, injectors: Mapping[str, tuple[int, int]], *, landed: Callable[[int | None], None]) -> None:
        """:meth:`publish` in the background, then ``landed(low)``; :meth:`join` raises what failed."""
        self.join()
        box: dict[str, BaseException] = {}
        done = threading.Event()
        self._lock.acquire()  # released by the worker, once the round landed
        try:
            works = self._works()
        except BaseException:
            self._lock.release()
            raise

        def run() -> None:
            try:
                try:
                    low = self._send(works, injectors)
                finally:
                    self._lock.release()
                landed(low)
            except BaseException as exc:  # raised by join(), in the caller's thread
                box["error"] = exc
            finally:
                done.set()

        self._pending = (done, box)
        self._worker.submit(run)

    def join(self) -> None:
        """Wait for the background step 7, if any, and raise what it raised (e.g. LeaseLostError)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        done, box = pending
        done.wait()
        if "error" in box:
            raise box["error"]

    def settled(self, batch_id: int) -> None:
        """After batch ``batch_id``'s delivery settled: publish the low watermark it held."""
        ex = self.ex
        self.join()
        low = self.publish()
        shown = ex.reports[-1].low_watermark_ms if ex.reports else None
        if low != shown and ex.progress is not None:  # the last batch line showed the watermark its delivery held
            ex.progress(f"{ex.comp.name}: batch {batch_id}'s delivery landed; low watermark "
                        f"{format_watermark(low, now_ms=ex.clock.now_ms())}")


class _Worker:
    """One daemon thread running the functions handed to it, in order; it ends after :attr:`IDLE_S` idle."""

    IDLE_S = 30.0

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the thread (after those handed over before it); it must not raise."""
        with self._lock:
            self._queue.put(fn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                fn = self._queue.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            fn()
