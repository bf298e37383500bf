"""Errors raised by the executor: all under deltawheel's one root, :class:`DeltaWheelError`.

Retryable errors (a restart of the query retries the batch) derive from
:class:`~deltawheel.statestore.exceptions.RetryableError`, configuration and user-code errors
from :class:`~deltawheel.statestore.exceptions.FatalError`, as in ``statestore.exceptions``.
"""

from __future__ import annotations

from deltawheel.statestore.exceptions import (
    CodecError,
    ConfigError,
    DeltaWheelError,
    FatalError,
    RetryableError,
)

__all__ = ["DeltaWheelError", "BatchFailedError", "ClusterError", "KafkaServerError", "UserCodeError",
           "WindowingError", "StateUpgradeError"]


class BatchFailedError(RetryableError):
    """A micro-batch failed (user code, input, or storage); nothing of it was delivered."""


class UserCodeError(FatalError):
    """process_record / process_timer raised; carries the key and what was processed."""

    exit_code = 7

    def __init__(self, computation: str, key: str, what: str, cause: BaseException) -> None:
        super().__init__(
            f"{computation}: user code failed for key {key!r} on {what}: {type(cause).__name__}: {cause}. "
            "The batch was not committed; fix the code (or set error_policy = ErrorPolicy.DEAD_LETTER) "
            "and restart: the batch is retried.")
        self.computation = computation
        self.key = key
        self.what = what
        self._cause = cause

    def __reduce__(self) -> tuple[type[UserCodeError], tuple[str, str, str, BaseException]]:
        return (UserCodeError, (self.computation, self.key, self.what, self._cause))


class StateUpgradeError(CodecError):
    """A key's stored state is of an older ``state_version`` and the computation's
    ``upgrade_state`` raised on it (or returned nothing usable, or the stored version is newer
    than the computation's): by the error policy the batch fails naming the key, or the key's
    records go to dead letters and its row stays as it was."""


class WindowingError(ConfigError):
    """A windowing strategy (window function, trigger, combiner, scenario) is malformed."""


class ClusterError(FatalError):
    """The local Spark standalone cluster (``deltawheel cluster``) could not be started, reached or stopped."""

    exit_code = 8


class KafkaServerError(FatalError):
    """The local Kafka broker (``executor/servers/kafka.py``) could not be started or reached."""

    exit_code = 8
