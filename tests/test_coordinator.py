"""ZooKeeper trouble in the middle of a pipeline run, with a ZooKeeper server of the test's own
(stopped, wiped and restarted through its real process):

* data loss (restarted on an empty data folder): the next start refuses with
  CoordinatorStateLostError; after ``deltawheel reseed --apply`` the run ends with the rows of
  a run that never lost anything;
* a blip shorter than the session timeout: commits pause and the run ends normally with the
  rows of an uninterrupted run;
* a session expiry: the run stops with LeaseLostError naming the expired session.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from conftest import copy_migrated_store, free_port, restart_zk_server
from deltawheel.executor.protocol.faults import FaultPoint
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import CoordinatorStateLostError, LeaseLostError
from deltawheel.statestore.layout import StoreLayout
from executor_util import ByRecordKey, state_of, stream_rows

pytestmark = [pytest.mark.spark, pytest.mark.zk]

PIPELINE = "zkloss"
FILES = 4


class _Crash(Exception):
    """The process 'dies' here."""


@pytest.fixture
def own_zk(tmp_path: Path) -> Iterator[Any]:
    """A ZooKeeper server for this test alone (the shared one must not be stopped or wiped)."""
    from deltawheel.servers.zookeeper import EmbeddedZooKeeper

    server = EmbeddedZooKeeper(tmp_path / "zk", port=free_port())
    server.start()
    yield server
    server.stop()


def _input(folder: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    for n in range(FILES):  # one file = one micro-batch; event times advance file by file
        ids = range(n * 40, n * 40 + 40)
        pq.write_table(pa.table({"record_id": [f"r{i}" for i in ids], "key": [f"k{i % 6}" for i in ids],
                                 "event_time": pa.array([500 * i for i in ids], pa.timestamp("ms", "UTC"))}),
                       folder / f"part-{n}.parquet")
        time.sleep(0.01)  # distinct mtimes: the files are read in this order
    return folder


def _run(spark: Any, folder: Path, layout: StoreLayout, zk: ZkConfig, *,
         faults: Callable[[FaultPoint, int], None] | None = None, write_path: str = "auto") -> Any:
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector

    inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="event_time",
                          value_columns=[], record_id_column="record_id", watermark_delay_ms=2_000, max_files_per_trigger=1)
    return PipelineRunner(spark, layout, Pipeline(PIPELINE, (inj,), (ByRecordKey(),)), zk=zk, faults=faults,
                          write_path=write_path, wait_s=20).run()


def _outputs(spark: Any, layout: StoreLayout) -> tuple[Any, Any]:
    return stream_rows(spark, layout, "counts"), state_of(spark, layout, "by_record_key")


@pytest.fixture(scope="module")
def clean(spark, zk_server, tmp_path_factory, migrated_template):  # type: ignore[no-untyped-def]
    """The rows and outputs of a run that nothing interrupted (the shared server, its own chroot)."""
    base = tmp_path_factory.mktemp("clean")
    folder = _input(base / "in")
    copy_migrated_store(migrated_template, base / "store")
    layout = StoreLayout(str(base / "store"))
    _run(spark, folder, layout, ZkConfig(hosts=zk_server.hosts, chroot="/zk-clean", session_timeout_s=6.0))
    counts, state = _outputs(spark, layout)
    assert len(counts) >= 20 and state  # something to compare
    return folder, (counts, state)


def _crash_after_commit(batch: int) -> tuple[Callable[[FaultPoint, int], None], list[int]]:
    crashed: list[int] = []

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point is FaultPoint.AFTER_COMMIT and batch_id == batch and not crashed:
            crashed.append(batch_id)
            raise _Crash(point)
    return faults, crashed


def _wipe(server: Any) -> None:
    """ZooKeeper loses everything: its real process restarted on an empty data folder."""
    server.stop()
    shutil.rmtree(server.data_dir / "data")
    restart_zk_server(server)



@pytest.mark.timeout(300)
def test_a_wiped_zookeeper_is_refused_at_acquisition_and_reseed_fences_above_the_store(
        spark, migrated_store, own_zk) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.ownership.reseed import apply_reseed, plan_reseed
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.grants import interval_path
    from deltawheel.statestore.zk.leases import LeaseManager

    zk = ZkConfig(hosts=own_zk.hosts, chroot="/dw", session_timeout_s=6.0)

    def owner(client: Any) -> IntervalOwner:
        return IntervalOwner(RowStore(spark, migrated_store, writer="w"), LeaseManager(client, pipeline="p", owner="w"),
                             "c", num_intervals=2)

    client = connect(zk)
    o = owner(client)
    o.acquire(claim_only=True)  # grant 0: the fence rows carry sequencer 0
    o.release()
    client.stop()
    client.close()
    _wipe(own_zk)
    client = connect(zk)
    try:  # ZooKeeper grants 0 again, equal to the fences (which reject only greater ones)
        with pytest.raises(CoordinatorStateLostError, match=r"lost the coordination state of pipeline 'p'.*"
                           r"no record of the pipeline's store.*up to sequencer 0.*interval 0: the store's "
                           r"fence carries sequencer 0, ZooKeeper just granted 0.*deltawheel reseed --store"):
            owner(client).acquire(claim_only=True)
        with pytest.raises(CoordinatorStateLostError, match="no record of the pipeline's store"):
            owner(client).acquire(claim_only=True)  # grant 1 now, but the refusal does not wear off
        plan = plan_reseed(spark, migrated_store, client, pipeline="p")  # the dry run
        # the refused grants moved ZooKeeper past the fences (0); the binding is still missing
        assert plan.needed and not plan.bound and plan.store == {"c": {0: 0, 1: 0}} and plan.behind == {}
        apply_reseed(spark, migrated_store, client, plan)
        o = owner(client)
        o.acquire(claim_only=True)
        seqs = o.sequencers
        assert min(seqs.values()) >= 1  # above everything in the store
        o.release()
        assert not plan_reseed(spark, migrated_store, client, pipeline="p").needed

        # ZooKeeper restored from an older copy: the binding survived, interval 1's grants did not
        client.delete(f"{interval_path('p', 'c', 1)}/grants", recursive=True)
        with pytest.raises(CoordinatorStateLostError, match=r"interval 1: the store's fence carries sequencer \d+, "
                           r"ZooKeeper just granted 0"):
            owner(client).acquire(claim_only=True)
        assert plan_reseed(spark, migrated_store, client, pipeline="p").behind == {"c": {1: seqs[1] + 1}}
    finally:
        client.stop()
        client.close()


@pytest.mark.timeout(300)
def test_a_copy_that_bound_the_store_then_waited_accepts_fences_another_copy_wrote_meanwhile(
        spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """Two copies of a new pipeline started at once: the one that records the store's binding can
    wait for leases the other holds, which fences the store under that binding. Those fence rows
    are not a lost ZooKeeper state: the waiting copy takes over when they are given back (only
    rows the store held before the binding are refused, as the wiped-ZooKeeper test shows)."""
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.binding import store_path
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager

    client = connect(zk_config)
    try:
        other_leases = LeaseManager(client, pipeline="race", owner="second")
        other_leases.acquire("c", [0, 1])  # the other copy got the leases first
        first = IntervalOwner(RowStore(spark, migrated_store, writer="first"),
                              LeaseManager(client, pipeline="race", owner="first"), "c", num_intervals=2)
        result: dict[str, object] = {}

        def start_first() -> None:
            try:
                first.acquire(claim_only=True, wait_s=120)
                result["sequencers"] = first.sequencers
            except BaseException as exc:
                result["error"] = exc

        t = threading.Thread(target=start_first)
        t.start()
        deadline = time.monotonic() + 60
        while client.exists(store_path("race")) is None:  # the first copy recorded the binding
            assert time.monotonic() < deadline and t.is_alive(), result
            time.sleep(0.05)
        second = IntervalOwner(RowStore(spark, migrated_store, writer="second"), other_leases, "c", num_intervals=2)
        second.acquire(claim_only=True)  # fences both intervals under the first copy's binding
        fenced = dict(second.sequencers)
        assert RowStore(spark, migrated_store, writer="x").fences("c") == fenced
        assert t.is_alive()  # still waiting for the leases
        second.release()
        t.join(timeout=120)
        assert "error" not in result, result
        assert all(s > fenced[iv] for iv, s in result["sequencers"].items())  # type: ignore[union-attr]
        first.release()
    finally:
        client.stop()
        client.close()


@pytest.mark.slow  # four pipeline runs: about 2.5 minutes per write path
@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", "merge"])
def test_zookeeper_data_loss_is_refused_then_reseed_gives_the_clean_rows(spark, tmp_path, own_zk, clean,
                                                                        write_path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.cli import main

    folder, want = clean
    layout = StoreLayout(str(tmp_path / "store"))
    zk = ZkConfig(hosts=own_zk.hosts, chroot="/dw", session_timeout_s=6.0)
    faults, crashed = _crash_after_commit(2)
    with pytest.raises(Exception, match="_Crash"):  # part-way: two batches committed
        _run(spark, folder, layout, zk, faults=faults, write_path=write_path)
    assert crashed == [2]

    _wipe(own_zk)

    with pytest.raises(CoordinatorStateLostError, match=r"ZooKeeper lost the coordination state of pipeline "
                       r"'zkloss'.*fence carries sequencer .*deltawheel reseed --store"):
        _run(spark, folder, layout, zk, write_path=write_path)
    with pytest.raises(CoordinatorStateLostError):  # and again: the refusal does not wear off
        _run(spark, folder, layout, zk, write_path=write_path)

    # the documented recovery: a dry run changes nothing, --apply re-seeds
    args = ["reseed", "--store", layout.root, "--pipeline", PIPELINE, "--zk", zk.hosts, "--zk-chroot", zk.chroot]
    assert main(args) == 0
    with pytest.raises(CoordinatorStateLostError):
        _run(spark, folder, layout, zk, write_path=write_path)
    assert main([*args, "--apply"]) == 0

    summary = _run(spark, folder, layout, zk, write_path=write_path)
    assert summary.reports["by_record_key"]
    assert _outputs(spark, layout) == want


@pytest.mark.timeout(150)
def test_a_pause_on_a_zookeeper_that_came_back_empty_stops_with_the_data_loss_named(own_zk) -> None:  # type: ignore[no-untyped-def]
    """The server stopped and an empty one started on its port: it refuses the old session ("has
    seen zxid ..., our last zxid is 0x0") without ever expiring it, so the client stays SUSPENDED.
    With the default bound (no max_pause_s given), a paused commit stops with the loss named once
    paused past the session timeout, instead of waiting as long as no expiry is reported; so does
    a paused watermark call."""
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager
    from deltawheel.statestore.zk.watermarks import WatermarkAuthority

    client = connect(ZkConfig(hosts=own_zk.hosts, chroot="/dw", session_timeout_s=4.0))
    try:
        leases = LeaseManager(client, pipeline="p", owner="w")
        leases.acquire("c", [0, 1])
        authority = WatermarkAuthority(client, pipeline="p")
        authority.publish_injector("i", 1_000)
        _wipe(own_zk)
        with pytest.raises(CoordinatorStateLostError, match=r"commits of p/c: ZooKeeper at 127\.0\.0\.1:\d+ lost its "
                           r"data: it serves new sessions but refuses this client's, which has seen transaction zxid "
                           r"0x[0-9a-f]+ while the ensemble's last is 0x[0-9a-f]+ \(its data folder was wiped, or "
                           r"restored from an older copy\)\. Nothing was committed.*deltawheel reseed --store <its "
                           r"store> --pipeline p --apply"):
            leases.await_valid("c", [0, 1])
        with pytest.raises(CoordinatorStateLostError, match=r"reading injector watermark: ZooKeeper at .* lost its data"):
            authority.injector_watermark("i")
        authority.close()
    finally:
        client.stop()
        client.close()


@pytest.mark.timeout(150)
def test_a_binding_deleted_by_a_refused_start_mid_bind_gives_the_refusal_not_a_raw_error(
        spark, migrated_store, zk_config, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two computations start on a ZooKeeper that lost the pipeline (a chroot without it) while the
    store holds both computations' fence rows. The first creates the store binding, is refused and
    deletes it; the second's binding step found the node at its create and reads it after the
    delete (driven here: the second waits between the two until the first was refused). It must
    be refused too, typed, not fail on kazoo's NoNodeError."""
    from dataclasses import replace
    from functools import partial

    from deltawheel.statestore.ownership import owner as owner_module
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.binding import bind_store, store_path
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager

    def owner(client: Any, computation: str) -> IntervalOwner:
        return IntervalOwner(RowStore(spark, migrated_store, writer=computation),
                             LeaseManager(client, pipeline="race", owner=computation), computation, num_intervals=2)

    clients = [connect(zk_config)]
    try:
        for comp in ("a", "b"):  # the store's fence rows, written under the ZooKeeper state now lost
            o = owner(clients[0], comp)
            o.acquire(claim_only=True)
            o.release()
        lost = replace(zk_config, chroot=zk_config.chroot + "-lost")
        clients += [connect(lost), connect(lost)]
        first, second = owner(clients[1], "a"), owner(clients[2], "b")
        at_get, go = threading.Event(), threading.Event()

        def between_create_and_get() -> None:
            at_get.set()
            assert go.wait(60)

        monkeypatch.setattr(owner_module, "bind_store", partial(bind_store, on_exists=between_create_and_get))
        result: dict[str, BaseException] = {}

        def start_second() -> None:
            try:
                second.acquire(claim_only=True)
            except BaseException as exc:
                result["error"] = exc

        t = threading.Thread(target=start_second)

        def granted() -> None:  # the first holds its leases and is about to check the store
            t.start()
            assert at_get.wait(60)  # the second's create found the first's binding

        first.on_granted = granted
        with pytest.raises(CoordinatorStateLostError, match="no record of the pipeline's store"):
            first.acquire(claim_only=True)
        assert clients[1].exists(store_path("race")) is None  # the refused start deleted its binding
        go.set()
        t.join(60)
        assert isinstance(result.get("error"), CoordinatorStateLostError), repr(result.get("error"))
        assert "lost the coordination state of pipeline 'race'" in str(result["error"])
        assert clients[2].exists(store_path("race")) is None  # not kept by the second either
    finally:
        for c in clients:
            c.stop()
            c.close()


def test_the_reseed_plan_shows_injector_watermarks_as_times() -> None:
    """The dry run's injector line reads as a time, or the end of time after a bounded run, not as
    a bare 9223372036854775807."""
    from deltawheel.statestore.zk.watermarks import END_OF_TIME

    from deltawheel.cli.reseed import injector_line

    assert injector_line("events", END_OF_TIME, END_OF_TIME) == (
        "  injector events: watermark end of time in the store's commits, ZooKeeper's end of time  ok")
    assert injector_line("events", 1_735_689_600_000, None) == (
        "  injector events: watermark 2025-01-01 00:00:00 UTC (1735689600000 ms) in the store's commits, "
        "ZooKeeper's none  restore")
    assert "9223372036854775807" not in injector_line("events", END_OF_TIME, 0)


@pytest.mark.timeout(400)
def test_reseed_restores_the_injector_watermark_the_lost_zookeeper_held(spark, tmp_path, zk_config, clean,
                                                                        capsys, migrated_at) -> None:  # type: ignore[no-untyped-def]
    """A run stopped before the commit of batch 2: ZooKeeper holds the injector watermark batch 1
    published (its newest event time minus the delay), which batch 2 runs under. ZooKeeper then
    loses everything (here: the pipeline's chroot is left behind); `reseed --apply` restores the
    watermark from what the store's commits record, to exactly the value lost."""
    from dataclasses import replace

    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.watermarks import WatermarkAuthority

    from deltawheel.cli import main

    folder, _ = clean
    layout = migrated_at(tmp_path / "store")
    crashed: list[int] = []

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point is FaultPoint.BEFORE_COMMIT and batch_id == 2 and not crashed:
            crashed.append(batch_id)
            raise _Crash(point)

    with pytest.raises(Exception, match="_Crash"):
        _run(spark, folder, layout, zk_config, faults=faults)

    def injector_watermark(zk: ZkConfig) -> int | None:
        client = connect(zk)
        try:
            authority = WatermarkAuthority(client, pipeline=PIPELINE)
            value = authority.injector_watermark("events")
            authority.close()
            return value
        finally:
            client.stop()
            client.close()

    held = injector_watermark(zk_config)
    assert held == 500 * (2 * 40 - 1) - 2_000  # batch 1's newest event time minus the 2 s delay
    wiped = replace(zk_config, chroot=zk_config.chroot + "-wiped")
    assert injector_watermark(wiped) is None
    args = ["reseed", "--store", layout.root, "--pipeline", PIPELINE, "--zk", zk_config.hosts, "--zk-chroot",
            wiped.chroot, "--json"]
    capsys.readouterr()
    assert main(args) == 0  # the dry run lists it and changes nothing
    plan = json.loads(capsys.readouterr().out)
    assert plan["injector_watermarks"] == {"events": held} and plan["zookeeper_injector_watermarks"] == {"events": None}
    assert injector_watermark(wiped) is None
    assert main([*args, "--apply"]) == 0
    assert injector_watermark(wiped) == held


def test_raise_sequencers_makes_the_next_grant_start_at_the_floor_and_never_lowers(zk_config) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.lease_tools import next_sequencers, raise_sequencers
    from deltawheel.statestore.zk.leases import LeaseManager

    client = connect(zk_config)
    try:
        leases = LeaseManager(client, pipeline="p", owner="a")
        assert next_sequencers(client, pipeline="p", computation="c", intervals=[0, 1]) == {0: 0, 1: 0}
        assert leases.acquire("c", [0])[0].sequencer == 0
        leases.release("c", [0])
        assert raise_sequencers(client, pipeline="p", computation="c", floors={0: 1_201, 1: 7},
                                ops_per_transaction=100)[0] >= 1_201
        assert leases.acquire("c", [0, 1]) and {i: g.sequencer for i, g in leases.held("c").items()}[0] >= 1_201
        assert leases.held("c")[1].sequencer >= 7
        leases.release("c")
        before = next_sequencers(client, pipeline="p", computation="c", intervals=[0])[0]
        assert raise_sequencers(client, pipeline="p", computation="c", floors={0: 5})[0] >= before  # not lowered
        assert next_sequencers(client, pipeline="p", computation="c", intervals=[0])[0] >= before
    finally:
        client.stop()
        client.close()


@pytest.fixture
def runner_clients(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The kazoo clients the pipeline runner connects (to watch their state, or expire a session)."""
    from deltawheel.executor.drivers import wiring

    got: list[Any] = []
    real = wiring.connect

    def connect(cfg: Any, **kw: Any) -> Any:
        client = real(cfg, **kw)
        got.append(client)
        return client

    monkeypatch.setattr(wiring, "connect", connect)
    return got


def _wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _blip(server: Any, clients: list[Any], *, down_s: float, batch: int = 1
          ) -> tuple[Callable[[FaultPoint, int], None], dict[str, Any]]:
    """Before the commit of ``batch``: stop ZooKeeper (its real process), start it again on the same
    data ``down_s`` later, in the background; the batch goes on meanwhile."""
    from kazoo.client import KazooState

    seen: dict[str, Any] = {}

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point is FaultPoint.BEFORE_COMMIT and batch_id == batch and "down" not in seen:
            seen["session"] = clients[-1].client_id[0]
            server.stop()
            _wait_for(lambda: clients[-1].state != KazooState.CONNECTED, "the client to see the disconnect")
            seen["down"] = time.time()

            def later() -> None:
                time.sleep(down_s)
                # the end of the window with ZooKeeper down: its restart begins (a commit may land
                # as soon as it serves, before restart_zk_server has checked that it does)
                seen["restarting"] = time.time()
                restart_zk_server(server)
                seen["up"] = time.time()
                _wait_for(lambda: clients[-1].state == KazooState.CONNECTED, "the reconnect")
                seen["after"] = clients[-1].client_id[0]
            seen["thread"] = threading.Thread(target=later, daemon=True)
            seen["thread"].start()
    return faults, seen


def _commits_between(layout: StoreLayout, start: float, end: float) -> list[str]:
    return sorted(p.name for p in Path(layout.computations_root).glob("*/rows/_delta_log/*.json") if start <= p.stat().st_mtime <= end)


class _KazooTrail(logging.Handler):
    """kazoo's own log lines during a run (a CLI test earlier in the process may have silenced them)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self._logger = logging.getLogger("kazoo")

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.created:.3f} {record.name} {record.levelname} {record.getMessage()}")

    def __enter__(self) -> _KazooTrail:
        self._level = self._logger.level
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


def _blip_run(spark: Any, layout: StoreLayout, own_zk: Any, clients: list[Any], clean: Any, *, down_s: float,
              zk: ZkConfig, write_path: str = "auto") -> None:
    folder, want = clean
    faults, seen = _blip(own_zk, clients, down_s=down_s)
    with _KazooTrail() as trail:
        try:
            summary = _run(spark, folder, layout, zk, faults=faults, write_path=write_path)
        except Exception:  # what the client and the server saw, to tell a test fault from a product one
            print("kazoo:", *trail.lines, f"seen: { {k: v for k, v in seen.items() if k != 'thread'} }",
                  "server log tail:", own_zk.process.log_tail(80), sep="\n")
            raise
    seen["thread"].join()
    assert "up" in seen and summary.reports["by_record_key"]
    assert seen["after"] == seen["session"]  # the same session: the blip did not end it
    assert _commits_between(layout, seen["down"], seen["restarting"]) == []  # nothing committed while it was down
    assert _outputs(spark, layout) == want


@pytest.mark.timeout(300)
def test_a_zookeeper_blip_shorter_than_the_session_pauses_commits_and_the_run_ends_normally(
        spark, tmp_path, own_zk, runner_clients, clean, migrated_at) -> None:  # type: ignore[no-untyped-def]
    _blip_run(spark, migrated_at(tmp_path / "store"), own_zk, runner_clients, clean, down_s=2.0,
              zk=ZkConfig(hosts=own_zk.hosts, chroot="/dw", session_timeout_s=20.0))  # 2 s down, the rest for a restart under load


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", "merge"])
def test_a_15s_zookeeper_blip_under_the_default_session_timeout_ends_normally(
        spark, tmp_path, own_zk, runner_clients, clean, migrated_at, write_path) -> None:  # type: ignore[no-untyped-def]
    zk = ZkConfig(hosts=own_zk.hosts, chroot="/dw")  # the default session timeout leaves room for 15 s
    assert zk.session_timeout_s > 15
    _blip_run(spark, migrated_at(tmp_path / "store"), own_zk, runner_clients, clean, down_s=15.0, zk=zk, write_path=write_path)


@pytest.mark.timeout(300)
def test_a_session_expiry_stops_the_run_with_the_cause_named(spark, tmp_path, own_zk, runner_clients,
                                                             clean, migrated_at) -> None:  # type: ignore[no-untyped-def]
    from kazoo.client import KazooClient, KazooState

    folder, _ = clean
    layout = migrated_at(tmp_path / "store")
    zk = ZkConfig(hosts=own_zk.hosts, chroot="/dw", session_timeout_s=6.0)
    lost: list[str] = []

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point is FaultPoint.BEFORE_COMMIT and batch_id == 1 and not lost:
            client = runner_clients[-1]
            client.add_listener(lambda state: lost.append(state) if state == KazooState.LOST else None)
            # the server expires the session: another client takes it over and closes it. The
            # original client may win the session back before the close (a reconnect races the
            # takeover), so take it over again until the loss is reported.
            deadline = time.monotonic() + 90
            while not lost:
                assert time.monotonic() < deadline, "the session was never reported LOST"
                other = KazooClient(hosts=zk.hosts + zk.chroot, client_id=client.client_id,
                                    timeout=zk.session_timeout_s)
                other.start(timeout=15)
                other.stop()
                other.close()
                try:
                    _wait_for(lambda: bool(lost), "the session to be reported LOST", timeout_s=10)
                except AssertionError:
                    continue

    with pytest.raises(LeaseLostError, match=r"lease on interval \d+ of zkloss/by_record_key was lost "
                       r"\(ZooKeeper session expired\)"):
        _run(spark, folder, layout, zk, faults=faults)
    assert lost


def _dw(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deltawheel.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _demo_rows(spark: Any, root: Path | str) -> dict[str, Any]:
    """Every column of the demo's streams that a run decides (not the commit id, which carries the
    processing time), and every computation's state and timers (not the dedup ids' seen times)."""
    out: dict[str, Any] = {}
    for stream in ("window_counts", "predictions", "anomalies"):
        df = spark.read.format("delta").load(f"{root}/streams/{stream}")
        out[stream] = sorted((r["record_id"], r["key"], r["value"], r["timestamp_ms"], r["producer"])
                             for r in df.collect())
    from deltawheel.statestore.rowtable.tables import rows_frame

    rows = rows_frame(spark, StoreLayout(str(root)))
    assert rows is not None
    out["state"] = sorted((r["computation"], r["key"], r["state"], sorted((t["tag"], t["time_ms"]) for t in r["timers"]))
                          for r in rows.collect() if not r["key"].startswith("\x00"))
    return out


@pytest.mark.slow  # five runs of the demo (four as subprocesses): about 8 minutes on a busy machine
@pytest.mark.timeout(2400)
def test_demo_on_its_embedded_zookeeper_come_back_empty_stops_is_refused_then_reseeded_to_the_clean_rows(
        spark, zk_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The operator's sequence: the demo runs on its store's embedded ZooKeeper; mid-run that server
    is stopped (as `zk stop --force` does), its data folder wiped and an empty one started on the same port
    (`zk start --port`). The run stops, without a --max-pause that would end it, with the lost data
    named (exit 4, coordination); a plain retry is refused, typed (exit 4, not a raw kazoo error);
    after `reseed --apply` the demo ends with exactly the rows of an uninterrupted run: pane flags,
    production ids, state and timers."""
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner

    from deltawheel.demo.pipeline import computations
    from deltawheel.demo.zeitgeist import GeneratorInjector, ZeitgeistParams
    from deltawheel.servers.embedded import StoreZooKeeper

    events, per_batch = 3_000, 500
    clean_store = tmp_path / "clean"
    inj = GeneratorInjector("queries", str(clean_store / "_input"), ZeitgeistParams(n_events=events, seed=7),
                            events_per_batch=per_batch)
    PipelineRunner(spark, StoreLayout(str(clean_store)), Pipeline("zeitgeist", (inj,), computations()),
                   zk=ZkConfig(hosts=zk_server.hosts, chroot=f"/clean-{tmp_path.name}")).run()
    want = _demo_rows(spark, clean_store)
    assert want["window_counts"] and want["predictions"]  # something to compare

    store = tmp_path / "store"
    demo = ["demo", "--store", str(store), "--events", str(events), "--events-per-batch", str(per_batch),
            "--max-pause", "900", "--wait", "60"]
    # a short session timeout for the run that loses ZooKeeper (it is found once paused past it)
    proc = subprocess.Popen([sys.executable, "-m", "deltawheel.cli", *demo, "--zk-session-timeout", "6"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        # the first stage's batch 2 ended: ZooKeeper loses everything before batch 3, the first whose
        # input watermark (batch 2's newest event time minus 3 s, past the first windows' end) fires
        # timers: run without that watermark, it would fire none and the next batch two batches' worth
        for line in proc.stdout:
            lines.append(line)
            if "window_counter batch 2" in line:
                break
        record = json.loads((store / "_zk" / "server.json").read_text())
        assert StoreZooKeeper(StoreLayout(str(store))).stop(force=True)  # what `zk stop --force` does
        shutil.rmtree(store / "_zk" / "data")
        deadline = time.monotonic() + 60
        while (start := _dw("zk", "start", "--store", str(store), "--port", str(record["port"]))).returncode != 0:
            assert "in use" in start.stdout + start.stderr and time.monotonic() < deadline, start.stdout + start.stderr
            time.sleep(0.5)
        lines += proc.stdout.readlines()  # until it ends
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(lines)
    try:
        assert proc.returncode == 4, out[-4000:]
        assert "CoordinatorStateLostError" in out and "lost its data: it serves new sessions but refuses" in out, out[-4000:]
        assert "deltawheel reseed --store <its store> --pipeline zeitgeist --apply" in out

        retry = _dw(*demo)
        assert retry.returncode == 4, retry.stdout[-3000:] + retry.stderr[-3000:]
        assert "CoordinatorStateLostError: ZooKeeper lost the coordination state of pipeline 'zeitgeist'" in retry.stderr
        assert "NoNodeError" not in retry.stdout + retry.stderr

        reseed = _dw("reseed", "--store", str(store), "--pipeline", "zeitgeist", "--apply")
        assert reseed.returncode == 0, reseed.stdout + reseed.stderr
        resumed = _dw(*demo)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        got = _demo_rows(spark, store)
        for part in want:
            assert got[part] == want[part], part
    finally:
        _dw("zk", "stop", "--store", str(store), "--force")
