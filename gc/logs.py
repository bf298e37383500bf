"""Delta log maintenance for ``deltawheel gc``: a checkpoint at the newest version, and log cleanup.

A table's ``_delta_log`` gains a JSON commit (and its ``.crc``) per commit. Readers start at the
newest checkpoint, so what lies before it is only needed to read older versions (time travel,
which ``deltawheel replay`` and ``history`` use). Delta removes such files itself when it writes a
checkpoint, past ``delta.logRetentionDuration`` (30 days by default). gc:

* **checkpoints** each table at its newest version when the newest checkpoint is behind it
  (Delta's own ``DeltaLog.checkpoint``, the call the background checkpointer makes; a checkpoint
  appears whole or not at all, and a second writer of the same file writes the same actions);
* with a **log retention** (``--log-retention-hours``), deletes the log files (commits, their
  checksums, checkpoints) of versions before the newest checkpoint whose commit is older than the
  retention, as Delta's own cleanup does, on local tables: versions before that checkpoint can no
  longer be read, which is the replay horizon gc reports.
"""

from __future__ import annotations

import os
import re
from typing import Any

from deltawheel.statestore.delta.checkpoints import newest_checkpoint
from deltawheel.statestore.delta.jvm import jsession
from deltawheel.statestore.delta.jvm import jvm as jvm_of
from deltawheel.statestore.delta.log import local_path

__all__ = ["checkpoint_newest", "clean_log", "log_entries"]

_VERSIONED = re.compile(r"^(\d{20})\.")  # a commit, its .crc, a checkpoint (of any kind), a compaction


def _log_dir(path: str) -> str | None:
    local = local_path(path)
    return None if local is None else os.path.join(local, "_delta_log")


def log_entries(path: str) -> int:
    """How many versioned files a local table's ``_delta_log`` holds (commits, checksums,
    checkpoints); -1 for a table not on the local file system."""
    folder = _log_dir(path)
    if folder is None:
        return -1
    return sum(1 for n in os.listdir(folder) if _VERSIONED.match(n))


def checkpoint_newest(spark: Any, path: str) -> int | None:
    """Checkpoint the table at ``path`` at its newest version unless its newest checkpoint is that
    version; returns the version checkpointed (None: it was already)."""
    version = int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["version"])
    folder = _log_dir(path)
    if folder is not None:
        cp, _ok = newest_checkpoint(os.listdir(folder))
        if cp is not None and cp.version >= version:
            return None
    jvm = jvm_of(spark)
    none = jvm.scala.Option.empty()
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(jsession(spark), path)
    log.checkpoint(log.getSnapshotAt(version, none, none, False), none)
    return version


def clean_log(path: str, *, cutoff_s: float, apply: bool) -> tuple[int, int | None]:
    """(log files of versions before the newest checkpoint whose commit is older than ``cutoff_s``
    (epoch seconds): deleted with ``apply``, else counted; that checkpoint's version, the oldest
    version readable afterwards, None: no such checkpoint). Local tables only ((0, None) else)."""
    folder = _log_dir(path)
    if folder is None:
        return 0, None
    names = os.listdir(folder)

    def committed_s(version: int) -> float:
        try:
            return os.path.getmtime(os.path.join(folder, f"{version:020d}.json"))
        except OSError:  # its commit is gone already (cleaned): the checkpoint's own time
            return min(os.path.getmtime(os.path.join(folder, n)) for n in names
                       if n.startswith(f"{version:020d}."))

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
    doomed = [n for n in names if (m := _VERSIONED.match(n)) and int(m.group(1)) < keep_from]
    if apply:
        for n in doomed:
            for name in (n, f".{n}.crc"):  # the file, and the local file system's checksum beside it
                try:
                    os.remove(os.path.join(folder, name))
                except FileNotFoundError:
                    pass
    return len(doomed), keep_from
