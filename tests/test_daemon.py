"""Python workers fork from deltawheel's preloading daemon (``executor/_daemon.py``)."""

from __future__ import annotations

import sys
from typing import Any


def _worker_facts(_i: int) -> tuple[str, bool, bool]:
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    return (spec.name if spec is not None else "", "pyarrow.parquet" in sys.modules,
            "deltawheel.executor._imagetask" in sys.modules)


def test_python_workers_fork_from_the_preloading_daemon(spark: Any) -> None:
    from deltawheel.statestore.sparkenv import DAEMON_MODULE

    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == DAEMON_MODULE
    # a plain RDD task imports neither pyarrow nor the image task's modules itself
    got = spark.sparkContext.parallelize(range(2), 2).map(_worker_facts).collect()
    assert got == [(DAEMON_MODULE, True, True)] * 2


def test_every_preloaded_module_imports() -> None:
    from deltawheel.executor import _daemon

    assert _daemon.preload() == list(_daemon.PRELOAD)  # a renamed module would be skipped silently
