"""State TTL and state versions in pipelines on real Spark, ZooKeeper and Delta, written as a user
would: ``deltawheel.connect``, a ``ParquetInjector``, ``engine.start`` / ``engine.run``.

* Event time: three files read one per batch; two users click only in the first, one in every
  file. When the watermark has moved a minute past the two idle users, the next batch drops them
  (their intervals run for it though no record of theirs comes): the batch line and the metrics
  table count them, the rows table no longer holds them; the busy user keeps its count. On each
  write path.
* Processing time: two runs of the same store, the executor's clock eleven minutes later in the
  second; users of the first run not seen again are dropped in the second.
* State versions: a run with the v1 class, then the same store with the v2 class: touched users'
  rows are upgraded (and written as ``json@2``), untouched ones stay v1, the counts go on; an
  upgrade that raises fails the batch (``UserCodeError`` naming the key and the
  ``StateUpgradeError``), nothing committed; the same batch with the dead-letter policy sends the
  key's record to ``dead_letters`` and leaves its row as it was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.protocol.metrics import read_batches
from deltawheel.statestore.clock import ManualClock
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX
from ttl_util import IdleVisits, TotalsV1, TotalsV2, TotalsV2Broken, TotalsV2BrokenDeadLetter, Visits

import deltawheel
from deltawheel import ParquetInjector, UserCodeError

pytestmark = [pytest.mark.spark, pytest.mark.zk]

T = 1_700_000_000_000  # event times (ms) near the clocks' start
MINUTE = 60_000
J = get_codec("json")


def write_clicks(folder: Path, name: str, clicks: list[tuple[str, int]], *, mtime: int) -> None:
    """One Parquet file of (user, event time) clicks; ``mtime`` orders the files for the stream."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    pq.write_table(pa.Table.from_pylist([{"user": u, "ts": ts} for u, ts in clicks]), path)
    os.utime(path, (mtime, mtime))


def rows_of(spark: Any, store: Path, computation: str) -> dict[str, tuple[Any, str]]:
    """key -> (decoded state, codec column) of the computation's rows that hold a state."""
    df = spark.read.format("delta").load(StoreLayout(str(store)).rows_of(computation))
    got = df.where(f"computation = '{computation}' AND key != '{FENCE_KEY}' AND state IS NOT NULL").collect()
    return {r["key"]: (J.decode(bytes(r["state"])), r["codec"]) for r in got}


def keys_of(spark: Any, store: Path, computation: str) -> set[str]:
    """The keys the computation's rows table holds a key row for (state, timers or record ids kept in
    the row). On the image path a key's record ids live in the interval's ids files (rows under
    ``IDS_KEY_PREFIX + key``), which leave whole at the dedup horizon, not with the key's TTL: a
    redelivered record of an expired key is still a duplicate until then (docs/operations.md)."""
    df = spark.read.format("delta").load(StoreLayout(str(store)).rows_of(computation))
    return {r["key"] for r in df.where(f"computation = '{computation}' AND key != '{FENCE_KEY}'").collect()
            if not r["key"].startswith(IDS_KEY_PREFIX)}


def injector(folder: Path) -> ParquetInjector:
    return ParquetInjector("clicks", str(folder), key_column=None, event_time_column="ts", watermark_delay_ms=0,
                           max_files_per_trigger=1)


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])
def test_idle_keys_expire_in_event_time_with_no_further_records(spark, zk_server, tmp_path,  # type: ignore[no-untyped-def]
                                                                write_path: str, migrated_at) -> None:
    folder, store = tmp_path / "clicks", tmp_path / "store"
    migrated_at(store)  # a migrated copy: connect migrating a new store runs in test_connect.py
    write_clicks(folder, "part-0.parquet", [("ann", T + 1_000), ("bob", T + 2_000), ("cy", T + 3_000)],
                 mtime=1_000_000)
    write_clicks(folder, "part-1.parquet", [("cy", T + 5 * MINUTE)], mtime=1_000_100)
    write_clicks(folder, "part-2.parquet", [("cy", T + 10 * MINUTE)], mtime=1_000_200)
    lines: list[str] = []
    with deltawheel.connect(spark, store=str(store), zk=zk_server.hosts, pipeline="ttl") as engine:
        engine.progress = lines.append
        engine.start(injector(folder), Visits(), available_now=True, write_path=write_path).awaitTermination()
        reports = list(engine.executors[-1].reports)
        # ann and bob: idle since their first click, a minute passed in event time by the third
        # batch's watermark (the second file's 5 min): that batch drops them, with no record of theirs
        assert [r.keys_expired for r in reports] == [0, 0, 2]
        assert rows_of(spark, store, "visits") == {"cy": (3, "json")}
        assert keys_of(spark, store, "visits") == {"cy"}  # no key row is left for them
    assert sum("2 keys expired (state TTL)" in line for line in lines) == 1
    metrics = read_batches(StoreLayout(str(store)), pipeline="ttl")
    assert sorted(m["keys_expired"] for m in metrics) == [0, 0, 2]


