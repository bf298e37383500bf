"""deltawheel's Delta log store for object-store tables: commits arbitrated by ZooKeeper.

``ZkS3LogStore.java`` follows Delta's ``BaseExternalLogStore`` with a znode as the entry: whoever
creates the entry for version N owns N. ZooKeeper SUSPENDED / LOST: its Curator client retries;
a commit that cannot create its entry fails with nothing committed. Entries are persistent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..jars import compile_jar

__all__ = ["ZK_LOG_STORE_CLASS", "DIRECT_CHECKPOINT_MANAGER_CLASS", "ensure_zk_log_store_jar",
           "ensure_checkpoint_manager_jar", "configure_log_store", "log_store_settings",
           "CONNECT_KEY", "NAMESPACE_KEY", "DIGEST_KEY"]

ZK_LOG_STORE_CLASS = "io.deltawheel.storage.ZkS3LogStore"
CONNECT_KEY = "deltawheel.logstore.zk.connect"
NAMESPACE_KEY = "deltawheel.logstore.zk.namespace"
DIGEST_KEY = "deltawheel.logstore.zk.digestSecret"  # "secret": Spark redacts it
_SOURCE = Path(__file__).with_name("ZkS3LogStore.java")
# Spark's checkpoint file manager for s3a:// paths, writing in place (docs/objectstore.md)
DIRECT_CHECKPOINT_MANAGER_CLASS = "io.deltawheel.storage.DirectCheckpointFileManager"
_CHECKPOINT_SOURCE = Path(__file__).with_name("DirectCheckpointFileManager.java")


def ensure_zk_log_store_jar(jars_dir: Path | None = None, *, quiet: bool = False) -> Path | None:
    """The compiled jar of ``ZkS3LogStore.java`` (None, with a warning, when there is no javac)."""
    return compile_jar(_SOURCE, jars_dir, quiet=quiet)


def ensure_checkpoint_manager_jar(jars_dir: Path | None = None, *, quiet: bool = False) -> Path | None:
    """The compiled jar of ``DirectCheckpointFileManager.java`` (None when there is no javac)."""
    return compile_jar(_CHECKPOINT_SOURCE, jars_dir, quiet=quiet)


def log_store_settings(hosts: str, *, chroot: str = "/deltawheel", digest: str | None = None) -> dict[str, str]:
    """Hadoop settings for the log store's ZooKeeper ``hosts`` (``digest``: ACL the entries)."""
    namespace = f"{chroot.strip('/')}/delta-log".lstrip("/")
    out = {CONNECT_KEY: hosts, NAMESPACE_KEY: namespace}
    if digest:
        out[DIGEST_KEY] = digest
    return out


def configure_log_store(spark: Any, hosts: str, *, chroot: str = "/deltawheel", digest: str | None = None) -> None:
    """Point a running session's log store at ZooKeeper ``hosts`` (the same for all of a table's writers)."""
    from ..delta.jvm import jcontext

    conf = jcontext(spark).hadoopConfiguration()
    for k, v in log_store_settings(hosts, chroot=chroot, digest=digest).items():
        spark.conf.set(k, v)
        conf.set(k, v)
    if not digest:  # a digest set by an earlier call must not outlive it
        spark.conf.unset(DIGEST_KEY)
        conf.unset(DIGEST_KEY)
