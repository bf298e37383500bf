"""Per-task overhead of PySpark's Python workers that deltawheel's tasks remove.

PySpark runs ``importlib.invalidate_caches()`` at the start of a task
(``pyspark.worker_util.setup_spark_files``): before every task up to pyspark 4.0,
since 4.2 only when the task adds an entry to ``sys.path`` (a fresh worker's first
task, or new ``pyFiles``). On Python 3.11 a
``zipimporter``'s ``invalidate_caches`` re-reads its whole archive directory,
and the workers import pyspark from ``$SPARK_HOME/python/lib/pyspark.zip``
(1,200 files): one zipimporter per imported subpackage, so every task re-read
that directory ~16 times — 0.25-0.3 s per task, measured on a trivial
two-task job on pyspark 4.0 (0.35-0.4 s -> 0.1 s). That was per Python stage,
i.e. per micro-batch; on pyspark 4.2 one invalidation with the archives unfrozen
costs ~170 ms, frozen 0.1 ms (docs/versions.md).

:func:`freeze_spark_zips` wraps the finders of Spark's own archives
(``pyspark.zip``, ``py4j-*-src.zip`` and the ``spark-core_*.jar`` that Spark
also puts on the workers' path, 15 MB; they never change while a worker
lives) so that invalidation skips them; everything else (user ``pyFiles``
zips, folders) is invalidated as before. The task functions call it first
thing; the task that runs it pays one last re-read, the following ones none. (deltawheel's
daemon, ``daemon.py``, freezes them before it forks, so that even a fresh worker's first task
skips the re-read.)

:func:`warm_workers` starts one trivial Python task per task slot in a background thread, so that
the Python workers are forked (and their first-task costs paid) while the driver is still taking
leases and planning its first query, not on the first micro-batch.

:func:`one_worker_pool` gives the session's RDD tasks (the image path's direct and timers-only
tasks) the environment Spark gives its SQL Python tasks (``mapInArrow``: the warm-up, the shuffled
image tasks). Spark keeps one pool of Python workers (a daemon and its forked workers) per
environment, and adds ``SPARK_SIMPLIFIED_TRACEBACK=1`` to the SQL tasks' when
``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled`` is on (the default): without the
same variable on the RDD tasks, a run kept two pools (two daemons, two sets of workers, ~130 MiB
more on 2 cores) and the warm-up warmed the pool the image tasks did not use. The variable only
shortens the tracebacks of errors in user code to the user's frames.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable

__all__ = ["freeze_spark_zips", "warm_workers", "one_worker_pool"]


class _FrozenZipFinder:
    """A zipimporter whose ``invalidate_caches`` is a no-op (its archive cannot change)."""

    __slots__ = ("_finder",)

    def __init__(self, finder: Any) -> None:
        self._finder = finder

    def find_spec(self, fullname: str, target: Any = None) -> Any:
        return self._finder.find_spec(fullname, target)

    def invalidate_caches(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._finder, name)


def _is_spark_archive(path: str) -> bool:
    base = os.path.basename(path)
    return (base == "pyspark.zip" or (base.startswith("py4j-") and base.endswith("-src.zip"))
            # Spark puts the jar it runs from on the workers' path (spark-core_*.jar, ~15 MB,
            # thousands of entries: the costliest re-read of all)
            or (base.startswith("spark-core_") and base.endswith(".jar")))


def freeze_spark_zips() -> int:
    """Wrap the path finders of Spark's own zip archives; returns how many were wrapped now."""
    import zipimport

    n = 0
    cache = sys.path_importer_cache
    for key, finder in list(cache.items()):
        if isinstance(finder, zipimport.zipimporter) and _is_spark_archive(finder.archive):
            cache[key] = _FrozenZipFinder(finder)
            n += 1
    return n


def _warm_task(batches: Any) -> Any:
    freeze_spark_zips()
    for _ in batches:
        pass
    return iter(())


_TRACEBACK_CONF = "spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled"


_MATCHED: set[int] = set()  # the contexts' environments already matched (a py4j call saved per batch)


def one_worker_pool(spark: Any, *, again: bool = False) -> None:
    """Make the RDD tasks' Python environment (``SparkContext.environment``) the one Spark gives SQL's
    Python tasks, so that both run in one pool of workers (module docstring). Once per context
    unless ``again`` (the warm-up, at each run's start, reads the setting again)."""
    env = spark.sparkContext.environment
    if id(env) in _MATCHED and not again:
        return
    _MATCHED.add(id(env))
    if str(spark.conf.get(_TRACEBACK_CONF, "true")).lower() == "true":
        env["SPARK_SIMPLIFIED_TRACEBACK"] = "1"
    else:
        env.pop("SPARK_SIMPLIFIED_TRACEBACK", None)


def warm_workers(spark: Any, *, on_error: Callable[[BaseException], None] | None = None) -> threading.Thread:
    """Run one no-op ``mapInArrow`` task per default task slot in a daemon thread (started; join it
    to wait). Best effort: Spark places the tasks (on a cluster, not necessarily one per
    executor), and a failure only goes to ``on_error`` — the real tasks fork their workers
    themselves."""
    slots = max(1, int(spark.sparkContext.defaultParallelism))
    one_worker_pool(spark, again=True)

    def run() -> None:
        try:
            spark.range(0, slots, 1, slots).mapInArrow(_warm_task, "id long").collect()
        except BaseException as exc:
            if on_error is not None:
                on_error(exc)

    t = threading.Thread(target=run, name="deltawheel-warm-workers", daemon=True)
    t.start()
    return t
