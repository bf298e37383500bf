"""Spark's progress under the direct read: the batch's input rows where Spark counts them.

Under the direct read (``tasks/input.py``) a batch's tasks read its input files themselves and
the micro-batch's DataFrame is never run, so Spark's ``StreamingQueryProgress.numInputRows`` (and
each source's) stayed 0 and Spark's UI and listeners showed an idle query. Spark takes that figure,
when the batch ends, from the ``numOutputRows`` metric of the leaves of the batch's executed plan
(``ProgressReporter``: a V1 source's scan node, matched to its source by position). The driver can
add to that metric (a ``SQLMetric`` is an accumulator: ``add`` on the driver changes the value Spark
reads), so after a direct-read batch :func:`show_input_rows` adds the records the tasks read to it:
a few Py4J calls, about 3 ms per batch once warm (docs/latency.md), no Spark job.

The batch's query is found through the local property Spark's stream thread sets
(``sql.streaming.queryId``): ``foreachBatch`` runs on that thread, and Py4J's pinned threads run the
Python function's calls to the JVM on it too. Outside a streaming query (a test calling the
executor directly) there is no such property and nothing is done. Never fails the batch: a figure
that cannot be set is logged at debug level and left as it was.
"""

from __future__ import annotations

import logging
from typing import Any

from deltawheel.statestore.delta.jvm import jsession

__all__ = ["QUERY_ID_PROPERTY", "show_input_rows"]

QUERY_ID_PROPERTY = "sql.streaming.queryId"
_LOG = logging.getLogger(__name__)


def show_input_rows(spark: Any, rows: int) -> bool:
    """Add ``rows`` to the scan metric Spark's progress reads for the running micro-batch of the
    calling ``foreachBatch`` (module docstring); True when it was set. Nothing is added when the
    scan already counted rows (the batch's DataFrame was run after all)."""
    try:
        query_id = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id or rows <= 0:
            return False
        query = jsession(spark).streams().get(query_id)
        if query is None:
            return False
        execution = query.streamingQuery().lastExecution()
        if execution is None:
            return False
        leaves = execution.executedPlan().collectLeaves()
        for i in range(leaves.size()):
            metric = leaves.apply(i).metrics().get("numOutputRows")
            if metric.isDefined():
                if metric.get().value() != 0:
                    return False
                metric.get().add(int(rows))
                return True
    except Exception as exc:  # a figure for Spark's UI never fails a batch
        _LOG.debug("could not show %d input rows in Spark's progress: %s: %s", rows, type(exc).__name__, exc)
    return False
