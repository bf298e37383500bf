"""One grant of a key interval: its payload, its znodes, and the two transactions that make it.

ZooKeeper SUSPENDED / LOST: plain kazoo calls whose errors the caller translates; a grant is
believed only when its second transaction succeeds in the session that created it.

Znodes ``intervals/{I}/owner`` (EPHEMERAL) and ``grants/g-N`` (docs/operations.md). Grant protocol:

1. One transaction creates ``owner`` with a *pending* payload and a sequential grant node
   (``owner`` existing fails it). The grant node's sequence number is the sequencer: it only grows.
2. One transaction ``check(grant node, version=0)`` + ``set(owner, grant, version=0)`` writes the
   sequencer; the grant is believed only if it succeeds *and* ephemeralOwner is our session.

A restart of the same instance replaces its granted owner znode in phase 1 (docs/fencing.md)."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from contextlib import suppress
from dataclasses import asdict, dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.security import ACL

from ..clock import Clock
from ..exceptions import CodecError, ConfigError, LeaseHeldError, LeaseLostError, LeaseSuspendedError

__all__ = ["LEASE_FORMAT_VERSION", "MAX_INTERVAL", "ZNODE_DAMAGED_HINT", "HeldGrant", "LeaseGrant",
           "decode_lease", "grant_path", "interval_path", "prune_grants", "raise_first", "take_interval"]

log = logging.getLogger(__name__)

LEASE_FORMAT_VERSION = 1
MAX_INTERVAL = 99_999


@dataclass(frozen=True, kw_only=True)
class LeaseGrant:
    """One grant of a key interval to an owner, with its sequencer.

    >>> g = LeaseGrant(pipeline="p", computation="c", interval=3, owner="host-1", sequencer=17, granted_ms=1000,
    ...                instance="a")
    >>> LeaseGrant.from_payload(g.to_payload()) == g
    True
    """

    pipeline: str
    computation: str
    interval: int
    owner: str
    sequencer: int
    granted_ms: int
    instance: str | None = None

    def to_payload(self) -> bytes:
        """JSON for the owner znode (carries ``format_version``)."""
        return json.dumps({"format_version": LEASE_FORMAT_VERSION, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def from_payload(cls, data: bytes) -> LeaseGrant:
        """Decode :meth:`to_payload` output.
        Raises CodecError: not a complete grant, or written by a newer deltawheel."""
        raw = decode_lease(data)
        if raw.get("format_version") != LEASE_FORMAT_VERSION:
            raise CodecError(f"lease payload has format_version {raw.get('format_version')!r}, this "
                             f"deltawheel reads {LEASE_FORMAT_VERSION}; upgrade deltawheel")
        try:
            return cls(pipeline=str(raw["pipeline"]), computation=str(raw["computation"]),
                       interval=int(raw["interval"]), owner=str(raw["owner"]),
                       sequencer=int(raw["sequencer"]), granted_ms=int(raw["granted_ms"]),
                       instance=None if raw.get("instance") is None else str(raw["instance"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CodecError(f"lease payload is not a complete grant (pending or damaged): {raw}{ZNODE_DAMAGED_HINT}") from exc


ZNODE_DAMAGED_HINT = ("; the znode was written by something other than deltawheel or is damaged: see "
            "docs/coordinator-recovery.md ('Lost ZooKeeper data')")


def decode_lease(data: bytes, what: str = "lease") -> dict[str, Any]:
    """The JSON object of an owner znode (any format version, pending or granted), or of ``what``'s.
    Raises CodecError: not a JSON object."""
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CodecError(f"{what} payload is not JSON: {data[:80]!r}{ZNODE_DAMAGED_HINT}") from exc
    if not isinstance(raw, dict):
        raise CodecError(f"{what} payload is not a JSON object: {data[:80]!r}{ZNODE_DAMAGED_HINT}")
    return raw


def interval_path(pipeline: str, computation: str, interval: int) -> str:
    """Znode of one key interval (holds ``owner`` and ``grants``).

    >>> interval_path("p", "c", 7)
    '/pipelines/p/computations/c/intervals/00007'
    """
    if not 0 <= interval <= MAX_INTERVAL:
        raise ConfigError(f"key interval {interval} is out of range 0..{MAX_INTERVAL}")
    return f"/pipelines/{pipeline}/computations/{computation}/intervals/{interval:05d}"


def grant_path(base: str, sequencer: int) -> str:
    """The grant node of ``sequencer`` below the interval znode ``base``.

    >>> grant_path("/i", 42)
    '/i/grants/g-0000000042'
    """
    return f"{base}/grants/g-{sequencer:010d}"


def raise_first(results: list[Any]) -> None:
    """Raise the first error of a committed transaction's results (not the roll-backs it caused)."""
    for r in results:
        if isinstance(r, Exception) and type(r).__name__ != "RolledBackError":
            raise r


@dataclass(frozen=True)
class HeldGrant:
    """A grant this client made, with its owner znode's session and its grant node."""

    grant: LeaseGrant
    session_id: int
    grant_path: str


