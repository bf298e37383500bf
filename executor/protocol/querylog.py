"""What a streaming query's checkpoint says it read: Spark's file-source log (``sources/N``), the
query's offsets, and the positions log deltawheel keeps beside them (``dw_positions/{batch}``).
Read for the shared intervals' catch-up and skip rule (``rescale.py``) and for replay's record of
each batch's input positions; a local checkpoint by path, a remote one through its files.
"""

from __future__ import annotations

import json
import os
import re
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
    """File-source log entry -> the names of the files Spark's file source listed in it, for the
    entries the query's *committed* batches read (up to the source's ``logOffset`` in the offsets
    of the newest ``<checkpoint>/commits/N``; every entry with ``committed_only=False``), from
    ``<checkpoint>/sources/<source>/`` (its JSON-lines log, ``.compact`` files included). The
    entries are the file source's own numbering, not the query's batch ids
    (:func:`query_batch_files` maps a micro-batch to its entries). A local checkpoint (a path), or
    one's files (``TableFiles``: an ``s3a://`` one is listed and each log file read, one GET
    each); missing: {}."""
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
    out: dict[int, list[str]] = {}
    for _, name in sorted(names):
        for line in (logdir.read_text(name) or "").splitlines():
            line = line.strip()
            if not line.startswith("{"):
                continue  # the version line ("v1")
            entry = json.loads(line)
            bid = int(entry["batchId"])
            if bid in done or not committed_only:
                out.setdefault(bid, [])
                base = unquote(os.path.basename(urlparse(entry["path"]).path))
                if base not in out[bid]:
                    out[bid].append(base)
    return out


def _files(checkpoint: str | TableFiles) -> TableFiles:
    """A checkpoint's files: given, or a local path's (a remote URI string: :func:`_local` refuses)."""
    return checkpoint if isinstance(checkpoint, TableFiles) else TableFiles(local_folder(checkpoint))


def _entry_names(text: str, batch_id: int) -> list[str]:
    """The file names a file-source log file (``sources/<i>/<n>[.compact]``) lists for ``batch_id``."""
    out: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue  # the version line ("v1")
        entry = json.loads(line)
        if int(entry["batchId"]) == batch_id:
            base = unquote(os.path.basename(urlparse(entry["path"]).path))
            if base not in out:
                out.append(base)
    return out


def source_batch_files(checkpoint: TableFiles, batch_id: int, *, source: int = 0) -> list[str] | None:
    """The names of the files Spark's file source read in micro-batch ``batch_id``, from that
    batch's file of its log alone (``sources/<source>/<batch_id>``, or ``<batch_id>.compact`` when
    the batch compacted the log): the reader for a checkpoint on an object store, one GET per
    batch (two on a compaction batch). None: the batch is not in the log.

    Raises:
        OSError: the file could not be read (not: it is missing).
    """
    logdir = checkpoint.sub(f"sources/{source}")
    for name in (str(batch_id), f"{batch_id}.compact"):
        text = logdir.read_text(name)
        if text is not None:
            return _entry_names(text, batch_id)
    # Spark deletes an entry's own file some minutes after a later compaction took it in: the
    # first compacted file at or after it lists it
    later = sorted(int(m.group(1)) for n in logdir.listdir() or () if (m := _COMPACT.match(n)) and m.group(2)
                   and int(m.group(1)) > batch_id)
    if later:
        text = logdir.read_text(f"{later[0]}.compact")
        if text is not None:
            return _entry_names(text, batch_id)
    return None


def query_batch_files(checkpoint: str | TableFiles, batch_id: int, *, source: int = 0) -> list[str] | None:
    """The names of the files micro-batch ``batch_id`` of the query read through its file source
    ``source``: those of the file-source log entries its offsets span
    (``sourceoffsets.file_source_range``: usually one entry; two or more after a stop between the
    file source's log and the query's offset log). A local checkpoint (a path), or one's files;
    None when not known (its offsets or an entry missing).

    Raises:
        OSError: a remote file could not be read (not: it is missing).
    """
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
    """The names of every file a query's file sources logged (batches run or running), all its
    sources together: what an injector estimating from its pending files leaves out."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        raise ConfigError(f"watermark_percentile reads the query checkpoint's file log, which must be local for "
                          f"now; {checkpoint} is not (use watermark_delay_ms alone there)")
    root = local_folder(checkpoint)
    srcs = os.path.join(root, "sources")
    out: set[str] = set()
    for src in (int(n) for n in (os.listdir(srcs) if os.path.isdir(srcs) else ()) if n.isdigit()):
        for names in source_log_files(checkpoint, source=src, committed_only=False).values():
            out.update(names)
    return frozenset(out)


def local_folder(uri: str) -> str:
    """The local folder of ``uri`` (a path or ``file:`` URI)."""
    if uri.startswith("file:"):
        return urlparse(uri).path
    if "://" in uri:
        raise ConfigError(f"sharing intervals between instances reads the query checkpoint's file log, which "
                          f"must be local or on s3a:// (read with the session's S3 settings); {uri} is not")
    return uri


def positions_log(checkpoint: str | TableFiles, *, committed_only: bool = True) -> dict[int, list[str]]:
    """Batch id -> the positions this module logged for it in the query checkpoint
    (``dw_positions/``), for the batches the query committed (every logged one with
    ``committed_only=False``). A local checkpoint, or one's files (``s3a://``); missing: {}."""
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
