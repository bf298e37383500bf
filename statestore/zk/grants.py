"""One grant of a key interval: its payload, its znodes, and the two transactions that make it.

ZooKeeper SUSPENDED / LOST: :func:`take_interval` and :func:`prune_grants` make plain kazoo
calls; the caller translates their errors (:class:`~.leases.LeaseManager`: a dropped connection
becomes :class:`LeaseSuspendedError`, an expired session :class:`LeaseLostError`). The owner
znode is EPHEMERAL and a grant is believed only when its second transaction succeeds in the
session that created it, so a grant cut off by a LOST session is never believed, and the end of
that session deletes its owner znode. Pruning old grant nodes gives up quietly on either state.

Znodes: ``intervals/{I}/owner`` (EPHEMERAL) and ``intervals/{I}/grants/g-N``
(PERSISTENT_SEQUENTIAL); the full layout: docs/operations.md, "Leases".

Grant protocol, in two phases (no window in which two owners both believe they own ``I``):

1. One transaction creates ``owner`` with a *pending* payload (no sequencer) and
   a sequential grant node. ``owner`` already existing fails the whole
   transaction, so at most one grant per interval is in progress or held. The
   sequence number ZooKeeper gives the grant node is the sequencer: it comes
   from the ``grants`` node's cversion, which only grows, so it is greater than
   every earlier grant's even after old grant nodes were pruned.
2. One transaction ``check(grant node, version=0)`` + ``set(owner, grant,
   version=0)`` writes the sequencer into ``owner``. The grant is believed only
   if it succeeds *and* the returned stat's ephemeralOwner is our session. A
   version-0 (pending) owner is never deleted by anybody but its creator
   (``break_lease`` refuses it; session expiry makes phase 2 fail), and the
   session check catches anything else: then both contenders give up.

A restart of the same job instance (``instance``) replaces a granted owner znode of another
session carrying its name (``delete(owner, version=1)`` + phase 1's creates, one transaction),
then phase 2 follows as usual. The new grant's sequencer is greater than the predecessor's, so
its commits are fenced from the takeover on. A pending owner znode is never taken over
(docs/fencing.md, "Restarts").

Release is ``check(our grant node, 0)`` + ``delete(owner, version=1)``, and
``break_lease`` (``lease_tools.py``) deletes the owner together with its grant node, so a late
release of a broken lease cannot delete the next owner's znode. Leases only
decide who works on an interval; the sequencer fences every Delta commit, so a
stale owner can never commit (see ``fencing``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
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


@dataclass(frozen=True)
class LeaseGrant:
    """One grant of a key interval to an owner, with its sequencer.

    ``instance``: the job instance's name, kept across its restarts (None: an unnamed one).

    >>> g = LeaseGrant("p", "c", 3, "host-1", 17, 1000, instance="a")
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

        Raises:
            CodecError: not a complete grant, or written by a newer deltawheel.
        """
        raw = decode_lease(data)
        if raw.get("format_version") != LEASE_FORMAT_VERSION:
            raise CodecError(f"lease payload has format_version {raw.get('format_version')!r}, this "
                             f"deltawheel reads {LEASE_FORMAT_VERSION}; upgrade deltawheel")
        try:
            grant = cls(str(raw["pipeline"]), str(raw["computation"]), int(raw["interval"]),
                        str(raw["owner"]), int(raw["sequencer"]), int(raw["granted_ms"]),
                        instance=None if raw.get("instance") is None else str(raw["instance"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CodecError(f"lease payload is not a complete grant (pending or damaged): {raw}{ZNODE_DAMAGED_HINT}") from exc
        return grant


ZNODE_DAMAGED_HINT = ("; the znode was written by something other than deltawheel or is damaged: see "
            "docs/coordinator-recovery.md ('Lost ZooKeeper data')")


def decode_lease(data: bytes) -> dict[str, Any]:
    """The JSON object of an owner znode (any format version, pending or granted).

    Raises:
        CodecError: not a JSON object.
    """
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CodecError(f"lease payload is not JSON: {data[:80]!r}{ZNODE_DAMAGED_HINT}") from exc
    if not isinstance(raw, dict):
        raise CodecError(f"lease payload is not a JSON object: {data[:80]!r}{ZNODE_DAMAGED_HINT}")
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
    """A grant this client made: the grant, the session that owns its owner znode, its grant node."""

    grant: LeaseGrant
    session_id: int
    grant_path: str


def take_interval(client: KazooClient, *, pipeline: str, computation: str, interval: int, owner: str,
                  clock: Clock, acls: list[ACL] | None, deadline: float, instance: str | None = None) -> HeldGrant:
    """Grant ``interval`` to ``owner`` (the two phases above), waiting until ``deadline``
    (``time.monotonic()``) for another owner to release it. A grant of another session carrying
    ``instance`` (this job instance's earlier process) is taken over at once instead.

    Raises:
        LeaseHeldError: still held by another owner at ``deadline``, or protected by a digest ACL
            this client lacks.
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
                continue  # the owner znode changed meanwhile (released, or taken by someone else): look again
            res = taken
        if any(isinstance(r, NoAuthError) for r in res):
            raise LeaseHeldError(f"{what} is protected by a digest ACL this client lacks; "
                                 "configure the same --zk-digest as the other instances")
        raise_first(res)
        sequencer = int(str(res[-1]).rsplit("g-", 1)[1])
        grant = LeaseGrant(pipeline, computation, interval, owner, sequencer, clock.now_ms(), instance=instance)
        node = grant_path(base, sequencer)
        # Phase 2: write the sequencer into our (still version-0) owner znode.
        tx = client.transaction()
        tx.check(node, 0)
        tx.set_data(owner_path, grant.to_payload(), 0)
        res = tx.commit()
        if isinstance(res[0], Exception) or isinstance(res[1], Exception) \
                or res[1].ephemeralOwner != session_id:
            _abandon(client, owner_path, session_id)
            raise LeaseLostError(f"{what} was lost while being granted (broken or session "
                                 "expired); acquire it again")
        return HeldGrant(grant, session_id, node)


def _take_over(client: KazooClient, owner_path: str, base: str, pending: bytes, *, acls: list[ACL] | None,
               instance: str | None, session_id: int) -> list[Any] | None:
    """Phase 1 over a grant this job instance's earlier process holds: delete its owner znode and
    make ours in one transaction. Returns the transaction's results, or None when the owner
    znode is not such a grant (another instance's, a pending one, or ours): then wait as usual."""
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
    """Delete all but the newest ``keep`` grant nodes of ``grants_dir`` (housekeeping: gives up
    quietly when the connection drops; the next grant prunes again). ``sequencer``: the newest
    grant's; below ``keep`` there cannot be more than ``keep`` grant nodes (a sequence number
    counts every child made or deleted before it), so nothing is listed (a round trip less)."""
    if sequencer is not None and sequencer < keep:
        return
    try:
        old = sorted(client.get_children(grants_dir))[:-keep]
        for name in old:
            try:
                client.delete(f"{grants_dir}/{name}", version=0)
            except (NoNodeError, NoAuthError):
                pass
    except (ConnectionLoss, SessionExpiredError):
        pass  # pruning is housekeeping; the next grant retries
