"""Pipelined reads, then one all-or-nothing transaction, repeated until no concurrent writer got in.

ZooKeeper SUSPENDED / LOST: every round runs through :meth:`.pause.Connection.resilient`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.security import ACL

from ..client import children
from .codec import Raw, decode
from .pause import Connection, zk_call

__all__ = ["Fence", "Rounds", "Update", "got"]

log = logging.getLogger(__name__)

Update = Callable[[Raw | None], bytes | None]
"""Maps a stored payload (``None``: absent) to the new one (``None``: write nothing); may raise."""
Fence = tuple[str, Callable[[bytes | None, ZnodeStat | None], "tuple[str, int] | None"]]
"""(node, judge): ``judge(data, stat)`` gives a (path, version) the write must check, or None."""


def got(res: Any) -> tuple[bytes | None, ZnodeStat | None]:
    """An asynchronous ``get``'s (data, stat); (None, None) for a missing node."""
    try:
        return res.get()  # type: ignore[no-any-return]
    except NoNodeError:
        return None, None


class Rounds:
    """Reads and compare-and-set writes of watermark znodes through one :class:`.pause.Connection`."""

    def __init__(self, connection: Connection, *, acls: list[ACL] | None) -> None:
        self.connection = connection
        self.client: KazooClient = connection.client
        self._acls = acls

    def children(self, path: str) -> list[str]:
        """The sorted children of ``path`` ([] when it does not exist); one plain call."""
        return children(self.client, path)

    def read(self, path: str, what: str) -> Raw | None:
        """The payload at ``path`` (``None``: absent), read once ZooKeeper serves."""
        def read() -> bytes | None:
            with zk_call(f"reading {what}"):
                try:
                    return self.client.get(path)[0]  # type: ignore[no-any-return]
                except NoNodeError:
                    return None

        data = self.connection.resilient(f"reading {what}", read)
        return None if data is None else decode(data, what)

    def cas(self, path: str, what: str, update: Update) -> None:
        """Read-modify-write ``path`` until no concurrent writer got in between."""
        self.cas_many(what, [(path, update, None)])

    def cas_many(self, what: str, items: Sequence[tuple[str, Update, Fence | None]], *,
                 session: int | None = None) -> None:
        """Read-modify-write (path, :data:`Update`, :data:`Fence` or None) items in one transaction."""
        self.connection.resilient(what, lambda: self._cas_loop(what, items), session=session)

    def _cas_loop(self, what: str, items: Sequence[tuple[str, Update, Fence | None]]) -> None:
        with zk_call(what):
            while True:
                reads = [(self.client.get_async(path), None if fence is None else self.client.get_async(fence[0]))
                         for path, _, fence in items]
                tx = self.client.transaction()
                writes = 0
                for (path, update, fence), (res, fence_res) in zip(items, reads, strict=True):
                    data, stat = got(res)
                    new = update(None if data is None else decode(data, what))
                    check = None if fence is None else fence[1](*got(fence_res))
                    if new is None:
                        continue
                    if check is not None:
                        tx.check(*check)
                    self.put(tx, path, new, stat)
                    writes += 1
                if not writes or not any(isinstance(r, Exception) for r in tx.commit()):
                    return
                log.debug("%s: concurrent update, retrying", what)

    def put(self, tx: Any, path: str, data: bytes, stat: ZnodeStat | None) -> None:
        """Add to ``tx`` a create of ``path`` where the read found none, else a set at the version read."""
        if stat is None:
            self.client.ensure_path(path.rsplit("/", 1)[0], acl=self._acls)
            tx.create(path, data, acl=self._acls)
        else:
            tx.set_data(path, data, stat.version)
