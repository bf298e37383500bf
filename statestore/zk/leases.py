"""Key-interval leases with sequencers, held in ZooKeeper.

Connection states (as in kazoo's lock recipe): while the connection is
SUSPENDED the leases are *in doubt* -- the session may already have expired
on the server and another instance may own the intervals -- so
:meth:`LeaseManager.check_valid` raises :class:`LeaseSuspendedError` and no
commit may proceed. When kazoo reconnects (CONNECTED) within the session
timeout, the manager re-verifies every lease in a background thread
(:meth:`LeaseManager.renew`); ``check_valid`` keeps raising
``LeaseSuspendedError`` until that succeeds, and leases found gone are dropped.
When the session is LOST (expired), ZooKeeper has deleted our ephemeral owner
znodes: every held lease is dropped, ``on_lost(grants, reason)`` is called from
a separate thread (never inside kazoo's listener), and ``check_valid`` /
``renew`` raise :class:`LeaseLostError` for them until they are acquired again
(kazoo opens a new session by itself; new grants get higher sequencers).
:meth:`LeaseManager.await_settled` lets a caller *pause* instead of failing on
SUSPENDED: it returns once the connection is back and every lease re-verified
(or lost), so a blip shorter than the session timeout only delays commits.
:meth:`LeaseManager.await_valid` is that pause for a committer, with log lines: an
ensemble that lost its quorum (or a lone server that is down) answers nobody, so the
session can neither be confirmed nor expired; ZooKeeper restores sessions with a fresh
timeout when a quorum serves again, so the committer waits (``max_pause_s``, default
:data:`~.refusal.DEFAULT_MAX_PAUSE_S`; None: as long as the session is not reported expired),
logs that commits are paused and why, and resumes with the same leases once they are
re-verified -- never committing meanwhile. A server that lost its data refuses the session
without ever expiring it: paused past the session timeout, the committer probes the ensemble
and stops with :class:`CoordinatorStateLostError` when it is behind (``refusal.py``).

Layout below the client's chroot, per interval ``I`` (``{I:05d}``)::

    /pipelines/{p}/computations/{c}/intervals/{I}/owner        EPHEMERAL, LeaseGrant JSON
    /pipelines/{p}/computations/{c}/intervals/{I}/grants/g-N   PERSISTENT_SEQUENTIAL

Grant protocol (no window in which two owners both believe they own ``I``):

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
   (``break_lease`` refuses it; session expiry makes step 2 fail), and the
   session check catches anything else: then both contenders give up.

Release is ``check(our grant node, 0)`` + ``delete(owner, version=1)``, and
``break_lease`` deletes the owner together with its grant node, so a late
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.security import ACL

from ..clock import Clock, SystemClock
from ..exceptions import (
    CodecError,
    ConfigError,
    LeaseHeldError,
    LeaseLostError,
    LeaseSuspendedError,
)
from ..layout import validate_name
from .client import zk_errors
from .layout import ensure_zk_layout
from .refusal import DEFAULT_MAX_PAUSE_S, check_refused

__all__ = ["LeaseGrant", "LeaseManager", "break_lease", "list_leases", "interval_path", "LEASE_FORMAT_VERSION",
           "next_sequencers", "raise_sequencers"]

log = logging.getLogger(__name__)

LEASE_FORMAT_VERSION = 1
MAX_INTERVAL = 99_999
OnLost = Callable[[list["LeaseGrant"], str], None]
_SYSTEM_CLOCK = SystemClock()


@dataclass(frozen=True)
class LeaseGrant:
    """One grant of a key interval to an owner, with its sequencer.

    >>> g = LeaseGrant("p", "c", 3, "host-1", 17, 1000)
    >>> LeaseGrant.from_payload(g.to_payload()) == g
    True
    """

    pipeline: str
    computation: str
    interval: int
    owner: str
    sequencer: int
    granted_ms: int

    def to_payload(self) -> bytes:
        """JSON for the owner znode (carries ``format_version``)."""
        return json.dumps({"format_version": LEASE_FORMAT_VERSION, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def from_payload(cls, data: bytes) -> LeaseGrant:
        """Decode :meth:`to_payload` output.

        Raises:
            CodecError: not a complete grant, or written by a newer deltawheel.
        """
        raw = _decode(data)
        if raw.get("format_version") != LEASE_FORMAT_VERSION:
            raise CodecError(f"lease payload has format_version {raw.get('format_version')!r}, this "
                             f"deltawheel reads {LEASE_FORMAT_VERSION}; upgrade deltawheel")
        try:
            grant = cls(str(raw["pipeline"]), str(raw["computation"]), int(raw["interval"]),
                        str(raw["owner"]), int(raw["sequencer"]), int(raw["granted_ms"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CodecError(f"lease payload is not a complete grant (pending or damaged): {raw}{ZNODE_DAMAGED_HINT}") from exc
        return grant


ZNODE_DAMAGED_HINT = ("; the znode was written by something other than deltawheel or is damaged: see "
            "docs/coordinator-recovery.md ('Lost ZooKeeper data')")


def _decode(data: bytes) -> dict[str, Any]:
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


def _grant_path(base: str, sequencer: int) -> str:
    return f"{base}/grants/g-{sequencer:010d}"


@dataclass(frozen=True)
class _Held:
    grant: LeaseGrant
    session_id: int
    grant_path: str


def _zk_errors(what: str) -> Any:
    return zk_errors(what, expired="acquire the leases again",
                     lost="lost the connection to ZooKeeper; retry once it is back")


class LeaseManager:
    """Acquires, verifies and releases the key-interval leases of one job instance.

    Args:
        client: a started kazoo client (see :func:`.zkclient.connect`); the caller owns it.
        pipeline: pipeline name.
        owner: who this instance is (shown to others, e.g. ``host:pid``).
        clock: stamps ``granted_ms``.
        acls: ACLs for lease znodes (:func:`.zkclient.digest_acls`); ``None`` = open.
        on_lost: called with the lost grants and a reason when the session expires.
        keep_grants: grant nodes kept per interval (older ones are pruned).
        max_pause_s: how long :meth:`await_valid` pauses commits while the leases are in doubt
            (default :data:`~.refusal.DEFAULT_MAX_PAUSE_S`; None: as long as the session is not
            reported expired).
    """

    def __init__(
        self, client: KazooClient, *, pipeline: str, owner: str, clock: Clock = _SYSTEM_CLOCK,
        acls: list[ACL] | None = None, on_lost: OnLost | None = None, keep_grants: int = 5,
        max_pause_s: float | None = DEFAULT_MAX_PAUSE_S,
    ) -> None:
        self._client = client
        self.pipeline = validate_name("pipeline", pipeline)
        self.owner = owner
        self._clock = clock
        self._acls = acls
        self._on_lost = on_lost
        self._keep = max(1, keep_grants)
        self.max_pause_s = max_pause_s
        self._lock = threading.RLock()
        self._held: dict[str, dict[int, _Held]] = {}
        self._lost: dict[tuple[str, int], str] = {}
        self._suspended = client.state != KazooState.CONNECTED
        self._verifying = False
        self._closed = False
        ensure_zk_layout(client)
        client.add_listener(self._on_state)

    @property
    def zk_client(self) -> KazooClient:
        """The ZooKeeper client the leases are held with."""
        return self._client

    # --- connection state ---------------------------------------------------

    def _on_state(self, state: str) -> None:
        """kazoo listener: only flips flags and starts threads (never blocks or calls ZooKeeper)."""
        if state == KazooState.SUSPENDED:
            with self._lock:
                self._suspended = True
        elif state == KazooState.LOST:
            with self._lock:
                self._suspended = False
                grants = self._drop_all("ZooKeeper session expired")
            if grants:
                self._spawn(self._notify_lost, grants, "ZooKeeper session expired")
        elif state == KazooState.CONNECTED:
            with self._lock:
                was_suspended, self._suspended = self._suspended, False
                self._verifying = was_suspended and any(self._held.values())
            if self._verifying:
                self._spawn(self._reverify)

    def _drop_all(self, reason: str) -> list[LeaseGrant]:
        grants = [h.grant for per in self._held.values() for h in per.values()]
        for g in grants:
            self._lost[(g.computation, g.interval)] = reason
        self._held.clear()
        return grants

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        threading.Thread(target=target, args=args, daemon=True, name=f"deltawheel-{target.__name__}").start()

    def _notify_lost(self, grants: list[LeaseGrant], reason: str) -> None:
        if self._on_lost is None:
            return
        try:
            self._on_lost(grants, reason)
        except Exception:  # a failing callback must not kill the notifier
            log.exception("on_lost callback failed for %d leases", len(grants))

    def _reverify(self) -> None:
        with self._lock:
            before = [h.grant for per in self._held.values() for h in per.values()]
        try:
            self.renew()
        except LeaseLostError as exc:
            dropped = [g for g in before if g.interval not in self.held(g.computation)]
            log.warning("leases lost while disconnected: %s", exc)
            if dropped:
                self._notify_lost(dropped, "lease gone when re-verified after a reconnect")
        except LeaseSuspendedError:
            pass  # disconnected again; the next CONNECTED retries

    # --- acquire ------------------------------------------------------------

    def acquire(self, computation: str, intervals: Iterable[int], *, wait_s: float = 0.0) -> dict[int, LeaseGrant]:
        """Acquire every interval, or none (all-or-nothing).

        Intervals are taken in ascending order, so two instances waiting for each
        other's intervals cannot deadlock. Intervals already held are kept as is.

        Args:
            computation: computation name.
            intervals: key intervals (0..99999).
            wait_s: how long to wait for intervals held by others to be released.

        Raises:
            LeaseHeldError: an interval is still held by another owner after ``wait_s``
                (nothing acquired by this call is kept).
            LeaseSuspendedError: the ZooKeeper connection is suspended.
        """
        validate_name("computation", computation)
        wanted = sorted(set(intervals))
        for i in wanted:
            interval_path(self.pipeline, computation, i)  # range check
        self._check_open()
        deadline = time.monotonic() + wait_s
        got: dict[int, LeaseGrant] = {}
        new: list[int] = []
        try:
            for i in wanted:
                with self._lock:
                    mine = self._held.get(computation, {}).get(i)
                if mine is not None:
                    got[i] = mine.grant
                    continue
                got[i] = self._grant(computation, i, deadline)
                new.append(i)
        except BaseException:
            if new:
                try:
                    self.release(computation, new)
                except Exception:
                    log.exception("could not release intervals %s after a failed acquire", new)
            raise
        return got

    def _check_open(self) -> None:
        if self._closed:
            raise LeaseLostError("this LeaseManager is closed; create a new one")
        if self._suspended or self._client.state != KazooState.CONNECTED:
            raise LeaseSuspendedError("the ZooKeeper connection is suspended; retry once it reconnects")

    def _grant(self, computation: str, interval: int, deadline: float) -> LeaseGrant:
        base = interval_path(self.pipeline, computation, interval)
        owner_path = f"{base}/owner"
        what = f"interval {interval} of {self.pipeline}/{computation}"
        with _zk_errors(f"acquiring {what}"):
            self._client.ensure_path(f"{base}/grants", acl=self._acls)
            while True:
                client_id = self._client.client_id
                if client_id is None:
                    raise LeaseSuspendedError(f"acquiring {what}: not connected to ZooKeeper; retry")
                session_id = int(client_id[0])
                pending = {"format_version": LEASE_FORMAT_VERSION, "pipeline": self.pipeline,
                           "computation": computation, "interval": interval, "owner": self.owner,
                           "sequencer": None, "granted_ms": None, "token": uuid.uuid4().hex}
                # Step 1: owner (pending) + sequential grant node, atomically.
                tx = self._client.transaction()
                tx.create(owner_path, json.dumps(pending).encode(), acl=self._acls, ephemeral=True)
                tx.create(f"{base}/grants/g-", json.dumps(pending).encode(), acl=self._acls, sequence=True)
                res = tx.commit()
                if isinstance(res[0], NodeExistsError):
                    self._wait_for_release(owner_path, what, deadline)
                    continue
                if any(isinstance(r, NoAuthError) for r in res):
                    raise LeaseHeldError(f"{what} is protected by a digest ACL this client lacks; "
                                         "configure the same --zk-digest as the other instances")
                _raise_first(res)
                sequencer = int(str(res[1]).rsplit("g-", 1)[1])
                grant = LeaseGrant(self.pipeline, computation, interval, self.owner, sequencer,
                                   self._clock.now_ms())
                grant_path = _grant_path(base, sequencer)
                # Step 2: write the sequencer into our (still version-0) owner znode.
                tx = self._client.transaction()
                tx.check(grant_path, 0)
                tx.set_data(owner_path, grant.to_payload(), 0)
                res = tx.commit()
                if isinstance(res[0], Exception) or isinstance(res[1], Exception) \
                        or res[1].ephemeralOwner != session_id:
                    self._abandon(owner_path, session_id)
                    raise LeaseLostError(f"{what} was lost while being granted (broken or session "
                                         "expired); acquire it again")
                with self._lock:
                    self._held.setdefault(computation, {})[interval] = _Held(grant, session_id, grant_path)
                    self._lost.pop((computation, interval), None)
                self._prune(f"{base}/grants")
                return grant

    def _wait_for_release(self, owner_path: str, what: str, deadline: float) -> None:
        released = threading.Event()
        try:
            data, stat = self._client.get(owner_path, watch=lambda _event: released.set())
        except NoNodeError:
            return  # released meanwhile: try again at once
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not released.wait(remaining):
            try:
                holder = _decode(data).get("owner")
            except CodecError:
                holder = "?"
            raise LeaseHeldError(f"{what} is held by {holder!r} (ZooKeeper client id 0x{stat.ephemeralOwner:x}); "
                                 "wait for it to release, or break the lease ('deltawheel leases break')")

    def _abandon(self, owner_path: str, session_id: int) -> None:
        try:
            stat = self._client.exists(owner_path)
            if stat is not None and stat.ephemeralOwner == session_id:
                self._client.delete(owner_path, version=stat.version)
        except Exception:
            log.exception("could not clean up %s", owner_path)

    def _prune(self, grants_dir: str) -> None:
        try:
            old = sorted(self._client.get_children(grants_dir))[:-self._keep]
            for name in old:
                try:
                    self._client.delete(f"{grants_dir}/{name}", version=0)
                except (NoNodeError, NoAuthError):
                    pass
        except (ConnectionLoss, SessionExpiredError):
            pass  # pruning is housekeeping; the next grant retries

    # --- verify, release ----------------------------------------------------

    def held(self, computation: str) -> dict[int, LeaseGrant]:
        """The leases of ``computation`` this instance believes it holds."""
        with self._lock:
            return {i: h.grant for i, h in self._held.get(computation, {}).items()}

    def check_valid(self, computation: str, interval: int) -> None:
        """Fast local check before a commit (no ZooKeeper round trip).

        Raises:
            LeaseLostError: the lease is not held (lost, broken, released or never acquired).
            LeaseSuspendedError: the connection is suspended or ownership is being re-verified.
        """
        with self._lock:
            if self._closed:
                raise LeaseLostError("this LeaseManager is closed; create a new one")
            reason = self._lost.get((computation, interval))
            if reason is not None:
                raise LeaseLostError(f"lease on interval {interval} of {self.pipeline}/{computation} "
                                     f"was lost ({reason}); acquire it again before committing")
            if self._suspended or self._client.state != KazooState.CONNECTED:
                raise LeaseSuspendedError(f"ZooKeeper connection is suspended; lease on interval {interval} "
                                          "is in doubt, wait for the reconnect")
            if self._verifying:
                raise LeaseSuspendedError("reconnected to ZooKeeper; leases are being re-verified, retry shortly")
            if interval not in self._held.get(computation, {}):
                raise LeaseLostError(f"interval {interval} of {self.pipeline}/{computation} is not held "
                                     "by this instance; acquire it first")

    def await_settled(self, timeout_s: float | None = None) -> bool:
        """Wait until the connection is CONNECTED and no lease is being re-verified (a blip is over).

        Returns False when it is still suspended after ``timeout_s`` (default: twice the
        client's session timeout plus 5 s, by which kazoo has either reconnected or reported
        the session LOST). Leases lost meanwhile then raise from :meth:`check_valid`.
        """
        if timeout_s is None:
            timeout_s = 2 * session_timeout_s(self._client) + 5.0
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._closed or (not self._suspended and not self._verifying
                                    and self._client.state == KazooState.CONNECTED):
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def await_valid(self, computation: str, intervals: Iterable[int], *, max_pause_s: float | None = None,
                    log_every_s: float = 30.0) -> float:
        """Check the leases of ``intervals`` before a commit; *pause* while they are in doubt.

        While the connection is SUSPENDED (the server went away, the ensemble lost its quorum)
        no lease can be trusted and nothing may be committed. This waits for the reconnect and
        the re-verification, logging a warning when the pause starts, every ``log_every_s``
        while it lasts, and when commits resume. Paused longer than the session timeout, it
        probes the ensemble (``refusal.py``): one that lost its data is not waited for.

        Args:
            computation: whose leases.
            intervals: the intervals the commit writes.
            max_pause_s: give up after this long (default: the manager's ``max_pause_s``; None
                there too: wait as long as the session is not reported expired).
            log_every_s: seconds between "still paused" log lines.

        Returns:
            Seconds paused (0.0 when the leases were valid at once).

        Raises:
            LeaseLostError: a lease is lost (e.g. the session expired during the pause).
            LeaseSuspendedError: still in doubt after ``max_pause_s`` (no server answers, or the
                ensemble has no quorum).
            CoordinatorStateLostError: the ensemble serves, but lost its data (it refuses the
                session: it is behind the last transaction this client saw).
        """
        ivs = sorted(set(intervals))
        bound = self.max_pause_s if max_pause_s is None else max_pause_s
        started: float | None = None
        next_log = 0.0
        what = f"commits of {self.pipeline}/{computation}"
        while True:
            try:
                for iv in ivs:
                    self.check_valid(computation, iv)
            except LeaseSuspendedError as exc:
                now = time.monotonic()
                if started is None:
                    started, next_log = now, now + log_every_s
                    log.warning("%s paused: %s (no ZooKeeper server answers, or the ensemble lost its quorum); "
                                "waiting for it to serve again, nothing is committed meanwhile", what, exc)
                elif now >= next_log:
                    next_log = now + log_every_s
                    log.warning("%s still paused after %.0f s: ZooKeeper does not serve", what, now - started)
                final = bound is not None and now - started >= bound
                # a server that lost its data refuses the session without expiring it: found, not waited for
                check_refused(self._client, paused_s=now - started, what=what, pipeline=self.pipeline, final=final)
                if final:
                    raise LeaseSuspendedError(
                        f"{what} paused for {now - started:.0f} s and ZooKeeper still does not serve ({exc}): no "
                        "server answers (unreachable, or down) or the ensemble lost its quorum; nothing was "
                        "committed. Bring ZooKeeper back (a majority of the ensemble's servers) and run again") from exc
                self.await_settled(timeout_s=1.0 if bound is None else max(0.05, min(1.0, bound - (now - started))))
                continue
            if started is None:
                return 0.0
            paused = time.monotonic() - started
            log.warning("%s resume: ZooKeeper serves again and the leases were re-verified after a pause of "
                        "%.1f s", what, paused)
            return paused

    def renew(self, computation: str | None = None) -> None:
        """Verify with ZooKeeper that every held lease (of ``computation``, or all) is still ours.

        Raises:
            LeaseLostError: a lease is gone or belongs to someone else (it is dropped).
            LeaseSuspendedError: the connection is suspended.
        """
        self._check_open()
        with self._lock:
            items = [h for c, per in self._held.items() if computation in (None, c) for h in per.values()]
            lost = [(c, i, r) for (c, i), r in self._lost.items() if computation in (None, c)]
        client_id = self._client.client_id
        session_id = int(client_id[0]) if client_id else None
        gone: list[tuple[_Held, str]] = []
        for h in items:
            g = h.grant
            path = f"{interval_path(g.pipeline, g.computation, g.interval)}/owner"
            with _zk_errors(f"renewing interval {g.interval}"):
                try:
                    data, stat = self._client.get(path)
                except NoNodeError:
                    gone.append((h, "owner znode is gone (lease broken or session expired)"))
                    continue
            seq = _decode(data).get("sequencer")
            if stat.ephemeralOwner != h.session_id or session_id != h.session_id or seq != g.sequencer:
                gone.append((h, f"taken over (owner sequencer {seq}, ours {g.sequencer})"))
        with self._lock:
            for h, reason in gone:
                self._held.get(h.grant.computation, {}).pop(h.grant.interval, None)
                self._lost[(h.grant.computation, h.grant.interval)] = reason
                lost.append((h.grant.computation, h.grant.interval, reason))
            if computation is None:
                self._verifying = False  # every lease was checked with ZooKeeper
        if lost:
            desc = "; ".join(f"{c}/{i}: {r}" for c, i, r in sorted(lost))
            raise LeaseLostError(f"leases of pipeline {self.pipeline} lost: {desc}; acquire them again")

    def release(self, computation: str | None = None, intervals: Iterable[int] | None = None) -> None:
        """Give up leases (all, one computation's, or some intervals); only znodes still ours are deleted.

        Raises:
            LeaseSuspendedError: the connection dropped mid-way (the rest stay held; retry).
        """
        wanted = None if intervals is None else set(intervals)
        with self._lock:
            targets = [h for c, per in self._held.items() if computation in (None, c)
                       for i, h in per.items() if wanted is None or i in wanted]
            if targets and (self._suspended or self._client.state != KazooState.CONNECTED):
                raise LeaseSuspendedError("cannot release while the ZooKeeper connection is suspended; "
                                          "retry once it reconnects (the leases end with the session anyway)")
            for key in [k for k in self._lost if computation in (None, k[0]) and (wanted is None or k[1] in wanted)]:
                del self._lost[key]
        client_id = self._client.client_id
        for h in targets:
            g = h.grant
            if client_id is not None and int(client_id[0]) == h.session_id:
                tx = self._client.transaction()
                tx.check(h.grant_path, 0)
                tx.delete(f"{interval_path(g.pipeline, g.computation, g.interval)}/owner", 1)
                with _zk_errors(f"releasing interval {g.interval}"):
                    tx.commit()  # a failed check means it was no longer ours: nothing to delete
            with self._lock:
                self._held.get(g.computation, {}).pop(g.interval, None)

    def close(self) -> None:
        """Release every lease (best effort) and stop listening; the client stays open."""
        try:
            self.release()
        except (LeaseSuspendedError, LeaseLostError):
            log.warning("could not release leases on close; they end with the session")
        with self._lock:
            self._held.clear()
            self._closed = True
        self._client.remove_listener(self._on_state)


def session_timeout_s(client: KazooClient) -> float:
    """The session timeout ``client`` asked for, in seconds (kazoo keeps it in ms)."""
    return float(getattr(client, "_session_timeout", 10_000)) / 1000.0


def _raise_first(results: list[Any]) -> None:
    for r in results:
        if isinstance(r, Exception) and type(r).__name__ != "RolledBackError":
            raise r


def break_lease(client: KazooClient, *, pipeline: str, computation: str, interval: int,
                apply: bool = False) -> dict[str, Any]:
    """Take a lease away from its owner (an operator tool; dry run by default).

    Returns:
        The plan: ``path``, ``held``, and when held the current ``owner``,
        ``sequencer``, ``session`` and ``version``; ``applied`` tells whether the
        owner znode was deleted.

    Raises:
        LeaseHeldError: the lease is protected by an ACL this client lacks, or a
            grant is in progress (retry).
    """
    base = interval_path(validate_name("pipeline", pipeline), validate_name("computation", computation), interval)
    plan: dict[str, Any] = {"path": f"{base}/owner", "pipeline": pipeline, "computation": computation,
                            "interval": interval, "held": False, "applied": False}
    try:
        data, stat = client.get(f"{base}/owner")
    except NoNodeError:
        plan["action"] = "nothing to break: the interval has no owner"
        return plan
    raw = _decode(data)
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
    grant = _grant_path(base, int(raw["sequencer"]))
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

    def children(path: str) -> list[str]:
        try:
            return sorted(client.get_children(path))
        except NoNodeError:
            return []

    for p in [pipeline] if pipeline else children("/pipelines"):
        for c in children(f"/pipelines/{p}/computations"):
            for name in children(f"/pipelines/{p}/computations/{c}/intervals"):
                base = f"/pipelines/{p}/computations/{c}/intervals/{name}"
                grants = children(f"{base}/grants")
                row: dict[str, Any] = {"pipeline": p, "computation": c, "interval": int(name), "owner": None,
                                       "sequencer": None, "session": None, "granted_ms": None,
                                       "last_sequencer": int(grants[-1].rsplit("g-", 1)[1]) if grants else None}
                try:
                    data, stat = client.get(f"{base}/owner")
                    raw = _decode(data)
                    row.update(owner=raw.get("owner"), sequencer=raw.get("sequencer"),
                               session=f"0x{stat.ephemeralOwner:x}", granted_ms=raw.get("granted_ms"))
                except NoNodeError:
                    pass
                out.append(row)
    return out


def next_sequencers(client: KazooClient, *, pipeline: str, computation: str,
                    intervals: Iterable[int]) -> dict[int, int]:
    """Per interval, one above the highest sequencer ZooKeeper's grant nodes record (0: none).

    Grants are issued in increasing order and the newest grant node of an interval is kept
    (older ones are pruned), so every grant ZooKeeper made is below this value. A store whose
    fences carry a sequencer at or above it was written under grants this ZooKeeper no longer
    knows (its data was lost): see :class:`~.exceptions.CoordinatorStateLostError`. Read-only;
    usable by any check that compares the store with ZooKeeper.
    """
    out: dict[int, int] = {}
    for iv in sorted(set(intervals)):
        try:
            names = client.get_children(f"{interval_path(pipeline, computation, iv)}/grants")
        except NoNodeError:
            names = []
        nums = [int(n.rsplit("g-", 1)[1]) for n in names if n.startswith("g-") and n[2:].isdigit()]
        out[iv] = max(nums) + 1 if nums else 0
    return out


def raise_sequencers(client: KazooClient, *, pipeline: str, computation: str, floors: Mapping[int, int],
                     acls: list[ACL] | None = None, ops_per_transaction: int = 500) -> dict[int, int]:
    """Make every later grant of each interval get a sequencer of at least ``floors[interval]``.

    ZooKeeper numbers the sequential grant nodes from a counter of the ``grants`` node that
    grows with every child created there. This creates and deletes placeholder children (in
    transactions of ``ops_per_transaction`` operations) until a sequential node gets a number
    at or above ``floor - 1``; that node stays, as a grant node marked ``reseed``, so that
    :func:`next_sequencers` sees it. Never lowers anything; safe to repeat and to run beside
    running writers. Returns the next sequencer per interval.
    """
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
            _raise_first(tx.commit())
    return out
