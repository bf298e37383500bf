"""Delete a checkpoint's leftovers of an unfinished first write, which Spark would refuse."""

from __future__ import annotations

import os

from deltawheel.statestore.delta.log import local_path

__all__ = ["clear_unstarted"]

_LOGS = ("offsets", "commits")


def clear_unstarted(checkpoint: str) -> list[str]:
    """Delete the leftovers of an unfinished first write in a local ``checkpoint``; the paths deleted."""
    local = local_path(checkpoint)
    if local is None:
        return []
    names: dict[str, list[str]] = {}
    for sub in _LOGS:
        try:
            names[sub] = os.listdir(os.path.join(local, sub))
        except OSError:
            names[sub] = []
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
