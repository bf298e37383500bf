"""Spark's Python daemon, preloading the task modules before it forks workers (docs/performance.md)."""

from __future__ import annotations

import gc
import os
import threading
from typing import Any, Callable

__all__ = ["choose_pool", "preload", "trim_after", "trim_heap", "POOL_ENV"]

POOL_ENV = "ARROW_DEFAULT_MEMORY_POOL"  # pyarrow's own variable: the daemon sets "system" unless it is set

PRELOAD = ("numpy", "pandas", "pyarrow", "pyarrow.compute", "pyarrow.parquet", "msgpack",
           "deltawheel.executor.tasks.image.task", "deltawheel.executor.tasks.image.direct",
           "deltawheel.executor.tasks.image.interval", "deltawheel.executor.tasks.image.ids",
           "deltawheel.statestore.writepath.image.idsfiles",
           "deltawheel.executor.tasks.usercode.columns", "deltawheel.executor.tasks.usercode.keys",
           "deltawheel.executor.tasks.usercode.keyrun", "deltawheel.executor.tasks.input",
           "deltawheel.executor.tasks.merge.task", "deltawheel.executor.tasks.worker")


def preload() -> list[str]:
    """Import :data:`PRELOAD` (those that import); returns the ones loaded."""
    import importlib

    loaded = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:
            continue
        loaded.append(name)
    return loaded


def choose_pool() -> str:
    """Arrow's allocator for the workers: ``ARROW_DEFAULT_MEMORY_POOL`` if set, else ``system``."""
    return os.environ.setdefault(POOL_ENV, "system")


def trim_heap() -> bool:
    """Return the C heap's free pages (glibc's ``malloc_trim``); False without such a call."""
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


def trim_after(worker: Callable[..., int]) -> Callable[..., int]:
    """PySpark's per-task ``daemon.worker`` function, then :func:`trim_heap`."""

    def run(*args: Any, **kwargs: Any) -> int:
        try:
            return worker(*args, **kwargs)
        finally:
            trim_heap()

    return run


if __name__ == "__main__":
    choose_pool()  # before pyarrow allocates (module docstring)
    preload()
    if threading.active_count() != 1:  # pragma: no cover - a module started a thread: fork is unsafe
        raise SystemExit("deltawheel daemon: a preloaded module started a thread; unset spark.python.daemon.module")
    from pyspark import daemon

    from .worker import freeze_spark_zips

    freeze_spark_zips()  # after every import above: each imported package of the zip has its own finder
    gc.freeze()  # after every import: the workers' collections skip what the daemon loaded (module docstring)
    daemon.worker = trim_after(daemon.worker)  # manager() calls it per task
    daemon.manager()
