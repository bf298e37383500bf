"""A detached service process (a ZooKeeper server, a Spark master or worker) run from a folder, in its
own session and process group, known by a pid file and a log file; with ``DELTAWHEEL_SERVERS_DIE_WITH``
set to a pid, a watchdog stops every service started under it once that pid is gone."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import psutil

from .exceptions import DeltaWheelError, ZooKeeperServerError

__all__ = ["DIE_WITH_ENV", "DetachedProcess", "die_with", "find_java", "free_ports", "port_free"]

DIE_WITH_ENV = "DELTAWHEEL_SERVERS_DIE_WITH"

# The watchdog: argv = [pid to outlive, service pgid]. Polls once a second; stops the service's
# group when the watched pid is gone (or a zombie); exits when the service is gone by itself.
_WATCHDOG = """
import os, signal, sys, time
import psutil
watched, group = int(sys.argv[1]), int(sys.argv[2])
def gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
while True:
    time.sleep(1.0)
    if gone(group):
        sys.exit(0)
    if gone(watched):
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                sys.exit(0)
            end = time.monotonic() + wait_s
            while time.monotonic() < end and not gone(group):
                time.sleep(0.2)
        sys.exit(0)
"""


JAVA_HINT = ("install a Java 17 (or newer) JDK -- e.g. `apt-get install openjdk-17-jdk-headless`, "
             "`dnf install java-17-openjdk-devel` or `brew install openjdk@17` -- or set JAVA_HOME to one")


def find_java(error: type[DeltaWheelError] = ZooKeeperServerError) -> str:
    """The ``java`` Spark and the servers start: ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else the
    one on ``PATH``; ``error`` (raised when there is none) is the type of what needs it."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if os.access(java, os.X_OK):
            return java
        raise error(f"java not found: JAVA_HOME is {home}, but {java} is not an executable: {JAVA_HINT}")
    found = shutil.which("java")
    if found is None:
        raise error(f"java not found: no `java` on PATH (and JAVA_HOME is not set); Spark runs on Java: {JAVA_HINT}")
    return found


def port_free(host: str, port: int) -> bool:
    """True if nothing listens on ``host:port`` (a bind succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports the OS reports free right now (bound together, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class DetachedProcess:
    """One service process (``name``, for messages), known by its pid file and its command line:
    one without ``marker`` (the main class) is stale. ``error``: the type raised for failures;
    ``prefix``: put before every command (``ip netns exec NS``; its ``exec`` chain keeps the pid)."""

    def __init__(self, name: str, *, pid_file: Path, log_file: Path, marker: str,
                 error: type[DeltaWheelError], prefix: Sequence[str] = ()) -> None:
        self.name = name
        self.prefix = tuple(prefix)
        self.pid_file = pid_file
        self.log_file = log_file
        self.marker = marker
        self._error = error
        self._proc: subprocess.Popen[bytes] | None = None

    def read_pid(self) -> int | None:
        """The pid in the pid file (alive or not), or None."""
        try:
            return int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def alive(self, pid: int) -> bool:
        """True if ``pid`` is a live (not zombie) process running this service."""
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            cmdline = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
        # An empty command line is a process between exec()s (the java launcher may re-exec itself).
        return not cmdline or self.marker in cmdline

    def pid(self) -> int | None:
        """The pid of the running service, or None (a stale pid file is not a running service)."""
        pid = self.read_pid()
        return pid if pid is not None and self.alive(pid) else None

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the log ('' if there is none)."""
        try:
            text = self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def launch(self, cmd: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None) -> int:
        """Start ``cmd`` detached (its own session), log to :attr:`log_file`; write and return its pid."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen([*self.prefix, *cmd], stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                          cwd=str(cwd), env=None if env is None else dict(env))
        self.pid_file.write_text(f"{self._proc.pid}\n")
        watched = os.environ.get(DIE_WITH_ENV, "").strip()
        if watched.isdigit():
            die_with(int(watched), self._proc.pid)
        return self._proc.pid

    def wait_ready(self, pid: int, ready: Callable[[], bool], timeout_s: float) -> str | None:
        """Poll ``ready`` until it holds; return why it did not (process gone, timeout), or None."""
        deadline = time.monotonic() + timeout_s
        while True:
            own = self._proc is not None and self._proc.pid == pid
            if own and self._proc is not None and self._proc.poll() is not None:
                return f"the process exited with code {self._proc.returncode}"
            if not own and not self.alive(pid):
                return f"process {pid} is gone"
            if ready():
                return None
            if time.monotonic() >= deadline:
                return f"no answer within {timeout_s:g}s"
            time.sleep(0.1)

    def stop(self, *, timeout_s: float = 15.0) -> bool:
        """SIGTERM to the process group, SIGKILL after ``timeout_s``; remove the pid file; whether it ran."""
        pid = self.pid()
        if pid is not None:
            self.kill_group(pid, timeout_s=timeout_s)
        self.pid_file.unlink(missing_ok=True)
        return pid is not None

    def kill(self) -> int | None:
        """SIGKILL the process group at once (a crash; the pid file stays); the pid killed, or None."""
        pid = self.pid()
        if pid is not None:
            self.kill_group(pid, timeout_s=0.0)
        return pid

    def kill_group(self, pid: int, *, timeout_s: float) -> None:
        """SIGTERM (skipped when ``timeout_s`` is 0) then SIGKILL to ``pid``'s group, until it is gone;
        the service's error type if it may not be signalled or survives SIGKILL."""
        steps = ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)) if timeout_s > 0 else ((signal.SIGKILL, 10.0),)
        for sig, wait_s in steps:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
            except PermissionError as exc:
                raise self._error(f"not allowed to signal {self.name} process {pid}: {exc}") from exc
            if self._wait_gone(pid, wait_s) and _wait_group_gone(pid, wait_s):
                return
        raise self._error(f"{self.name} process {pid} survived SIGKILL; kill it by hand")

    def _wait_gone(self, pid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc is not None and self._proc.pid == pid:
                with contextlib.suppress(subprocess.TimeoutExpired):  # our own child: gone once reaped
                    self._proc.wait(timeout=0.05)  # (a JVM's main thread can be a zombie while the rest stop)
                    return True
            elif not psutil.pid_exists(pid) or _zombie(pid):
                _reap(pid)
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def die_with(watched: int, group: int) -> None:
    """Start the watchdog that stops process group ``group`` once process ``watched`` is gone."""
    subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(watched), str(group)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                     close_fds=True)


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    out = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.info["pid"]) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(int(proc.info["pid"]))
        except (ProcessLookupError, PermissionError):
            continue
    return out


def _wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no process of group ``pgid`` is left (a launcher's child can outlive the leader)."""
    deadline = time.monotonic() + timeout_s
    while _group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _zombie(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)  # psutil is untyped: Any
    except psutil.NoSuchProcess:
        return False


def _reap(pid: int) -> None:
    """Collect a zombie child of this process (no-op for other processes' children)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
