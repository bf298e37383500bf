"""A standby's Delta warm-up (``statestore/delta/warm.py``): one scratch commit per process that
leaves nothing behind, and a snapshot refresh that sees another process's commit."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltawheel.statestore.delta import warm
from deltawheel.statestore.delta.txn import TableLog

pytestmark = pytest.mark.spark


def test_the_warm_up_commits_once_per_process_and_leaves_no_folder(spark, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(warm, "_warmed", False)
    before = set(Path(tempfile.gettempdir()).glob("deltawheel-warm-*"))
    took = warm.warm_commits(spark)
    assert took is not None and took > 0
    assert set(Path(tempfile.gettempdir()).glob("deltawheel-warm-*")) == before
    assert warm.warm_commits(spark) is None  # once per process


def _commit_by_hand(table: Path, version: int, rel: str) -> None:
    """A commit as another process writes it: the data file, then the next ``N.json`` of the log."""
    (table / rel).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"x": pa.array([7], pa.int32())}), table / rel)
    add = {"add": {"path": rel, "partitionValues": {}, "size": (table / rel).stat().st_size,
                   "modificationTime": int(time.time() * 1000), "dataChange": True,
                   "stats": json.dumps({"numRecords": 1})}}
    info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE",
                           "operationParameters": {"mode": "Append"}, "isBlindAppend": True}}
    (table / "_delta_log" / f"{version:020d}.json").write_text(
        json.dumps(info) + "\n" + json.dumps(add) + "\n", encoding="utf-8")


@pytest.mark.parametrize("others", [1, 3])
def test_a_refresh_brings_the_jvms_snapshot_to_another_writers_commits(spark, tmp_path: Path,
                                                                       others: int) -> None:  # type: ignore[no-untyped-def]
    table = tmp_path / "t"
    spark.createDataFrame([(1,)], "x int").write.format("delta").save(str(table))
    log = TableLog(spark, str(table))
    assert log.version_now() == 0
    for v in range(1, others + 1):
        _commit_by_hand(table, v, f"part-hand-{v}.parquet")
    jlog = log._log  # the JVM's cached DeltaLog, as a takeover's claim finds it
    assert int(jlog.unsafeVolatileSnapshot().version()) == 0  # not seen without a refresh
    assert warm.refresh(spark, str(table)) == others
    assert int(jlog.unsafeVolatileSnapshot().version()) == others
    assert spark.read.format("delta").load(str(table)).count() == 1 + others


def test_a_refresh_of_a_missing_table_is_no_version_and_no_error(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert warm.refresh(spark, str(tmp_path / "none")) in (-1, None)
