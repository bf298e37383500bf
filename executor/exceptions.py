"""Errors raised by the executor: all under deltawheel's one root, :class:`DeltaWheelError`."""

from __future__ import annotations

import ast
import re

from deltawheel.statestore.exceptions import (  # the local servers' errors, re-exported
    ClusterError,
    CodecError,
    ConfigError,
    DeltaWheelError,
    FatalError,
    HostsUnavailableError,
    KafkaServerError,
    RetryableError,
    UnknownHostError,
)

__all__ = ["DeltaWheelError", "BatchFailedError", "ClusterError", "HostsUnavailableError", "InputFileError",
           "InputSchemaError", "KafkaServerError", "UnknownHostError", "UserCodeError", "WindowingError",
           "StateUpgradeError", "KafkaDataLossError"]


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

    def __reduce__(self) -> tuple[object, tuple[str, str, str, BaseException, str]]:
        return (_user_code_error, (self.computation, self.key, self.what, self._cause, str(self)))

    @classmethod
    def from_task(cls, text: str) -> UserCodeError | None:
        """The user-code error a Spark task failed with, rebuilt from the task's failure text (all that
        reaches the driver); None: the task failed otherwise. Its message is the task's.

        >>> err = UserCodeError.from_task("... UserCodeError: c: user code failed for key 'k' on record 'r1' "
        ...                               "(event time 5): ValueError: no. The batch was not committed; ...")
        >>> err.computation, err.key, err.what, str(err)
        ('c', 'k', "record 'r1' (event time 5)", "c: user code failed for key 'k' on record 'r1' (event time 5): ValueError: no. The batch was not committed; ...")
        """
        m = _IN_TASK.search(text)
        if m is None:
            return None
        try:
            key = str(ast.literal_eval(m["key"]))
        except (ValueError, SyntaxError):
            key = m["key"]
        return _user_code_error(m["computation"], key, m["what"], RuntimeError(m["cause"]),
                                m[0][len("UserCodeError: "):])


# A UserCodeError's message as a task's failure text holds it, up to the end of its advice
_IN_TASK = re.compile(r"UserCodeError: (?P<computation>[^\n:]+): user code failed for key "
                      r"(?P<key>'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\") on (?P<what>[^\n]*?): "
                      r"(?P<cause>[A-Za-z_][\w.]*: (?s:.*?))\. The batch was not committed[^\n]*")


def _user_code_error(computation: str, key: str, what: str, cause: BaseException, message: str) -> UserCodeError:
    """A UserCodeError with ``message`` as its text (a rebuilt or unpickled one keeps the original's)."""
    err = UserCodeError(computation, key, what, cause)
    err.args = (message,)
    return err


class InputSchemaError(ConfigError):
    """An input file has a column of another type than the injector reads: retrying cannot help."""


class InputFileError(ConfigError):
    """An input file cannot be read at all (truncated, corrupt, not Parquet): retrying cannot help."""

    ADVICE = ("the batch was not committed. The file is truncated or is not a Parquet file: write it again whole under "
              "the same name (or, to leave its records out, a Parquet file of the injector's schema without rows), "
              "then run the same command again: the batch reads it again")

    @staticmethod
    def from_task(text: str) -> str | None:
        """The message of an InputFileError a Spark task raised, found in its failure text (None: none)."""
        m = re.search(r"InputFileError: (input file [^\n]*)", text)
        return None if m is None else m.group(1)


class KafkaDataLossError(ConfigError):
    """Records of a Kafka batch are no longer in the topic, with the injector's ``failOnDataLoss`` on."""

    @staticmethod
    def from_task(text: str) -> str | None:
        """The message of a KafkaDataLossError a Spark task raised, found in its failure text (None: none)."""
        m = re.search(r"KafkaDataLossError: (topic [^\n]*)", text)
        return None if m is None else m.group(1)


class StateUpgradeError(CodecError):
    """A key's older state could not be upgraded (``upgrade_state`` raised or gave nothing usable)."""


class WindowingError(ConfigError):
    """A windowing strategy (window function, trigger, combiner, scenario) is malformed."""
