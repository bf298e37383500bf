"""``deltawheel sql`` as a user runs it: every row in csv and json, a said cut in table."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import copy_migrated_store
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.writepath.streams import ensure_stream_table, stream_schema_ddl

from deltawheel.cli import main

pytestmark = pytest.mark.spark

N = 5_000


@pytest.fixture(scope="module")
def big_store(spark, tmp_path_factory, migrated_template) -> StoreLayout:  # type: ignore[no-untyped-def]
    layout = StoreLayout(str(tmp_path_factory.mktemp("clisql") / "store"))
    copy_migrated_store(migrated_template, Path(layout.root))
    path = ensure_stream_table(spark, layout, "events")
    rows = [(f"id{i}", f"k{i % 7}", json.dumps({"n": i}).encode(), "json", 1000 + i, None, "src", "c1", 1)
            for i in range(N)]
    spark.createDataFrame(rows, schema=stream_schema_ddl()).repartition(4).write.format("delta") \
        .mode("append").save(path)
    return layout


def _sql(capsys: Any, *argv: str) -> tuple[int, str, str]:
    rc = main(["sql", *argv])
    got = capsys.readouterr()
    return rc, got.out, got.err


def test_csv_and_json_return_every_row(big_store, capsys) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = _sql(capsys, "--store", big_store.root, "--format", "csv",
                        "SELECT record_id, value_json FROM events_decoded ORDER BY timestamp_ms")
    assert rc == 0, err
    recs = list(csv.DictReader(io.StringIO(out)))
    assert len(recs) == N  # 5,000 of 5,000 (it stopped at 1,000 without a word)
    assert [json.loads(r["value_json"])["n"] for r in recs] == list(range(N))
    assert "rows" not in err
    rc, out, err = _sql(capsys, "--store", big_store.root, "--format", "json", "SELECT record_id FROM events")
    assert rc == 0, err
    assert sorted(json.loads(line)["record_id"] for line in out.splitlines()) == sorted(f"id{i}" for i in range(N))


def test_table_cut_is_said_with_the_total(big_store, capsys) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = _sql(capsys, "--store", big_store.root, "SELECT record_id FROM events")
    assert rc == 0, err
    assert out.splitlines()[-1] == f"(1000 of {N} rows shown; raise --max-rows)"
    assert len(out.splitlines()) == 2 + 1000 + 1
    assert f"showed 1000 of {N} rows" in err and "--format csv|json for every row" in err
    rc, out, err = _sql(capsys, "--store", big_store.root, "--format", "csv", "--max-rows", "10",
                        "SELECT record_id FROM events")
    assert rc == 0 and len(out.splitlines()) == 11
    assert f"showed 10 of {N} rows" in err
    rc, out, err = _sql(capsys, "--store", big_store.root, "SELECT count(*) AS n FROM events")
    assert out.splitlines()[-1] == "(1 row)" and err == ""


@pytest.mark.slow  # 5,000 rows through a subprocess; the CSV output: the other test_cli_sql.py tests
def test_subprocess_csv_5000_of_5000(big_store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.run(
        [sys.executable, "-m", "deltawheel.cli", "sql", "--store", big_store.root, "--format", "csv",
         "SELECT record_id, key FROM events"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert len(recs) == N and len({r["record_id"] for r in recs}) == N
    print(f"deltawheel sql --format csv returned {len(recs)} of {N} rows")
    # no Spark or ZooKeeper log lines without --verbose (the JVM launcher's own line aside)
    launcher = "WARNING: Using incubator modules: jdk.incubator.vector"
    assert [ln for ln in proc.stderr.splitlines() if ln != launcher] == [], proc.stderr[-2000:]


def test_describe_prints_column_comments(big_store, capsys) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = _sql(capsys, "--store", big_store.root, "--describe", "state", "--format", "csv")
    assert rc == 0, err
    cols = {r["column"]: r for r in csv.DictReader(io.StringIO(out))}
    assert "n_pending" not in cols
    assert cols["n_checkpointed"]["type"] == "int" and "not data at risk" in cols["n_checkpointed"]["comment"]
    assert all(r["comment"] for r in cols.values()), [c for c, r in cols.items() if not r["comment"]]
    for view in ("rows", "timers", "pending_productions", "fences", "dead_letters", "late_data", "events",
                 "events_decoded"):
        rc, out, err = _sql(capsys, "--store", big_store.root, "--describe", view, "--format", "json")
        assert rc == 0, err
        got = [json.loads(line) for line in out.splitlines()]
        assert got and all(r["comment"] for r in got), (view, [r["column"] for r in got if not r["comment"]])
    rc, out, _ = _sql(capsys, "--store", big_store.root, "--describe", "events")
    assert "the record's unique id" in out and "..." not in out  # table format: comments not cut
    rc, _, err = _sql(capsys, "--store", big_store.root, "--describe", "nope")
    assert rc == 2 and "SQL error" in err


def test_several_queries_and_the_shell(big_store, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = _sql(capsys, "--store", big_store.root, "--format", "json",
                        "SELECT count(*) AS n FROM events; SELECT 'a;b' AS s", "SELECT 7 AS seven")
    assert rc == 0, err
    # each line says which statement it answers (a statement's row may look like another's)
    assert [json.loads(line) for line in out.splitlines()] == [
        {"query": 1, "row": {"n": N}}, {"query": 2, "row": {"s": "a;b"}}, {"query": 3, "row": {"seven": 7}}]
    rc, out, err = _sql(capsys, "--store", big_store.root, "--format", "json",
                        "SELECT key, count(*) AS n FROM events GROUP BY key ORDER BY key LIMIT 2",
                        "SELECT 'k9' AS key, 0 AS n WHERE false", "SELECT key, 1 AS n FROM events ORDER BY key LIMIT 1")
    assert rc == 0, err
    assert [json.loads(line) for line in out.splitlines()] == [
        {"query": 1, "row": {"key": "k0", "n": N // 7 + 1}}, {"query": 1, "row": {"key": "k1", "n": N // 7 + 1}},
        {"query": 3, "row": {"key": "k0", "n": 1}}]
    rc, out, err = _sql(capsys, "--store", big_store.root, "--format", "json", "SELECT 7 AS seven")
    assert [json.loads(line) for line in out.splitlines()] == [{"seven": 7}]  # one statement: its rows as they are
    # a statement that would write stops the call before any runs
    rc, out, err = _sql(capsys, "--store", big_store.root, "SELECT 1 AS one; DELETE FROM state")
    assert rc == 2 and out == "" and "ReadOnlySqlError" in err
    monkeypatch.setattr(sys, "stdin", io.StringIO(
        "SELECT count(*)\n  AS n FROM events;\n\\d\nSELECT nope FROM events;\nSELECT 2 AS two\n\n\\q\nSELECT 3;\n"))
    rc, out, err = _sql(capsys, "--store", big_store.root, "--format", "json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0] == {"query": 1, "row": {"n": N}} and {"view": "state"} in lines
    assert lines[-1] == {"query": 3, "row": {"two": 2}}  # the bad statement 2 wrote no row
    assert rc == 2 and "UNRESOLVED_COLUMN" in err  # the bad statement's error, the others ran
