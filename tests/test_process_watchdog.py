"""A server started under ``DELTAWHEEL_SERVERS_DIE_WITH`` does not outlive the process it names.

A real ZooKeeper server is started by a child Python process; the child is SIGKILLed (as a CI
runner's timeout or a user's kill would end a test run). Tied to the child (the variable names the
child's pid), the server must be gone soon after; untied, it is detached on purpose and keeps
running, as ``deltawheel zk start`` needs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
from conftest import free_port
from deltawheel.statestore.process import DIE_WITH_ENV

_STARTER = textwrap.dedent("""
    import os, sys, time
    if sys.argv[3] == "tie":
        os.environ[sys.argv[4]] = str(os.getpid())
    from deltawheel.servers.zookeeper import EmbeddedZooKeeper
    server = EmbeddedZooKeeper(sys.argv[1], port=int(sys.argv[2]))
    server.start()
    print(server.process.pid(), flush=True)
    time.sleep(600)
""")


def _server_of_killed_starter(folder: Path, *, tie: bool) -> int:
    """Start a ZooKeeper server from a child process, SIGKILL the child, return the server's pid."""
    env = {k: v for k, v in os.environ.items() if k != DIE_WITH_ENV}
    child = subprocess.Popen([sys.executable, "-c", _STARTER, str(folder), str(free_port()),
                              "tie" if tie else "detached", DIE_WITH_ENV], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    assert line.isdigit(), f"the starter printed {line!r}"
    assert not _gone(int(line))
    child.kill()
    child.wait(timeout=10)
    return int(line)


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _gone(pid)


def test_a_tied_server_dies_with_the_sigkilled_process(tmp_path: Path) -> None:
    server = _server_of_killed_starter(tmp_path / "zk", tie=True)
    try:
        assert _wait_gone(server, 30.0), "the tied server outlived the SIGKILLed process by 30 s"
    finally:
        if not _gone(server):
            os.killpg(server, signal.SIGKILL)


def test_an_untied_server_outlives_the_process_that_started_it(tmp_path: Path) -> None:
    server = _server_of_killed_starter(tmp_path / "zk", tie=False)
    try:
        assert not _wait_gone(server, 4.0), "an untied server must keep running (zk start)"
    finally:
        os.killpg(server, signal.SIGKILL)
