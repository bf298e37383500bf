"""Peak memory of the whole process tree, sampled from /proc.

A benchmark process here is a Python driver, a JVM child and Python worker
grandchildren; a single-process max RSS (``time -v``) sees only one of them.
:class:`MemorySampler` is a daemon thread that, every ``interval_s``, sums PSS
(proportional set size: shared pages split between the sharers, so the sum
over a tree is meaningful) and RSS over this process and all its descendants,
and keeps the peaks. Use one sampler per engine run::

    with MemorySampler() as mem:
        engine.run(...)
    mem.peak.pss_bytes
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import psutil

__all__ = ["MemoryPeak", "MemorySampler", "tree_memory"]


@dataclass(frozen=True)
class MemoryPeak:
    """The peaks a :class:`MemorySampler` saw (see the field comments)."""
    pss_bytes: int  # peak of the sum of PSS over the tree
    rss_bytes: int  # peak of the sum of RSS over the tree (double-counts shared pages)
    max_single_rss_bytes: int  # largest RSS of one process seen (what `time -v` reports)
    driver_maxrss_bytes: int  # getrusage(RUSAGE_SELF).ru_maxrss of this Python process
    samples: int
    max_processes: int

    def to_dict(self) -> dict[str, Any]:
        """The peaks as JSON-ready data, in MiB (``*_mib`` instead of ``*_bytes``)."""
        d = asdict(self)
        for k in ("pss_bytes", "rss_bytes", "max_single_rss_bytes", "driver_maxrss_bytes"):
            d[k.replace("_bytes", "_mib")] = round(d.pop(k) / 2**20, 1)
        return d


def tree_memory(root: psutil.Process | None = None) -> tuple[int, int, int, int]:
    """Return (sum PSS, sum RSS, max single RSS, process count) over ``root`` and its descendants.

    Processes that vanish or cannot be read mid-sample are skipped.
    """
    root = root or psutil.Process(os.getpid())
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        procs = [root]
    pss = rss = top = n = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            try:
                r = p.memory_info().rss
            except psutil.Error:
                continue
            rss += r
            pss += r
            top = max(top, r)
            n += 1
            continue
        r = int(info.rss)
        rss += r
        pss += int(getattr(info, "pss", r))
        top = max(top, r)
        n += 1
    return pss, rss, top, n


class MemorySampler:
    """Context manager sampling :func:`tree_memory` every ``interval_s`` seconds in a thread."""

    def __init__(self, *, interval_s: float = 1.0) -> None:
        self._interval = interval_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pss = self._rss = self._top = self._samples = self._procs = 0
        self._root = psutil.Process(os.getpid())

    def sample(self) -> None:
        """Take one sample now and update the peaks."""
        pss, rss, top, n = tree_memory(self._root)
        with self._lock:
            self._pss = max(self._pss, pss)
            self._rss = max(self._rss, rss)
            self._top = max(self._top, top)
            self._procs = max(self._procs, n)
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
        return self

    def stop(self) -> MemoryPeak:
        """Stop sampling (after one last sample) and return the peaks."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()  # one last sample so short runs have at least two
        return self.peak

    @property
    def peak(self) -> MemoryPeak:
        """The peaks so far (``driver_maxrss_bytes`` read now)."""
        maxrss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        with self._lock:
            return MemoryPeak(self._pss, self._rss, self._top, int(maxrss_kib) * 1024,
                              self._samples, self._procs)

    def __enter__(self) -> MemorySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
