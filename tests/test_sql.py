"""SQL views, query formatting, inspect, and the sql / inspect / migrate / sql-server CLI."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from conftest import copy_migrated_store, free_port
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.inspection.sqlviews import inspect_key, register_views, run_sql
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import (
    FENCE_KEY,
    KeyRow,
    Production,
    SeenId,
    TimeDomain,
    Timer,
    rows_schema_ddl,
)
from deltawheel.statestore.rowtable.tables import ensure_rows_table
from deltawheel.statestore.writepath.streams import ensure_stream_table, list_streams, stream_schema_ddl

from deltawheel.cli import main

pytestmark = pytest.mark.spark

PICKLED = pickle.dumps({1, 2})
ROWS = [
    KeyRow(computation="wc", key="a", interval=0, state=b'{"n":1}',
           timers=(Timer(5000, "w", TimeDomain.EVENT_TIME),
                                                     Timer(9000, "p", TimeDomain.PROCESSING_TIME)),
           record_ids=(SeenId("r1", 1),), pending=(Production("p1", "out", "A", b'{"x":2}', 7000),),
           watermark_hold_ms=4000, sequencer=3, commit_id="c1", updated_ms=1000),
    KeyRow(computation="wc", key="b", interval=1, state=msgpack.packb({"n": 2, "b": b"\x01"}),
           codec="msgpack", sequencer=3),
    KeyRow(computation="wc", key="c", interval=1, state=PICKLED, codec="pickle", sequencer=3),
    KeyRow(computation="wc", key="long", interval=1, state=b'{"s":"' + b"x" * 100 + b'"}', sequencer=3),
    KeyRow(computation="wc", key=FENCE_KEY, interval=0, sequencer=3, commit_id="fence-0"),
]
EXPECTED_STATE = {"a": {"n": 1}, "b": {"b": {"$bytes_b64": "AQ=="}, "n": 2}, "long": {"s": "x" * 100}}
ENV = {**os.environ, "DELTAWHEEL_JARS_DIR": os.environ["DELTAWHEEL_JARS_DIR"]}


@pytest.fixture(scope="module")
def store(spark, tmp_path_factory, migrated_template) -> StoreLayout:  # type: ignore[no-untyped-def]
    layout = StoreLayout(str(tmp_path_factory.mktemp("sql") / "store"))
    copy_migrated_store(migrated_template, Path(layout.root))
    (spark.createDataFrame([r.to_row() for r in ROWS], schema=rows_schema_ddl())
     .write.format("delta").mode("append").save(ensure_rows_table(spark, layout, "wc")))
    path = ensure_stream_table(spark, layout, "out")
    assert ensure_stream_table(spark, layout, "out") == path  # idempotent
    (spark.createDataFrame([("id1", "A", b'{"x":2}', "json", 7000, dt.datetime(2020, 1, 1), "wc", "c1", 1),
                            ("id2", "B", b"\xff", "json", 8000, None, "wc", "c1", 1)],
                           schema=stream_schema_ddl())
     .write.format("delta").mode("append").save(path))
    return layout


def test_register_views_and_streams(spark, store) -> None:  # type: ignore[no-untyped-def]
    assert list_streams(spark, store) == ["out"]
    assert list_streams(None, store) == ["out"]
    assert register_views(spark, store) == [
        "rows", "state", "timers", "pending_productions", "fences", "state_history", "dead_letters", "late_data", "audit",
        "out", "out_decoded"]
    keys = sorted(r["key"] for r in spark.sql("SELECT key FROM rows").collect())
    assert keys == ["a", "b", "c", "long"]  # no fence row
    assert [tuple(r) for r in spark.sql("SELECT * FROM fences").collect()] == [("wc", 0, 3, "fence-0")]
    assert spark.sql("SELECT count(*) FROM dead_letters").collect()[0][0] == 0


def test_csv_parses_back_to_decoded_state(spark, store) -> None:  # type: ignore[no-untyped-def]
    out = run_sql(spark, store, "SELECT key, codec, state_json, n_timers, next_event_timer, watermark_hold "
                  "FROM state ORDER BY key", fmt="csv")
    recs = list(csv.DictReader(io.StringIO(out)))
    assert [r["key"] for r in recs] == ["a", "b", "c", "long"]
    for r in recs:
        if r["key"] in EXPECTED_STATE:
            assert json.loads(r["state_json"]) == EXPECTED_STATE[r["key"]]
    assert recs[2]["state_json"] == f"<pickle: {len(PICKLED)} bytes>"
    assert recs[0]["n_timers"] == "2" and recs[0]["next_event_timer"] == "1970-01-01 00:00:05"
    assert recs[0]["watermark_hold"] == "1970-01-01 00:00:04" and recs[1]["watermark_hold"] == ""


def test_json_lines_and_pickle_opt_in(spark, store) -> None:  # type: ignore[no-untyped-def]
    out = run_sql(spark, store, "SELECT key, state_json, updated FROM state ORDER BY key", fmt="json",
                  allow_pickle=True)
    recs = [json.loads(line) for line in out.splitlines()]
    assert [r["key"] for r in recs] == ["a", "b", "c", "long"]
    assert json.loads(recs[2]["state_json"]) == [1, 2]
    assert recs[0]["updated"] == "1970-01-01T00:00:01"


def test_table_format(spark, store) -> None:  # type: ignore[no-untyped-def]
    out = run_sql(spark, store, "SELECT key, state_json, sequencer FROM state ORDER BY key")
    lines = out.splitlines()
    assert lines[0].split(" | ")[0].strip() == "key" and set(lines[1]) <= {"-", "+"}
    assert lines[-1] == "(4 rows)"
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule aligned
    long_line = next(line for line in lines if line.startswith("long"))
    assert '{"s": "xxxx' in long_line and "..." in long_line and "x" * 100 not in long_line
    assert run_sql(spark, store, "SELECT key FROM state", max_rows=2).splitlines()[-1] == \
        "(2 of 4 rows shown; raise --max-rows)"
    assert run_sql(spark, store, "SELECT 1 AS one").splitlines()[-1] == "(1 row)"


def test_timers_productions_and_stream_views(spark, store) -> None:  # type: ignore[no-untyped-def]
    register_views(spark, store)
    timers = [tuple(r) for r in spark.sql("SELECT key, tag, domain, fire_time, time_ms FROM timers "
                                          "ORDER BY time_ms").collect()]
    assert timers == [("a", "w", "event_time", dt.datetime(1970, 1, 1, 0, 0, 5), 5000),
                      ("a", "p", "processing_time", dt.datetime(1970, 1, 1, 0, 0, 9), 9000)]
    prods = spark.sql("SELECT * FROM pending_productions").collect()
    assert [(p["key"], p["production_id"], p["stream"], p["out_key"], json.loads(p["value_json"]))
            for p in prods] == [("a", "p1", "out", "A", {"x": 2})]
    decoded = {r["record_id"]: r["value_json"] for r in spark.sql("SELECT * FROM out_decoded").collect()}
    assert decoded == {"id1": '{"x": 2}', "id2": "<undecodable json: 1 bytes>"}


def test_inspect_key(spark, store) -> None:  # type: ignore[no-untyped-def]
    got = inspect_key(spark, store, computation="wc", key="a")
    assert got is not None
    assert got["state"] == {"n": 1} and got["interval"] == 0 and got["sequencer"] == 3
    assert got["timers"][0] == {"tag": "w", "domain": "event_time", "time_ms": 5000,
                                "fire_time": "1970-01-01T00:00:05+00:00"}
    assert got["pending"] == [{"production_id": "p1", "stream": "out", "key": "A", "codec": "json",
                               "value": {"x": 2}, "timestamp_ms": 7000}]
    assert got["record_ids"] == [{"record_id": "r1", "seen_ms": 1}]
    json.dumps(got)  # plain values only
    assert inspect_key(spark, store, computation="wc", key="c")["state"].startswith("<pickle:")
    assert inspect_key(spark, store, computation="wc", key="c", allow_pickle=True)["state"] == [1, 2]
    assert inspect_key(spark, store, computation="wc", key="nope") is None


def test_inspect_reads_a_local_store_without_spark_as_spark_does(spark, store) -> None:  # type: ignore[no-untyped-def]
    """``inspect`` answers from the data files of a local store (no JVM start); the row equals
    what Spark reads."""
    from deltawheel.statestore.inspection.sqlviews import key_row_from_files
    from deltawheel.statestore.rowtable.rows import KeyRow
    from pyspark.sql import functions as F

    for key in ("a", "c", "long"):
        by_spark = spark.read.format("delta").load(store.rows_of("wc")).where(
            (F.col("computation") == "wc") & (F.col("key") == key)).collect()
        assert key_row_from_files(store, computation="wc", key=key) == KeyRow.from_row(by_spark[0])
    assert key_row_from_files(store, computation="wc", key="nope") is None
    assert key_row_from_files(store, computation="other", key="a") is None
    assert inspect_key(None, store, computation="wc", key="a") == inspect_key(spark, store, computation="wc", key="a")


def test_config_errors(spark, store, migrated_store) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="stream name 'state' clashes with the built-in SQL view"):
        ensure_stream_table(spark, migrated_store, "state")
    with pytest.raises(ConfigError, match="stream name 'bad-name' is not valid"):
        ensure_stream_table(spark, migrated_store, "bad-name")
    with pytest.raises(ConfigError, match="unknown output format 'xml'"):
        run_sql(spark, store, "SELECT 1", fmt="xml")
    with pytest.raises(ConfigError, match="max_rows must be at least 1"):
        run_sql(spark, store, "SELECT 1", max_rows=0)
    # a stream table made behind deltawheel's back with a reserved name
    (spark.createDataFrame([], stream_schema_ddl()).write.format("delta")
     .save(f"{migrated_store.streams_root}/timers"))
    with pytest.raises(ConfigError, match=r"would define the view 'timers', which is already taken"):
        register_views(spark, migrated_store)


def test_cli_in_process(store, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["sql", "--store", store.root, "SELEC key FROM state"]) == 2
    assert "deltawheel sql: SQL error: " in capsys.readouterr().err
    assert main(["sql", "--store", store.root, "SELECT nope FROM state"]) == 2
    assert "UNRESOLVED_COLUMN" in capsys.readouterr().err
    (tmp_path / "plain").mkdir()
    assert main(["sql", "--store", str(tmp_path / "plain"), "SELECT 1"]) == 3
    assert "NotAStoreError: " in capsys.readouterr().err
    assert main(["inspect", "--store", store.root, "--computation", "wc", "--key", "a"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == {"n": 1}
    assert main(["inspect", "--store", store.root, "--computation", "wc", "--key", "zz"]) == 1
    err = capsys.readouterr().err
    assert "no row for key 'zz' of computation 'wc': the key holds no state" in err
    # what to do next: the computation's keys, and the key's past versions
    assert f"deltawheel sql --store {store.root} \"SELECT key FROM state WHERE computation = 'wc'\"" in err
    assert f"deltawheel history --store {store.root} --computation wc --key zz" in err
    new = str(tmp_path / "new")
    assert main(["migrate", "--store", new]) == 0
    out = capsys.readouterr().out
    assert "pending migrations" in out and "1  meta_and_rows" in out and "dry run" in out
    assert main(["migrate", "--store", new, "--apply"]) == 0
    assert "store is now at schema version 8" in capsys.readouterr().out
    assert main(["migrate", "--store", new, "--apply"]) == 0
    assert "is up to date (schema version 8)" in capsys.readouterr().out


# a Spark application of its own (about 30 s); in the default run the same query's csv is checked in
# process (test_csv_parses_back_to_decoded_state) and `deltawheel sql --format csv` as a child process
# in test_cli_sql.py (test_subprocess_csv_5000_of_5000) and test_quickstart.py
@pytest.mark.slow
def test_cli_subprocess_csv(store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.run(
        [sys.executable, "-m", "deltawheel.cli", "sql", "--store", store.root, "--format", "csv",
         "SELECT key, state_json FROM state ORDER BY key"],
        capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert {r["key"]: json.loads(r["state_json"]) for r in recs if r["key"] != "c"} == EXPECTED_STATE


def _wait_for_port(port: int, proc: subprocess.Popen[Any], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"sql-server exited with {proc.returncode}"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"sql-server did not listen on {port} within {timeout_s}s")


@pytest.mark.slow  # about 75 s on a quiet machine (a Spark Thrift server); the sql CLI tests stay in the default suite
def test_sql_server_with_sqlalchemy(store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import sqlalchemy
    from sqlalchemy import text

    port = free_port()
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltawheel.cli", "sql-server", "--store", store.root,
         "--port", str(port)],
        stdout=subprocess.PIPE, stderr=log, text=True, env=ENV, cwd=tmp_path,
    )
    try:
        _wait_for_port(port, proc, 300)
        engine = sqlalchemy.create_engine(f"hive://127.0.0.1:{port}/default")
        with engine.connect() as conn:
            got = conn.execute(text("SELECT key, state_json FROM state ORDER BY key")).fetchall()
            assert [k for k, _ in got] == ["a", "b", "c", "long"]
            assert {k: json.loads(v) for k, v in got if k != "c"} == EXPECTED_STATE
            n = conn.execute(text("SELECT count(*) FROM out_decoded")).scalar()
            assert n == 2
        # BI tools browse the tables through SQLAlchemy's inspector: the views by their names
        names = sqlalchemy.inspect(engine).get_table_names()
        assert {"state", "timers", "pending_productions", "fences", "out", "out_decoded"} <= set(names), names
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM state")).scalar() == 4  # other statements as before
            # the column comments reach JDBC/Thrift clients too (DESCRIBE: name, type, comment)
            described = {r[0]: r[2] for r in conn.execute(text("DESCRIBE state")).fetchall()}
        from deltawheel.statestore.comments import VIEWS
        want = VIEWS["state"]
        assert want and all(described.get(c) == note for c, note in want.items()), (described, want)
        # read-only as the sql tool: a client's writes are refused, the rows table is untouched
        before = _rows_version(store)
        for q in (WRITES[0], WRITES[1], WRITES[9], "-- hi\n  /* x */ OPTIMIZE delta.`{rows}`",
                  # on a view: refused as the sql tool refuses it, before Delta's analysis fails it
                  "DELETE FROM state", "UPDATE state SET state_json = '{{}}'"):
            with engine.connect() as conn, pytest.raises(Exception, match=r"(?s)ReadOnlySqlError.*fenced path"):
                conn.execute(text(q.format(rows=store.rows_of("wc"))))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM state")).scalar() == 4
        assert _rows_version(store) == before
        engine.dispose()
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        assert f"SQLAlchemy URL hive://127.0.0.1:{port}/default" in out and "stopping" in out
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()
    assert not (Path(tmp_path) / "derby.log").exists()


def _rows_version(layout: StoreLayout) -> int:
    logs = [f for f in os.listdir(os.path.join(layout.rows_of("wc"), "_delta_log")) if f.endswith(".json")]
    return max(int(f.split(".")[0]) for f in logs)


WRITES = [
    "UPDATE delta.`{rows}` SET state = NULL WHERE key = 'a'",
    "DELETE FROM delta.`{rows}` WHERE key = 'a'",
    "MERGE INTO delta.`{rows}` t USING (SELECT 'a' AS key) s ON t.key = s.key WHEN MATCHED THEN DELETE",
    "INSERT INTO delta.`{rows}` SELECT * FROM delta.`{rows}`",
    "DROP TABLE IF EXISTS delta.`{rows}`",
    "CREATE TABLE evil USING delta LOCATION '{rows}'",
    "ALTER TABLE delta.`{rows}` SET TBLPROPERTIES ('x' = 'y')",
    "OPTIMIZE delta.`{rows}`",
    "VACUUM delta.`{rows}` RETAIN 0 HOURS",
    # spellings a prefix check would let through
    "WITH x AS (SELECT * FROM delta.`{rows}`) INSERT INTO delta.`{rows}` SELECT * FROM x",
    "/* SELECT */ update delta.`{rows}` SET sequencer = 99",
    "-- just looking\n  DELETE FROM delta.`{rows}`",
    "FROM delta.`{rows}` INSERT INTO delta.`{rows}` SELECT *",
    "SET spark.databricks.delta.retentionDurationCheck.enabled = false",
]


def test_sql_tool_is_read_only(spark, store, capsys) -> None:  # type: ignore[no-untyped-def]
    """``deltawheel sql`` runs queries only: every writing statement is refused before it runs,
    with the reason, and the rows table stays at its version (an UPDATE used to commit unfenced)."""
    from deltawheel.statestore.inspection.readonly import ReadOnlySqlError, check_read_only

    def version() -> int:
        return int(spark.sql(f"DESCRIBE HISTORY delta.`{store.rows_of('wc')}`").agg({"version": "max"}).first()[0])

    before = version()
    for q in WRITES:
        assert main(["sql", "--store", store.root, q.format(rows=store.rows_of("wc"))]) == 2, q
        err = capsys.readouterr().err
        assert "ReadOnlySqlError" in err and "fenced path" in err, (q, err)
    # two statements: each checked before any runs, the DELETE refused, the SELECT not run
    assert main(["sql", "--store", store.root, "SELECT 1 AS one; DELETE FROM state"]) == 2
    got = capsys.readouterr()
    assert "ReadOnlySqlError" in got.err and got.out == ""
    assert version() == before
    assert main(["sql", "--store", store.root, "--format", "json", "SELECT count(*) AS n FROM state"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 4
    for q in ("WITH x AS (SELECT key FROM state) SELECT * FROM x", "SHOW TABLES", "DESCRIBE state",
              "EXPLAIN SELECT * FROM state", f"DESCRIBE HISTORY delta.`{store.rows_of('wc')}`", "VALUES (1)"):
        assert main(["sql", "--store", store.root, q]) == 0, q
    capsys.readouterr()
    with pytest.raises(ReadOnlySqlError, match=r"is a UpdateTable, which would change the store.*fenced path"):
        check_read_only(spark, "UPDATE state SET key = 'x'")
