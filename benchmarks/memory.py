"""Peak memory and CPU of a whole process tree (driver, JVM, Python workers), sampled from /proc.

:class:`MemorySampler` sums PSS (shared pages split between sharers, so a tree's sum is meaningful)
over a process tree every ``interval_s`` and keeps the sample with the highest sum (``peak``)."""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Callable

import psutil

from .threads import ThreadCpu

__all__ = ["MemoryPeak", "MemorySampler", "ProcessMemory", "measured_run_ended", "on_measured_run_end",
           "process_role", "tree_processes"]

_MIB = 2**20
_IDLE_CPU_S = 0.1  # a process that used less CPU than this up to the peak sat idle
#: Java main classes (or jar names) that name a JVM's role, first match wins.
_JVM_ROLES = (
    ("org.apache.zookeeper.server", "zookeeper_jvm"),
    ("org.gaul.s3proxy", "s3proxy_jvm"),
    ("s3proxy", "s3proxy_jvm"),
    ("kafka.Kafka", "kafka_jvm"),
    ("org.apache.spark.deploy.SparkSubmit", "driver_jvm"),
    ("pyspark-shell", "driver_jvm"),
)


def process_role(cmdline: list[str], *, is_root: bool = False, parent_role: str | None = None) -> str:
    """What a process of a benchmark's tree is, from its command line (else the program's name).

    >>> process_role(["java", "-Xmx256m", "-cp", "j/*", "org.apache.zookeeper.server.ZooKeeperServerMain", "z"])
    'zookeeper_jvm'
    >>> process_role(["python3", "-m", "pyspark.daemon"])
    'python_daemon'
    >>> process_role(["python3", "-m", "deltawheel.executor.tasks.daemon", "pyspark.worker"])
    'python_daemon'
    >>> process_role(["python3", "-m", "pyspark.daemon"], parent_role="python_daemon")
    'python_worker'
    """
    if is_root:
        return "driver_python"
    prog = os.path.basename(cmdline[0]) if cmdline else ""
    joined = " ".join(cmdline)
    if prog.startswith("java"):
        return next((role for needle, role in _JVM_ROLES if needle in joined), "other_jvm")
    if "python" in prog:
        if parent_role in ("python_daemon", "python_worker"):
            return "python_worker"
        if "pyspark.daemon" in joined or "tasks.daemon" in joined:
            return "python_daemon"
        if "pyspark.worker" in joined:
            return "python_worker"
        return "other_python"
    return prog or "unknown"


@dataclass(frozen=True, kw_only=True)
class ProcessMemory:
    """One process of the tree in one sample."""
    pid: int
    role: str  # see process_role
    pss_bytes: int
    rss_bytes: int
    uss_bytes: int  # pages of this process alone (what ending it would free)
    cpu_s: float = 0.0  # its CPU time (user + system) so far


