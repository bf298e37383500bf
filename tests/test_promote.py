"""``deltawheel promote``: a replay's state replaces the live computation's under its
leases, while the pipeline runs; real Spark, ZooKeeper and Delta."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltawheel.statestore.exceptions import ReplayTargetError
from hypothesis import given, settings
from hypothesis import strategies as hs

from deltawheel.cli import main

pytestmark = pytest.mark.spark

PER_FILE = 500


def _marker(into: Path, **kw: Any) -> None:
    into.mkdir(parents=True, exist_ok=True)
    (into / "_replay.json").write_text(json.dumps(kw))


def test_a_folder_that_is_no_replay_of_this_computation_is_refused(tmp_path: Path) -> None:
    """Each refusal as the command line gives it, before Spark or ZooKeeper: nothing changes."""
    from deltawheel.executor.drivers.promote import check_replay
    from deltawheel.statestore.layout import StoreLayout

    store = StoreLayout(str(tmp_path / "store"))
    into = tmp_path / "shadow"

    def check(**kw: Any) -> Any:
        args = {"pipeline": "zeitgeist", "computation": "model", **kw}
        return check_replay(store, StoreLayout(str(into)), **args)

    with pytest.raises(ReplayTargetError, match="is not a replay's folder"):
        check()
    with pytest.raises(ReplayTargetError, match="is the live store itself"):
        check_replay(store, store, pipeline="zeitgeist", computation="model")
    real = os.path.realpath(store.root)
    _marker(into, store=real, pipeline="zeitgeist", computation="detector", reached=3)
    with pytest.raises(ReplayTargetError, match="a replay of computation 'detector', not 'model'"):
        check()
    _marker(into, store=real, pipeline="other", computation="model", reached=3)
    with pytest.raises(ReplayTargetError, match="a replay of pipeline 'other', not 'zeitgeist'"):
        check()
    _marker(into, store="/elsewhere", pipeline="zeitgeist", computation="model", reached=3)
    with pytest.raises(ReplayTargetError, match="a replay of store '/elsewhere'"):
        check()
    _marker(into, store=real, pipeline="zeitgeist", computation="model", reached=None)
    with pytest.raises(ReplayTargetError, match="never finished its seeding"):
        check()
    # the command line: exit status 3 (a ConfigError), nothing written
    _marker(into, store=real, pipeline="zeitgeist", computation="detector", reached=3)
    assert main(["promote", "--from", str(into), "--store", str(store.root), "--pipeline", "zeitgeist",
                 "--computation", "model"]) == 3
    assert not os.path.exists(store.root)


def test_a_plan_counts_the_keys_it_does_not_name() -> None:
    """A plan names five keys written and five deleted; the others are counted, with the command
    that compares them all, so a long plan does not read as complete."""
    from deltawheel.executor.drivers.promote import PromotePlan
    from deltawheel.statestore.rowtable.rows import KeyRow
    from deltawheel.statestore.surgery.replace import SurgeryResult

    def plan(written: int, deleted: int) -> str:
        change = SurgeryResult(computation="model", intervals=(0, 1), sequencers={0: 1, 1: 1},
                               upserted=tuple(KeyRow(computation="model", key=f"k{i}", interval=i % 2) for i in range(written)),
                               deleted=tuple((i % 2, f"d{i}") for i in range(deleted)), before={},
                               version=None, audit_id=None, planned=True)
        return PromotePlan(store="/live", into="/shadow", pipeline="zeitgeist", computation="model", reached=3,
                           newest=3, behind=0, change=change).describe()

    out = plan(8, 6)
    assert "write 8 keys and delete 6" in out
    assert [line.split("'")[1] for line in out.splitlines() if line.startswith("  write  ")] == \
        ["k0", "k1", "k2", "k3", "k4"]
    assert out.count("  delete ") == 5
    assert out.splitlines()[-1] == ("  ... and 4 more keys: deltawheel diff --store /live --store /shadow "
                                    "--computation model compares them all")
    assert "more keys" not in plan(5, 5)        # every key named: nothing to count


@pytest.mark.zk
@pytest.mark.timeout(900)
@settings(deadline=None)  # the first example imports the drivers
@given(gap=hs.integers(0, 60), per_batch=hs.sampled_from([0.0, 0.3, 0.5, 0.9, 1.0, 1.5, 3.0]),
       other=hs.booleans())
def test_the_catch_up_before_the_hand_over_runs_while_the_gap_shrinks(gap: int, per_batch: float,
                                                                        other: bool) -> None:
    """Live batches land while the replay catches up (``per_batch`` per batch it re-runs; ``other``:
    a claim among them, which no replay re-runs). Each round runs exactly what is behind; rounds
    shrink; it stops with at most one batch left for the leases, or when the live stage keeps pace
    (the rest is caught up while it pauses), and after at most 5 rounds."""
    from deltawheel.executor.drivers.promote import close_gap
    from deltawheel.statestore.inspection.positions import ComputationCommit

    live: list[ComputationCommit] = []
    reached = [-1]
    debt = [0.0]

    def land(n: int) -> None:
        for _ in range(n):
            v = len(live)
            claim = other and v % 4 == 3
            live.append(ComputationCommit(version=v, timestamp_ms=0, kind="claim" if claim else "batch",
                                          batch_id=None if claim else v, files=() if claim else ("f",),
                                          input_ms=None, late_ms=None))

    def behind_now() -> list[int]:
        return [c.version for c in live if c.version > reached[0] and c.reruns]

    ran: list[list[int]] = []

    def catch_up(todo: Any) -> None:
        assert [c.version for c in todo] == behind_now()  # exactly what is behind, oldest first
        ran.append([c.version for c in todo])
        reached[0] = live[-1].version
        debt[0] += per_batch * len(todo)
        land(int(debt[0]))
        debt[0] -= int(debt[0])

    land(gap)
    rounds = close_gap(lambda: list(live), lambda: reached[0], catch_up)
    assert rounds == [len(r) for r in ran] and len(rounds) <= 5
    assert all(a > b for a, b in itertools.pairwise(rounds))  # each round shorter than the one before
    left = len(behind_now())
    assert left <= 1 or (rounds and left >= rounds[-1]) or len(rounds) == 5
    if per_batch <= 0.5 and gap <= 16:  # a replay twice as fast as the live stage closes the gap
        assert left <= 1


def test_a_replay_behind_the_live_position_is_refused_without_catch_up(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, tmp_path) -> None:
    from deltawheel.executor.drivers.promote import promote
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.surgery.audit import read_audit
    from deltawheel.statestore.zk.client import connect
    from executor_util import BucketCounter, events, start_executor, state_of, stop_executor

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 0, input_watermark_ms=None)
    first = computation_commits(spark, migrated_store, "buckets")[-1].version
    ex.run_batch(events(spark, [("r2", "cats", 2_000)]), 1, input_watermark_ms=None)
    stop_executor(ex, client)
    into = tmp_path / "shadow"
    _marker(into, store=os.path.realpath(migrated_store.root), pipeline="test", computation="buckets",
            reached=first, from_version=first)
    before = state_of(spark, migrated_store, "buckets")
    client = connect(zk_config)
    try:
        with pytest.raises(ReplayTargetError, match="is 1 live batches behind the live input position"):
            promote(spark, store=migrated_store, into=StoreLayout(str(into)), client=client, pipeline="test",
                    code=BucketCounter(), catch_up=False)
    finally:
        client.stop()
        client.close()
    assert state_of(spark, migrated_store, "buckets") == before
    assert read_audit(spark, migrated_store) == []


def _state(spark: Any, rows: str, computation: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    df = spark.read.format("delta").load(rows).where((F.col("computation") == computation)
                                                     & ~F.col("key").startswith("\x00"))
    return {r["key"]: json.loads(r["state"]) for r in df.collect() if r["state"] is not None}


def _predictions(spark: Any, store: Path) -> list[tuple[str, int, Any]]:
    """(key, timestamp, decoded value) of every prediction delivered, sorted."""
    return sorted(((r["key"], r["timestamp_ms"], json.loads(r["value"])) for r in spark.read.format("delta").load(
        f"{store}/streams/predictions").collect()), key=lambda p: (p[0], p[1]))


def _pipeline(folder: Path, delay_ms: int) -> Any:
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.sources.parquet import ParquetInjector

    from deltawheel.demo.pipeline import Model, window_counter

    inj = ParquetInjector("queries", str(folder), key_column="query", event_time_column="event_time",
                          record_id_column="record_id", max_files_per_trigger=1, watermark_delay_ms=delay_ms)
    return Pipeline("zeitgeist", (inj,), (window_counter(), Model()))


@pytest.mark.slow  # a live pipeline, a replay, a promotion while it runs, and a reference run (minutes)
@pytest.mark.timeout(2400)
def test_promote_racing_a_running_pipeline(spark, zk_server, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The pipeline runs (a thread, following its input folder) while a replay of ``model`` with
    changed code is promoted: it hands the model's intervals over at a batch boundary, the tool
    catches the replay up under the leases and replaces the state, the pipeline goes on. Its final
    rows are the promoted state plus what came after (the promoted ``panes`` count as promoted, the
    rest as an uninterrupted run of the model over the panes the live window_counter delivered), its
    predictions that run's: none twice, none lost."""
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout

    from deltawheel.demo.zeitgeist import ZeitgeistParams, write_event_files

    params = ZeitgeistParams(n_events=6 * PER_FILE, seed=11, rate_per_s=20, n_queries=8)
    data = params.generate()
    folder, store = tmp_path / "input", tmp_path / "store"
    layout = StoreLayout(str(store))
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/promote-{uuid.uuid4().hex[:8]}")

    def files(n: int) -> None:
        write_event_files(data.slice(0, n * PER_FILE), str(folder), events_per_batch=PER_FILE,
                          first_mtime_s=params.start_ms // 1000)

    files(2)
    PipelineRunner(spark, layout, _pipeline(folder, params.max_disorder_ms), zk=zk, end_of_input=False, progress=lambda line: None).run()
    start = computation_commits(spark, layout, "model")[-1].version
    into = tmp_path / "shadow"
    zk_args = ["--zk", zk.hosts, "--zk-chroot", zk.chroot]
    assert main(["replay", "--store", str(store), "--pipeline", "zeitgeist", "--computation", "model",
                 "--from-version", str(start), "--code", "promote_model:TaggedModel", "--into", str(into),
                 *zk_args]) == 0
    capsys.readouterr()

    stop, failed, lines = threading.Event(), [], []
    runner = PipelineRunner(spark, layout, _pipeline(folder, params.max_disorder_ms), zk=zk, end_of_input=False, progress=lines.append,
                            follow=stop.is_set, poll_s=0.3)

    def run() -> None:
        try:
            runner.run()
        except BaseException as exc:  # the test fails on it below
            failed.append(exc)

    t = threading.Thread(target=run, name="live-pipeline")
    t.start()
    try:
        files(4)
        deadline = time.monotonic() + 600
        while not [c for c in computation_commits(spark, layout, "model") if c.version > start and c.files]:
            # until a batch of the model commits after the replay's start: the replay is behind then
            assert time.monotonic() < deadline and not failed, failed
            time.sleep(1)
        argv = ["promote", "--from", str(into), "--store", str(store), "--pipeline", "zeitgeist",
                "--computation", "model", *zk_args]
        assert main([*argv, "--plan"]) == 0
        out = capsys.readouterr().out
        assert "batches to catch up first, under the leases" in out and "would take the leases" in out
        assert main([*argv, "--no-wait"]) == _exit_of_lease_held()  # a running owner: refused at once
        assert "--no-wait: intervals" in capsys.readouterr().err
        assert not os.path.exists(layout.audit)  # neither wrote anything
        files(6)  # more input while the promotion runs: the pipeline's batch in flight, and after
        assert main([*argv, "--wait", "600"]) == 0
        out = capsys.readouterr().out
        assert "promoted" in out and "catching up" in out, out
        promoted = _state(spark, StoreLayout(str(into)).rows_of("model"), "model")
        deadline = time.monotonic() + 900
        while not _all_read(spark, layout):
            assert time.monotonic() < deadline and not failed, failed
            time.sleep(2)
    finally:
        stop.set()
        t.join(timeout=600)
    assert not failed, failed
    assert any("handing intervals over to promote" in line for line in lines), lines[-20:]

    # the audit record, as a user reads it
    assert main(["sql", "--store", str(store), "--format", "json",
                 "SELECT tool, source, computation, rows_changed, commit_version FROM audit"]) == 0
    (audit,) = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    kinds = {int(h["version"]): json.loads(h["userMetadata"]).get("kind") for h in spark.sql(
        f"DESCRIBE HISTORY delta.`{layout.rows_of('model')}`").collect() if h["userMetadata"]}
    assert audit["tool"] == "promote" and audit["source"] == str(into) and audit["computation"] == "model"
    assert kinds[audit["commit_version"]] == "promote" and audit["rows_changed"] == len(promoted)

    # what an uninterrupted run of the model makes of the panes the live window_counter delivered
    live, expected = _state(spark, layout.rows_of("model"), "model"), expected_model(spark, store)
    assert set(live) == set(expected[0])
    assert any(st.get("panes") for st in promoted.values())  # the changed code's field ...
    for key, st in live.items():
        assert st.get("panes") == promoted.get(key, {}).get("panes")  # ... as promoted (live code keeps it)
        assert {k: v for k, v in st.items() if k != "panes"} == expected[0][key]  # the rest: what came after
    got = _predictions(spark, store)
    assert len({(k, ts) for k, ts, _ in got}) == len(got)  # none twice
    assert got == expected[1]  # none lost, the values an uninterrupted run gives


def expected_model(spark: Any, store: Path) -> tuple[dict[str, Any], list[tuple[str, int, Any]]]:
    """(per query, the demo model's state; its predictions as (key, timestamp, value), sorted) after
    every on-time pane of the store's window_counts stream, each window once, in window order: what
    an uninterrupted run of the model makes of that input (windows without a pane count 0)."""
    from deltawheel.demo.pipeline import HISTORY, WINDOW_MS

    panes: dict[str, dict[int, int]] = {}
    for r in spark.read.format("delta").load(f"{store}/streams/window_counts").collect():
        v = json.loads(r["value"])
        if v.get("retraction") or v.get("timing") == "LATE":
            continue
        panes.setdefault(r["key"], {}).setdefault(int(v["window_start"]), int(v["value"]))
    states, preds = {}, []
    for q, by_start in panes.items():
        st: dict[str, Any] = {"hist": [], "avg": None, "last": None}
        for s in range(min(by_start), max(by_start) + WINDOW_MS, WINDOW_MS):
            actual = by_start.get(s, 0)
            if st["avg"] is not None and len(st["hist"]) >= 3:
                preds.append((q, s + WINDOW_MS, {"query": q, "window_start": s, "actual": actual,
                                                 "expected": round(st["avg"], 3)}))
            st["avg"] = actual if st["avg"] is None else 0.7 * st["avg"] + 0.3 * actual
            st["hist"] = (st["hist"] + [[s, actual]])[-HISTORY:]
        st["last"] = max(by_start)
        states[q] = st
    return states, sorted(preds, key=lambda p: (p[0], p[1]))


def _exit_of_lease_held() -> int:
    from deltawheel.statestore.exceptions import LeaseHeldError, exit_code

    return exit_code(LeaseHeldError("x"))


def _all_read(spark: Any, layout: Any) -> bool:
    """The live pipeline read every input file and the model every window_counts file delivered."""
    from deltawheel.statestore.inspection.positions import computation_commits

    counter = {f for c in computation_commits(spark, layout, "window_counter") for f in c.files or ()}
    if "part-00005.parquet" not in counter:
        return False
    read = {f for c in computation_commits(spark, layout, "model") for f in c.files or ()}
    delivered = {f"window_counts/{n}" for n in os.listdir(layout.stream("window_counts")) if n.endswith(".parquet")}
    return delivered <= read
