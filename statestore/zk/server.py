"""An embedded, single-node ZooKeeper server run from the jars in the pyspark wheel.

The server is a detached ``java`` process (its own session and process group),
so ``deltawheel zk start`` can return while the server keeps running. Everything
it needs lives in one data folder::

    <data_dir>/zoo.cfg          generated configuration
    <data_dir>/data/            snapshots and transaction logs
    <data_dir>/zookeeper.log    the server's stdout/stderr (log4j2 at INFO)
    <data_dir>/zookeeper.pid    pid of the running server

Readiness is the ``srvr`` four-letter word answered with the server's version
(``ruok`` answers ``imok`` even while the server is not yet serving). It is meant for
local development and tests; production deployments point :class:`ZkConfig` at an
ensemble instead.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..exceptions import ZooKeeperServerError

__all__ = ["EmbeddedZooKeeper", "ZkServerStatus", "find_java", "pyspark_jars_dir", "four_letter_word"]

_MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
_LOG4J2 = """\
status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
"""


@dataclass(frozen=True)
class ZkServerStatus:
    """What :meth:`EmbeddedZooKeeper.status` found.

    Attributes:
        running: a live server process serves requests on ``port`` (``srvr``).
        pid: pid from the pid file when that process is alive, else ``None``.
        port: client port the server is configured for.
        data_dir: the server's data folder.
        hosts: connection string for clients.
    """

    running: bool
    pid: int | None
    port: int
    data_dir: str
    hosts: str


def find_java() -> str:
    """Path of the ``java`` executable (``$JAVA_HOME/bin/java`` first, then ``PATH``).

    Raises:
        ZooKeeperServerError: no java was found.
    """
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    found = shutil.which("java")
    if found is None:
        raise ZooKeeperServerError(
            "java not found (looked in $JAVA_HOME/bin and PATH): install Java 17+ or set JAVA_HOME"
        )
    return found


def pyspark_jars_dir() -> Path:
    """The ``jars`` folder of the installed pyspark wheel (it ships ZooKeeper and its deps).

    Raises:
        ZooKeeperServerError: pyspark is not installed or ships no ZooKeeper jar.
    """
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ZooKeeperServerError("pyspark is not installed; it provides the ZooKeeper jars")
    jars = Path(spec.origin).parent / "jars"
    if not any(jars.glob("zookeeper-*.jar")):
        raise ZooKeeperServerError(f"no zookeeper-*.jar in {jars}; reinstall pyspark")
    return jars


def four_letter_word(host: str, port: int, word: str = "ruok", *, timeout_s: float = 1.0) -> str | None:
    """Send a ZooKeeper four-letter word; return the reply, or ``None`` if nothing answered."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(word.encode("ascii"))
            chunks = []
            while True:
                data = sock.recv(4096)
                if not data:
                    break
                chunks.append(data)
    except OSError:
        return None
    return b"".join(chunks).decode("utf-8", "replace")


