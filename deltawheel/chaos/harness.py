"""The chaos run: the bank pipeline as two ``deltawheel run`` instances on a ZooKeeper ensemble and a
local store (or S3Proxy), fed a seeded input under the fault schedule, then checked; docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.objectstore.s3a import ENV_ENDPOINT
from deltawheel.statestore.process import DIE_WITH_ENV, die_with

from ..servers.ensemble import ZooKeeperEnsemble
from . import checker
from .bank import INPUT_ENV, closing_moves, moves, write_moves
from .disk import StoreDisk, unmount_stale
from .driver import Driver, python_workers
from .faults import INSTANCES, KINDS, PlannedFault, plan
from .netcut import NetCut, member_session, session_after, start_net_cut, toxiproxy_missing
from .objectstore import ChaosObjectStore
from .tools import tool_fault

__all__ = ["ChaosSettings", "ChaosRun", "run_chaos"]

CHROOT = "/chaos"
MARKER = "chaos-run.json"
CLI = (sys.executable, "-m", "deltawheel.cli")


@dataclass(frozen=True, kw_only=True)
class ChaosSettings:
    """A chaos run's knobs; ``seed`` fixes the input and the fault schedule."""

    seed: int
    seconds: float = 60.0
    data: Path = Path("data") / "chaos"
    session_timeout_s: float = 6.0
    file_every_s: float = 2.0
    moves_per_file: int = 20
    mean_gap_s: float = 5.0
    bound_s: float = 600.0  # a stream must commit this soon after each heal
    start_s: float = 300.0  # for both drivers' first commits (and a driver back after a fault)
    drain_s: float = 900.0
    tool_timeout_s: float = 900.0  # a tool still running then is killed (its exit code -9)
    master: str = "local[1]"
    trigger: str = "1 second"
    store_tmpfs_mb: int = 128  # the store's tmpfs for ``disk-full`` (0: none, the kind left out)
    kinds: tuple[str, ...] = ()  # the kinds the schedule draws from (empty: every kind of :data:`KINDS`)
    object_store: bool = False  # the store on s3a:// through an S3Proxy of the run's own (``s3proxy-kill``)


#: Lines of a driver's log that tell what a worker's kill did.
WORKER_SIGNS = ("Python worker exited unexpectedly", "crashed", "EOFError", "BatchFailedError", "deltawheel run:")


class _Skipped(Exception):
    """A fault that cannot happen at its time (the reason)."""


@dataclass(kw_only=True)
class ChaosRun:
    """What a run did: its settings, the faults as they happened, the tools' exit codes, the check."""

    settings: ChaosSettings
    faults: list[checker.FaultRecord] = field(default_factory=list)
    skipped: list[tuple[PlannedFault, str]] = field(default_factory=list)  # not started, and why
    kinds: list[str] = field(default_factory=lambda: sorted(KINDS))  # the kinds the schedule drew from
    left_out: dict[str, str] = field(default_factory=dict)  # kind -> why it is not among them
    exits: list[checker.DriverExit] = field(default_factory=list)  # drivers that stopped by themselves
    tools: dict[str, list[int]] = field(default_factory=dict)
    tracebacks: list[str] = field(default_factory=list)  # tools that ended with one, not a typed error
    files: int = 0
    drained: bool = False
    result: checker.CheckResult | None = None
    phases: dict[str, float] = field(default_factory=dict)


