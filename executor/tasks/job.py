"""Steps 2-4 of a batch as the executor runs them on either write path: input preparation,
then dedup, loading the rows and user code in Spark tasks.

A :class:`UserJob` runs the tasks whose output a write path (``statestore/writepath``)
commits and delivers: :class:`~deltawheel.executor.tasks.image.job.ImageTasks` for the image path,
:class:`~deltawheel.executor.tasks.merge.job.MergeTasks` for the MERGE path. The executor's one
protocol body (``batch.py``) calls it; it writes nothing itself.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Mapping, Protocol, TypeVar

from deltawheel.statestore.delta.jvm import java_errors
from deltawheel.statestore.delta.log import local_path
from deltawheel.statestore.exceptions import DeltaWheelError

from ..exceptions import BatchFailedError, InputSchemaError, UserCodeError

__all__ = ["Prepared", "BatchCounts", "BatchRun", "UserJob", "task_failure", "user_error_message"]

#: Spark's error condition for a Parquet column it cannot read as the schema's type
PARQUET_TYPE_MISMATCH = "FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH"

BatchT = TypeVar("BatchT")


@dataclass
class Prepared:
    """The batch's input, prepared (step 2): ``input`` for the tasks (None: timers only or the
    tasks read the files themselves), input-level ``dead`` letters to record (a frame; None:
    none or recorded from the tasks' output), ``direct``: the tasks read the batch's files
    (``image/direct.py``), and ``raw``: the records' original text by record id, where the source
    kept it (``input.original_text``: the tasks' dead letters take theirs from it)."""

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
    """What the tasks of one batch counted (the batch report's counters).

    ``records_in``: input records; ``processed``: records user code ran; ``duplicates``: records
    dropped as seen; ``late``: late records the tasks saw (the routed ones are counted by the
    protocol); ``dead_letters``: of decoding, keying and user code; ``timers_fired``;
    ``productions``; ``keys_written``: rows changed; ``ids_expired``: record ids dropped past the
    dedup horizon; ``keys_expired``: keys the state TTL dropped. The image path only: ``bloom_*`` (the dedup filters' first check: records
    checked, "maybe seen" answers, of which not seen, the filters' memory), ``intervals_run`` and
    ``images_read`` (intervals whose image a task read from the store)."""

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


@dataclass
class BatchRun(Generic[BatchT]):
    """What the tasks of one batch returned (steps 2-4).

    ``batch``: the write path's new rows and productions (it commits and delivers them);
    ``counts``: the batch report's counters (:class:`BatchCounts`); ``dead`` /
    ``late``: the tasks' dead letters and routed late records as frames (None: none);
    ``prod_min_ts``: the oldest production timestamp (holds the low watermark while they are
    undelivered; None: not known yet, see :meth:`UserJob.checkpoint`); ``event_timer_ms``:
    the earliest event-time work set (to warn when no watermark will ever fire it)."""

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

    #: the batch's Parquet files the tasks may read themselves (image path; ``image/direct.py``)
    direct_source: Any
    #: per input stream, how far (ms) a record's event time may be ahead of the clock
    event_ahead_ms: Mapping[str, int]

    def prepare(self, df: Any | None, *, wm_late: int | None, now: int, batch_id: int | None = None) -> Prepared:
        """Step 2 in the JVM: keys, dead letters of input without a usable key, the late flag
        (``batch_id``: the query's micro-batch ``df`` is, for a direct read that needs it)."""

    def run(self, prepared: Prepared, *, batch_id: int, wm_in: int | None, wm_late: int | None, now: int,
            horizon: int | None, commit_id: str, strong: bool, mark: Callable[[str], None]) -> BatchRun[BatchT]:
        """Steps 2-4 in the tasks (dedup, load the rows, user code), materialized once.

        Raises:
            StaleViewError: the tasks met a newer fence or changed files (reload, run again).
            BatchFailedError: user code failed.
        """

    def checkpoint(self, run: BatchRun[BatchT]) -> bool:
        """A weak batch's straggler: make the commit checkpoint the productions ``run`` holds;
        False: the tasks must run again with ``strong`` (their files do not hold them)."""

    def observe(self, run: BatchRun[BatchT]) -> None:
        """After the commit: remember what the batch cost per interval (task placement)."""


def task_failure(exc: BaseException, computation: str, batch_id: int | None) -> DeltaWheelError:
    """The typed error of a batch whose Spark job failed: the user code's (:class:`UserCodeError`,
    rebuilt from the task's text: exit 7), an input file with a column of another type than the
    injector reads (:class:`InputSchemaError`: exit 3), otherwise :class:`BatchFailedError` (retry).
    Retrying helps neither of the first two."""
    user = UserCodeError.from_task(str(exc))
    if user is not None:
        return user
    batch = f"{computation} batch {'?' if batch_id is None else batch_id}"
    for condition, params in java_errors(exc):
        if condition == PARQUET_TYPE_MISMATCH:
            uri, column = params.get("path", "?"), params.get("column", "?").strip("[]")
            path = urllib.parse.unquote(local_path(uri) or uri)
            expected, found = params.get("expectedType", "?").upper(), params.get("actualType", "?").upper()
            return InputSchemaError(
                f"{batch}: input file {path} has column {column} as Parquet {found}, "
                f"where the injector reads {expected} (its schema=, or its folder's first file's); the batch was "
                f"not committed. Write the file again with {column} as {expected} under the same name, then run "
                "the same command again: the batch reads it again")
    return BatchFailedError(user_error_message(exc, computation, batch_id))


def user_error_message(exc: BaseException, computation: str, batch_id: int | None) -> str:
    """A one-line message for a batch that failed in a Spark task: the user code's error when it is found."""
    text = str(exc)
    m = re.search(r"UserCodeError: (.*?)(?:\n|$)", text) or re.search(r"(\w+Error: .*?)(?:\n|$)", text)
    detail = m.group(1) if m else text.strip().splitlines()[0][:500] if text.strip() else type(exc).__name__
    return f"{computation} batch {'?' if batch_id is None else batch_id} failed in a Spark task: {detail}"