def _alive(pid: int) -> bool:
    """True if ``pid`` is a live (not zombie) process that runs a ZooKeeper server."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    # An empty command line is a process between exec()s (the java launcher may re-exec itself).
    return not cmdline or _MAIN_CLASS in cmdline


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class EmbeddedZooKeeper:
    """A local ZooKeeper server in its own detached process.

    Args:
        data_dir: folder for the configuration, data, log and pid file (created).
        port: client port.
        host: address the server listens on.
        jars_dir: folder of jars for the classpath; default: pyspark's ``jars``.
    """

    def __init__(
        self, data_dir: Path | str, *, port: int = 2181, host: str = "127.0.0.1",
        jars_dir: Path | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.host = host
        self._jars_dir = jars_dir
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        """Client connection string ``host:port``."""
        return f"{self.host}:{self.port}"

    @property
    def pid_file(self) -> Path:
        """The server's pid file (written when it starts)."""
        return self.data_dir / "zookeeper.pid"

    @property
    def log_file(self) -> Path:
        """The server's log file."""
        return self.data_dir / "zookeeper.log"

    @property
    def config_file(self) -> Path:
        """The server's configuration file (``zoo.cfg``)."""
        return self.data_dir / "zoo.cfg"

    def _read_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _ready(self) -> bool:
        # ``ruok`` answers ``imok`` before the server serves requests; ``srvr`` does not.
        reply = four_letter_word(self.host, self.port, "srvr")
        return reply is not None and reply.startswith("Zookeeper version")

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the server log ('' if there is none)."""
        try:
            text = self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def status(self) -> ZkServerStatus:
        """Whether the server of this data folder runs and answers on its port."""
        pid = self._read_pid()
        if pid is not None and not _alive(pid):
            pid = None
        running = pid is not None and self._ready()
        return ZkServerStatus(running=running, pid=pid, port=self.port, data_dir=str(self.data_dir),
                              hosts=self.hosts)

    def _write_config(self) -> None:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            "\n".join([
                f"dataDir={self.data_dir / 'data'}",
                f"clientPort={self.port}",
                f"clientPortAddress={self.host}",
                "tickTime=500",
                "minSessionTimeout=1000",
                "maxSessionTimeout=60000",
                "initLimit=10",
                "syncLimit=5",
                "maxClientCnxns=0",
                "4lw.commands.whitelist=ruok,srvr,stat",
                "admin.enableServer=false",
                "autopurge.snapRetainCount=3",
                "autopurge.purgeInterval=1",
                "",
            ])
        )
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)

    def start(self, *, timeout_s: float = 30.0) -> None:
        """Start the server and return once it serves requests.

        A no-op when this folder's server already runs on the port; a stale pid
        file (dead process) is removed first.

        Raises:
            ZooKeeperServerError: java or the jars are missing, the port is taken by
                another process, or the server did not become ready in time (the
                message carries the end of its log).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        pid = self._read_pid()
        if pid is not None:
            if _alive(pid):
                problem = self._wait_ready(pid, timeout_s)
                if problem is None:
                    return
                self._kill_group(pid, timeout_s=5.0)
                raise ZooKeeperServerError(
                    f"ZooKeeper (pid {pid}) from {self.data_dir} did not answer on {self.hosts} ({problem}); "
                    f"it was stopped. Log tail:\n{self.log_tail()}"
                )
            self.pid_file.unlink(missing_ok=True)
        if not _port_free(self.host, self.port):
            raise ZooKeeperServerError(
                f"port {self.port} on {self.host} is in use by another process; stop it or pass another --port"
            )
        java = find_java()
        jars = self._jars_dir or pyspark_jars_dir()
        self._write_config()
        cmd = [
            java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp", f"{jars}/*", _MAIN_CLASS, str(self.config_file),
        ]
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True, cwd=str(self.data_dir),
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")
        problem = self._wait_ready(self._proc.pid, timeout_s)
        if problem is not None:
            self._kill_group(self._proc.pid, timeout_s=5.0)
            self.pid_file.unlink(missing_ok=True)
            raise ZooKeeperServerError(
                f"ZooKeeper did not become ready on {self.hosts}: {problem}; "
                f"see {self.log_file}. Log tail:\n{self.log_tail()}"
            )

    def _wait_ready(self, pid: int, timeout_s: float) -> str | None:
        """Poll until the server serves requests; return why it did not, or ``None``."""
        deadline = time.monotonic() + timeout_s
        while True:
            own = self._proc is not None and self._proc.pid == pid
            if own and self._proc is not None and self._proc.poll() is not None:
                return f"the java process exited with code {self._proc.returncode}"
            if not own and not _alive(pid):
                return f"process {pid} is gone"
            if self._ready():
                return None
            if time.monotonic() >= deadline:
                return f"no answer within {timeout_s:g}s"
            time.sleep(0.1)

    def stop(self, *, timeout_s: float = 15.0) -> bool:
        """Stop the server: SIGTERM to its process group, then SIGKILL after ``timeout_s``.

        Returns:
            True if a running server was stopped, False if none was running.
        """
        pid = self._read_pid()
        stopped = False
        if pid is not None and _alive(pid):
            self._kill_group(pid, timeout_s=timeout_s)
            stopped = True
        self.pid_file.unlink(missing_ok=True)
        return stopped

    def _kill_group(self, pid: int, *, timeout_s: float) -> None:
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError as exc:
                raise ZooKeeperServerError(f"not allowed to signal ZooKeeper process {pid}: {exc}") from exc
            if self._wait_gone(pid, wait_s):
                return
        raise ZooKeeperServerError(f"ZooKeeper process {pid} survived SIGKILL; kill it by hand")

    def _wait_gone(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc is not None and self._proc.pid == pid:
                try:
                    self._proc.wait(timeout=0.05)  # reap our own child: no zombie left
                except subprocess.TimeoutExpired:
                    pass
            if not psutil.pid_exists(pid) or _zombie(pid):
                _reap(pid)
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)  # psutil is untyped: Any
    except psutil.NoSuchProcess:
        return False


def _reap(pid: int) -> None:
    """Collect a zombie child of this process (no-op for other processes' children)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
