"""Key-interval leases with sequencers, held in ZooKeeper.

While SUSPENDED the leases are *in doubt*: :meth:`LeaseManager.check_valid` raises
:class:`LeaseSuspendedError` until every lease is re-verified after the reconnect. When the session
is LOST every lease is dropped, ``on_lost(grants, reason)`` is called from a separate thread, and
they raise :class:`LeaseLostError`. docs/coordinator-recovery.md; the grant protocol: ``grants.py``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoNodeError
from kazoo.security import ACL

from ..clock import Clock, SystemClock
from ..exceptions import CodecError, LeaseLostError, LeaseSuspendedError, SessionLostError
from ..layout import validate_name
from .client import zk_errors
from .grants import HeldGrant, LeaseGrant, decode_lease, interval_path, prune_grants, take_interval
from .layout import ensure_zk_layout
from .refusal import DEFAULT_MAX_PAUSE_S, session_timeout_s
from .watermarks.pause import Pause

__all__ = ["LeaseManager"]

log = logging.getLogger(__name__)

OnLost = Callable[[list[LeaseGrant], str], None]
_SYSTEM_CLOCK = SystemClock()
SESSION_EXPIRED = "ZooKeeper session expired"  # the reason of every lease a LOST session took along


def _zk_errors(what: str) -> Any:
    return zk_errors(what, expired="acquire the leases again",
                     lost="lost the connection to ZooKeeper; retry once it is back")


class LeaseManager:
    """Acquires, verifies and releases the key-interval leases of one job instance.

    ``owner``: shown to others (e.g. ``host:pid``); ``instance``: the name kept across restarts,
    whose earlier process's leases are taken over at once (``grants.py``); ``on_lost(grants,
    reason)``: called when leases are lost; ``max_pause_s``: the bound of :meth:`await_valid`."""

    def __init__(
        self, client: KazooClient, *, pipeline: str, owner: str, clock: Clock = _SYSTEM_CLOCK,
        acls: list[ACL] | None = None, on_lost: OnLost | None = None, keep_grants: int = 5,
        max_pause_s: float | None = DEFAULT_MAX_PAUSE_S, instance: str | None = None,
    ) -> None:
        self._client = client
        self.pipeline = validate_name("pipeline", pipeline)
        self.owner = owner
        self.instance = None if instance is None else validate_name("instance", instance)
        self._clock = clock
        self._acls = acls
        self._on_lost = on_lost
        self._keep = max(1, keep_grants)
        self.max_pause_s = max_pause_s
        self._lock = threading.RLock()
        self._held: dict[str, dict[int, HeldGrant]] = {}
        self._lost: dict[tuple[str, int], str] = {}
        self._releasing: set[int] = set()  # id() of the held grants release() is deleting: not taken over
        self._suspended = client.state != KazooState.CONNECTED
        self._verifying = False
        self._closed = False
        ensure_zk_layout(client)
        client.add_listener(self._on_state)

    @property
    def zk_client(self) -> KazooClient:
        """The ZooKeeper client the leases are held with."""
        return self._client

    def _on_state(self, state: str) -> None:
        """kazoo listener: only flips flags and starts threads."""
        if state == KazooState.SUSPENDED:
            with self._lock:
                self._suspended = True
        elif state == KazooState.LOST:
            with self._lock:
                self._suspended = False
                grants = [h.grant for per in self._held.values() for h in per.values()]
                self._lost.update({(g.computation, g.interval): SESSION_EXPIRED for g in grants})
                self._held.clear()
            if grants:
                self._spawn(self._notify_lost, grants, SESSION_EXPIRED)
        elif state == KazooState.CONNECTED:
            with self._lock:
                was_suspended, self._suspended = self._suspended, False
                self._verifying = was_suspended and any(self._held.values())
            if self._verifying:
                self._spawn(self._reverify)

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

    def acquire(self, computation: str, intervals: Iterable[int], *, wait_s: float = 0.0) -> dict[int, LeaseGrant]:
        """Acquire every interval, or none, in ascending order (no deadlock); ``wait_s``: for a release.
        Raises LeaseHeldError (an interval still held by another owner after ``wait_s``) or
        LeaseSuspendedError (the connection is suspended)."""
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
        with _zk_errors(f"acquiring interval {interval} of {self.pipeline}/{computation}"):
            held = take_interval(self._client, pipeline=self.pipeline, computation=computation, interval=interval,
                                 owner=self.owner, clock=self._clock, acls=self._acls, deadline=deadline,
                                 instance=self.instance)
            with self._lock:
                self._held.setdefault(computation, {})[interval] = held
                self._lost.pop((computation, interval), None)
            self._watch(held)
            prune_grants(self._client, f"{base}/grants", keep=self._keep, sequencer=held.grant.sequencer)
            return held.grant

    def _watch(self, held: HeldGrant) -> None:
        """Drop the lease as soon as another session replaces the owner znode of ``held``."""
        path = f"{interval_path(held.grant.pipeline, held.grant.computation, held.grant.interval)}/owner"

        def changed(_event: Any) -> None:  # kazoo's thread: only start one
            self._spawn(self._check_taken, held, path)

        try:
            self._client.exists(path, watch=changed)
        except Exception:
            log.debug("could not watch %s", path, exc_info=True)

    def _check_taken(self, held: HeldGrant, path: str) -> None:
        g = held.grant
        with self._lock:
            if self._closed or self._held.get(g.computation, {}).get(g.interval) is not held:
                return  # released, lost or replaced meanwhile
        try:
            data, stat = self._client.get(path)
        except Exception:  # e.g. gone: released by us, or the session ends (the listener and renew see to it)
            return
        if stat.ephemeralOwner == held.session_id:
            self._watch(held)  # still ours: watch on
            return
        reason = _taken_over(data, g.sequencer, self.instance)
        with self._lock:
            if self._held.get(g.computation, {}).get(g.interval) is not held or id(held) in self._releasing:
                return
            self._held[g.computation].pop(g.interval, None)
            self._lost[(g.computation, g.interval)] = reason
        log.warning("lease on interval %d of %s/%s lost: %s", g.interval, g.pipeline, g.computation, reason)
        self._notify_lost([g], reason)

    def held(self, computation: str) -> dict[int, LeaseGrant]:
        """The leases of ``computation`` this instance believes it holds."""
        with self._lock:
            return {i: h.grant for i, h in self._held.get(computation, {}).items()}

    def check_valid(self, computation: str, interval: int) -> None:
        """Fast local check before a commit (no ZooKeeper round trip). Raises LeaseLostError: the lease is
        not held (lost, broken, released or never acquired); LeaseSuspendedError: the connection is
        suspended or ownership is being re-verified."""
        with self._lock:
            if self._closed:
                raise LeaseLostError("this LeaseManager is closed; create a new one")
            reason = self._lost.get((computation, interval))
            if reason is not None:
                lost = SessionLostError if reason == SESSION_EXPIRED else LeaseLostError
                raise lost(f"lease on interval {interval} of {self.pipeline}/{computation} "
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
        """Wait until CONNECTED with no lease being re-verified; False if still not after ``timeout_s``
        (default: twice the session timeout plus 5 s)."""
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
        """Check the leases of ``intervals`` before a commit; *pause* while they are in doubt, logging
        every ``log_every_s`` (:class:`.watermarks.pause.Pause`). Returns the seconds paused.

        Raises:
            LeaseLostError: a lease is lost (e.g. the session expired during the pause).
            LeaseSuspendedError: still in doubt after ``max_pause_s``.
            CoordinatorStateLostError: the ensemble serves, but lost its data.
        """
        ivs = sorted(set(intervals))
        bound = self.max_pause_s if max_pause_s is None else max_pause_s
        pause = Pause(f"commits of {self.pipeline}/{computation}", bound, client=self._client, pipeline=self.pipeline,
                      log_every_s=log_every_s, nothing="committed", logger=log)
        while True:
            try:
                for iv in ivs:
                    self.check_valid(computation, iv)
            except LeaseSuspendedError as exc:
                paused = pause.note(str(exc))
                self.await_settled(timeout_s=1.0 if bound is None else max(0.05, min(1.0, bound - paused)))
                continue
            return pause.resumed(" and the leases were re-verified")

    def renew(self, computation: str | None = None) -> None:
        """Verify with ZooKeeper that every held lease (of ``computation``, or all) is still ours.
        Raises LeaseLostError (a lease is gone or someone else's: it is dropped) or LeaseSuspendedError."""
        self._check_open()
        with self._lock:
            items = [h for c, per in self._held.items() if computation in (None, c) for h in per.values()]
            lost = [(c, i, r) for (c, i), r in self._lost.items() if computation in (None, c)]
        client_id = self._client.client_id
        session_id = int(client_id[0]) if client_id else None
        gone: list[tuple[HeldGrant, str]] = []
        for h in items:
            g = h.grant
            path = f"{interval_path(g.pipeline, g.computation, g.interval)}/owner"
            with _zk_errors(f"renewing interval {g.interval}"):
                try:
                    data, stat = self._client.get(path)
                except NoNodeError:
                    gone.append((h, "owner znode is gone (lease broken or session expired)"))
                    continue
            seq = decode_lease(data).get("sequencer")
            if stat.ephemeralOwner != h.session_id or session_id != h.session_id or seq != g.sequencer:
                gone.append((h, _taken_over(data, g.sequencer, self.instance)))
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
        Raises LeaseSuspendedError: the connection dropped mid-way (the rest stay held; retry)."""
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
            with self._lock:
                self._releasing.add(id(h))  # the next owner's node, seen by our watch meanwhile, is no takeover
            try:
                if client_id is not None and int(client_id[0]) == h.session_id:
                    tx = self._client.transaction()
                    tx.check(h.grant_path, 0)
                    tx.delete(f"{interval_path(g.pipeline, g.computation, g.interval)}/owner", 1)
                    with _zk_errors(f"releasing interval {g.interval}"):
                        tx.commit()  # a failed check means it was no longer ours: nothing to delete
                with self._lock:
                    self._held.get(g.computation, {}).pop(g.interval, None)
            finally:
                with self._lock:
                    self._releasing.discard(id(h))

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


def _taken_over(data: bytes, ours: int, instance: str | None) -> str:
    """Why a lease whose owner znode now holds ``data`` is no longer ours (``instance``: ours)."""
    try:
        raw = decode_lease(data)
    except CodecError:
        raw = {}
    inst = raw.get("instance")
    same = inst is not None and inst == instance
    return (f"taken over by {raw.get('owner')!r}" + (f" of instance {inst!r}" if inst is not None else "")
            + (f" (owner sequencer {raw['sequencer']}, ours {ours})" if raw.get("sequencer") is not None
               else f" (its grant in progress, ours sequencer {ours})")
            + ("; a newer process with this instance's name took it: a restart, or two processes started with "
               "one instance name" if same else ""))
