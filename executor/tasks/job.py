"""Steps 2-4 of a batch on either write path; a :class:`UserJob` writes nothing itself."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Mapping, Protocol, TypeVar

from deltawheel.statestore.delta.jvm import java_errors
from deltawheel.statestore.delta.log import local_path
from deltawheel.statestore.exceptions import DeltaWheelError, ObjectStoreUnreachableError

from ..exceptions import BatchFailedError, InputFileError, InputSchemaError, KafkaDataLossError, UserCodeError

__all__ = ["Prepared", "BatchCounts", "BatchRun", "UserJob", "task_failure", "user_error_message"]

#: Spark's error condition for a Parquet column it cannot read as the schema's type
PARQUET_TYPE_MISMATCH = "FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH"
#: Spark's error conditions for a file it cannot read (``FAILED_READ_FILE.NO_HINT``, ...)
FAILED_READ_FILE = "FAILED_READ_FILE"


BatchT = TypeVar("BatchT")


@dataclass(kw_only=True)
class Prepared:
    """The batch's prepared input (step 2); ``input`` None: none from Spark."""

    input: Any | None
    dead: Any | None = None
    records_in: int = 0
    dead_in: int = 0
    obs_min: int | None = None
    obs_max: int | None = None
    direct: Any | None = None
    raw: Any | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchCounts:
    """What the tasks of one batch counted (``bloom_*``, ``intervals_run``, ``images_read``: image path)."""

    records_in: int = 0
    processed: int = 0
    duplicates: int = 0
    late: int = 0
    dead_letters: int = 0
    timers_fired: int = 0
    productions: int = 0
    keys_written: int = 0
    ids_expired: int = 0
    keys_expired: int = 0
    bloom_checked: int = 0
    bloom_maybe: int = 0
    bloom_false_pos: int = 0
    bloom_bytes: int = 0
    intervals_run: int = 0
    images_read: int = 0


@dataclass(kw_only=True)
class BatchRun(Generic[BatchT]):
    """What the tasks of one batch returned; ``prod_min_ts`` None: not known yet."""

    batch: BatchT
    counts: BatchCounts
    dead: Any | None = None
    late: Any | None = None
    prod_min_ts: int | None = None
    event_timer_ms: int | None = None
    obs_min: int | None = None
    obs_max: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class UserJob(Protocol[BatchT]):
    """The Spark side of steps 2-4 for one write path."""

    #: per input stream, how far (ms) a record's event time may be ahead of the clock
    event_ahead_ms: Mapping[str, int]

    def prepare(self, df: Any | None, *, wm_late: int | None, now: int, batch_id: int | None = None,
                direct: Any = None) -> Prepared:
        """Step 2 in the JVM: keys, dead letters, the late flag; ``direct``: the ``DirectSource`` whose
        files the tasks may read themselves (image path; ``image/direct.py``)."""

    def run(self, prepared: Prepared, *, batch_id: int, wm_in: int | None, wm_late: int | None, now: int,
            horizon: int | None, commit_id: str, strong: bool, mark: Callable[[str], None],
            late_raised: Mapping[int, int] | None = None) -> BatchRun[BatchT]:
        """Steps 2-4 in the tasks, materialized once (StaleViewError: reload and rerun). ``late_raised``:
        intervals whose records are judged against a line above ``wm_late`` (``protocol/lateness.py``)."""

    def checkpoint(self, run: BatchRun[BatchT]) -> bool:
        """A weak batch's straggler: checkpoint the productions; False: rerun the tasks with ``strong``."""

    def observe(self, run: BatchRun[BatchT]) -> None:
        """After the commit: remember what the batch cost per interval (task placement)."""


def task_failure(exc: BaseException, computation: str, batch_id: int | None) -> DeltaWheelError:
    """The typed error of a failed Spark job: UserCodeError, InputSchemaError, else BatchFailedError."""
    user = UserCodeError.from_task(str(exc))
    if user is not None:
        return user
    batch = f"{computation} batch {'?' if batch_id is None else batch_id}"
    found = InputFileError.from_task(str(exc))  # the direct read's, in a task
    if found is not None:
        return _unreachable(batch, found) or InputFileError(f"{batch}: {found}")
    lost = KafkaDataLossError.from_task(str(exc))  # the Kafka direct read's, in a task
    if lost is not None:
        return KafkaDataLossError(f"{batch}: {lost}")
    for condition, params in java_errors(exc):
        uri = params.get("path", "?")
        path = urllib.parse.unquote(local_path(uri) or uri)
        if condition == PARQUET_TYPE_MISMATCH:
            column = params.get("column", "?").strip("[]")
            expected, found = params.get("expectedType", "?").upper(), params.get("actualType", "?").upper()
            return InputSchemaError(
                f"{batch}: input file {path} has column {column} as Parquet {found}, "
                f"where the injector reads {expected} (its schema=, or its folder's first file's); the batch was "
                f"not committed. Write the file again with {column} as {expected} under the same name, then run "
                "the same command again: the batch reads it again")
        if condition.startswith(FAILED_READ_FILE):
            said = f"input file {path} cannot be read ({_cause(exc)})"
            return _unreachable(batch, said) or InputFileError(f"{batch}: {said}; {InputFileError.ADVICE}")
    return BatchFailedError(user_error_message(exc, computation, batch_id))


#: a read that failed on the way to the file, not on the file: its store did not answer
_NETWORK = ("java.net.SocketException", "java.net.ConnectException", "java.net.SocketTimeoutException",
            "java.net.UnknownHostException", "java.net.NoRouteToHostException", "Connection reset",
            "Connection refused", "Unable to execute HTTP request", "NETWORK_CONNECTION", "curlCode")


def _unreachable(batch: str, said: str) -> ObjectStoreUnreachableError | None:
    """The retryable error of an input file whose store did not answer (``said``: what the read said);
    None: the file itself is bad.

    >>> type(_unreachable("b batch 3", "input file s3a://x/f.parquet cannot be read (java.net.SocketException: "
    ...                   "Connection reset)")).__name__
    'ObjectStoreUnreachableError'
    >>> _unreachable("b batch 3", "input file /in/f.parquet cannot be read (EOFException: the file is truncated)")
    """
    if not any(mark in said for mark in _NETWORK):
        return None
    return ObjectStoreUnreachableError(f"{batch}: {said}: its store did not answer; the batch was not committed and "
                                       "runs again once the store answers")


def _cause(exc: BaseException) -> str:
    """The root cause Spark gives for a file it could not read, in one line."""
    causes = re.findall(r"Caused by: ([\w.$]+: [^\n]+)", str(exc))
    return causes[-1][:300] if causes else type(exc).__name__


def user_error_message(exc: BaseException, computation: str, batch_id: int | None) -> str:
    """A one-line message for a batch that failed in a Spark task: the user code's error when it is found."""
    text = str(exc)
    m = re.search(r"UserCodeError: (.*?)(?:\n|$)", text) or re.search(r"(\w+Error: .*?)(?:\n|$)", text)
    # a JVM failure: its root cause ("Caused by:"), else the first exception named (not py4j's wrapper)
    java = (re.findall(r"Caused by: ([\w.$]+: [^\n]+)", text)
            or re.findall(r"((?:[\w$]+\.)+[\w$]*Exception: [^\n]+)", text))
    detail = (m.group(1) if m else java[-1][:500] if java
              else text.strip().splitlines()[0][:500] if text.strip() else type(exc).__name__)
    return f"{computation} batch {'?' if batch_id is None else batch_id} failed in a Spark task: {detail}"
