"""The benchmarks' memory sampler: the whole process tree, per process and role, at its peak.

Real child processes (a Python child holding memory, the embedded ZooKeeper's JVM), sampled as
the throughput benchmark samples an engine run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port
from deltawheel.benchmarks.memory import (
    MemoryPeak,
    MemorySampler,
    ProcessMemory,
    measured_run_ended,
    on_measured_run_end,
    process_role,
    tree_processes,
)
from kazoo.client import KazooClient

from deltawheel.servers.zookeeper import EmbeddedZooKeeper

pytestmark = pytest.mark.timeout(120)

_HOLD = """
import sys, time
end = time.process_time() + float(sys.argv[2])
while time.process_time() < end:  # busy first (sampled while it works), then holding memory
    pass
block = bytearray(int(sys.argv[1]) * 2**20)
for i in range(0, len(block), 4096):  # touch every page: resident, not only reserved
    block[i] = 1
print("ready", flush=True)
time.sleep(60)
"""


def _child(mib: int, *, busy_s: float = 0.0) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(mib), str(busy_s)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_the_peak_names_each_process_of_the_tree_what_started_and_what_sat_idle() -> None:
    before = _child(8)  # left by an earlier run: in the tree, not new
    try:
        with MemorySampler(interval_s=0.05) as mem:
            big = _child(96, busy_s=0.5)
            time.sleep(0.3)
            big.kill()
            big.wait()
            time.sleep(0.2)
    finally:
        before.kill()
        before.wait()
    peak = mem.peak
    by_pid = {p.pid: p for p in peak.at_peak}
    assert big.pid in by_pid and before.pid in by_pid  # the peak is the sample with the big child
    # most of its 96 MiB: the kernel's proactive reclaim (DAMON) may page out some of a block touched once
    assert by_pid[big.pid].role == "other_python" and by_pid[big.pid].pss_bytes > 64 * 2**20
    assert peak.is_new(by_pid[big.pid]) and not peak.is_new(by_pid[before.pid])
    assert peak.cpu_in_run(by_pid[big.pid]) >= 0.3 and peak.cpu_in_run(by_pid[before.pid]) < 0.1
    assert peak.pss_bytes == sum(p.pss_bytes for p in peak.at_peak)
    assert dict(peak.role_peaks_bytes)["other_python"] > 104 * 2**20

    d = json.loads(json.dumps(peak.to_dict()))  # JSON as throughput.json holds it
    row = next(r for r in d["at_peak"] if r["pid"] == big.pid)
    assert row["new"] is True and row["role"] == "other_python" and row["pss_mib"] > 96
    assert d["at_peak_by_role_pss_mib"]["driver_python"] > 0
    assert d["at_peak_new_pss_mib"] > 96 and d["pss_mib"] > d["at_peak_new_pss_mib"]
    idle = next(r for r in d["at_peak"] if r["pid"] == before.pid)
    assert idle["cpu_s_in_run"] < 0.1 and row["cpu_s_in_run"] >= 0.3
    # the idle one, not the busy (each figure rounded to 0.1 MiB on its own)
    assert idle["pss_mib"] <= d["at_peak_idle_pss_mib"] <= d["pss_mib"] - row["pss_mib"] + 0.15
    assert d["loadavg_1m_at_peak"] is not None and d["samples"] >= 3


def test_the_cpu_seconds_are_those_the_tree_used_while_sampled() -> None:
    """A child started while sampling counts its CPU from zero (here all of it falls before its first
    sample); one there before counts only what it used since."""
    before = _child(8, busy_s=0.4)  # its 0.4 CPU-s come before sampling
    try:
        with MemorySampler(interval_s=60.0) as mem:
            time.sleep(0.2)  # the thread's first sample: without the child
            new = _child(8, busy_s=0.6)  # busy and done before it is first sampled
            mem.sample()
            new.kill()
            new.wait()
    finally:
        before.kill()
        before.wait()
    d = json.loads(json.dumps(mem.peak.to_dict()))
    assert 0.55 <= d["cpu_s_by_role"]["other_python"] < 0.85, d["cpu_s_by_role"]
    assert d["cpu_s"] == pytest.approx(sum(d["cpu_s_by_role"].values()), abs=0.05)


def test_what_follows_the_measured_run_is_not_sampled() -> None:
    with MemorySampler(interval_s=0.05) as mem:
        time.sleep(0.2)
        measured_run_ended()  # as an engine says when its wall time ends (then it reads its output)
        samples = mem.peak.samples
        late = _child(96)  # sampled, it would make the peak (the test process alone is far smaller)
        time.sleep(0.3)
    late.kill()
    late.wait()
    assert samples >= 2 and mem.peak.samples == samples  # no sample after the end
    assert late.pid not in {p.pid for p in mem.peak.at_peak}
    measured_run_ended()  # no sampler running: nothing happens


def test_the_worker_daemon_is_idle_only_when_no_python_worker_worked() -> None:
    mib = 2**20

    def peak(worker_cpu_s: float) -> dict[str, float]:
        procs = (ProcessMemory(pid=1, role="driver_jvm", pss_bytes=900 * mib, rss_bytes=900 * mib,
                               uss_bytes=900 * mib, cpu_s=9.0),
                 ProcessMemory(pid=2, role="python_daemon", pss_bytes=50 * mib, rss_bytes=60 * mib,
                               uss_bytes=40 * mib, cpu_s=0.3),
                 ProcessMemory(pid=3, role="python_worker", pss_bytes=200 * mib, rss_bytes=220 * mib,
                               uss_bytes=180 * mib, cpu_s=1.0 + worker_cpu_s))
        p = MemoryPeak(pss_bytes=1150 * mib, rss_bytes=1180 * mib, max_single_rss_bytes=900 * mib,
                       driver_maxrss_bytes=0, samples=3, max_processes=3, at_peak=procs,
                       cpu_first=((1, 1.0), (2, 0.3), (3, 1.0)))
        return p.to_dict()  # type: ignore[no-any-return]

    # an engine that ran Python tasks: its workers and the daemon that forked them are its own
    assert peak(worker_cpu_s=2.0)["at_peak_idle_pss_mib"] == 0
    # an engine after it that ran none (Spark SQL): the workers and the daemon were left to it
    assert peak(worker_cpu_s=0.0)["at_peak_idle_pss_mib"] == 250


def test_roles_of_spark_and_deltawheel_processes() -> None:
    daemon = ["python3", "-m", "deltawheel.executor.tasks.daemon", "pyspark.worker"]
    assert process_role(daemon) == "python_daemon"
    assert process_role(daemon, parent_role="python_daemon") == "python_worker"  # a forked worker
    assert process_role(["java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "pyspark-shell"]) == "driver_jvm"
    assert process_role(["/usr/bin/java", "-jar", "s3proxy"]) == "s3proxy_jvm"
    assert process_role(["java", "-cp", "x", "Other"]) == "other_jvm"
    assert process_role(["anything"], is_root=True) == "driver_python"


def test_the_embedded_zookeeper_serves_from_a_small_heap(tmp_path: Path) -> None:
    """The ZooKeeper JVM a pipeline starts is one process of the benchmark's tree: labelled as such,
    serving, and small (its initial heap is not 1/64 of the machine's memory)."""
    server = EmbeddedZooKeeper(tmp_path / "zk", port=free_port())
    server.start()
    try:
        client = KazooClient(hosts=server.hosts)
        client.start(timeout=20)
        try:
            for i in range(200):
                client.create(f"/m/n{i}", b"v" * 512, makepath=True, ephemeral=i % 2 == 0)
            assert len(client.get_children("/m")) == 200
        finally:
            client.stop()
            client.close()
        time.sleep(0.5)
        ours = [p for p in tree_processes() if p.pid == server.status().pid]  # other tests' servers aside
    finally:
        server.stop()
    assert [p.role for p in ours] == ["zookeeper_jvm"]
    assert 20 * 2**20 < ours[0].pss_bytes < 110 * 2**20, f"ZooKeeper's PSS {ours[0].pss_bytes / 2**20:.0f} MiB"


def test_a_child_process_tree_is_sampled_from_outside() -> None:
    """``root_pid``: the throughput benchmark samples an engine's own process from its parent; the
    child's tree alone (not the sampling process), its peak RSS read from /proc (VmHWM)."""
    child = _child(64)
    try:
        with MemorySampler(interval_s=0.05, root_pid=child.pid) as mem:
            time.sleep(0.3)
    finally:
        child.kill()
        child.wait()
    peak = mem.peak
    assert [p.pid for p in peak.at_peak] == [child.pid] and peak.at_peak[0].role == "driver_python"
    assert peak.pss_bytes > 64 * 2**20 and peak.driver_maxrss_bytes > 64 * 2**20
    assert peak.samples >= 3


def test_the_end_hooks_are_called_once_by_the_next_end() -> None:
    calls: list[str] = []
    on_measured_run_end(lambda: calls.append("ended"))
    measured_run_ended()
    measured_run_ended()
    assert calls == ["ended"]


_NAMED = """
import threading, time
def spin(s):
    end = time.thread_time() + s
    while time.thread_time() < end:
        pass
def named(name, busy_s):
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write(name)  # as the JVM names its threads
    spin(0.4)  # before the first sample: not counted
    done.release()
    ready.wait()
    spin(busy_s)
    time.sleep(60)
ready, done = threading.Event(), threading.Semaphore(0)
for name, busy in (("C2 CompilerThread0", 0.6), ("stream execution thread", 0.0), ("Thread-7", 0.2)):
    threading.Thread(target=named, args=(name, busy), daemon=True).start()
for _ in range(3):
    done.acquire()
print("named", flush=True)
input()
ready.set()
time.sleep(60)
"""


def test_a_processes_cpu_splits_by_what_its_threads_are_named() -> None:
    from deltawheel.benchmarks.threads import ThreadCpu

    proc = subprocess.Popen([sys.executable, "-c", _NAMED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None and proc.stdout.readline().strip() == "named"
        cpu = ThreadCpu()
        cpu.sample(proc.pid)  # each thread's 0.4 s so far is not counted
        proc.stdin.write("\n")
        proc.stdin.flush()
        time.sleep(1.5)
        cpu.sample(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    got = cpu.by_group()
    assert 0.5 <= got["jit_c2"] <= 0.9, got  # the busy thread's 0.6 s since, by the comm name /proc shows
    assert 0.1 <= got["py4j_calls"] <= 0.5, got
    assert got.get("stream_execution", 0.0) < 0.05, got  # named, but idle
    assert list(got)[0] == "jit_c2"  # largest first
