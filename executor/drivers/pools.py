"""Each live query's jobs in a FAIR scheduler pool of its own (docs/continuous.md, "Scheduler pools")."""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator

__all__ = ["POOL_PROPERTY", "SchedulerModeWarning", "in_pool", "scheduler_mode", "warn_unless_fair"]

#: The local property Spark's scheduler reads a job's pool from.
POOL_PROPERTY = "spark.scheduler.pool"


class SchedulerModeWarning(UserWarning):
    """A pipeline of several live stages runs in a session whose scheduler is not FAIR."""


@contextmanager
def in_pool(spark: Any, pool: str) -> Iterator[None]:
    """Jobs this thread submits, and the queries it starts, run in scheduler pool ``pool`` until exit."""
    sc = spark.sparkContext
    before = sc.getLocalProperty(POOL_PROPERTY)
    sc.setLocalProperty(POOL_PROPERTY, pool)
    try:
        yield
    finally:
        sc.setLocalProperty(POOL_PROPERTY, before)


def scheduler_mode(spark: Any) -> str:
    """The running session's ``spark.scheduler.mode`` (``FIFO``, Spark's default, when unset)."""
    return str(spark.sparkContext.getConf().get("spark.scheduler.mode", "FIFO")).upper()


def warn_unless_fair(mode: str, stages: int, log: Callable[[str], None] | None = None) -> bool:
    """With more than one live stage and a scheduler ``mode`` other than FAIR: a
    :class:`SchedulerModeWarning` (and the same line to ``log``); True when it warned.

    >>> warn_unless_fair("FAIR", 3), warn_unless_fair("FIFO", 1)
    (False, False)
    """
    if stages < 2 or mode.upper() == "FAIR":
        return False
    line = (f"{stages} live stages share this Spark application with spark.scheduler.mode={mode}: a stage's "
            "micro-batch jobs wait behind the others' (the first stage's latency grows with each stage beside it). "
            "Build the session with deltawheel.spark_session(), or set spark.scheduler.mode=FAIR before the "
            "session starts (docs/continuous.md, 'Scheduler pools')")
    warnings.warn(line, SchedulerModeWarning, stacklevel=4)  # the caller of start_pipeline
    if log is not None:
        log(f"warning: {line}")
    return True
