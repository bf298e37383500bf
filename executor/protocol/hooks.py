"""The end-of-batch hook that moves the injectors' watermarks: :class:`InjectorHook`.

After each micro-batch, each injector feeding the executor observes the batch's event-time
range (its estimate moves) and its watermark is published. Called as a plain ``on_batch_end``
hook it publishes each injector itself (a read-modify-write of its node). The executor that
runs it as step 7 of the batch protocol asks :meth:`InjectorHook.observe` instead, and
publishes the estimates in the step's own ZooKeeper round and transaction
(:meth:`.WatermarkAuthority.publish_and_advance` ``injectors``): two round trips per injector
fewer on every batch. Job instances sharing intervals publish their own estimates
(:meth:`.WatermarkAuthority.publish_instance_injector`, a minimum over the live instances):
those the hook publishes itself, as before.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.zk.watermarks import WatermarkAuthority

from ..sources.injector import BatchStats, Injector, publish_watermark
from .rescale import files_read

__all__ = ["InjectorHook"]


class InjectorHook:
    """The ``on_batch_end`` hook of an executor fed by ``feeding`` (see the module docstring).

    Args:
        authority: where the watermarks are published.
        feeding: the injectors whose records the executor reads.
        checkpoint: the query's checkpoint (its file log says what was read: injectors that
            estimate from their pending files need it).
        instance: the job instance's name when instances share the intervals (its estimate is
            published as that instance's).
        held: with ``instance``, the intervals (and sequencers) the instance holds, per computation.

    Raises:
        ConfigError: an injector estimates from its pending files (``watermark_percentile``) and no
            ``checkpoint`` is given.
    """

    def __init__(self, authority: WatermarkAuthority, feeding: Sequence[Injector], *, checkpoint: str | None,
                 instance: str | None = None,
                 held: Callable[[], Mapping[str, Mapping[int, int]]] | None = None) -> None:
        self.authority = authority
        self.feeding = tuple(feeding)
        self.checkpoint = checkpoint
        self.instance = instance
        self.held = held
        self._tracking = [inj for inj in self.feeding if getattr(inj, "tracks_files", False)]
        if self._tracking and checkpoint is None:
            raise ConfigError(f"injector {self._tracking[0].name} estimates its watermark from the files no query "
                              "has read yet: give the query's checkpoint (engine.executor(..., checkpoint=...))")

    def __call__(self, mn: int | None, mx: int | None) -> None:
        """Observe the batch's event-time range and publish every injector's watermark."""
        self._observe(mn, mx)
        for inj in self.feeding:
            self._publish(inj)

    def observe(self, mn: int | None, mx: int | None) -> dict[str, tuple[int, int]]:
        """Observe the batch's event-time range; returns the estimates for the caller to publish
        (injector name -> (watermark, sequencer 0)). Estimates it cannot hand over (an instance's,
        published as a minimum over instances) it publishes itself; an injector without an
        estimate yet is left out, as :func:`.publish_watermark` publishes nothing for it."""
        self._observe(mn, mx)
        out: dict[str, tuple[int, int]] = {}
        for inj in self.feeding:
            if self.instance is not None:
                self._publish(inj)
                continue
            watermark = inj.watermark_ms()
            if watermark is not None:
                out[inj.name] = (int(watermark), 0)
        return out

    def _observe(self, mn: int | None, mx: int | None) -> None:
        read = files_read(self.checkpoint) if self._tracking and self.checkpoint is not None else frozenset()
        for inj in self.feeding:
            stats = BatchStats(count=0 if mx is None else 1, min_event_ms=mn, max_event_ms=mx, sources=read)
            if inj in self._tracking:
                inj.observe(stats, query=self.checkpoint)  # type: ignore[call-arg]
            else:
                inj.observe(stats)

    def _publish(self, inj: Injector) -> None:
        publish_watermark(self.authority, inj, instance=self.instance,
                          held=None if self.held is None else self.held())
