"""What a streaming query's checkpoint says it read: the file-source log, offsets and positions log."""

from __future__ import annotations

import json
import os
import re
from typing import Iterator
from urllib.parse import unquote, urlparse

from deltawheel.statestore.delta.sourceoffsets import file_source_range
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import ConfigError

__all__ = ["POSITIONS_DIR", "files_read", "local_folder", "source_log_files", "positions_log", "source_batch_files",
           "query_batch_files"]

POSITIONS_DIR = "dw_positions"  # in a query checkpoint: per batch, the positions it read
_COMPACT = re.compile(r"^(\d+)(\.compact)?$")


def source_log_files(checkpoint: str | TableFiles, *, source: int = 0,
                     committed_only: bool = True) -> dict[int, list[str]]:
    """File-source log entry -> its file names, for the committed batches' entries (missing: {})."""
    root = _files(checkpoint)
    logdir = root.sub(f"sources/{source}")
    listed = logdir.listdir()
    if listed is None:
        return {}
    committed = [int(n) for n in root.listdir("commits") or () if n.isdigit()]
    top = None
    if committed_only and committed:
        rng = file_source_range(root, max(committed), source=source)
        top = None if rng is None else rng[1]
    done = set(committed) if top is None else set(range(top + 1))  # (an older checkpoint: entry = batch)
    names = [(int(m.group(1)), n) for n in listed if (m := _COMPACT.match(n))]
    out: dict[int, dict[str, None]] = {}  # (a dict keeps the names in order, once each)
    for _, name in sorted(names):
        for bid, base in _log_entries(logdir.read_text(name) or ""):
            if bid in done or not committed_only:
                out.setdefault(bid, {})[base] = None
    return {bid: list(bases) for bid, bases in out.items()}


def _files(checkpoint: str | TableFiles) -> TableFiles:
    return checkpoint if isinstance(checkpoint, TableFiles) else TableFiles(local_folder(checkpoint))


def _entry_names(text: str, batch_id: int) -> list[str]:
    """The file names a file-source log file (``sources/<i>/<n>[.compact]``) lists for ``batch_id``."""
    return list(dict.fromkeys(base for bid, base in _log_entries(text) if bid == batch_id))


def _log_entries(text: str) -> Iterator[tuple[int, str]]:
    """(batch id, file name) of each entry of a file-source log file's ``text``."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):  # not the version line ("v1")
            entry = json.loads(line)
            yield int(entry["batchId"]), unquote(os.path.basename(urlparse(entry["path"]).path))


def source_batch_files(checkpoint: TableFiles, batch_id: int, *, source: int = 0) -> list[str] | None:
    """The files the file source read in micro-batch ``batch_id`` (None: not logged; OSError: unreadable)."""
    logdir = checkpoint.sub(f"sources/{source}")
    for name in (str(batch_id), f"{batch_id}.compact"):
        text = logdir.read_text(name)
        if text is not None:
            return _entry_names(text, batch_id)
    # a compacted entry's own file goes: the first compacted file at or after it lists it
    later = sorted(int(m.group(1)) for n in logdir.listdir() or () if (m := _COMPACT.match(n)) and m.group(2)
                   and int(m.group(1)) > batch_id)
    if later:
        text = logdir.read_text(f"{later[0]}.compact")
        if text is not None:
            return _entry_names(text, batch_id)
    return None


def query_batch_files(checkpoint: str | TableFiles, batch_id: int, *, source: int = 0) -> list[str] | None:
    """The files micro-batch ``batch_id`` read through file source ``source`` (None: not known)."""
    root = _files(checkpoint)
    span = file_source_range(root, batch_id, source=source)
    if span is None:
        return None
    out: list[str] = []
    for entry in range(span[0], span[1] + 1):
        names = source_batch_files(root, entry, source=source)
        if names is None:
            return None
        out += [n for n in names if n not in out]
    return out


def files_read(checkpoint: str) -> frozenset[str]:
    """The names of every file a query's file sources logged, all its sources together."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        raise ConfigError(f"watermark_percentile reads the query checkpoint's file log, which must be local for "
                          f"now; {checkpoint} is not (use watermark_delay_ms alone there)")
    srcs = os.path.join(local_folder(checkpoint), "sources")
    listed = os.listdir(srcs) if os.path.isdir(srcs) else []
    return frozenset(name for n in listed if n.isdigit()
                     for names in source_log_files(checkpoint, source=int(n), committed_only=False).values()
                     for name in names)


def local_folder(uri: str) -> str:
    """The local folder of ``uri`` (a path or ``file:`` URI)."""
    if uri.startswith("file:"):
        return urlparse(uri).path
    if "://" in uri:
        raise ConfigError(f"sharing intervals between instances reads the query checkpoint's file log, which "
                          f"must be local or on s3a:// (read with the session's S3 settings); {uri} is not")
    return uri


def positions_log(checkpoint: str | TableFiles, *, committed_only: bool = True) -> dict[int, list[str]]:
    """Batch id -> the positions logged in ``dw_positions/`` for the committed batches (missing: {})."""
    root = _files(checkpoint)
    logdir = root.sub(POSITIONS_DIR)
    listed = logdir.listdir()
    if listed is None:
        return {}
    done = {int(n) for n in root.listdir("commits") or () if n.isdigit()}
    out: dict[int, list[str]] = {}
    for name in listed:
        if name.isdigit() and (int(name) in done or not committed_only):
            text = logdir.read_text(name)
            if text is not None:
                out[int(name)] = list(json.loads(text)["positions"])
    return out
