"""Spark's Python daemon with the task modules loaded before it forks workers.

``spark.python.daemon.module`` set to this module (``sparkenv`` does) makes the daemon, before
it forks a worker per task slot:

- import pyarrow, numpy, pandas and the image task's modules once, so that every forked worker
  starts with them loaded. A module that fails to import is skipped (the worker imports it
  itself); a preload that started a Python thread stops the daemon with a message naming the
  setting to unset, since a fork copies only the forking thread;
- freeze the finders of Spark's own zip archives (:func:`.worker.freeze_spark_zips`);
- move every object it holds into the collector's permanent generation (``gc.freeze()``), so
  PySpark's ``gc.collect()`` after each task skips them;
- set ``ARROW_DEFAULT_MEMORY_POOL=system`` unless the variable is set already; after each task
  the worker returns the C heap's free pages to the system (``malloc_trim``).

Why, and the figures: docs/performance.md, "Python worker start" and "Memory".
"""

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
    """Arrow's allocator for the workers: ``ARROW_DEFAULT_MEMORY_POOL`` if set, else ``system``
    (set in the environment, where pyarrow reads it when it first allocates)."""
    return os.environ.setdefault(POOL_ENV, "system")


def trim_heap() -> bool:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim``); False where there is
    no such call (another C library)."""
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


def trim_after(worker: Callable[..., int]) -> Callable[..., int]:
    """PySpark's per-task ``daemon.worker`` function, then :func:`trim_heap` (~3-4 ms of CPU on a
    worker of the benchmark's ``medium``; PySpark's own ``gc.collect()`` follows: the cycles it
    frees go back at the next task's end)."""

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
