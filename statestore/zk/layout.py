"""The ZooKeeper layout version: a ``/layout`` znode below the chroot; a newer one is refused.

ZooKeeper SUSPENDED / LOST: plain kazoo calls; a repeat finishes what a cut-off call began."""

from __future__ import annotations

import json
from contextlib import suppress

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from ..exceptions import MigrationError

__all__ = ["ZK_LAYOUT_VERSION", "LAYOUT_PATH", "ensure_zk_layout", "read_zk_layout_version"]

ZK_LAYOUT_VERSION = 1
LAYOUT_PATH = "/layout"
_FOLDERS = ("/pipelines",)


def read_zk_layout_version(client: KazooClient) -> int | None:
    """The stored layout version, or ``None`` when ``/layout`` does not exist yet.
    Raises MigrationError: ``/layout`` exists but does not hold a layout version."""
    if client.exists(LAYOUT_PATH) is None:
        return None
    data, _ = client.get(LAYOUT_PATH)
    try:
        version = json.loads(data.decode("utf-8"))["format_version"]
        if not isinstance(version, int):
            raise TypeError(version)
    except (ValueError, KeyError, TypeError) as exc:
        raise MigrationError(f"znode {LAYOUT_PATH} does not hold a deltawheel layout version "
                             f"({data[:80]!r}); is this chroot used by another application?") from exc
    return version


def ensure_zk_layout(client: KazooClient) -> list[str]:
    """Create the layout znodes that are missing; return the paths it created.
    Raises MigrationError: the stored layout is newer than :data:`ZK_LAYOUT_VERSION`, or unreadable."""
    created: list[str] = []
    stored = _check(read_zk_layout_version(client))
    for path in _FOLDERS:
        if client.exists(path) is None:
            with suppress(NodeExistsError):
                client.create(path, b"", makepath=True)
                created.append(path)
    if stored is None:
        payload = json.dumps({"format_version": ZK_LAYOUT_VERSION}).encode("utf-8")
        try:
            client.create(LAYOUT_PATH, payload)
            created.append(LAYOUT_PATH)
        except NodeExistsError:  # created concurrently by another instance
            _check(read_zk_layout_version(client))
    return created


def _check(stored: int | None) -> int | None:
    if stored is not None and stored > ZK_LAYOUT_VERSION:
        raise MigrationError(f"ZooKeeper layout version {stored} is newer than this deltawheel's "
                             f"({ZK_LAYOUT_VERSION}); upgrade deltawheel to use this chroot")
    return stored
