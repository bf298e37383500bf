"""The Python workers of a chaos run's driver, for the ``worker-kill`` fault.

pyspark's daemon puts itself and its forked workers in a process group of their own, so they are
found as descendants of the driver's process (``/proc``'s parent ids) by their command line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PythonWorker", "python_workers"]

MARKS = ("pyspark.daemon", "pyspark.worker")


@dataclass(frozen=True)
class PythonWorker:
    """One Python process under a driver: its pid and whether it is the daemon or a forked worker."""

    pid: int
    role: str  # "daemon" (its parent is the JVM) or "worker" (forked by the daemon)


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, command line) of every process that can be read."""
    out: dict[int, tuple[int, str, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        out[int(entry.name)] = (int(fields[1]), fields[0], cmd)
    return out


def python_workers(root: int) -> list[PythonWorker]:
    """The live (not zombie) pyspark daemons and workers descending from process ``root``, by pid."""
    procs = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found: list[PythonWorker] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        ppid, state, cmd = procs[pid]
        if state != "Z" and any(m in cmd for m in MARKS):
            parent = procs.get(ppid, (0, "", ""))[2]
            found.append(PythonWorker(pid, "worker" if any(m in parent for m in MARKS) else "daemon"))
    return sorted(found, key=lambda w: w.pid)
