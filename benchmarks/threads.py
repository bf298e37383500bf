"""CPU time of a JVM's threads, grouped by what they do, read from /proc/<pid>/task.

A benchmark's driver JVM runs Spark's stream execution, the JIT compilers, the garbage collector and
the threads py4j serves Python's calls on; :class:`ThreadCpu` tells how its CPU splits between them
over a measured run (docs/latency.md, "Where the two cores go")."""

from __future__ import annotations

import os
import re

__all__ = ["ThreadCpu", "jvm_thread_group", "thread_cpu"]

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
#: (prefix of a thread's name, as /proc shows it: at most 15 characters; group), first match wins
_GROUPS = (
    ("C2 CompilerThre", "jit_c2"),
    ("C1 CompilerThre", "jit_c1"),
    ("stream executio", "stream_execution"),
    ("Executor task l", "task_launch"),
    ("GC Thread", "gc"),
    ("G1 ", "gc"),
    ("VM Thread", "vm_thread"),
    ("dag-scheduler", "scheduler"),
    ("dispatcher-", "rpc"),
    ("task-result-get", "rpc"),
    ("rpc-", "rpc"),
    ("spark-listener", "listeners"),
)


def jvm_thread_group(name: str) -> str:
    """What a JVM thread named ``name`` (as /proc/<pid>/task/<tid>/comm has it) does.

    >>> jvm_thread_group("C2 CompilerThre")
    'jit_c2'
    >>> jvm_thread_group("stream executio")
    'stream_execution'
    >>> jvm_thread_group("Thread-12")  # py4j serves Python's calls on threads it does not name
    'py4j_calls'
    >>> jvm_thread_group("process reaper")
    'other'
    """
    if re.fullmatch(r"Thread-\d+", name):
        return "py4j_calls"
    return next((group for prefix, group in _GROUPS if name.startswith(prefix)), "other")


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread of ``pid``: tid -> (its name, CPU seconds so far, user + system); {} if it is gone."""
    out: dict[int, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue  # ended meanwhile
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()  # fields from the third (state) on
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) * _TICK_S)  # utime, stime
    return out


class ThreadCpu:
    """CPU seconds per thread group of some processes between their first and last :meth:`sample`."""

    def __init__(self) -> None:
        self._first: dict[tuple[int, int], float] = {}
        self._last: dict[tuple[int, int], tuple[str, float]] = {}
        self._seen: set[int] = set()

    def sample(self, pid: int) -> None:
        """Read ``pid``'s threads now; a thread started since its first sample counts from zero."""
        first_time = pid not in self._seen
        self._seen.add(pid)
        for tid, (name, cpu) in thread_cpu(pid).items():
            self._first.setdefault((pid, tid), cpu if first_time else 0.0)
            self._last[(pid, tid)] = (name, cpu)

    def by_group(self) -> dict[str, float]:
        """Group -> CPU seconds used between the samples, largest first."""
        out: dict[str, float] = {}
        for key, (name, last) in self._last.items():
            group = jvm_thread_group(name)
            out[group] = out.get(group, 0.0) + max(0.0, last - self._first.get(key, last))
        return {g: round(s, 2) for g, s in sorted(out.items(), key=lambda gs: -gs[1])}
