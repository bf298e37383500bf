"""A live instance whose ZooKeeper session expires (a long pause, a network cut past the session
timeout) takes a new session in the same process, joins the members again and starts its stages
again: the leases come back with higher sequencers and every row is counted once. Real ZooKeeper
(the session is expired the way ZooKeeper does it: closed from a second client), Spark and Delta."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from continuous_pipeline import click_rows, closing_rows, expected, make, outputs, write_file
from deltawheel.statestore.layout import StoreLayout
from test_continuous import wait_for
from test_continuous_instances import COMPUTATIONS, holders, members
from test_leases import expire_session

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


@pytest.mark.timeout(900)
def test_an_instance_whose_session_expired_goes_on_in_its_process_and_counts_every_row_once(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path: Path, migrated_at) -> None:
    rows = click_rows(120)
    folder, store = tmp_path / "input", tmp_path / "store"
    migrated_at(store)
    write_file(folder, "part-0.parquet", rows[:60])
    lines: list[str] = []
    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks", instance="a", wait_s=30) as engine:
        engine.progress = lines.append
        run = engine.start_pipeline(make(str(folder)), trigger="200 milliseconds")
        wait_for("a read the first file", lambda: run.executors["user_minutes"].records_in_total >= 60, runs=(run,))
        client = engine.wiring.client
        before = {c: dict(ex.owner.sequencers) for c, ex in run.executors.items()}
        session = client.client_id[0]
        expire_session(client, zk_config.hosts)
        write_file(folder, "part-1.parquet", rows[60:])  # read after the expiry
        wait_for("every stage started again in its process",
                 lambda: sum("started again in this driver" in ln for ln in lines) >= len(COMPUTATIONS),
                 runs=(run,), timeout_s=180)
        assert client.client_id[0] != session
        assert any("SessionLostError" in ln for ln in lines), lines[-20:]
        assert members(zk_config, "clicks") == ["a"]
        write_file(folder, "part-2.parquet", closing_rows(rows))
        want_users, want_totals = expected(rows)
        layout = StoreLayout(str(store))
        wait_for("both streams hold every row", lambda: len(outputs(spark, layout)[1]) >= len(want_totals),
                 runs=(run,), timeout_s=300)
        time.sleep(2.0)  # a duplicate would land by now
        assert outputs(spark, layout) == (want_users, want_totals)
        assert holders(zk_config, "clicks") == {c: ["a"] * 4 for c in COMPUTATIONS}
        after = {c: dict(ex.owner.sequencers) for c, ex in run.executors.items()}
        assert all(after[c][iv] > seq for c, seqs in before.items() for iv, seq in seqs.items()), (before, after)
        run.stop()
