"""The per-batch metrics table (``_metrics/batches``) made from Python on a local store: the table
Spark's ``CREATE TABLE`` makes, appended to and read back; an older table gets the new columns."""

from __future__ import annotations

from typing import Any

import pytest
from delta_util import assert_made_as_spark_makes, detail, first_commit

pytestmark = [pytest.mark.spark]


def _row(batch: int, **more: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"pipeline": "p", "computation": "c", "instance": "i", "write_path": "image",
                           "batch_id": batch, "started_ms": 1_000 * batch, "recorded_ms": 1_000 * batch + 5,
                           "wall_s": 0.25, "commit_s": 0.01, "steps_s": {"plan": 0.01, "commit": 0.01},
                           "records_in": 10, "processed": 10, "format_version": 1}
    row.update(more)
    return row


@pytest.mark.timeout(600)
def test_the_metrics_table_made_from_python_is_the_one_spark_makes_and_takes_rows(spark, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.protocol.metrics import BatchMetrics, read_batches
    from deltawheel.statestore.delta import create
    from deltawheel.statestore.layout import StoreLayout

    py, sp = StoreLayout(str(tmp_path / "py")), StoreLayout(str(tmp_path / "sp"))
    made: list[str] = []
    real = create.create_local_table
    monkeypatch.setattr(create, "create_local_table", lambda *a, **k: made.append(a[1]) or real(*a, **k))
    assert BatchMetrics(spark, py).append(_row(0), _row(1))
    assert made == [py.metrics_batches]
    monkeypatch.setattr(create, "create_local_table", lambda *a, **k: False)  # Spark's CREATE TABLE
    assert BatchMetrics(spark, sp).append(_row(0), _row(1))

    mine, theirs = first_commit(py.metrics_batches), first_commit(sp.metrics_batches)
    assert_made_as_spark_makes(mine, theirs)
    assert detail(spark, py.metrics_batches) == detail(spark, sp.metrics_batches)
    assert spark.read.format("delta").load(py.metrics_batches).schema == \
        spark.read.format("delta").load(sp.metrics_batches).schema

    # rows appended afterwards, read by Spark and by read_batches (no Spark on a local store)
    monkeypatch.setattr(create, "create_local_table", real)
    again = BatchMetrics(spark, py)
    assert again.append(_row(2, keys_expired=3, image_cache_hit_rate=0.5))
    assert [r["batch_id"] for r in read_batches(py)] == [0, 1, 2]
    got = {r["batch_id"]: r for r in spark.read.format("delta").load(py.metrics_batches).collect()}
    assert got[2]["steps_s"] == {"plan": 0.01, "commit": 0.01} and got[2]["image_cache_hit_rate"] == 0.5
    assert first_commit(py.metrics_batches) == mine  # an existing table is left as it is


@pytest.mark.timeout(600)
def test_an_older_metrics_table_gets_the_columns_added_since(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A table made by a deltawheel before ``keys_expired`` and ``image_cache_hit_rate``: the first
    append adds them (through Spark, which reads the table's schema); its old rows read them as null."""
    from deltawheel.executor.protocol.metrics import (
        _ADDED_COLUMNS,
        METRICS_COLUMNS,
        BatchMetrics,
        read_batches,
    )
    from deltawheel.statestore.layout import StoreLayout

    layout = StoreLayout(str(tmp_path / "old"))
    old_cols = METRICS_COLUMNS
    for c in _ADDED_COLUMNS:
        old_cols = old_cols.replace(f", {c}", "")
    assert "keys_expired" not in old_cols and "image_cache_hit_rate" not in old_cols
    spark.sql(f"CREATE TABLE delta.`{layout.metrics_batches}` ({old_cols}) USING DELTA")
    names = [c.strip().split(" ", 1)[0] for c in old_cols.replace("MAP<STRING, DOUBLE>", "MAP").split(",")]
    old_row = _row(0, recorded_ms=500)
    spark.createDataFrame([tuple(old_row.get(n) for n in names)], old_cols).write.format("delta") \
        .mode("append").save(layout.metrics_batches)
    assert BatchMetrics(spark, layout).append(_row(1, keys_expired=7))
    rows = {r["batch_id"]: r for r in read_batches(layout)}
    assert rows[1]["keys_expired"] == 7 and rows[0]["keys_expired"] is None
