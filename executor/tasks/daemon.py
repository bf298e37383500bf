"""Spark's Python daemon with the task modules loaded before it forks workers.

Spark starts one daemon per executor (``python -m pyspark.daemon``) and forks a Python
worker from it for each task slot; a worker left idle for a minute is killed, and the next
batch forks a fresh one. A fresh worker imports pyarrow, numpy and the image task's modules
on its first task (~0.5 s of CPU each, on every worker at once): a whole extra second on the
first batch of a query that follows a pause. ``spark.python.daemon.module`` set to this
module (``sparkenv`` does) imports them once in the daemon, so every forked worker starts
with them loaded. A module that fails to import is skipped (the worker imports it itself);
a preload that started a Python thread stops the daemon with a message naming the setting to
unset, since a fork copies only the forking thread. (numpy and pyarrow start native threads —
OpenBLAS, jemalloc's background thread — which have their own fork handlers.)

The daemon also freezes the finders of Spark's own zip archives (:func:`.worker.freeze_spark_zips`)
before it forks: PySpark's worker calls ``importlib.invalidate_caches()`` before every task, which
on Python 3.11 re-reads each archive's whole directory (~0.1–0.15 s of CPU). The task functions
freeze them too, but only once they run, so without this a fresh worker's first task paid it.

Last, the daemon moves every object it holds then into the collector's permanent generation
(``gc.freeze()``, as Python's documentation advises before forking): PySpark's daemon runs a full
``gc.collect()`` in a reused worker after every task, which otherwise walks all the preloaded
modules' ~50,000 objects each time (on the benchmark's ``medium`` batches ~9 % of a worker's CPU,
~70 ms per task on a loaded machine, beside the other task and the driver's commit), and writes
to their headers, copying the daemon's shared pages into each worker. Frozen objects are still
freed by reference counting; only a reference cycle made of them alone would stay (module-level
objects that live as long as the worker anyway).

Memory (docs/performance.md, "Memory"), three settings of the workers:

- Arrow's buffers come from the C library's allocator (``ARROW_DEFAULT_MEMORY_POOL=system``, set
  here unless the variable is set already): pyarrow's default, mimalloc, kept ~45-90 MiB more per
  worker of freed pages resident between and during tasks, for no measurable time.
- ``pandas`` is preloaded: pyarrow imports it in every worker on the first ``pa.scalar`` of a task
  (its pandas shim), ~36 MiB per worker; imported once here, the workers share its pages.
- After each task the worker returns the C heap's free pages to the system (``malloc_trim``): an
  idle worker (Spark keeps one alive for a minute,
  beside the next query's) holds its live data only, not the last task's peak.
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
