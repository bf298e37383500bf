"""``bench commits``: its counts agree with the Delta log it wrote (never its speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltawheel.benchmarks.commits import failed_checks, measure_point

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def _check(point: dict[str, object], n: int) -> None:
    assert point["writers"] == n
    assert point["failed_batches"] == 0, point["failed"]
    assert point["writer_errors"] == []
    assert point["commits"] > 0
    # every commit a writer counted is one version of the rows table carrying its commit id, and
    # nothing else was committed meanwhile but the writers' (their claims come before the start)
    assert point["log_versions_of_counted_commits"] == point["commits"]
    assert point["keys_missing"] == 0
    assert point["zk_writes"] > 0
    json.dumps(point)


@pytest.mark.parametrize("shape", ["computations", "instances"])
def test_two_writers_on_a_folder(spark, zk_server, migrated_store, shape: str) -> None:  # type: ignore[no-untyped-def]
    point = measure_point(spark, zk_hosts=zk_server.hosts, store_uri=migrated_store.root, shape=shape, n=2,
                          seconds=3.0, warmup=0.5)
    _check(point, 2)
    # a version may hold several instances' batches (group commit): every version holding one is
    # a version written after the start
    assert 0 < point["versions_holding_counted_commits"] <= point["log_versions_after_start"]
    assert point["versions_holding_counted_commits"] <= point["commits"]
    assert point["commits_without_turn"] == 0  # the instances take turns, and every turn came


def test_a_point_without_a_commit_fails_the_run() -> None:
    good = {"target": "local", "latency_ms": 0, "shape": "instances", "writers": 2, "failed": {},
            "failed_batches": 0, "keys_missing": 0, "writer_errors": [], "commits": 7,
            "log_versions_of_counted_commits": 7}
    idle = {**good, "writers": 4, "commits": 0, "log_versions_of_counted_commits": 0}
    assert failed_checks([good]) == []
    assert failed_checks([good, idle]) == ["local 0 ms instances N=4: failed {}, keys missing 0, counted 0 vs log 0, "
                                           "no commit"]


@pytest.mark.slow
@pytest.mark.objectstore
def test_s3a_behind_toxiproxy(tmp_path: Path) -> None:
    """The s3a path end to end: S3Proxy behind Toxiproxy (built from its Go module) at 20 ms, the
    ZooKeeper log store, two writers; the command's own servers and session, stopped after it."""
    import subprocess
    import sys

    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, "-m", "deltawheel.cli", "bench", "commits", "--out", str(out),
                           "--targets", "s3a", "--latencies", "20", "--writers", "2", "--seconds", "4",
                           "--warmup", "1"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((out / "commits.json").read_text())
    assert (out / "commits.png").exists()
    assert {p["shape"] for p in result["points"]} == {"computations", "instances"}
    for p in result["points"]:
        assert p["target"] == "s3a" and p["latency_ms"] == 20
        _check(p, 2)
