"""Which of gc's Spark passes would change nothing, told from a table's log and a listing of its folder
without a Spark job: a store holds many small tables, and on most of them OPTIMIZE and VACUUM have
nothing to do. Each answer is exact or "unsure" (then Delta's own command runs)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any
from urllib.parse import unquote

from deltawheel.statestore.delta.log import LogSnapshot, read_snapshot
from deltawheel.statestore.delta.storefs import table_files

__all__ = ["live_files", "nothing_before", "nothing_to_compact", "nothing_to_vacuum"]


def live_files(spark: Any, path: str) -> LogSnapshot | None:
    """The table's newest version as its log says (None: not readable here)."""
    files = table_files(spark, path)
    return None if files is None else read_snapshot(files)


def nothing_to_compact(snap: LogSnapshot) -> bool:
    """True when OPTIMIZE would rewrite nothing: no partition holds two files and no file carries a
    deletion vector (Delta's bin packing leaves a bin of one file as it is, unless it has one).

    >>> nothing_to_compact(LogSnapshot(version=1, adds=({"path": "a", "partitionValues": {"i": "0"}},
    ...     {"path": "b", "partitionValues": {"i": "1"}}), configuration={}, txns={}))
    True
    >>> nothing_to_compact(LogSnapshot(version=1, adds=({"path": "a", "partitionValues": {}},
    ...     {"path": "b", "partitionValues": {}}), configuration={}, txns={}))
    False
    """
    per = Counter(tuple(sorted((a.get("partitionValues") or {}).items())) for a in snap.adds)
    return all(n <= 1 for n in per.values()) and not any(a.get("deletionVector") for a in snap.adds)


def _hidden(part: str) -> bool:
    """A name VACUUM never looks into (Delta's ``isHiddenDirectory``, taken narrowly: a partition
    folder of a column named ``_x`` and ``_change_data`` are not hidden).

    >>> [_hidden(n) for n in ("_delta_log", ".part-0.parquet.crc", "_change_data", "_c=1", "i=0")]
    [True, True, False, False, False]
    """
    return part.startswith(".") or (part.startswith("_") and "=" not in part
                                    and not part.startswith(("_change_data", "_delta_index")))


def nothing_to_vacuum(spark: Any, path: str, snap: LogSnapshot) -> bool:
    """True when every file of the table's folder that VACUUM looks at is a live file of ``snap``, so
    VACUUM would delete no file (it may still have removed empty folders); False when unsure."""
    from pyarrow import fs as pafs

    files = table_files(spark, path)
    live = {unquote(a["path"]) for a in snap.adds}
    if files is None or any(":" in p.split("/", 1)[0] or p.startswith("/") for p in live):
        return False  # a file outside the folder, named by an absolute path
    root = files.path().rstrip("/")
    for info in files.fs.get_file_info(pafs.FileSelector(root, allow_not_found=True, recursive=True)):
        rel = info.path[len(root):].lstrip("/")
        if info.type == pafs.FileType.File and not any(_hidden(p) for p in rel.split("/")) and rel not in live:
            return False
    return True


def nothing_before(snap: LogSnapshot, column: str, cutoff: int) -> bool:
    """True when no row of ``snap`` has ``column`` below ``cutoff``, by each file's statistics in the log
    (a file's minimum bounds its rows, deleted ones too); False when a file has none for ``column``.

    >>> def snap(*stats): return LogSnapshot(version=1, adds=tuple({"path": "x", "stats": s} for s in stats),
    ...                                      configuration={}, txns={})
    >>> nothing_before(snap('{"numRecords": 2, "minValues": {"t": 10}}', '{"numRecords": 0}'), "t", 10)
    True
    >>> [nothing_before(snap('{"numRecords": 2, "minValues": {"t": 9}}'), "t", 10), nothing_before(snap(None), "t", 10)]
    [False, False]
    """
    for add in snap.adds:
        stats = json.loads(add.get("stats") or "{}")
        low = (stats.get("minValues") or {}).get(column)
        if stats.get("numRecords") != 0 and not (isinstance(low, (int, float)) and low >= cutoff):
            return False
    return True
