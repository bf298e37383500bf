"""docs/deploy.md's command lines, run as written on the hosts test bed: the example job submitted
from the client host in client deploy mode, then in cluster deploy mode with ``--supervise`` (its
driver's host killed: the master starts it again on the other worker). Prints the time from
submit to the first committed batch per mode."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from deltawheel.servers.netns import leftovers

REPO = Path(__file__).resolve().parents[1]
HOSTS = REPO / "data" / "hosts"
FIRST = re.compile(r"first batch committed at (\d+\.\d+)")


def blocks() -> dict[str, str]:
    """The ``sh`` blocks of docs/deploy.md that follow a ``<!-- deploy-test: NAME -->`` line."""
    text = (REPO / "docs" / "deploy.md").read_text()
    return dict(re.findall(r"<!-- deploy-test: (\w+) -->\n```sh\n(.*?)```", text, re.S))


def run_block(script: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("SPARK_CONF_DIR", None)
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


def drivers() -> list[tuple[str, dict[str, object]]]:
    """(worker host, the master's entry) of each active driver."""
    with urllib.request.urlopen("http://10.61.0.20:8080/json/", timeout=5) as resp:
        state = json.loads(resp.read())
    return [(str(d["worker"]).split("-")[2], d) for d in state.get("activedrivers", [])]


def _driver_files(driver_id: str, name: str) -> list[Path]:
    """A cluster-mode driver's output files in its worker's work folder (Spark's ``work``)."""
    return [p for w in HOSTS.glob("worker*") for p in (w / "work" / driver_id).glob(name)]


def wait_first_batch(driver_id: str, *, timeout_s: float) -> float:
    """The epoch time the driver ``driver_id`` printed as its first committed batch."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for out in _driver_files(driver_id, "stdout"):
            m = FIRST.search(out.read_text(errors="replace"))
            if m:
                return float(m.group(1))
        time.sleep(1.0)
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in _driver_files(driver_id, "std*"))
    raise AssertionError(f"{driver_id}: no first batch within {timeout_s}s\n{logs}")


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_deploy_md_client_then_cluster_mode(hosts_available: None) -> None:
    from deltawheel.servers.hosts import HostsCluster

    b = blocks()
    assert set(b) == {"setup", "client", "cluster", "down"}
    figures: dict[str, float] = {}
    try:
        setup = run_block(b["setup"], timeout=1800)
        assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]

        t0 = time.time()
        client = run_block(b["client"], timeout=1200)
        assert client.returncode == 0, client.stdout[-3000:] + client.stderr[-5000:]
        m = FIRST.search(client.stdout)
        assert m, client.stdout[-3000:]
        figures["client: submit to first batch"] = float(m.group(1)) - t0
        assert re.search(r"records in: \{'user_minutes': [1-9]\d*", client.stdout), client.stdout[-2000:]

        t0 = time.time()
        cluster = run_block(b["cluster"], timeout=600)
        assert cluster.returncode == 0, cluster.stdout[-3000:] + cluster.stderr[-5000:]
        ((worker, entry),) = drivers()
        assert worker in ("10.61.0.21", "10.61.0.22") and entry["mainclass"] == "org.apache.spark.deploy.PythonRunner"
        first = str(entry["id"])
        figures["cluster: submit to first batch"] = wait_first_batch(first, timeout_s=900) - t0

        # the driver's host dies whole: --supervise starts the driver again on the other worker
        bed = HostsCluster(HOSTS)
        lost = "worker1" if worker == "10.61.0.21" else "worker2"
        killed_at = time.time()
        assert bed.kill_host(lost)
        deadline = time.time() + 300
        while not any(w != worker and d.get("state") == "RUNNING" for w, d in drivers()):
            assert time.time() < deadline, drivers()
            time.sleep(1.0)
        ((_, again),) = [(w, d) for w, d in drivers() if w != worker]
        assert again["id"] != first and again["mainclass"] == entry["mainclass"]  # relaunched under a new id
        more = bed.on_client([sys.executable, "examples/clicks_job.py", "make-input", "--input",
                              "s3a://deltawheel/clicks-input", "--first", "4"], cwd=REPO, capture_output=True,
                             env={**os.environ, **_s3_env()}, timeout=300)
        assert more.returncode == 0, more.stderr
        figures["cluster: host killed to first batch of the relaunched driver"] = (
            wait_first_batch(str(again["id"]), timeout_s=900) - killed_at)
    finally:
        down = run_block(b["down"], timeout=300)
        print("\n".join(f"{k}: {v:.1f} s" for k, v in figures.items()))
    assert down.returncode == 0, down.stdout + down.stderr
    assert leftovers() == []


def _s3_env() -> dict[str, str]:
    done = subprocess.run([sys.executable, "-m", "deltawheel.cli", "cluster", "env"], cwd=REPO,
                          capture_output=True, text=True, check=True)
    return dict(re.findall(r"export (\w+)=(\S+)", done.stdout))
