"""The batch protocol's side of the watermark authority: :class:`BatchWatermarks`.

What a batch reads at step 1 (the input watermark: the minimum over its upstream injectors and
computations), and what step 7 publishes (the intervals' oldest work, the low watermark computed
from it, and the injector estimates an :class:`~.hooks.InjectorHook` observed before the commit,
in one ZooKeeper transaction); also when a delivery that held the low watermark has landed.
An executor without a watermark source fires event-time timers only when its caller passes
``input_watermark_ms``: its start refuses a computation with event-time timers unless the caller
says so (``manual_watermarks``), and a batch that sets such timers warns once.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Mapping

from deltawheel.statestore.exceptions import ConfigError

from .hooks import InjectorHook
from .reports import format_watermark

if TYPE_CHECKING:
    from .executor import ComputationExecutor

_LOG = logging.getLogger(__name__)

__all__ = ["BatchWatermarks"]


class BatchWatermarks:
    """The watermarks of one executor's batches (its authority, upstream and hook, read at each
    call: a caller may set them between batches). ``low``: the low watermark it last published;
    ``injectors_read``: the injector watermarks the current batch's :meth:`input` read."""

    def __init__(self, executor: ComputationExecutor) -> None:
        self.ex = executor
        self.low: int | None = None
        self.injectors_read: dict[str, int] = {}
        self._warned = False
        self._lock = threading.Lock()

    def has_source(self) -> bool:
        """An authority and upstream entries: the input watermark can become known."""
        return self.ex.authority is not None and bool(self.ex.upstream)

    def require_source(self) -> None:
        """At the start: a computation with event-time timers needs a watermark source, or a caller
        that fires them itself (``manual_watermarks``).

        Raises:
            ConfigError: neither.
        """
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
        """min over upstream low watermarks (None until all are known); remembers the injector
        watermarks it read in :attr:`injectors_read` (step 5 records them).

        An upstream computation in :attr:`~.executor.ComputationExecutor.upstream_caps` counts with
        at most its capped value: the watermark it had before this query took its snapshot of the
        computation's stream table. Another process (a job instance) may deliver rows and advance
        that watermark after the snapshot; acting on the newer value would find those rows late
        when they arrive with the next query.
        """
        ex = self.ex
        if ex.authority is None or not ex.upstream:
            return None
        marks = []
        for u in ex.upstream:
            kind, _, name = u.partition(":")
            wm = (ex.authority.injector_watermark(name) if kind == "injector"
                  else ex.authority.advance_low_watermark(name))
            if kind == "injector" and wm is not None:
                self.injectors_read[name] = wm
            if kind == "computation" and name in ex.upstream_caps:
                cap = ex.upstream_caps[name]
                wm = None if wm is None or cap is None else min(wm, cap)
            if wm is None:
                return None
            marks.append(wm)
        return min(marks)

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
        """The end-of-batch hook is this authority's :class:`InjectorHook` whose estimates step 7
        publishes in its own transaction (not a job instance's, which publishes them itself after
        the commit): it observes the batch before the commit, which records the estimates."""
        hook = self.ex.on_batch_end
        return isinstance(hook, InjectorHook) and hook.authority is self.ex.authority and hook.instance is None

    def observe_injectors(self, mn: int | None, mx: int | None) -> dict[str, tuple[int, int]]:
        """The injectors' estimates after this batch's event-time range (step 7 publishes them);
        {} when the hook publishes them itself."""
        hook = self.ex.on_batch_end
        if not self.hook_observes_early():
            return {}
        assert isinstance(hook, InjectorHook)
        return hook.observe(mn, mx)

    def publish(self, injectors: Mapping[str, tuple[int, int]] | None = None) -> int | None:
        """Publish the intervals' oldest work and advance the low watermark (with ``injectors``:
        publish these injector estimates in the same transaction)."""
        ex = self.ex
        assert ex.authority is not None
        with self._lock:  # the batch and its delivery thread both publish
            held = ex.inflight.held_ts()
            if ex.input_hold_ms is not None:  # input not read yet holds it too
                held = ex.input_hold_ms if held is None else min(held, ex.input_hold_ms)
            works: dict[int, tuple[int | None, int]] = {}
            path_oldest = ex.path.oldest_work()
            for iv, seq in ex.owner.sequencers.items():
                oldest = path_oldest.get(iv)
                if held is not None:  # undelivered (straggling) productions hold the watermark
                    oldest = held if oldest is None else min(oldest, held)
                works[iv] = (oldest, seq)
            # the oldest work and the low watermark computed from it: one round of reads, one transaction
            low = ex.authority.publish_and_advance(ex.comp.name, works, injectors=injectors)
            if low is not None:
                self.low = low
            return low

    def settled(self, batch_id: int) -> None:
        """After the executor settled batch ``batch_id``'s delivery: publish the low watermark it
        held, and say so when it is not the one the last batch line showed."""
        ex = self.ex
        low = self.publish()
        shown = ex.reports[-1].low_watermark_ms if ex.reports else None
        if low != shown and ex.progress is not None:  # the last batch line showed the watermark its delivery held
            ex.progress(f"{ex.comp.name}: batch {batch_id}'s delivery landed; low watermark "
                        f"{format_watermark(low, now_ms=ex.clock.now_ms())}")
