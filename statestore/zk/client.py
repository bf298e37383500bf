"""Connecting to ZooKeeper: a started :class:`KazooClient` with chroot and digest auth.

kazoo reconnects on its own (SUSPENDED, then CONNECTED; a new session after LOST)."""

from __future__ import annotations

import math
import select
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, NoNodeError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.protocol.paths import normpath
from kazoo.security import ACL, make_acl, make_digest_acl

from ..config import ZkConfig
from ..exceptions import LeaseSuspendedError, SessionLostError, ZooKeeperServerError

__all__ = ["children", "connect", "digest_acls", "poll_select", "zk_errors"]

# retry forever, quickly: a short outage must reconnect well within the session timeout
_CONNECTION_RETRY: dict[str, Any] = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0}


_READABLE = select.POLLIN | select.POLLPRI
_FAILED = select.POLLERR | select.POLLHUP | select.POLLNVAL


def poll_select(rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any],
                timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """``select.select``'s answer by one poll(2) call, with no limit on descriptor numbers (kazoo's own
    makes, registers and closes an epoll selector at every call); an error or a hang-up is ready, so
    the caller's next read or write raises it. ``xlist`` is not watched (kazoo passes none)."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    watched = [(obj, _READABLE, True) for obj in rlist] + [(obj, select.POLLOUT, False) for obj in wlist]
    poller, masks = select.poll(), dict[int, int]()
    for obj, mask, _ in watched:
        fd = obj.fileno()
        masks[fd] = masks.get(fd, 0) | mask
    for fd, mask in masks.items():
        poller.register(fd, mask)
    ready = dict(poller.poll(None if timeout is None else math.ceil(timeout * 1000)))
    hits = [(obj, reading) for obj, mask, reading in watched if ready.get(obj.fileno(), 0) & (mask | _FAILED)]
    return [o for o, r in hits if r], [o for o, r in hits if not r], []


class _PollingHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler with :func:`poll_select`: a request and its answer take about five
    selects, each an epoll selector made and closed in kazoo's own."""

    def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return poll_select(*args, **kwargs)


def connect(cfg: ZkConfig, *, timeout_s: float = 15.0) -> KazooClient:
    """Return a started client whose paths are relative to ``cfg.chroot`` (created when missing).
    Raises ZooKeeperServerError: no server answered within ``timeout_s``."""
    client = KazooClient(hosts=cfg.hosts, timeout=cfg.session_timeout_s, handler=_PollingHandler(),
                         connection_retry=dict(_CONNECTION_RETRY),
                         auth_data=[("digest", cfg.digest)] if cfg.digest else None)
    try:
        client.start(timeout=timeout_s)
    except KazooTimeoutError as exc:
        client.close()
        raise ZooKeeperServerError(f"could not connect to ZooKeeper at {cfg.hosts} within {timeout_s:.0f}s: "
                                   "start it ('deltawheel zk start') or pass the right --zk host:port"
                                   ) from exc
    if cfg.chroot != "/":
        # one session: make the chroot from the root, then set it (kazoo applies it per request)
        try:
            client.ensure_path(cfg.chroot)
        except BaseException:
            client.stop()
            client.close()
            raise
        client.chroot = normpath(cfg.chroot)
    return client


def digest_acls(cfg: ZkConfig) -> list[ACL] | None:
    """ACLs for lease znodes: all rights to the digest user, read to the world (None: no digest).

    >>> digest_acls(ZkConfig()) is None
    True
    >>> [a.perms for a in digest_acls(ZkConfig(digest="dw:secret"))]
    [31, 1]
    """
    if not cfg.digest:
        return None
    user, password = cfg.digest.split(":", 1)
    return [make_digest_acl(user, password, all=True), make_acl("world", "anyone", read=True)]


def children(client: KazooClient, path: str) -> list[str]:
    """The sorted children of ``path`` ([] when it does not exist)."""
    try:
        return sorted(client.get_children(path))
    except NoNodeError:
        return []


@contextmanager
def zk_errors(what: str, *, expired: str, lost: str) -> Iterator[None]:
    """Translate an expired session to :class:`LeaseLostError`, a lost connection to LeaseSuspendedError."""
    try:
        yield
    except SessionExpiredError as exc:
        raise SessionLostError(f"{what}: the ZooKeeper session expired; {expired}") from exc
    except (ConnectionLoss, ConnectionClosedError) as exc:
        raise LeaseSuspendedError(f"{what}: {lost}") from exc
