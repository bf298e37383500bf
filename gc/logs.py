"""gc's Delta log maintenance: a checkpoint at the newest version, and (local, ``s3a://``) deleting the files
before the newest checkpoint older than the retention, which never races a writer: writers add after it."""

from __future__ import annotations

import re
from typing import Any

from deltawheel.statestore.delta.checkpoints import newest_checkpoint
from deltawheel.statestore.delta.jvm import jsession
from deltawheel.statestore.delta.jvm import jvm as jvm_of
from deltawheel.statestore.delta.log import read_snapshot
from deltawheel.statestore.delta.storefs import TableFiles, files_for, table_files

__all__ = ["checkpoint_newest", "clean_log", "log_entries", "log_files"]

_VERSIONED = re.compile(r"^(\d{20})\.")  # a commit, its .crc, a checkpoint (of any kind), a compaction


def log_files(path: str, spark: Any | None = None) -> TableFiles | None:
    """The ``_delta_log`` folder of the table at ``path`` (None: a scheme the file seam does not reach)."""
    files = table_files(spark, path) if spark is not None else files_for(path)
    return None if files is None else files.sub("_delta_log")


def log_entries(path: str, spark: Any | None = None) -> int:
    """How many versioned files a table's ``_delta_log`` holds; -1 where the file seam does not reach."""
    if (folder := log_files(path, spark)) is None:
        return -1
    return sum(1 for n in folder.listdir() or [] if _VERSIONED.match(n))


def checkpoint_newest(spark: Any, path: str) -> int | None:
    """Checkpoint the table at its newest version if not done; the version checkpointed (None: it was)."""
    snap = read_snapshot(files) if (files := table_files(spark, path)) is not None else None
    version = snap.version if snap is not None else int(
        spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["version"])
    if files is not None:
        cp, _ok = newest_checkpoint(files.sub("_delta_log").listdir() or [])
        if cp is not None and cp.version >= version:
            return None
    jvm = jvm_of(spark)
    none = jvm.scala.Option.empty()
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(jsession(spark), path)
    log.checkpoint(log.getSnapshotAt(version, none, none, False), none)
    return version


def clean_log(path: str, *, cutoff_s: float, apply: bool, spark: Any | None = None) -> tuple[int, int | None]:
    """(log files before the newest checkpoint older than ``cutoff_s``, that checkpoint's version or None):
    deleted with ``apply``, else counted; (0, None) for a scheme the file seam does not reach."""
    if (folder := log_files(path, spark)) is None:
        return 0, None
    mtimes = {name: mtime_ns / 1e9 for name, _size, mtime_ns in folder.list_files() or []}  # epoch seconds
    names = list(mtimes)

    def committed_s(version: int) -> float:
        commit = f"{version:020d}.json"
        if commit in mtimes:
            return mtimes[commit]
        # its commit is gone already (cleaned): the checkpoint's own time
        return min(t for n, t in mtimes.items() if n.startswith(f"{version:020d}."))

    old = [n for n in names if _VERSIONED.match(n) and ".checkpoint." in n]
    versions = sorted({int(n[:20]) for n in old}, reverse=True)
    keep_from = None
    for v in versions:  # the newest complete checkpoint committed before the cutoff
        cp, _ok = newest_checkpoint([n for n in old if int(n[:20]) == v])
        if cp is not None and committed_s(v) <= cutoff_s:
            keep_from = v
            break
    if keep_from is None:
        return 0, None
    doomed = sorted(n for n in names if (m := _VERSIONED.match(n)) and int(m.group(1)) < keep_from)
    if apply:
        for n in doomed:  # oldest first: a reader never sees a gap below a version still listed
            folder.delete(n)
    return len(doomed), keep_from
