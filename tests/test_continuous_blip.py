"""A continuous pipeline riding through a ZooKeeper blip shorter than the session timeout.

Both stages of ``continuous_pipeline`` run live on a ZooKeeper server of the test's own (its real
process stopped and started again on the same data); a file arrives while the server is down.
The run goes on once ZooKeeper is back, on the same session, and ends with exactly the rows a
count made here gives (what an uninterrupted run writes, ``test_continuous.py``), each once; after
a graceful stop ``recover`` finds nothing to deliver and no lease is held.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from conftest import free_port, restart_zk_server
from continuous_pipeline import click_rows, closing_row, expected, make, outputs, write_file
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.zk.client import connect as connect_zk
from deltawheel.statestore.zk.lease_tools import list_leases

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


@pytest.fixture
def own_zk(tmp_path: Path) -> Iterator[Any]:
    """A ZooKeeper server for this test alone (the shared one must not be stopped)."""
    from deltawheel.servers.zookeeper import EmbeddedZooKeeper

    server = EmbeddedZooKeeper(tmp_path / "zk", port=free_port())
    server.start()
    yield server
    server.stop()



def _wait_for(what: str, check: Callable[[], bool], *, timeout_s: float, runs: tuple[Any, ...] = (),
              poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        for run in runs:
            run.check()  # a failed batch or tick is raised at once
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(poll_s)


def _blip_while_running(spark: Any, tmp_path: Path, server: Any, migrated_at: Any, *, down_s: float,
                        session_s: float) -> list[str]:
    from deltawheel.executor.drivers.recover import scan
    from kazoo.client import KazooState

    rows = click_rows(160)
    folder, store = tmp_path / "input", tmp_path / "store"
    migrated_at(store)  # a migrated copy: connect migrating a new store runs in test_connect.py
    write_file(folder, "part-0.parquet", rows[:80])
    layout = StoreLayout(str(store))
    want_users, want_totals = expected(rows)
    lines: list[str] = []
    with deltawheel.connect(spark, store=str(store), zk=server.hosts, zk_chroot="/dw", pipeline="clicks",
                            zk_session_timeout_s=session_s) as engine:
        engine.progress = lines.append
        run = engine.start_pipeline(make(str(folder)), trigger="200 milliseconds")
        stage1 = run.executors["user_minutes"]
        _wait_for("stage 1 read the first file", lambda: stage1.records_in_total >= 80, timeout_s=300, runs=(run,))
        session = engine.client.client_id[0]
        server.stop()  # the blip: every query, tick and delivery sees ZooKeeper gone
        _wait_for("the client to see the disconnect", lambda: engine.client.state != KazooState.CONNECTED,
                  timeout_s=30, poll_s=0.02)
        down = time.time()
        # arrives while ZooKeeper is down, with a record that closes every minute
        write_file(folder, "part-1.parquet", rows[80:] + [closing_row(rows)])
        time.sleep(down_s)
        up = time.time()  # the server serves again during restart_zk_server: a client may reconnect before it returns
        restart_zk_server(server)
        _wait_for("the reconnect", lambda: engine.client.state == KazooState.CONNECTED, timeout_s=30, poll_s=0.05)
        assert engine.client.client_id[0] == session  # the same session: the blip did not end it
        _wait_for("both streams hold every row", lambda: len(outputs(spark, layout)[1]) >= len(want_totals),
                  timeout_s=300, runs=(run,))
        run.check()
        report = run.stop()
        assert report.unfinished == ()
        assert stage1.records_in_total == len(rows) + 1
        committed_down = sorted(p.name for p in Path(layout.computations_root).glob("*/rows/_delta_log/*.json")
                                if down + 0.5 <= p.stat().st_mtime <= up)
        assert committed_down == []  # nothing committed while ZooKeeper was away
    assert outputs(spark, layout) == (want_users, want_totals)
    client = connect_zk(ZkConfig(hosts=server.hosts, chroot="/dw"))
    try:
        pending = scan(spark, layout, client, pipeline="clicks")
        held = [r for r in list_leases(client, pipeline="clicks") if r["owner"] is not None]
    finally:
        client.stop()
        client.close()
    assert pending and all(sum(r.undelivered.values()) == 0 and r.owner is None for r in pending), pending
    assert held == []
    return lines


@pytest.mark.timeout(600)
def test_a_continuous_pipeline_rides_through_a_short_zookeeper_blip(  # type: ignore[no-untyped-def]
        spark, tmp_path, own_zk, migrated_at) -> None:
    lines = _blip_while_running(spark, tmp_path, own_zk, migrated_at, down_s=2.0, session_s=10.0)
    assert any("clicks: stopped 2 queries after their batch in flight" in ln for ln in lines), lines[-20:]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_continuous_pipeline_rides_through_a_12s_blip_under_the_session_timeout(  # type: ignore[no-untyped-def]
        spark, tmp_path, own_zk, migrated_at) -> None:
    """Longer than several triggers and ticks: each of them meets a suspended connection."""
    _blip_while_running(spark, tmp_path, own_zk, migrated_at, down_s=12.0, session_s=30.0)
