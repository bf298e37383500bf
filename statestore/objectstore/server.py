"""A local S3-compatible object store: S3Proxy (``org.gaul:s3proxy``) on a filesystem backend.

For trials and tests, not production: S3Proxy serves the S3 API over jclouds' ``filesystem``
provider, so a bucket is a folder and an object a file below the server's data folder. The
server is a detached ``java -jar`` process (its own session and process group), so
``deltawheel objectstore start`` can return while it keeps running. Everything it needs lives in
one data folder::

    <data_dir>/s3proxy.conf   generated configuration (endpoint, identity, credential, backend)
    <data_dir>/blobs/         the buckets (one folder each) and their objects
    <data_dir>/s3proxy.log    the server's stdout/stderr
    <data_dir>/s3proxy.pid    pid of the running server

The jar (``jar-with-dependencies``, 40 MiB) is fetched once from Maven Central into the
per-user cache (:func:`deltawheel.statestore.objectstore.s3a.default_s3_jars_dir`), outside any
clone. Readiness: the server answers an HTTP request on its port (any S3 reply, even an error).
"""

from __future__ import annotations

import http.client
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..exceptions import ObjectStoreServerError
from ..zk.server import find_java
from .client import S3Client, S3Endpoint
from .s3a import S3PROXY_JAR, default_s3_jars_dir, ensure_jar

__all__ = ["S3ProxyServer", "ObjectStoreStatus", "DEFAULT_IDENTITY", "DEFAULT_OBJECTSTORE_PORT"]

DEFAULT_OBJECTSTORE_PORT = 9310
DEFAULT_IDENTITY = "deltawheel"
_JAR_NAME = "s3proxy-"


@dataclass(frozen=True)
class ObjectStoreStatus:
    """What :meth:`S3ProxyServer.status` found.

    Attributes:
        running: a live server process answers HTTP on ``port``.
        pid: pid from the pid file when that process is alive, else ``None``.
        port: the port the server is configured for.
        data_dir: the server's data folder.
        endpoint: URL and credentials for clients (those of the configuration file).
    """

    running: bool
    pid: int | None
    port: int
    data_dir: str
    endpoint: S3Endpoint


