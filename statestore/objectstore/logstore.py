"""deltawheel's Delta log store for object-store tables: commits arbitrated by ZooKeeper.

Delta's default S3 log store holds its put-if-absent of ``_delta_log/N.json`` within one JVM
only: two Spark applications committing one version of a table can both succeed, the later
replacing the earlier. ``ZkS3LogStore.java`` (beside this file) follows the protocol of Delta's
external-store log stores (``BaseExternalLogStore``; its DynamoDB store is the reference) with a
ZooKeeper znode as the external entry: the writer whose ``create`` of the entry for version N
succeeds owns N; everyone else gets ``FileAlreadyExistsException`` and Delta retries on N+1
after checking conflicts. A writer that dies between writing its temporary file and completing
the entry is finished by the next writer or reader.

ZooKeeper SUSPENDED / LOST: the store's Curator client retries (exponential back-off, 5 tries)
and waits up to 30 s for a connection; a commit that cannot create its entry fails with nothing
committed, and Delta's caller sees an ``IOException`` (the batch fails and is retried). An entry
created before the session was lost stays (it is persistent, not ephemeral), so a commit is
never half-owned.

It is compiled once with ``javac`` like the local store (:func:`ensure_zk_log_store_jar`) and
registered for ``s3a://`` by ``build_spark`` (``spark.delta.logStore.s3a.impl``) when the S3A
jars are on the classpath. Its ZooKeeper is set per session with :func:`configure_log_store`.
"""

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
DIGEST_KEY = "deltawheel.logstore.zk.digestSecret"  # "secret": Spark redacts it in its UI and logs
_SOURCE = Path(__file__).with_name("ZkS3LogStore.java")
# Spark's checkpoint file manager for s3a:// paths (writes in place, no rename): ``build_spark``
# sets it whenever the S3A jars are on the classpath (docs/objectstore.md, "Checkpoint files")
DIRECT_CHECKPOINT_MANAGER_CLASS = "io.deltawheel.storage.DirectCheckpointFileManager"
_CHECKPOINT_SOURCE = Path(__file__).with_name("DirectCheckpointFileManager.java")


def ensure_zk_log_store_jar(jars_dir: Path | None = None, *, quiet: bool = False) -> Path | None:
    """The compiled jar of ``ZkS3LogStore.java`` (None, with a warning, when there is no javac)."""
    return compile_jar(_SOURCE, jars_dir, quiet=quiet)


def ensure_checkpoint_manager_jar(jars_dir: Path | None = None, *, quiet: bool = False) -> Path | None:
    """The compiled jar of ``DirectCheckpointFileManager.java`` (None, with a warning, when there
    is no javac)."""
    return compile_jar(_CHECKPOINT_SOURCE, jars_dir, quiet=quiet)


def log_store_settings(hosts: str, *, chroot: str = "/deltawheel", digest: str | None = None) -> dict[str, str]:
    """Hadoop settings that point the log store at ZooKeeper ``hosts``; its entries live below
    ``<chroot>/delta-log`` (the chroot of the pipelines' ZkConfig). ``digest`` (``user:password``,
    the ZkConfig's): the entries carry a digest ACL, all rights to that user and read to everyone,
    as the lease znodes; a process without it cannot commit to the tables they guard."""
    namespace = f"{chroot.strip('/')}/delta-log".lstrip("/")
    out = {CONNECT_KEY: hosts, NAMESPACE_KEY: namespace}
    if digest:
        out[DIGEST_KEY] = digest
    return out


def configure_log_store(spark: Any, hosts: str, *, chroot: str = "/deltawheel", digest: str | None = None) -> None:
    """Point the object-store log store of a running session at ZooKeeper ``hosts``.

    Every process that commits to one table must use the same ZooKeeper, chroot and digest: that
    is what makes their commits exclusive.
    """
    from ..delta.jvm import jcontext

    conf = jcontext(spark).hadoopConfiguration()
    for k, v in log_store_settings(hosts, chroot=chroot, digest=digest).items():
        spark.conf.set(k, v)  # the session's SQL conf: Delta's Hadoop configuration copies it as it is
        conf.set(k, v)
    if not digest:  # a digest set by an earlier call must not outlive it
        spark.conf.unset(DIGEST_KEY)
        conf.unset(DIGEST_KEY)
