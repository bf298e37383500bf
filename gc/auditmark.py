"""Up to which rows version every tool commit has its audit row: the audit check's start.

``<store>/_gc/audit_checked.json`` keeps that version with its commit's SHA-256, so the next gc
reads only later commits while that commit is in the log with the same bytes. Local stores only."""

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
    """The kept rows version up to which every tool commit has its audit row; None: read every commit."""
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
    """Keep ``upto`` for the next gc. False: not kept (a remote store, no such commit, not written)."""
    path, log = mark_path(layout), log_files(layout.rows)
    if path is None or log is None or upto < 0:
        return False
    text = log.read_text(f"{upto:020d}.json")
    if text is None:
        return False
    doc = {"format_version": AUDIT_MARK_FORMAT_VERSION, "upto": upto, "fingerprint": commit_fingerprint(text)}
    return keep_json(path, doc, what="the audit check's version")
