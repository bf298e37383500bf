"""Up to which rows version every tool commit has its audit row: the audit check's start.

gc recovers the audit rows of tools that died between their rows commit and their audit row
(``statestore/inspection/auditgap.py``, ``background.audit_recovery``). Finding them means reading
the commits' metadata; ``DESCRIBE HISTORY`` opens every JSON commit still in the rows table's log, a
cost that grows with the whole history at every gc. After a gc appended the missing rows, every tool
commit up to the newest version it read has its row (for the background gc: up to the version
before the first tool commit it left to its tool, younger than the grace), and a commit never
changes, so ``<store>/_gc/audit_checked.json`` keeps that version (:func:`save_checked`) with the
SHA-256 of its JSON commit, and the next gc reads only the commits after it (:func:`checked_upto`).

Used only while that commit is still in the log with the same bytes: a rows table made again, a
store restored from an older copy, the commit cleaned up by a log clean-up, a file of another
format: no start (every commit read, as before). Local stores only (a remote table's history is
read by ``DESCRIBE HISTORY``). Written aside, then renamed.
"""

from __future__ import annotations

import json
import os

from deltawheel.statestore.delta.log import log_files
from deltawheel.statestore.layout import StoreLayout

from .ranlog import commit_fingerprint, keep_json, local_root

__all__ = ["AUDIT_MARK_FORMAT_VERSION", "checked_upto", "mark_path", "save_checked"]

AUDIT_MARK_FORMAT_VERSION = 1


def mark_path(layout: StoreLayout) -> str | None:
    """Where gc keeps the version (None: not a local store)."""
    root = local_root(layout)
    return None if root is None else os.path.join(root, "_gc", "audit_checked.json")


def checked_upto(layout: StoreLayout) -> int | None:
    """The rows version up to which every tool commit has its audit row, when the kept one is valid
    for the rows table's log now (module docstring); None: read every commit."""
    path, log = mark_path(layout), log_files(layout.rows)
    if path is None or log is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        if not isinstance(doc, dict) or doc.get("format_version") != AUDIT_MARK_FORMAT_VERSION:
            return None
        upto, fingerprint = int(doc["upto"]), str(doc["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError):  # none, or not ours
        return None
    text = log.read_text(f"{upto:020d}.json")
    if text is None or commit_fingerprint(text) != fingerprint:  # another log, or that commit cleaned up
        return None
    return upto


def save_checked(layout: StoreLayout, upto: int) -> bool:
    """Keep ``upto`` (every tool commit up to it has its audit row) for the next gc. False: not kept
    (a remote store, no such JSON commit, or the file could not be written: the next gc reads every
    commit)."""
    path, log = mark_path(layout), log_files(layout.rows)
    if path is None or log is None or upto < 0:
        return False
    text = log.read_text(f"{upto:020d}.json")
    if text is None:
        return False
    doc = {"format_version": AUDIT_MARK_FORMAT_VERSION, "upto": upto, "fingerprint": commit_fingerprint(text)}
    return keep_json(path, doc, what="the audit check's version")
