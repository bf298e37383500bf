"""The audit row a tool that died after its rows commit left missing (``statestore/surgery/audit.py``,
``statestore/inspection/auditgap.py``): ``deltawheel gc --apply`` appends it (a dry run and a refused
run count it and write nothing), and the read-only ``deltawheel sql`` shows it in its ``audit`` view
from the commit, as of now and not as of before the commit. Real Spark and Delta.

The tool's commit carries its metadata as a tool writes it (``surgery/replace.py``: the audit record,
``audit.commit_meta``), here on a commit changing no row."""

from __future__ import annotations

import json
from typing import Any

import pytest
from audit_util import tool_commit

from deltawheel.cli import main

pytestmark = pytest.mark.spark


def _audit_view(capsys: Any, store: str, *more: str) -> list[dict[str, Any]]:
    rc = main(["sql", "--store", store, "--format", "json", *more,
               "SELECT audit_id, tool, who, computation, intervals, rows_changed, commit_version, sequencers, detail "
               "FROM audit ORDER BY audit_id"])
    got = capsys.readouterr()
    assert rc == 0, got.err
    return [json.loads(line) for line in got.out.splitlines() if line.strip()]


def test_sql_shows_the_missing_audit_row_from_the_commit_without_writing(  # type: ignore[no-untyped-def]
        spark, migrated_store, capsys) -> None:
    from deltawheel.statestore.rowtable.tables import ensure_rows_table
    from deltawheel.statestore.surgery.audit import read_audit, recover_audit

    store = migrated_store.root
    buckets = ensure_rows_table(spark, migrated_store, "buckets")  # the tool commits to buckets' rows table
    before = int(spark.sql(f"DESCRIBE HISTORY delta.`{buckets}` LIMIT 1").collect()[0]["version"])
    version = tool_commit(spark, migrated_store, "lost-1", sequencers={0: 3, 2: 5})
    # sql (read-only): the audit view has the missing row, rebuilt from the commit; nothing written
    rows = _audit_view(capsys, store)
    assert [(r["audit_id"], r["tool"], r["who"], r["computation"], r["intervals"], r["rows_changed"],
             r["commit_version"]) for r in rows] == [("lost-1", "repair", "tester@here", "buckets", [0, 2], 1, version)]
    assert json.loads(rows[0]["sequencers"]) == {"0": 3, "2": 5} and json.loads(rows[0]["detail"])["recovered"]
    assert read_audit(spark, migrated_store) == []
    assert _audit_view(capsys, store, "--as-of", str(before)) == []  # before the tool's commit: none missing
    # once appended (a tool run's recovery), the view shows the table's row, not a second one
    assert [r.audit_id for r in recover_audit(spark, migrated_store)] == ["lost-1"]
    assert recover_audit(spark, migrated_store) == []
    assert [r["audit_id"] for r in _audit_view(capsys, store)] == ["lost-1"]
    # a second tool's lost row beside a recorded one: the view has both
    tool_commit(spark, migrated_store, "lost-2", sequencers={0: 3, 2: 5})
    assert [r["audit_id"] for r in _audit_view(capsys, store)] == ["lost-1", "lost-2"]


def test_the_audit_check_reads_only_the_commits_after_the_last_gcs(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """After a gc appended the missing rows it keeps, per rows table, the version it read up to
    (``gc/ranlog.py``); the next check opens only the commits after it and finds what a read of every
    commit finds. A kept version whose commit is not this log's any more is not used."""
    from deltawheel.gc.ranlog import checked_upto, mark_path, save_checked
    from deltawheel.statestore.surgery.audit import audit_gap_of, recover_audit

    v1 = tool_commit(spark, migrated_store, "lost-1", sequencers={0: 3})
    buckets = migrated_store.rows_of("buckets")  # the table the tool committed to: its versions

    def gap(**options: Any) -> Any:
        return audit_gap_of(spark, migrated_store, buckets, **options)

    assert checked_upto(migrated_store, "buckets") is None  # no gc yet: every commit
    first = gap(after_version=checked_upto(migrated_store, "buckets"))
    assert [r["audit_id"] for r in first.rows] == ["lost-1"] and first.upto == v1 and first.read == v1 + 1
    assert [r.audit_id for r in recover_audit(spark, migrated_store, first.rows)] == ["lost-1"]
    assert save_checked(migrated_store, first.upto, "buckets") and checked_upto(migrated_store, "buckets") == v1
    assert checked_upto(migrated_store) is None  # the first rows table's mark is its own
    for n in range(2):  # commits of no tool
        spark.sql(f"ALTER TABLE delta.`{buckets}` SET TBLPROPERTIES ('deltawheel.test.n' = '{n}')")
    v2 = tool_commit(spark, migrated_store, "lost-2", sequencers={1: 4})
    got = gap(after_version=checked_upto(migrated_store, "buckets"))
    assert (got.read, got.upto) == (3, v2)  # the three commits after v1, not the log's v2 + 1
    full = gap()  # DESCRIBE HISTORY: every commit
    assert full.read == v2 + 1

    def same(r: dict[str, Any]) -> dict[str, Any]:  # the commit's time: commitInfo's vs the history's
        return {k: v for k, v in r.items() if k != "recorded_ms"}

    assert [same(r) for r in got.rows] == [same(r) for r in full.rows] and [r["audit_id"] for r in got.rows] == ["lost-2"]
    assert abs(got.rows[0]["recorded_ms"] - full.rows[0]["recorded_ms"]) < 60_000
    # the kept version's commit is not this log's (e.g. the rows table made again): not used
    path = mark_path(migrated_store, "buckets")
    assert path is not None
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({**doc, "fingerprint": "0" * 64}, fh)
    assert checked_upto(migrated_store, "buckets") is None


@pytest.mark.slow  # three gc runs over every table of the store: minutes on a loaded machine
@pytest.mark.timeout(1800)
def test_gc_appends_the_missing_audit_row_once_its_passes_succeeded(spark, migrated_store, capsys) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.surgery.audit import read_audit

    store = migrated_store.root
    version = tool_commit(spark, migrated_store, "lost-1", sequencers={0: 3, 2: 5})
    # a dry run and a refused run count it and write nothing
    assert main(["gc", "--store", store, "--skip-zk"]) == 0
    out = capsys.readouterr().out
    assert "[plan] audit_recovery" in out and "1 audit rows missing" in out and "lost-1" in out, out
    assert main(["gc", "--store", store, "--skip-zk", "--apply", "--vacuum-retain-hours", "24"]) == 3
    capsys.readouterr()
    assert read_audit(spark, migrated_store) == []
    # gc --apply appends it
    assert main(["gc", "--store", store, "--skip-zk", "--apply"]) == 0
    assert "[done] audit_recovery" in capsys.readouterr().out
    audit = read_audit(spark, migrated_store)
    assert [(a["audit_id"], a["commit_version"], a["rows_upserted"]) for a in audit] == [("lost-1", version, 1)]
    assert json.loads(audit[0]["detail"])["recovered"] is True
    # the next gc starts its check after the version this one read (a dry run keeps nothing)
    from deltawheel.gc.ranlog import checked_upto

    assert (checked_upto(migrated_store, "buckets") or -1) >= version
