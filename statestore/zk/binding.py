"""Which store a pipeline's ZooKeeper state belongs to.

The first writer records its rows table id in ``/pipelines/{p}/store``; every later writer checks
it before taking a lease. ZooKeeper SUSPENDED / LOST: one create-or-read, kazoo's error propagates."""

from __future__ import annotations

import json
from contextlib import suppress
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from ..exceptions import StoreMismatchError

__all__ = ["BINDING_FORMAT_VERSION", "store_path", "bind_store"]

BINDING_FORMAT_VERSION = 1


def store_path(pipeline: str) -> str:
    """The ZooKeeper node that records which store ``pipeline`` writes to."""
    return f"/pipelines/{pipeline}/store"


def bind_store(client: KazooClient, pipeline: str, *, table_id: str, root: str,
               on_exists: Callable[[], None] | None = None) -> bool:
    """Record ``table_id`` as the store of ``pipeline``, or check that it is the one recorded.

    Returns True when this call recorded it; ``on_exists``: called before a found binding is read.
    Raises StoreMismatchError: the pipeline's ZooKeeper state belongs to another store."""
    path = store_path(pipeline)
    payload = json.dumps({"format_version": BINDING_FORMAT_VERSION, "rows_table_id": table_id, "root": root},
                         sort_keys=True).encode()
    while True:
        with suppress(NodeExistsError):
            client.create(path, payload, makepath=True)
            return True
        if on_exists is not None:
            on_exists()
        with suppress(NoNodeError):  # deleted since the create found it: create again
            data, _ = client.get(path)
            break
    try:
        held = json.loads(data.decode("utf-8"))
        other, other_root = str(held["rows_table_id"]), str(held.get("root", "?"))
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreMismatchError(f"znode {path} does not hold a deltawheel store binding ({data[:80]!r}); "
                                 "is this ZooKeeper chroot used by another application?") from exc
    if other != table_id:
        chroot = getattr(client, "chroot", "") or "/"
        raise StoreMismatchError(
            f"ZooKeeper (chroot {chroot}) holds pipeline {pipeline!r} of another store: {other_root} (rows table "
            f"id {other}); this store is {root} (id {table_id}). Its leases, sequencers and watermarks are not "
            "this store's (a new store would inherit the old watermarks and drop every record as late). Give "
            "this store its own ZooKeeper chroot (--zk-chroot, ZkConfig.chroot) or pipeline name; if the "
            "other store is gone, stop the ZooKeeper left running for it (an embedded one: `deltawheel zk "
            f"stop --store <that store>`, or end its process) or delete the znode /pipelines/{pipeline} "
            f"(with its children) in chroot {chroot}.")
    return False
