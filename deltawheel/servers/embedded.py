"""The embedded defaults: with no ``--zk`` a local store runs its own ZooKeeper, recorded in ``<store>/_zk/``
with a file per user process; its last user stops it unless ``zk start`` started it (docs/operations.md)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Iterator

import psutil

from deltawheel.servers.zookeeper import EmbeddedZooKeeper, configured_port, four_letter_word
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import ZooKeeperServerError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.process import free_ports, port_free

__all__ = ["ensure_zookeeper", "ZooKeeperUse", "StoreZooKeeper", "ServerRecord", "ServerUser",
           "RECORD_FORMAT_VERSION"]

RECORD_FORMAT_VERSION = 1
_HOST = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class ServerRecord:
    """What ``server.json`` says about a store's own server (``keep``: its last user does not stop it)."""

    store: str
    port: int
    pid: int | None
    keep: bool
    started_by: str
    started_at: float

    @property
    def hosts(self) -> str:
        """Connection string of the server."""
        return f"{_HOST}:{self.port}"

    def to_json(self) -> str:
        """The ``server.json`` text (with its format version)."""
        return json.dumps({"format_version": RECORD_FORMAT_VERSION, "host": _HOST, **asdict(self)}, indent=2,
                          sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ServerRecord:
        """Parse ``server.json`` (raises ValueError/KeyError/TypeError when it is not one)."""
        d = json.loads(text)
        return cls(store=str(d["store"]), port=int(d["port"]), pid=None if d["pid"] is None else int(d["pid"]),
                   keep=bool(d["keep"]), started_by=str(d["started_by"]), started_at=float(d["started_at"]))


@dataclass(frozen=True)
class ServerUser:
    """One process using a store's server (its file under ``users/``)."""

    pid: int
    create_time: float
    command: str
    since: float
    file: Path

    def alive(self) -> bool:
        """The process still runs (same pid and start time, not a zombie)."""
        try:
            proc = psutil.Process(self.pid)
            same = abs(proc.create_time() - self.create_time) < 0.01
            return bool(same and proc.status() != psutil.STATUS_ZOMBIE)  # psutil is unannotated
        except psutil.Error:
            return False


@dataclass(frozen=True)
class StoreServerStatus:
    """What :meth:`StoreZooKeeper.status` found: the record, whether the server answers, its users."""

    data_dir: str
    record: ServerRecord | None
    pid: int | None
    running: bool
    users: tuple[ServerUser, ...]


def _command() -> str:
    """This process's command line, for records and ``zk status`` (``deltawheel ...`` for the CLI)."""
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    prog = "deltawheel" if prog in ("__main__.py", "deltawheel") else prog
    return " ".join([prog, *sys.argv[1:]])[:300]


class StoreZooKeeper:
    """A local store's own embedded ZooKeeper: its record, lock and users (the files above)."""

    lock_timeout_s = 120.0  #: how long :meth:`locked` waits for the lock

    def __init__(self, layout: StoreLayout) -> None:
        if not layout.is_local:
            raise ZooKeeperServerError(f"store {layout.root} is not local: it has no embedded ZooKeeper; pass --zk")
        self.layout = layout
        self.data_dir = Path(layout.zk_data.removeprefix("file://")).resolve()
        self.record_file = self.data_dir / "server.json"
        self.lock_file = self.data_dir / "server.lock"
        self.users_dir = self.data_dir / "users"  # one file per process using the server

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's server lock (an flock); ZooKeeperServerError after ``lock_timeout_s``."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.lock_file, "a+") as f:
            deadline = time.monotonic() + self.lock_timeout_s
            while True:
                try:
                    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise ZooKeeperServerError(
                            f"another process has held {self.lock_file} for {self.lock_timeout_s:g}s (starting or "
                            "stopping the store's ZooKeeper); see `deltawheel zk status --store "
                            f"{self.layout.root}`, end that process or try again") from None
                    time.sleep(0.1)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def read_record(self) -> ServerRecord | None:
        """The record, or None (none yet, or unreadable: it is rewritten at the next start)."""
        try:
            return ServerRecord.from_json(self.record_file.read_text())
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def _write_record(self, record: ServerRecord) -> None:
        tmp = self.record_file.with_suffix(".json.tmp")
        tmp.write_text(record.to_json())
        tmp.replace(self.record_file)

    def server(self, port: int | None = None) -> EmbeddedZooKeeper:
        """The server of this folder on ``port`` (default: the port it was last started on)."""
        if port is None:
            port = configured_port(self.data_dir) or getattr(self.read_record(), "port", None) or 0
        return EmbeddedZooKeeper(self.data_dir, port=port, host=_HOST)

    def running(self) -> EmbeddedZooKeeper | None:
        """This folder's server when its process is alive and it answers, else None (no lock taken)."""
        server = self.server()
        return server if server.process.pid() is not None and server.mode() is not None else None

    def users(self) -> list[ServerUser]:
        """Every registered user, alive or not."""
        out = []
        for f in sorted(self.users_dir.glob("*.json")):
            try:
                d = json.loads(f.read_text())
                out.append(ServerUser(pid=int(d["pid"]), create_time=float(d["create_time"]),
                                      command=str(d["command"]), since=float(d["since"]), file=f))
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                continue
        return out

    def _live_users(self) -> list[ServerUser]:  # under the lock: the dead ones' files are removed
        live = []
        for u in self.users():
            if u.alive():
                live.append(u)
            else:
                u.file.unlink(missing_ok=True)
        return live

    def _register(self) -> ServerUser:
        self.users_dir.mkdir(parents=True, exist_ok=True)
        me = psutil.Process(os.getpid())
        user = ServerUser(pid=me.pid, create_time=me.create_time(), command=_command(), since=time.time(),
                          file=self.users_dir / f"{me.pid}-{uuid.uuid4().hex[:8]}.json")
        user.file.write_text(json.dumps({"pid": user.pid, "create_time": user.create_time, "command": user.command,
                                         "since": user.since}))
        return user

    def acquire(self, *, keep: bool = False, port: int | None = None, register: bool = True,
                timeout_s: float = 30.0) -> tuple[EmbeddedZooKeeper, ServerUser | None, bool]:
        """Find the store's running server or start it; join it as a user (``register``). Returns the
        server, this process's user entry (None without ``register``) and whether this call started it.

        Raises:
            ZooKeeperServerError: it does not start, or it runs on another port than ``port``.
        """
        with self.locked():
            self._live_users()
            record = self.read_record()
            server = self.running()
            if server is None and self.server().process.pid() is not None:  # not answering: starting, or hung
                with contextlib.suppress(ZooKeeperServerError):
                    self.server().wait_ready(timeout_s=timeout_s)  # kills it if it does not answer
                    server = self.server()
            started = server is None
            if server is None:
                server = self._start(record, port, timeout_s)
                self._write_record(ServerRecord(store=self.layout.root, port=server.port,
                                                pid=server.process.pid(), keep=keep, started_by=_command(),
                                                started_at=time.time()))
                print(f"deltawheel: started the store's embedded ZooKeeper on {server.hosts} (data in "
                      f"{self.data_dir})", file=sys.stderr)
            else:
                if port is not None and port != server.port:
                    raise ZooKeeperServerError(
                        f"the store's ZooKeeper already runs on {server.hosts}, not port {port}: use it, or stop it "
                        f"first (`deltawheel zk stop --store {self.layout.root}`)")
                if record is None or record.pid != server.process.pid() or (keep and not record.keep):
                    self._write_record(ServerRecord(  # adopt a server started before records, or pin it
                        store=self.layout.root, port=server.port, pid=server.process.pid(),
                        keep=keep or (record is not None and record.keep),
                        started_by=record.started_by if record else "(unknown)",
                        started_at=record.started_at if record else time.time()))
            user = self._register() if register else None
        return server, user, started

    def _start(self, record: ServerRecord | None, port: int | None, timeout_s: float) -> EmbeddedZooKeeper:
        # on ``port``, else the recorded port when free, else one of a few free ports
        if port is not None:
            candidates = [port]
        else:
            candidates = free_ports(3, _HOST)
            if record is not None and port_free(_HOST, record.port) and four_letter_word(_HOST, record.port) is None:
                candidates.insert(0, record.port)
        problem: ZooKeeperServerError | None = None
        for candidate in candidates[:3]:
            server = EmbeddedZooKeeper(self.data_dir, port=candidate, host=_HOST)
            try:
                server.start(timeout_s=timeout_s)
                return server
            except ZooKeeperServerError as exc:
                if port is not None or "java not found" in str(exc) or "pyspark" in str(exc):
                    raise
                problem = exc
        assert problem is not None
        raise problem

    def release(self, user: ServerUser | None) -> bool:
        """Leave the server; stop it if no live user is left and it is not kept. True if it stopped."""
        with self.locked():
            if user is not None:
                user.file.unlink(missing_ok=True)
            if self._live_users():
                return False
            record = self.read_record()
            if record is not None and record.keep:
                return False
            return self._stop(record)

    def stop(self, *, force: bool = False) -> bool:
        """Stop the server (``zk stop``), also when kept. True if a running server was stopped.

        Raises:
            ZooKeeperServerError: live processes still use it (and not ``force``).
        """
        with self.locked():
            users = self._live_users()
            if users and not force and self.server().process.pid() is not None:
                listed = "; ".join(f"pid {u.pid}: {u.command}" for u in users)
                raise ZooKeeperServerError(
                    f"{len(users)} process(es) still use the store's ZooKeeper ({listed}); stopping it would cut "
                    "them off: let them finish or end them, or pass --force")
            return self._stop(self.read_record())

    def _stop(self, record: ServerRecord | None) -> bool:
        stopped = self.server().stop()
        if record is not None:
            self._write_record(replace(record, pid=None, keep=False))
        return stopped

    def status(self) -> StoreServerStatus:
        """The record, the server's pid and whether it answers, and its live users (reads only)."""
        server = self.server()
        pid = server.process.pid()
        running = pid is not None and server.mode() is not None
        return StoreServerStatus(data_dir=str(self.data_dir), record=self.read_record(), pid=pid, running=running,
                                 users=tuple(u for u in self.users() if u.alive()))


class ZooKeeperUse:
    """The ZooKeeper a caller uses (:attr:`config`) and gives back when done (:meth:`release`, or exit)."""

    def __init__(self, config: ZkConfig, *, owner: StoreZooKeeper | None = None,
                 user: ServerUser | None = None) -> None:
        self.config = config
        self._owner = owner
        self._user = user
        self._released = False

    @property
    def hosts(self) -> str:
        """The connection string (``config.hosts``)."""
        return self.config.hosts

    def release(self) -> bool:
        """Leave the store's server (its last user stops it). Idempotent; True if it stopped."""
        if self._released or self._owner is None:
            return False
        self._released = True
        return self._owner.release(self._user)

    def __enter__(self) -> ZooKeeperUse:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def ensure_zookeeper(cfg: ZkConfig, layout: StoreLayout, *, own: bool = False) -> ZooKeeperUse:
    """The ZooKeeper for a command on ``layout``; release the returned use when done. ``own``: no
    ``--zk`` was given, so a local store uses its own server and ``cfg.hosts`` is ignored.

    Raises:
        ZooKeeperServerError: the server could not start, or runs on another port than ``cfg.hosts``'s."""
    if own and layout.is_local:
        owner = StoreZooKeeper(layout)
        server, user, _ = owner.acquire()
        return ZooKeeperUse(replace(cfg, hosts=server.hosts), owner=owner, user=user)
    host, _, port_text = cfg.hosts.split(",")[0].rpartition(":")
    port = int(port_text)
    if "," not in cfg.hosts and host in (_HOST, "localhost") and layout.is_local:
        owner = StoreZooKeeper(layout)
        running = owner.running()
        if (running is not None and running.port == port) or four_letter_word(host, port) is None:
            _, user, _ = owner.acquire(port=port)
            return ZooKeeperUse(cfg, owner=owner, user=user)
    return ZooKeeperUse(cfg)  # another server answers there; or none, and kazoo will say it cannot connect