class _Harness:
    def __init__(self, settings: ChaosSettings, say: Callable[[str], None]) -> None:
        self.s = settings
        self.say = say
        self.data = settings.data.resolve()
        self.input, self.store, self.logs = self.data / "input", self.data / "store", self.data / "logs"
        self.s3 = ChaosObjectStore(self.data / "s3") if settings.object_store else None
        self.store_url = self.s3.url if self.s3 else str(self.store)  # what the drivers and tools are given
        if self.s3:
            self.store = self.s3.local  # the store's files, for the checker
        self.ensemble = ZooKeeperEnsemble(self.data / "zk", size=3)
        self.run = ChaosRun(settings=settings)
        self.stop_input = threading.Event()
        self.stopping = threading.Event()  # set by stop(): nothing starts any more
        self.lock = threading.Lock()
        self.slots: dict[str, threading.Lock] = {}
        self.tool_procs: list[subprocess.Popen[bytes]] = []
        self.drivers: dict[str, Driver] = {}
        self.threads: list[threading.Thread] = []
        self.file_index = 0
        self.disk = StoreDisk(self.s3.blobs if self.s3 else self.store, settings.store_tmpfs_mb)
        self.netcut: NetCut | None = None  # the drivers' proxies, with ``net-cut`` among the kinds

    def prepare(self) -> None:
        unmount_stale(self.disk.folder)
        if self.data.exists():
            if any(self.data.iterdir()) and not (self.data / MARKER).exists():
                raise ConfigError(f"chaos --data {self.data}: a folder with other content; give an empty or new "
                                  "folder (a chaos run's own folder is reused)")
            shutil.rmtree(self.data)
        self.logs.mkdir(parents=True)
        if self.s.kinds:
            self.run.kinds = sorted(self.s.kinds)
        (self.data / MARKER).write_text(json.dumps({**asdict(self.s), "data": str(self.s.data)}, indent=2) + "\n")
        reason = self.disk.mount()
        if reason is not None:
            self.leave_out("disk-full", reason)
        else:
            self.say(f"chaos: the store on a tmpfs of {self.s.store_tmpfs_mb} MiB (disk-full fills it)")
        if self.s3 is None:
            self.run.kinds = [k for k in self.run.kinds if k != "s3proxy-kill"]
        else:
            self.s3.start()
            self.say(f"chaos: the store on {self.s3.url} through S3Proxy at {self.s3.env[ENV_ENDPOINT]}")
        if "net-cut" in self.run.kinds:
            reason = self.start_netcut()
            if reason is not None:
                self.leave_out("net-cut", reason)

    def leave_out(self, kind: str, reason: str) -> None:
        self.run.left_out[kind] = reason
        self.run.kinds = [k for k in self.run.kinds if k != kind]
        self.say(f"chaos: {kind} left out of the schedule: {reason}")

    def start_netcut(self) -> str | None:
        """Toxiproxy and each driver's proxies (:mod:`.netcut`); None, or why not.

        Raises:
            ConfigError: ``net-cut`` named in the kinds, and Toxiproxy did not start."""
        server = self.s3.server if self.s3 is not None else None
        got = start_net_cut(self.data / "toxiproxy", zk=[s.hosts for s in self.ensemble.servers],
                            s3=f"{server.host}:{server.port}" if server is not None else None)
        if isinstance(got, str):
            if "net-cut" in self.s.kinds:
                raise ConfigError(f"chaos: the fault kind net-cut needs Toxiproxy, which did not start: {got}")
            return got
        self.netcut = got
        self.say(f"chaos: the drivers reach ZooKeeper{' and S3Proxy' * bool(server)} through Toxiproxy "
                 f"(a: {got.hosts('a')}; b: {got.hosts('b')})")
        return None

    def zk_args(self, driver: str | None = None) -> list[str]:
        """``--zk``: the servers' addresses, or a driver's proxies to them (with ``net-cut``)."""
        hosts = self.netcut.hosts(driver) if driver is not None and self.netcut is not None else self.ensemble.hosts
        return ["--zk", hosts, "--zk-chroot", CHROOT]

    def env(self, driver: str | None = None) -> dict[str, str]:
        """The environment of the tools, or of a driver (its S3 endpoint its proxy, with ``net-cut``)."""
        env = {**os.environ, INPUT_ENV: str(self.input), "PYTHONUNBUFFERED": "1", **(self.s3.env if self.s3 else {})}
        if driver is not None and self.netcut is not None and self.s3 is not None:
            env[ENV_ENDPOINT] = self.netcut.s3_endpoint(driver)
        if driver is not None:  # a driver lives the whole run, through many query starts: room for their
            # compiled code (a 48-MiB cache filled), and the JVM's own report should it die
            env["SPARK_SUBMIT_OPTS"] = " ".join([env.get("SPARK_SUBMIT_OPTS", ""), "-XX:ReservedCodeCacheSize=256m",
                                                 f"-XX:ErrorFile={self.logs}/hs_err_{driver}_%p.log"]).strip()
        return env

    def make_drivers(self) -> None:
        for name in INSTANCES:
            cmd = [*CLI, "run", "deltawheel.chaos.bank:pipeline", "--store", self.store_url,
                           *self.zk_args(name), "--zk-session-timeout", str(self.s.session_timeout_s),
                           "--trigger", self.s.trigger, "--instance", name, "--master", self.s.master, "--wait", "600",
                           "--driver-memory", "1g"]
            self.drivers[name] = Driver(name=name, cmd=cmd, log=self.logs / f"driver-{name}.log", env=self.env(name))

    def write_next(self) -> None:
        write_moves(self.input, self.file_index, moves(self.file_index, self.s.moves_per_file, seed=self.s.seed))
        self.file_index += 1

    def generate(self) -> None:
        while not self.stop_input.wait(self.s.file_every_s):
            self.write_next()

    def tool(self, name: str, *args: str) -> int:
        """Run ``deltawheel args`` into ``logs/tool-<name>.log``; record and return its exit code
        (-1: not started, the run stopping; -9: killed after ``tool_timeout_s``)."""
        with open(self.logs / f"tool-{name}.log", "ab") as out, self.lock:
            if self.stopping.is_set():
                return -1
            start = out.tell()
            proc = subprocess.Popen([*CLI, *args], stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                                    start_new_session=True)
            die_with(os.getpid(), proc.pid)
            self.tool_procs.append(proc)
        try:
            rc = proc.wait(timeout=self.s.tool_timeout_s)
        except subprocess.TimeoutExpired:  # recorded as killed: the run goes on
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait(timeout=60)
        with open(self.logs / f"tool-{name}.log", "rb") as log:
            log.seek(start)
            told = log.read().decode(errors="replace")
        with self.lock:
            self.run.tools.setdefault(name, []).append(rc)
            if "Traceback (most recent call last)" in told:
                last = [ln for ln in told.splitlines() if ln.strip() and not ln.startswith(("\t", " "))]
                self.run.tracebacks.append(f"{name} rc {rc}: {(last or [''])[-1][:200]}")
        return rc

    def skip(self, f: PlannedFault, reason: str) -> None:
        with self.lock:
            self.run.skipped.append((f, reason))
        self.say(f"chaos: {f.kind} on {f.target} planned at {f.at:.1f}s skipped: {reason}")

    def inject(self, f: PlannedFault, begin: float) -> None:
        time.sleep(max(0.0, begin + f.at - time.monotonic()))
        with self.slots.setdefault(f.slot, threading.Lock()):
            if time.monotonic() > begin + self.s.seconds:  # its slot's previous fault outlasted the phase
                self.skip(f, "the phase is over")
                return
            start, target = time.time(), f.target
            try:
                if f.target in self.drivers:
                    heal, note = self.driver_fault(f, self.drivers[f.target])
                else:
                    target, note = self.other_fault(f)
                    heal = time.time()
            except _Skipped as exc:
                self.skip(f, str(exc))
                return
        record = checker.FaultRecord(kind=f.kind, target=target, start=start, heal=heal, note=note)
        with self.lock:
            self.run.faults.append(record)
        self.say(f"chaos: {f.kind} on {target} at {start - self.run.phases['chaos']:.1f}s, healed after "
                 f"{heal - start:.1f}s {note}".rstrip())

    def driver_fault(self, f: PlannedFault, d: Driver) -> tuple[float, str]:
        """Kill or stop driver ``d`` (or a Python worker), heal it; (heal time, note) once it runs again."""
        note = ""
        if f.kind == "worker-kill":
            heal, note = self.worker_kill(f, d)
        elif f.kind == "net-cut":
            heal, note = self.net_cut(f, d)
        elif f.kind == "driver-kill":
            with self.lock:
                d.down = True
            d.kill()
            time.sleep(f.duration_s)
            with self.lock:
                if not self.stopping.is_set():
                    d.start()
                d.down = False
            heal = time.time()
        else:  # a zombie: shorter (driver-pause) or longer (session-expiry) than the session
            d.signal(signal.SIGSTOP)
            time.sleep(f.duration_s)
            d.signal(signal.SIGCONT)
            heal = time.time()
            if f.kind == "session-expiry":  # it stops on its lost lease: the supervisor's restart
                self.stopping.wait(self.s.session_timeout_s)
        self.wait_back(d)
        return heal, note

    def worker_kill(self, f: PlannedFault, d: Driver) -> tuple[float, str]:
        """SIGKILL one Python worker of ``d`` (drawn with the seed), watch the driver for the fault's
        duration; raises :class:`_Skipped` without a worker."""
        proc = d.proc
        workers = python_workers(proc.pid) if proc is not None and proc.poll() is None else []
        if not workers:
            raise _Skipped("no Python worker under the driver at that moment")
        w = f.rng(self.s.seed).choice(workers)
        with self.lock:
            exits_before = len(self.run.exits)
        log_at = d.log.stat().st_size
        try:
            os.kill(w.pid, signal.SIGKILL)
        except ProcessLookupError:
            raise _Skipped(f"the drawn {w.role} (pid {w.pid}) ended before the kill") from None
        heal = time.time()
        self.stopping.wait(f.duration_s)
        with open(d.log, "rb") as log:
            log.seek(log_at)
            after = log.read().decode(errors="replace").splitlines()
        with self.lock:
            note = f"pid {w.pid} ({w.role}, 1 of {len(workers)} Python processes); " + checker.exits_note(
                self.run.exits[exits_before:], d.name, f.duration_s)
        seen = [ln.strip() for ln in after if any(m in ln for m in WORKER_SIGNS)]
        return heal, note + (f"; its log: {seen[0][:200]}" if seen else "")

    def net_cut(self, f: PlannedFault, d: Driver) -> tuple[float, str]:
        """Cut driver ``d``'s proxies for the fault's duration; watch it for the session timeout and,
        if its session expired, until it was started again."""
        assert self.netcut is not None
        with self.lock:
            exits_before, starts = len(self.run.exits), d.starts
        session, begin = member_session(self.ensemble.hosts, CHROOT, d.name), time.time()
        names = self.netcut.cut(d.name)
        try:
            self.stopping.wait(f.duration_s)
        finally:
            self.netcut.restore(d.name)
        heal = time.time()
        self.stopping.wait(self.s.session_timeout_s)
        said = session_after(self.ensemble.hosts, CHROOT, d.name, session)
        deadline = time.monotonic() + self.s.start_s
        while said == "expired" and d.starts == starts and time.monotonic() < deadline and not self.stopping.wait(1):
            pass
        with self.lock:
            ran = checker.exits_note(self.run.exits[exits_before:], d.name, time.time() - begin)
        return heal, f"{len(names)} proxies cut ({', '.join(names)}); its session {said}; {ran}"

    def other_fault(self, f: PlannedFault) -> tuple[str, str]:
        """A server's kill and restart, the disk filled and freed, or a tool; returns (target, note)."""
        if f.kind.startswith("zk"):
            myid = int(f.target[2:]) if f.target != "leader" else (self.ensemble.leader() or 1)
            self.ensemble.kill(myid)
            time.sleep(f.duration_s)
            if not self.stopping.is_set():
                self.ensemble.restart(myid)
            return f"zk{myid}", ""
        if f.kind == "s3proxy-kill" and self.s3 is not None:
            pid = self.s3.kill()
            self.stopping.wait(f.duration_s)
            if not self.stopping.is_set():
                self.s3.restart()
            return f.target, f"pid {pid}"
        if f.kind == "disk-full":
            free = self.disk.free_bytes()
            filled = self.disk.fill()
            self.stopping.wait(f.duration_s)
            self.disk.free()
            return f.target, f"{filled / 2**20:.1f} MiB written of {free / 2**20:.1f} MiB free"
        return tool_fault(self, f)

    def wait_back(self, d: Driver) -> None:
        """Hold the driver's slot until it runs again (the next fault hits a running driver)."""
        deadline = time.monotonic() + self.s.start_s
        while not d.running() and time.monotonic() < deadline and not self.stopping.wait(1.0):
            pass

    def supervise(self) -> None:
        """As a supervisor (systemd, Kubernetes): restart a driver that exits, recording its exit."""
        while not self.stopping.wait(1.0):
            with self.lock:
                for d in self.drivers.values():
                    if d.down or d.proc is None or d.proc.poll() is None or self.stopping.is_set():
                        continue
                    exit_ = checker.DriverExit(driver=d.name, code=d.proc.returncode, at=time.time(),
                                               error=d.last_error())
                    self.run.exits.append(exit_)
                    self.say(f"chaos: driver {d.name} exited with {exit_.code} ({exit_.error}); started again")
                    d.start()

    def wait(self, what: str, check: Callable[[], bool], timeout_s: float, *, every_s: float = 30.0) -> bool:
        """Whether ``check()`` came true within ``timeout_s``; a line every ``every_s`` says what it waits for."""
        start = said = time.monotonic()
        while not check():
            if (now := time.monotonic()) - start > timeout_s:
                self.say(f"chaos: {what}: not within {timeout_s:.0f}s")
                return False
            if now - said >= every_s:
                said = now
                self.say(f"chaos: waiting for {what}: {now - start:.0f}s of at most {timeout_s:.0f}s")
            time.sleep(min(1.0, every_s))
        return True

    def execute(self) -> ChaosRun:
        s, run = self.s, self.run
        self.say(f"chaos: data in {self.data}; ZooKeeper ensemble of 3 starting")
        self.prepare()
        self.ensemble.start()
        self.make_drivers()
        self.write_next()
        generator = threading.Thread(target=self.generate, name="chaos-input", daemon=True)
        generator.start()
        run.phases["start"] = time.time()
        for d in self.drivers.values():
            d.start()
        threading.Thread(target=self.supervise, name="chaos-supervisor", daemon=True).start()
        if not self.wait("both drivers' first commits", lambda: all(
                "running" in d.log.read_text(errors="replace") for d in self.drivers.values())
                and bool(checker.stream_commits(self.store, "changes")), s.start_s):
            raise ConfigError(f"chaos: the drivers did not commit within {s.start_s:.0f}s; see {self.logs}")
        schedule = plan(s.seed, s.seconds, mean_gap_s=s.mean_gap_s, session_timeout_s=s.session_timeout_s,
                        kinds=run.kinds)
        self.say(f"chaos: both drivers commit; {len(schedule)} faults over {s.seconds:.0f}s")
        run.phases["chaos"] = time.time()
        begin = time.monotonic()
        self.threads = [threading.Thread(target=self.inject, args=(f, begin), name=f"chaos-{f.kind}", daemon=True)
                        for f in schedule]
        for t in self.threads:
            t.start()
        time.sleep(max(0.0, begin + s.seconds - time.monotonic()))
        for t in self.threads:
            t.join()
        run.phases["healed"] = time.time()
        self.stop_input.set()
        generator.join()
        write_moves(self.input, self.file_index, closing_moves(self.file_index))
        run.files = self.file_index + 1
        self.say(f"chaos: every fault healed; {run.files} input files; draining")
        run.drained = self.wait("the drain", lambda: checker.complete(self.store, self.input), s.drain_s)
        time.sleep(3.0)  # a duplicate would land by now
        run.phases["drained"] = time.time()
        return run

    def stop(self) -> None:
        try:
            self.stop_processes()
        finally:  # Toxiproxy and S3Proxy stopped, the store's content back on disk, also when stopping failed
            try:
                if self.netcut is not None:
                    self.netcut.stop()
                if self.s3 is not None:
                    self.s3.stop()
            finally:
                note = self.disk.unmount()
                if note:
                    self.say(f"chaos: the store's tmpfs: {note}")

    def stop_processes(self) -> None:
        with self.lock:
            self.stopping.set()
        for d in self.drivers.values():
            d.signal(signal.SIGCONT)
            d.signal(signal.SIGTERM)
        for d in self.drivers.values():
            if d.proc is not None:
                try:
                    d.proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    d.kill()
        with self.lock:
            procs = list(self.tool_procs)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=60)
        for t in self.threads:  # a fault still sleeping before its heal: it starts nothing now
            t.join(timeout=120)
        self.ensemble.stop()


