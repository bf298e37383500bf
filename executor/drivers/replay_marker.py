"""A replay's marker ``<into>/_replay.json``: what it replays and how far it got (``reached``)."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from deltawheel.statestore.delta.storefs import TableFiles, files_for, table_files
from deltawheel.statestore.exceptions import ReplayTargetError
from deltawheel.statestore.layout import StoreLayout

__all__ = ["MARKER", "store_id", "into_files", "read_marker", "marker_of", "write_marker"]

MARKER = "_replay.json"  # in the shadow store: what it replays and how far it got


def store_id(store: StoreLayout) -> str:
    """How a replay's marker names the live store: a local folder's real path, an object store's URI."""
    return os.path.realpath(store.root) if store.is_local else store.root.rstrip("/")


def into_files(spark: Any, into: StoreLayout) -> TableFiles:
    """The shadow store's folder as Python reaches it (local or ``s3a://``); else ReplayTargetError."""
    files = table_files(spark, into.root) if spark is not None else files_for(into.root)
    if files is None or (spark is None and not files.is_local):
        raise ReplayTargetError(f"--into {into.root}: a replay's shadow store is a local folder or an s3a:// store")
    return files


def read_marker(into: StoreLayout, *, spark: Any = None) -> dict[str, Any] | None:
    """What ``<into>/_replay.json`` records (None: not a replay's folder)."""
    return marker_of(into_files(spark, into))


def marker_of(files: TableFiles) -> dict[str, Any] | None:
    """The marker in the shadow store's folder ``files`` (None: none there)."""
    text = files.read_text(MARKER)
    return None if text is None else dict(json.loads(text))


def write_marker(files: TableFiles, content: Mapping[str, Any]) -> None:
    """Write the marker ``content`` into the shadow store's folder ``files``, whole."""
    files.write_text(MARKER, json.dumps(dict(content), indent=2, sort_keys=True))
