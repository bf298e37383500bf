"""Building a SparkSession with Delta Lake from cached jars; :func:`check_session` checks another's."""

from __future__ import annotations

import atexit
import os
import sys
import tempfile
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..delta.jvm import require_classic_session
from ..exceptions import JarFetchError, JavaMissingError, SessionConfigError, SparkConnectSessionError
from ..jars import compile_jar, ensure_delta_jars
from ..process import find_java

__all__ = ["LOG_STORE_CLASS", "SparkSettings", "ensure_log_store_jar", "ensure_commit_jar", "build_spark",
           "check_session", "missing_settings", "session_settings", "setup_jars"]

LOG_STORE_CLASS = "io.deltawheel.storage.ExclusiveLocalLogStore"
_LOG_STORE_SOURCE = Path(__file__).parent / "ExclusiveLocalLogStore.java"
_COMMIT_SOURCE = Path(__file__).parent.parent / "delta" / "TxnCommit.java"


def ensure_log_store_jar(jars_dir: Path | None = None, *, quiet: bool = False) -> Path | None:
    """The jar of deltawheel's local Delta log store (exclusive across processes); None without javac."""
    return compile_jar(_LOG_STORE_SOURCE, jars_dir, quiet=quiet)


def ensure_commit_jar(jars_dir: Path | None = None, *, quiet: bool = False) -> Path | None:
    """The jar of ``TxnCommit`` (a commit's actions in one py4j call, ``delta/txn.py``); None without javac."""
    return compile_jar(_COMMIT_SOURCE, jars_dir, quiet=quiet)


@dataclass(frozen=True, kw_only=True)
class SparkSettings:
    """How to build the session. ``master`` is e.g. ``local[2]`` or a cluster URL."""

    master: str = "local[2]"
    app_name: str = "deltawheel"
    shuffle_partitions: int = 2
    driver_memory: str = "2g"
    log_level: str = "ERROR"
    hive_support: bool = False
    # the S3A jars / Kafka connector: True fetches them, None adds them if cached, False leaves them out
    object_store: bool | None = None
    kafka: bool | None = None
    python_daemon: str | None = None  # ``spark.python.daemon.module``; None: Spark's own
    extra: Mapping[str, str] = field(default_factory=dict)


