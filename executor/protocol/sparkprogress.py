"""Spark's progress under the direct read: the batch's input rows where Spark counts them.

Under the direct read (``tasks/input.py``) a batch's tasks read its input files themselves and
the micro-batch's DataFrame is never run, so Spark's ``StreamingQueryProgress.numInputRows`` (and
each source's) stayed 0 and Spark's UI and listeners showed an idle query. Spark takes that figure,
when the batch ends, from the ``numOutputRows`` metric of the leaves of the batch's executed plan
(``ProgressReporter``: a V1 source's scan node, matched to its source by position). The driver can
add to that metric (a ``SQLMetric`` is an accumulator: ``add`` on the driver changes the value Spark
reads), so after a direct-read batch :func:`show_input_rows` adds the records the tasks read to it:
nine Py4J calls per batch (the query and the position of its scan among the plan's leaves are
looked up once per query: a plan's shape is the query's), no Spark job.

The batch's query is found through the local property Spark's stream thread sets
(``sql.streaming.queryId``): ``foreachBatch`` runs on that thread, and Py4J's pinned threads run the
Python function's calls to the JVM on it too. Outside a streaming query (a test calling the
executor directly) there is no such property and nothing is done. Never fails the batch: a figure
that cannot be set is logged at debug level and left as it was.
"""

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
    """Add ``rows`` to the scan metric Spark's progress reads for the running micro-batch of the
    calling ``foreachBatch`` (module docstring); True when it was set. Nothing is added when the
    scan already counted rows (the batch's DataFrame was run after all)."""
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
    """(the query's StreamExecution, the index of the first leaf of its last executed plan with a
    ``numOutputRows`` metric: the scan), or None."""
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
    """Add ``rows`` to the ``numOutputRows`` metric of leaf ``leaf`` of ``execution``'s running
    micro-batch (raises when that leaf has none); False when it already counted rows (nothing added)."""
    last = execution.lastExecution()
    if last is None:
        return False
    metric = last.executedPlan().collectLeaves().apply(leaf).metrics().apply("numOutputRows")
    if metric.value() != 0:
        return False
    metric.add(int(rows))
    return True
