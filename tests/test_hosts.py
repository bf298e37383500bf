"""The hosts test bed (``deltawheel cluster up --hosts``): separate hosts made of network and mount
namespaces, each with its own address and its own view of the file system, and nothing left after
``down``. Skipped, with the reason, where namespaces cannot be made."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from cluster_util import cli
from hosts_util import HOSTS_DATA

from deltawheel.servers.netns import leftovers

REPO = Path(__file__).resolve().parents[1]


def test_without_root_the_error_says_why() -> None:
    if shutil.which("setpriv") is None or subprocess.run(["id", "nobody"], capture_output=True).returncode:
        pytest.skip("needs setpriv and the user nobody to run as non-root")
    code = ("from deltawheel.servers.netns import check_namespaces\n"
            "from deltawheel.executor.exceptions import HostsUnavailableError\n"
            "try:\n    check_namespaces()\nexcept HostsUnavailableError as e:\n    print('refused:', e)\n")
    done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c",
                           code], capture_output=True, text=True, timeout=60, cwd="/")
    if "Permission denied" in done.stderr:
        pytest.skip("the user nobody cannot read this checkout")
    assert re.search(r"refused: the hosts test bed needs root: .*CAP_NET_ADMIN", done.stdout), done.stdout + done.stderr


def _on(host: str, script: str) -> subprocess.CompletedProcess[str]:
    return cli("cluster", "exec", "--data", str(HOSTS_DATA), host, "--", "/bin/sh", "-c", script, timeout=60)


@pytest.mark.timeout(300)
def test_s3_host_up_isolated_and_down_leaves_nothing(hosts_available: None, tmp_path: Path) -> None:
    marker = Path("/tmp") / f"client-only-{tmp_path.name}"
    marker.write_text("the client's /tmp")
    try:
        up = cli("cluster", "up", "--hosts", "--no-zk", "--no-spark", "--data", str(HOSTS_DATA), timeout=240)
        assert up.returncode == 0, up.stdout + up.stderr
        assert re.search(r"s3 +10\.61\.0\.10 +namespace dwh-s3", up.stdout), up.stdout
        assert "S3:           http://10.61.0.10:9000" in up.stdout
        # the s3 host: its own address, no repository, no per-user cache, not the client's /tmp
        seen = _on("s3", f"hostname -I; ls {REPO} 2>&1; ls -A /root; ls /tmp; "
                         f"ls {HOSTS_DATA}; python3 -c 'import deltawheel' 2>&1 | tail -1")
        assert seen.returncode == 0, seen.stdout + seen.stderr
        assert seen.stdout.split()[0] == "10.61.0.10"
        assert marker.name not in seen.stdout and "pyproject.toml" not in seen.stdout
        assert "ModuleNotFoundError: No module named 'deltawheel'" in seen.stdout
        assert "s3" in seen.stdout and "worker1" not in seen.stdout  # its own folder only (and spark)
        # S3Proxy answers the client host over the bridge
        client = _on("client", "python3 -c \"import urllib.request as u, urllib.error as e\n"
                               "try: u.urlopen('http://10.61.0.10:9000/', timeout=5)\n"
                               "except e.HTTPError as x: print('http', x.code)\"")
        assert re.search(r"http (403|400)", client.stdout), client.stdout + client.stderr
        # the client host has the machine's files and its own address
        mine = _on("client", f"hostname -I; cat {marker}")
        assert mine.stdout.split()[0] == "10.61.0.30" and "the client's /tmp" in mine.stdout
    finally:
        marker.unlink()
        down = cli("cluster", "down", "--hosts", "--data", str(HOSTS_DATA))
    assert down.returncode == 0, down.stdout + down.stderr
    assert "namespaces, veths and the bridge deleted" in down.stdout
    assert leftovers() == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_all_hosts_up_status_down(hosts_available: None) -> None:
    try:
        started = time.monotonic()
        up = cli("cluster", "up", "--hosts", "--data", str(HOSTS_DATA), timeout=400)
        up_s = time.monotonic() - started
        assert up.returncode == 0, up.stdout + up.stderr
        assert "Spark master: spark://10.61.0.20:7077" in up.stdout
        assert "ZooKeeper:    10.61.0.11:2181,10.61.0.12:2181,10.61.0.13:2181" in up.stdout
        status = cli("cluster", "status", "--hosts", "--data", str(HOSTS_DATA))
        assert status.returncode == 0 and status.stdout.splitlines()[-1] == "healthy", status.stdout
        assert "workers registered with the master: 2" in status.stdout
        assert sorted(re.findall(r"(leader|follower)", status.stdout)) == ["follower", "follower", "leader"]
        # a worker host runs Spark from the hosts' installation: pyspark, not deltawheel, not the repo
        seen = _on("worker1", "python3 -c 'import pyspark' 2>&1 | tail -1; "
                              f"{HOSTS_DATA}/spark/bin/python -c 'import pyspark; print(pyspark.__version__)'; "
                              f"{HOSTS_DATA}/spark/bin/python -c 'import deltawheel' 2>&1 | tail -1; ls {REPO}")
        assert "No module named 'pyspark'" in seen.stdout and "No module named 'deltawheel'" in seen.stdout
        assert "pyproject.toml" not in seen.stdout
        pids = [int(p) for p in re.findall(r"pid (\d+)", status.stdout)]
        assert len(pids) == 7
    finally:
        started = time.monotonic()
        down = cli("cluster", "down", "--hosts", "--data", str(HOSTS_DATA))
        down_s = time.monotonic() - started
    assert down.returncode == 0, down.stdout + down.stderr
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert leftovers() == [] and alive == [], [psutil.Process(p).as_dict(["status", "cmdline", "ppid"]) for p in alive]
    print(f"hosts test bed: up {up_s:.1f}s, down {down_s:.1f}s")
