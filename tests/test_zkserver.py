"""The embedded ZooKeeper server: a real java process, started and stopped for real."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import free_port
from deltawheel.statestore.exceptions import ZooKeeperServerError
from deltawheel.statestore.process import find_java

from deltawheel.servers.zookeeper import EmbeddedZooKeeper, four_letter_word

pytestmark = pytest.mark.timeout(120)


def _gone(pid: int) -> bool:
    """No running process with this pid (a zombie awaiting its parent counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _zk_processes(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "ZooKeeperServerMain" in cmd and str(data_dir) in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def test_start_status_stop_leaves_no_process(tmp_path: Path) -> None:
    server = EmbeddedZooKeeper(tmp_path / "zk", port=free_port())
    assert server.status().running is False
    server.start()
    try:
        st = server.status()
        assert st.running and st.pid is not None and st.hosts == server.hosts == f"127.0.0.1:{server.port}"
        deadline = time.monotonic() + 60  # a loaded machine answers late: wait for the reply, not a duration
        while (reply := four_letter_word("127.0.0.1", server.port, "srvr", timeout_s=5.0)) is None \
                and time.monotonic() < deadline:
            time.sleep(0.5)
        assert reply is not None and reply.startswith("Zookeeper version: 3.9")
        assert "minSessionTimeout=1000" in (tmp_path / "zk" / "zoo.cfg").read_text()

        server.start()  # already running: no-op, same process
        assert server.status().pid == st.pid
        assert EmbeddedZooKeeper(tmp_path / "zk", port=server.port).status().pid == st.pid  # other handle
    finally:
        assert server.stop() is True
    with pytest.raises(ProcessLookupError):
        os.kill(st.pid, 0)
    assert not (tmp_path / "zk" / "zookeeper.pid").exists()
    assert server.status().running is False
    assert server.stop() is False
    assert _zk_processes(tmp_path / "zk") == []


def test_stale_pid_file_is_cleaned(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "zk").mkdir()
    (tmp_path / "zk" / "zookeeper.pid").write_text(f"{dead.pid}\n")
    server = EmbeddedZooKeeper(tmp_path / "zk", port=free_port())
    assert server.status().pid is None
    server.start()
    try:
        assert server.status().running and server.status().pid != dead.pid
    finally:
        assert server.stop()


def test_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ZooKeeperServerError, match=f"port {port} .* in use by another process"):
            EmbeddedZooKeeper(tmp_path / "zk", port=port).start()


def test_not_ready_in_time_kills_the_server(tmp_path: Path) -> None:
    server = EmbeddedZooKeeper(tmp_path / "zk", port=free_port())
    with pytest.raises(ZooKeeperServerError, match="did not become ready .*no answer within 0.05s.* Log tail"):
        server.start(timeout_s=0.05)
    assert _zk_processes(tmp_path / "zk") == []
    assert not server.pid_file.exists()


def test_missing_java_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    found = find_java()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))  # a JAVA_HOME without java: not the one on PATH, as Spark
    with pytest.raises(ZooKeeperServerError, match=f"JAVA_HOME is {tmp_path}, but"):
        find_java()
    monkeypatch.delenv("JAVA_HOME")
    assert find_java() == shutil.which("java") and os.access(found, os.X_OK)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ZooKeeperServerError, match="java not found"):
        find_java()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deltawheel.cli", *args],
                          capture_output=True, text=True, timeout=90)


