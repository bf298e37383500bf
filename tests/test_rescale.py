"""Intervals moving between job instances: the skip rule and catch-up keep a move exact.

Instances here are pipeline runners with their own instance name (own query checkpoint, own
ZooKeeper session), run one after the other in this process on the shared Spark session.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.computation import RECORD_KEY
from deltawheel.executor.drivers.pipeline import Pipeline
from deltawheel.executor.drivers.runner import PipelineRunner
from deltawheel.executor.protocol.rescale import CATCH_UP_BATCH, source_log_files
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import interval_of
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.members import Membership
from deltawheel.statestore.zk.watermarks.codec import Znodes
from executor_util import state_of, stream_rows
from hypothesis import given
from hypothesis import strategies as st
from pyspark import cloudpickle
from rescale_instance import KEYS, KeyCount, write_file

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def runner(spark: Any, layout: StoreLayout, folder: Path, zk_config: Any, *, instance: str | None,
           intervals: list[int] | None, write_path: str) -> PipelineRunner:
    inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="t",
                          watermark_delay_ms=1_000, max_files_per_trigger=1, max_event_ahead_ms=None)
    return PipelineRunner(spark, layout, Pipeline("moves", (inj,), (KeyCount(),)), zk=zk_config, wait_s=20,
                          instance=instance, intervals=intervals, write_path=write_path, warm_workers=False)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])
def test_a_moved_interval_is_neither_skipped_nor_processed_twice(spark: Any, zk_config: Any, tmp_path: Path,
                                                                  migrated_at: Any, write_path: str) -> None:
    folder, layout = tmp_path / "in", migrated_at(tmp_path / "store")
    expected: dict[str, int] = {}

    def add(n: int) -> None:
        for k, c in write_file(folder, n).items():  # each key n % 5 + 1 times
            expected[k] = expected.get(k, 0) + c

    def run(instance: str, intervals: list[int] | None) -> Any:
        return runner(spark, layout, folder, zk_config, instance=instance, intervals=intervals,
                      write_path=write_path).run().reports["key_count"]

    add(0)
    run("a", [0, 1])
    run("b", [2, 3])
    add(1)
    run("b", [2, 3])  # b's query is now one file ahead of a's
    # b takes 0 and 1: its query consumed part-00001, which their committed files lack: caught up
    reports = run("b", None)
    catch = [r for r in reports if r.batch_id == CATCH_UP_BATCH]
    assert [r.processed for r in catch] == [sum(2 for k in KEYS if interval_of(k, 4) in (0, 1))]
    files = RowStore(spark, layout, writer="check").input_files("key_count")
    assert files == {iv: frozenset({"part-00000.parquet", "part-00001.parquet"}) for iv in range(4)}
    add(2)
    # a takes everything back: its query is one file behind; part-00001 is skipped for every
    # interval (processed by b), part-00002 processed
    reports = run("a", None)
    assert sum(r.skipped_moved for r in reports) == 2 * len(KEYS)  # part-00001: each key twice
    assert {k: s for k, (s, _) in state_of(spark, layout, "key_count").items()} == expected
    logged = source_log_files(str(tmp_path / "store" / "_checkpoints" / "moves" / "key_count" / "a"))
    assert sorted(f for fs in logged.values() for f in fs) == [f"part-{n:05d}.parquet" for n in range(3)]


def test_sharing_needs_at_most_one_parquet_injector(spark: Any, zk_config: Any, tmp_path: Path,
                                                     migrated_at: Any) -> None:
    class TwoFolders(KeyCount):
        name = "two_folders"
        inputs = {"events": "key", "more": RECORD_KEY}

    folder, layout = tmp_path / "in", migrated_at(tmp_path / "store")
    write_file(folder, 0)
    injs = tuple(ParquetInjector(n, str(folder), key_column="key", event_time_column="t", watermark_delay_ms=1_000, max_files_per_trigger=1)
                 for n in ("events", "more"))
    r = PipelineRunner(spark, layout, Pipeline("moves", injs, (TwoFolders(),)), zk=zk_config, instance="a",
                       warm_workers=False)
    with pytest.raises(ConfigError, match="at most one Parquet injector"):
        r.run()


@pytest.mark.timeout(600)
def test_a_windowed_computation_shared_by_instances_gives_the_panes_of_one(spark: Any, zk_config: Any,
                                                                           tmp_path: Path, migrated_at: Any) -> None:
    """Instance a reads every file ahead while instance b, a live member, has read nothing: b's
    intervals' windows must stay open until b's own reading closes them (each instance publishes
    its own injector estimate; the injector's watermark is the live instances' minimum)."""
    from deltawheel import FixedWindows, windowed

    folder = tmp_path / "in"
    for n in range(3):  # file n: window n (FixedWindows of 10 s from 1,000,000 ms)
        write_file(folder, n)

    def run(name: str, store: str, instance: str | None) -> list[tuple[Any, ...]]:
        inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="t",
                              watermark_delay_ms=1_000, max_files_per_trigger=1, max_event_ahead_ms=None)
        sums = windowed(name="sums", inputs={"events": RECORD_KEY}, output="sums", windowing=FixedWindows(10_000),
                        combine="count")
        layout = StoreLayout(str(tmp_path / store))
        if not Path(layout.root).exists():  # a new store, migrated as the template is
            migrated_at(Path(layout.root))
        PipelineRunner(spark, layout, Pipeline(name, (inj,), (sums,)), zk=zk_config, wait_s=20, instance=instance,
                       warm_workers=False).run()
        return sorted(row[1:] for row in stream_rows(spark, layout, "sums"))  # (key, value, time): the panes

    single = run("single", "single", None)
    assert len(single) == 3 * len(KEYS)  # every key in every window
    client = connect(zk_config)
    try:
        b = Membership(client, pipeline="shared", instance="b")
        b.join()  # b is live and has read nothing: a takes only its half and reads all files ahead
        run("shared", "shared", "a")
        b.leave()
    finally:
        client.stop()
        client.close()
    # b alone now: it takes every interval, skips what a committed, and reads its half from the start
    assert run("shared", "shared", "b") == single


def write_keys(folder: Path, n: int, keys: list[str], t_ms: int) -> None:
    """Input file ``n``: one record per key at ``t_ms`` (+ its position), written whole, with a
    modification time that orders the files by ``n``."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".part-{n:05d}.parquet"
    pq.write_table(pa.table({"key": keys, "t": pa.array([t_ms + i for i in range(len(keys))], pa.int64())}), tmp)
    os.replace(tmp, folder / f"part-{n:05d}.parquet")
    # Spark's file source takes files in modification-time order: files written within one tick
    # of the clock would come in any order (and a file read before an earlier one is late)
    os.utime(folder / f"part-{n:05d}.parquet", (1_700_000_000 + n, 1_700_000_000 + n))


