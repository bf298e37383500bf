"""A computation reading a Kafka topic and a Parquet folder: each batch commit records the
offset ranges it read and the files, each by its source's place in the query; replay re-reads
both, in the live query's order, and unchanged code gives an empty diff."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import test_kafka

kafka_broker = test_kafka.kafka_broker  # the Kafka tests' broker fixture


def _write_files(folder: Path, first: int, count: int) -> list[str]:
    """``count`` Parquet files of 4 records each (cards c0..c4, numbers from 1000 + 4 * first on),
    modified one second apart in order (the file source reads them oldest first)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for k in range(first, first + count):
        nums = [1000 + 4 * k + j for j in range(4)]
        table = pa.table({"card": [f"c{n % 5}" for n in nums], "i": nums,
                          "ts": [1_000_000 + (n - 1000) * 300 + 50 for n in nums]})
        name = f"part-{k:05d}.parquet"
        pq.write_table(table, folder / name)
        os.utime(folder / name, (1_700_000_000 + k, 1_700_000_000 + k))
        names.append(name)
    return names


def test_kafka_beside_a_parquet_folder_records_both_by_source_index(tmp_path: Path) -> None:
    """The positions of a computation reading Kafka and a Parquet folder: the Kafka ranges from the
    offset log, the files from the file source's own log (``sources/<i>``, ``i`` its place in the
    computation's inputs, here 1); without a way to name stream tables, none."""
    from deltawheel.executor.protocol.rescale import kafka_input
    from deltawheel.executor.sources.kafka import KafkaInjector
    from deltawheel.executor.sources.parquet import ParquetInjector
    from deltawheel.statestore.layout import StoreLayout
    from kafka_mixed_pipeline import SCHEMA, MixedCount

    events = KafkaInjector("events", bootstrap_servers="127.0.0.1:1", topic="cards", schema=SCHEMA,
                           key_column="card", event_time_column="ts", watermark_delay_ms=0)
    (tmp_path / "in").mkdir()
    files = ParquetInjector("files", str(tmp_path / "in"), schema=SCHEMA, key_column="card", event_time_column="ts",
                            watermark_delay_ms=0)
    chk = tmp_path / "ck"
    for d in ("sources/0", "sources/1", "offsets"):
        (chk / d).mkdir(parents=True)
    (chk / "sources" / "0" / "0").write_bytes(b'\x00v1\n{"cards":{"1":0,"0":0}}')
    (chk / "sources" / "1" / "0").write_text('v1\n{"path":"file:///x/in/part-00000.parquet","timestamp":1,'
                                             '"batchId":0,"action":"add"}\n')
    (chk / "sources" / "1" / "1").write_text('v1\n{"path":"file:///x/in/part-00001.parquet","timestamp":2,'
                                             '"batchId":1,"action":"add"}\n')
    (chk / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n'
                                       '{"cards":{"0":3,"1":2}}\n{"logOffset":0}\n')
    (chk / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n'
                                       '{"cards":{"0":5,"1":2}}\n{"logOffset":1}\n')
    rec = kafka_input(MixedCount(), {"events": events, "files": files}, checkpoint=str(chk),
                      table_of=StoreLayout(str(tmp_path / "store")).stream)
    assert rec is not None and rec.file_source == 1 and set(rec.parquet) == {"files"} and set(rec.kafka) == {"events"}
    assert rec.batch_positions(None, 0) == ["part-00000.parquet"]
    assert rec.batch_positions(None, 1) == ["part-00001.parquet"]
    assert rec.kafka_ranges(0) == {"cards": {"0": [0, 3], "1": [0, 2]}}
    assert rec.kafka_ranges(1) == {"cards": {"0": [3, 5]}}
    # without the store's stream tables (the caller cannot say where they are): nothing recorded
    assert kafka_input(MixedCount(), {"events": events, "files": files}, checkpoint=str(chk)) is None


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.slow  # two runs of a Kafka + Parquet pipeline and two replays: minutes on a loaded machine
@pytest.mark.timeout(2400)
def test_a_computation_reading_kafka_and_files_is_replayed_to_an_empty_diff(  # type: ignore[no-untyped-def]
        spark, kafka_broker, zk_config, tmp_path, capsys, monkeypatch) -> None:
    from deltawheel.executor.drivers.replay import plan_replay, replay
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout
    from kafka_mixed_pipeline import NAME, MixedCount, make
    from kafka_pipeline import card_messages
    from test_kafka import kafka_ready, produce

    from deltawheel.cli import main
    from deltawheel.servers.kafka import create_topic

    kafka_ready(spark)
    servers, topic, folder = kafka_broker.bootstrap_servers, "mixed-cards", tmp_path / "cards"
    create_topic(spark, servers, topic, partitions=2)
    layout = StoreLayout(str(tmp_path / "store"))
    folder.mkdir()
    (events, files), pipe = make(servers, topic, str(folder))
    ends, names = [], []
    for run in range(2):  # two runs: the first one's end is a version in the middle
        produce(spark, servers, topic, card_messages(12 * run, 12, lag_ms=0))  # 6 per partition
        names += _write_files(folder, 2 * run, 2)
        PipelineRunner(spark, layout, pipe, zk=zk_config, end_of_input=False, progress=lambda line: None).run()
        ends.append(computation_commits(spark, layout, "mixed_count")[-1].version)
    batches = [c for c in computation_commits(spark, layout, "mixed_count") if c.reruns]
    # every commit records its positions: every offset and every file in exactly one batch
    assert all(c.kafka is not None for c in batches), [(c.version, c.files, c.kafka) for c in batches]
    for p in ("0", "1"):
        covered = [o for c in batches for o in range(*(c.kafka or {}).get(topic, {}).get(p, (0, 0)))]
        assert sorted(covered) == list(range(12)), (p, [c.kafka for c in batches])
    assert sorted(f for c in batches for f in c.files or ()) == names
    live = spark.read.format("delta").load(layout.stream("mixed_counts"))
    assert {json.loads(r["value"])["from"] for r in live.collect()} == {"events", "files"}
    # from the start, through the API: an empty diff, every production made again
    plan = plan_replay(spark, store=layout, into=StoreLayout(str(tmp_path / "shadow1")), pipeline=NAME,
                       computation="mixed_count", from_start=True)
    done = replay(spark, plan, code=MixedCount(), injectors=[events, files])
    assert done.diff is not None and done.diff.empty, done.diff
    assert spark.read.format("delta").load(StoreLayout(str(tmp_path / "shadow1")).stream("mixed_counts")).count() \
        == live.count() == 24 + 16
    # from the middle, as a user runs it: the command line with the live pipeline as source
    monkeypatch.setenv("KAFKA_SERVERS", servers)
    monkeypatch.setenv("KAFKA_TOPIC", topic)
    monkeypatch.setenv("CARDS_FOLDER", str(folder))
    monkeypatch.setenv("PYTHONPATH", "")  # --source puts its module's folder there; undone after the test
    out = tmp_path / "diff.json"
    rc = main(["replay", "--store", layout.root, "--pipeline", NAME, "--computation", "mixed_count",
               "--from-version", str(ends[0]), "--into", str(tmp_path / "shadow2"), "--zk", zk_config.hosts,
               "--zk-chroot", zk_config.chroot, "--source", "kafka_mixed_pipeline:pipeline", "--diff-out", str(out)])
    got = capsys.readouterr()
    assert rc == 0, got.out + got.err
    d = json.loads(out.read_text())
    assert d["empty"] and d["version_a"] == ends[1], got.out
    later = [c for c in batches if c.version > ends[0]]
    assert later and any(c.files for c in later) and any(c.kafka for c in later)
    replayed = spark.read.format("delta").load(StoreLayout(str(tmp_path / "shadow2")).stream("mixed_counts"))
    assert replayed.count() == 12 + 8  # the second run's records: 12 from the topic, 8 from two files
