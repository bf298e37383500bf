"""``deltawheel repair``: an UPDATE or DELETE of the decoded state view (MERGE,
timers and pending productions: test_repair_merge.py), one fenced
commit under the leases of the intervals it touches, audited; real Spark, ZooKeeper and Delta."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
from deltawheel.statestore.exceptions import RepairStatementError
from deltawheel.statestore.surgery.repair import parse_repair

from deltawheel.cli import main


def test_only_updates_and_deletes_of_the_state_view_are_repairs() -> None:
    with pytest.raises(RepairStatementError, match="not a repair statement: 'INSERT INTO"):
        parse_repair("INSERT INTO state VALUES (1)")
    with pytest.raises(RepairStatementError, match="not a repair statement: 'SELECT"):
        parse_repair("SELECT * FROM state")
    with pytest.raises(RepairStatementError, match="a repair changes the state, timers or pending_productions "
                                                   "view, not 'rows': the raw rows"):
        parse_repair("UPDATE rows SET state = NULL")
    with pytest.raises(RepairStatementError, match="only state_json can be set"):
        parse_repair("UPDATE state SET key = 'b' WHERE key = 'a'")
    s = parse_repair("update state set state_json = '{\"n\": 1}' where key = 'a';")
    assert (s.kind, s.expr, s.where) == ("update", "'{\"n\": 1}'", "key = 'a'")
    assert parse_repair("DELETE FROM state").where is None
    # the command line refuses before it starts Spark: exit status 3, nothing touched
    assert main(["repair", "--store", "/nonexistent/store", "--pipeline", "p", "--computation", "c",
                 "DROP TABLE state"]) == 3


def _sql(spark: Any, layout: Any, query: str) -> list[tuple[Any, ...]]:
    from deltawheel.statestore.inspection.sqlviews import sql_frame

    return [tuple(r) for r in sql_frame(spark, layout, query).collect()]


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.slow  # five commands, each its own Spark job set: minutes on a loaded machine
@pytest.mark.timeout(1200)
def test_repair_as_a_user_runs_it_plan_update_delete_and_refusals(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, capsys) -> None:
    from executor_util import BucketCounter, events, start_executor, state_of, stop_executor

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    ex.run_batch(events(spark, [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "cats", 3_000)]), 0,
                 input_watermark_ms=None)
    stop_executor(ex, client)
    before = state_of(spark, migrated_store, "buckets")
    base = ["repair", "--store", migrated_store.root, "--pipeline", "test", "--computation", "buckets",
            "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
    update = "UPDATE state SET state_json = '{\"0\": 7}' WHERE key = 'cats'"
    assert main([*base, "--plan", update]) == 0
    out = capsys.readouterr().out
    assert "would write 1 key and delete 0" in out and """'cats' (interval""" in out
    assert """{"0": 2} -> {"0": 7}""" in out
    assert state_of(spark, migrated_store, "buckets") == before  # the plan changed nothing

    # refusals: nothing changes, no audit record
    for stmt, msg in (("DELETE FROM state WHERE computation = 'other'", "names rows of computation 'other'"),
                      ("UPDATE state SET state_json = 'not json' WHERE key = 'cats'", "is not JSON"),
                      ("UPDATE state SET state_json = nosuchcolumn", "not valid on the state view")):
        assert main([*base, stmt]) == 3
        assert msg in capsys.readouterr().err
    from deltawheel.statestore.surgery.repair import plan_repair
    from deltawheel.statestore.zk.client import connect

    client = connect(zk_config)
    try:
        with pytest.raises(RepairStatementError, match="names rows of computation 'other'"):
            plan_repair(spark, migrated_store, client, pipeline="test", computation="buckets",
                        statement="DELETE FROM state WHERE computation = 'other'")
    finally:
        client.stop()
        client.close()
    assert state_of(spark, migrated_store, "buckets") == before

    assert main([*base, update]) == 0
    assert "repaired buckets: 1 keys written, 0 deleted" in capsys.readouterr().out
    assert main([*base, "DELETE FROM state WHERE key = 'dogs'"]) == 0
    capsys.readouterr()
    after = state_of(spark, migrated_store, "buckets")
    assert after == {"cats": ({"0": 7}, before["cats"][1])}  # cats' timer kept; dogs gone with its timer
    audit = _sql(spark, migrated_store, "SELECT tool, source, rows_changed, commit_version FROM audit "
                                        "ORDER BY recorded_ms")
    assert [(t, s, n) for t, s, n, _ in audit] == [("repair", update, 1),
                                                  ("repair", "DELETE FROM state WHERE key = 'dogs'", 1)]
    hist = {int(h["version"]): json.loads(h["userMetadata"]) for h in spark.sql(
        f"DESCRIBE HISTORY delta.`{migrated_store.rows_of('buckets')}`").collect() if h["userMetadata"]}
    assert all(hist[v]["kind"] == "repair" for *_, v in audit)
    # the read-only SQL tool stays read-only
    assert main(["sql", "--store", migrated_store.root, "DELETE FROM state WHERE key = 'cats'"]) != 0
    # the pipeline goes on from the repaired state
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    ex.run_batch(events(spark, [("r4", "cats", 4_000)]), 1, input_watermark_ms=None)
    stop_executor(ex, client)
    assert state_of(spark, migrated_store, "buckets")["cats"][0] == {"0": 8}


@pytest.mark.spark
@pytest.mark.slow  # a live pipeline, a repair while it runs, and a reference run (minutes)
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("how", ["update", "merge"])
def test_repair_racing_a_running_pipeline(spark, zk_server, tmp_path, capsys, how) -> None:  # type: ignore[no-untyped-def]
    """The demo pipeline runs (a thread, following its input folder) while one key of ``model`` is
    repaired (an UPDATE; or a MERGE from a JSON file, which also inserts a key): the pipeline hands
    the intervals over at a batch boundary and goes on. Its final rows are an uninterrupted run's
    (of the model over the panes the live window_counter delivered) with the repair applied (a
    field the model carries along; the inserted key), its predictions that run's: none twice,
    none lost."""
    import threading
    import time
    import uuid

    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from test_promote import PER_FILE, _all_read, _pipeline, _predictions, _state, expected_model

    from deltawheel.demo.zeitgeist import ZeitgeistParams, write_event_files

    params = ZeitgeistParams(n_events=6 * PER_FILE, seed=11, rate_per_s=20, n_queries=8)
    data = params.generate()
    folder, store = tmp_path / "input", tmp_path / "store"
    layout = StoreLayout(str(store))
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/repair-{uuid.uuid4().hex[:8]}")

    def files(n: int) -> None:
        write_event_files(data.slice(0, n * PER_FILE), str(folder), events_per_batch=PER_FILE,
                          first_mtime_s=params.start_ms // 1000)

    files(2)
    stop, failed, lines = threading.Event(), [], []
    runner = PipelineRunner(spark, layout, _pipeline(folder, params.max_disorder_ms), zk=zk, end_of_input=False,
                            progress=lines.append, follow=stop.is_set, poll_s=0.3)

    def run() -> None:
        try:
            runner.run()
        except BaseException as exc:  # the test fails on it below
            failed.append(exc)

    t = threading.Thread(target=run, name="live-pipeline")
    t.start()
    try:
        deadline = time.monotonic() + 600
        while not os.path.isdir(layout.rows_of("model")) or not _state(spark, layout.rows_of("model"), "model"):
            assert time.monotonic() < deadline and not failed, failed
            time.sleep(1)
        key = sorted(_state(spark, layout.rows_of("model"), "model"))[0]
        files(4)
        stmt = (f"UPDATE state SET state_json = regexp_replace(state_json, '^[{{]', '{{\"repaired\": 1, ') "
                f"WHERE key = '{key}'")
        if how == "merge":
            src = tmp_path / "patch.json"
            src.write_text(json.dumps({"q": key, "mark": 1}) + "\n" + json.dumps({"q": "zz-merged", "mark": 2}) + "\n")
            stmt = (f"MERGE INTO state USING json.`{src}` AS p ON state.key = p.q WHEN MATCHED THEN UPDATE SET "
                    "state_json = regexp_replace(state.state_json, '^[{]', concat('{\"repaired\": ', p.mark, ', ')) "
                    "WHEN NOT MATCHED THEN INSERT (key, state_json) VALUES (p.q, to_json(named_struct('repaired', p.mark)))")
        files(6)  # more input while the repair runs: the pipeline's batch in flight, and after
        assert main(["repair", "--store", str(store), "--pipeline", "zeitgeist", "--computation", "model",
                     "--zk", zk.hosts, "--zk-chroot", zk.chroot, "--wait", "600", stmt]) == 0
        assert f"repaired model: {1 if how == 'update' else 2} keys written" in capsys.readouterr().out
        deadline = time.monotonic() + 900
        while not _all_read(spark, layout):
            assert time.monotonic() < deadline and not failed, failed
            time.sleep(2)
    finally:
        stop.set()
        t.join(timeout=600)
    assert not failed, failed
    assert any("handing intervals over to repair" in line for line in lines), lines[-20:]
    (audit,) = _sql(spark, layout, "SELECT tool, source, rows_changed, commit_version FROM audit")
    kinds = {int(h["version"]): json.loads(h["userMetadata"]).get("kind") for h in spark.sql(
        f"DESCRIBE HISTORY delta.`{layout.rows_of('model')}`").collect() if h["userMetadata"]}
    assert audit[:3] == ("repair", stmt, 1 if how == "update" else 2) and kinds[audit[3]] == "repair"

    live, (expected, preds) = _state(spark, layout.rows_of("model"), "model"), expected_model(spark, store)
    merged = {"zz-merged": {"repaired": 2}} if how == "merge" else {}
    assert live == {**expected, key: {**expected[key], "repaired": 1}, **merged}
    got = _predictions(spark, store)
    assert len({(k, ts) for k, ts, _ in got}) == len(got)  # none twice
    assert got == preds  # none lost, the values an uninterrupted run gives


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.slow  # a continuous run of two stages and a repair while it runs (minutes on a loaded machine)
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_a_continuous_run_hands_intervals_over_to_a_repair(spark, zk_config, tmp_path, capsys,  # type: ignore[no-untyped-def]
                                                           fused: bool) -> None:
    """``deltawheel run``'s continuous queries: between batches the stage gives the requested
    intervals to the repair and takes them again; every output once, the repaired field kept. The
    run's ticks are an hour apart: the request itself wakes the idle stage (a ZooKeeper watch),
    which hands over at once, not at a tick that finds it idle; the tool gives the intervals back
    as soon as its commit landed, before its audit row. (The run then stops, and one with the usual
    ticks goes on: an idle stage's timers fire at its ticks.) Fused: the second stage runs in the first
    one's batches, which pause for the repair alike."""
    from continuous_pipeline import click_rows, closing_row, expected, make, outputs, write_file
    from deltawheel.statestore.layout import StoreLayout
    from test_continuous import wait_for
    from test_promote import _state

    import deltawheel

    rows = click_rows(160)
    folder, store = tmp_path / "input", tmp_path / "store"
    minutes = StoreLayout(str(store)).rows_of("user_minutes")  # user_minutes' rows table
    write_file(folder, "part-0.parquet", rows[:80])
    lines: list[str] = []
    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks") as engine:
        engine.progress = lines.append
        run = engine.start_pipeline(make(str(folder), fused=fused), tick_s=3600.0)
        wait_for("user_minutes holds state", lambda: bool(_state(spark, minutes, "user_minutes")), runs=(run,))
        key = sorted(_state(spark, minutes, "user_minutes"))[0]
        stmt = f"UPDATE state SET state_json = regexp_replace(state_json, '^[{{]', '{{\"999\": 5, ') WHERE key = '{key}'"
        assert main(["repair", "--store", str(store), "--pipeline", "clicks", "--computation", "user_minutes",
                     "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot, "--wait", "300", stmt]) == 0
        said = capsys.readouterr().out
        assert "repaired user_minutes: 1 keys written" in said
        assert re.search(r"user_minutes: committed 1 rows written, 0 deleted at rows version \d+; intervals given back "
                         r"after [\d.]+s \(held [\d.]+s\)", said), said
        run.stop()
        run = engine.start_pipeline(make(str(folder), fused=fused))
        write_file(folder, "part-1.parquet", rows[80:] + [closing_row(rows)])  # after the repair
        want_users, want_totals = expected(rows)
        wait_for("every minute's total", lambda: len(outputs(spark, engine.layout)[1]) >= len(want_totals),
                 runs=(run,), timeout_s=600)
        run.stop()
        got_users, got_totals = outputs(spark, engine.layout)
    # one hand-over: the stage paused at one batch boundary, not once per batch or tick
    handed = [line for line in lines if line.startswith("user_minutes: handing intervals over to repair")]
    back = [line for line in lines if line.startswith("user_minutes: intervals taken again after repair")]
    assert len(handed) == 1 and len(back) == 1, lines[-20:]
    print(back[0], said, sep="\n")  # the pause's figures (pytest -rP shows them)
    assert got_users == want_users and got_totals == want_totals  # every output once
    assert _state(spark, minutes, "user_minutes")[key] == {"999": 5}  # the repaired field, kept
