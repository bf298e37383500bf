"""A query's checkpoint before it starts (an unfinished first write, the batch Spark replays), its progress."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from deltawheel.statestore.delta.log import local_path

__all__ = ["clear_unstarted", "delta_end_version", "pending_batch"]

_LOGS = ("offsets", "commits")


def _entries(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def clear_unstarted(checkpoint: str) -> list[str]:
    """Delete the leftovers of an unfinished first write in a local ``checkpoint``; the paths deleted."""
    local = local_path(checkpoint)
    if local is None:
        return []
    names = {sub: _entries(os.path.join(local, sub)) for sub in _LOGS}
    if any(n.isdigit() for sub in _LOGS for n in names[sub]):
        return []
    gone = []
    for sub in _LOGS:
        for n in names[sub]:
            if n.startswith("."):  # temporary files and checksums of an entry never written
                path = os.path.join(local, sub, n)
                try:
                    os.remove(path)
                    gone.append(path)
                except OSError:
                    pass
    return gone


def delta_end_version(query: Any, path: str) -> int | None:
    """The ``reservoirVersion`` (every version before it was read) of ``path``'s source in the last progress."""
    progress = query.lastProgress  # None before the first batch: no sources
    sources = getattr(progress, "sources", None)
    if sources is None:
        sources = progress.get("sources", []) if isinstance(progress, dict) else []
    for src in sources:
        desc = getattr(src, "description", None) or (src.get("description") if isinstance(src, dict) else "")
        if not desc or not str(desc).rstrip("]").endswith(path.rstrip("/")):
            continue
        end = getattr(src, "endOffset", None) if not isinstance(src, dict) else src.get("endOffset")
        if isinstance(end, str):
            try:
                end = json.loads(end)
            except ValueError:
                return None
        if isinstance(end, dict) and "reservoirVersion" in end:
            return int(end["reservoirVersion"])
        return None
    return None


def pending_batch(checkpoint: str) -> int | None:
    """The id of the micro-batch the checkpoint planned and did not commit (None: none); for a remote
    checkpoint a bound above any id, so that the start's first batch counts as a replay."""
    local = local_path(checkpoint)
    if local is None:
        return 2**62
    ids = {sub: [int(n) for n in _entries(os.path.join(local, sub)) if n.isdigit()] for sub in _LOGS}
    planned = max(ids["offsets"], default=None)
    committed = max(ids["commits"], default=-1)
    return planned if planned is not None and planned > committed else None


def await_commit_log(query: Any, done_batch: int, deadline: float) -> None:
    """Wait until ``deadline`` (monotonic) for ``query`` to report micro-batch ``done_batch``'s
    progress: Spark writes the commit log first, so a stop after this does not replay that batch."""
    while done_batch >= 0 and time.monotonic() < deadline and query.isActive:
        progress = query.lastProgress
        if progress is not None and int(progress["batchId"]) >= done_batch:
            return
        time.sleep(0.02)
