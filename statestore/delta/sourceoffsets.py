"""What Delta's streaming source read in one micro-batch, from the query checkpoint and the table's log.

Anything but the plain case gives None (the caller asks Spark); a failed remote read raises
``OSError``. docs/embedding.md, "Direct read"; docs/replay.md, "Input positions per commit"."""

from __future__ import annotations

import json
import os
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .log import files_of, log_files, read_snapshot
from .storefs import TableFiles

__all__ = ["END_INDEX", "BASE_INDEX", "SourceOffset", "Where", "offset_lines", "batch_adds", "version_adds",
           "source_boundary", "add_file_name",
           "kafka_offsets", "kafka_ranges", "files_of", "file_source_range"]

BASE_INDEX = -1  # before every file of the offset's version
END_INDEX = 2**63 - 1  # after every file of the offset's version

Where = str | TableFiles  # a checkpoint or table: a local path, or its files

_TABLES: dict[TableFiles, tuple[str, bool] | None] = {}  # table root -> (its id, readable here)
_TABLES_LOCK = threading.Lock()


@dataclass(frozen=True)
class SourceOffset:
    """One Delta source's offset in a micro-batch's offset log line."""

    reservoir_id: str
    version: int
    index: int
    starting: bool  # ``isStartingVersion``: inside the snapshot the query started from

    def boundary(self) -> int | None:
        """The first version not read yet when the offset is at a version boundary, else None."""
        if self.starting or self.index not in (BASE_INDEX, END_INDEX):
            return None
        return self.version + 1 if self.index == END_INDEX else self.version


def _read(where: TableFiles, rel: str) -> str | None:
    if where.is_local:
        try:
            with open(os.path.join(where.root, rel), encoding="utf-8") as fh:
                return fh.read()
        except OSError:
            return None
    return where.read_text(rel)


def offset_lines(checkpoint: Where, batch_id: int) -> list[Any] | None:
    """The parsed source lines of ``offsets/<batch_id>`` (None: no file; a line None: no offset).
    Raises OSError: a remote checkpoint's file could not be read (not: it is missing)."""
    root = files_of(checkpoint)
    if root is None or batch_id < 0:
        return None
    text = _read(root, f"offsets/{batch_id}")
    if text is None:
        return None
    lines = text.splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        return None
    out: list[Any] = []
    for line in lines[2:]:
        try:
            out.append(None if line.strip() in ("", "-") else json.loads(line))
        except ValueError:
            return None
    return out


def _offset(lines: list[Any] | None, table_id: str) -> SourceOffset | None:
    for entry in lines or ():
        if isinstance(entry, dict) and entry.get("reservoirId") == table_id:
            try:
                return SourceOffset(table_id, int(entry["reservoirVersion"]), int(entry["index"]),
                                    bool(entry.get("isStartingVersion", False)))
            except (KeyError, TypeError, ValueError):
                return None
    return None


def _table(root: TableFiles) -> tuple[str, bool] | None:
    with _TABLES_LOCK:
        if root in _TABLES:
            return _TABLES[root]
    snap = read_snapshot(root)
    if snap is None or snap.table_id is None:
        return None
    got = (snap.table_id, snap.configuration.get("delta.columnMapping.mode", "none") in ("", "none"))
    with _TABLES_LOCK:
        _TABLES[root] = got
    return got


def batch_adds(checkpoint: Where, batch_id: int, table: Where) -> tuple[dict[str, Any], ...] | None:
    """The ``add`` actions Delta's source over ``table`` read in micro-batch ``batch_id`` (None: unknown).
    Raises OSError: a remote file could not be read (not: it is missing)."""
    root = files_of(table)
    if root is None or batch_id < 1:
        return None
    known = _table(root)
    if known is None or not known[1]:
        return None
    end = _offset(offset_lines(checkpoint, batch_id), known[0])
    start = _offset(offset_lines(checkpoint, batch_id - 1), known[0])
    if end is None or start is None:
        return None
    if end == start:
        return ()
    first, stop = start.boundary(), end.boundary()
    if first is None or stop is None or stop < first:
        return None
    return version_adds(root, first, stop)


def version_adds(table: Where, first: int, stop: int, *,
                 skip_changes: bool = False) -> tuple[dict[str, Any], ...] | None:
    """The data-changing ``add`` actions of ``table``'s versions ``first`` .. ``stop - 1`` (None: a version
    missing, or one Delta's source would not read as plain appends). ``skip_changes``: a version that
    removes data (stream retention's delete) is skipped and a metadata change read past, as Delta's
    ``skipChangeCommits`` does. Raises OSError as :func:`batch_adds`."""
    log = log_files(table)
    if log is None:
        return None
    adds: list[dict[str, Any]] = []
    for v in range(first, stop):
        text = log.read_text(f"{v:020d}.json")
        if text is None:
            return None
        acts = []
        for line in text.splitlines():
            if line.strip():
                try:
                    acts.append(json.loads(line))
                except ValueError:
                    return None
        if any("remove" in a and a["remove"].get("dataChange", True) for a in acts) and skip_changes:
            continue
        for act in acts:
            if ("metaData" in act and not skip_changes) or ("remove" in act and act["remove"].get("dataChange", True)):
                return None
            add = act.get("add")
            if add is None or not add.get("dataChange", True):
                continue
            if add.get("deletionVector") or add.get("partitionValues") or "://" in add["path"] \
                    or add["path"].startswith("/"):
                return None
            adds.append(add)
    return tuple(adds)


