"""A chaos run's driver (one ``deltawheel run`` in a session of its own that dies with the harness),
and its Python workers for ``worker-kill``: pyspark's daemon and workers have a process group of
their own, so they are found as the driver's descendants (``/proc``) by their command line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from deltawheel.statestore.process import die_with

__all__ = ["Driver", "PythonWorker", "python_workers"]


@dataclass(kw_only=True)
class Driver:
    """One ``deltawheel run`` of the chaos pipeline: command, log (``--- start N`` per start), env, proc."""

    name: str
    cmd: list[str]
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    down: bool = False  # a driver-kill fault holds it down: the supervisor leaves it alone

    def running(self) -> bool:
        """Whether it runs and its log says every stage runs since its last start."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        text = self.log.read_text(errors="replace")
        return ": running " in text[text.rfind("--- start "):]

    def last_error(self) -> str:
        """What made it exit: its last ``deltawheel run:`` line since its last start, else its last line."""
        text = self.log.read_text(errors="replace")
        lines = text[text.rfind("--- start "):].splitlines()[1:]
        said = [ln for ln in lines if ln.startswith("deltawheel run:")]
        if said:
            return said[-1][len("deltawheel run:"):].strip()[:300]
        # the JVM's own words, should it have died: an error of its own, or a crash report beside the log
        jvm = [ln.strip() for ln in lines if any(m in ln for m in _JVM_DIED)]
        reports = sorted(str(p.name) for p in self.log.parent.glob(f"hs_err_{self.name}_*.log"))
        told = "".join(f"; the JVM: {jvm[0][:200]}" for _ in jvm[:1]) + "".join(f"; {r}" for r in reports[-1:])
        return (f"no error line; the last: {lines[-1].strip()[:260]}" if lines else "no error line") + told

    def start(self) -> None:
        """Start the command (again), a ``--- start N`` line first in its log."""
        with open(self.log, "ab") as out:
            out.write(f"--- start {self.starts + 1} at {time.time():.3f}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        die_with(os.getpid(), self.proc.pid)  # a harness killed (a test's timeout) takes its drivers along
        self.starts += 1

    def signal(self, sig: int) -> None:
        """Send ``sig`` to its process group, if it runs."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL its process group and reap it."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=60)


_JVM_DIED = ("java.lang.OutOfMemoryError", "A fatal error has been detected", "StackOverflowError",
             "Exception in thread \"main\"")
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
