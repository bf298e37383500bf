"""The README flow of the store: quickstart, then zk start, sql, inspect, zk stop (subprocesses)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def dw(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return done(started(*args), timeout=timeout)


def started(*args: str) -> subprocess.Popen[str]:
    """``deltawheel ARGS`` started (commands that only read the store run side by side)."""
    return subprocess.Popen([sys.executable, "-m", "deltawheel.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def done(proc: subprocess.Popen[str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.timeout(1800)
def test_quickstart_then_sql_with_embedded_zookeeper(tmp_path: Path, migrated_at: Any) -> None:
    # a migrated copy: the quickstart does not migrate it first (a new store migrated on first use: the
    # README's continuous example in test_continuous.py, test_runner_start.py's new store)
    store, port = tmp_path / "store", free_port()
    migrated_at(store)
    zk = f"127.0.0.1:{port}"
    q = dw("quickstart", "--store", str(store), "--zk", zk)
    assert q.returncode == 0, q.stdout + q.stderr
    assert "pass 1: 25 records, 25 new, 0 duplicates dropped" in q.stdout
    assert "pass 2: 25 records, 0 new, 25 duplicates dropped" in q.stdout  # exactly-once on the replay
    assert "stopped the embedded ZooKeeper" in q.stderr

    start = dw("zk", "start", "--store", str(store), "--port", str(port))
    assert start.returncode == 0, start.stdout + start.stderr
    pid = int((store / "_zk" / "zookeeper.pid").read_text())
    try:
        # two queries in one call (one Spark session): each prints its csv with its header (the
        # default table format of the command is checked in test_cli_sql.py, in process); inspect
        # reads the store meanwhile, in a session of its own
        sql = started("sql", "--store", str(store), "--format", "csv",
                      "SELECT key, state_json, n_timers, n_checkpointed FROM state WHERE computation = 'wordcount' "
                      "ORDER BY key", "SELECT key, value_json FROM word_counts_decoded")
        inspect = started("inspect", "--store", str(store), "--computation", "wordcount", "--key", "once")
        out, one = done(sql), done(inspect)
        assert out.returncode == 0, out.stdout + out.stderr
        state_csv, sep, stream_csv = out.stdout.partition("key,value_json\n")
        assert sep and state_csv.startswith("key,state_json,n_timers,n_checkpointed\n"), out.stdout[:2000]
        rows = {r["key"]: r for r in csv.DictReader(io.StringIO(state_csv))}
        assert json.loads(rows["the"]["state_json"]) == {"count": 5}
        assert json.loads(rows["fox"]["state_json"]) == {"count": 2}
        assert json.loads(rows["dog"]["state_json"]) == {"count": 2}
        # the second pass's commit cleared the first pass's productions from the rows: delivered by then
        assert rows["the"]["n_timers"] == "1" and rows["the"]["n_checkpointed"] == "0"
        delivered = list(csv.DictReader(io.StringIO(sep + stream_csv)))
        produced = {r["key"]: json.loads(r["value_json"]) for r in delivered}
        assert len(delivered) == len(produced) == 18 and produced["the"] == {"word": "the", "count": 5}  # once each
        assert one.returncode == 0 and json.loads(one.stdout)["state"] == {"count": 2}, one.stdout + one.stderr
    finally:
        stop = dw("zk", "stop", "--store", str(store))
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert not _running(pid), "zk stop left the server process behind"


def _running(pid: int) -> bool:
    """Alive and not a zombie (a reaped-later zombie holds no port, no files, no CPU)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