def _alive(pid: int) -> bool:
    """True if ``pid`` is a live (not zombie) process that runs S3Proxy."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return not cmdline or _JAR_NAME in cmdline


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class S3ProxyServer:
    """An S3Proxy server with a filesystem backend in its own detached process.

    Args:
        data_dir: folder for the configuration, the buckets, the log and the pid file (created).
        port: HTTP port.
        host: address the server listens on.
        identity: the access key clients use; the credential (secret key) is generated at the
            first start and kept in the configuration file, so a restart keeps it.
        jars_dir: where the S3Proxy jar is cached (default: the per-user S3 jar cache).
    """

    def __init__(self, data_dir: Path | str, *, port: int = DEFAULT_OBJECTSTORE_PORT, host: str = "127.0.0.1",
                 identity: str = DEFAULT_IDENTITY, jars_dir: Path | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.host = host
        self.identity = identity
        self._jars_dir = jars_dir
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def config_file(self) -> Path:
        """The server's configuration (``s3proxy.conf``)."""
        return self.data_dir / "s3proxy.conf"

    @property
    def pid_file(self) -> Path:
        """The server's pid file (written when it starts)."""
        return self.data_dir / "s3proxy.pid"

    @property
    def log_file(self) -> Path:
        """The server's log file."""
        return self.data_dir / "s3proxy.log"

    @property
    def blobs_dir(self) -> Path:
        """The filesystem backend's folder: one sub-folder per bucket."""
        return self.data_dir / "blobs"

    def _config(self) -> dict[str, str]:
        try:
            lines = self.config_file.read_text().splitlines()
        except FileNotFoundError:
            return {}
        return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))

    @property
    def endpoint(self) -> S3Endpoint:
        """URL and credentials of this server (the credential is generated at the first start)."""
        cfg = self._config()
        return S3Endpoint(url=f"http://{self.host}:{self.port}", access_key=cfg.get("s3proxy.identity", self.identity),
                          secret_key=cfg.get("s3proxy.credential", ""))

    def client(self) -> S3Client:
        """An :class:`S3Client` on this server."""
        return S3Client(self.endpoint)

    def create_bucket(self, bucket: str) -> bool:
        """Create ``bucket`` through the S3 API; False if it existed already."""
        return self.client().create_bucket(bucket)

    def _read_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _ready(self) -> bool:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=1.0)
        try:
            conn.request("GET", "/")
            conn.getresponse().read()
            return True
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the server log ('' if there is none)."""
        try:
            text = self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def status(self) -> ObjectStoreStatus:
        """Whether the server of this data folder runs and answers on its port."""
        pid = self._read_pid()
        if pid is not None and not _alive(pid):
            pid = None
        running = pid is not None and self._ready()
        return ObjectStoreStatus(running=running, pid=pid, port=self.port, data_dir=str(self.data_dir),
                                 endpoint=self.endpoint)

    def _write_config(self) -> None:
        credential = self._config().get("s3proxy.credential") or secrets.token_hex(16)
        self.blobs_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text("\n".join([
            f"s3proxy.endpoint=http://{self.host}:{self.port}",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={self.identity}",
            f"s3proxy.credential={credential}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={self.blobs_dir}",
            "",
        ]))
        self.config_file.chmod(0o600)

    def start(self, *, timeout_s: float = 60.0) -> None:
        """Start the server and return once it answers HTTP requests.

        A no-op when this folder's server already runs; a stale pid file is removed first.

        Raises:
            ObjectStoreServerError: java or the jar is missing, the port is taken by another
                process, or the server did not become ready in time (with the end of its log).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        pid = self._read_pid()
        if pid is not None:
            if _alive(pid):
                problem = self._wait_ready(pid, timeout_s)
                if problem is None:
                    return
                self._kill_group(pid, timeout_s=5.0)
                raise ObjectStoreServerError(
                    f"S3Proxy (pid {pid}) from {self.data_dir} did not answer on port {self.port} ({problem}); "
                    f"it was stopped. Log tail:\n{self.log_tail()}")
            self.pid_file.unlink(missing_ok=True)
        if not _port_free(self.host, self.port):
            raise ObjectStoreServerError(
                f"port {self.port} on {self.host} is in use by another process; stop it or pass another --port")
        try:
            java = find_java()
        except Exception as exc:  # ZooKeeperServerError: same message, this server's error type
            raise ObjectStoreServerError(str(exc)) from exc
        jar = ensure_jar(S3PROXY_JAR, self._jars_dir or default_s3_jars_dir())
        self._write_config()
        cmd = [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-jar", str(jar),
               "--properties", str(self.config_file)]
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, close_fds=True, cwd=str(self.data_dir))
        self.pid_file.write_text(f"{self._proc.pid}\n")
        problem = self._wait_ready(self._proc.pid, timeout_s)
        if problem is not None:
            self._kill_group(self._proc.pid, timeout_s=5.0)
            self.pid_file.unlink(missing_ok=True)
            raise ObjectStoreServerError(
                f"S3Proxy did not become ready on {self.host}:{self.port}: {problem}; see {self.log_file}. "
                f"Log tail:\n{self.log_tail()}")

    def _wait_ready(self, pid: int, timeout_s: float) -> str | None:
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
        """Stop the server (SIGTERM to its process group, SIGKILL after ``timeout_s``).

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
                raise ObjectStoreServerError(f"not allowed to signal S3Proxy process {pid}: {exc}") from exc
            if self._wait_gone(pid, wait_s):
                return
        raise ObjectStoreServerError(f"S3Proxy process {pid} survived SIGKILL; kill it by hand")

    def _wait_gone(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc is not None and self._proc.pid == pid:
                try:
                    self._proc.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
            try:
                gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                gone = True
            if gone:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
