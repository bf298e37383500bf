"""Python workers fork from deltawheel's preloading daemon (``executor/tasks/daemon.py``)."""

from __future__ import annotations

import os
import sys
from typing import Any


def _worker_facts(_i: int) -> tuple[str, bool, bool]:
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    return (spec.name if spec is not None else "", "pyarrow.parquet" in sys.modules,
            "deltawheel.executor.tasks.image.interval" in sys.modules)


def test_python_workers_fork_from_the_preloading_daemon(spark: Any) -> None:
    from deltawheel.executor.session import DAEMON_MODULE

    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == DAEMON_MODULE
    # a plain RDD task imports neither pyarrow nor the image task's modules itself
    got = spark.sparkContext.parallelize(range(2), 2).map(_worker_facts).collect()
    assert got == [(DAEMON_MODULE, True, True)] * 2


def test_every_preloaded_module_imports() -> None:
    from deltawheel.executor.tasks import daemon as _daemon

    assert _daemon.preload() == list(_daemon.PRELOAD)  # a renamed module would be skipped silently


def _unfrozen_spark_zips(_i: int) -> list[str]:
    import zipimport

    from deltawheel.executor.tasks.worker import _is_spark_archive

    return [k for k, f in sys.path_importer_cache.items()
            if isinstance(f, zipimport.zipimporter) and _is_spark_archive(f.archive)]


def test_workers_start_with_the_spark_zip_finders_frozen(spark: Any) -> None:
    # PySpark invalidates the import caches before every task; a finder of pyspark.zip left
    # unfrozen re-reads the whole archive directory there (Python 3.11). A plain RDD task does not
    # freeze them itself: only the daemon (after all of its imports) can have done it.
    got = spark.sparkContext.parallelize(range(2), 2).map(_unfrozen_spark_zips).collect()
    assert got == [[], []]


def test_warm_workers_runs_a_python_task_per_slot(spark: Any) -> None:
    from deltawheel.executor.tasks.worker import warm_workers

    errors: list[BaseException] = []
    before = set(spark.sparkContext.statusTracker().getJobIdsForGroup())
    t = warm_workers(spark, on_error=errors.append)
    t.join(120)
    assert not t.is_alive() and errors == []
    jobs = set(spark.sparkContext.statusTracker().getJobIdsForGroup()) - before
    stages = [s for j in jobs for s in (spark.sparkContext.statusTracker().getJobInfo(j).stageIds or [])]
    tasks = sum(spark.sparkContext.statusTracker().getStageInfo(s).numCompletedTasks for s in stages
                if spark.sparkContext.statusTracker().getStageInfo(s) is not None)
    assert tasks == spark.sparkContext.defaultParallelism


def _daemon_pid(_i: Any) -> int:
    import os

    return os.getppid()  # a worker is forked by its pool's daemon


def _daemon_pids_arrow(batches: Any) -> Any:
    import os

    import pyarrow as pa

    for _b in batches:
        pass
    yield pa.RecordBatch.from_pydict({"pid": [os.getppid()]})


def test_rdd_and_sql_python_tasks_share_one_worker_pool(spark: Any) -> None:
    # Spark keeps a pool of Python workers (a daemon and its forks) per task environment, and gives
    # its SQL Python tasks (mapInArrow: the warm-up, the shuffled image tasks) a variable the RDD
    # tasks (the direct and timers-only image tasks) lack: two pools, the warm-up warming the other
    from deltawheel.executor.tasks.worker import one_worker_pool

    sc = spark.sparkContext
    sc.environment.pop("SPARK_SIMPLIFIED_TRACEBACK", None)
    sql = set(r.pid for r in spark.range(0, 2, 1, 2).mapInArrow(_daemon_pids_arrow, "pid long").collect())
    apart = set(sc.parallelize(range(2), 2).map(_daemon_pid).collect())
    assert len(sql) == 1 and sql.isdisjoint(apart)  # without the match: another daemon
    one_worker_pool(spark, again=True)
    assert set(sc.parallelize(range(2), 2).map(_daemon_pid).collect()) == sql


def _worker_memory_facts(_i: int) -> tuple[str, bool, str]:
    import pyarrow as pa

    trims = getattr(sys.modules["pyspark.daemon"], "worker", None)
    return (pa.default_memory_pool().backend_name, "pandas" in sys.modules, getattr(trims, "__qualname__", ""))


def test_workers_allocate_arrow_from_the_c_heap_share_pandas_and_trim_after_each_task(spark: Any) -> None:
    # a plain RDD task imports neither pandas nor pyarrow's pools itself: what it sees is the daemon's
    got = spark.sparkContext.parallelize(range(2), 2).map(_worker_memory_facts).collect()
    assert got == [("system", True, "trim_after.<locals>.run")] * 2


def test_the_arrow_pool_is_the_c_heap_unless_the_user_chose_one(monkeypatch: Any) -> None:
    from deltawheel.executor.tasks.daemon import POOL_ENV, choose_pool

    monkeypatch.delenv(POOL_ENV, raising=False)
    assert choose_pool() == "system" and os.environ[POOL_ENV] == "system"
    monkeypatch.setenv(POOL_ENV, "mimalloc")
    assert choose_pool() == "mimalloc"


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))


def test_trim_heap_returns_the_c_heaps_free_pages() -> None:
    import ctypes

    from deltawheel.executor.tasks.daemon import trim_after

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def freed_block() -> list[int]:
        # 128 MiB in 64 KiB chunks (under malloc's mmap threshold: on the heap), touched; every
        # other one freed: 64 MiB of free holes between live chunks, which free() cannot give back
        chunks = [libc.malloc(64 * 1024) for _ in range(2048)]
        for c in chunks:
            ctypes.memset(c, 1, 64 * 1024)
        for c in chunks[::2]:
            libc.free(c)
        return chunks[1::2]

    pinned = freed_block()
    held = _rss_anon_kib()  # free() kept the holes between live chunks
    calls: list[int] = []
    assert trim_after(lambda *a: calls.append(len(a)) or 0)(1, 2) == 0 and calls == [2]
    assert _rss_anon_kib() < held - 32 * 1024  # at least half of the freed 64 MiB went back
    for c in pinned:
        libc.free(c)
