"""The end-of-batch hook that moves the injectors' watermarks: :class:`InjectorHook`."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.zk.watermarks import WatermarkAuthority

from ..sources.injector import BatchStats, Injector, publish_watermark
from .rescale import files_read

__all__ = ["InjectorHook"]


class InjectorHook:
    """The ``on_batch_end`` hook of an executor fed by ``feeding``; ``checkpoint`` is needed by injectors
    estimating from pending files (else ConfigError), ``instance`` and ``held`` when sharing intervals."""

    def __init__(self, authority: WatermarkAuthority, feeding: Sequence[Injector], *, checkpoint: str | None,
                 instance: str | None = None,
                 held: Callable[[], Mapping[str, Mapping[int, int]]] | None = None) -> None:
        self.authority, self.feeding, self.checkpoint = authority, tuple(feeding), checkpoint
        self.instance, self.held = instance, held
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
        """Observe the batch's event-time range; returns the estimates for the caller to publish."""
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