@dataclass(frozen=True, kw_only=True)
class MemoryPeak:
    """The peaks a :class:`MemorySampler` saw."""
    pss_bytes: int  # peak of the sum of PSS over the tree
    rss_bytes: int  # peak of the sum of RSS over the tree (double-counts shared pages)
    max_single_rss_bytes: int  # largest RSS of one process seen (what `time -v` reports)
    driver_maxrss_bytes: int  # the tree root's own peak RSS (getrusage's ru_maxrss, or a child's VmHWM)
    samples: int
    max_processes: int
    at_peak: tuple[ProcessMemory, ...] = ()  # every process in the sample with the highest PSS sum
    role_peaks_bytes: tuple[tuple[str, int], ...] = ()  # (role, its own highest PSS sum over the run)
    at_peak_s: float | None = None  # seconds from the start of sampling to that sample
    loadavg_1m_at_peak: float | None = None
    loadavg_1m_at_start: float | None = None
    preexisting: tuple[int, ...] = ()  # pids of the tree when the sampler was made
    cpu_first: tuple[tuple[int, float], ...] = ()  # (pid, its CPU time when sampling began: 0 if it started since)
    cpu_by_role: tuple[tuple[str, float], ...] = ()  # (role, CPU seconds its processes used while sampled)
    driver_jvm_threads_cpu: tuple[tuple[str, float], ...] = ()  # (thread group, CPU seconds while sampled)

    def is_new(self, p: ProcessMemory) -> bool:
        """``p`` started while sampling."""
        return p.pid not in self.preexisting

    def cpu_in_run(self, p: ProcessMemory) -> float:
        """The CPU seconds ``p`` used from the start of sampling (or its own start) to the peak."""
        return round(p.cpu_s - dict(self.cpu_first).get(p.pid, p.cpu_s), 2)

    def is_idle(self, p: ProcessMemory) -> bool:
        """``p`` used under 0.1 CPU-s since sampling began; the worker daemon is busy while a worker is."""
        if p.role == "python_daemon":
            return not any(q.role == "python_worker" and self.cpu_in_run(q) >= _IDLE_CPU_S for q in self.at_peak)
        return self.cpu_in_run(p) < _IDLE_CPU_S

    def by_role(self) -> dict[str, int]:
        """PSS at the peak summed per role (bytes), largest first."""
        out = Counter[str]()
        for p in self.at_peak:
            out[p.role] += p.pss_bytes
        return dict(out.most_common())

    def to_dict(self) -> dict[str, Any]:
        """The peaks as JSON-ready data in MiB, with the processes at the peak, per-role sums and CPU seconds."""
        d = asdict(self)
        for k in ("pss_bytes", "rss_bytes", "max_single_rss_bytes", "driver_maxrss_bytes"):
            d[k.replace("_bytes", "_mib")] = round(d.pop(k) / _MIB, 1)
        d["at_peak"] = [{"pid": p.pid, "role": p.role, "pss_mib": round(p.pss_bytes / _MIB, 1),
                         "rss_mib": round(p.rss_bytes / _MIB, 1), "uss_mib": round(p.uss_bytes / _MIB, 1),
                         "new": self.is_new(p), "cpu_s_in_run": self.cpu_in_run(p)}
                        for p in sorted(self.at_peak, key=lambda p: -p.pss_bytes)]
        d["at_peak_new_pss_mib"] = round(sum(p.pss_bytes for p in self.at_peak if self.is_new(p)) / _MIB, 1)
        d["at_peak_idle_pss_mib"] = round(sum(p.pss_bytes for p in self.at_peak if self.is_idle(p)) / _MIB, 1)
        d["at_peak_by_role_pss_mib"] = {r: round(b / _MIB, 1) for r, b in self.by_role().items()}
        d["role_peaks_pss_mib"] = {r: round(b / _MIB, 1) for r, b in
                                   sorted(self.role_peaks_bytes, key=lambda rb: -rb[1])}
        d["cpu_s"] = round(sum(c for _, c in self.cpu_by_role), 2)
        d["cpu_s_by_role"] = {r: round(c, 2) for r, c in sorted(self.cpu_by_role, key=lambda rc: -rc[1])}
        d["driver_jvm_threads_cpu_s"] = dict(self.driver_jvm_threads_cpu)  # threads.py's groups
        del d["preexisting"], d["cpu_first"], d["role_peaks_bytes"], d["cpu_by_role"], d["driver_jvm_threads_cpu"]
        return d


def _role_of(p: psutil.Process, *, root: psutil.Process, roles: dict[tuple[int, float], str]) -> str:
    try:
        key = (p.pid, p.create_time())
    except psutil.Error:
        return "unknown"
    if (got := roles.get(key)) is None:
        parent_role = None
        try:
            ppid = p.ppid()
            parent_role = next((r for (pid, _), r in roles.items() if pid == ppid), None)
            cmd = p.cmdline()
        except psutil.Error:
            cmd = []
        got = roles[key] = process_role(cmd, is_root=p.pid == root.pid, parent_role=parent_role)
    return got


def tree_processes(root: psutil.Process | None = None, *,
                   roles: dict[tuple[int, float], str] | None = None) -> list[ProcessMemory]:
    """Every process of ``root``'s tree with its role and memory; ``roles`` caches roles between calls.

    Vanished processes are skipped; one whose smaps cannot be read counts its RSS as PSS and USS."""
    root = root or psutil.Process(os.getpid())
    roles = {} if roles is None else roles
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        procs = [root]

    def started(p: psutil.Process) -> float:
        try:
            return float(p.create_time())
        except psutil.Error:
            return 0.0

    procs.sort(key=started)  # a parent before its children: a forked worker is named after its daemon
    out = []
    for p in procs:
        try:
            info = p.memory_full_info()
            r = int(info.rss)
            pss, uss = int(getattr(info, "pss", r)), int(getattr(info, "uss", r))
            cpu = p.cpu_times()
        except psutil.AccessDenied:
            try:
                r = pss = uss = int(p.memory_info().rss)
                cpu = p.cpu_times()
            except psutil.Error:
                continue
        except psutil.Error:
            continue
        out.append(ProcessMemory(pid=p.pid, role=_role_of(p, root=root, roles=roles), pss_bytes=pss,
                                 rss_bytes=r, uss_bytes=uss, cpu_s=float(cpu.user + cpu.system)))
    return out


