"""A local ZooKeeper ensemble of an odd number of servers: member N an :class:`~.zookeeper.EmbeddedZooKeeper`
in ``<data_dir>/zk<N>``, ``ensemble.json`` the ids and ports. A majority must run to serve."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from deltawheel.statestore.exceptions import ZooKeeperServerError
from deltawheel.statestore.process import free_ports

from .zookeeper import EmbeddedZooKeeper, QuorumPeer, ZkServerStatus

__all__ = ["ZooKeeperEnsemble", "EnsembleStatus"]


@dataclass(frozen=True)
class EnsembleStatus:
    """What :meth:`ZooKeeperEnsemble.status` found: members in ``myid`` order, quorum, leader's ``myid``."""

    hosts: str
    servers: tuple[ZkServerStatus, ...]
    quorum: bool
    leader: int | None


class ZooKeeperEnsemble:
    """Several ZooKeeper servers forming one ensemble on this machine; ``size`` is odd,
    ``client_ports`` default to those recorded in ``data_dir``, else free ones."""

    def __init__(self, data_dir: Path | str, *, size: int = 3, host: str = "127.0.0.1",
                 client_ports: list[int] | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.manifest = self.data_dir / "ensemble.json"  # the members' ids and ports
        peers = self._recorded()
        if peers is None or (client_ports is not None and [p.client_port for p in peers] != client_ports):
            if size < 1 or size % 2 == 0:
                raise ZooKeeperServerError(f"an ensemble needs an odd number of servers (1, 3, 5), not {size}")
            if client_ports is not None and len(client_ports) != size:
                raise ZooKeeperServerError(f"{len(client_ports)} client ports given for {size} servers")
            ports = free_ports(3 * size, host)
            cps = client_ports if client_ports is not None else ports[:size]
            peers = [QuorumPeer(i + 1, host, cps[i], ports[size + i], ports[2 * size + i]) for i in range(size)]
        self.peers = tuple(peers)
        self.servers = tuple(
            EmbeddedZooKeeper(self.data_dir / f"zk{p.myid}", port=p.client_port, host=host, quorum=self.peers,
                              myid=p.myid)
            for p in self.peers
        )

    def _recorded(self) -> list[QuorumPeer] | None:
        try:
            raw = json.loads(self.manifest.read_text())
            return [QuorumPeer(int(p["myid"]), str(p["host"]), int(p["client_port"]), int(p["peer_port"]),
                               int(p["election_port"])) for p in raw["peers"]]
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    @property
    def hosts(self) -> str:
        """The clients' connection string: every member's ``host:port``, comma-separated."""
        return ",".join(s.hosts for s in self.servers)

    def server(self, myid: int) -> EmbeddedZooKeeper:
        """The member with this ``myid`` (1-based)."""
        for p, s in zip(self.peers, self.servers, strict=True):
            if p.myid == myid:
                return s
        raise ZooKeeperServerError(f"no server {myid} in this ensemble (ids {[p.myid for p in self.peers]})")

    def start(self, *, timeout_s: float = 60.0) -> None:
        """Start every member (running ones are kept) and return once each serves; on failure stop all.

        Raises:
            ZooKeeperServerError: a member could not start or no quorum formed in time.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.manifest.write_text(json.dumps({"format_version": 1, "peers": [asdict(p) for p in self.peers]},
                                            indent=2) + "\n")
        try:
            for s in self.servers:
                s.launch()
            for s in self.servers:
                s.wait_ready(timeout_s=timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self, *, timeout_s: float = 15.0) -> int:
        """Stop every member (idempotent); returns how many were running."""
        return sum(1 for s in self.servers if s.stop(timeout_s=timeout_s))

    def kill(self, myid: int) -> int | None:
        """SIGKILL member ``myid`` (a crash); returns its pid, or None if it was not running."""
        return self.server(myid).kill()

    def restart(self, myid: int, *, timeout_s: float = 60.0) -> None:
        """Start member ``myid`` again; waits until it serves (it needs a quorum to)."""
        self.server(myid).start(timeout_s=timeout_s)

    def leader(self) -> int | None:
        """The ``myid`` of the member whose ``srvr`` says ``leader``, or None."""
        return next((p.myid for p, s in zip(self.peers, self.servers, strict=True) if s.mode() == "leader"), None)

    def status(self) -> EnsembleStatus:
        """Each member's pid and mode, whether a quorum serves, and who leads."""
        servers = tuple(s.status() for s in self.servers)
        leader = next((p.myid for p, st in zip(self.peers, servers, strict=True) if st.mode == "leader"), None)
        serving = sum(1 for st in servers if st.running)
        return EnsembleStatus(hosts=self.hosts, servers=servers, quorum=serving > len(servers) // 2, leader=leader)
