"""Every SparkSession deltawheel builds: statestore's set-up, Spark's Python workers forked from
:data:`DAEMON_MODULE` (docs/performance.md, "Python worker start")."""

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
    """statestore's ``build_spark`` with the Python workers forked from :data:`DAEMON_MODULE`."""
    if settings.python_daemon is None:
        settings = dataclasses.replace(settings, python_daemon=DAEMON_MODULE)
    return sparkenv.build_spark(settings, jars_dir=jars_dir)


def spark_session(store: str | None = None, *, app_name: str = "deltawheel", master: str | None = None,
                  **settings: Any) -> Any:
    """A SparkSession configured for deltawheel (or the running one), as :func:`deltawheel.connect` expects:
    for an ``s3a://`` ``store`` with the S3A jars and log store (docs/objectstore.md); ``settings``: more
    :class:`SparkSettings` fields. Raises JavaMissingError or JarFetchError."""
    fields: dict[str, Any] = {"app_name": app_name, **settings}
    if master is not None:
        fields["master"] = master
    if store is not None and store.startswith("s3a://"):
        fields.setdefault("object_store", True)
    return build_spark(SparkSettings(**fields))