CHECKPOINT_FILE_MANAGER = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def build_spark(settings: SparkSettings = SparkSettings(), *, jars_dir: Path | None = None):  # type: ignore[no-untyped-def]
    """A new SparkSession with Delta Lake, or the running one with only ``settings.extra`` and the log level.

    Raises:
        SparkConnectSessionError: ``SPARK_REMOTE`` is set (a Spark Connect session).
        JavaMissingError: no ``java`` to start Spark with.
        JarFetchError: a jar could not be fetched or compiled.
    """
    from pyspark.sql import SparkSession

    remote = os.environ.get("SPARK_REMOTE")
    if remote:
        raise SparkConnectSessionError(
            f"SPARK_REMOTE is set ({remote}), so pyspark would build a Spark Connect session; deltawheel "
            "needs a classic SparkSession (a Connect client has no driver JVM, and deltawheel commits through "
            "Delta Lake's JVM API). Unset SPARK_REMOTE for this process (docs/embedding.md, 'Session settings')")
    if SparkSession.getActiveSession() is not None:
        # re-applying ours would change only its runtime settings (and undo the s3a checkpoint manager)
        running = SparkSession.builder.getOrCreate()
        for k, v in settings.extra.items():
            running.conf.set(k, v)
        running.sparkContext.setLogLevel(settings.log_level)
        return running
    find_java(JavaMissingError)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    jars = ensure_delta_jars(jars_dir)
    store_jar = ensure_log_store_jar(jars_dir)
    if store_jar is not None:
        jars.append(store_jar)
    s3_jars = _object_store_jars(settings.object_store)
    jars += s3_jars
    manager = None if s3_jars or store_jar is None else _checkpoint_manager_jar()
    if manager is not None:  # local checkpoint files without Hadoop's forked chmod (docs/performance.md)
        jars.append(manager)
    if store_jar is not None and (commits := ensure_commit_jar(jars_dir, quiet=True)) is not None:
        jars.append(commits)  # a commit in one py4j call (statestore/delta/TxnCommit.java)
    if settings.kafka is not False:  # Spark's Kafka connector (docs/sources.md)
        from .connectors import ensure_kafka_jars, kafka_jars_present

        jars += ensure_kafka_jars() if settings.kafka else kafka_jars_present()
    warehouse = Path(tempfile.gettempdir()) / f"deltawheel-warehouse-{os.getpid()}"
    builder = (
        SparkSession.builder.master(settings.master)
        .appName(settings.app_name)
        .config("spark.jars", ",".join(str(j) for j in jars))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.databricks.delta.snapshotPartitions", "2")
        # no file list in the .crc: outside UTC Delta verifies it at every commit (docs/performance.md)
        .config("spark.databricks.delta.allFilesInCrc.enabled", "false")
        # no deletion-vector counts in the .crc: while a checksum lacks them Delta derives the next one
        # from a full state reconstruction (a Spark job) at every commit (docs/performance.md)
        .config("spark.databricks.delta.checksumDVMetrics.enabled", "false")
        # VACUUM lists the table folder in this many tasks (the default 10,000 is slow)
        .config("spark.sql.sources.parallelPartitionDiscovery.parallelism",
                str(max(8, settings.shuffle_partitions)))
        .config("spark.sql.session.timeZone", "UTC")
        # live queries of one application share the cores: each in its pool (executor/drivers/pools.py)
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        # streaming checkpoint files through Hadoop's FileSystem API, faster than FileContext
        # (docs/performance.md); exactly-once does not rest on their atomicity (docs/fencing.md)
        .config("spark.sql.streaming.checkpointFileManagerClass", CHECKPOINT_FILE_MANAGER)
    )
    if manager is not None:
        from ..objectstore.logstore import DIRECT_CHECKPOINT_MANAGER_CLASS

        builder = builder.config("spark.sql.streaming.checkpointFileManagerClass", DIRECT_CHECKPOINT_MANAGER_CLASS)
    if settings.python_daemon is not None:
        builder = builder.config("spark.python.daemon.module", settings.python_daemon)
    if store_jar is not None:  # commits to local tables: put-if-absent across processes
        builder = builder.config("spark.delta.logStore.file.impl", LOG_STORE_CLASS)
    if s3_jars:  # commits to s3a:// tables: arbitrated by ZooKeeper across processes
        from ..objectstore.logstore import (
            DIRECT_CHECKPOINT_MANAGER_CLASS,
            S3A_CONF,
            ZK_LOG_STORE_CLASS,
        )

        builder = builder.config("spark.delta.logStore.s3a.impl", ZK_LOG_STORE_CLASS)
        # checkpoint files on s3a:// written in place, one PUT (docs/objectstore.md); local ones unforked
        builder = builder.config("spark.sql.streaming.checkpointFileManagerClass", DIRECT_CHECKPOINT_MANAGER_CLASS)
        for key, value in S3A_CONF.items():  # settings.extra may replace them
            builder = builder.config(key, value)
    if settings.hive_support:
        builder = builder.config("spark.sql.catalogImplementation", "hive").config(
            "spark.hadoop.javax.jdo.option.ConnectionURL",
            f"jdbc:derby:memory:deltawheel-{os.getpid()};create=true",
        )
    conf = {**_object_store_conf(), **settings.extra}
    from .cds import driver_java_options

    options = driver_java_options(conf.get("spark.driver.extraJavaOptions"))  # the class-data archive (cds.py)
    if options is not None:
        conf["spark.driver.extraJavaOptions"] = options
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.log_level)
    atexit.register(_remove_if_empty, warehouse)
    return spark


def setup_jars(*, object_store: bool = False, quiet: bool = False) -> list[Path]:
    """Fetch and build every jar (``object_store``: its jars too) into the cache now; returns them.
    Raises JarFetchError: a jar could not be fetched or compiled."""
    jars = [*ensure_delta_jars(quiet=quiet), ensure_log_store_jar(quiet=quiet), ensure_commit_jar(quiet=quiet)]
    if object_store:
        from ..objectstore import s3a
        from ..objectstore.logstore import object_store_jars

        jars += [*s3a.ensure_s3a_jars(), s3a.ensure_jar(s3a.S3PROXY_JAR, s3a.default_s3_jars_dir()),
                 *(object_store_jars(quiet=quiet) or [])]
    return [j for j in jars if j is not None]


def _conf(spark: Any, key: str) -> str | None:
    """A setting of a running session: its SparkConf (static settings), else its SQL conf."""
    value = spark.sparkContext.getConf().get(key, None)
    return str(value) if value is not None else (None if (v := spark.conf.get(key, None)) is None else str(v))


