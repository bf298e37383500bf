"""A local cluster in one data folder: a Spark standalone master and workers, and a ZooKeeper ensemble
(:mod:`.ensemble`); the executors run the driver's Python (docs/cluster.md)."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltawheel.servers.ensemble import EnsembleStatus, ZooKeeperEnsemble
from deltawheel.statestore.exceptions import ClusterError, ZooKeeperServerError
from deltawheel.statestore.process import DetachedProcess, find_java, free_ports

__all__ = ["SparkStandalone", "SparkStatus", "WorkerStatus", "LocalCluster", "ClusterStatus", "spark_home",
           "MASTER_CLASS", "WORKER_CLASS"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_SPARK_DEFAULTS = """\
# written by deltawheel cluster up
spark.master.rest.enabled  false
spark.ui.reverseProxy      false
spark.worker.cleanup.enabled false
"""


def spark_home() -> Path:
    """The installed pyspark's folder: a Spark distribution (``bin/spark-class``, ``jars``).

    Raises:
        ClusterError: it ships no executable ``bin/spark-class``.
    """
    import pyspark

    home = Path(pyspark.__file__).parent
    if not os.access(home / "bin" / "spark-class", os.X_OK):
        raise ClusterError(f"no executable bin/spark-class in {home}; reinstall pyspark")
    return home


def spark_process(name: str, folder: Path, main: str, prefix: Sequence[str] = ()) -> DetachedProcess:
    """A Spark master's or worker's process (``main``), its pid and log files in ``folder``."""
    kind = "master" if main == MASTER_CLASS else "worker"
    return DetachedProcess(name, pid_file=folder / f"{kind}.pid", log_file=folder / f"{kind}.log", marker=main,
                           error=ClusterError, prefix=prefix)


def launch_spark(proc: DetachedProcess, spark_class: str, host: str, port: int, ui_port: int, *,
                 master_url: str | None = None, cores: int = 1, memory: str = "", env: dict[str, str] | None = None) -> int:
    """Launch the master, or with ``master_url`` a worker working in ``work/``, unless it runs; its pid."""
    pid, folder = proc.pid(), proc.pid_file.parent
    if pid is not None:
        return pid
    cmd = [spark_class, proc.marker, *([master_url] if master_url else []), "--host", host, "--port", str(port),
           "--webui-port", str(ui_port)]
    if master_url:
        (folder / "work").mkdir(parents=True, exist_ok=True)
        cmd += ["--cores", str(cores), "--memory", memory, "--work-dir", str(folder / "work")]
    return proc.launch(cmd, cwd=folder, env=env)


def await_up(proc: DetachedProcess, ready: Any, timeout_s: float, *, check: str = "") -> None:
    """Wait until ``ready()`` holds for ``proc``; else ClusterError with why, ``check`` and the log's tail."""
    pid = proc.read_pid()
    if pid is None:
        raise ClusterError(f"{proc.name} is not running; start it first")
    problem = proc.wait_ready(pid, ready, timeout_s)
    if problem is not None:
        raise ClusterError(f"{proc.name} did not come up: {problem}; see {proc.log_file}{check}. "
                           f"Log tail:\n{proc.log_tail()}")


def master_alive(state: dict[str, Any] | None) -> bool:
    """Whether a master's state (:func:`master_state`) says it is ALIVE."""
    return (state or {}).get("status") == "ALIVE"


