"""deltawheel's Delta log store for object-store tables: ``ZkS3LogStore.java``, Delta's
``BaseExternalLogStore`` with a persistent znode as the entry (whoever creates version N's owns N).
ZooKeeper SUSPENDED / LOST: its Curator client retries; a commit without its entry fails whole."""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..exceptions import ConfigError
from ..jars import compile_jar
from .s3a import set_hadoop

__all__ = ["ZK_LOG_STORE_CLASS", "DIRECT_CHECKPOINT_MANAGER_CLASS", "NO_EXPECT_CONTINUE_CLASS",
           "COMMIT_STATUS_FS_CLASS", "S3A_CONF", "ensure_zk_log_store_jar", "ensure_checkpoint_manager_jar",
           "ensure_interceptor_jar", "ensure_commit_status_fs_jar", "object_store_jars", "configure_log_store",
           "hold_log_store", "log_store_restored", "log_store_settings",
           "CONNECT_KEY", "NAMESPACE_KEY", "DIGEST_KEY"]

ZK_LOG_STORE_CLASS = "io.deltawheel.storage.ZkS3LogStore"
CONNECT_KEY = "deltawheel.logstore.zk.connect"
NAMESPACE_KEY = "deltawheel.logstore.zk.namespace"
DIGEST_KEY = "deltawheel.logstore.zk.digestSecret"  # "secret": Spark redacts it
_SOURCE = Path(__file__).with_name("ZkS3LogStore.java")
# Spark's checkpoint file manager for s3a:// paths, writing in place (docs/objectstore.md)
DIRECT_CHECKPOINT_MANAGER_CLASS = "io.deltawheel.storage.DirectCheckpointFileManager"
_CHECKPOINT_SOURCE = Path(__file__).with_name("DirectCheckpointFileManager.java")
# small uploads without Expect: 100-continue, one round trip instead of two (docs/objectstore.md)
NO_EXPECT_CONTINUE_CLASS = "io.deltawheel.storage.NoExpectContinue"
# S3A that answers the status of a commit file the log store has just written without a HEAD
COMMIT_STATUS_FS_CLASS = "io.deltawheel.storage.CommitStatusS3AFileSystem"
# the round trips these save (docs/objectstore.md, "Spark settings"): the interceptor takes the SDK's header off
# small uploads, the next setting stops the HTTP client adding its own
S3A_CONF = {"spark.hadoop.fs.s3a.audit.execution.interceptors": NO_EXPECT_CONTINUE_CLASS,
            "spark.hadoop.fs.s3a.connection.expect.continue": "false",
            "spark.hadoop.fs.s3a.impl": COMMIT_STATUS_FS_CLASS}
_INTERCEPTOR_SOURCE = Path(__file__).with_name("NoExpectContinue.java")
_COMMIT_STATUS_SOURCE = Path(__file__).with_name("CommitStatusS3AFileSystem.java")


def ensure_zk_log_store_jar(jars_dir: Path | None = None, *, quiet: bool = False) -> Path | None:
    """The compiled jar of ``ZkS3LogStore.java`` (None, with a warning, when there is no javac)."""
    return compile_jar(_SOURCE, jars_dir, quiet=quiet)


def ensure_checkpoint_manager_jar(jars_dir: Path | None = None, *, quiet: bool = False) -> Path | None:
    """The compiled jar of ``DirectCheckpointFileManager.java`` (None when there is no javac)."""
    return compile_jar(_CHECKPOINT_SOURCE, jars_dir, quiet=quiet)


def _against_s3a(source: Path, jars_dir: Path | None, quiet: bool) -> Path | None:
    from .s3a import ensure_s3a_jars

    return compile_jar(source, jars_dir, quiet=quiet, classpath=ensure_s3a_jars(quiet=quiet))


def ensure_interceptor_jar(jars_dir: Path | None = None, *, quiet: bool = False) -> Path | None:
    """The compiled jar of ``NoExpectContinue.java``, against the S3A jars (None when there is no javac)."""
    return _against_s3a(_INTERCEPTOR_SOURCE, jars_dir, quiet)


def ensure_commit_status_fs_jar(jars_dir: Path | None = None, *, quiet: bool = False) -> Path | None:
    """The compiled jar of ``CommitStatusS3AFileSystem.java``, against S3A (None when there is no javac)."""
    return _against_s3a(_COMMIT_STATUS_SOURCE, jars_dir, quiet)


