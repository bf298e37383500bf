"""The last published low watermark this instance saw, served without ZooKeeper: flagged ``stale``
when not CONNECTED (SUSPENDED / LOST); it never moves back, so a stale value is only too low."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient, KazooState

from ...clock import Clock
from ...exceptions import CodecError
from .codec import decode

__all__ = ["LastKnown", "LastSeen"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LastKnown:
    """The last published low watermark this instance saw; ``stale``: not CONNECTED now."""

    low_watermark_ms: int | None
    seen_ms: int | None
    stale: bool


class LastSeen:
    """Per computation, the last published low watermark read, written or told of, and when."""

    def __init__(self, client: KazooClient, clock: Clock) -> None:
        self._client = client
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int | None, int]] = {}

    def remember(self, computation: str, value: int | None) -> None:
        """Note ``value`` as the published low watermark of ``computation``, seen now."""
        with self._lock:
            self._seen[computation] = (value, self._clock.now_ms())

    def last_known(self, computation: str) -> LastKnown:
        """What was seen last (no ZooKeeper call)."""
        with self._lock:
            value, seen = self._seen.get(computation, (None, None))
        return LastKnown(value, seen, stale=self._client.state != KazooState.CONNECTED)

    def watch(self, path: str, computation: str, callback: Callable[[int | None], None]) -> None:
        """Call ``callback(value)`` now and after changes at ``path``, the latest value each time
        (a failing callback is logged)."""
        def on_change(data: bytes | None, _stat: object) -> None:
            try:
                value = None if data is None else decode(data, "low watermark")["low_watermark_ms"]
            except CodecError:
                log.exception("ignoring a damaged low watermark at %s", path)
                return
            self.remember(computation, value)
            try:
                callback(value)
            except Exception:  # a failing callback must not end the watch
                log.exception("low watermark callback for %s failed", computation)

        self._client.DataWatch(path, on_change)
