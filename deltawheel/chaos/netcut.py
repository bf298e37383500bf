"""The ``net-cut`` fault: a driver's proxies to ZooKeeper (and S3Proxy) in the run's Toxiproxy disabled
and enabled again; a local store is not cut (docs/reliability.md)."""

from __future__ import annotations

from pathlib import Path

from kazoo.exceptions import KazooException

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import ObjectStoreServerError, ZooKeeperServerError
from deltawheel.statestore.process import free_ports
from deltawheel.statestore.zk import members
from deltawheel.statestore.zk.client import connect

from ..servers.toxiproxy import ToxiproxyServer, ensure_toxiproxy
from .bank import PIPELINE
from .faults import INSTANCES

__all__ = ["NetCut", "member_session", "session_after", "start_net_cut", "toxiproxy_missing"]


def toxiproxy_missing() -> str | None:
    """None where the Toxiproxy server can run (built once if needed), else why not."""
    try:
        ensure_toxiproxy(quiet=True)
    except ObjectStoreServerError as exc:
        return " ".join(str(exc).split())[:300]
    return None


def start_net_cut(folder: Path, *, zk: list[str], s3: str | None) -> NetCut | str:
    """A started :class:`NetCut` with the proxies of every driver of :data:`.faults.INSTANCES`, or why not."""
    reason = toxiproxy_missing()
    if reason is not None:
        return reason
    cut = NetCut(folder, zk=zk, s3=s3)
    try:
        cut.start(INSTANCES)
    except ObjectStoreServerError as exc:
        return " ".join(str(exc).split())[:300]
    return cut


def _member_session(hosts: str, chroot: str, instance: str) -> int | None:
    client = connect(ZkConfig(hosts=hosts, chroot=chroot, session_timeout_s=10.0), timeout_s=15.0)
    try:
        return members.member_session(client, PIPELINE, instance)
    finally:
        client.stop()
        client.close()


def member_session(hosts: str, chroot: str, instance: str) -> int | None:
    """The session id of ``instance``'s membership, read on ``hosts``; None: not a member, or no answer."""
    try:
        return _member_session(hosts, chroot, instance)
    except (ZooKeeperServerError, KazooException):
        return None


def session_after(hosts: str, chroot: str, instance: str, before: int | None) -> str:
    """Whether ``instance``'s session ``before`` ``held`` or ``expired``, or why ``unknown``."""
    if before is None:
        return "unknown (no member znode before the cut)"
    try:
        return "held" if _member_session(hosts, chroot, instance) == before else "expired"
    except (ZooKeeperServerError, KazooException) as exc:
        return f"unknown (ZooKeeper did not answer: {type(exc).__name__})"


class NetCut:
    """A Toxiproxy server in ``folder`` with each driver's proxies to ZooKeeper at ``zk`` and S3Proxy at
    ``s3`` (``host:port``; None: no S3 proxy)."""

    def __init__(self, folder: Path, *, zk: list[str], s3: str | None = None) -> None:
        self.folder = folder
        self.zk, self.s3 = list(zk), s3
        self.server: ToxiproxyServer | None = None
        self.ports: dict[str, int] = {}  # proxy name -> its listening port

    def start(self, instances: tuple[str, ...]) -> None:
        """Start the server and make each instance's proxies, enabled.

        Raises:
            ObjectStoreServerError: no Toxiproxy, or the server or a proxy failed (it is stopped again)."""
        names = [f"{i}-zk{n}" for i in instances for n in range(1, len(self.zk) + 1)]
        names += [f"{i}-s3" for i in instances] if self.s3 is not None else []
        api, *listen = free_ports(1 + len(names))
        self.server = ToxiproxyServer(self.folder, port=api)
        self.server.start()
        try:
            for name, port in zip(names, listen, strict=True):
                upstream = self.s3 if name.endswith("-s3") else self.zk[int(name.rsplit("zk", 1)[1]) - 1]
                assert upstream is not None
                self.server.proxy(name, listen_port=port, upstream=upstream)
                self.ports[name] = port
        except BaseException:
            self.stop()
            raise

    def hosts(self, instance: str) -> str:
        """``instance``'s ZooKeeper connection string: its proxies, one per server."""
        assert self.server is not None
        return ",".join(f"{self.server.host}:{self.ports[f'{instance}-zk{n}']}" for n in range(1, len(self.zk) + 1))

    def s3_endpoint(self, instance: str) -> str:
        """``instance``'s S3 endpoint URL: its proxy to S3Proxy."""
        assert self.server is not None
        return f"http://{self.server.host}:{self.ports[f'{instance}-s3']}"

    def cut(self, instance: str) -> list[str]:
        """Disable every proxy of ``instance``; returns their names."""
        return self._set(instance, False)

    def restore(self, instance: str) -> list[str]:
        """Enable every proxy of ``instance`` again; returns their names."""
        return self._set(instance, True)

    def _set(self, instance: str, enabled: bool) -> list[str]:
        assert self.server is not None
        names = [name for name in self.ports if name.split("-", 1)[0] == instance]
        for name in names:
            self.server.set_enabled(name, enabled)
        return names

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        if self.server is not None:
            self.server.stop()
