"""Injectors (executor/sources/) and the Zeitgeist generator (deltawheel/demo/zeitgeist.py).

Streams are consumed with real Spark file / Delta streaming sources
(``trigger(availableNow=True)`` into ``foreachBatch``); watermarks are
published through a real :class:`WatermarkAuthority` on the test ZooKeeper.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from deltawheel.executor.sources.delta import DeltaTableInjector
from deltawheel.executor.sources.injector import BatchStats, Injector, MaxSeenMinusBound, publish_watermark
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.statestore.exceptions import ConfigError, StaleSequencerError
from deltawheel.statestore.writepath.streams import STREAM_FORMAT_VERSION, stream_schema_ddl
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.watermarks import END_OF_TIME, WatermarkAuthority

from deltawheel.demo.zeitgeist import (
    AnomalySchedule,
    GeneratorInjector,
    ZeitgeistParams,
    generate_queries,
    table_digest,
    write_event_files,
)

#: 300 events in 3 files of 100; rate 100/s, so ~1 s of base time per file.
SMALL = ZeitgeistParams(n_events=300, seed=11, late_fraction=0.05, late_after_events=100)
Batch = tuple[int, list[Any], BatchStats]


def run_stream(df: Any, checkpoint: Path) -> list[Batch]:
    """Consume a streaming DataFrame with availableNow; return (batch id, rows, stats) per batch."""
    from pyspark.sql import functions as F

    batches: list[Batch] = []

    def collect(batch_df: Any, batch_id: int) -> None:
        rows = batch_df.withColumn("ev_ms", F.unix_millis("event_time")).collect()
        batches.append((batch_id, rows, BatchStats.of(batch_df)))

    query = (df.writeStream.trigger(availableNow=True).option("checkpointLocation", str(checkpoint))
             .foreachBatch(collect).start())
    assert query.awaitTermination(120), "the availableNow query did not finish"
    return batches


def event_ms(params: ZeitgeistParams) -> np.ndarray:
    return np.array(params.generate().column("event_time").cast("int64").to_pylist())


# --- the generator ------------------------------------------------------------


def test_generator_is_deterministic_per_arguments() -> None:
    a, b = generate_queries(2000, seed=1), generate_queries(2000, seed=1)
    assert a.equals(b) and table_digest(a) == table_digest(b)
    assert table_digest(generate_queries(2000, seed=2)) != table_digest(a)
    assert table_digest(generate_queries(2001, seed=1)) != table_digest(a)
    ids = a.column("record_id").to_pylist()
    assert ids[0] == "q1-0000000000" and len(set(ids)) == 2000
    assert str(a.schema.field("event_time").type) == "timestamp[ms, tz=UTC]"


def test_generator_has_spike_dip_and_bounded_disorder_with_few_late_events() -> None:
    params = ZeitgeistParams(n_events=20_000, seed=3)
    table, win = params.generate(), params.windows()
    queries = np.array(table.column("query").to_pylist())
    ev = event_ms(params)
    base = params.start_ms + np.arange(params.n_events) * 1000 // params.rate_per_s
    in_spike = (base >= win.spike_start_ms) & (base < win.spike_end_ms)
    in_dip = (base >= win.dip_start_ms) & (base < win.dip_end_ms)
    spike_in, spike_out = (queries[in_spike] == win.spike_query).mean(), (queries[~in_spike] == win.spike_query).mean()
    assert spike_in > 5 * spike_out > 0
    assert (queries[in_dip] == win.dip_query).sum() == 0
    assert (queries[~in_dip] == win.dip_query).mean() > 0.15  # the most popular query, otherwise
    assert win.spike_end_ms - win.spike_start_ms == 20_000 and win.dip_end_ms - win.dip_start_ms == 30_000
    lag = base - ev
    late = lag > params.max_disorder_ms
    assert lag.min() >= 0 and lag[~late].max() <= params.max_disorder_ms
    assert np.all(lag[late] >= params.late_by_ms)
    assert 0.5 * 0.002 * 19_000 < late.sum() < 2 * 0.002 * 19_000
    assert not late[: params.late_after_events].any()


def test_generator_writes_files_idempotently(tmp_path: Path) -> None:
    folder = str(tmp_path / "events")
    gen = GeneratorInjector("queries", folder, SMALL, events_per_batch=100)
    paths = gen.prepare()
    assert [os.path.basename(p) for p in paths] == [f"part-{i:05d}.parquet" for i in range(3)]
    mtimes = [os.stat(p).st_mtime for p in paths]
    assert mtimes == sorted(mtimes) and len(set(mtimes)) == 3
    digests = [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths]
    assert GeneratorInjector("queries", folder, SMALL, events_per_batch=100).prepare() == paths
    assert [hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths] == digests
    assert [os.stat(p).st_mtime for p in paths] == mtimes
    manifest = json.loads((tmp_path / "events" / "_zeitgeist.json").read_text())
    assert manifest["anomalies"]["dip_query"] == "weather" and manifest["params"]["seed"] == 11
    assert sorted(os.listdir(folder)) == ["_zeitgeist.json", *[os.path.basename(p) for p in paths]]
    with pytest.raises(ConfigError, match="exists with different events .* fresh folder"):
        GeneratorInjector("queries", folder, replace(SMALL, seed=12), events_per_batch=100).prepare()


@pytest.mark.parametrize(("call", "match"), [
    (lambda: generate_queries(-1, seed=0), "need n_events >= 0"),
    (lambda: generate_queries(10, seed=0, n_queries=1), "n_queries > 1"),
    (lambda: generate_queries(10, seed=0, late_fraction=1.5), "late_fraction must be in"),
    (lambda: generate_queries(10, seed=0, n_queries=3), "must be query ranks below n_queries=3"),
    (lambda: AnomalySchedule(spike_rank=0).check(50), "must be different queries"),
    (lambda: AnomalySchedule(spike_factor=1.0).check(50), "spike_factor must be > 1"),
    (lambda: AnomalySchedule(dip_start=0.9, dip_end=0.8).check(50), r"dip interval \[0.9, 0.8\)"),
    (lambda: AnomalySchedule(dip_start=0.45).check(50), "must not overlap"),
    (lambda: write_event_files(generate_queries(1, seed=0), "/nonexistent", events_per_batch=0,
                               first_mtime_s=0), "events_per_batch must be >= 1"),
    (lambda: GeneratorInjector("g", "/nonexistent", SMALL, events_per_batch=0), "events_per_batch must be >= 1"),
    (lambda: MaxSeenMinusBound(-1), "watermark_delay_ms must be >= 0"),
])
def test_bad_generator_and_estimate_arguments(call: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        call()


# --- watermark estimates ----------------------------------------------------------


def test_max_seen_minus_bound_never_moves_backwards(tmp_path: Path) -> None:
    inj = ParquetInjector("src", str(tmp_path), key_column="key", event_time_column="t", watermark_delay_ms=10_000, max_files_per_trigger=1)
    assert isinstance(inj, Injector)
    assert inj.watermark_ms() is None
    inj.observe(BatchStats(0))  # an empty batch tells nothing
    assert inj.watermark_ms() is None
    inj.observe(BatchStats(3, 40_000, 100_000))
    assert inj.watermark_ms() == 90_000
    inj.observe(BatchStats(2, 1_000, 95_000))  # older data: late, and no step back
    assert inj.watermark_ms() == 90_000
    inj.observe(BatchStats(1, 130_000, 130_000))
    assert inj.watermark_ms() == 120_000
    inj.finish()
    assert inj.watermark_ms() == END_OF_TIME


@pytest.mark.zk
def test_publish_watermark_through_the_authority(tmp_path: Path, zk_config: Any) -> None:
    client = connect(zk_config)
    try:
        authority = WatermarkAuthority(client, pipeline="zeitgeist")
        first = ParquetInjector("queries", str(tmp_path), key_column=None, event_time_column="t",
                                watermark_delay_ms=3_000, max_files_per_trigger=1)
        assert publish_watermark(authority, first, sequencer=1) is None
        assert authority.injector_watermark("queries") is None
        first.observe(BatchStats(10, 20_000, 50_000))
        assert publish_watermark(authority, first, sequencer=1) == 47_000
        # A restarted instance has seen less so far: its estimate is lower, the stored one stays.
        restarted = ParquetInjector("queries", str(tmp_path), key_column=None, event_time_column="t",
                                    watermark_delay_ms=3_000, max_files_per_trigger=1)
        restarted.observe(BatchStats(5, 10_000, 40_000))
        assert restarted.watermark_ms() == 37_000
        assert publish_watermark(authority, restarted, sequencer=2) == 47_000
        assert authority.injector_watermark("queries") == 47_000
        with pytest.raises(StaleSequencerError, match="another instance runs this source"):
            publish_watermark(authority, first, sequencer=1)
        restarted.finish()
        assert publish_watermark(authority, restarted, sequencer=2) == END_OF_TIME
        assert authority.snapshot()["injectors"]["queries"]["watermark_ms"] == END_OF_TIME
    finally:
        client.stop()
        client.close()


# --- streaming ----------------------------------------------------------------------


@pytest.mark.spark
def test_parquet_injector_streams_exactly_the_input_in_the_stream_schema(spark: Any, tmp_path: Path) -> None:
    folder = str(tmp_path / "events")
    GeneratorInjector("queries", folder, SMALL, events_per_batch=100).prepare()
    source = SMALL.generate()
    expected = {(f"queries/part-{i // 100:05d}.parquet#{i % 100}", q, t) for i, (q, t) in enumerate(
        zip(source.column("query").to_pylist(), event_ms(SMALL).tolist(), strict=True))}

    def make() -> ParquetInjector:
        return ParquetInjector("queries", folder, key_column="query", event_time_column="event_time",
                               watermark_delay_ms=3_000, max_files_per_trigger=1)

    inj = make()
    df = inj.stream_df(spark)
    want = spark.createDataFrame([], stream_schema_ddl()).schema
    assert [(f.name, f.dataType) for f in df.schema.fields] == [(f.name, f.dataType) for f in want.fields]
    runs = [run_stream(df, tmp_path / "ck1"), run_stream(make().stream_df(spark), tmp_path / "ck2")]
    assert [len(r) for r in runs] == [3, 3]
    max_seen = None
    for batch_id, rows, stats in runs[0]:
        name = f"part-{batch_id:05d}.parquet"
        assert stats.sources == {name} and stats.count == len(rows) == 100
        assert all(r.commit_id.startswith(f"file={name}#row=") for r in rows)
        assert {r.codec for r in rows} == {"json"} and {r.producer for r in rows} == {"queries"}
        assert {r.format_version for r in rows} == {STREAM_FORMAT_VERSION}
        assert all(r.ev_ms == r.timestamp_ms for r in rows)
        source_ids = source.column("record_id").to_pylist()
        assert all(json.loads(bytes(r.value)) == {"query": r.key, "record_id": source_ids[
            batch_id * 100 + int(r.commit_id.rsplit("#row=", 1)[1])]} for r in rows)
        inj.observe(stats)
        max_seen = max(r.timestamp_ms for r in rows) if max_seen is None else max(max_seen, stats.max_event_ms)
        assert inj.watermark_ms() == max_seen - 3_000
    got = [(r.record_id, r.key, r.timestamp_ms) for _, rows, _ in runs[0] for r in rows]
    assert len(set(r[0] for r in got)) == 300 and set(got) == expected
    again = [(r.record_id, bytes(r.value), r.commit_id) for _, rows, _ in runs[1] for r in rows]
    assert again == [(r.record_id, bytes(r.value), r.commit_id) for _, rows, _ in runs[0] for r in rows]


@pytest.mark.spark
def test_the_parquet_schema_read_from_a_footer_is_the_one_spark_infers(spark: Any, tmp_path: Path) -> None:
    # ParquetInjector reads a local folder's schema from one footer (no Spark job); where the Arrow
    # types map exactly it must be Spark's own inference, otherwise it leaves the folder to Spark
    import datetime as dt
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltawheel.executor.sources.folders import _local_parquet_schema

    simple = pa.table({
        "s": ["a"], "b": pa.array([b"x"]), "i8": pa.array([1], pa.int8()), "i16": pa.array([1], pa.int16()),
        "i32": pa.array([1], pa.int32()), "i64": pa.array([1], pa.int64()), "f": pa.array([1.0], pa.float32()),
        "d": [1.0], "bo": [True], "da": pa.array([dt.date(2020, 1, 1)]),
        "dec": pa.array([decimal.Decimal("1.23")], pa.decimal128(10, 2)),
        "tus": pa.array([1], pa.timestamp("us", "UTC")), "tms": pa.array([1], pa.timestamp("ms", "UTC"))})
    (tmp_path / "simple").mkdir()
    pq.write_table(simple, tmp_path / "simple" / "part-0.parquet")
    (tmp_path / "simple" / "_staged.parquet").write_bytes(b"not parquet")  # ignored, as Spark does
    got = _local_parquet_schema(str(tmp_path / "simple"))
    assert got is not None and got == spark.read.parquet(str(tmp_path / "simple")).schema
    assert _local_parquet_schema(f"file://{tmp_path / 'simple'}") == got
    for name, column in [("ntz", pa.array([1], pa.timestamp("us"))), ("nested", pa.array([[1]])),
                         ("unsigned", pa.array([1], pa.uint32()))]:
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"c": column}), tmp_path / name / "p.parquet")
        assert _local_parquet_schema(str(tmp_path / name)) is None, name
    (tmp_path / "empty").mkdir()
    assert _local_parquet_schema(str(tmp_path / "empty")) is None
    assert _local_parquet_schema("s3a://bucket/folder") is None


@pytest.mark.spark
def test_generator_injector_late_events_and_end_of_input(spark: Any, tmp_path: Path) -> None:
    gen = GeneratorInjector("queries", str(tmp_path / "events"), SMALL, events_per_batch=100)
    source = SMALL.generate()
    base = SMALL.start_ms + np.arange(SMALL.n_events) * 1000 // SMALL.rate_per_s
    deliberately_late = set(np.array(source.column("record_id").to_pylist())[
        base - event_ms(SMALL) > SMALL.max_disorder_ms].tolist())
    assert deliberately_late
    late_seen: set[str] = set()
    ids: list[str] = []
    max_seen = -END_OF_TIME
    for batch_id, rows, stats in run_stream(gen.stream_df(spark), tmp_path / "ck"):
        before = gen.watermark_ms()
        late_seen |= {r.record_id for r in rows if before is not None and r.timestamp_ms < before}
        ids += [r.record_id for r in rows]
        assert all(json.loads(bytes(r.value)) == {"query": r.key} for r in rows)
        gen.observe(stats)
        max_seen = max(max_seen, stats.max_event_ms or max_seen)
        if batch_id < 2:
            assert gen.last_file not in stats.sources
            assert gen.watermark_ms() == max_seen - SMALL.max_disorder_ms
    assert ids == source.column("record_id").to_pylist()
    assert late_seen == deliberately_late  # exactly the deliberately late events are behind the estimate
    assert gen.watermark_ms() == END_OF_TIME  # the batch holding the last file ended the input


@pytest.mark.spark
def test_delta_table_injector(spark: Any, tmp_path: Path) -> None:
    folder, table = str(tmp_path / "events"), str(tmp_path / "delta")
    GeneratorInjector("queries", folder, SMALL, events_per_batch=100).prepare()
    spark.read.parquet(f"{folder}/part-00000.parquet").coalesce(1).write.format("delta").save(table)
    spark.read.parquet(f"{folder}/part-0000[12].parquet").coalesce(1).write.format("delta").mode("append").save(table)
    inj = DeltaTableInjector("queries", table, key_column="query", event_time_column="event_time",
                             watermark_delay_ms=3_000)
    batches = run_stream(inj.stream_df(spark), tmp_path / "ck")
    assert [stats.count for _, _, stats in batches] == [100, 200]
    rows = [r for _, rs, _ in batches for r in rs]
    assert sorted(r.record_id for r in rows) == sorted(SMALL.generate().column("record_id").to_pylist())
    assert all(r.commit_id == f"delta={r.record_id}" and json.loads(bytes(r.value)) == {"query": r.key}
               for r in rows)
    for _, _, stats in batches:
        inj.observe(stats)
    assert inj.watermark_ms() == int(event_ms(SMALL).max()) - 3_000


@pytest.mark.spark
def test_bad_source_configuration(spark: Any, tmp_path: Path) -> None:
    folder = str(tmp_path / "events")
    GeneratorInjector("queries", folder, SMALL, events_per_batch=100).prepare()
    args: dict[str, Any] = {"key_column": "query", "event_time_column": "event_time", "watermark_delay_ms": 0}
    # a folder that does not exist yet: made when the stream is built, without a schema then refused empty
    missing = ParquetInjector("queries", str(tmp_path / "missing"), **args)
    with pytest.raises(ConfigError, match="cannot read a Parquet schema from .*missing.*or give schema="):
        missing.stream_df(spark)
    assert (tmp_path / "missing").is_dir()
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(ConfigError, match=r"input folder .*a_file is not a folder and cannot be made one"):
        ParquetInjector("queries", str(tmp_path / "a_file"), **args).stream_df(spark)
    with pytest.raises(ConfigError, match="injector name 'bad-name' is not valid"):
        ParquetInjector("bad-name", folder, **args)
    with pytest.raises(ConfigError, match="max_files_per_trigger must be >= 1, got 0"):
        ParquetInjector("queries", folder, **args, max_files_per_trigger=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="cannot read a Parquet schema from .*empty"):
        ParquetInjector("queries", str(tmp_path / "empty"), **args).stream_df(spark)
    with pytest.raises(ConfigError, match=r"key_column 'nope' is not a column of the source \(columns: "
                                          r"event_time, query, record_id\)"):
        ParquetInjector("queries", folder, **{**args, "key_column": "nope"}).stream_df(spark)
    with pytest.raises(ConfigError, match="value_columns 'v' is not a column"):
        ParquetInjector("queries", folder, **args, value_columns=["query", "v"]).stream_df(spark)
    with pytest.raises(ConfigError, match="record_id_column 'rid' is not a column"):
        ParquetInjector("queries", folder, **args, record_id_column="rid").stream_df(spark)
    with pytest.raises(ConfigError, match="event_time_column 'query' has type string"):
        ParquetInjector("queries", folder, **{**args, "event_time_column": "query"}).stream_df(spark)
    with pytest.raises(ConfigError, match="a Delta table source needs record_id_column"):
        DeltaTableInjector("queries", folder, **args, record_id_column=None)
    with pytest.raises(ConfigError, match="is not a readable Delta table"):
        DeltaTableInjector("queries", str(tmp_path / "no_table"), **args).stream_df(spark)
    spark.read.parquet(folder).write.format("delta").save(str(tmp_path / "table"))
    with pytest.raises(ConfigError, match="record_id_column 'rid' is not a column"):
        DeltaTableInjector("queries", str(tmp_path / "table"), **args, record_id_column="rid").stream_df(spark)


# --- JSON lines ---------------------------------------------------------------------

JSON_LINES = {
    "a.jsonl": ['{"card": "c1", "amount": 10.5, "ts": 1000}', '{"card": "c2", "amount": 3, "ts": 4000}',
                '{"card": "c1", "amount": oops', "", '{"card": "c2", "amount": 7.0, "ts": 2000}'],
    "b.jsonl": ['{"card": "c1", "amount": "ten", "ts": 9000}', '[1, 2]',
                '{"card": "c3", "amount": 1.0, "ts": "1970-01-01T00:00:12Z"}'],
}


def write_json_lines(folder: Path, files: dict[str, list[str]] = JSON_LINES) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, (name, lines) in enumerate(sorted(files.items())):
        (folder / name).write_text("\n".join(lines) + "\n")
        os.utime(folder / name, (1_700_000_000 + i, 1_700_000_000 + i))  # read in this order


@pytest.mark.spark
def test_json_lines_injector_keeps_malformed_lines_raw(spark: Any, tmp_path: Path) -> None:
    from deltawheel.executor.sources.jsonl import JsonLinesInjector

    write_json_lines(tmp_path / "in")
    inj = JsonLinesInjector("payments", str(tmp_path / "in"), schema="card STRING, amount DOUBLE, ts BIGINT",
                            key_column="card", event_time_column="ts", watermark_delay_ms=500, max_files_per_trigger=1)
    df = inj.stream_df(spark)
    want = spark.createDataFrame([], stream_schema_ddl() + ", raw_value BINARY").schema  # + the line
    assert [(f.name, f.dataType) for f in df.schema.fields] == [(f.name, f.dataType) for f in want.fields]
    batches = run_stream(df, tmp_path / "ck")
    assert [sorted({r.commit_id.split("#")[0] for r in rows}) for _, rows, _ in batches] == [
        ["file=a.jsonl"], ["file=b.jsonl"]]
    rows = {r.record_id: r for _, rs, _ in batches for r in rs}
    assert all(r.commit_id == "file=" + rid.split("/", 1)[1].replace("#", "#line=") for rid, r in rows.items())
    good = {rid: (r.key, json.loads(bytes(r.value)), r.timestamp_ms) for rid, r in rows.items() if r.codec == "json"}
    assert good == {
        "payments/a.jsonl#1": ("c1", {"amount": 10.5, "card": "c1"}, 1000),
        "payments/a.jsonl#2": ("c2", {"amount": 3.0, "card": "c2"}, 4000),
        "payments/a.jsonl#5": ("c2", {"amount": 7.0, "card": "c2"}, 2000),  # the blank line 4 is skipped
    }
    bad = {rid: (r.key, bytes(r.value).decode(), r.timestamp_ms, r.event_time) for rid, r in rows.items()
           if r.codec == "malformed"}
    assert bad == {  # the raw line, no key, no event time
        "payments/a.jsonl#3": ("", '{"card": "c1", "amount": oops', None, None),
        "payments/b.jsonl#1": ("", '{"card": "c1", "amount": "ten", "ts": 9000}', None, None),  # a type mismatch
        "payments/b.jsonl#2": ("", "[1, 2]", None, None),  # not an object
        "payments/b.jsonl#3": ("", '{"card": "c3", "amount": 1.0, "ts": "1970-01-01T00:00:12Z"}', None, None),
    }
    for _, _, stats in batches:
        inj.observe(stats)
    assert inj.watermark_ms() == 4000 - 500  # malformed lines move nothing (b.jsonl's 9000 is one)

    # a STRING event time: ISO 8601 (or timestamp_format); one that does not parse has none
    write_json_lines(tmp_path / "iso", {"c.jsonl": ['{"card": "c9", "ts": "1970-01-01T00:00:12Z"}',
                                                    '{"card": "c9", "ts": "12/01/1970 00:00"}',
                                                    '{"card": "c9", "ts": "yesterday"}']})
    for fmt, want_ts in ((None, [12_000, None, None]), ("dd/MM/yyyy HH:mm", [None, 950_400_000, None])):
        iso = JsonLinesInjector("iso", str(tmp_path / "iso"), schema="card STRING, ts STRING", key_column="card",
                                event_time_column="ts", watermark_delay_ms=0, timestamp_format=fmt, max_files_per_trigger=1)
        got = [r for _, rs, _ in run_stream(iso.stream_df(spark), tmp_path / f"ck-{fmt is None}") for r in rs]
        assert [r.timestamp_ms for r in sorted(got, key=lambda r: r.record_id)] == want_ts
        assert {r.codec for r in got} == {"json"}


@pytest.mark.spark
def test_json_lines_schema_inferred_and_epoch_ms(spark: Any, tmp_path: Path) -> None:
    from deltawheel.executor.sources.jsonl import JsonLinesInjector

    write_json_lines(tmp_path / "in", {"a.jsonl": JSON_LINES["a.jsonl"]})
    inj = JsonLinesInjector("payments", str(tmp_path / "in"), key_column="card", event_time_column="ts",
                            watermark_delay_ms=0, record_id_column="card", max_files_per_trigger=1)
    assert inj.resolved_schema(spark).simpleString() == "struct<amount:double,card:string,ts:bigint>"
    rows = [r for _, rs, _ in run_stream(inj.stream_df(spark), tmp_path / "ck") for r in rs]
    assert sorted((r.record_id, r.codec, r.timestamp_ms) for r in rows) == [
        ("c1", "json", 1000), ("c2", "json", 2000), ("c2", "json", 4000), ("payments/a.jsonl#3", "malformed", None)]
    assert json.loads(bytes(next(r for r in rows if r.timestamp_ms == 1000).value)) == {"amount": 10.5}


@pytest.mark.spark
def test_bad_json_source_configuration(spark: Any, tmp_path: Path) -> None:
    from deltawheel.executor.sources.jsonl import JsonLinesInjector

    args: dict[str, Any] = {"key_column": "card", "event_time_column": "ts", "watermark_delay_ms": 0}
    missing = JsonLinesInjector("p", str(tmp_path / "missing"), **args)  # made when the stream is built
    with pytest.raises(ConfigError, match="cannot infer a JSON schema from .*missing.*give schema="):
        missing.stream_df(spark)
    assert (tmp_path / "missing").is_dir()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="is not a Spark DDL column list"):
        JsonLinesInjector("p", str(tmp_path / "empty"), schema="card STRANGE,,", **args).stream_df(spark)
    with pytest.raises(ConfigError, match="cannot infer a JSON schema from .*empty.*give schema="):
        JsonLinesInjector("p", str(tmp_path / "empty"), **args).stream_df(spark)
    with pytest.raises(ConfigError, match=r"key_column 'card' is not a column of the source \(columns: "):
        JsonLinesInjector("p", str(tmp_path / "empty"), schema="id STRING, ts BIGINT", **args).stream_df(spark)


@pytest.mark.spark
@pytest.mark.zk
def test_json_lines_through_the_executor_dead_letters_say_malformed(
        spark: Any, tmp_path: Path, migrated_store: Any, zk_config: Any) -> None:
    # as a user would: the public names, a computation keyed by a field, the dead_letters view
    import deltawheel
    from tests.executor_util import ByRecordKey, start_executor, state_of, stop_executor, store_sql

    write_json_lines(tmp_path / "in")
    events = deltawheel.JsonLinesInjector("events", str(tmp_path / "in"),
                                          schema="card STRING, amount DOUBLE, ts BIGINT",
                                          key_column="card", event_time_column="ts", watermark_delay_ms=0, max_files_per_trigger=1)
    ex, client = start_executor(spark, migrated_store, zk_config, ByRecordKey())
    try:
        query = (events.stream_df(spark).writeStream.foreachBatch(ex).trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        assert query.awaitTermination(180)
    finally:
        stop_executor(ex, client)
    # the dead letters' own commit has its step in the batch timeline (not counted as the settle)
    assert [r.dead_letters for r in ex.reports] == [1, 3]
    for r in ex.reports:
        steps = [k for k, _ in r.steps_s]
        assert steps.index("load_and_user_code") + 1 == steps.index("dead_and_late") == steps.index("settle") - 1
    dead = {r["source_position"]: (r["raw_value"].decode(), r["error"], r["key"]) for r in store_sql(
        spark, migrated_store, "SELECT source_position, raw_value, error, key FROM dead_letters")}
    malformed = "malformed input: the source could not parse it; raw_value holds the original text"
    assert dead == {
        "file=a.jsonl#line=3": ('{"card": "c1", "amount": oops', malformed, ""),
        "file=b.jsonl#line=1": ('{"card": "c1", "amount": "ten", "ts": 9000}', malformed, ""),
        "file=b.jsonl#line=2": ("[1, 2]", malformed, ""),
        # an ISO time string where the schema says BIGINT: Spark's PERMISSIVE parse calls it malformed
        "file=b.jsonl#line=3": ('{"card": "c3", "amount": 1.0, "ts": "1970-01-01T00:00:12Z"}', malformed, ""),
    }
    assert state_of(spark, migrated_store, "by_record_key") == {
        "c1": ({"0": 1}, [("0", 9_999)]), "c2": ({"0": 2}, [("0", 9_999)])}


# --- per-partition watermark (Kafka) -------------------------------------------------


def test_per_partition_watermark_is_the_minimum_and_idle_partitions_are_left_out() -> None:
    from deltawheel.executor.sources.kafka import PerPartitionWatermark
    from deltawheel.statestore.clock import ManualClock

    clock = ManualClock(0)
    w = PerPartitionWatermark(1_000, idle_timeout_ms=60_000, clock=clock)
    w.assign(["t/0", "t/1", "t/2"])
    w.observe(BatchStats(2, 5_000, 9_000, partitions=(("t/0", 9_000), ("t/1", 5_000))))
    assert w.watermark_ms() is None  # t/2 has delivered nothing and is not idle yet
    clock.advance(60_000)  # t/2 silent for the idle timeout; t/0 and t/1 too
    assert w.watermark_ms() is None  # every partition idle: stays where it was (nothing yet)
    w.observe(BatchStats(1, 7_000, 7_000, partitions=(("t/1", 7_000),)))
    assert w.watermark_ms() == 6_000  # only t/1 is active
    w.observe(BatchStats(1, 12_000, 12_000, partitions=(("t/0", 12_000),)))
    assert w.watermark_ms() == 6_000  # t/0 active again: min(12 s, 7 s) - 1 s
    w.observe(BatchStats(1, 2_000, 2_000, partitions=(("t/2", 2_000),)))
    assert w.watermark_ms() == 6_000  # t/2 wakes up behind: no step back (its older records are late)
    clock.advance(60_000)
    assert w.watermark_ms() == 6_000  # all idle again: held
    w.observe(BatchStats(3, 9_000, 20_000, partitions=(("t/0", 20_000), ("t/1", 15_000), ("t/2", 9_000))))
    assert w.watermark_ms() == 8_000
    w.observe(BatchStats(1, 30_000, 30_000))  # no per-partition detail: moves nothing
    assert w.watermark_ms() == 8_000
    w.finish()
    assert w.watermark_ms() == END_OF_TIME


def test_per_partition_watermark_never_idle_by_default() -> None:
    from deltawheel.executor.sources.kafka import PerPartitionWatermark
    from deltawheel.statestore.clock import ManualClock

    clock = ManualClock(0)
    w = PerPartitionWatermark(0, clock=clock)
    w.assign(["t/0", "t/1"])
    w.observe(BatchStats(1, 5_000, 5_000, partitions=(("t/0", 5_000),)))
    clock.advance(10**9)
    assert w.watermark_ms() is None  # an empty partition holds the watermark back
    w.observe(BatchStats(1, 4_000, 4_000, partitions=(("t/1", 4_000), ("t/0", None))))
    assert w.watermark_ms() == 4_000


@pytest.mark.parametrize(("call", "match"), [
    (lambda: __import__("deltawheel").PerPartitionWatermark(-1), "watermark_delay_ms must be >= 0"),
    (lambda: __import__("deltawheel").PerPartitionWatermark(0, idle_timeout_ms=0), "idle_timeout_ms must be > 0"),
    (lambda: __import__("deltawheel").KafkaInjector(
        "k", bootstrap_servers="h:9092", topic="t", schema=None, key_column=None, event_time_column=None,
        watermark_delay_ms=0), "a Kafka source needs the messages' schema"),
    (lambda: __import__("deltawheel").KafkaInjector(
        "k", bootstrap_servers="", topic="t", schema="a INT", key_column=None, event_time_column=None,
        watermark_delay_ms=0), "give bootstrap_servers and topic"),
    (lambda: __import__("deltawheel").KafkaInjector(
        "bad-name", bootstrap_servers="h:9092", topic="t", schema="a INT", key_column=None,
        event_time_column=None, watermark_delay_ms=0), "injector name 'bad-name' is not valid"),
])
def test_bad_kafka_source_configuration(call: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        call()


@pytest.mark.spark
def test_to_stream_schema_of_any_dataframe_keeps_malformed_raw(spark: Any) -> None:
    # docs/sources.md, "Any other DataFrame", on a batch frame of lines instead of a socket
    from pyspark.sql import functions as F

    from deltawheel import to_stream_schema

    raw = spark.createDataFrame([('{"user": "u1", "ts": 7000}',), ("{broken",)], "value STRING")
    parsed = raw.select(F.from_json("value", "user STRING, ts BIGINT, _corrupt_record STRING",
                                    {"columnNameOfCorruptRecord": "_corrupt_record"}).alias("j"), "value")
    df = to_stream_schema(parsed.select("j.*", "value"), producer="socket", key_column="user",
                          event_time_column="ts", value_columns=["user"], record_id=F.sha2(F.col("value"), 256),
                          commit_id=F.lit("socket"), malformed=F.col("_corrupt_record"))
    got = sorted((r.key, r.codec, bytes(r.value).decode(), r.timestamp_ms, r.event_time is None) for r in df.collect())
    assert got == [("", "malformed", "{broken", None, True), ("u1", "json", '{"user":"u1"}', 7000, False)]