@pytest.mark.timeout(600)
def test_a_leaver_holds_the_watermark_until_its_intervals_are_caught_up(
        spark: Any, zk_config: Any, tmp_path: Path, migrated_at: Any) -> None:
    """b reads less than a and leaves; a publishes its estimate (as its next batch would, before
    it takes b's intervals), then takes them and catches up on the files b never read. Those
    records must not be late (the input watermark must still be b's position): the panes equal
    one instance's."""
    from deltawheel.statestore.zk.members import assign
    from deltawheel.statestore.zk.watermarks import WatermarkAuthority

    from deltawheel import FixedWindows, windowed

    folder, t0 = tmp_path / "in", 1_000_000
    probe = windowed(name="sums", inputs={"events": RECORD_KEY}, output="sums", windowing=FixedWindows(10_000),
                     combine="count")
    n = type(probe).num_intervals
    b_ivs = assign(["a", "b"], n)["b"]
    a_keys = [k for k in KEYS if interval_of(k, n) not in b_ivs]
    assert a_keys and len(a_keys) < len(KEYS)

    def run(name: str, store: str, instance: str | None, *, end: bool) -> list[tuple[Any, ...]]:
        inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="t",
                              watermark_delay_ms=1_000, max_files_per_trigger=1, max_event_ahead_ms=None)
        sums = windowed(name="sums", inputs={"events": RECORD_KEY}, output="sums", windowing=FixedWindows(10_000),
                        combine="count")
        layout = StoreLayout(str(tmp_path / store))
        if not Path(layout.root).exists():  # a new store, migrated as the template is
            migrated_at(Path(layout.root))
        PipelineRunner(spark, layout, Pipeline(name, (inj,), (sums,)), zk=zk_config, wait_s=20, instance=instance,
                       warm_workers=False, end_of_input=end).run()
        return sorted(row[1:] for row in stream_rows(spark, layout, "sums"))

    def files_upto(last: int) -> None:
        plan = [(KEYS, t0), (a_keys, t0 + 25_000), (KEYS, t0 + 30_000), (a_keys, t0 + 65_000)]
        for i, (keys, t) in enumerate(plan[:last + 1]):
            if not (folder / f"part-{i:05d}.parquet").exists():
                write_keys(folder, i, keys, t)

    files_upto(3)
    single = run("single", "single", None, end=True)
    assert len(single) == 2 * len(KEYS) + 2 * len(a_keys)  # every record's window, once
    for i in range(4):
        (folder / f"part-{i:05d}.parquet").unlink()

    client = connect(zk_config)
    try:
        def alone_with(other: str, instance: str) -> None:  # ``other`` live (a member that runs nothing)
            m = Membership(client, pipeline="shared", instance=other)
            m.join()
            run("shared", "shared", instance, end=False)
            m.leave()

        files_upto(1)
        alone_with("b", "a")  # a reads files 0 and 1 for its half
        alone_with("a", "b")  # b reads them for its half
        files_upto(3)
        alone_with("b", "a")  # a reads files 2 and 3 ahead for its half; b counts: it is live
        # b is gone; a's next batch publishes its estimate before it takes b's intervals
        authority = WatermarkAuthority(client, pipeline="shared")
        a_estimate = t0 + 65_000 + len(a_keys) - 1 - 1_000
        authority.publish_instance_injector("events", "a", a_estimate,
                                            held={"sums": {iv: 1 for iv in range(n) if iv not in b_ivs}})
        # an instance's estimate counts the records of its own intervals: b's last is in file 0
        b_position = max(t0 + i for i, k in enumerate(KEYS) if k not in a_keys) - 1_000
        assert authority.injector_watermark("events") == b_position
    finally:
        client.stop()
        client.close()
    # a takes b's intervals and catches up on file 2 for them: on time, as for one instance
    assert run("shared", "shared", "a", end=True) == single


