"""A local Spark standalone cluster and ZooKeeper ensemble (``deltawheel cluster``): the command
line as a user runs it, the demo pipeline on it, and the demo surviving a lost worker and a lost
ZooKeeper server with exactly the rows of a local run."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import test_pipeline
from cluster_util import cli, processes_of
from test_pipeline import EVENTS, demo_cmd, outputs

demo_reference = test_pipeline.reference  # the fixture: the demo's rows of a local run (module-scoped)

pytestmark = [pytest.mark.zk]


@pytest.mark.timeout(400)
@pytest.mark.slow  # a standalone cluster up and down: a minute; the hosts test bed's up/down: test_hosts.py
def test_cli_up_status_down_leaves_no_process(tmp_path: Path) -> None:
    data = tmp_path / "cl"
    try:
        up = cli("cluster", "up", "--data", str(data))
        assert up.returncode == 0, up.stdout + up.stderr
        master = re.search(r"Spark master: (spark://127\.0\.0\.1:\d+)", up.stdout)
        zk = re.search(r"ZooKeeper: +(\S+)", up.stdout)
        assert master and zk, up.stdout
        assert len(zk.group(1).split(",")) == 3
        status = cli("cluster", "status", "--data", str(data))
        assert status.returncode == 0, status.stdout + status.stderr
        lines = status.stdout.splitlines()
        assert f"ZooKeeper {zk.group(1)}: quorum yes, leader zk" in status.stdout
        assert sorted(m for ln in lines for m in re.findall(r"alive  (leader|follower)", ln)) == [
            "follower", "follower", "leader"]
        assert sum("registered 1 core" in ln for ln in lines if ln.strip().startswith("worker-")) == 2
        assert f"Spark {master.group(1)}" in status.stdout and "master ALIVE" in status.stdout
        assert lines[-1] == "healthy"
        # the master's JSON agrees: two workers alive
        ui = re.search(r"web UI (http://\S+)\)", status.stdout)
        assert ui is not None
        with urllib.request.urlopen(f"{ui.group(1)}/json/", timeout=5) as resp:
            state = json.loads(resp.read())
        assert state["status"] == "ALIVE" and state["aliveworkers"] == 2
        pids = [int(p) for p in re.findall(r"pid (\d+)", status.stdout)]
        assert len(pids) == 6 and all(not _gone(p) for p in pids)
    finally:
        down = cli("cluster", "down", "--data", str(data))
    assert down.returncode == 0 and "stopped 6 processes" in down.stdout, down.stdout + down.stderr
    assert all(_gone(p) for p in pids)
    assert processes_of(data) == []
    again = cli("cluster", "down", "--data", str(data))
    assert again.returncode == 0 and "no process of the cluster" in again.stdout
    status = cli("cluster", "status", "--data", str(data))
    assert status.returncode == 1 and "NOT healthy" in status.stdout and "not running" in status.stdout


def _gone(pid: int) -> bool:
    """No running process with this pid (an orphaned zombie awaiting init counts as gone)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _apps(cluster) -> list[dict]:  # type: ignore[no-untyped-def, type-arg]
    return list((cluster.spark.master_json() or {}).get("completedapps", []))


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(1500)
def test_demo_on_the_cluster_gives_the_rows_of_a_local_run(spark, local_cluster, tmp_path, demo_reference) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "on-cluster"
    before = len(_apps(local_cluster))
    started = time.monotonic()
    proc = subprocess.run(demo_cmd(store, local_cluster.zk_hosts, "/on-cluster", "--master", local_cluster.master_url),
                          capture_output=True, text=True, timeout=1400)
    print(f"demo on the cluster: {time.monotonic() - started:.1f}s")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert outputs(spark, store) == demo_reference
    apps = _apps(local_cluster)  # it ran on the standalone cluster, on both workers' cores
    assert len(apps) == before + 1 and apps[-1]["cores"] == 2 and apps[-1]["state"] == "FINISHED", apps


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.objectstore
@pytest.mark.timeout(1800)
def test_losing_a_worker_and_a_zookeeper_server_mid_run_keeps_the_rows(spark, local_cluster, object_store, s3_bucket,
                                                                       tmp_path, demo_reference) -> None:  # type: ignore[no-untyped-def]
    """The issue's end-to-end test: the demo on the cluster with its tables on the object store
    (s3a://, commits arbitrated by the ensemble); SIGKILL one Spark worker (with its executor) and
    the ZooKeeper leader while it runs; it still ends with exactly the rows of a clean local run."""
    from conftest import object_store_env

    store = f"s3a://{s3_bucket}/{uuid.uuid4().hex}"
    # the demo's driver and the cluster's executors reach the server through the global S3A
    # settings build_spark derives from these variables; the log store uses the ensemble (--zk)
    env = object_store_env(object_store)
    cmd = demo_cmd(store, local_cluster.zk_hosts, "/killed", "--master", local_cluster.master_url,
                   "--input", str(tmp_path / "input"), "--verbose")  # Spark's log: the lost executor
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=env)
    assert proc.stdout is not None
    log: list[str] = []
    killed: dict[str, object] = {}
    try:
        for line in proc.stdout:
            log.append(line)
            if not killed and "window_counter batch 0:" in line:  # mid-run: batches 1.. still to come
                leader = local_cluster.ensemble.leader()
                killed = {"worker": local_cluster.spark.kill_worker(1), "zk": leader,
                          "zk_pid": local_cluster.ensemble.kill(leader), "at": time.monotonic() - started}
        proc.wait(timeout=1500)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    out = "".join(log)
    (tmp_path / "demo.log").write_text(out)
    print("".join(ln for ln in log if "lost" in ln.lower())[-2000:])
    print(f"demo with a worker and ZooKeeper server {killed.get('zk')} killed at {killed.get('at', 0):.1f}s: "
          f"finished in {time.monotonic() - started:.1f}s, exit {proc.returncode}")
    assert killed and killed["worker"] is not None and killed["zk_pid"] is not None, out[-3000:]
    assert proc.returncode == 0, out[-5000:]
    assert outputs(spark, store) == demo_reference
    assert f"records read by window_counter : {EVENTS}" in out
    assert "Lost executor" in out  # the job saw the worker go (Spark logs it at ERROR)
    st = local_cluster.status()  # the kills happened: one worker and one server down, a quorum left
    assert [w.pid is None for w in st.spark.workers] == [True, False]
    assert st.zookeeper.quorum and sum(s.running for s in st.zookeeper.servers) == 2
    # leave the shared cluster whole for the next test
    local_cluster.ensemble.restart(killed["zk"])
    local_cluster.spark.restart_worker(1)
    assert local_cluster.wait_healthy(timeout_s=60)


