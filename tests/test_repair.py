"""``deltawheel repair`` (issue 43 item 1): an UPDATE or DELETE of the decoded state view, one fenced
commit under the leases of the intervals it touches, audited; real Spark, ZooKeeper and Delta."""

from __future__ import annotations

import json
from typing import Any

import pytest
from deltawheel.executor.cli import main
from deltawheel.statestore.exceptions import RepairStatementError
from deltawheel.statestore.surgery.repair import parse_repair


def test_only_updates_and_deletes_of_the_state_view_are_repairs() -> None:
    with pytest.raises(RepairStatementError, match="not a repair statement: 'INSERT INTO"):
        parse_repair("INSERT INTO state VALUES (1)")
    with pytest.raises(RepairStatementError, match="not a repair statement: 'SELECT"):
        parse_repair("SELECT * FROM state")
    with pytest.raises(RepairStatementError, match="timers cannot be repaired by themselves yet"):
        parse_repair("DELETE FROM timers WHERE key = 'a'")
    with pytest.raises(RepairStatementError, match="a repair changes the state view, not 'rows'"):
        parse_repair("UPDATE rows SET state = NULL")
    with pytest.raises(RepairStatementError, match="only state_json can be set"):
        parse_repair("UPDATE state SET key = 'b' WHERE key = 'a'")
    with pytest.raises(RepairStatementError, match="MERGE into the state view is not supported yet"):
        parse_repair("MERGE INTO state USING src ON state.key = src.key WHEN MATCHED THEN DELETE")
    s = parse_repair("update state set state_json = '{\"n\": 1}' where key = 'a';")
    assert (s.kind, s.state_expr, s.where) == ("update", "'{\"n\": 1}'", "key = 'a'")
    assert parse_repair("DELETE FROM state").where is None
    # the command line refuses before it starts Spark: exit status 3, nothing touched
    assert main(["repair", "--store", "/nonexistent/store", "--pipeline", "p", "--computation", "c",
                 "DROP TABLE state"]) == 3


def _sql(spark: Any, layout: Any, query: str) -> list[tuple[Any, ...]]:
    from deltawheel.statestore.inspection.sqlviews import sql_frame

    return [tuple(r) for r in sql_frame(spark, layout, query).collect()]


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(900)
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
    assert "would write 1 keys and delete 0" in out and """'cats' (interval""" in out
    assert """{"0": 2} -> {"0": 7}""" in out
    assert state_of(spark, migrated_store, "buckets") == before  # the plan changed nothing

    # refusals: nothing changes, no audit record
    for stmt, msg in (("DELETE FROM state WHERE computation = 'other'", "names rows of computation 'other'"),
                      ("UPDATE state SET state_json = 'not json' WHERE key = 'cats'", "is not JSON"),
                      ("UPDATE state SET state_json = nosuchcolumn", "not valid on the state view")):
        assert main([*base, stmt]) == 3
        assert msg in capsys.readouterr().err
    with pytest.raises(RepairStatementError, match="names rows of computation 'other'"):
        from deltawheel.statestore.surgery.repair import plan_repair

        plan_repair(spark, migrated_store, computation="buckets", statement="DELETE FROM state WHERE "
                                                                             "computation = 'other'")
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
        f"DESCRIBE HISTORY delta.`{migrated_store.rows}`").collect() if h["userMetadata"]}
    assert all(hist[v]["kind"] == "repair" for *_, v in audit)
    # the read-only SQL tool stays read-only
    assert main(["sql", "--store", migrated_store.root, "DELETE FROM state WHERE key = 'cats'"]) != 0
    # the pipeline goes on from the repaired state
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    ex.run_batch(events(spark, [("r4", "cats", 4_000)]), 1, input_watermark_ms=None)
    stop_executor(ex, client)
    assert state_of(spark, migrated_store, "buckets")["cats"][0] == {"0": 8}
