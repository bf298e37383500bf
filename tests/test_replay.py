"""Replay: input positions per commit, ``deltawheel replay`` into a shadow
store, and the diff against the live store; real Spark, ZooKeeper and Delta.

The live store: the demo's ``window_counter`` and ``model`` over generated queries, run three times
on a growing input folder (2, 4, then 6 files), so ``model`` has commits in the middle of the run.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from deltawheel.cli import main

pytestmark = pytest.mark.spark

EVENTS, PER_FILE = 3_000, 500


def _params() -> Any:
    from deltawheel.demo.zeitgeist import ZeitgeistParams

    return ZeitgeistParams(n_events=EVENTS, seed=11, rate_per_s=20, n_queries=8)


def _run_live(spark: Any, store: Path, zk: Any, files: int) -> None:
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.layout import StoreLayout
    from replay_source import pipeline_for

    from deltawheel.demo.zeitgeist import write_event_files

    params = _params()
    folder = str(store.parent / "input")
    write_event_files(params.generate().slice(0, files * PER_FILE), folder, events_per_batch=PER_FILE,
                      first_mtime_s=params.start_ms // 1000)
    PipelineRunner(spark, StoreLayout(str(store)), pipeline_for(folder, disorder_ms=params.max_disorder_ms),
                   zk=zk, end_of_input=False, progress=lambda line: None).run()


@pytest.fixture(scope="module")
def live(spark, zk_server, tmp_path_factory):  # type: ignore[no-untyped-def]
    """(store path, the model's commits after each of the three runs)."""
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout

    store = tmp_path_factory.mktemp("replay") / "store"
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/live-{uuid.uuid4().hex[:8]}")
    ends = []
    for files in (2, 4, 6):
        _run_live(spark, store, zk, files)
        ends.append(computation_commits(spark, StoreLayout(str(store)), "model")[-1].version)
    return store, ends, zk


@pytest.mark.slow  # the live store: three runs of the pipeline (about 3 min)
def test_every_batch_commit_records_its_input_positions(spark, live) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.inspection.positions import computation_commits, position_at, replay_horizon
    from deltawheel.statestore.layout import StoreLayout

    store, ends, _ = live
    layout = StoreLayout(str(store))
    model = [c for c in computation_commits(spark, layout, "model") if c.kind != "claim"]
    assert replay_horizon(model) is None  # every commit records them: replayable from the start
    read = [f for c in model for f in (c.files or ())]
    # the model reads the data files of window_counts: each exactly once over the run
    assert read and all(f.startswith("window_counts/") for f in read)
    assert len(read) == len(set(read))
    delivered = {f"window_counts/{n}" for n in os.listdir(layout.stream("window_counts")) if n.endswith(".parquet")}
    assert set(read) <= delivered
    assert position_at(model, ends[0]) < position_at(model, ends[2])  # type: ignore[operator]
    counter = [c for c in computation_commits(spark, layout, "window_counter") if c.kind != "claim" and c.files]
    # window_counter reads the injector's files, one per micro-batch
    assert sorted(f for c in counter for f in c.files or ()) == [f"part-{i:05d}.parquet" for i in range(6)]


@pytest.mark.slow  # the live store: three runs of the pipeline (about 3 min)
def test_replay_of_unchanged_code_from_the_middle_gives_an_empty_diff(spark, live, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    store, ends, zk = live
    into, out = tmp_path / "shadow", tmp_path / "diff.json"
    argv = ["replay", "--store", str(store), "--pipeline", "zeitgeist", "--computation", "model",
            "--from-version", str(ends[0]), "--into", str(into), "--zk", zk.hosts, "--zk-chroot", zk.chroot,
            "--diff-out", str(out)]
    # up to the second run's end first: compared with the live store as of that version
    rc = main([*argv, "--to-version", str(ends[1])])
    got = capsys.readouterr()
    assert rc == 0, got.out + got.err
    d = json.loads(out.read_text())
    assert d["empty"] and d["version_a"] == ends[1], got.out
    # the same command again, to now: continues with the later batches only
    rc = main(argv)
    got = capsys.readouterr()
    text = got.out
    assert rc == 0, text + got.err
    assert f"continues a replay that reached rows version {ends[1]}" in text
    d = json.loads(out.read_text())
    assert d["empty"] and d["version_a"] == ends[2], text
    # it did replay something: the shadow store has the productions of the replayed batches
    from deltawheel.statestore.layout import StoreLayout

    shadow = spark.read.format("delta").load(StoreLayout(str(into)).stream("predictions")).count()
    assert shadow > 0
    assert "no difference" in text


def _series(spark: Any, store: Path) -> dict[str, list[tuple[int, int]]]:
    """Per query, (window start, count) of every window from its first one on (a window without an
    on-time pane counts 0), from the live window_counts stream: the model's input, read directly."""
    from deltawheel.demo.pipeline import WINDOW_MS

    panes: dict[str, dict[int, int]] = {}
    for r in spark.read.format("delta").load(f"{store}/streams/window_counts").collect():
        v = json.loads(r["value"])
        if v.get("retraction") or v.get("timing") == "LATE":
            continue
        panes.setdefault(r["key"], {}).setdefault(int(v["window_start"]), int(v["value"]))
    out = {}
    for q, by_start in panes.items():
        first, last = min(by_start), max(by_start)
        out[q] = [(s, by_start.get(s, 0)) for s in range(first, last + WINDOW_MS, WINDOW_MS)]
    return out


def _expected(series: list[tuple[int, int]]) -> dict[int, tuple[float, float]]:
    """Window start -> (the exponential average's prediction, the 3-window mean's), for every window
    predicted (three windows known before it)."""
    out: dict[int, tuple[float, float]] = {}
    avg = None
    for i, (s, actual) in enumerate(series):
        if avg is not None and i >= 3:
            out[s] = (round(avg, 3), round(sum(a for _, a in series[i - 3:i]) / 3, 3))
        avg = actual if avg is None else 0.7 * avg + 0.3 * actual
    return out


@pytest.mark.slow  # the live store: three runs of the pipeline (about 3 min)
def test_replay_with_a_changed_moving_average_differs_exactly_where_the_window_matters(  # type: ignore[no-untyped-def]
        spark, live, tmp_path, capsys) -> None:
    from deltawheel.statestore.layout import StoreLayout

    from deltawheel.demo.pipeline import WINDOW_MS

    store, ends, zk = live
    into, out = tmp_path / "shadow", tmp_path / "diff.json"
    rc = main(["replay", "--store", str(store), "--pipeline", "zeitgeist", "--computation", "model",
               "--from-version", str(ends[0]), "--code", "replay_model:WindowModel", "--into", str(into),
               "--zk", zk.hosts, "--zk-chroot", zk.chroot, "--diff-out", str(out)])
    got = capsys.readouterr()
    text = got.out
    assert rc == 0, text + got.err
    d = json.loads(out.read_text())
    # what the live model predicted after the start version: the productions of its later commits
    early = {json.loads(r["userMetadata"])["commit_id"] for r in spark.sql(
        f"DESCRIBE HISTORY delta.`{store}/computations/model/rows`").collect()
        if r["userMetadata"] and r["version"] <= ends[0] and json.loads(r["userMetadata"]).get("computation") == "model"}
    live_preds = {(r["key"], r["timestamp_ms"]): json.loads(r["value"]) for r in spark.read.format("delta").load(
        f"{store}/streams/predictions").collect() if r["commit_id"] not in early}
    shadow_preds = {(r["key"], r["timestamp_ms"]): json.loads(r["value"]) for r in spark.read.format("delta").load(
        StoreLayout(str(into)).stream("predictions")).collect()}
    assert live_preds and set(shadow_preds) == set(live_preds)  # the same windows predicted, nothing more or less
    series = _series(spark, store)
    differs = set()
    for (q, ts), p in live_preds.items():
        ema, mean = _expected(series[q])[ts - WINDOW_MS]
        assert p["expected"] == ema  # the live code's, computed here independently
        assert shadow_preds[(q, ts)]["expected"] == mean  # the replayed code's
        if ema != mean:
            differs.add((q, ts))
    assert differs  # the window matters somewhere ...
    assert d["counts"]["productions_changed"] == len(differs)  # ... and exactly there
    assert d["counts"]["productions_only_a"] == d["counts"]["productions_only_b"] == 0
    # the state does not depend on how predictions are made: no key differs
    assert d["counts"]["added"] == d["counts"]["removed"] == d["counts"]["changed"] == 0
    assert {(s["key"], s["timestamp_ms"]) for s in d["samples"]["productions_changed"]} <= differs


def _plan(spark: Any, store: Any, into: Any, **kw: Any) -> Any:
    from deltawheel.executor.drivers.replay import plan_replay
    from deltawheel.statestore.layout import StoreLayout

    args = {"pipeline": "zeitgeist", "computation": "model", **kw}
    return plan_replay(spark, store=StoreLayout(str(store)), into=StoreLayout(str(into)), **args)


@pytest.mark.slow  # the live store: three runs of the pipeline (about 3 min)
def test_plan_says_what_it_reads_and_writes(spark, live, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    store, ends, _ = live
    rc = main(["replay", "--store", str(store), "--pipeline", "zeitgeist", "--computation", "model",
               "--from-version", str(ends[1]), "--into", str(tmp_path / "shadow"), "--plan"])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"from rows version {ends[1]} up to rows version {ends[2]}" in out
    assert "input files of 1 batches" in out and "no live lease is taken" in out
    assert not (tmp_path / "shadow").exists()  # a plan writes nothing
    plan = _plan(spark, store, tmp_path / "shadow", from_start=True)
    assert plan.from_version is None and len(plan.batches) >= 3 and plan.input_bytes


@pytest.mark.slow  # the live store: three runs of the pipeline (about 3 min)
def test_refusals_name_what_is_wrong(spark, live, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.exceptions import (
        ConfigError,
        NotAStoreError,
        ReplayTargetError,
        ReplayUnavailableError,
    )

    store, ends, _ = live
    into = tmp_path / "shadow"
    with pytest.raises(NotAStoreError, match="has no rows table"):
        _plan(spark, tmp_path / "nowhere", into, from_start=True)
    with pytest.raises(ConfigError, match="pipeline 'other' has never run on store"):
        _plan(spark, store, into, pipeline="other", from_start=True)
    with pytest.raises(ConfigError, match="computation 'nope' has no commit"):
        _plan(spark, store, into, computation="nope", from_start=True)
    with pytest.raises(ConfigError, match="exactly one of --from-version"):
        _plan(spark, store, into, from_start=True, from_version=ends[0])
    with pytest.raises(ReplayUnavailableError, match="rows version 100000 does not exist"):
        _plan(spark, store, into, from_version=100_000)
    with pytest.raises(ReplayUnavailableError, match="no version at or before 1000 ms"):
        _plan(spark, store, into, from_timestamp_ms=1000)
    with pytest.raises(ReplayTargetError, match="is the live store"):
        _plan(spark, store, store, from_start=True)
    into.mkdir()
    (into / "something").write_text("x")
    with pytest.raises(ReplayTargetError, match="is not empty: it holds files that are not a replay"):
        _plan(spark, store, into, from_start=True)
    (into / "something").unlink()
    (into / "_replay.json").write_text(json.dumps({"store": os.path.realpath(store), "pipeline": "zeitgeist",
                                                   "computation": "detector", "from_version": None, "reached": 3}))
    with pytest.raises(ReplayTargetError, match="computation 'detector'"):
        _plan(spark, store, into, from_start=True)
    # the command line: the same refusal, exit status 3, nothing written
    assert main(["replay", "--store", str(store), "--pipeline", "zeitgeist", "--computation", "model", "--from-start",
                 "--code", "replay_model:Nope", "--into", str(tmp_path / "s2")]) == 3
    assert not (tmp_path / "s2").exists()


@pytest.mark.slow  # the live store: three runs of the pipeline (about 3 min)
def test_a_replay_needing_input_or_positions_that_are_gone_is_refused_with_the_horizon(  # type: ignore[no-untyped-def]
        spark, live, tmp_path) -> None:
    import shutil

    from deltawheel.statestore.exceptions import InputGoneError, ReplayUnavailableError
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout

    src, ends, _ = live
    store = tmp_path / "copy" / "store"
    shutil.copytree(src, store)
    layout = StoreLayout(str(store))
    last = computation_commits(spark, layout, "model")[-1]
    gone = next(f for f in last.files or () if f.startswith("window_counts/"))
    os.remove(os.path.join(layout.stream("window_counts"), gone.split("/", 1)[1]))
    with pytest.raises(InputGoneError, match=f"{gone} was removed .* replay from rows version {last.version} or later"):
        _plan(spark, store, tmp_path / "shadow", from_version=ends[0])
    shutil.copy(os.path.join(StoreLayout(str(src)).stream("window_counts"), gone.split("/", 1)[1]),
                layout.stream("window_counts"))
    # a commit of a tool to the model's rows table (no input positions; here it changes no row) moves the horizon
    from deltawheel.statestore.delta.txn import TableLog

    TableLog(spark, layout.rows_of("model")).commit(
        user_metadata=json.dumps({"computation": "model", "kind": "repair"}))
    horizon = computation_commits(spark, layout, "model")[-1].version
    with pytest.raises(ReplayUnavailableError, match=f"replay from version {horizon} or later"):
        _plan(spark, store, tmp_path / "shadow", from_version=ends[0])
    with pytest.raises(ReplayUnavailableError, match=f"use --from-version {horizon} or later"):
        _plan(spark, store, tmp_path / "shadow", from_start=True)


@pytest.mark.slow  # the live store: three runs of the pipeline (about 3 min)
def test_diff_of_two_stores_from_the_command_line(spark, live, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    store, ends, _ = live
    out = tmp_path / "d.json"
    assert main(["diff", "--store", str(store), "--store", str(store), "--computation", "model",
                 "--stream", "predictions"]) == 0
    assert "no difference" in capsys.readouterr().out
    # the model's state as of the first run's end against its newest: keys changed, none removed
    rc = main(["diff", "--store", str(store), "--store", str(store), "--computation", "model", "--as-of",
               str(ends[0]), "--diff-out", str(out)])
    assert rc == 1
    d = json.loads(out.read_text())
    assert d["counts"]["changed"] > 0 and d["counts"]["removed"] == 0
    s = d["samples"]["changed"][0]
    assert s["a"]["last"] < s["b"]["last"]  # decoded: the newer state has seen later windows


def test_code_must_import_and_be_the_computation_of_that_name() -> None:
    """``--code`` as a user gives it: MODULE:CLASS, checked before anything runs."""
    from deltawheel.executor.drivers.replay import load_code
    from deltawheel.statestore.exceptions import ReplayCodeError

    from deltawheel.demo.pipeline import Model

    with pytest.raises(ReplayCodeError, match="does not import"):
        load_code("no_such_module_here:Model", "model")
    with pytest.raises(ReplayCodeError, match="give MODULE:CLASS"):
        load_code("replay_model", "model")
    with pytest.raises(ReplayCodeError, match="not a Computation"):
        load_code("json:JSONDecoder", "model")
    with pytest.raises(ReplayCodeError, match="is computation 'detector', not 'model'"):
        load_code("deltawheel.demo.pipeline:Detector", "model")
    made = load_code("replay_model:WindowModel", "model")
    assert isinstance(made, Model) and type(made).__name__ == "WindowModel"


def test_a_checkpoint_the_readers_do_not_reach_records_no_positions_and_runs(tmp_path: Path) -> None:
    """Positions are read from the query checkpoint's logs: locally, or on ``s3a://`` with the
    session's S3 settings (tests/test_s3a_positions.py). Without a session to take them from, or on
    another object store, the driver records none (replay refuses there) instead of failing every
    batch."""
    from deltawheel.executor.computation import RECORD_KEY, Computation
    from deltawheel.executor.drivers.wiring import positions_recorder
    from deltawheel.statestore.layout import StoreLayout

    class Down(Computation):
        name = "down"
        inputs = {"up": RECORD_KEY}

        def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
            pass

    local = StoreLayout(str(tmp_path / "store"))
    assert positions_recorder(Down(), {}, layout=local, checkpoint=str(tmp_path / "ck")) is not None
    remote = StoreLayout("s3a://bucket/store")
    assert positions_recorder(Down(), {}, layout=remote, checkpoint="s3a://bucket/store/_checkpoints/p/down") is None
    other = StoreLayout("abfss://c@acct.dfs.core.windows.net/store")
    assert positions_recorder(Down(), {}, layout=other, spark=object(),
                              checkpoint="abfss://c@acct.dfs.core.windows.net/store/_checkpoints/p/down") is None


def test_a_selection_of_intervals_or_keys_is_checked_before_anything_runs(tmp_path: Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``--intervals`` / ``--keys`` as a user gives them: refused before Spark starts, nothing written."""
    from deltawheel.executor.drivers.promote import promote_intervals
    from deltawheel.executor.drivers.replay import replay_scope
    from deltawheel.statestore.exceptions import ConfigError, ReplayTargetError
    from deltawheel.statestore.rowtable.rows import interval_of

    with pytest.raises(ConfigError, match=r"intervals 0\.\.3; \[4, 9\] out of range"):
        replay_scope(4, intervals=[1, 4, 9])
    with pytest.raises(ConfigError, match="give --intervals or --keys, not both"):
        replay_scope(4, intervals=[1], keys=["q1"])
    with pytest.raises(ConfigError, match="give one or more non-empty keys"):
        replay_scope(4, keys=["q1", ""])
    assert replay_scope(4, keys=["q000001", "q000002"]) == tuple(sorted({interval_of("q000001", 4),
                                                                         interval_of("q000002", 4)}))
    assert replay_scope(4, intervals=[3, 1, 3]) == (1, 3) and replay_scope(4) is None
    # a promotion of a partial replay: only the intervals it replayed
    assert promote_intervals({"intervals": [1, 3]}, None, 4, into="s") == (1, 3)
    assert promote_intervals({"intervals": None}, [2], 4, into="s") == (2,)
    with pytest.raises(ReplayTargetError, match=r"replayed only intervals \[1, 3\], not \[2\]"):
        promote_intervals({"intervals": [1, 3]}, [1, 2], 4, into="s")
    with pytest.raises(ConfigError, match=r"intervals 0\.\.3; \[7\] out of range"):
        promote_intervals({"intervals": None}, [7], 4, into="s")
    base = ["replay", "--store", str(tmp_path / "store"), "--pipeline", "zeitgeist", "--computation", "model",
            "--from-start", "--into", str(tmp_path / "shadow")]
    assert main([*base, "--intervals", "0,4"]) == 3
    assert "[4] out of range" in capsys.readouterr().err
    assert main([*base, "--intervals", "0", "--keys", "q1"]) == 3
    assert "not both" in capsys.readouterr().err
    assert main([*base, "--intervals", "one"]) == 3
    assert "give interval numbers separated by commas" in capsys.readouterr().err
    # the Python API needs the computation's number of intervals for a selection; so does a diff
    from deltawheel.executor.drivers.replay import plan_replay
    from deltawheel.statestore.inspection.diff import diff_stores
    from deltawheel.statestore.layout import StoreLayout

    with pytest.raises(ConfigError, match="needs the computation's num_intervals"):
        plan_replay(None, store=StoreLayout(str(tmp_path / "store")), into=StoreLayout(str(tmp_path / "shadow")),
                    pipeline="zeitgeist", computation="model", from_start=True, keys=["q1"])
    with pytest.raises(ConfigError, match="intervals need the computation's num_intervals"):
        diff_stores(None, StoreLayout("a"), StoreLayout("b"), "model", intervals=[1])
    # --source names the live pipeline; its computation must be there
    from replay_source import INPUT_ENV

    monkeypatch.setenv(INPUT_ENV, str(tmp_path / "input"))
    monkeypatch.setenv("PYTHONPATH", "")  # --source puts its module's folder there; undone after the test
    (tmp_path / "input").mkdir()
    assert main([*base[:6], "nope", *base[7:], "--source", "replay_source:pipeline"]) == 3
    assert "has no computation 'nope' (it has window_counter, model)" in capsys.readouterr().err
    assert not (tmp_path / "shadow").exists() and not (tmp_path / "store").exists()


@pytest.mark.slow  # the live store: three runs of the pipeline (about 3 min)
@pytest.mark.timeout(2400)
def test_a_computation_fed_by_an_injector_is_replayed_with_the_live_pipeline_as_source(  # type: ignore[no-untyped-def]
        spark, live, tmp_path, capsys, monkeypatch) -> None:
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout
    from replay_source import INPUT_ENV

    store, ends, zk = live
    monkeypatch.setenv(INPUT_ENV, str(store.parent / "input"))
    monkeypatch.setenv("PYTHONPATH", "")  # --source puts its module's folder there; undone after the test
    batches = [c for c in computation_commits(spark, StoreLayout(str(store)), "window_counter") if c.reruns]
    start = batches[len(batches) // 2].version
    into, out = tmp_path / "shadow", tmp_path / "diff.json"
    argv = ["replay", "--store", str(store), "--pipeline", "zeitgeist", "--computation", "window_counter",
            "--from-version", str(start), "--into", str(into), "--zk", zk.hosts, "--zk-chroot", zk.chroot,
            "--diff-out", str(out)]
    assert main(argv) == 3  # an injector feeds it: the command says what to pass
    assert "give the live pipeline with --source MODULE:PIPELINE" in capsys.readouterr().err
    assert not into.exists()
    rc = main([*argv, "--source", "replay_source:pipeline"])
    got = capsys.readouterr()
    assert rc == 0, got.out + got.err
    d = json.loads(out.read_text())
    assert d["empty"], got.out
    assert spark.read.format("delta").load(StoreLayout(str(into)).stream("window_counts")).count() > 0


@pytest.mark.slow  # the live store: three runs of the pipeline (about 3 min)
@pytest.mark.timeout(2400)
def test_a_replay_whose_input_file_was_deleted_is_refused_with_what_to_do(  # type: ignore[no-untyped-def]
        spark, live, tmp_path, capsys, monkeypatch) -> None:
    import shutil

    from deltawheel.executor.drivers.replay import plan_replay, replay
    from deltawheel.statestore.exceptions import InputGoneError
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout
    from replay_source import INPUT_ENV, pipeline_for

    store, _, zk = live
    layout = StoreLayout(str(store))
    batches = [c for c in computation_commits(spark, layout, "window_counter") if c.reruns]
    start = batches[len(batches) // 2].version
    later = [c for c in batches if c.version > start and c.files]
    assert len(later) >= 2
    folder = tmp_path / "input"  # the live input, one file of the newest batch deleted
    shutil.copytree(store.parent / "input", folder)
    gone = later[-1].files[0]  # type: ignore[index]
    (folder / gone).unlink()
    monkeypatch.setenv(INPUT_ENV, str(folder))
    monkeypatch.setenv("PYTHONPATH", "")  # --source puts its module's folder there; undone after the test
    into = tmp_path / "shadow"
    argv = ["replay", "--store", str(store), "--pipeline", "zeitgeist", "--computation", "window_counter",
            "--from-version", str(start), "--into", str(into), "--source", "replay_source:pipeline"]
    said = (rf"window_counter: the input of live batch {later[-1].batch_id} \(rows version {later[-1].version}\) is "
            rf"gone: 1 of its input files \(e.g. {gone}\) are no longer in {folder}\. A replay re-reads the input "
            rf"files of every batch it re-runs: restore them there \(the same names; .*\), or replay from rows "
            rf"version {later[-1].version} or later \(--from-version {later[-1].version}\)")
    # the command, with --plan or without: refused before anything is written, the replay's advice
    for extra in (["--plan"], ["--zk", zk.hosts, "--zk-chroot", zk.chroot]):
        assert main([*argv, *extra]) == 3
        err = capsys.readouterr().err
        assert re.search(said, err), err
        assert "moved interval" not in err
        assert not into.exists()
    # a file gone while the replay runs: refused before the batch reading it, with the same advice
    (folder / gone).write_bytes((store.parent / "input" / gone).read_bytes())
    second = later[1].files[0]  # type: ignore[index]
    plan = plan_replay(spark, store=layout, into=StoreLayout(str(into)), pipeline="zeitgeist",
                       computation="window_counter", from_version=start)
    ran: list[str] = []

    def progress(line: str) -> None:
        ran.append(line)
        if line.startswith("batch ") and (folder / second).exists():
            (folder / second).unlink()  # after the first replayed batch

    with pytest.raises(InputGoneError, match=rf"live batch {later[1].batch_id} \(rows version {later[1].version}\) "
                                             rf"is gone: 1 of its input files \(e\.g\. {second}\)"):
        replay(spark, plan, code=pipeline_for(str(folder)).computations[0], zk=None,
               injectors=pipeline_for(str(folder)).injectors, progress=progress)
    assert any(line.startswith("batch ") for line in ran)
    marker = json.loads((into / "_replay.json").read_text())
    assert start <= marker["reached"] < later[1].version  # where a second run continues


def _model_rows(spark: Any, rows: str) -> dict[str, tuple[int, Any]]:
    """key -> (interval, decoded state) of the model's rows (not the fence row, nor the rows of its
    dedup ids files: no state)."""
    from deltawheel.statestore.rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX

    return {r["key"]: (int(r["interval"]), json.loads(r["state"])) for r in spark.read.format("delta").load(rows)
            .where("computation = 'model'").collect()
            if r["key"] != FENCE_KEY and not r["key"].startswith(IDS_KEY_PREFIX)}


@pytest.mark.slow  # the live store: three runs of the pipeline (about 3 min); it promotes into it, so it runs last
@pytest.mark.timeout(2400)  # the live store, two replays and a promotion: over 10 min on a loaded machine
def test_a_replay_of_some_keys_diffs_only_them_and_its_promotion_replaces_only_their_intervals(  # type: ignore[no-untyped-def]
        spark, live, tmp_path, capsys) -> None:
    from deltawheel.executor.drivers.promote import promote
    from deltawheel.executor.drivers.replay import plan_replay, replay
    from deltawheel.statestore.exceptions import ReplayTargetError
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.rowtable.rows import interval_of
    from deltawheel.statestore.surgery.audit import read_audit
    from deltawheel.statestore.zk.client import connect
    from replay_model import TaggedModel

    from deltawheel.demo.pipeline import WINDOW_MS

    store, ends, zk = live
    layout = StoreLayout(str(store))
    before = _model_rows(spark, layout.rows_of("model"))
    by_interval: dict[int, list[str]] = {}
    for k, (iv, _) in before.items():
        by_interval.setdefault(iv, []).append(k)
    assert len(by_interval) >= 2
    key = sorted(before)[0]
    # the command line: one key, the changed moving average
    into, out = tmp_path / "one_key", tmp_path / "diff.json"
    rc = main(["replay", "--store", str(store), "--pipeline", "zeitgeist", "--computation", "model",
               "--from-version", str(ends[0]), "--keys", key, "--code", "replay_model:WindowModel",
               "--into", str(into), "--zk", zk.hosts, "--zk-chroot", zk.chroot, "--diff-out", str(out)])
    got = capsys.readouterr()
    assert rc == 0, got.out + got.err
    assert f"only intervals [{interval_of(key, 4)}] (those of keys ['{key}']" in got.out
    d = json.loads(out.read_text())
    # the shadow store holds only the key's interval
    assert {iv for iv, _ in _model_rows(spark, StoreLayout(str(into)).rows_of("model")).values()} == {interval_of(key, 4)}
    other = next(i for i in range(4) if i != interval_of(key, 4))
    with pytest.raises(ReplayTargetError, match=rf"holds a replay of intervals \[{interval_of(key, 4)}\], not \[{other}\]"):
        plan_replay(spark, store=layout, into=StoreLayout(str(into)), pipeline="zeitgeist", computation="model",
                    from_version=ends[0], intervals=[other], num_intervals=4)
    # the diff: the key's predictions that differ, nothing of the others
    early = {json.loads(r["userMetadata"])["commit_id"] for r in spark.sql(
        f"DESCRIBE HISTORY delta.`{store}/computations/model/rows`").collect()
        if r["userMetadata"] and r["version"] <= ends[0] and json.loads(r["userMetadata"]).get("computation") == "model"}
    series = _series(spark, store)[key]
    differs = []
    for r in spark.read.format("delta").load(f"{store}/streams/predictions").where(f"key = '{key}'").collect():
        if r["commit_id"] not in early:
            ema, mean = _expected(series)[r["timestamp_ms"] - WINDOW_MS]
            differs += [r["timestamp_ms"]] if ema != mean else []
    assert differs and d["counts"]["productions_changed"] == len(differs)
    assert d["counts"]["productions_only_a"] == d["counts"]["productions_only_b"] == 0  # other keys left out
    assert {s["key"] for s in d["samples"]["productions_changed"]} == {key}
    # the Python API: one interval, a code that changes the state; promoted without the pipeline running
    iv = next(i for i in sorted(by_interval) if i != interval_of(key, 4))
    tagged = tmp_path / "tagged"
    plan = plan_replay(spark, store=layout, into=StoreLayout(str(tagged)), pipeline="zeitgeist", computation="model",
                       from_version=ends[0], intervals=[iv], num_intervals=4)
    result = replay(spark, plan, code=TaggedModel(), zk=None)
    assert result.diff is not None and 0 < result.diff.counts["changed"] <= len(by_interval[iv])
    assert {s["key"] for s in result.diff.samples["changed"]} <= set(by_interval[iv])
    with pytest.raises(ReplayTargetError, match=rf"replayed only intervals \[{iv}\], not \[{interval_of(key, 4)}\]"):
        promote(spark, store=layout, into=StoreLayout(str(tagged)), client=None, pipeline="zeitgeist",
                code=TaggedModel(), intervals=[interval_of(key, 4)])
    main_promote = ["promote", "--from", str(tagged), "--store", str(store), "--pipeline", "zeitgeist",
                    "--computation", "model", "--code", "replay_model:TaggedModel"]
    assert main([*main_promote, "--intervals", str(interval_of(key, 4)), "--zk", zk.hosts,
                 "--zk-chroot", zk.chroot]) == 3  # the same refusal from the command line
    assert _model_rows(spark, layout.rows_of("model")) == before  # nothing changed
    client = connect(zk)
    try:
        r = promote(spark, store=layout, into=StoreLayout(str(tagged)), client=client, pipeline="zeitgeist",
                    code=TaggedModel(), wait_s=30)
    finally:
        client.stop()
        client.close()
    assert r.intervals == (iv,) and r.upserted
    after = _model_rows(spark, layout.rows_of("model"))
    tagged_keys = {k for k, (_, st) in after.items() if st.get("tag") == "fixed"}
    assert tagged_keys and tagged_keys <= set(by_interval[iv])  # only the replayed interval's keys were written
    assert {k: v for k, v in after.items() if v[0] != iv} == {k: v for k, v in before.items() if v[0] != iv}
    assert {k: v for k, v in after.items() if v[0] == iv} == _model_rows(spark, StoreLayout(str(tagged)).rows_of("model"))
    audit = [a for a in read_audit(spark, layout) if a["audit_id"] == r.audit_id]
    assert len(audit) == 1 and list(audit[0]["intervals"]) == [iv]
    # a replay from before the promotion crosses its commit and says the live state has a change it lacks
    later = plan_replay(spark, store=layout, into=StoreLayout(str(tmp_path / "again")), pipeline="zeitgeist",
                        computation="model", from_version=ends[0])
    assert [t.audit_id for t in later.tool_changes] == [r.audit_id] and later.horizon is None
    assert f"promote change at rows version {r.version} (audit id {r.audit_id})" in later.describe()
