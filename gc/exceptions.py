"""Errors raised by garbage collection: all under deltawheel's one root, :class:`DeltaWheelError`."""

from __future__ import annotations

from deltawheel.statestore.exceptions import ConfigError, DeltaWheelError

__all__ = ["DeltaWheelError", "ReplayHorizonError", "RetentionError", "VacuumRetentionError"]


class VacuumRetentionError(ConfigError):
    """A VACUUM retention below Delta's safety minimum was asked for without ``force``."""


class ReplayHorizonError(ConfigError):
    """A retention (stream, VACUUM, log) shorter than the replay horizon the user asked to keep."""


class RetentionError(ConfigError):
    """A retention (metrics, late data, dead letters) below zero."""
