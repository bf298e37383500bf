"""gc's retention of ``late_data`` and ``dead_letters`` (by when a batch recorded the row), through
``deltawheel gc`` as a user runs it, and the background gc's audit recovery (``gc/background.py``).
Real Spark and Delta; the side tables' rows are written with their own columns."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from audit_util import tool_commit
from deltawheel.gc.passes import RetentionError, run_gc
from deltawheel.statestore.tabledefs import DEAD_LETTERS_COLUMNS, LATE_DATA_COLUMNS

from deltawheel.cli import main

pytestmark = pytest.mark.spark

HOUR = 3_600_000


def _side_rows(spark: Any, layout: Any, now_ms: int) -> None:
    """Late records recorded 1, 3 and 5 hours ago; dead letters 1 and 50 hours ago."""
    late = [("c", "events", f"late-{h}", "k", b"1", "json", 1_000, 2_000, "late", 1, now_ms - h * HOUR, 1)
            for h in (1, 3, 5)]
    spark.createDataFrame(late, LATE_DATA_COLUMNS).write.format("delta").mode("append").save(layout.late_data)
    dead = [("c", "events", f"dead-{h}", "k", b"x", "ValueError: bad", "p", 1_000, 1, now_ms - h * HOUR, 1)
            for h in (1, 50)]
    spark.createDataFrame(dead, DEAD_LETTERS_COLUMNS).write.format("delta").mode("append").save(layout.dead_letters)


def _ids(spark: Any, path: str) -> list[str]:
    return sorted(r[0] for r in spark.read.format("delta").load(path).select("record_id").collect())


@pytest.mark.slow  # three gc runs over every table of the store: minutes on a loaded machine
@pytest.mark.timeout(1800)
def test_gc_deletes_late_data_and_dead_letters_past_their_retention(spark, migrated_store, capsys) -> None:  # type: ignore[no-untyped-def]
    store = migrated_store.root
    _side_rows(spark, migrated_store, int(time.time() * 1000))
    flags = ["--late-data-retention-hours", "2", "--dead-letter-retention-hours", "24"]
    # the plan counts them and changes nothing
    assert main(["gc", "--store", store, "--skip-zk", *flags]) == 0
    out = capsys.readouterr().out
    assert "[plan] late_data_retention late_data: 2 records recorded before" in out, out
    assert re.search(r"late_data: 2 records recorded before \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+ ms\) \(2 h ago\)",
                     out), out
    assert "[plan] dead_letter_retention dead_letters: 1 records recorded before" in out, out
    assert _ids(spark, migrated_store.late_data) == ["late-1", "late-3", "late-5"]
    assert _ids(spark, migrated_store.dead_letters) == ["dead-1", "dead-50"]
    # a replay horizon kept does not refuse them: replay re-reads the inputs, never these tables
    assert main(["gc", "--store", store, "--skip-zk", "--apply", "--keep-replay-hours", "100", *flags]) == 0
    out = capsys.readouterr().out
    assert "[done] late_data_retention late_data: 2 records" in out, out
    assert "[done] dead_letter_retention dead_letters: 1 records" in out, out
    assert _ids(spark, migrated_store.late_data) == ["late-1"]
    assert _ids(spark, migrated_store.dead_letters) == ["dead-1"]
    # without the flags nothing of them is collected
    assert main(["gc", "--store", store, "--skip-zk"]) == 0
    out = capsys.readouterr().out
    assert "late_data_retention" not in out and "dead_letter_retention" not in out, out


def test_gc_refuses_a_negative_side_table_retention(spark, migrated_store, capsys) -> None:  # type: ignore[no-untyped-def]
    _side_rows(spark, migrated_store, 10 * HOUR)
    with pytest.raises(SystemExit) as exit_:
        main(["gc", "--store", migrated_store.root, "--late-data-retention-hours", "-1"])
    assert exit_.value.code == 2
    assert "must be >= 0 hours, got -1" in capsys.readouterr().err
    with pytest.raises(RetentionError, match=r"the dead-letter retention must be >= 0 hours, got -1; nothing was"):
        run_gc(spark, migrated_store, now_ms=10 * HOUR, apply=True, dead_letter_retention_ms=-HOUR)
    with pytest.raises(RetentionError, match=r"the late-data retention must be >= 0 hours"):
        run_gc(spark, migrated_store, now_ms=10 * HOUR, apply=True, late_data_retention_ms=-1)
    assert _ids(spark, migrated_store.late_data) == ["late-1", "late-3", "late-5"]


@pytest.mark.slow  # three background gc runs over every table: minutes on a loaded machine
@pytest.mark.timeout(1800)
def test_background_gc_recovers_a_missing_audit_row_past_its_grace(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """A tool that died between its rows commit and its audit row: the background gc of a running
    pipeline appends the row, but not while the commit is younger than the grace (the tool may be
    about to append it itself)."""
    from deltawheel.gc.background import BackgroundGc
    from deltawheel.statestore.exceptions import ConfigError
    from deltawheel.statestore.surgery.audit import read_audit

    with pytest.raises(ConfigError, match=r"audit_grace_ms must be >= 0, got -1"):
        BackgroundGc(spark, migrated_store, every_batches=1, audit_grace_ms=-1)
    version = tool_commit(spark, migrated_store, "lost-bg", sequencers={0: 3})
    young = BackgroundGc(spark, migrated_store, every_batches=1)  # the default grace: 10 minutes
    assert young.batch_done() and young.wait(600)
    assert not young.failures and young.reports, young.failures
    assert read_audit(spark, migrated_store) == []
    assert not any(a.pass_name == "audit_recovery" for a in young.reports[-1].actions)
    lines: list[str] = []
    background = BackgroundGc(spark, migrated_store, every_batches=1, audit_grace_ms=0, progress=lines.append)
    assert background.batch_done() and background.wait(600)
    assert not background.failures and background.reports, background.failures
    audit = read_audit(spark, migrated_store)
    assert [(a["audit_id"], a["commit_version"], a["tool"]) for a in audit] == [("lost-bg", version, "repair")]
    assert json.loads(audit[0]["detail"])["recovered"] is True
    assert "1 missing audit rows recovered" in lines[-1], lines
    # the next run finds none missing: nothing appended twice
    assert background.batch_done() and background.wait(600)
    assert [a["audit_id"] for a in read_audit(spark, migrated_store)] == ["lost-bg"]