def _vm_hwm_bytes(pid: int) -> int:
    """``VmHWM`` of process ``pid``, 0 if unreadable."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class MemorySampler:
    """Context manager sampling the tree of ``root_pid`` (default this process) every ``interval_s`` in a thread."""

    def __init__(self, *, interval_s: float = 1.0, root_pid: int | None = None) -> None:
        self._interval = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pss = self._rss = self._top = self._samples = self._procs = 0
        self._root = psutil.Process(os.getpid() if root_pid is None else root_pid)
        self._foreign = self._root.pid != os.getpid()
        self._hwm = 0
        self._roles: dict[tuple[int, float], str] = {}
        self._at_peak: tuple[ProcessMemory, ...] = ()
        self._role_peaks: dict[str, int] = {}
        self._cpu_first: dict[int, float] = {}
        self._cpu_last: dict[int, tuple[str, float]] = {}  # pid -> (role, CPU time at its last sample)
        self._jvm_threads = ThreadCpu()  # the driver JVM's CPU per thread group
        self._t0 = time.monotonic()
        try:
            self._preexisting = tuple(sorted([self._root.pid, *(c.pid for c in self._root.children(recursive=True))]))
        except psutil.Error:
            self._preexisting = (self._root.pid,)
        self._at_peak_s: float | None = None
        self._load_at_peak: float | None = None
        self._load_at_start = round(os.getloadavg()[0], 2)

    def sample(self) -> None:
        """Take one sample now and update the peaks."""
        procs = tree_processes(self._root, roles=self._roles)
        hwm = _vm_hwm_bytes(self._root.pid) if self._foreign else 0
        pss = sum(p.pss_bytes for p in procs)
        per_role = Counter[str]()
        for p in procs:
            per_role[p.role] += p.pss_bytes
        with self._lock:
            if pss > self._pss or not self._at_peak:
                self._pss = pss
                self._at_peak = tuple(procs)
                self._at_peak_s = round(time.monotonic() - self._t0, 1)
                self._load_at_peak = round(os.getloadavg()[0], 2)
            for p in procs:  # a process started since sampling began counts its CPU from zero
                self._cpu_first.setdefault(p.pid, p.cpu_s if p.pid in self._preexisting else 0.0)
                self._cpu_last[p.pid] = (p.role, p.cpu_s)
            for p in procs:
                if p.role == "driver_jvm":
                    self._jvm_threads.sample(p.pid)
            for role, b in per_role.items():
                self._role_peaks[role] = max(self._role_peaks.get(role, 0), b)
            self._rss = max(self._rss, sum(p.rss_bytes for p in procs))
            self._top = max([self._top, *(p.rss_bytes for p in procs)])
            self._procs = max(self._procs, len(procs))
            self._hwm = max(self._hwm, hwm)
            self._samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.sample()
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - t0)))

    def start(self) -> MemorySampler:
        """Start sampling in a daemon thread; returns ``self``."""
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)
        self._thread.start()
        _ACTIVE.append(self)
        return self

    def stop(self) -> MemoryPeak:
        """Stop sampling (after one last sample, unless :meth:`end` took it) and return the peaks."""
        if not self._stop.is_set():
            self.end()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        return self.peak

    def end(self) -> None:
        """Take one last sample now and sample no more (once only)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()  # one last sample so short runs have at least two

    @property
    def peak(self) -> MemoryPeak:
        """The peaks so far."""
        maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        with self._lock:
            maxrss = self._hwm if self._foreign else int(maxrss_kib) * 1024
            return MemoryPeak(pss_bytes=self._pss, rss_bytes=self._rss, max_single_rss_bytes=self._top,
                              driver_maxrss_bytes=maxrss, samples=self._samples, max_processes=self._procs,
                              at_peak=self._at_peak, role_peaks_bytes=tuple(self._role_peaks.items()),
                              at_peak_s=self._at_peak_s, loadavg_1m_at_peak=self._load_at_peak,
                              loadavg_1m_at_start=self._load_at_start, preexisting=self._preexisting,
                              cpu_first=tuple(self._cpu_first.items()),
                              cpu_by_role=tuple(self._cpu_roles().items()),
                              driver_jvm_threads_cpu=tuple(self._jvm_threads.by_group().items()))

    def _cpu_roles(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for pid, (role, last) in self._cpu_last.items():
            out[role] = out.get(role, 0.0) + max(0.0, last - self._cpu_first.get(pid, last))
        return out

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_ACTIVE: list[MemorySampler] = []  # the samplers started and not yet stopped, oldest first
_END_HOOKS: list[Callable[[], None]] = []  # called once each by the next measured_run_ended()


def on_measured_run_end(hook: Callable[[], None]) -> None:
    """Call ``hook`` once at the next :func:`measured_run_ended`."""
    _END_HOOKS.append(hook)


def measured_run_ended() -> None:
    """The measured run has ended: every running sampler takes its last sample and the hooks run once."""
    for sampler in list(_ACTIVE):
        sampler.end()
    hooks = list(_END_HOOKS)
    _END_HOOKS.clear()
    for hook in hooks:
        hook()
