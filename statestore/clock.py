"""Injected time: every component that reads the wall clock takes a :class:`Clock`."""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock", "ManualClock"]


class Clock(Protocol):
    """Where a component reads the time: :class:`SystemClock` in production, :class:`ManualClock` in tests."""

    def now_ms(self) -> int:
        """Milliseconds since the epoch."""
        ...


class SystemClock:
    """The real wall clock."""

    def now_ms(self) -> int:
        """The current time in milliseconds since the epoch."""
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock tests move by hand.

    >>> c = ManualClock(1000); c.advance(500); c.now_ms()
    1500
    """

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        """The time it was last set to, in milliseconds since the epoch."""
        with self._lock:
            return self._now

    def advance(self, ms: int) -> None:
        """Move the clock forward by ``ms`` (backwards if negative)."""
        with self._lock:
            self._now += ms

    def set(self, ms: int) -> None:
        """Set the clock to ``ms``."""
        with self._lock:
            self._now = ms
