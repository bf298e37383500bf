"""Spark's progress under the direct read (``executor/protocol/sparkprogress.py``): a batch whose
tasks read its input files themselves never runs the micro-batch's DataFrame, yet Spark's
``lastProgress`` (what its UI and listeners show) reports the rows the batch read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from continuous_pipeline import UserMinutes, click_rows, write_file

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def _clicks(folder: Path) -> Any:
    """The clicks in ``folder``'s Parquet files, a file per batch."""
    return deltawheel.ParquetInjector("clicks", str(folder), key_column="user", event_time_column="ts",
                                      record_id_column="id", watermark_delay_ms=5_000, max_files_per_trigger=1)


def _executed(query: Any) -> list[Any]:
    return [p for p in query.recentProgress if "addBatch" in p["durationMs"]]


@pytest.mark.timeout(600)
def test_spark_progress_counts_the_rows_a_direct_read_batch_read(spark: Any, zk_config: Any, tmp_path: Path,
                                                                  migrated_at: Any) -> None:
    rows = click_rows(90)
    folder = tmp_path / "input"
    write_file(folder, "part-0.parquet", rows[:50])
    clicks = _clicks(folder)
    store = migrated_at(tmp_path / "store").root  # a migrated copy: connect migrating a new store runs in test_connect.py
    with deltawheel.connect(spark, store=store, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="progress") as engine:
        engine.progress = False
        query = engine.start(clicks, UserMinutes())
        ex = engine.executors[-1]
        query.processAllAvailable()
        assert query.lastProgress["numInputRows"] == 50
        assert [s["numInputRows"] for s in query.lastProgress["sources"]] == [50]
        write_file(folder, "part-1.parquet", rows[50:])
        query.processAllAvailable()
        assert query.lastProgress["numInputRows"] == 40 and query.lastProgress["inputRowsPerSecond"] >= 0
        executed = _executed(query)
        # every batch read its files in the tasks, and Spark's figure is each batch's own count
        assert [r.direct for r in ex.reports] == [True] * len(ex.reports)
        by_batch = {r.batch_id: r.records_in for r in ex.reports}
        assert {int(p["batchId"]): p["numInputRows"] for p in executed} == by_batch
        assert sum(by_batch.values()) == len(rows)


@pytest.mark.timeout(600)
def test_a_direct_read_batch_shows_its_rows_in_a_few_py4j_calls_once_the_query_is_known(
        spark: Any, zk_config: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_at: Any) -> None:
    # the query and its scan's place among the plan's leaves are looked up at the first batch only;
    # each later batch walks to the metric directly (the figure itself checked as above)
    import threading

    import py4j.java_gateway as gateway
    from deltawheel.executor.protocol import batch

    counting = threading.local()
    calls: list[tuple[int, bool]] = []
    send = gateway.GatewayClient.send_command

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(counting, "n", None) is not None:
            counting.n += 1
        return send(self, *args, **kwargs)

    show = batch.show_input_rows

    def show_counted(spark_: Any, rows: int) -> bool:
        counting.n = 0
        try:
            shown = show(spark_, rows)
        finally:
            n, counting.n = counting.n, None
        calls.append((n, shown))
        return shown

    monkeypatch.setattr(gateway.GatewayClient, "send_command", counted)
    monkeypatch.setattr(batch, "show_input_rows", show_counted)
    rows = click_rows(90)
    folder = tmp_path / "input"
    for i, part in enumerate((rows[:30], rows[30:60], rows[60:])):
        write_file(folder, f"part-{i}.parquet", part)
    clicks = _clicks(folder)
    store = migrated_at(tmp_path / "store").root  # a migrated copy: connect migrating a new store runs in test_connect.py
    with deltawheel.connect(spark, store=store, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="progress_calls") as engine:
        engine.progress = False
        query = engine.start(clicks, UserMinutes())
        query.processAllAvailable()
        executed = _executed(query)
        assert {int(p["batchId"]): p["numInputRows"] for p in executed} == {0: 30, 1: 30, 2: 30}
    assert len(calls) == 3 and all(shown for _n, shown in calls), calls
    assert all(n <= 9 for n, _shown in calls[1:]), calls  # was 16-17 per batch before the query was remembered
