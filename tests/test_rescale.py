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
from deltawheel.executor.runtime.pipeline import Pipeline, PipelineRunner
from deltawheel.executor.runtime.rescale import CATCH_UP_BATCH, source_log_files
from deltawheel.executor.runtime.sources import ParquetInjector
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import interval_of
from deltawheel.statestore.rowtable.store import RowStore
from executor_util import state_of
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
@pytest.mark.parametrize("write_path", ["image", "merge"])
def test_a_moved_interval_is_neither_skipped_nor_processed_twice(spark: Any, zk_config: Any, tmp_path: Path,
                                                                  write_path: str) -> None:
    folder, layout = tmp_path / "in", StoreLayout(str(tmp_path / "store"))
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


def test_sharing_needs_at_most_one_parquet_injector(spark: Any, zk_config: Any, tmp_path: Path) -> None:
    class TwoFolders(KeyCount):
        name = "two_folders"
        inputs = {"events": "key", "more": RECORD_KEY}

    folder, layout = tmp_path / "in", StoreLayout(str(tmp_path / "store"))
    write_file(folder, 0)
    injs = tuple(ParquetInjector(n, str(folder), key_column="key", event_time_column="t", watermark_delay_ms=1_000)
                 for n in ("events", "more"))
    r = PipelineRunner(spark, layout, Pipeline("moves", injs, (TwoFolders(),)), zk=zk_config, instance="a",
                       warm_workers=False)
    with pytest.raises(ConfigError, match="at most one Parquet injector"):
        r.run()


def test_windowed_computations_are_not_shared_between_instances(spark: Any, zk_config: Any, tmp_path: Path) -> None:
    """A user who names an instance for a windowed pipeline is told why it cannot be shared,
    before anything runs (the injector's watermark is one per pipeline)."""
    from deltawheel import FixedWindows, windowed

    folder, layout = tmp_path / "in", StoreLayout(str(tmp_path / "store"))
    write_file(folder, 0)
    inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="t", watermark_delay_ms=1_000)
    sums = windowed(name="sums", inputs={"events": RECORD_KEY}, output="sums", windowing=FixedWindows(10_000),
                    combine="count")
    r = PipelineRunner(spark, layout, Pipeline("moves", (inj,), (sums,)), zk=zk_config, instance="a",
                       warm_workers=False)
    with pytest.raises(ConfigError, match="event-time timers"):
        r.run()
    assert not (tmp_path / "store" / "_checkpoints" / "moves" / "sums" / "a" / "commits").exists()


# --- membership, target, move requests, the rebalance command --------------------------


@pytest.mark.zk
def test_members_split_the_intervals_and_a_move_request_overrides_it(zk_config: Any, capsys: Any) -> None:
    from deltawheel.executor.cli import main
    from deltawheel.executor.cli.rebalance import parse_assign
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.members import Membership, assign, live_members, read_move, target

    assert assign(["b", "a"], 5) == {"a": (0, 1, 2), "b": (3, 4)}
    assert assign(["a", "b", "c"], 2) == {"a": (0,), "b": (1,), "c": ()}
    clients = [connect(zk_config) for _ in range(3)]
    try:
        members = [Membership(c, pipeline="p", instance=n) for c, n in zip(clients, "abc", strict=True)]
        for m in members[:2]:
            m.join()
        with pytest.raises(ConfigError, match="already running"):
            Membership(clients[2], pipeline="p", instance="a").join()
        assert live_members(clients[0], "p") == ["a", "b"]
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
    from deltawheel.statestore.zk.leases import list_leases

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
        except Exception:  # noqa: BLE001 - the table may not exist yet
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
