"""The computation settings of a windowed computation, given to ``windowed(...)``: class attributes of
the subclass it builds, so driver and tasks read the same values.

>>> ComputationSettings(num_intervals=2, late_policy="route").late_policy
<LatePolicy.ROUTE: 'route'>
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Mapping

from deltawheel.statestore.exceptions import ConfigError

from ..computation import Computation, ErrorPolicy, LatePolicy

__all__ = ["ComputationSettings", "SETTINGS", "refuse_unknown"]


@dataclass(frozen=True, kw_only=True)
class ComputationSettings:
    """The :class:`Computation` settings a windowed computation accepts (defaults: Computation's);
    ConfigError for a value of the wrong type, an unknown policy, a negative timeout."""

    num_intervals: int = Computation.num_intervals
    codec: str = Computation.codec
    allow_pickle: bool = Computation.allow_pickle
    exactly_once: bool = Computation.exactly_once
    dedup_retention: timedelta = Computation.dedup_retention
    strong_productions: bool = Computation.strong_productions
    straggler_timeout_s: float = Computation.straggler_timeout_s
    delivery_timeout_s: float = Computation.delivery_timeout_s
    late_policy: LatePolicy | str = Computation.late_policy
    error_policy: ErrorPolicy | str = Computation.error_policy
    state_ttl: timedelta | None = Computation.state_ttl
    state_ttl_processing: timedelta | None = Computation.state_ttl_processing

    def __post_init__(self) -> None:
        for flag in ("allow_pickle", "exactly_once", "strong_productions"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        for timeout in ("straggler_timeout_s", "delivery_timeout_s"):
            t = getattr(self, timeout)
            if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
                raise ConfigError(f"{timeout} must be a number of seconds >= 0, got {t!r}")
        for policy, kind in (("late_policy", LatePolicy), ("error_policy", ErrorPolicy)):
            try:
                object.__setattr__(self, policy, kind(getattr(self, policy)))
            except ValueError:
                raise ConfigError(f"{policy} must be one of {', '.join(p.value for p in kind)} "
                                  f"(or {kind.__name__}), got {getattr(self, policy)!r}") from None

    def attributes(self) -> dict[str, Any]:
        """The settings as the class attributes of a computation."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


#: The names :func:`windowed` accepts as computation settings.
SETTINGS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ComputationSettings))


def refuse_unknown(name: str, unknown: Mapping[str, Any], *, arguments: tuple[str, ...]) -> None:
    """ConfigError, naming every accepted name, for keyword arguments of ``windowed(...)`` that are
    neither its ``arguments`` nor a setting."""
    if unknown:
        raise ConfigError(
            f"windowed computation {name!r}: unknown setting {', '.join(map(repr, sorted(unknown)))}; "
            f"windowed(...) accepts the computation settings {', '.join(SETTINGS)} and the arguments "
            f"{', '.join(arguments)}")
