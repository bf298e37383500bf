"""A live stage's restarts inside its driver (``continuous.py``): which failures start it again, how
long it waits, and the typed error of a store that failed under Spark's or pyarrow's call."""

from __future__ import annotations

from deltawheel.statestore.exceptions import (
    DeltaWheelError,
    DiskFullError,
    LeaseError,
    RetryableError,
    SessionLostError,
    StaleSequencerError,
    disk_full,
)

__all__ = ["RESTARTS", "first_line", "restart_delay_s", "retryable", "store_failed"]

#: How often a stage that failed with a retryable error is started again inside its driver before the
#: run stops with that error; the count starts again at each committed batch.
RESTARTS = 5


def restart_delay_s(n: int) -> float:
    """The wait before a stage's ``n``-th restart in a row: 2 s, doubled each time, at most 30 s.

    >>> [restart_delay_s(n) for n in (1, 2, 3, 4, 5, 6)]
    [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    """
    return min(30.0, 2.0 * 2.0 ** (n - 1))


def first_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc``'s first line, a Java error's own (not Py4J's), at most 500 characters."""
    lines = [ln.strip(": ") for ln in str(exc).strip().splitlines() if ln.strip(": ")]
    if len(lines) > 1 and lines[0].startswith("An error occurred while calling"):
        lines = lines[1:]
    return f"{type(exc).__name__}: {lines[0][:500] if lines else ''}"


def retryable(exc: BaseException) -> bool:
    """Whether a stage that failed with ``exc`` starts again in its driver: not on a lease lost otherwise
    than with this process's session (taken over, broken) nor on a sequencer fenced out."""
    return isinstance(exc, RetryableError) and (
        isinstance(exc, SessionLostError) or not isinstance(exc, (LeaseError, StaleSequencerError)))



def store_failed(exc: BaseException, root: str, pipeline: str) -> DeltaWheelError | None:
    """The typed error when the disk or the object store of the store at ``root`` failed under ``exc``
    (None: another error)."""
    if disk_full(exc):
        return DiskFullError(f"{pipeline}: {first_line(exc)}")
    if root.startswith("s3a://"):
        from deltawheel.statestore.objectstore.errors import store_failure

        return store_failure(exc, root)
    return None