def test_an_upstream_computations_watermark_is_capped_at_its_value_before_the_query(
        spark: Any, migrated_store: Any, zk_config: Any) -> None:
    """Job instances: another instance may deliver rows to an upstream's stream table and advance
    its watermark after this query pinned its snapshot of the table; the query and the flush
    after it act on the watermark read before the snapshot (``PipelineRunner`` sets the cap)."""
    from deltawheel.executor.protocol.host import BatchInputs
    from executor_util import start_executor, stop_executor

    ex, client = start_executor(spark, migrated_store, zk_config, KeyCount(), watermarks=True)
    try:
        authority = ex.authority
        authority.declare("upper", upstream=["injector:src"], num_intervals=1)
        authority.publish_injector("src", 1_000)
        authority.publish_oldest_work("upper", 0, None, sequencer=1)
        ex.upstream = ("computation:upper",)
        assert ex.input_watermark() == 1_000
        ex.next_batch_inputs(BatchInputs(upstream_caps={"upper": 1_000}))  # read before the snapshot
        authority.publish_injector("src", 5_000)  # the upstream moves on after it
        assert ex.input_watermark() == 1_000
        ex.next_batch_inputs(BatchInputs(upstream_caps={"upper": None}))  # unknown before the snapshot: unknown
        assert ex.input_watermark() is None
        ex.next_batch_inputs(BatchInputs())
        assert ex.input_watermark() == 5_000
    finally:
        stop_executor(ex, client)


# --- membership, target, move requests, the rebalance command --------------------------


