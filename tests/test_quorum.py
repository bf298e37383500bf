"""A batch on a real three-server ZooKeeper ensemble that loses its quorum while the batch
publishes its watermarks (step 7): the batch pauses, commits and publishes nothing meanwhile, and
completes once a majority serves again, with exactly the rows and watermarks of a run without
the outage. ``--max-pause`` / ``PipelineRunner(max_pause_s=...)`` bounds that pause."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import pytest
from deltawheel.executor.protocol.executor import ComputationExecutor
from deltawheel.executor.protocol.faults import FaultPoint
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.leases import LeaseManager
from deltawheel.statestore.zk.watermarks import WatermarkAuthority
from executor_util import BucketCounter, events, state_of, stream_rows
from kazoo.client import KazooState

pytestmark = [pytest.mark.zk, pytest.mark.spark]

B1 = [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "cats", 12_000), ("r2", "dogs", 2_000)]
B2 = [("r4", "cats", 15_000), ("r5", "dogs", 21_000), ("r1", "cats", 1_000)]
SESSION_S = 6.0


def wait_until(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def run_two_batches(spark: Any, layout: Any, client: Any,
                    faults: Callable[[FaultPoint, int], None] | None = None) -> dict[str, Any]:
    """Batches B1 (input watermark 11 s) and B2 (40 s) of the bucket counter, publishing watermarks;
    what they leave: stream rows, state, the published low watermark and oldest work after each."""
    leases = LeaseManager(client, pipeline="test", owner="w")
    comp = BucketCounter()
    owner = IntervalOwner(RowStore(spark, layout, writer="w"), leases, comp.name, num_intervals=comp.num_intervals)
    authority = WatermarkAuthority(client, pipeline="test")
    ex = ComputationExecutor(spark, layout, comp, owner=owner, authority=authority, faults=faults,
                             progress=print, write_path="image")
    out: dict[str, Any] = {}
    try:
        ex.start(wait_s=20)
        for batch_id, items, wm in ((0, B1, 11_000), (1, B2, 40_000)):
            report = ex.run_batch(events(spark, items), batch_id, input_watermark_ms=wm)
            ex.settle()
            out[f"low{batch_id}"] = authority.published_low_watermark(comp.name)  # (the report's may be held)
            out[f"oldest{batch_id}"] = {iv: None if raw is None else raw["oldest_work_ms"]
                                        for iv, raw in authority.oldest_work(comp.name, comp.num_intervals).items()}
            out[f"productions{batch_id}"] = report.productions
        ex.stop()
    finally:
        client.stop()
        client.close()
    out["rows"] = stream_rows(spark, layout, "counts")
    out["state"] = state_of(spark, layout, comp.name)
    return out


@pytest.mark.slow  # a three-server ensemble, two runs and an 8 s outage: about 3 minutes on a busy machine
@pytest.mark.timeout(400)
def test_a_batch_pauses_without_quorum_while_publishing_watermarks_and_completes_after(
        spark, migrated_store, store_layout, tmp_path, ensemble, caplog) -> None:  # type: ignore[no-untyped-def]
    from deltawheel import migrations

    clean_layout = type(store_layout)(str(tmp_path / "clean"))
    migrations.apply(spark, clean_layout, dry_run=False)
    clean = run_two_batches(spark, clean_layout, connect(ZkConfig(hosts=ensemble.hosts, chroot="/clean",
                                                                  session_timeout_s=SESSION_S)))
    assert clean["productions0"] and clean["rows"]  # the comparison below compares something

    caplog.set_level(logging.WARNING, logger="deltawheel.statestore.zk.watermarks")
    outage: dict[str, float] = {}
    client = connect(ZkConfig(hosts=ensemble.hosts, chroot="/ens", session_timeout_s=SESSION_S))

    def lose_quorum(point: FaultPoint, batch_id: int) -> None:
        """Batch 0 committed and delivered: two of the three servers die right before step 7, the
        third stops serving, the client is cut off; a majority comes back after 8 s (longer than
        the session timeout) while step 7 waits."""
        if point is not FaultPoint.BEFORE_WATERMARK or batch_id != 0:
            return
        leader = ensemble.leader()
        assert leader is not None
        follower = next(p.myid for p in ensemble.peers if p.myid != leader)
        survivor = next(s for p, s in zip(ensemble.peers, ensemble.servers, strict=True)
                        if p.myid not in (leader, follower))
        ensemble.kill(leader)
        ensemble.kill(follower)
        wait_until(lambda: survivor.mode() is None)
        wait_until(lambda: client.state != KazooState.CONNECTED)
        outage["start"] = time.monotonic()

        def back() -> None:
            ensemble.restart(leader)
            outage["end"] = time.monotonic()

        threading.Timer(SESSION_S + 2.0, back).start()

    faulted = run_two_batches(spark, migrated_store, client, faults=lose_quorum)
    assert outage.get("end", 0.0) - outage.get("start", 0.0) > SESSION_S  # the outage did happen, and lasted
    assert caplog.text.count("paused: the ZooKeeper connection is suspended") == 1, caplog.text
    assert "resumes: ZooKeeper serves again after a pause of" in caplog.text
    for key in ("low0", "oldest0", "productions0", "low1", "oldest1", "productions1", "rows", "state"):
        assert faulted[key] == clean[key], key


@pytest.mark.timeout(300)
def test_max_pause_stops_a_pipeline_run_whose_zookeeper_does_not_serve(spark, zk_server, zk_config,  # type: ignore[no-untyped-def]
                                                                       tmp_path, migrated_at) -> None:
    """PipelineRunner(max_pause_s=...) reaches the batch: ZooKeeper cut off right before step 7 of the
    first batch, the run stops with LeaseSuspendedError after that pause (not after the session
    timeout, not never)."""
    from dataclasses import replace

    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector
    from deltawheel.statestore.exceptions import LeaseSuspendedError
    from executor_util import ByRecordKey
    from test_coordinator import _input
    from test_leases import CutProxy

    proxy = CutProxy(zk_server.port)
    cut: list[int] = []

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point is FaultPoint.BEFORE_WATERMARK and not cut:
            cut.append(batch_id)
            proxy.cut()

    inj = ParquetInjector("events", str(_input(tmp_path / "in")), key_column="key", event_time_column="event_time",
                          value_columns=[], record_id_column="record_id", watermark_delay_ms=2_000, max_files_per_trigger=1)
    layout = migrated_at(tmp_path / "store")  # a migrated copy: connect migrating a new store runs in test_connect.py
    runner = PipelineRunner(spark, layout, Pipeline("paused", (inj,), (ByRecordKey(),)),
                            zk=replace(zk_config, hosts=f"127.0.0.1:{proxy.port}"), faults=faults, wait_s=20,
                            max_pause_s=1.5)
    try:
        with pytest.raises(LeaseSuspendedError, match=r"paused for [12] s and ZooKeeper still does not serve.*: no "
                           r"server answers \(unreachable, or down\) or the ensemble lost its quorum; nothing was "
                           r"written"):
            runner.run()
    finally:
        proxy.restore()
    assert cut == [0]


def test_demo_takes_max_pause_in_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    from deltawheel.statestore.zk.refusal import DEFAULT_MAX_PAUSE_S

    from deltawheel.cli import build_parser

    assert build_parser().parse_args(["demo", "--max-pause", "2.5"]).max_pause == 2.5
    assert build_parser().parse_args(["demo"]).max_pause == DEFAULT_MAX_PAUSE_S == 300.0  # the documented default
    assert build_parser().parse_args(["demo", "--max-pause", "inf"]).max_pause == float("inf")  # no bound
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--max-pause", "-1"])
    assert "expected seconds (a number >= 0), got '-1'" in capsys.readouterr().err