def object_store_jars(*, quiet: bool = False) -> list[Path] | None:
    """deltawheel's own jars for ``s3a://`` stores (the log store, the checkpoint file manager, the
    upload interceptor, S3A with commit statuses); None when one cannot be compiled (no javac)."""
    ours = []
    for ensure in (ensure_zk_log_store_jar, ensure_checkpoint_manager_jar, ensure_interceptor_jar,
                   ensure_commit_status_fs_jar):
        if (jar := ensure(quiet=quiet)) is None:  # no javac: the others would not compile either
            return None
        ours.append(jar)
    return ours


def log_store_settings(hosts: str, *, chroot: str = "/deltawheel", digest: str | None = None) -> dict[str, str]:
    """Hadoop settings for the log store's ZooKeeper ``hosts`` (``digest``: ACL the entries)."""
    namespace = f"{chroot.strip('/')}/delta-log".lstrip("/")
    out = {CONNECT_KEY: hosts, NAMESPACE_KEY: namespace}
    if digest:
        out[DIGEST_KEY] = digest
    return out


def configure_log_store(spark: Any, hosts: str, *, chroot: str = "/deltawheel", digest: str | None = None) -> None:
    """Point a running session's log store at ZooKeeper ``hosts`` (the same for all of a table's writers)."""
    # a digest set by an earlier call must not outlive it
    set_hadoop(spark, {DIGEST_KEY: None, **log_store_settings(hosts, chroot=chroot, digest=digest)})


@contextlib.contextmanager
def log_store_restored() -> Iterator[None]:
    """The running session's log store settings as they were before the block, put back after it: a
    command run inside a process that goes on (``deltawheel.cli.main``) must not leave that process's
    commits to another arbiter. Without a session (pyspark not even imported) there is nothing to keep."""
    sql = sys.modules.get("pyspark.sql")
    spark = None if sql is None else sql.SparkSession.getActiveSession()
    if sql is None or spark is None:
        yield
        return
    from ..delta.jvm import jcontext

    conf = jcontext(spark).hadoopConfiguration()
    before = {k: conf.get(k) for k in (CONNECT_KEY, NAMESPACE_KEY, DIGEST_KEY)}
    try:
        yield
    finally:
        if sql.SparkSession.getActiveSession() is not None:  # not stopped by the block
            set_hadoop(spark, before)


@dataclass
class _Hold:
    settings: dict[str, str]
    before: dict[str, str | None]  # the session's settings when the first holder came
    count: int = 0


_HOLDS: dict[int, _Hold] = {}  # per Spark application (id of its SparkContext)
_HOLDS_LOCK = threading.Lock()


def hold_log_store(spark: Any, hosts: str, *, chroot: str = "/deltawheel",
                   digest: str | None = None) -> Callable[[], None]:
    """:func:`configure_log_store` for as long as an engine or runner is open: returns its release;
    the last release puts the settings from before back.
    Raises ConfigError: another open engine or runner of this application uses other settings (one each)."""
    want = log_store_settings(hosts, chroot=chroot, digest=digest)
    key = id(spark.sparkContext)
    with _HOLDS_LOCK:
        held = _HOLDS.get(key)
        if held is not None and held.settings != want:
            theirs, ours = (f"{h[CONNECT_KEY]} under /{h[NAMESPACE_KEY]}" for h in (held.settings, want))
            raise ConfigError(f"this Spark application commits to object stores through ZooKeeper {theirs} (an "
                              f"open engine or runner uses it); another at {ours} would leave a table's commits "
                              "without one arbiter: give every engine of one application on object-store stores "
                              "the same zk hosts, chroot and digest, or close the other first")
        if held is None:
            from ..delta.jvm import jcontext

            conf = jcontext(spark).hadoopConfiguration()
            held = _HOLDS[key] = _Hold(settings=want, before={k: conf.get(k) for k in (CONNECT_KEY, NAMESPACE_KEY,
                                                                                         DIGEST_KEY)})
            configure_log_store(spark, hosts, chroot=chroot, digest=digest)
        held.count += 1
    done = threading.Event()

    def release() -> None:
        with _HOLDS_LOCK:
            if done.is_set():
                return
            done.set()
            held.count -= 1
            if held.count == 0 and _HOLDS.get(key) is held:
                del _HOLDS[key]
                set_hadoop(spark, held.before)

    return release
