"""When a continuous query starts its next micro-batch: :class:`Trigger`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from deltawheel.statestore.exceptions import ConfigError

__all__ = ["Trigger"]

_UNITS_MS = {"ms": 1, "millisecond": 1, "milliseconds": 1, "s": 1_000, "sec": 1_000, "secs": 1_000,
             "second": 1_000, "seconds": 1_000, "m": 60_000, "min": 60_000, "mins": 60_000, "minute": 60_000,
             "minutes": 60_000}
_TRIGGER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


@dataclass(frozen=True)
class Trigger:
    """When a continuous query starts its next micro-batch (``interval_ms`` None: as fast as possible).

    >>> Trigger.parse("500 milliseconds"), Trigger.parse("2s"), Trigger.parse(None)
    (Trigger(interval_ms=500), Trigger(interval_ms=2000), Trigger(interval_ms=None))
    """

    interval_ms: int | None = None

    @classmethod
    def parse(cls, value: str | float | Trigger | None) -> Trigger:
        """A trigger from None / ``""``, seconds, or text such as ``"500ms"``; ConfigError for anything else."""
        if isinstance(value, Trigger):
            return value
        if value is None or value == "":
            return cls()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            ms = float(value) * 1_000
        else:
            m = _TRIGGER.match(str(value).lower())
            unit = m.group(2) if m else None
            if m is None or unit not in _UNITS_MS and unit != "":
                raise ConfigError(f"trigger {value!r}: expected a processing-time interval such as '500 milliseconds', "
                                  "'2 seconds', '1 minute' (or None / '' for as fast as possible)")
            ms = float(m.group(1)) * _UNITS_MS.get(unit or "s", 1_000)
        if ms < 0:
            raise ConfigError(f"trigger {value!r}: an interval must be >= 0")
        return cls(int(round(ms)) if ms > 0 else None)

    def apply(self, writer: Any) -> Any:
        """``writer`` (a ``DataStreamWriter``) with this trigger."""
        return writer if self.interval_ms is None else writer.trigger(processingTime=f"{self.interval_ms} milliseconds")

    def __str__(self) -> str:
        return "as fast as possible" if self.interval_ms is None else f"every {self.interval_ms} ms"
