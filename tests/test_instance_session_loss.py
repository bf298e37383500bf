"""A named job instance whose ZooKeeper session expires while it is cut off stops with
``LeaseLostError`` (docs/fencing.md, "ZooKeeper sessions").

With an instance name the run shares its intervals (``drivers/sharing.py``) and looks at the
members' target before each batch. A batch that came while the driver was cut off from
ZooKeeper past its session timeout made that look fail with kazoo's raw ``SessionExpiredError``
(or ``ConnectionLoss``) once the connection came back: the query ended and the run stopped with
``BatchFailedError`` instead of the lost lease (the driver cut off from the ensemble on the
hosts test bed, tests/test_hostfaults_job.py, showed it). Here the cut is a closed Toxiproxy
proxy between the driver and its ZooKeeper server.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import free_port
from continuous_pipeline import click_rows, make, write_file
from deltawheel.statestore.exceptions import LeaseLostError
from test_continuous import wait_for

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def ended(run: Any) -> bool:
    """Whether a stage of ``run`` failed or its query ended."""
    return any(s.failed or (s.query is not None and not s.query.isActive) for s in run.stages.values())


# slow (a session timeout, a continuous run and Toxiproxy: minutes on a loaded machine); the
# shorter default test of the same rebalance path is test_continuous_instances.py's
# test_two_instances_of_a_continuous_pipeline_split_its_intervals_and_give_every_row_once
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_named_instance_cut_off_past_its_session_timeout_stops_with_lease_lost(
        spark: Any, zk_server: Any, zk_config: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from kazoo.client import KazooClient

    from deltawheel.servers.toxiproxy import ToxiproxyServer

    tox = ToxiproxyServer(tmp_path / "toxiproxy", port=free_port())
    tox.start()
    try:
        listen = free_port()
        tox.proxy("zk", listen_port=listen, upstream=f"127.0.0.1:{zk_server.port}")
        rows = click_rows(80)
        folder = tmp_path / "input"
        write_file(folder, "part-0.parquet", rows[:40])
        caplog.set_level(logging.WARNING, logger="deltawheel.statestore.zk.leases")
        with deltawheel.connect(spark, store=str(tmp_path / "store"), zk=f"127.0.0.1:{listen}",
                                zk_chroot=zk_config.chroot, pipeline="clicks", instance="a", wait_s=30,
                                zk_session_timeout_s=zk_config.session_timeout_s) as engine:
            # restarts=0: the typed error itself (by default the stages take a new session and start
            # again in this process: tests/test_session_lost_live.py)
            run = engine.start_pipeline(make(str(folder)), trigger="200 milliseconds", restarts=0)
            wait_for("a read the first file", lambda: run.executors["user_minutes"].records_in_total > 0,
                     runs=(run,))
            direct = KazooClient(hosts=zk_server.hosts + zk_config.chroot)
            direct.start(timeout=15)
            try:
                member = "/pipelines/clicks/members/a"
                assert direct.exists(member)
                tox.set_enabled("zk", False)  # the driver is cut off from ZooKeeper
                write_file(folder, "part-1.parquet", rows[40:])  # a batch while it is cut off
                # the server expires the session (its member znode goes) ...
                wait_for("the session to expire", lambda: direct.exists(member) is None, timeout_s=120)
                # ... and the batch waits for ZooKeeper (without the fix it was blocked in the
                # target's look, or had failed on ConnectionLoss: then this wait runs out)
                deadline = time.monotonic() + 120
                while "paused" not in caplog.text and time.monotonic() < deadline and not ended(run):
                    time.sleep(0.5)
            finally:
                direct.stop()
                direct.close()
            tox.set_enabled("zk", True)  # back: ZooKeeper tells the driver its session expired
            # the lease manager or the watermark publisher notices first: either names the expiry
            with pytest.raises(LeaseLostError, match=r"was lost \(ZooKeeper session expired\)|the ZooKeeper "
                                                     r"session expired while it was paused"):
                assert not run.await_termination(timeout_s=180), "the run stopped without an error"
                raise AssertionError("the run went on after its session expired")
            run.stop()
    finally:
        tox.stop()