def session_settings(store: str) -> dict[str, str]:
    """The settings a session needs for a store at ``store`` (a local folder or URI).

    >>> sorted(session_settings("s3a://bucket/store"))
    ['spark.delta.logStore.s3a.impl', 'spark.sql.catalog.spark_catalog', 'spark.sql.extensions']
    """
    from ..objectstore.logstore import ZK_LOG_STORE_CLASS

    want = {"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog"}
    scheme = store.split("://", 1)[0] if "://" in store else "file"
    if scheme == "file":
        want["spark.delta.logStore.file.impl"] = LOG_STORE_CLASS
    elif scheme == "s3a":
        want["spark.delta.logStore.s3a.impl"] = ZK_LOG_STORE_CLASS
    return want


def missing_settings(have: Mapping[str, str | None], store: str) -> list[str]:
    """``key=value (it is ...)`` for each of :func:`session_settings` that ``have`` lacks.

    >>> missing_settings({"spark.sql.extensions": "a.B"}, "s3a://b/s")[0]
    'spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension (it is a.B)'
    """
    want = session_settings(store)
    now = {key: have.get(key) or "" for key in want}
    return [f"{key}={value}" + (f" (it is {now[key]})" if now[key] else " (unset)")
            for key, value in want.items() if value not in [v.strip() for v in now[key].split(",")]]


def check_session(spark: Any, store: str) -> None:
    """Check that ``spark`` has what deltawheel needs for a store at ``store`` (a local folder or URI).
    Raises SparkConnectSessionError, or SessionConfigError naming every missing setting and its fix."""
    require_classic_session(spark)
    missing = missing_settings({k: _conf(spark, k) for k in session_settings(store)}, store)
    if not missing:
        return
    jars = "the Delta jars and deltawheel's log store jar"
    if store.startswith("s3a://"):
        jars += ", the S3A jars and deltawheel's s3a log store jar"
    raise SessionConfigError(
        f"the SparkSession lacks settings deltawheel needs for the store {store}: {'; '.join(missing)}. "
        f"Build the session with deltawheel.spark_session(store={store!r}) (module "
        f"deltawheel.executor.session), or set these before the session starts, with {jars} "
        f"from deltawheel.statestore.session.sparkenv.setup_jars() in spark.jars (docs/embedding.md, "
        f"'Session settings')")


def _checkpoint_manager_jar() -> Path | None:
    """deltawheel's checkpoint file manager (local files written without forking ``chmod``), if compiled."""
    from ..objectstore.logstore import ensure_checkpoint_manager_jar

    return ensure_checkpoint_manager_jar(quiet=True)


def _object_store_jars(wanted: bool | None) -> list[Path]:
    """The S3A jars for ``SparkSettings.object_store`` (docs/objectstore.md)."""
    if wanted is False:
        return []
    from ..objectstore.logstore import object_store_jars
    from ..objectstore.s3a import ensure_s3a_jars, s3a_jars_present

    jars = ensure_s3a_jars() if wanted else s3a_jars_present()
    if not jars:
        return []
    ours = object_store_jars()
    if ours is None and wanted:  # no javac: no object-store tables, not unsafe commits
        raise JarFetchError("object-store tables need deltawheel's log store for s3a://, compiled with "
                            "javac: install a JDK (17+) or build the session with "
                            "SparkSettings(object_store=None)")
    return [] if ours is None else [*jars, *ours]


def _object_store_conf() -> dict[str, str]:
    """S3A settings from ``$DELTAWHEEL_S3_ENDPOINT``, the log store's ZooKeeper from ``$DELTAWHEEL_ZK``."""
    from ..objectstore.logstore import log_store_settings
    from ..objectstore.s3a import endpoint_from_env, spark_conf

    endpoint = endpoint_from_env()
    conf = spark_conf(endpoint) if endpoint is not None else {}
    zk = os.environ.get("DELTAWHEEL_ZK")
    if zk:
        chroot = os.environ.get("DELTAWHEEL_ZK_CHROOT", "/deltawheel")
        digest = os.environ.get("DELTAWHEEL_ZK_DIGEST") or None
        conf.update({f"spark.hadoop.{k}": v
                     for k, v in log_store_settings(zk, chroot=chroot, digest=digest).items()})
    return conf


def _remove_if_empty(path: Path) -> None:
    with suppress(OSError):  # not there, or a user put tables in it: leave it
        path.rmdir()
