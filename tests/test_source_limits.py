"""File injectors fit for continuous input: a given ``schema=`` lets a Parquet injector start on an
empty folder (a file that does not match it is refused, typed), and by default a micro-batch reads
every new file (no backlog grows while files keep arriving)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from continuous_pipeline import click_rows, write_file
from deltawheel.executor.sources.injector import BatchStats
from deltawheel.executor.sources.jsonl import JsonLinesInjector
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.statestore.exceptions import ConfigError

import deltawheel

SCHEMA = "user STRING, ts BIGINT, id STRING"  # the columns continuous_pipeline.write_file writes
ARGS: dict[str, Any] = {"key_column": "user", "event_time_column": "ts", "record_id_column": "id",
                        "watermark_delay_ms": 5_000}


def batches_of(df: Any, checkpoint: Path) -> list[BatchStats]:
    """Consume a streaming DataFrame with availableNow; the stats of each micro-batch."""
    out: list[BatchStats] = []
    query = (df.writeStream.trigger(availableNow=True).option("checkpointLocation", str(checkpoint))
             .foreachBatch(lambda batch_df, _id: out.append(BatchStats.of(batch_df))).start())
    assert query.awaitTermination(120), "the availableNow query did not finish"
    return out


@pytest.mark.spark
def test_by_default_a_micro_batch_reads_every_waiting_file(spark: Any, tmp_path: Path) -> None:
    rows = click_rows(30)
    for i in range(3):
        write_file(tmp_path / "in", f"part-{i}.parquet", rows[10 * i:10 * i + 10])
    default = batches_of(ParquetInjector("events", str(tmp_path / "in"), **ARGS).stream_df(spark), tmp_path / "ck1")
    assert [(b.count, len(b.sources)) for b in default] == [(30, 3)]
    capped = ParquetInjector("events", str(tmp_path / "in"), **ARGS, max_files_per_trigger=2)
    assert [b.count for b in batches_of(capped.stream_df(spark), tmp_path / "ck2")] == [20, 10]
    by_bytes = ParquetInjector("events", str(tmp_path / "in"), **ARGS, max_bytes_per_trigger=1)
    assert [b.count for b in batches_of(by_bytes.stream_df(spark), tmp_path / "ck3")] == [10, 10, 10]

    (tmp_path / "json").mkdir()
    for i in range(2):
        (tmp_path / "json" / f"{i}.jsonl").write_text(f'{{"user": "u{i}", "ts": {i}, "id": "j{i}"}}\n')
    lines = JsonLinesInjector("lines", str(tmp_path / "json"), schema=SCHEMA, **ARGS)
    assert [b.count for b in batches_of(lines.stream_df(spark), tmp_path / "ck4")] == [2]
    (tmp_path / "none").mkdir()  # a JSON Lines injector with a schema starts on an empty folder too
    empty = JsonLinesInjector("lines", str(tmp_path / "none"), schema=SCHEMA, **ARGS)
    assert batches_of(empty.stream_df(spark), tmp_path / "ck5") == []


@pytest.mark.spark
def test_a_file_that_does_not_match_the_given_schema_is_refused(spark: Any, tmp_path: Path) -> None:
    write_file(tmp_path / "in", "part-0.parquet", click_rows(5))
    with pytest.raises(ConfigError, match=r"injector events: file part-0\.parquet does not match the given schema: "
                                          r"ts is BIGINT in the file, DOUBLE in the schema; region is missing"):
        ParquetInjector("events", str(tmp_path / "in"), schema="user STRING, ts DOUBLE, id STRING, region STRING",
                        **ARGS).stream_df(spark)
    with pytest.raises(ConfigError, match=r"is not a Spark DDL column list"):
        ParquetInjector("events", str(tmp_path / "in"), schema="user STRANGE,,", **ARGS).stream_df(spark)
    with pytest.raises(ConfigError, match=r"injector events: give max_files_per_trigger or max_bytes_per_trigger, "
                                          r"not both"):
        ParquetInjector("events", str(tmp_path / "in"), **ARGS, max_files_per_trigger=2, max_bytes_per_trigger=10)
    with pytest.raises(ConfigError, match=r"max_bytes_per_trigger must be >= 1, got 0"):
        JsonLinesInjector("lines", str(tmp_path / "in"), **ARGS, max_bytes_per_trigger=0)


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(600)
def test_a_parquet_injector_with_a_schema_starts_on_an_empty_folder(spark: Any, zk_config: Any,
                                                                     tmp_path: Path, migrated_at: Any) -> None:
    """The query starts before any file exists; files renamed in later are each read once, by the
    tasks themselves (the direct read works from the given schema)."""
    from executor_util import Copier, stream_rows

    rows = [{**r, "user": f"k{i % 4}"} for i, r in enumerate(click_rows(40))]
    folder = tmp_path / "in"
    folder.mkdir()
    events = ParquetInjector("events", str(folder), schema=SCHEMA, **ARGS)
    store = migrated_at(tmp_path / "store").root  # a migrated copy: connect migrating a new store runs in test_connect.py
    with deltawheel.connect(spark, store=store, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="empty_start") as engine:
        engine.progress = False
        query = engine.start(events, Copier(), trigger="200 milliseconds")
        ex = engine.executors[-1]
        for i in range(4):
            write_file(folder, f"part-{i}.parquet", rows[10 * i:10 * i + 10])
            time.sleep(0.3)
        deadline = time.monotonic() + 240
        while ex.records_in_total < len(rows) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ex.records_in_total == len(rows)
        assert query.isActive
        read = [r for r in ex.reports if r.records_in]
        assert read and all(r.direct for r in read), read
    copies = stream_rows(spark, engine.layout, "copies")  # the last batch's delivery lands at the stop
    got = [(json.loads(r[2])["id"], r[1], r[3]) for r in copies]
    assert sorted(got) == sorted((r["id"], r["user"], r["ts"]) for r in rows)  # each once