def test_cluster_errors_say_what_to_do(tmp_path: Path) -> None:
    from deltawheel.executor.exceptions import ClusterError

    from deltawheel.servers.cluster import LocalCluster, SparkStandalone

    with pytest.raises(ClusterError, match="nothing to start: both --no-zk and --no-spark"):
        LocalCluster(tmp_path / "none", zookeeper=False, spark=False).up()
    spark = SparkStandalone(tmp_path / "spark", workers=1)
    with pytest.raises(ClusterError, match="Spark worker 1 is not running; start it first"):
        spark.await_worker(1)
    with pytest.raises(ClusterError, match=r"Spark master did not come up: no answer within 0.05s; see .*master.log"):
        spark.start(timeout_s=0.05)
    assert spark.status().master_pid is None and processes_of(tmp_path / "spark") == []


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(1500)
def test_a_worker_lost_while_its_task_runs_user_code_keeps_the_rows_exactly_once(
        spark, zk_config, local_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A batch on the cluster whose task for one key blocks in user code: SIGKILL that task's worker
    (the Worker JVM with its executor JVM and Python workers: its process group) while the task
    runs; Spark runs the task again on the other worker and the batch commits exactly the rows of
    a clean run (no production twice, no record lost)."""
    import lost_worker_job
    from deltawheel.statestore.layout import StoreLayout
    from executor_util import state_of, stream_rows

    clean_markers = tmp_path / "clean-markers"
    clean_markers.mkdir()
    (clean_markers / "go").touch()  # never blocks
    clean_store = str(tmp_path / "clean")
    lost_worker_job.run_batch(spark, clean_store, zk_config.hosts, zk_config.chroot, str(clean_markers))

    markers = tmp_path / "markers"
    markers.mkdir()
    store = str(tmp_path / "killed")
    cmd = [sys.executable, lost_worker_job.__file__, "--master", local_cluster.master_url, "--store", store,
           "--zk", local_cluster.zk_hosts, "--chroot", f"/lost-{uuid.uuid4().hex[:8]}", "--markers", str(markers)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    killed: dict[str, Any] = {}
    first = out = None
    try:
        deadline = time.monotonic() + 600
        while not list(markers.glob("running-*")):
            assert proc.poll() is None and time.monotonic() < deadline, "the blocking task never started"
            time.sleep(0.2)
        first = int(next(markers.glob("running-*")).name.split("-", 1)[1])
        # the task's Python worker <- pyspark's daemon (its own process group) <- the executor JVM <-
        # the Worker JVM (the executor is in the worker's process group, which kill_worker kills)
        groups = {w.pid(): i for i, w in enumerate(local_cluster.spark.worker_procs, start=1)}
        parents = psutil.Process(first).parents()
        index = next(groups[os.getpgid(p.pid)] for p in parents if os.getpgid(p.pid) in groups)
        python_group = os.getpgid(first)
        chain = [f"{p.name()}:{p.pid}" for p in parents[:4]]
        killed = {"worker": index, "chain": chain}
        killed.update(worker_pid=local_cluster.spark.kill_worker(index), at=time.monotonic() - started)
        if python_group not in groups:  # the daemon and its workers: killed with the machine too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(python_group, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while psutil.pid_exists(first) and not _gone(first):  # the task died with its worker
            assert time.monotonic() < deadline, f"the task's process {first} survived its worker"
            time.sleep(0.1)
        (markers / "go").touch()  # the task's next attempt runs through
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        if killed and out is None:  # failed before the end: leave the shared cluster whole anyway
            local_cluster.spark.restart_worker(killed["worker"])
    (tmp_path / "job.log").write_text(out or "")
    attempts = sorted(int(f.name.split("-", 1)[1]) for f in markers.glob("running-*"))
    print(f"lost worker {killed.get('worker')} (pid {killed.get('worker_pid')}, task in pid {first} under "
          f"{killed.get('chain')}) at {killed.get('at', 0):.1f}s; the task ran in pids {attempts}; job finished in "
          f"{time.monotonic() - started:.1f}s, exit {proc.returncode}")
    print("".join(ln + "\n" for ln in (out or "").splitlines() if "lost" in ln.lower() or "blocking batch" in ln)[-2000:])
    try:
        assert proc.returncode == 0 and "lost-worker job: done" in out, (out or "")[-5000:]
        assert first in attempts and len(attempts) >= 2  # it ran again, in another process
        assert "Lost executor" in out  # the driver saw the executor go (Spark logs it at ERROR)
        assert stream_rows(spark, StoreLayout(store), "counts") == stream_rows(spark, StoreLayout(clean_store), "counts")
        assert state_of(spark, StoreLayout(store), "blocking") == state_of(spark, StoreLayout(clean_store), "blocking")
        assert len(stream_rows(spark, StoreLayout(store), "counts")) > 0
    finally:  # leave the shared cluster whole for the next test
        local_cluster.spark.restart_worker(killed.get("worker", 1))
        assert local_cluster.wait_healthy(timeout_s=90)