def take_interval(client: KazooClient, *, pipeline: str, computation: str, interval: int, owner: str,
                  clock: Clock, acls: list[ACL] | None, deadline: float, instance: str | None = None) -> HeldGrant:
    """Grant ``interval`` to ``owner``, waiting until ``deadline`` (monotonic) for a release.

    Raises:
        LeaseHeldError: still held by another owner at ``deadline``, or a digest ACL refuses it.
        LeaseLostError: lost while being granted (broken, or the session expired).
        LeaseSuspendedError: not connected to ZooKeeper.
    """
    base = interval_path(pipeline, computation, interval)
    owner_path = f"{base}/owner"
    what = f"interval {interval} of {pipeline}/{computation}"
    client.ensure_path(f"{base}/grants", acl=acls)
    while True:
        client_id = client.client_id
        if client_id is None:
            raise LeaseSuspendedError(f"acquiring {what}: not connected to ZooKeeper; retry")
        session_id = int(client_id[0])
        pending = json.dumps({"format_version": LEASE_FORMAT_VERSION, "pipeline": pipeline,
                              "computation": computation, "interval": interval, "owner": owner,
                              "instance": instance, "sequencer": None, "granted_ms": None,
                              "token": uuid.uuid4().hex}).encode()
        # Phase 1: owner (pending) + sequential grant node, atomically.
        tx = client.transaction()
        tx.create(owner_path, pending, acl=acls, ephemeral=True)
        tx.create(f"{base}/grants/g-", pending, acl=acls, sequence=True)
        res = tx.commit()
        if isinstance(res[0], NodeExistsError):
            taken = _take_over(client, owner_path, base, pending, acls=acls, instance=instance, session_id=session_id)
            if taken is None:
                _wait_for_release(client, owner_path, what, deadline)
                continue
            if not any(isinstance(r, NoAuthError) for r in taken) \
                    and any(isinstance(r, (NoNodeError, BadVersionError, NodeExistsError)) for r in taken):
                continue  # the owner znode changed meanwhile: look again
            res = taken
        if any(isinstance(r, NoAuthError) for r in res):
            raise LeaseHeldError(f"{what} is protected by a digest ACL this client lacks; "
                                 "configure the same --zk-digest as the other instances")
        raise_first(res)
        sequencer = int(str(res[-1]).rsplit("g-", 1)[1])
        grant = LeaseGrant(pipeline=pipeline, computation=computation, interval=interval, owner=owner,
                           sequencer=sequencer, granted_ms=clock.now_ms(), instance=instance)
        node = grant_path(base, sequencer)
        # Phase 2: write the sequencer into our (still version-0) owner znode.
        tx = client.transaction()
        tx.check(node, 0)
        tx.set_data(owner_path, grant.to_payload(), 0)
        res = tx.commit()
        if any(isinstance(r, Exception) for r in res) or res[1].ephemeralOwner != session_id:
            _abandon(client, owner_path, session_id)
            raise LeaseLostError(f"{what} was lost while being granted (broken or session "
                                 "expired); acquire it again")
        return HeldGrant(grant, session_id, node)


def _take_over(client: KazooClient, owner_path: str, base: str, pending: bytes, *, acls: list[ACL] | None,
               instance: str | None, session_id: int) -> list[Any] | None:
    """Phase 1 over a grant of this instance's earlier process; None: not such a grant, wait."""
    if instance is None:
        return None
    try:
        data, stat = client.get(owner_path)
    except NoNodeError:
        return [NoNodeError()]  # released meanwhile: try again at once
    try:
        raw = decode_lease(data)
    except CodecError:
        return None
    if raw.get("instance") != instance or raw.get("sequencer") is None or stat.version != 1 \
            or stat.ephemeralOwner == session_id:
        return None
    tx = client.transaction()
    tx.delete(owner_path, version=1)
    tx.create(owner_path, pending, acl=acls, ephemeral=True)
    tx.create(f"{base}/grants/g-", pending, acl=acls, sequence=True)
    res: list[Any] = tx.commit()
    if not any(isinstance(r, Exception) for r in res):
        log.warning("%s: took over the lease of %r (sequencer %s, ZooKeeper client id 0x%x), an earlier process "
                    "of instance %r: its commits are fenced from now on", owner_path, raw.get("owner"),
                    raw.get("sequencer"), stat.ephemeralOwner, instance)
    return res


def _wait_for_release(client: KazooClient, owner_path: str, what: str, deadline: float) -> None:
    released = threading.Event()
    try:
        data, stat = client.get(owner_path, watch=lambda _event: released.set())
    except NoNodeError:
        return  # released meanwhile: try again at once
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not released.wait(remaining):
        try:
            holder = decode_lease(data).get("owner")
        except CodecError:
            holder = "?"
        raise LeaseHeldError(f"{what} is held by {holder!r} (ZooKeeper client id 0x{stat.ephemeralOwner:x}); "
                             "wait for it to release, or break the lease ('deltawheel leases break')")


def _abandon(client: KazooClient, owner_path: str, session_id: int) -> None:
    try:
        stat = client.exists(owner_path)
        if stat is not None and stat.ephemeralOwner == session_id:
            client.delete(owner_path, version=stat.version)
    except Exception:
        log.exception("could not clean up %s", owner_path)


def prune_grants(client: KazooClient, grants_dir: str, *, keep: int, sequencer: int | None = None) -> None:
    """Delete all but the newest ``keep`` grant nodes (``sequencer``: the newest one's, to skip early)."""
    if sequencer is not None and sequencer < keep:
        return
    with suppress(ConnectionLoss, SessionExpiredError):  # pruning is housekeeping; the next grant retries
        for name in sorted(client.get_children(grants_dir))[:-keep]:
            with suppress(NoNodeError, NoAuthError):
                client.delete(f"{grants_dir}/{name}", version=0)
