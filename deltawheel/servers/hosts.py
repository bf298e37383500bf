"""A test bed of hosts that share nothing, on this machine (``deltawheel cluster up --hosts``): ``s3``,
``zk1``-``zk3``, ``master``, ``worker1``, ``worker2`` and ``client`` on one bridge (:mod:`.netns`;
docs/cluster.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from deltawheel.statestore.exceptions import ClusterError
from deltawheel.statestore.objectstore.client import S3Endpoint

from . import cluster
from .netns import Host, HostNetwork, host_prefix, isolated_prefix, leftovers
from .s3proxy import S3ProxyServer
from .zookeeper import EmbeddedZooKeeper, QuorumPeer

__all__ = ["HostsCluster", "HOST_NAMES", "DEFAULT_SUBNET", "host_python"]

DEFAULT_SUBNET = "10.61.0"
_LAST = {"s3": 10, "zk1": 11, "zk2": 12, "zk3": 13, "master": 20, "worker1": 21, "worker2": 22, "client": 30}
HOST_NAMES = tuple(_LAST)
ZK_PORT, MASTER_PORT, MASTER_UI, WORKER_PORT, WORKER_UI, S3_PORT = 2181, 7077, 8080, 7078, 8081, 9000
_SPARK_DEFAULTS = ("spark.master.rest.enabled false\nspark.worker.cleanup.enabled false\n"
                   "spark.worker.timeout 10\n")  # a lost host is declared dead (its driver relaunched) in 10 s


def host_python() -> Path:
    """The system Python the hosts run (this one's minor version, outside ``/root`` and ``/work``).

    Raises:
        ClusterError: no such interpreter.
    """
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for folder in ("/usr/bin", "/usr/local/bin"):
        if (Path(folder) / name).exists():
            return Path(folder) / name
    raise ClusterError(f"the hosts run the system's {name}, which is not in /usr/bin or /usr/local/bin; "
                       f"install it (Debian: apt-get install {name} {name}-venv)")


@dataclass(frozen=True)
class HostsStatus:
    """What runs on each host: ``{host: [(service, pid or None), ...]}``, workers, ZooKeeper modes."""

    services: dict[str, list[tuple[str, int | None]]]
    workers_registered: int
    zk_modes: dict[str, str | None]

    @property
    def healthy(self) -> bool:
        """Every service runs, both workers are registered, the ensemble serves."""
        running = all(pid is not None for svcs in self.services.values() for _n, pid in svcs)
        return running and self.workers_registered == 2 and all(m is not None for m in self.zk_modes.values())


class HostsCluster:
    """The hosts test bed on the /24 ``subnet``; ``services``: which of ``s3``, ``zk``, ``spark`` :meth:`up`
    starts (default: the last ``up``'s, else all)."""

    def __init__(self, data_dir: Path | str, *, subnet: str = DEFAULT_SUBNET,
                 services: Sequence[str] | None = None, worker_memory: str = "2g") -> None:
        self.data_dir = Path(data_dir).resolve()
        self.manifest = self.data_dir / "hosts.json"  # the subnet and the services
        saved = cluster.read_manifest(self.manifest)
        if saved is not None:
            subnet = str(saved["subnet"])
        if services is None:
            services = tuple(saved["services"]) if saved is not None else ("s3", "zk", "spark")
        unknown = set(services) - {"s3", "zk", "spark"}
        if unknown:
            raise ClusterError(f"unknown services {sorted(unknown)}: choose among s3, zk, spark")
        self.subnet, self.services, self.worker_memory = subnet, tuple(services), worker_memory
        self.hosts = {n: Host(n, f"{subnet}.{last}") for n, last in _LAST.items()}
        self.network = HostNetwork(tuple(self.hosts.values()), bridge_address=f"{subnet}.1")
        self.spark_dir = self.data_dir / "spark"
        #: the hosts' Python with pyspark alone, and pyspark's folder in it (``bin/spark-class``, ``jars``)
        self.spark_python = self.spark_dir / "bin" / "python"
        self.spark_home = (self.spark_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
                           / "site-packages" / "pyspark")
        self.master_url = f"spark://{self.hosts['master'].address}:{MASTER_PORT}"
        self.master_ui = f"http://{self.hosts['master'].address}:{MASTER_UI}"  # /json/: workers, drivers
        self.zk_hosts = ",".join(f"{self.hosts[f'zk{i}'].address}:{ZK_PORT}" for i in (1, 2, 3))
        peers = tuple(QuorumPeer(i, self.hosts[f"zk{i}"].address, ZK_PORT, 2888, 3888) for i in (1, 2, 3))
        self.zookeepers = tuple(
            EmbeddedZooKeeper(self.dir(f"zk{p.myid}") / "zk", port=ZK_PORT, host=p.host, quorum=peers,
                              myid=p.myid, jars_dir=self.spark_home / "jars",
                              prefix=self.isolated("zk" + str(p.myid)))
            for p in peers)
        self.s3 = S3ProxyServer(self.dir("s3") / "s3proxy", port=S3_PORT, host=self.hosts["s3"].address,
                                jars_dir=self.dir("s3") / "jars", prefix=self.isolated("s3"))
        self.master = cluster.spark_process("Spark master on host master", self.dir("master"),
                                            cluster.MASTER_CLASS, self.isolated("master", spark=True))
        self.workers = tuple(cluster.spark_process(f"Spark worker on host {n}", self.dir(n),
                                                   cluster.WORKER_CLASS, self.isolated(n, spark=True))
                             for n in ("worker1", "worker2"))

    def dir(self, host: str) -> Path:
        """A host's own folder."""
        return self.data_dir / host

    @property
    def s3_endpoint(self) -> S3Endpoint:
        """S3Proxy's URL and credentials."""
        return self.s3.endpoint

    def isolated(self, host: str, *, spark: bool = False, env: Mapping[str, str] | None = None) -> list[str]:
        """The words that run a command on cluster host ``host`` (its own network and files)."""
        h = self.hosts[host]
        extra = dict(env or {})
        if spark:
            extra.update(SPARK_HOME=str(self.spark_home), SPARK_CONF_DIR=str(self.dir(host) / "conf"),
                         SPARK_LOCAL_IP=h.address, SPARK_LOCAL_HOSTNAME=h.address, SPARK_LOG_DIR=str(self.dir(host)),
                         SPARK_NO_DAEMONIZE="1", SPARK_DAEMON_MEMORY="512m", PYSPARK_PYTHON=str(self.spark_python))
        return isolated_prefix(h, own_dir=self.dir(host), shared_dirs=[self.spark_dir], hidden=[self.data_dir],
                               env=extra)

    def on_client(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` on the client host (the machine's files, the client's network); text output."""
        return subprocess.run([*self.client_prefix(), *cmd], text=True, **kwargs)

    def client_prefix(self) -> list[str]:
        """The words that run a command on the client host (no ``SPARK_LOCAL_IP``: it would travel to the driver)."""
        return host_prefix(self.hosts["client"], {})

    def ensure_spark_install(self) -> Path:
        """Make the hosts' Spark installation once: a venv of the system Python with pyspark alone.

        Raises:
            ClusterError: no suitable Python, or pip could not install pyspark.
        """
        want = version("pyspark")
        stamp = self.spark_dir / ".pyspark-version"
        if stamp.exists() and stamp.read_text().strip() == want and self.spark_python.exists():
            return self.spark_dir
        shutil.rmtree(self.spark_dir, ignore_errors=True)
        steps = [[str(host_python()), "-m", "venv", str(self.spark_dir)],
                 [str(self.spark_python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  f"pyspark=={want}"]]
        for cmd in steps:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise ClusterError(f"could not make the hosts' Spark installation in {self.spark_dir}: "
                                   f"{' '.join(cmd)} said {done.stderr.strip()[-1500:]}")
        stamp.write_text(want + "\n")
        return self.spark_dir

    def up(self, *, timeout_s: float = 120.0, fresh: bool = False) -> None:
        """Make the network and the hosts, then start the services; on failure take everything down.
        ``fresh``: first delete every host's folder but the Spark installation (refused while up).

        Raises:
            HostsUnavailableError: namespaces cannot be made on this machine.
            ClusterError / ZooKeeperServerError / ObjectStoreServerError: a service did not come up."""
        if fresh:
            if leftovers():
                raise ClusterError("--fresh: the test bed is up; take it down first (deltawheel cluster down --hosts)")
            for name in HOST_NAMES:
                shutil.rmtree(self.dir(name), ignore_errors=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.manifest.write_text(json.dumps({"format_version": 1, "subnet": self.subnet,
                                             "services": list(self.services)}, indent=2) + "\n")
        try:
            self.network.up()
            for name in HOST_NAMES:
                self.dir(name).mkdir(parents=True, exist_ok=True)
            self.ensure_spark_install()
            if "s3" in self.services:
                self._start_s3(timeout_s)
            if "zk" in self.services:
                for z in self.zookeepers:
                    z.launch()
            if "spark" in self.services:
                self._start_spark(timeout_s)
            if "zk" in self.services:
                for z in self.zookeepers:
                    z.wait_ready(timeout_s=timeout_s)
        except BaseException:
            self.down()
            raise

    def _start_s3(self, timeout_s: float) -> None:
        from deltawheel.statestore.objectstore.s3a import S3PROXY_JAR, default_s3_jars_dir, ensure_jar

        jar = ensure_jar(S3PROXY_JAR, default_s3_jars_dir())
        dest = self.dir("s3") / "jars" / jar.name
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(jar, dest)
        self.s3.start(timeout_s=timeout_s)

    def _start_spark(self, timeout_s: float) -> None:
        spark_class = str(self.spark_home / "bin" / "spark-class")
        for name in ("master", "worker1", "worker2"):
            (self.dir(name) / "conf").mkdir(parents=True, exist_ok=True)
            (self.dir(name) / "conf" / "spark-defaults.conf").write_text(_SPARK_DEFAULTS)
        cluster.launch_spark(self.master, spark_class, self.hosts["master"].address, MASTER_PORT, MASTER_UI)
        cluster.await_up(self.master, lambda: cluster.master_alive(self.master_json()), timeout_s,
                         check=self._check("master"))
        for name, proc in zip(("worker1", "worker2"), self.workers, strict=True):
            cluster.launch_spark(proc, spark_class, self.hosts[name].address, WORKER_PORT, WORKER_UI,
                                 master_url=self.master_url, cores=2, memory=self.worker_memory)
        for name, proc in zip(("worker1", "worker2"), self.workers, strict=True):
            addr = self.hosts[name].address
            cluster.await_up(proc, lambda a=addr: a in self.registered_workers(), timeout_s,
                             check=self._check(name))

    def _check(self, host: str) -> str:
        return f" and that this machine reaches {self.hosts[host].address} over the bridge"

    def master_json(self) -> dict[str, Any] | None:
        """The master's state (``/json/``), or None when it does not answer."""
        return cluster.master_state(self.master_ui)

    def registered_workers(self) -> list[str]:
        """The addresses of the workers the master lists ALIVE."""
        state = self.master_json() or {}
        return [str(w.get("host")) for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def status(self) -> HostsStatus:
        """Each service's pid, the workers registered and each ZooKeeper server's mode."""
        services: dict[str, list[tuple[str, int | None]]] = {}
        if "s3" in self.services:
            services["s3"] = [("S3Proxy", self.s3.status().pid)]
        zk_modes: dict[str, str | None] = {}
        if "zk" in self.services:
            for i, z in enumerate(self.zookeepers, start=1):
                services[f"zk{i}"] = [("ZooKeeper", z.process.pid())]
                zk_modes[f"zk{i}"] = z.mode()
        registered = 2
        if "spark" in self.services:
            services["master"] = [("Spark master", self.master.pid())]
            for name, w in zip(("worker1", "worker2"), self.workers, strict=True):
                services[name] = [("Spark worker", w.pid())]
            registered = len(self.registered_workers())
        return HostsStatus(services, registered, zk_modes)

    def kill_host(self, host: str) -> list[int]:
        """SIGKILL every process on ``host`` (:meth:`up` restarts them); returns their pids."""
        return self.network.kill(self.hosts[host])

    def down(self) -> tuple[int, list[str]]:
        """Stop everything, delete the network; idempotent. Returns (processes ended, what is left)."""
        n = sum(1 for w in self.workers if w.stop(timeout_s=5.0)) + int(self.master.stop(timeout_s=5.0))
        n += sum(1 for z in self.zookeepers if z.stop(timeout_s=5.0)) + int(self.s3.stop(timeout_s=5.0))
        n += self.network.down()
        for _ in range(20):
            left = leftovers()
            if not left:
                break
            time.sleep(0.25)
        return n, left
