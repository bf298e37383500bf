"""Helpers for the cluster tests: the processes a cluster folder runs, the CLI, a running demo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil


def processes_of(folder: Path) -> list[psutil.Process]:
    """Live processes whose command line names ``folder`` (ZooKeeper's zoo.cfg, Spark's work dirs)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status", "cwd"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            cwd = proc.info["cwd"] or ""
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if proc.info["status"] != psutil.STATUS_ZOMBIE and (str(folder) in cmd or cwd.startswith(str(folder))):
            found.append(proc)
    return found


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``deltawheel ARGS`` as a user would (a separate process)."""
    return subprocess.run([sys.executable, "-m", "deltawheel.cli", *args],
                          capture_output=True, text=True, timeout=timeout)
