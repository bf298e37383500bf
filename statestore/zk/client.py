"""Connecting to ZooKeeper: a started :class:`KazooClient` with chroot and digest auth.

kazoo reconnects on its own (SUSPENDED, then CONNECTED; a new session after LOST)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, NoNodeError, SessionExpiredError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.paths import normpath
from kazoo.security import ACL, make_acl, make_digest_acl

from ..config import ZkConfig
from ..exceptions import LeaseSuspendedError, SessionLostError, ZooKeeperServerError

__all__ = ["children", "connect", "digest_acls", "zk_errors"]

# retry forever, quickly: a short outage must reconnect well within the session timeout
_CONNECTION_RETRY: dict[str, Any] = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0}


def connect(cfg: ZkConfig, *, timeout_s: float = 15.0) -> KazooClient:
    """Return a started client whose paths are relative to ``cfg.chroot`` (created when missing).
    Raises ZooKeeperServerError: no server answered within ``timeout_s``."""
    client = KazooClient(hosts=cfg.hosts, timeout=cfg.session_timeout_s,
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
