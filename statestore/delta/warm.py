"""A standby's Delta warm-up: its takeover's claim is not the JVM's first Delta commit.

A process whose JVM never committed to Delta pays for it on the first commit: Delta's commit classes
loaded and compiled, the table's log listed and its snapshot built. For a standby that first commit
is the takeover's claim, on the failover's path (1.9 s of a 2-s acquisition, docs/continuous.md).
:func:`warm_commits` commits once to a scratch table of the process's own (a temporary folder,
removed after) while the instance stands by; :func:`refresh` keeps the JVM's snapshot of a rows table
current, so the claim reads only the commits since.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from .txn import TableLog, new_add

__all__ = ["refresh", "warm_commits"]

_LOG = logging.getLogger(__name__)
_lock = threading.Lock()
_warmed = False


def warm_commits(spark: Any) -> float | None:
    """One claim-like commit to a scratch Delta table, once per process; its seconds (None: done before).

    The scratch table is partitioned as a rows table and the commit records a partition read, as a claim
    does. A failure is logged, not raised: the takeover then pays the cost, as it would without it."""
    global _warmed
    with _lock:
        if _warmed:
            return None
        _warmed = True
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .jvm import activate

    t0 = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="deltawheel-warm-"))
    try:
        activate(spark)  # (a thread of its own)
        table = str(folder / "table")
        (spark.createDataFrame([("warm", 0, 1)], "computation string, interval int, x int")
         .write.format("delta").partitionBy("computation", "interval").save(table))
        rel = "computation=warm/interval=0/claim.parquet"
        pq.write_table(pa.table({"x": pa.array([1], pa.int32())}), f"{table}/{rel}")
        size = (folder / "table" / rel).stat().st_size
        TableLog(spark, table).commit(add=[new_add(rel, {"computation": "warm", "interval": "0"}, size, 1)],
                                      read_partitions=["computation = 'warm' AND interval = 0"],
                                      user_metadata='{"deltawheel": "warm-up"}')
    except Exception as exc:  # only a cost moved: the takeover's claim pays it
        _LOG.warning("the Delta warm-up of a standby failed (%s: %s); its takeover's claim commit will be "
                     "slower", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        return None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return time.monotonic() - t0


def refresh(spark: Any, path: str) -> int | None:
    """Bring the JVM's snapshot of the Delta table at ``path`` up to date; its version (None: failed)."""
    try:
        return TableLog(spark, path).version_now()
    except Exception as exc:  # a store not answering: the takeover reads the log itself
        _LOG.debug("refreshing the snapshot of %s failed: %s", path, exc)
        return None