@pytest.mark.zk
def test_members_split_the_intervals_and_a_move_request_overrides_it(zk_config: Any, capsys: Any) -> None:
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.members import (
        Membership,
        assign,
        live_members,
        parse_assign,
        read_move,
        target,
    )

    from deltawheel.cli import main

    assert assign(["b", "a"], 5) == {"a": (0, 1, 2), "b": (3, 4)}
    assert assign(["a", "b", "c"], 2) == {"a": (0,), "b": (1,), "c": ()}
    clients = [connect(zk_config) for _ in range(3)]
    try:
        members = [Membership(c, pipeline="p", instance=n) for c, n in zip(clients, "abc", strict=True)]
        for m in members[:2]:
            m.join()
        # "a" again from another session (a restart under its name): its member znode is replaced
        again = Membership(clients[2], pipeline="p", instance="a")
        again.join()
        assert again.replaced and not members[1].replaced
        assert clients[0].exists(again.path).ephemeralOwner == clients[2].client_id[0]
        assert live_members(clients[0], "p") == ["a", "b"]
        again.leave()
        members[0].join()  # back to the first session's (the test's "c" is that third client)
        assert clients[0].exists(members[0].path).ephemeralOwner == clients[0].client_id[0]
        assert target(clients[0], "p", "c1", 4) == {"a": (0, 1), "b": (2, 3)}
        zk = ["--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
        assert main(["rebalance", "--pipeline", "p", "--computation", "c1", "--assign", "a=0-2", "--assign", "b=3",
                     "--plan", *zk]) == 0
        assert "plan: would request" in capsys.readouterr().out and read_move(clients[0], "p", "c1") is None
        assert main(["rebalance", "--pipeline", "p", "--computation", "c1", "--assign", "a=0-2", "--assign", "b=3",
                     *zk]) == 0
        assert target(clients[0], "p", "c1", 4) == {"a": (0, 1, 2), "b": (3,)}
        members[2].join()  # an instance the request does not name: it still applies (c gets nothing)
        assert target(clients[0], "p", "c1", 4) == {"a": (0, 1, 2), "b": (3,), "c": ()}
        clients[1].stop()  # b dies: a request naming a dead instance is void, the live ones split
        clients[1].close()
        assert live_members(clients[0], "p") == ["a", "c"]
        assert target(clients[0], "p", "c1", 4) == {"a": (0, 1), "c": (2, 3)}
        assert main(["rebalance", "--pipeline", "p", "--computation", "c1", "--clear", *zk]) == 0
        assert "move request deleted" in capsys.readouterr().out and read_move(clients[0], "p", "c1") is None
        assert main(["rebalance", "--pipeline", "p", "--computation", "c1", "--assign", "a=0-2", "--assign", "c=2",
                     *zk]) == 3
        assert "ConfigError: --assign: intervals [2] are given to two instances" in capsys.readouterr().err
        with pytest.raises(ConfigError, match="write INSTANCE=I,J-K"):
            parse_assign(["a:1"])
    finally:
        for c in (clients[0], clients[2]):
            c.stop()
            c.close()


# --- 1 -> 3 -> 2 -> 1 instances, separate Spark applications, while input arrives ---------------


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_one_to_three_to_two_to_one_instances_gives_the_rows_of_one(spark: Any, zk_server: Any, zk_config: Any,
                                                                     tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import threading
    import time

    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.lease_tools import list_leases

    store, folder = tmp_path / "store", tmp_path / "in"
    expected: dict[str, int] = {}
    written = [0]
    stop_input = threading.Event()

    def add() -> None:
        for k, c in write_file(folder, written[0]).items():
            expected[k] = expected.get(k, 0) + c
        written[0] += 1

    def feed() -> None:  # a file every 3 s while the instances come and go
        while not stop_input.is_set():
            add()
            stop_input.wait(3.0)

    script = str(Path(__file__).with_name("rescale_instance.py"))
    procs: dict[str, subprocess.Popen[str]] = {}
    logs: dict[str, Path] = {}

    def start(name: str) -> None:
        logs[name] = tmp_path / f"{name}.log"
        procs[name] = subprocess.Popen(
            [sys.executable, script, str(store), str(folder), zk_server.hosts, zk_config.chroot, name,
             str(tmp_path / f"stop-{name}"), "image"], stdout=logs[name].open("w"), stderr=subprocess.STDOUT,
            text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})

    client = connect(zk_config)

    def holders() -> dict[int, str | None]:
        return {r["interval"]: r["owner"] for r in list_leases(client, pipeline="moves")
                if r["computation"] == "key_count"}

    def wait_for(what: str, cond: Any, timeout_s: float = 300) -> None:
        end = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}: holders {holders()}; logs: " + " | ".join(
                    f"{n}: {p.read_text()[-1500:]}" for n, p in logs.items()))
            time.sleep(1.0)

    def spread(n: int) -> bool:  # every interval held, by n distinct instances (owners are host:pid)
        h = holders()
        return len(h) == 4 and None not in h.values() and len(set(h.values())) == n

    def counts() -> dict[str, int]:
        try:
            return {k: s for k, (s, _) in state_of(spark, StoreLayout(str(store)), "key_count").items()}
        except Exception:
            return {}

    try:
        add()
        start("a")
        wait_for("a to hold everything", lambda: spread(1))
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        time.sleep(6)
        start("b")
        start("c")
        wait_for("three instances to share the intervals", lambda: spread(3))
        time.sleep(6)
        (tmp_path / "stop-c").touch()  # a graceful leave
        assert procs["c"].wait(timeout=300) == 0
        wait_for("two instances to share the intervals", lambda: spread(2))
        time.sleep(6)
        procs["b"].send_signal(signal.SIGKILL)  # a death: its session expires, a takes its intervals
        procs["b"].wait(timeout=60)
        wait_for("a to hold everything again", lambda: spread(1))
        stop_input.set()
        feeder.join()
        wait_for("a to process every file", lambda: counts() == expected)
        (tmp_path / "stop-a").touch()
        assert procs["a"].wait(timeout=300) == 0
        assert counts() == expected  # exactly the rows of one instance reading every file once
        moves = [line for p in logs.values() for line in p.read_text().splitlines() if " MOVE " in line]
        print("\n".join(moves))
        assert moves
    finally:
        stop_input.set()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        client.stop()
        client.close()


