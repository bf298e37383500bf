"""GC passes: dry run changes nothing; apply removes old stream records and compacts."""

from __future__ import annotations

import pytest
from deltawheel.gc.passes import run_gc
from deltawheel.statestore.streams import ensure_stream_table, stream_schema_ddl

pytestmark = pytest.mark.spark


def test_gc_dry_run_then_apply(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    path = ensure_stream_table(spark, migrated_store, "clicks")
    ddl = stream_schema_ddl().replace(" NOT NULL", "")
    for i in range(3):  # three appends: three files
        spark.createDataFrame([(f"r{i}", "k", b"1", "json", 1000 * i, None, "p", "c", 1)], ddl) \
            .write.format("delta").mode("append").save(path)
    plan = run_gc(spark, migrated_store, now_ms=10_000, stream_retention_ms=8_500)
    assert not plan.applied
    assert [a.count for a in plan.actions if a.pass_name == "stream_retention"] == [2]
    assert spark.read.format("delta").load(path).count() == 3  # dry run changed nothing
    done = run_gc(spark, migrated_store, now_ms=10_000, stream_retention_ms=8_500, apply=True)
    assert any("[done] stream_retention" in line and "2 records" in line for line in done.lines())
    assert sorted(r["record_id"] for r in spark.read.format("delta").load(path).collect()) == ["r2"]
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    assert detail["numFiles"] == 1  # compacted
