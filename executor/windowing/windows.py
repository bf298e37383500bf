"""Where in event time: windows and window functions. The end of input is the watermark
:data:`END_OF_INPUT_MS`, beyond the global window's end, so the global window fires when input ends.

>>> FixedWindows(120_000).assign(26_000)
(Window(start_ms=0, end_ms=120000),)
>>> [w.start_ms for w in SlidingWindows(60_000, 30_000).assign(45_000)]
[0, 30000]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..exceptions import WindowingError

__all__ = ["GLOBAL_START_MS", "GLOBAL_END_MS", "END_OF_INPUT_MS", "WindowingError", "Window", "GLOBAL_WINDOW",
           "WindowFn", "GlobalWindows", "FixedWindows", "SlidingWindows", "Sessions", "merge_overlapping",
           "window_fn_from_spec"]

GLOBAL_START_MS = -(2**61)
GLOBAL_END_MS = 2**61
END_OF_INPUT_MS = 2**62


@dataclass(frozen=True, order=True)
class Window:
    """The half-open event-time interval ``[start_ms, end_ms)``."""

    start_ms: int
    end_ms: int

    def __post_init__(self) -> None:
        if self.end_ms <= self.start_ms:
            raise WindowingError(f"window end {self.end_ms} must be after its start {self.start_ms}")

    @property
    def is_global(self) -> bool:
        """True for the single window of :class:`GlobalWindows`."""
        return self.start_ms == GLOBAL_START_MS and self.end_ms == GLOBAL_END_MS

    @property
    def wid(self) -> str:
        """The compact id used in state and timer tags: ``"start,end"`` (``"*"`` for global)."""
        return "*" if self.is_global else f"{self.start_ms},{self.end_ms}"

    @staticmethod
    def from_wid(wid: str) -> "Window":
        """Inverse of :attr:`wid`."""
        if wid == "*":
            return GLOBAL_WINDOW
        start, end = wid.split(",")
        return Window(int(start), int(end))

    def span(self, other: "Window") -> "Window":
        """The smallest window covering both."""
        return Window(min(self.start_ms, other.start_ms), max(self.end_ms, other.end_ms))


GLOBAL_WINDOW = Window(GLOBAL_START_MS, GLOBAL_END_MS)


class WindowFn:
    """Assigns timestamps to windows; override :meth:`assign` (and, with ``merging``, :meth:`merge`)."""

    merging: bool = False

    def assign(self, timestamp_ms: int) -> tuple[Window, ...]:
        """The windows an element with this event timestamp belongs to."""
        raise NotImplementedError

    def merge(self, windows: Sequence[Window]) -> list[tuple[Window, list[Window]]]:
        """``(merged, sources)`` per group of two or more of a key's live ``windows`` that merge."""
        return []


class GlobalWindows(WindowFn):
    """Every element in the one global window."""

    def assign(self, timestamp_ms: int) -> tuple[Window, ...]:
        """``(GLOBAL_WINDOW,)``."""
        return (GLOBAL_WINDOW,)


@dataclass(frozen=True)
class FixedWindows(WindowFn):
    """Tumbling windows of ``size_ms``, aligned to ``offset_ms`` from epoch 0."""

    size_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise WindowingError(f"fixed window size must be > 0 ms, got {self.size_ms}")

    def assign(self, timestamp_ms: int) -> tuple[Window, ...]:
        """The window ``[start, start + size_ms)`` holding the timestamp."""
        start = timestamp_ms - (timestamp_ms - self.offset_ms) % self.size_ms
        return (Window(start, start + self.size_ms),)


@dataclass(frozen=True)
class SlidingWindows(WindowFn):
    """Windows of ``size_ms`` starting every ``period_ms`` (aligned to ``offset_ms``)."""

    size_ms: int
    period_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.period_ms <= 0:
            raise WindowingError(
                f"sliding windows need size and period > 0 ms, got size {self.size_ms}, period {self.period_ms}")

    def assign(self, timestamp_ms: int) -> tuple[Window, ...]:
        """Every window that holds the timestamp, by start."""
        last = timestamp_ms - (timestamp_ms - self.offset_ms) % self.period_ms
        starts = range(last, timestamp_ms - self.size_ms, -self.period_ms)
        return tuple(sorted(Window(start, start + self.size_ms) for start in starts))


@dataclass(frozen=True)
class Sessions(WindowFn):
    """Per-key sessions: each element opens ``[t, t + gap_ms)``; overlapping windows merge."""

    gap_ms: int
    merging = True

    def __post_init__(self) -> None:
        if self.gap_ms <= 0:
            raise WindowingError(f"session gap must be > 0 ms, got {self.gap_ms}")

    def assign(self, timestamp_ms: int) -> tuple[Window, ...]:
        """``[t, t + gap_ms)``."""
        return (Window(timestamp_ms, timestamp_ms + self.gap_ms),)

    def merge(self, windows: Sequence[Window]) -> list[tuple[Window, list[Window]]]:
        """Windows that intersect, merged transitively."""
        return merge_overlapping(windows)


def merge_overlapping(windows: Sequence[Window]) -> list[tuple[Window, list[Window]]]:
    """Merge intersecting windows transitively (what sessions do).

    >>> merge_overlapping([Window(0, 10), Window(5, 15), Window(20, 30)])
    [(Window(start_ms=0, end_ms=15), [Window(start_ms=0, end_ms=10), Window(start_ms=5, end_ms=15)])]
    """
    groups: list[tuple[Window, list[Window]]] = []
    for w in sorted(set(windows)):
        if groups and w.start_ms < groups[-1][0].end_ms:
            groups[-1] = (groups[-1][0].span(w), [*groups[-1][1], w])
        else:
            groups.append((w, [w]))
    return [(span, group) for span, group in groups if len(group) > 1]


def _spec_ms(spec: Mapping[str, Any], field: str, unit_ms: int, default: float | None = None) -> int:
    value = spec.get(field, default)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WindowingError(f"windowing {spec.get('type')!r} needs a number {field!r}, got {value!r}")
    return round(value * unit_ms)


def window_fn_from_spec(spec: Mapping[str, Any], *, unit_ms: int = 1000) -> WindowFn:
    """A window function from its scenario description (times in ``unit_ms``); else WindowingError."""
    kind = spec.get("type")
    if kind == "global":
        return GlobalWindows()
    if kind == "fixed":
        return FixedWindows(_spec_ms(spec, "size", unit_ms), _spec_ms(spec, "offset", unit_ms, 0))
    if kind == "sliding":
        return SlidingWindows(_spec_ms(spec, "size", unit_ms), _spec_ms(spec, "period", unit_ms),
                              _spec_ms(spec, "offset", unit_ms, 0))
    if kind == "sessions":
        return Sessions(_spec_ms(spec, "gap", unit_ms))
    raise WindowingError(f"unknown windowing type {kind!r}; use global, fixed, sliding or sessions")