def master_state(ui_url: str) -> dict[str, Any] | None:
    """A Spark master's state from ``<ui_url>/json/``, or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"{ui_url}/json/", timeout=2.0) as resp:
            data = json.loads(resp.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True, kw_only=True)
class WorkerStatus:
    """One worker: its process and whether the master lists it as ALIVE."""

    index: int
    pid: int | None
    port: int
    registered: bool
    cores: int | None
    memory_mb: int | None
    log: str


@dataclass(frozen=True, kw_only=True)
class SparkStatus:
    """The master (pid, ALIVE per its JSON) and each worker."""

    master_url: str
    ui_url: str
    master_pid: int | None
    master_alive: bool
    workers: tuple[WorkerStatus, ...]
    log: str


class SparkStandalone:
    """A Spark standalone master and ``workers`` workers, detached processes; ``ports``: ``master``,
    ``master_ui``, ``worker_N``, ``worker_N_ui`` (default free ones)."""

    def __init__(self, data_dir: Path | str, *, ports: dict[str, int] | None = None, workers: int = 2,
                 worker_cores: int = 1, worker_memory: str = "2g", host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.worker_cores = worker_cores
        self.worker_memory = worker_memory
        names = ["master", "master_ui"] + [f"worker_{i}{s}" for i in range(1, workers + 1) for s in ("", "_ui")]
        if ports is None or not all(n in ports for n in names):
            ports = dict(zip(names, free_ports(len(names), host), strict=True))
        self.ports = {n: ports[n] for n in names}
        self.workers = workers
        self.master = spark_process("Spark master", self.data_dir / "master", MASTER_CLASS)
        self.worker_procs = tuple(spark_process(f"Spark worker {i}", self.data_dir / f"worker-{i}", WORKER_CLASS)
                                  for i in range(1, workers + 1))
        self.master_url = f"spark://{host}:{self.ports['master']}"  # what a driver's --master is
        self.ui_url = f"http://{host}:{self.ports['master_ui']}"  # its /json/ lists workers and applications

    def master_json(self) -> dict[str, Any] | None:
        """:func:`master_state` of this master."""
        return master_state(self.ui_url)

    def _registered(self) -> dict[int, dict[str, Any]]:  # port -> the master's entry of an ALIVE worker
        state = self.master_json() or {}
        return {int(w.get("port", -1)): w for w in state.get("workers", []) if w.get("state") == "ALIVE"}

    def _env(self) -> dict[str, str]:
        conf = self.data_dir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "spark-defaults.conf").write_text(_SPARK_DEFAULTS)
        env = dict(os.environ)
        env.update(SPARK_HOME=str(spark_home()), SPARK_CONF_DIR=str(conf), SPARK_LOCAL_IP=self.host,
                   SPARK_DAEMON_MEMORY="512m", PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
                   SPARK_LOG_DIR=str(self.data_dir), SPARK_NO_DAEMONIZE="1")
        return env

    def start(self, *, timeout_s: float = 90.0) -> None:
        """Start what does not run; return once every worker is registered; on failure stop everything.

        Raises:
            ClusterError: java or pyspark is missing, or a process did not come up in time.
        """
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> None:
        find_java(ClusterError)  # a clear error when there is none (spark-class's is terse)
        spark_class, env = str(spark_home() / "bin" / "spark-class"), self._env()
        launch_spark(self.master, spark_class, self.host, self.ports["master"], self.ports["master_ui"], env=env)
        await_up(self.master, lambda: master_alive(self.master_json()), timeout_s)
        for i, proc in enumerate(self.worker_procs, start=1):
            launch_spark(proc, spark_class, self.host, self.ports[f"worker_{i}"], self.ports[f"worker_{i}_ui"],
                         master_url=self.master_url, cores=self.worker_cores, memory=self.worker_memory, env=env)
        for i in range(1, len(self.worker_procs) + 1):
            self.await_worker(i, timeout_s=timeout_s)

    def await_worker(self, index: int, *, timeout_s: float = 90.0) -> None:
        """Wait until worker ``index`` (1-based) runs and the master lists it ALIVE; else ClusterError."""
        port = self.ports[f"worker_{index}"]
        await_up(self.worker_procs[index - 1], lambda: port in self._registered(), timeout_s)

    def stop(self, *, timeout_s: float = 15.0) -> int:
        """Stop the workers (with their executors), then the master; idempotent. Returns how many ran."""
        n = sum(1 for w in self.worker_procs if w.stop(timeout_s=timeout_s))
        return n + int(self.master.stop(timeout_s=timeout_s))

    def kill_worker(self, index: int) -> int | None:
        """SIGKILL worker ``index`` (1-based) and its executors (a lost machine); returns its pid."""
        return self.worker_procs[index - 1].kill()

    def restart_worker(self, index: int, *, timeout_s: float = 90.0) -> None:
        """Start worker ``index`` again (after a kill) and wait until it is registered."""
        self.start(timeout_s=timeout_s)
        self.await_worker(index, timeout_s=timeout_s)

    def status(self) -> SparkStatus:
        """The master's pid and state, each worker's pid and registration."""
        state = self.master_json()
        registered = self._registered() if state is not None else {}
        workers = []
        for i, proc in enumerate(self.worker_procs, start=1):
            entry = registered.get(self.ports[f"worker_{i}"])
            workers.append(WorkerStatus(index=i, pid=proc.pid(), port=self.ports[f"worker_{i}"],
                                        registered=entry is not None,
                                        cores=None if entry is None else int(entry.get("cores", 0)),
                                        memory_mb=None if entry is None else int(entry.get("memory", 0)),
                                        log=str(proc.log_file)))
        return SparkStatus(master_url=self.master_url, ui_url=self.ui_url, master_pid=self.master.pid(),
                           master_alive=master_alive(state),
                           workers=tuple(workers), log=str(self.master.log_file))


@dataclass(frozen=True)
class ClusterStatus:
    """What :meth:`LocalCluster.status` found (None for a part the cluster does not have)."""

    zookeeper: EnsembleStatus | None
    spark: SparkStatus | None

    @property
    def healthy(self) -> bool:
        """Every ZooKeeper server runs and serves, the master and every worker is registered."""
        zk_ok = self.zookeeper is None or (self.zookeeper.quorum and all(s.running for s in self.zookeeper.servers))
        sp = self.spark
        spark_ok = sp is None or (sp.master_alive and all(w.pid is not None and w.registered for w in sp.workers))
        return zk_ok and spark_ok


def read_manifest(path: Path) -> dict[str, Any] | None:
    """A cluster's saved manifest (its ports and parts), None when there is none or it is unreadable."""
    try:
        raw = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