def test_cli_start_status_stop(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "zkdata", str(free_port())
    started = _cli("zk", "start", "--data-dir", str(data_dir), "--port", port)
    assert started.returncode == 0, started.stderr
    assert f"--zk 127.0.0.1:{port}" in started.stdout
    pid = int((data_dir / "zookeeper.pid").read_text())
    try:
        assert not _gone(pid)  # the server outlived the CLI process that started it
        again = _cli("zk", "start", "--data-dir", str(data_dir), "--port", port)
        assert again.returncode == 0 and int((data_dir / "zookeeper.pid").read_text()) == pid
        status = _cli("zk", "status", "--data-dir", str(data_dir), "--port", port)
        assert status.returncode == 0 and f"running: pid {pid}, port {port}" in status.stdout
    finally:
        stopped = _cli("zk", "stop", "--data-dir", str(data_dir), "--port", port)
    assert stopped.returncode == 0 and f"stopped ZooKeeper (pid {pid})" in stopped.stdout
    assert _gone(pid)
    assert _zk_processes(data_dir) == []
    status = _cli("zk", "status", "--data-dir", str(data_dir), "--port", port)
    assert status.returncode == 1 and "not running" in status.stdout
    assert "no ZooKeeper running" in _cli("zk", "stop", "--data-dir", str(data_dir), "--port", port).stdout


def test_cli_store_uses_its_zk_folder(tmp_path: Path) -> None:
    status = _cli("zk", "status", "--store", str(tmp_path / "store"), "--port", str(free_port()))
    assert status.returncode == 1
    assert str(tmp_path / "store" / "_zk") in status.stdout


def test_the_server_runs_from_zookeepers_own_jars_and_serves_a_client(tmp_path: Path) -> None:
    # the whole pyspark jars folder on the classpath cost the server ~20 MiB of heap (each opened
    # jar's central directory); it runs from ZooKeeper's own jars and its logging's
    from kazoo.client import KazooClient

    server = EmbeddedZooKeeper(tmp_path / "zk", port=free_port())
    server.start()
    try:
        st = server.status()
        assert st.pid is not None
        cmd = psutil.Process(st.pid).cmdline()
        cp = cmd[cmd.index("-cp") + 1].split(":")
        names = sorted(os.path.basename(j) for j in cp)
        assert not any(j.endswith("*") for j in cp) and len(names) < 20
        assert any(n.startswith("zookeeper-jute-") for n in names) and not any(n.startswith("spark-") for n in names)
        client = KazooClient(hosts=server.hosts)
        client.start(timeout=20)
        try:
            client.create("/w/a", b"one", makepath=True)
            client.set("/w/a", b"two")
            assert client.get("/w/a")[0] == b"two" and client.get_children("/w") == ["a"]
        finally:
            client.stop()
            client.close()
        # (a readiness probe that gave up on a slow reply under load makes the server log that it
        # could not close the probe's command socket: benign, and the only ERROR allowed)
        errors = [ln for ln in (tmp_path / "zk" / "zookeeper.log").read_text().splitlines()
                  if "ERROR" in ln and "Error closing a command socket" not in ln]
        assert errors == []
    finally:
        server.stop()


def test_a_jars_folder_laid_out_otherwise_goes_on_the_classpath_whole(tmp_path: Path) -> None:
    from deltawheel.servers.zookeeper import pyspark_jars_dir, server_classpath

    (tmp_path / "zookeeper-all-3.9.jar").write_bytes(b"")
    (tmp_path / "log4j-core-2.jar").write_bytes(b"")
    assert server_classpath(tmp_path) == f"{tmp_path}/*"
    picked = server_classpath(pyspark_jars_dir()).split(":")
    assert all(os.path.exists(j) for j in picked) and len(picked) < 20


def test_a_kafka_broker_or_spark_cluster_without_java_says_so_with_its_own_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each server reports a missing ``java`` as its own failure (exit 8, not ZooKeeper's 4)."""
    from deltawheel.statestore.exceptions import ClusterError, KafkaServerError

    from deltawheel.servers.cluster import SparkStandalone
    from deltawheel.servers.kafka import KafkaBroker

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(KafkaServerError, match="java not found"):
        KafkaBroker(tmp_path / "kafka", port=free_port()).start()
    with pytest.raises(ClusterError, match="java not found"):
        SparkStandalone(tmp_path / "spark").start()


def test_the_clients_select_answers_as_select_does() -> None:
    """``poll_select`` (the select of every client ``connect`` makes) against ``select.select`` on a socket
    pair through its states: idle, written to, drained, its peer closed; and the timeout it waits."""
    import select as select_module

    from deltawheel.statestore.zk.client import poll_select

    a, b = socket.socketpair()
    try:
        def both(r: list[object], w: list[object], timeout: float) -> tuple[object, object]:
            return poll_select(r, w, [], timeout), select_module.select(r, w, [], timeout)

        got, want = both([b], [b], 0)
        assert got == want == ([], [b], [])  # writable, nothing to read
        a.sendall(b"x")
        got, want = both([b, a], [b], 0.5)
        assert got == want == ([b], [b], [])
        assert b.recv(1) == b"x"
        t0 = time.monotonic()
        got, want = both([b], [], 0.2)
        assert got == want == ([], [], []) and time.monotonic() - t0 >= 0.35  # both waited their 0.2 s
        a.close()
        got, want = both([b], [], 1.0)
        assert got == want == ([b], [], [])  # the hang-up is ready: the read says so
        assert b.recv(1) == b""
        with pytest.raises(ValueError):
            poll_select([b], [], [], -1)
    finally:
        b.close()
