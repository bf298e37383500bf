"""Spark's progress under the direct read: the batch's input rows where Spark counts them."""

from __future__ import annotations

import logging
import threading
from typing import Any

from deltawheel.statestore.delta.jvm import jsession

__all__ = ["QUERY_ID_PROPERTY", "show_input_rows"]

QUERY_ID_PROPERTY = "sql.streaming.queryId"
_LOG = logging.getLogger(__name__)
_QUERIES_KEPT = 8  # the queries whose stream execution and scan leaf are remembered (each holds its last plan)
# query id (unique in the JVM) -> (the query's StreamExecution, its scan's leaf index)
_queries: dict[str, tuple[Any, int]] = {}
_lock = threading.Lock()


def show_input_rows(spark: Any, rows: int) -> bool:
    """Add ``rows`` to the scan metric of the calling ``foreachBatch``'s micro-batch; True when set."""
    try:
        query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id or rows <= 0:
            return False
        known = _queries.get(str(query_id))
        if known is not None:
            try:
                return _add(*known, rows)
            except Exception:  # (a plan of another shape: the scan is looked up again)
                pass
        found = _find(jsession(spark), str(query_id))
        if found is None:
            return False
        with _lock:
            while len(_queries) >= _QUERIES_KEPT:
                _queries.pop(next(iter(_queries)))
            _queries[str(query_id)] = found
        return _add(*found, rows)
    except Exception as exc:  # a figure for Spark's UI never fails a batch
        _LOG.debug("could not show %d input rows in Spark's progress: %s: %s", rows, type(exc).__name__, exc)
    return False


def _find(session: Any, query_id: str) -> tuple[Any, int] | None:
    """(the query's StreamExecution, the index of its scan leaf), or None."""
    query = session.streams().get(query_id)
    if query is None:
        return None
    execution = query.streamingQuery()
    last = execution.lastExecution()
    if last is None:
        return None
    leaves = last.executedPlan().collectLeaves()
    for i in range(leaves.size()):
        if leaves.apply(i).metrics().contains("numOutputRows"):
            return execution, i
    return None


def _add(execution: Any, leaf: int, rows: int) -> bool:
    """Add ``rows`` to leaf ``leaf``'s ``numOutputRows``; False when it already counted rows."""
    last = execution.lastExecution()
    if last is None:
        return False
    metric = last.executedPlan().collectLeaves().apply(leaf).metrics().apply("numOutputRows")
    if metric.value() != 0:
        return False
    metric.add(int(rows))
    return True
