"""Where a tool's time goes: its phases in order, and the window the live stage is paused (hand-over to back).

>>> from deltawheel.statestore.clock import ManualClock
>>> clock = ManualClock(0)
>>> t = Timeline(clock=clock)
>>> with t.phase("checks"):
...     clock.advance(2_000)
>>> t.paused_from()
>>> with t.phase("fenced commit"):
...     clock.advance(500)
>>> t.paused_until()
>>> print(t.describe())
  +0.0s  checks: 2.0s
  +2.0s  fenced commit: 0.5s  (paused)
the live stage was paused 0.5s (from +2.0s to +2.5s)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ..clock import Clock, SystemClock

__all__ = ["Phase", "Opened", "Timeline"]


@dataclass(frozen=True)
class Phase:
    """One phase: its name, start and end (ms since the timeline began), whether the stage was paused."""

    name: str
    start_ms: int
    end_ms: int
    paused: bool

    def describe(self) -> str:
        """One line: ``+start  name: seconds``."""
        return (f"  +{self.start_ms / 1000:.1f}s  {self.name}: {(self.end_ms - self.start_ms) / 1000:.1f}s"
                + ("  (paused)" if self.paused else ""))


@dataclass
class Opened:
    """A phase begun (:meth:`Timeline.begin`) and not ended yet."""

    name: str
    start_ms: int
    paused: bool
    ended: bool = False


@dataclass
class Timeline:
    """The phases of one tool run; ``say``: called with each phase's line as it ends."""

    clock: Clock = field(default_factory=SystemClock)
    say: Callable[[str], None] | None = None
    phases: list[Phase] = field(default_factory=list)
    _t0: int = field(init=False)
    _paused: tuple[int, int | None] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._t0 = self.clock.now_ms()

    def _now(self) -> int:
        return self.clock.now_ms() - self._t0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the block's time as phase ``name`` (also when it raises)."""
        opened = self.begin(name)
        try:
            yield
        finally:
            self.end(opened)

    def begin(self, name: str) -> Opened:
        """Phase ``name`` starts now; :meth:`end` ends it (for a phase that ends on an event)."""
        return Opened(name, self._now(), self.paused)

    def end(self, opened: Opened) -> None:
        """Phase ``opened`` ends now (a second call does nothing)."""
        if opened.ended:
            return
        opened.ended = True
        p = Phase(opened.name, opened.start_ms, self._now(), opened.paused)
        self.phases.append(p)
        if self.say is not None:
            self.say(p.describe())

    @property
    def paused(self) -> bool:
        """Whether the live stage is paused now (between :meth:`paused_from` and :meth:`paused_until`)."""
        return self._paused is not None and self._paused[1] is None

    def paused_from(self) -> None:
        """The live stage is paused from now (the tool holds its intervals)."""
        self._paused = (self._now(), None)

    def paused_until(self) -> None:
        """The live stage may go on from now (the tool gave its intervals back)."""
        if self._paused is not None and self._paused[1] is None:
            self._paused = (self._paused[0], self._now())

    def pause_s(self) -> float | None:
        """How long the stage was paused (None: it was not, or is still)."""
        start, end = self._paused or (0, None)
        return None if end is None else (end - start) / 1000

    def pause_line(self) -> str | None:
        """How long the live stage was paused, from when to when (None: it was not)."""
        start, end = self._paused or (0, None)
        return None if end is None else (f"the live stage was paused {(end - start) / 1000:.1f}s "
                                         f"(from +{start / 1000:.1f}s to +{end / 1000:.1f}s)")

    def describe(self) -> str:
        """Every phase, a line each, then the pause."""
        pause = self.pause_line()
        return "\n".join([p.describe() for p in self.phases] + ([pause] if pause else []))
