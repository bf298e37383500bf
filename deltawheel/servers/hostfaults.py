"""Faults between the test bed's hosts (``deltawheel cluster fault``): cut a host off (its veth down, or
from peers: their addresses mapped to :data:`DEAD_MAC`), heal it, kill it (docs/cluster.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deltawheel.statestore.exceptions import UnknownHostError

from .hosts import HostsCluster
from .netns import Host, run_ip

__all__ = ["DEAD_MAC", "Cut", "HostFaults"]

#: A locally administered unicast address that no veth of the bed carries.
DEAD_MAC = "02:00:00:00:de:ad"


def _ip(*args: str, check: bool = True) -> str:
    return run_ip(*args, check=check, hint="; is the test bed up (deltawheel cluster status --hosts)?").stdout


@dataclass(frozen=True)
class Cut:
    """One cut in place: ``host`` off the bridge (``peer`` None) or ``host`` and ``peer`` apart."""

    host: str
    peer: str | None

    def __str__(self) -> str:
        return f"{self.host} cut off whole" if self.peer is None else f"{self.host} cut off from {self.peer}"


class HostFaults:
    """The faults of the hosts of ``cluster`` (a :class:`HostsCluster` whose network is up)."""

    def __init__(self, cluster: HostsCluster) -> None:
        self.cluster = cluster

    def host(self, name: str) -> Host:
        """The host named ``name``; :class:`UnknownHostError` when the bed has no such host."""
        try:
            return self.cluster.hosts[name]
        except KeyError:
            raise UnknownHostError(f"no host {name!r} in the test bed: choose among "
                                   f"{', '.join(self.cluster.hosts)}") from None

    def _both_ways(self, name: str, peers: Sequence[str], verb: str, *tail: str, check: bool = True) -> None:
        """``ip neigh VERB <other's address> TAIL`` in the namespace of each side of each pair."""
        a = self.host(name)
        others = [self.host(p) for p in peers]
        if a in others:
            raise UnknownHostError(f"host {name!r} cannot be cut off from itself")
        for b in others:
            for x, y in ((a, b), (b, a)):
                _ip("-n", x.netns, "neigh", verb, y.address, *tail, check=check)

    def cut(self, name: str, peers: Sequence[str] = ()) -> None:
        """Cut host ``name`` off the bridge (no ``peers``) or from each of ``peers`` (both ways).

        Raises:
            UnknownHostError: an unknown host.
            ClusterError: an ``ip`` command failed (the bed is down?).
        """
        if not peers:
            _ip("link", "set", self.host(name).netns, "down")
            return
        self._both_ways(name, peers, "replace", "lladdr", DEAD_MAC, "dev", "eth0", "nud", "permanent")

    def heal(self, name: str, peers: Sequence[str] = ()) -> None:
        """Undo :meth:`cut` (raising as it does): with no ``peers``, every cut of host ``name``, whole or from any peer."""
        if not peers:
            _ip("link", "set", self.host(name).netns, "up")
            peers = [c.peer if c.host == name else c.host for c in self.cuts()
                     if c.peer is not None and name in (c.host, c.peer)]
        self._both_ways(name, sorted(set(peers)), "del", "dev", "eth0", check=False)

    def cuts(self) -> list[Cut]:
        """The cuts in place now, each pair once."""
        by_address = {h.address: n for n, h in self.cluster.hosts.items()}
        found: list[Cut] = []
        pairs: set[frozenset[str]] = set()
        for name, h in self.cluster.hosts.items():
            link = _ip("link", "show", h.netns, check=False)
            if "<" in link and "UP" not in link.split("<", 1)[1].split(">", 1)[0].split(","):
                found.append(Cut(name, None))
            for line in _ip("-n", h.netns, "neigh", "show", check=False).splitlines():
                words = line.split()
                if DEAD_MAC in words and words[0] in by_address:
                    pair = frozenset((name, by_address[words[0]]))
                    if pair not in pairs:
                        pairs.add(pair)
                        found.append(Cut(name, by_address[words[0]]))
        return found

    def kill(self, name: str) -> list[int]:
        """SIGKILL every process of host ``name`` (its namespace's); returns their pids (raises as :meth:`host`)."""
        self.host(name)
        return self.cluster.kill_host(name)

    def restart(self, *, timeout_s: float = 120.0) -> None:
        """Start again every service of the bed that does not run (after :meth:`kill`)."""
        self.cluster.up(timeout_s=timeout_s)