@pytest.mark.timeout(1500)
def test_idle_keys_expire_in_processing_time_in_a_later_run(  # type: ignore[no-untyped-def]
        spark, zk_server, tmp_path, migrated_at) -> None:
    folder, store = tmp_path / "clicks", tmp_path / "store"
    migrated_at(store)  # a migrated copy: connect migrating a new store runs in test_connect.py
    clock = ManualClock(T)
    write_clicks(folder, "part-0.parquet", [("ann", T + 1_000), ("bob", T + 2_000), ("cy", T + 3_000)],
                 mtime=1_000_000)
    with deltawheel.connect(spark, store=str(store), zk=zk_server.hosts, pipeline="idle") as engine:
        engine.start(injector(folder), IdleVisits(), available_now=True, clock=clock).awaitTermination()
        assert [r.keys_expired for r in engine.executors[-1].reports] == [0]
    clock.set(T + 11 * MINUTE)  # ten minutes (the TTL) and one later
    write_clicks(folder, "part-1.parquet", [("cy", T + 4_000)], mtime=1_000_100)
    with deltawheel.connect(spark, store=str(store), zk=zk_server.hosts, pipeline="idle") as engine:
        engine.start(injector(folder), IdleVisits(), available_now=True, clock=clock).awaitTermination()
        assert [r.keys_expired for r in engine.executors[-1].reports] == [2]
        assert rows_of(spark, store, "visits") == {"cy": (2, "json")}
        assert keys_of(spark, store, "visits") == {"cy"}


@pytest.mark.timeout(1500)
def test_a_v2_computation_upgrades_the_v1_rows_it_touches_while_the_pipeline_runs(  # type: ignore[no-untyped-def]
        spark, zk_server, tmp_path, migrated_at) -> None:
    folder, store = tmp_path / "clicks", tmp_path / "store"
    migrated_at(store)  # a migrated copy: connect migrating a new store runs in test_connect.py
    write_clicks(folder, "part-0.parquet", [("ann", T + 1_000), ("ann", T + 2_000), ("bob", T + 3_000),
                                            ("bob", T + 3_500)], mtime=1_000_000)
    with deltawheel.connect(spark, store=str(store), zk=zk_server.hosts, pipeline="ver") as engine:
        engine.run(injector(folder), TotalsV1(), progress=False)
    assert rows_of(spark, store, "totals") == {"ann": (2, "json"), "bob": (2, "json")}
    write_clicks(folder, "part-1.parquet", [("ann", T + 4_000), ("cy", T + 5_000)], mtime=1_000_100)
    with deltawheel.connect(spark, store=str(store), zk=zk_server.hosts, pipeline="ver") as engine:
        engine.run(injector(folder), TotalsV2(), progress=False)
    # ann upgraded on its first touch and counted on; bob untouched (still v1); cy new (v2)
    assert rows_of(spark, store, "totals") == {"ann": ({"n": 3, "last": T + 4_000}, "json@2"),
                                               "bob": (2, "json"), "cy": ({"n": 1, "last": T + 5_000}, "json@2")}
    totals = spark.read.format("delta").load(StoreLayout(str(store)).stream("totals")).collect()
    assert sorted((r["key"], J.decode(bytes(r["value"]))["n"]) for r in totals) == [
        ("ann", 1), ("ann", 2), ("ann", 3), ("bob", 1), ("bob", 2), ("cy", 1)]
    # a v2 whose upgrade raises on bob's count fails the batch that touches bob, naming the key
    write_clicks(folder, "part-2.parquet", [("bob", T + 6_000)], mtime=1_000_200)
    with deltawheel.connect(spark, store=str(store), zk=zk_server.hosts, pipeline="ver") as engine:
        with pytest.raises(UserCodeError, match=r"key 'bob' on its stored state \(json\): StateUpgradeError: "
                                                   r"upgrade_state of totals from state_version 1 to 2 failed"):
            engine.run(injector(folder), TotalsV2Broken(), progress=False)
    assert rows_of(spark, store, "totals")["bob"] == (2, "json")  # nothing changed
    # the same batch again with the dead-letter policy: bob's record is a dead letter, its row stays v1
    with deltawheel.connect(spark, store=str(store), zk=zk_server.hosts, pipeline="ver") as engine:
        engine.run(injector(folder), TotalsV2BrokenDeadLetter(), progress=False)
    dead = spark.read.format("delta").load(StoreLayout(str(store)).dead_letters).collect()
    assert [(r["key"], r["event_time_ms"], "StateUpgradeError: upgrade_state of totals" in r["error"])
            for r in dead] == [("bob", T + 6_000, True)]
    assert rows_of(spark, store, "totals")["bob"] == (2, "json")


def test_a_metrics_table_of_an_older_deltawheel_gets_the_keys_expired_column(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    from deltawheel.executor.protocol.metrics import METRICS_COLUMNS, BatchMetrics, batch_row
    from deltawheel.executor.protocol.reports import BatchReport

    layout = StoreLayout(str(tmp_path / "store"))
    old_columns = METRICS_COLUMNS.replace(", keys_expired BIGINT", "")
    assert old_columns != METRICS_COLUMNS
    spark.sql(f"CREATE TABLE delta.`{layout.metrics_batches}` ({old_columns}) USING DELTA")
    report = dataclasses.replace(BatchReport.empty(7, input_watermark_ms=None, low_watermark_ms=None, wall_s=0.1),
                                 keys_expired=3)
    metrics = BatchMetrics(spark, layout)
    assert metrics.append(batch_row(report, pipeline="p", computation="c", instance=None, write_path="image",
                                    started_ms=0))
    assert "keys_expired" in spark.read.format("delta").load(layout.metrics_batches).columns
    assert [(r["batch_id"], r["keys_expired"]) for r in read_batches(layout)] == [(7, 3)]