# --- the fence row's input-file set -------------------------------------------------------


@given(st.lists(st.frozensets(st.text(min_size=1, max_size=12)), max_size=4), st.frozensets(st.text(max_size=12)))
def test_input_file_sets_round_trip_and_union(sets: list[frozenset[str]], added: frozenset[str]) -> None:
    from deltawheel.statestore.rowtable import inputfiles

    payloads = [inputfiles.encode(s) if s else None for s in sets]
    assert [inputfiles.decode(p) for p in payloads] == [s for s in sets]
    union = inputfiles.union_payloads(payloads, added)
    want = frozenset().union(*sets, added)
    assert inputfiles.decode(union) == want and (union is None) == (not want)


def test_an_unreadable_input_file_set_is_a_codec_error() -> None:
    from deltawheel.statestore.exceptions import CodecError
    from deltawheel.statestore.rowtable import inputfiles

    with pytest.raises(CodecError, match="not JSON"):
        inputfiles.decode(b"\xff")
    with pytest.raises(CodecError, match="upgrade deltawheel"):
        inputfiles.decode(b'{"format_version": 2, "input_files": []}')


@pytest.mark.timeout(600)
def test_a_takeover_catch_up_judges_lateness_by_the_taken_intervals_not_the_takers(
        spark: Any, zk_config: Any, tmp_path: Path, migrated_at: Any) -> None:
    """Found by a 60-minute chaos run (386 windows missing): b held intervals 2 and 3 and had read
    far ahead; it took over 0 and 1 from a, gone after file 1, and caught up on files 2-5 for them.
    The catch-up judged lateness by b's own newest mark (its intervals' watermark, windows ahead)
    and dropped the backlog as too late. An interval's records are late only behind what a batch
    of that interval acted on: the panes are those of one instance reading everything."""
    from deltawheel import FixedWindows, windowed

    def run(folder: Path, store: str, instance: str | None, intervals: list[int] | None) -> list[Any]:
        inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="t",
                              watermark_delay_ms=1_000, max_files_per_trigger=1, max_event_ahead_ms=None)
        sums = windowed(name="sums", inputs={"events": RECORD_KEY}, output="sums", windowing=FixedWindows(10_000),
                        combine="count")
        layout = StoreLayout(str(tmp_path / store))
        if not Path(layout.root).exists():
            migrated_at(Path(layout.root))
        r = PipelineRunner(spark, layout, Pipeline(store, (inj,), (sums,)), zk=zk_config, wait_s=20,
                           instance=instance, intervals=intervals, warm_workers=False,
                           end_of_input=intervals is None)  # a and b's first run: their input goes on
        summary = r.run()
        if instance == "b" and intervals is None:
            caught = [rep for rep in summary.reports["sums"] if rep.batch_id == CATCH_UP_BATCH]
            assert caught and caught[0].records_in > 0 and caught[0].late == 0, caught
        return sorted(row[1:] for row in stream_rows(spark, layout, "sums"))

    everything, folder = tmp_path / "all", tmp_path / "in"
    for n in range(6):  # file n: window n
        write_file(everything, n)
    single = run(everything, "single", None, None)
    for n in range(2):
        write_file(folder, n)
    run(folder, "shared", "a", [0, 1])  # a: files 0 and 1 for intervals 0 and 1, then gone
    client = connect(zk_config)
    try:  # a gone: its estimate of the injector no longer holds b's watermark back
        client.delete(f"{Znodes('shared').instances('events')}/a", recursive=True)
    finally:
        client.stop()
        client.close()
    for n in range(2, 6):
        write_file(folder, n)
    run(folder, "shared", "b", [2, 3])  # b: every file for intervals 2 and 3 (its watermark far ahead)
    assert run(folder, "shared", "b", None) == single  # b takes every interval: a catch-up on 0 and 1