def source_boundary(checkpoint: Where, batch_id: int, table: Where) -> int | None:
    """The first version of ``table`` Delta's source had not read after micro-batch ``batch_id`` (its
    offset ``offsets/<batch_id>``); None: not known (no such offset, or one inside a version)."""
    root = files_of(table)
    known = None if root is None else _table(root)
    if known is None:
        return None
    end = _offset(offset_lines(checkpoint, batch_id), known[0])
    return None if end is None else end.boundary()


def add_file_name(add: dict[str, Any]) -> str:
    """The data file's name of an ``add`` action, unescaped, as Spark's ``input_file_name()`` ends."""
    return urllib.parse.unquote(add["path"].rsplit("/", 1)[-1])


def file_source_range(checkpoint: Where, batch_id: int, *, source: int) -> tuple[int, int] | None:
    """(first, last) of the file-source log entries (``sources/<source>/``) batch ``batch_id`` read;
    first > last: none; None: not known here (the file source numbers its entries apart from batches).
    Raises OSError: a remote checkpoint's file could not be read (not: it is missing).

    >>> import tempfile, os
    >>> chk = tempfile.mkdtemp(); os.makedirs(f"{chk}/offsets")
    >>> for b, k in ((0, 0), (1, 2)):
    ...     _ = open(f"{chk}/offsets/{b}", "w").write("\\n".join(["v1", "{}", '{"logOffset":%d}' % k]))
    >>> file_source_range(chk, 0, source=0), file_source_range(chk, 1, source=0), file_source_range(chk, 2, source=0)
    ((0, 0), (1, 2), None)
    """
    if batch_id < 0:
        return None
    end = _log_offset(offset_lines(checkpoint, batch_id), source)
    start = -1 if batch_id == 0 else _log_offset(offset_lines(checkpoint, batch_id - 1), source)
    return None if end is None or start is None else (start + 1, end)


def _log_offset(lines: list[Any] | None, source: int) -> int | None:
    """The file source's ``logOffset`` in an offset log's source lines (no offset yet: -1; None: unknown)."""
    if lines is None or source >= len(lines):
        return None
    entry = lines[source]
    if entry is None:
        return -1
    if not isinstance(entry, dict) or set(entry) != {"logOffset"}:
        return None
    try:
        return int(entry["logOffset"])
    except (TypeError, ValueError):
        return None


def kafka_offsets(lines: list[Any] | None, topic: str) -> tuple[int, dict[str, int]] | None:
    """(the source's index, partition -> next offset) of the Kafka source over ``topic``; None: none."""
    for i, entry in enumerate(lines or ()):
        if isinstance(entry, dict) and set(entry) == {topic} and isinstance(entry[topic], dict):
            try:
                return i, {str(p): int(o) for p, o in entry[topic].items()}
            except (TypeError, ValueError):
                return None
    return None


def _initial_kafka(checkpoint: Where, source: int, topic: str) -> dict[str, int] | None:
    """The offsets a Kafka source's first batch started from (``sources/<i>/0``)."""
    root = files_of(checkpoint)
    if root is None:
        return None
    text = _read(root, f"sources/{source}/0")
    if text is None:
        return None
    start = text.find("{")
    try:
        got = kafka_offsets([json.loads(text[start:])] if start >= 0 else None, topic)
    except ValueError:
        return None
    return None if got is None else got[1]


def kafka_ranges(checkpoint: Where, batch_id: int, topic: str, *,
                 new_partition_start: int | None = None) -> dict[str, dict[str, list[int]]] | None:
    """``{topic: {partition: [start, end)}}`` a Kafka source read in micro-batch ``batch_id`` (None: unknown);
    ``new_partition_start``: the start of a partition added during the run.
    Raises OSError: a remote checkpoint's file could not be read (not: it is missing)."""
    if batch_id < 0:
        return None
    end = kafka_offsets(offset_lines(checkpoint, batch_id), topic)
    if end is None:
        return None
    index, stop = end
    if batch_id == 0:
        first = _initial_kafka(checkpoint, index, topic)
    else:
        prev = kafka_offsets(offset_lines(checkpoint, batch_id - 1), topic)
        first = None if prev is None else prev[1]
    if first is not None and new_partition_start is not None:
        first = {**{p: new_partition_start for p in stop}, **first}
    if first is None or any(p not in first or first[p] < 0 or first[p] > stop[p] for p in stop):
        return None
    return {topic: {p: [first[p], stop[p]] for p in sorted(stop, key=int) if stop[p] > first[p]}}
