"""``deltawheel cluster fault``: a host cut off from one peer reaches the others but not it, a host
cut off whole reaches none; after heal everything is reached again (a server on the ``s3`` host,
no Spark; the faults under a running job are in test_hostfaults_job.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_util import cli

PORT = 9000
PROBE = ("import socket, sys\n"
         "try:\n"
         "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()\n"
         "    print('reached')\n"
         "except TimeoutError:\n"
         "    print('timed out')\n"
         "except OSError as exc:\n"
         "    print(f'error {exc}')\n")


@pytest.fixture
def bed(hosts_available: None, tmp_path: Path) -> Iterator[object]:
    """The bed's network and a TCP server on host ``s3`` (a plain HTTP server: the cut is what is tested)."""
    from deltawheel.servers.hosts import HostsCluster
    from deltawheel.servers.netns import host_prefix, leftovers

    cluster = HostsCluster(tmp_path / "bed", services=())
    try:
        cluster.network.up()
        s3 = cluster.hosts["s3"]
        subprocess.Popen([*host_prefix(s3), sys.executable, "-m", "http.server", str(PORT), "--bind", s3.address],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
        yield cluster
    finally:
        cluster.down()
    assert leftovers() == []


def reach(cluster: object, source: str, target: str = "s3") -> str:
    """What a connection from host ``source`` to the server on ``target`` did."""
    from deltawheel.servers.hosts import HostsCluster
    from deltawheel.servers.netns import host_prefix

    assert isinstance(cluster, HostsCluster)
    done = subprocess.run([*host_prefix(cluster.hosts[source]), sys.executable, "-c", PROBE,
                           cluster.hosts[target].address, str(PORT)], capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or done.stderr.strip()


def fault(cluster: object, *words: str) -> subprocess.CompletedProcess[str]:
    from deltawheel.servers.hosts import HostsCluster

    assert isinstance(cluster, HostsCluster)
    return cli("cluster", "fault", *words[:1], "--data", str(cluster.data_dir), *words[1:])


@pytest.mark.timeout(120)
def test_cut_from_a_peer_and_whole_then_heal(bed: Any) -> None:
    import time

    from deltawheel.servers.hostfaults import HostFaults

    deadline = time.monotonic() + 30  # the server starts
    while reach(bed, "client") != "reached":
        assert time.monotonic() < deadline, reach(bed, "client")
        time.sleep(0.2)
    assert reach(bed, "worker1") == "reached"

    done = fault(bed, "cut", "client", "--from", "s3")
    assert done.returncode == 0, done.stderr
    assert reach(bed, "client") == "timed out"  # silently dropped, not refused
    assert reach(bed, "worker1") == "reached"
    faults = HostFaults(bed)
    assert [str(c) for c in faults.cuts()] == ["s3 cut off from client"]

    done = fault(bed, "heal", "client")
    assert done.returncode == 0, done.stderr
    assert reach(bed, "client") == "reached"
    assert faults.cuts() == []

    faults.cut("s3")  # whole: nobody reaches it
    assert [str(c) for c in faults.cuts()] == ["s3 cut off whole"]
    assert reach(bed, "client") == "timed out" and reach(bed, "worker1") == "timed out"
    faults.heal("s3")
    assert reach(bed, "client") == "reached" and reach(bed, "worker1") == "reached"
    assert faults.cuts() == []


def test_a_fault_on_an_unknown_host_is_refused(bed: Any) -> None:
    done = fault(bed, "cut", "worker9", "--from", "s3")
    assert done.returncode == 8, done.stdout + done.stderr
    assert "no host 'worker9' in the test bed: choose among s3, zk1" in done.stdout + done.stderr
    from deltawheel.executor.exceptions import UnknownHostError

    from deltawheel.servers.hostfaults import HostFaults

    with pytest.raises(UnknownHostError, match="no host 'nowhere'"):
        HostFaults(bed).kill("nowhere")
    with pytest.raises(UnknownHostError, match="cannot be cut off from itself"):
        HostFaults(bed).cut("s3", ["s3"])
