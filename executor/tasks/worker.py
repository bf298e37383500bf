"""Per-task overhead of PySpark's Python workers that deltawheel's tasks remove (docs/performance.md)."""

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
            # the spark-core jar on the workers' path is the costliest re-read of all
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
    """Give RDD tasks SQL's Python task environment, so one worker pool serves both."""
    env = spark.sparkContext.environment
    if id(env) in _MATCHED and not again:
        return
    _MATCHED.add(id(env))
    if str(spark.conf.get(_TRACEBACK_CONF, "true")).lower() == "true":
        env["SPARK_SIMPLIFIED_TRACEBACK"] = "1"
    else:
        env.pop("SPARK_SIMPLIFIED_TRACEBACK", None)


def warm_workers(spark: Any, *, on_error: Callable[[BaseException], None] | None = None) -> threading.Thread:
    """Run one no-op task per default task slot in a started daemon thread (best effort)."""
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
