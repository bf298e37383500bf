"""``deltawheel repair`` beyond UPDATE/DELETE of the state: MERGE from a file or
table, timers and checkpointed productions, ``--plan`` on an unknown pipeline, and the empty
side-table views; real Spark, ZooKeeper and Delta."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

import pytest
from deltawheel.statestore.exceptions import ConfigError, RepairStatementError
from deltawheel.statestore.surgery.repair import parse_repair
from executor_util import BucketCounter
from pyspark import cloudpickle

from deltawheel.cli import main

# Spark's Python workers cannot import test modules: ship this module's classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class TtlBuckets(BucketCounter):
    """The bucket counter with an event-time state TTL (its keys carry the framework's TTL timer)."""

    name = "ttl_buckets"
    state_ttl = timedelta(hours=1)


def test_merge_timers_and_pending_statements_parse_and_bad_ones_are_refused() -> None:
    m = parse_repair("MERGE INTO state USING parquet.`/data/seed` AS s ON state.key = s.q "
                     "WHEN MATCHED AND s.n > 0 THEN UPDATE SET state_json = to_json(named_struct('0', s.n)) "
                     "WHEN NOT MATCHED THEN INSERT (key, state_json) VALUES (s.q, concat('{\"0\": ', s.n, '}'))")
    assert m.kind == "merge" and m.merge is not None
    assert (m.merge.fmt, m.merge.path, m.merge.alias, m.merge.matched_cond) == ("parquet", "/data/seed", "s", "s.n > 0")
    assert m.merge.insert_key == "s.q" and m.merge.insert_state == "concat('{\"0\": ', s.n, '}')"
    d = parse_repair("merge into state using csv.`seed.csv` on state.key = source.q when matched then delete")
    assert d.merge is not None and d.merge.alias == "source" and d.merge.matched_expr is None
    assert d.merge.insert_key is None
    t = parse_repair("UPDATE timers SET time_ms = time_ms + 1000 WHERE key = 'a' AND tag = 'x'")
    assert (t.view, t.kind, t.expr, t.where) == ("timers", "update", "time_ms + 1000", "key = 'a' AND tag = 'x'")
    assert parse_repair("DELETE FROM pending_productions WHERE key = 'a'").view == "pending_productions"
    for stmt, msg in (
            ("MERGE INTO state USING avro.`/x` AS s ON state.key = s.q WHEN MATCHED THEN DELETE",
             "source format 'avro' is not one of"),
            ("MERGE INTO timers USING parquet.`/x` AS s ON timers.key = s.q WHEN MATCHED THEN DELETE",
             "a MERGE changes the state view, not 'timers'"),
            ("MERGE INTO state USING parquet.`/x` AS s ON state.n = s.q WHEN MATCHED THEN DELETE",
             "the condition must be the key's equality"),
            ("MERGE INTO state USING parquet.`/x` AS s ON state.key = s.q WHEN MATCHED THEN UPDATE SET codec = 'x'",
             "only state_json can be set"),
            ("MERGE INTO state USING parquet.`/x` AS s ON state.key = s.q WHEN NOT MATCHED THEN INSERT (key) "
             "VALUES (s.q)", "write INSERT \\(key, state_json\\)"),
            ("MERGE INTO state USING parquet.`/x` AS s ON state.key = s.q WHEN NOT MATCHED BY SOURCE THEN DELETE",
             "NOT MATCHED BY SOURCE is not supported"),
            ("MERGE INTO state USING parquet.`/x` AS s", "not a MERGE this tool reads"),
            ("UPDATE timers SET tag = 'b'", "only time_ms can be set"),
            ("UPDATE pending_productions SET stream = 'b'", "cannot be changed, only dropped"),
            ("DELETE FROM fences", "not 'fences': the fence rows"),
    ):
        with pytest.raises(RepairStatementError, match=msg):
            parse_repair(stmt)


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_side_table_views_are_empty_with_their_columns_before_anything_landed(  # type: ignore[no-untyped-def]
        spark, migrated_store, capsys) -> None:
    """On a store no tool has changed, ``audit`` is an empty view with the audit columns (not
    Spark's TABLE_OR_VIEW_NOT_FOUND); so are ``dead_letters`` and ``late_data`` without their
    tables (a store whose migration 2 tables were removed stands in for one before any record)."""
    import shutil

    assert main(["sql", "--store", migrated_store.root, "--format", "json", "SELECT count(*) AS n FROM audit"]) == 0
    assert json.loads(capsys.readouterr().out) == {"n": 0}
    shutil.rmtree(migrated_store.dead_letters)
    shutil.rmtree(migrated_store.late_data)
    for view, column in (("audit", "commit_version"), ("dead_letters", "raw_value"), ("late_data", "watermark_ms")):
        assert main(["sql", "--store", migrated_store.root, f"SELECT {column}, computation FROM {view}"]) == 0
        assert "(0 rows)" in capsys.readouterr().out


def _seed(spark: Any, layout: Any, zk_config: Any, comp: Any) -> None:
    from executor_util import events, start_executor, stop_executor

    ex, client = start_executor(spark, layout, zk_config, comp)
    ex.run_batch(events(spark, [("r1", "cats", 1_000), ("r2", "dogs", 2_000)]), 0, input_watermark_ms=None)
    stop_executor(ex, client)


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.slow  # eight commands, each its own Spark jobs, and two batches (minutes on a loaded machine)
@pytest.mark.timeout(1200)
def test_merge_as_a_user_bootstraps_and_patches_state_from_a_file(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, tmp_path, capsys) -> None:
    """The docs' MERGE from a Parquet file: one key patched, one inserted in its interval with the
    computation's codec, planned first, audited; refusals change nothing; the pipeline goes on
    from the merged state (it decodes the inserted key's state)."""
    from deltawheel.statestore.rowtable.rows import interval_of
    from executor_util import events, start_executor, state_of, stop_executor

    _seed(spark, migrated_store, zk_config, BucketCounter())
    before = state_of(spark, migrated_store, "buckets")
    seed = tmp_path / "seed.parquet"
    spark.createDataFrame([("cats", 40), ("birds", 7)], "q STRING, n BIGINT").coalesce(1).write.parquet(str(seed))
    base = ["repair", "--store", migrated_store.root, "--pipeline", "test", "--computation", "buckets",
            "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
    merge = (f"MERGE INTO state USING parquet.`{seed}` AS s ON state.key = s.q "
             "WHEN MATCHED THEN UPDATE SET state_json = to_json(named_struct('0', s.n)) "
             "WHEN NOT MATCHED THEN INSERT (key, state_json) VALUES (s.q, to_json(named_struct('0', s.n)))")

    # --plan of a pipeline ZooKeeper does not know is refused as the apply is
    assert main([*base[:4], "nosuch", *base[5:], "--plan", merge]) == 3
    assert "pipeline 'nosuch' has no computation 'buckets' in ZooKeeper" in capsys.readouterr().err
    assert main([*base, "--plan", merge]) == 0
    out = capsys.readouterr().out
    assert "would write 2 keys and delete 0" in out
    assert """'cats' (interval""" in out and """{"0": 1} -> {"0": 40}""" in out
    assert f"'birds' (interval {interval_of('birds', 4)}): (new) -> {{\"0\": 7}} [json]" in out
    assert state_of(spark, migrated_store, "buckets") == before  # the plan changed nothing

    bad = tmp_path / "bad.csv"
    bad.write_text("q,n\nbirds,1\nbirds,2\n")
    for stmt, msg in (
            (f"MERGE INTO state USING csv.`{bad}` AS s ON state.key = s.q WHEN NOT MATCHED THEN "
             "INSERT (key, state_json) VALUES (s.q, to_json(named_struct('0', s.n)))", "inserts key 'birds' twice"),
            (f"MERGE INTO state USING parquet.`{seed}` AS s ON state.key = s.q WHEN NOT MATCHED THEN "
             "INSERT (key, state_json) VALUES (concat(char(0), s.q), '{}')", "not a usable key"),
            (f"MERGE INTO state USING parquet.`{seed}` AS s ON state.key = s.q WHEN NOT MATCHED THEN "
             "INSERT (key, state_json) VALUES (s.q, 'not json')", "is not JSON"),
            (f"MERGE INTO state USING parquet.`{seed}` AS s ON state.key = s.q AND computation = 'other' "
             "WHEN MATCHED THEN DELETE", "names rows of computation 'other'"),
            (f"MERGE INTO state USING parquet.`{tmp_path}/missing` AS s ON state.key = s.q WHEN MATCHED THEN DELETE",
             "cannot be read"),
    ):
        assert main([*base, stmt]) == 3, stmt
        assert msg in capsys.readouterr().err, stmt
    assert state_of(spark, migrated_store, "buckets") == before

    assert main([*base, merge]) == 0
    assert "repaired buckets: 2 keys written, 0 deleted" in capsys.readouterr().out
    after = state_of(spark, migrated_store, "buckets")
    assert after == {**before, "cats": ({"0": 40}, before["cats"][1]), "birds": ({"0": 7}, [])}
    rows = {r["key"]: r for r in spark.read.format("delta").load(migrated_store.rows_of("buckets"))
            .where("computation = 'buckets'").collect()}
    assert rows["birds"]["interval"] == interval_of("birds", 4) and rows["birds"]["codec"] == "json"
    assert main(["sql", "--store", migrated_store.root, "--format", "json",
                 "SELECT tool, source, rows_upserted, intervals FROM audit"]) == 0
    (audit,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert audit["source"] == merge and audit["rows_upserted"] == 2
    assert sorted(audit["intervals"]) == sorted({interval_of("birds", 4), interval_of("cats", 4)})

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    ex.run_batch(events(spark, [("r3", "birds", 3_000), ("r4", "cats", 4_000)]), 1, input_watermark_ms=None)
    stop_executor(ex, client)
    final = state_of(spark, migrated_store, "buckets")
    assert final["birds"][0] == {"0": 8} and final["cats"][0] == {"0": 41}


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.slow  # four repairs and three batches (minutes on a loaded machine)
@pytest.mark.timeout(1200)
def test_timers_repaired_and_the_ttl_timer_refused(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """A key's stuck timer deleted, another moved (the next-timer columns follow), the state TTL's
    timer refused; then the pipeline fires what is left at the new times."""
    from deltawheel.statestore.surgery.repair import repair
    from deltawheel.statestore.zk.client import connect
    from executor_util import events, start_executor, stop_executor, stream_rows

    comp = TtlBuckets()
    _seed(spark, migrated_store, zk_config, comp)
    client = connect(zk_config)
    try:
        def run(stmt: str) -> Any:
            return repair(spark, migrated_store, client, pipeline="test", computation="ttl_buckets", statement=stmt)

        with pytest.raises(RepairStatementError, match="selects the state TTL timer of key 'cats'"):
            run("DELETE FROM timers WHERE key = 'cats'")
        with pytest.raises(RepairStatementError, match="new time of timer '0' of key 'cats' is NULL"):
            run("UPDATE timers SET time_ms = NULL WHERE key = 'cats' AND tag = '0'")
        r = run("DELETE FROM timers WHERE key = 'dogs' AND tag = '0'")
        assert r.rows_changed == 1 and r.before["dogs"].next_event_timer_ms == 9_999
        r = run("UPDATE timers SET time_ms = 30000 WHERE key = 'cats' AND tag = '0'")
        assert r.rows_changed == 1
    finally:
        client.stop()
        client.close()
    rows = {r["key"]: r for r in spark.read.format("delta").load(migrated_store.rows_of("ttl_buckets"))
            .where("computation = 'ttl_buckets'").collect()}
    assert [(t["tag"], t["time_ms"]) for t in rows["dogs"]["timers"] if t["tag"] == "0"] == []
    assert sorted((t["tag"], t["time_ms"]) for t in rows["cats"]["timers"] if t["tag"] == "0") == [("0", 30_000)]
    assert rows["cats"]["next_event_timer_ms"] == min(t["time_ms"] for t in rows["cats"]["timers"]
                                                      if t["domain"] == "event_time")
    assert rows["dogs"]["next_event_timer_ms"] == min(t["time_ms"] for t in rows["dogs"]["timers"]
                                                      if t["domain"] == "event_time")
    ex, client = start_executor(spark, migrated_store, zk_config, TtlBuckets())
    ex.run_batch(events(spark, []), 1, input_watermark_ms=20_000)  # the old time passed: nothing fires
    ex.flush(input_watermark_ms=31_000)  # the moved timer fires; the deleted one never
    stop_executor(ex, client)
    counts = [(k, json.loads(v)) for _, k, v, _ in stream_rows(spark, migrated_store, "counts")]
    assert [v for _, v in counts] == [{"n": 1, "q": "cats", "start": 0}]


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(1200)
def test_a_dropped_checkpointed_production_is_never_delivered(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config) -> None:
    """A batch checkpoints two productions and its process dies before delivering them; the
    repair drops one: its own recovery does not deliver it, the pipeline's does not either, the
    other is delivered once."""
    from deltawheel.executor.protocol.faults import FaultPoint
    from deltawheel.statestore.surgery.repair import repair
    from deltawheel.statestore.zk.client import connect
    from executor_util import events, start_executor, stop_executor, stream_rows

    class Crash(Exception):
        pass

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point is FaultPoint.AFTER_COMMIT and batch_id == 1:
            raise Crash(point)

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), faults=faults, writer="first")
    ex.run_batch(events(spark, [("r1", "cats", 1_000), ("r2", "dogs", 2_000)]), 0, input_watermark_ms=None)
    with pytest.raises(Crash):
        ex.run_batch(events(spark, []), 1, input_watermark_ms=11_000)
    client.stop()  # the process dies: its session and leases go
    client.close()
    client = connect(zk_config)
    try:
        with pytest.raises(RepairStatementError, match="not valid on the pending_productions view"):
            repair(spark, migrated_store, client, pipeline="test", computation="buckets",
                   statement="DELETE FROM pending_productions WHERE nosuch = 1")
        r = repair(spark, migrated_store, client, pipeline="test", computation="buckets",
                   statement="DELETE FROM pending_productions WHERE key = 'dogs'")
    finally:
        client.stop()
        client.close()
    assert r.rows_changed == 1 and len(r.before["dogs"].pending) == 1 and r.upserted[0].pending == ()
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), writer="second")
    ex.flush(input_watermark_ms=40_000)
    stop_executor(ex, client)
    counts = [json.loads(v) for _, _, v, _ in stream_rows(spark, migrated_store, "counts")]
    assert counts == [{"n": 1, "q": "cats", "start": 0}]


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(600)
def test_plan_refuses_an_unknown_pipeline_in_the_api(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.surgery.repair import plan_repair
    from deltawheel.statestore.zk.client import connect

    client = connect(zk_config)
    try:
        with pytest.raises(ConfigError, match="pipeline 'nosuch' has no computation 'buckets' in ZooKeeper"):
            plan_repair(spark, migrated_store, client, pipeline="nosuch", computation="buckets",
                        statement="DELETE FROM state WHERE key = 'a'")
    finally:
        client.stop()
        client.close()


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(900)
def test_merge_inserts_keys_from_a_json_file_with_the_given_codec(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, tmp_path) -> None:
    """A computation with no rows yet: the MERGE needs the codec (refused without it), then
    inserts each key in its interval with that codec column (msgpack, state version 2)."""
    from deltawheel.statestore.codecs import get_codec
    from deltawheel.statestore.rowtable.rows import interval_of
    from deltawheel.statestore.surgery.repair import repair
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager

    src = tmp_path / "seed.json"
    src.write_text('{"q": "a", "n": 1}\n{"q": "b", "n": 2}\n')
    stmt = (f"MERGE INTO state USING json.`{src}` ON state.key = source.q WHEN NOT MATCHED THEN "
            "INSERT (key, state_json) VALUES (source.q, to_json(named_struct('n', source.n)))")
    client = connect(zk_config)
    try:
        leases = LeaseManager(client, pipeline="test", owner="seeder")
        leases.acquire("fresh", list(range(4)), wait_s=10)  # the pipeline's lease znodes: 4 intervals
        leases.close()
        with pytest.raises(RepairStatementError, match="has no rows yet, so the codec"):
            repair(spark, migrated_store, client, pipeline="test", computation="fresh", statement=stmt)
        with pytest.raises(RepairStatementError, match="--codec pickle"):
            repair(spark, migrated_store, client, pipeline="test", computation="fresh", statement=stmt,
                   codec="pickle")
        r = repair(spark, migrated_store, client, pipeline="test", computation="fresh", statement=stmt,
                   codec="msgpack@2")
    finally:
        client.stop()
        client.close()
    assert r.rows_changed == 2 and r.version is not None
    rows = {x["key"]: x for x in spark.read.format("delta").load(migrated_store.rows_of("fresh"))
            .where("computation = 'fresh' AND key NOT LIKE '\u0000%'").collect()}
    assert {k: (x["interval"], x["codec"], get_codec("msgpack").decode(x["state"])) for k, x in rows.items()} == {
        "a": (interval_of("a", 4), "msgpack@2", {"n": 1}), "b": (interval_of("b", 4), "msgpack@2", {"n": 2})}
