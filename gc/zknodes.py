"""gc's ``zk_instances`` and ``zk_replays`` passes over the ZooKeeper nodes of a store's pipelines; a
delete names the version read, so an estimate published meanwhile is kept."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from deltawheel.statestore.zk.binding import store_path
from deltawheel.statestore.zk.client import children
from deltawheel.statestore.zk.members import live_members
from deltawheel.statestore.zk.watermarks.codec import Znodes, decode
from deltawheel.statestore.zk.watermarks.low import holds_back
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError, NotEmptyError

from .passes import GcAction

__all__ = ["bound_pipelines", "collect_zk_nodes", "REPLAY_CHROOT_MARK"]

REPLAY_CHROOT_MARK = "-replay-"  # executor/drivers/replay.py's shadow_chroot: {chroot}-replay-{hash}


def _object(client: KazooClient, path: str) -> dict[str, Any] | None:
    """The JSON object at ``path``, e.g. a store binding or a lease owner (None: none, or not one)."""
    try:
        data, _ = client.get(path)
        raw = json.loads(data.decode("utf-8"))
        return raw if isinstance(raw, dict) else None
    except (NoNodeError, ValueError, UnicodeDecodeError):
        return None


def _owner_paths(client: KazooClient, base: str) -> Iterator[str]:
    """The lease owner znode of every interval of every computation under ``base``."""
    for comp in children(client, base):
        for iv in children(client, f"{base}/{comp}/intervals"):
            yield f"{base}/{comp}/intervals/{iv}/owner"


def _lease_holders(client: KazooClient, pipeline: str) -> set[str]:
    """The instance (and owner) names on the pipeline's held leases."""
    out: set[str] = set()
    for path in _owner_paths(client, f"/pipelines/{pipeline}/computations"):
        raw = _object(client, path) or {}
        out.update(str(raw[k]) for k in ("instance", "owner") if raw.get(k))
    return out


def _caught_up(client: KazooClient, znodes: Znodes, computations: set[str]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for comp in sorted(computations):
        base = f"{znodes.folder('caught_up')}/{comp}"
        out[comp] = {}
        for iv in children(client, base):
            try:
                data, _ = client.get(f"{base}/{iv}")
            except NoNodeError:
                continue
            out[comp][int(iv)] = int(decode(data, base)["sequencer"])
    return out


def _gone_instances(client: KazooClient, pipeline: str, *, apply: bool) -> int:
    znodes = Znodes(pipeline)
    live = set(live_members(client, pipeline)) | _lease_holders(client, pipeline)
    removed = 0
    for injector in children(client, znodes.folder("instances")):
        base = f"{znodes.folder('instances')}/{injector}"
        for name in children(client, base):
            if name in live:
                continue
            try:
                data, stat = client.get(f"{base}/{name}")
            except NoNodeError:
                continue
            raw = decode(data, f"{base}/{name}")
            comps = {*(raw.get("held") or {}), *(raw.get("released") or {})}
            if holds_back(raw, _caught_up(client, znodes, comps)):
                continue  # its unread records of an interval are not caught up by a later owner yet
            if apply:
                try:
                    client.delete(f"{base}/{name}", version=stat.version)
                except (BadVersionError, NoNodeError):
                    continue  # published again meanwhile (a restart under this name), or gone
            removed += 1
    return removed


def _finished_replays(client: KazooClient, chroot: str, *, store_exists: Callable[[str], bool],
                      apply: bool) -> list[str]:
    """The replay chroots beside ``chroot`` whose shadow store is gone and that hold no lease."""
    parent, _, leaf = chroot.rstrip("/").rpartition("/")
    parent = parent or "/"
    found = []
    for name in children(client, parent):
        if not name.startswith(leaf + REPLAY_CHROOT_MARK):
            continue
        root = f"{parent.rstrip('/')}/{name}"
        pipelines = children(client, f"{root}/pipelines")
        bindings = [_object(client, f"{root}/pipelines/{p}/store") for p in pipelines]
        stores = [str(b["root"]) for b in bindings if b is not None and b.get("root")]
        if not stores or any(store_exists(s) for s in stores):
            continue  # not a shadow store's chroot we can place, or its store is still there
        if any(client.exists(o) is not None for p in pipelines
               for o in _owner_paths(client, f"{root}/pipelines/{p}/computations")):
            continue  # a replay runs in it
        if apply:
            try:
                client.delete(root, recursive=True)
            except (NoNodeError, NotEmptyError):
                continue
        found.append(root)
    return found


def _local_store_exists(root: str) -> bool:
    if "://" in root and not root.startswith("file:"):
        return True  # an object store's shadow store: not looked into, kept
    return os.path.isdir(os.path.join(root.removeprefix("file:"), "rows", "_delta_log"))


def bound_pipelines(client: KazooClient, *, rows_table_id: str) -> list[str]:
    """The pipelines of ``client``'s chroot bound to the store whose first rows table is ``rows_table_id``."""
    return [p for p in children(client, "/pipelines")
            if str((_object(client, store_path(p)) or {}).get("rows_table_id")) == rows_table_id]


def collect_zk_nodes(client: KazooClient, root: KazooClient | None, *, rows_table_id: str,
                     chroot: str, apply: bool = False,
                     store_exists: Callable[[str], bool] = _local_store_exists) -> list[GcAction]:
    """Plan (default) or delete the ZooKeeper nodes that outlived what they were for (``root``: replays')."""
    actions: list[GcAction] = []
    verb = "deleted" if apply else "would delete"
    for pipeline in bound_pipelines(client, rows_table_id=rows_table_id):
        n = _gone_instances(client, pipeline, apply=apply)
        actions.append(GcAction("zk_instances", f"zk:/pipelines/{pipeline}",
                                f"{verb} {n} estimates of gone instances that hold no watermark back", n))
    if root is not None:
        gone = _finished_replays(root, chroot, store_exists=store_exists, apply=apply)
        actions.append(GcAction("zk_replays", f"zk:{chroot}{REPLAY_CHROOT_MARK}*",
                                f"{verb} {len(gone)} chroots of replays whose shadow store is gone"
                                + (f" ({', '.join(gone)})" if gone else ""), len(gone)))
    return actions
