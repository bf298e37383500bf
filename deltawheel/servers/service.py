"""A server run from its data folder as a detached process: the base of the servers here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from deltawheel.statestore.exceptions import DeltaWheelError
from deltawheel.statestore.process import DetachedProcess, port_free

__all__ = ["Server", "read_properties"]


def read_properties(path: Path) -> dict[str, str]:
    """The ``key=value`` lines of a server's configuration file (empty when there is none)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


class Server:
    """The server of ``data_dir`` on ``host:port``, its ``<stem>.pid`` and ``<stem>.log``; a subclass gives
    :meth:`command` and :meth:`ready`. ``prefix``: words before its command (a test host, :mod:`.hosts`)."""

    stop_timeout_s = 15.0  #: how long :meth:`stop` waits after SIGTERM by default
    start_timeout_s = 30.0  #: how long :meth:`start` waits for it to serve by default
    port_hint = "stop it or pass another --port"  #: the advice when a port is taken

    def __init__(self, data_dir: Path | str, *, name: str, stem: str, marker: str, error: type[DeltaWheelError],
                 port: int, host: str = "127.0.0.1", prefix: Sequence[str] = ()) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host, self.port, self.error = host, port, error
        self.pid_file, self.log_file = self.data_dir / f"{stem}.pid", self.data_dir / f"{stem}.log"
        self.process = DetachedProcess(name, pid_file=self.pid_file, log_file=self.log_file, marker=marker,
                                       error=error, prefix=prefix)

    def ready(self) -> bool:
        """Whether the server answers on its port."""
        raise NotImplementedError

    def command(self) -> list[str]:
        """Write the server's files in its data folder; the command that runs it."""
        raise NotImplementedError

    def ports(self) -> tuple[int, ...]:
        """The ports it listens on (refused when another program holds one)."""
        return (self.port,)

    def launch(self) -> int:
        """Start the server process (unless it runs) without waiting for it to serve; returns its pid.

        Raises:
            its error: a port is taken by another process, or :meth:`command` failed."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        running = self.process.pid()
        if running is not None:
            return running
        self.pid_file.unlink(missing_ok=True)
        for port in () if self.process.prefix else self.ports():
            if not port_free(self.host, port):
                raise self.error(f"port {port} on {self.host} is in use by another process; {self.port_hint}")
        return self.process.launch(self.command(), cwd=self.data_dir)

    def wait_ready(self, *, timeout_s: float | None = None) -> None:
        """Return once the server serves; else stop it and raise its error, why, and the log's tail.

        Raises:
            its error: not running, or not serving within ``timeout_s`` (default :attr:`start_timeout_s`)."""
        pid = self.process.read_pid()
        if pid is None:
            raise self.error(f"{self.process.name} from {self.data_dir} is not running; start it first")
        problem = self.process.wait_ready(pid, self.ready, self.start_timeout_s if timeout_s is None else timeout_s)
        if problem is not None:
            if self.process.alive(pid):
                self.process.kill_group(pid, timeout_s=5.0)
            self.pid_file.unlink(missing_ok=True)
            raise self.error(f"{self.process.name} did not become ready on {self.host}:{self.port}: {problem}; "
                             f"see {self.log_file}. Log tail:\n{self.process.log_tail()}")

    def start(self, *, timeout_s: float | None = None) -> None:
        """:meth:`launch`, then :meth:`wait_ready` (raising as they do)."""
        self.launch()
        self.wait_ready(timeout_s=timeout_s)

    def stop(self, *, timeout_s: float | None = None) -> bool:
        """SIGTERM its process group, SIGKILL after ``timeout_s``; True if a running server was stopped."""
        return self.process.stop(timeout_s=self.stop_timeout_s if timeout_s is None else timeout_s)

    def kill(self) -> int | None:
        """SIGKILL the server at once (a crash, for fault tests); returns its pid, or None if not running."""
        return self.process.kill()
