"""An embedded ZooKeeper server run from pyspark's jars as a detached ``java`` process with its files in
one data folder: standalone, or an ensemble member. For development and tests."""

from __future__ import annotations

import importlib.util
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deltawheel.statestore.config import DEFAULT_ZK_PORT
from deltawheel.statestore.exceptions import ZooKeeperServerError
from deltawheel.statestore.process import find_java, free_ports, port_free

from .service import Server, read_properties

__all__ = ["EmbeddedZooKeeper", "JVM_FLAGS", "QuorumPeer", "ZkServerStatus", "pyspark_jars_dir", "server_classpath",
           "four_letter_word", "configured_port", "default_port"]

_MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
_QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
#: The server's JVM: a small initial heap (the default, 1/64 of memory, stays resident), serial GC, C1 only.
JVM_FLAGS = ("-Xms16m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
_LOG4J2 = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
"""


@dataclass(frozen=True, kw_only=True)
class ZkServerStatus:
    """What :meth:`EmbeddedZooKeeper.status` found (``mode``: ``srvr``'s, None when not serving)."""

    running: bool
    pid: int | None
    port: int
    data_dir: str
    hosts: str
    mode: str | None = None


@dataclass(frozen=True)
class QuorumPeer:
    """One member of a ZooKeeper ensemble: its id (``myid``), address and three ports.

    >>> QuorumPeer(2, "127.0.0.1", 2182, 2889, 3889).server_line()
    'server.2=127.0.0.1:2889:3889'
    """

    myid: int
    host: str
    client_port: int
    peer_port: int
    election_port: int

    def server_line(self) -> str:
        """The ``server.N=host:peer:election`` line of every member's ``zoo.cfg``."""
        return f"server.{self.myid}={self.host}:{self.peer_port}:{self.election_port}"


def pyspark_jars_dir() -> Path:
    """The ``jars`` folder of the installed pyspark (it ships ZooKeeper).

    Raises:
        ZooKeeperServerError: pyspark is not installed or ships no ZooKeeper jar.
    """
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ZooKeeperServerError("pyspark is not installed; it provides the ZooKeeper jars. Install deltawheel "
                                       "with its dependencies (pip install deltawheel), or give --zk host:port "
                                       "of a running ZooKeeper")
    jars = Path(spec.origin).parent / "jars"
    if not any(jars.glob("zookeeper-*.jar")):
        raise ZooKeeperServerError(f"no zookeeper-*.jar in {jars}; reinstall pyspark")
    return jars


#: The jars the server loads classes from (by name prefix): the whole folder costs ~20 MiB of heap.
SERVER_JARS = ("zookeeper-", "slf4j-api-", "log4j-", "metrics-core-", "snappy-java-", "commons-io-", "commons-cli-")


def server_classpath(jars: Path) -> str:
    """The :data:`SERVER_JARS` of ``jars``; the whole folder when it is laid out otherwise."""
    picked = sorted(j for j in jars.glob("*.jar") if j.name.startswith(SERVER_JARS))
    names = [j.name for j in picked]
    if not any(n.startswith("zookeeper-jute-") for n in names) or not any(
            n.startswith("zookeeper-") and not n.startswith("zookeeper-jute-") for n in names):
        return f"{jars}/*"
    return ":".join(str(j) for j in picked)


def four_letter_word(host: str, port: int, word: str = "ruok", *, timeout_s: float = 1.0) -> str | None:
    """Send a ZooKeeper four-letter word; return the reply, or ``None`` if nothing answered."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(word.encode("ascii"))
            reply = b"".join(iter(lambda: sock.recv(4096), b""))  # until the server closes
    except OSError:
        return None
    return reply.decode("utf-8", "replace")


def configured_port(data_dir: Path | str) -> int | None:
    """The ``clientPort`` of the last server started in ``data_dir`` (its ``zoo.cfg``), or None."""
    port = read_properties(Path(data_dir) / "zoo.cfg").get("clientPort")
    return None if port is None else int(port)


def default_port(data_dir: Path | str, host: str) -> int:
    """The port of an earlier start in ``data_dir``, else 2181 when free, else a free port."""
    port = configured_port(data_dir)
    if port is not None:
        return port
    if port_free(host, DEFAULT_ZK_PORT) and four_letter_word(host, DEFAULT_ZK_PORT) is None:
        return DEFAULT_ZK_PORT
    return free_ports(1, host)[0]


class EmbeddedZooKeeper(Server):
    """A local ZooKeeper server in its own detached process; ``jars_dir`` default pyspark's ``jars``,
    ``quorum`` every member of its ensemble (itself included; empty: standalone), ``myid`` its id there."""

    def __init__(self, data_dir: Path | str, *, port: int = 2181, host: str = "127.0.0.1", jars_dir: Path | None = None,
                 quorum: Sequence[QuorumPeer] = (), myid: int | None = None, prefix: Sequence[str] = ()) -> None:
        # the marker is this folder's zoo.cfg: a pid running another folder's server is not this one
        config = Path(data_dir).resolve() / "zoo.cfg"
        super().__init__(data_dir, name="ZooKeeper", stem="zookeeper", marker=str(config),
                         error=ZooKeeperServerError, port=port, host=host, prefix=prefix)
        self.config_file = config
        self._jars_dir = jars_dir
        self.quorum = tuple(quorum)
        self.myid = myid
        if self.quorum and myid not in {p.myid for p in self.quorum}:
            raise ZooKeeperServerError(f"myid {myid} is not one of the ensemble's ids "
                                       f"{sorted(p.myid for p in self.quorum)}")
        self._main_class = _QUORUM_MAIN_CLASS if self.quorum else _MAIN_CLASS
        self.hosts = f"{host}:{port}"  #: the client connection string

    def ready(self) -> bool:
        """Whether it answers ``srvr`` with its mode (``ruok`` answers before it serves)."""
        return self.mode() is not None

    def mode(self) -> str | None:
        """``standalone``, ``leader`` or ``follower`` (from ``srvr``); None while not serving."""
        reply = four_letter_word(self.host, self.port, "srvr")
        if reply is None or not reply.startswith("Zookeeper version"):
            return None
        return next((ln.split(":", 1)[1].strip() for ln in reply.splitlines() if ln.startswith("Mode:")), None)

    def status(self) -> ZkServerStatus:
        """Whether the server of this data folder runs and answers on its port (and in which mode)."""
        pid = self.process.pid()
        mode = self.mode() if pid is not None else None
        return ZkServerStatus(running=mode is not None, pid=pid, port=self.port, data_dir=str(self.data_dir),
                              hosts=self.hosts, mode=mode)

    def _write_config(self) -> None:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        lines = [f"dataDir={self.data_dir / 'data'}", f"clientPort={self.port}", f"clientPortAddress={self.host}",
                 # a session expires at the first tick after its timeout: a 100-ms tick, a killed process's
                 # leases free within 0.1 s of it; the ensemble's limits (in ticks) stay 5 s and 2.5 s
                 "tickTime=100", "minSessionTimeout=1000", "maxSessionTimeout=60000", "initLimit=50", "syncLimit=25",
                 "maxClientCnxns=0", "4lw.commands.whitelist=ruok,srvr,stat,mntr", "admin.enableServer=false",
                 "autopurge.snapRetainCount=3", "autopurge.purgeInterval=1"]
        if self.quorum:
            lines += [p.server_line() for p in self.quorum]
            (self.data_dir / "data" / "myid").write_text(f"{self.myid}\n")
        self.config_file.write_text("\n".join([*lines, ""]))
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)

    def command(self) -> list[str]:
        """The java command of this server, its ``zoo.cfg`` written (an ensemble serves once a quorum runs).

        Raises:
            ZooKeeperServerError: java or the jars are missing."""
        java = find_java()
        jars = self._jars_dir or pyspark_jars_dir()
        self._write_config()
        return [java, *JVM_FLAGS, f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                "-Dzookeeper.jmx.log4j.disable=true", "-cp", server_classpath(jars), self._main_class,
                str(self.config_file)]
