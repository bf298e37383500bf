"""How refinements relate: accumulation modes, panes and their pane info. In
``ACCUMULATING_AND_RETRACTING`` mode a new pane is preceded by a retraction pane withdrawing the
previous one (with the new one's pane info)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from .windows import GLOBAL_WINDOW, Window, WindowingError

__all__ = ["Timing", "AccumulationMode", "PaneInfo", "Pane"]


class Timing(str, Enum):
    """When a pane fired relative to the watermark."""

    EARLY = "EARLY"
    ON_TIME = "ON_TIME"
    LATE = "LATE"


class AccumulationMode(str, Enum):
    """How a window's successive panes relate."""

    DISCARDING = "discarding"  # each pane holds only what arrived since the previous one
    ACCUMULATING = "accumulating"  # each pane holds everything so far
    ACCUMULATING_AND_RETRACTING = "accumulating_and_retracting"  # and withdraws the previous pane first

    @staticmethod
    def parse(value: "str | AccumulationMode") -> "AccumulationMode":
        """The mode called ``value``; WindowingError if unknown."""
        try:
            return AccumulationMode(value)
        except ValueError:
            raise WindowingError(
                f"unknown accumulation mode {value!r}; use discarding, accumulating or "
                "accumulating_and_retracting") from None


@dataclass(frozen=True)
class PaneInfo:
    """Where a pane sits in its window's sequence of panes."""

    timing: Timing
    index: int
    is_first: bool
    is_last: bool


@dataclass(frozen=True)
class Pane:
    """One output of a window of a key."""

    key: str
    window: Window
    value: Any
    info: PaneInfo
    retraction: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The pane as produced to the output stream (times in ms; the global window's bounds None)."""
        glob = self.window.is_global
        return {"key": self.key, "window_start": None if glob else self.window.start_ms,
                "window_end": None if glob else self.window.end_ms, "value": self.value,
                "timing": self.info.timing.value, "pane_index": self.info.index, "is_first": self.info.is_first,
                "is_last": self.info.is_last, "retraction": self.retraction}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Pane":
        """Inverse of :meth:`to_dict`."""
        window = GLOBAL_WINDOW if d["window_start"] is None else Window(int(d["window_start"]), int(d["window_end"]))
        info = PaneInfo(Timing(d["timing"]), int(d["pane_index"]), bool(d["is_first"]), bool(d["is_last"]))
        return Pane(str(d["key"]), window, d["value"], info, bool(d.get("retraction", False)))