class LocalCluster:
    """A ZooKeeper ensemble and a Spark standalone cluster in ``data_dir``; an earlier ``up``'s ports and
    parts (``cluster.json``) win over the arguments."""

    def __init__(self, data_dir: Path | str, *, zookeeper: bool = True, spark: bool = True, workers: int = 2,
                 worker_memory: str = "2g", zk_servers: int = 3, host: str = "127.0.0.1") -> None:
        self.data_dir = Path(data_dir).resolve()
        self.manifest = self.data_dir / "cluster.json"  # which parts run and on which ports
        saved = read_manifest(self.manifest)
        if saved is not None:
            zookeeper, spark = bool(saved.get("zookeeper")), bool(saved.get("spark"))
            workers = int(saved.get("workers", workers))
            worker_memory = str(saved.get("worker_memory", worker_memory))
        self.ensemble = ZooKeeperEnsemble(self.data_dir / "zk", size=zk_servers, host=host) if zookeeper else None
        ports = saved.get("spark_ports") if saved is not None else None
        self.spark = (SparkStandalone(self.data_dir / "spark", ports=ports, workers=workers,
                                      worker_memory=worker_memory, host=host) if spark else None)
        self.master_url = None if self.spark is None else self.spark.master_url  # None without Spark
        self.zk_hosts = None if self.ensemble is None else self.ensemble.hosts  # None without ZooKeeper

    def up(self, *, timeout_s: float = 90.0) -> None:
        """Start the ensemble and the Spark cluster (what runs is kept); on failure stop all.

        Raises:
            ZooKeeperServerError / ClusterError: a part did not come up.
        """
        if self.ensemble is None and self.spark is None:
            raise ClusterError("nothing to start: both --no-zk and --no-spark were given")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.manifest.write_text(json.dumps({
            "format_version": 1, "zookeeper": self.ensemble is not None, "spark": self.spark is not None,
            "workers": 0 if self.spark is None else self.spark.workers,
            "worker_memory": None if self.spark is None else self.spark.worker_memory,
            "spark_ports": None if self.spark is None else self.spark.ports}, indent=2) + "\n")
        try:
            if self.ensemble is not None:
                self.ensemble.start(timeout_s=timeout_s)
            if self.spark is not None:
                self.spark.start(timeout_s=timeout_s)
        except (ZooKeeperServerError, ClusterError, KeyboardInterrupt):
            self.down()
            raise

    def down(self) -> int:
        """Stop everything (Spark first: its jobs may still use ZooKeeper); idempotent. Returns how many ran."""
        return (0 if self.spark is None else self.spark.stop()) + (0 if self.ensemble is None else self.ensemble.stop())

    def status(self) -> ClusterStatus:
        """Each process's pid and state (ZooKeeper role, Spark worker registration)."""
        return ClusterStatus(None if self.ensemble is None else self.ensemble.status(),
                             None if self.spark is None else self.spark.status())

    def wait_healthy(self, *, timeout_s: float = 60.0) -> bool:
        """Poll :meth:`status` until every part is healthy; False if not within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.status().healthy:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)
        return True
