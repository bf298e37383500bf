"""The operator's tools on leases: show them, break one, and read or raise the sequencer floor.

ZooKeeper SUSPENDED / LOST: plain kazoo calls, neither paused nor retried; each is safe to repeat."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import ACL

from ..exceptions import LeaseHeldError
from ..layout import validate_name
from .client import children
from .grants import LEASE_FORMAT_VERSION, decode_lease, grant_path, interval_path, raise_first

__all__ = ["break_lease", "list_leases", "next_sequencers", "raise_sequencers", "pipeline_chroots"]


def break_lease(client: KazooClient, *, pipeline: str, computation: str, interval: int,
                apply: bool = False) -> dict[str, Any]:
    """Take a lease away from its owner (dry run by default). Returns the plan: ``path``, ``held``,
    the ``owner``, ``sequencer``, ``session`` and ``version`` when held, ``applied``.
    Raises LeaseHeldError: an ACL this client lacks protects it, or a grant is in progress."""
    base = interval_path(validate_name("pipeline", pipeline), validate_name("computation", computation), interval)
    plan: dict[str, Any] = {"path": f"{base}/owner", "pipeline": pipeline, "computation": computation,
                            "interval": interval, "held": False, "applied": False}
    try:
        data, stat = client.get(f"{base}/owner")
    except NoNodeError:
        plan["action"] = "nothing to break: the interval has no owner"
        return plan
    raw = decode_lease(data)
    plan.update(held=True, owner=raw.get("owner"), sequencer=raw.get("sequencer"),
                session=f"0x{stat.ephemeralOwner:x}", version=stat.version,
                action="delete the owner znode and its grant node; the owner's next check fails")
    if not apply:
        return plan
    if stat.version == 0 or raw.get("sequencer") is None:
        raise LeaseHeldError(f"interval {interval} of {pipeline}/{computation} is being granted right now; "
                             "retry in a moment")
    tx = client.transaction()
    tx.delete(f"{base}/owner", stat.version)
    grant = grant_path(base, int(raw["sequencer"]))
    if client.exists(grant) is not None:
        tx.delete(grant, 0)
    res = tx.commit()
    if any(isinstance(r, NoAuthError) for r in res):
        raise LeaseHeldError(f"the lease on interval {interval} of {pipeline}/{computation} is protected by a "
                             "digest ACL; run with the owners' --zk-digest")
    if any(isinstance(r, Exception) for r in res):
        plan["action"] = "the owner changed meanwhile; nothing was deleted, run again"
        return plan
    plan["applied"] = True
    return plan


def list_leases(client: KazooClient, *, pipeline: str | None = None) -> list[dict[str, Any]]:
    """Every known interval with its owner (``None`` when free) and last sequencer."""
    out: list[dict[str, Any]] = []
    for p in [pipeline] if pipeline else children(client, "/pipelines"):
        for c in children(client, f"/pipelines/{p}/computations"):
            for name in children(client, f"/pipelines/{p}/computations/{c}/intervals"):
                base = f"/pipelines/{p}/computations/{c}/intervals/{name}"
                grants = children(client, f"{base}/grants")
                row: dict[str, Any] = {"pipeline": p, "computation": c, "interval": int(name), "owner": None,
                                       "instance": None, "sequencer": None, "session": None, "granted_ms": None,
                                       "last_sequencer": int(grants[-1].rsplit("g-", 1)[1]) if grants else None}
                with suppress(NoNodeError):
                    data, stat = client.get(f"{base}/owner")
                    raw = decode_lease(data)
                    row.update(owner=raw.get("owner"), instance=raw.get("instance"), sequencer=raw.get("sequencer"),
                               session=f"0x{stat.ephemeralOwner:x}", granted_ms=raw.get("granted_ms"))
                out.append(row)
    return out


def next_sequencers(client: KazooClient, *, pipeline: str, computation: str,
                    intervals: Iterable[int]) -> dict[int, int]:
    """Per interval, one above the highest sequencer ZooKeeper's grant nodes record (0: none)."""
    out: dict[int, int] = {}
    for iv in sorted(set(intervals)):
        names = children(client, f"{interval_path(pipeline, computation, iv)}/grants")
        nums = [int(n.rsplit("g-", 1)[1]) for n in names if n.startswith("g-") and n[2:].isdigit()]
        out[iv] = max(nums) + 1 if nums else 0
    return out


def raise_sequencers(client: KazooClient, *, pipeline: str, computation: str, floors: Mapping[int, int],
                     acls: list[ACL] | None = None, ops_per_transaction: int = 500) -> dict[int, int]:
    """Make every later grant of each interval get a sequencer of at least ``floors[interval]`` (never
    lowers): placeholders until a node, marked ``reseed``, reaches ``floor - 1``. Returns the next ones."""
    out: dict[int, int] = {}
    marker = json.dumps({"format_version": LEASE_FORMAT_VERSION, "reseed": True}).encode()
    for iv, floor in sorted(floors.items()):
        grants = f"{interval_path(pipeline, computation, iv)}/grants"
        client.ensure_path(grants, acl=acls)
        while True:
            probe = client.create(f"{grants}/g-", marker, acl=acls, sequence=True)
            got = int(str(probe).rsplit("g-", 1)[1])
            if got + 1 >= floor:
                out[iv] = got + 1
                break
            client.delete(probe)
            pairs = min(max(1, ops_per_transaction // 2), floor - got - 1)
            tx = client.transaction()
            for _ in range(pairs):
                tx.create(f"{grants}/reseed", b"", acl=acls)
                tx.delete(f"{grants}/reseed")
            raise_first(tx.commit())
    return out


def pipeline_chroots(root: KazooClient, chroot: str, pipeline: str | None, *, max_depth: int = 3,
                     max_nodes: int = 500) -> list[tuple[str, list[str]]]:
    """The chroots other than ``chroot`` holding pipelines (only ``pipeline``), with their pipelines,
    walking at most ``max_depth`` levels and ``max_nodes`` znodes from ``root`` (a client without chroot)."""
    found: list[tuple[str, list[str]]] = []
    level, seen = [""], 0
    for _ in range(max_depth):
        below = []
        for path in level:
            for child in sorted(root.get_children(path or "/")):
                node = f"{path}/{child}"
                seen += 1
                if node == "/zookeeper" or seen > max_nodes:
                    continue
                if child == "pipelines" and path and path != chroot:
                    names = [n for n in sorted(root.get_children(node)) if pipeline is None or n == pipeline]
                    if names:
                        found.append((path, names))
                else:
                    below.append(node)
        level = below
    return found
