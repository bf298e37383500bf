"""The SparkSession deltawheel runs computations on: statestore's session set-up plus the
executor's Python worker daemon.

:func:`~deltawheel.statestore.session.sparkenv.build_spark` configures Delta Lake, the jars and
the log stores; what it cannot know is the executor's: Spark's Python workers fork from
:data:`DAEMON_MODULE` (``executor/tasks/daemon.py``), which imports pyarrow, numpy and the task
modules before it forks, so a worker replacing one killed after a minute idle does not pay
~0.5 s of imports on its first task (docs/performance.md, "Python worker start"). Every
session deltawheel builds -- the CLI, :func:`deltawheel.spark_session`, the windowing harness,
the tests and benchmarks -- is built here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from deltawheel.statestore.session import sparkenv
from deltawheel.statestore.session.sparkenv import SparkSettings

__all__ = ["DAEMON_MODULE", "build_spark", "spark_session"]

#: The module Spark's Python workers fork from (``spark.python.daemon.module``).
DAEMON_MODULE = "deltawheel.executor.tasks.daemon"


def build_spark(settings: SparkSettings = SparkSettings(), *, jars_dir: Path | None = None) -> Any:
    """:func:`~deltawheel.statestore.session.sparkenv.build_spark` with the workers forked from
    :data:`DAEMON_MODULE` (unless ``settings.python_daemon`` names another): create (or return the
    running) SparkSession with Delta Lake configured.

    Raises:
        JavaMissingError: no ``java`` to start Spark with.
        JarFetchError: a jar could not be fetched or compiled.
    """
    if settings.python_daemon is None:
        settings = dataclasses.replace(settings, python_daemon=DAEMON_MODULE)
    return sparkenv.build_spark(settings, jars_dir=jars_dir)


def spark_session(store: str | None = None, *, app_name: str = "deltawheel", master: str | None = None,
                  **settings: Any) -> Any:
    """A SparkSession configured for deltawheel, for a job that has none yet (or the running one).

    Built by :func:`build_spark`. The session :func:`deltawheel.connect` expects: Delta Lake's
    extension and catalog, the jars from the per-user cache
    (:func:`~deltawheel.statestore.jars.default_jars_dir`, fetched on first use), deltawheel's log
    store for local tables (compiled once with ``javac``), and for an ``s3a://`` ``store`` the S3A jars
    and the object-store log store (endpoint and keys from ``$DELTAWHEEL_S3_ENDPOINT`` and its
    companions, docs/objectstore.md). ``settings``: more :class:`SparkSettings` fields
    (``driver_memory``, ``shuffle_partitions``, ``extra={conf: value}``, ...).

    Raises:
        JavaMissingError: no ``java`` to start Spark with.
        JarFetchError: a jar could not be fetched or compiled.
    """
    fields: dict[str, Any] = {"app_name": app_name, **settings}
    if master is not None:
        fields["master"] = master
    if store is not None and store.startswith("s3a://"):
        fields.setdefault("object_store", True)
    return build_spark(SparkSettings(**fields))
