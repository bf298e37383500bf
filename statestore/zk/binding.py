"""Which store a pipeline's ZooKeeper state belongs to.

Leases, sequencers and watermarks live in ZooKeeper under
``/pipelines/{pipeline}``; rows, fences and streams live in the store. The two
only make sense together: a fresh store run against ZooKeeper state left by
another store of the same pipeline name would inherit its watermarks (every
record late, nothing emitted) and its sequencers. So the first writer of a
pipeline records its store in ``/pipelines/{pipeline}/store`` — the rows
table's Delta table id, fixed when the store is created, and the store's root
for the message — and every later writer checks it before taking a lease.
Copies of one store (same table id) may share the state; another store may not.

ZooKeeper SUSPENDED / LOST: the check is one create-or-read before any lease
is taken; a connection error propagates (kazoo's), nothing is half-written
(the znode is created whole or not at all). A binding deleted between the
create that found it and the read (a start that found ZooKeeper's state lost
deletes the binding it had just created, ``ownership/owner.py``) is created again: the
binding is never read as missing while it is being replaced.
"""

from __future__ import annotations

import json
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

    Returns True when this call recorded it (the pipeline's first writer, or the first after the
    binding was deleted: create and read are repeated until one of them finds it).

    Args:
        client: a started client (paths below its chroot).
        pipeline: the pipeline's name.
        table_id: the rows table's Delta table id.
        root: the store's root (shown in messages).
        on_exists: called when the create found the binding, before it is read (tests drive the
            race with a concurrent delete through it).

    Raises:
        StoreMismatchError: the pipeline's ZooKeeper state belongs to another store.
    """
    path = store_path(pipeline)
    payload = json.dumps({"format_version": BINDING_FORMAT_VERSION, "rows_table_id": table_id, "root": root},
                         sort_keys=True).encode()
    while True:
        try:
            client.create(path, payload, makepath=True)
            return True
        except NodeExistsError:
            pass
        if on_exists is not None:
            on_exists()
        try:
            data, _ = client.get(path)
            break
        except NoNodeError:
            continue  # deleted since the create found it: create it (or read the next one)
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