def _save(run: ChaosRun, store: Path) -> None:
    data = run.settings.data.resolve()
    (data / "faults.json").write_text(json.dumps({
        "seed": run.settings.seed, "store": str(store.relative_to(data)),
        "object_store": run.settings.object_store, "phases": run.phases, "files": run.files,
        "drained": run.drained, "tools": run.tools, "tracebacks": run.tracebacks,
        "faults": [asdict(f) for f in run.faults], "kinds": run.kinds, "left_out": run.left_out,
        "skipped": [{**asdict(f), "reason": why} for f, why in run.skipped],
        "exits": [asdict(e) for e in run.exits]}, indent=2) + "\n")


def run_chaos(settings: ChaosSettings, *, say: Callable[[str], None] = print) -> ChaosRun:
    """One chaos run and its check (``run.result``); every process it started is stopped on the way out.

    Raises:
        ConfigError: ``settings.kinds`` names an unknown kind or one this run cannot make,
            ``settings.data`` holds something else, or the drivers never committed."""
    unknown = sorted(set(settings.kinds) - set(KINDS))
    if unknown:
        raise ConfigError(f"chaos: no fault kind {', '.join(unknown)}; the kinds: {', '.join(sorted(KINDS))}")
    if "s3proxy-kill" in settings.kinds and not settings.object_store:
        raise ConfigError("chaos: the fault kind s3proxy-kill needs the store on the object store: add --object-store")
    if "net-cut" in settings.kinds and (why := toxiproxy_missing()) is not None:
        raise ConfigError(f"chaos: the fault kind net-cut needs Toxiproxy, which is unavailable: {why}; "
                          "or leave net-cut out of --kinds")
    h = _Harness(settings, say)
    before = os.environ.get(DIE_WITH_ENV)
    os.environ[DIE_WITH_ENV] = str(os.getpid())  # the servers it starts die with this process too
    try:
        run = h.execute()
    finally:
        h.stop()
        h.stop_input.set()
        os.environ.pop(DIE_WITH_ENV)
        if before is not None:
            os.environ[DIE_WITH_ENV] = before
    run.faults.sort(key=lambda f: f.start)
    _save(run, h.store)
    run.result = checker.check_run(h.store, h.input, run.faults, bound_s=settings.bound_s,
                                   end=run.phases.get("drained"))
    run.result.violations += checker.exit_violations(run.exits, object_store=settings.object_store)
    run.result.violations += checker.traceback_violations(run.tracebacks)
    return run
