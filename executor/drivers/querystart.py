"""What a streaming query's checkpoint needs before the query starts.

A query stopped (SIGKILL, SIGTERM) while it wrote its first offsets entry leaves a hidden
temporary file in ``offsets/`` (``.0.<uuid>.tmp``, 0 bytes) and no entry. Spark then refuses
every start of that checkpoint (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``: batch 0 wants an
empty location), so the same command could never resume. Before such a checkpoint is used, the
leftovers of the unfinished first write are deleted: nothing was committed, nothing is lost.
"""

from __future__ import annotations

import os

from deltawheel.statestore.delta.log import local_path

__all__ = ["clear_unstarted"]

_LOGS = ("offsets", "commits")


def clear_unstarted(checkpoint: str) -> list[str]:
    """Delete the hidden leftovers of an unfinished first write in ``checkpoint``'s ``offsets/`` and
    ``commits/`` when neither holds an entry yet (local checkpoints only); the paths deleted.

    A checkpoint with any entry is left as it is: Spark reads its entries and ignores the rest.
    """
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
