"""Kafka offsets as input positions: each batch commit of a Kafka-fed computation records
the offset ranges it read, from the query's offset log; replay re-reads them from the topic and
refuses ranges past the topic's retention, naming the horizon."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import test_kafka

kafka_broker = test_kafka.kafka_broker  # the Kafka tests' broker fixture


def _offsets(chk: Path, batch: int, line: str) -> None:
    (chk / "offsets").mkdir(parents=True, exist_ok=True)
    (chk / "offsets" / str(batch)).write_text('v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n'
                                              + line + "\n")


def test_the_offset_log_gives_each_batchs_kafka_ranges(tmp_path: Path) -> None:
    """Start inclusive, end exclusive, per partition; the first batch starts at the source's initial
    offsets (``sources/0/0``, as Spark's Kafka source writes it); partitions that read nothing are
    left out; what the log does not say is None (nothing recorded, replay refuses)."""
    from deltawheel.statestore.delta.sourceoffsets import kafka_ranges
    from deltawheel.statestore.rowtable.inputfiles import commit_entry, entry_of, kafka_of

    chk = tmp_path / "ck"
    assert kafka_ranges(str(chk), 0, "cards") is None  # no offset log yet
    _offsets(chk, 0, '{"cards":{"0":4,"1":3}}')
    assert kafka_ranges(str(chk), 0, "cards") is None  # no initial offsets
    (chk / "sources" / "0").mkdir(parents=True)
    (chk / "sources" / "0" / "0").write_bytes(b'\x00v1\n{"cards":{"1":0,"0":1}}')
    assert kafka_ranges(str(chk), 0, "cards") == {"cards": {"0": [1, 4], "1": [0, 3]}}
    _offsets(chk, 1, '{"cards":{"0":9,"1":3}}')
    assert kafka_ranges(str(chk), 1, "cards") == {"cards": {"0": [4, 9]}}
    _offsets(chk, 2, '{"cards":{"0":9,"1":3,"2":5}}')  # a partition without a start
    assert kafka_ranges(str(chk), 2, "cards") is None
    # ... started at offset 0 by a source that fails on data loss (the caller says so)
    assert kafka_ranges(str(chk), 2, "cards", new_partition_start=0) == {"cards": {"2": [0, 5]}}
    assert kafka_ranges(str(chk), 1, "other") is None  # another topic's source
    # the commit entry: old readers see the files, the ranges are a field of their own
    meta = commit_entry(1, [], kafka=kafka_ranges(str(chk), 1, "cards"))
    assert entry_of(meta) == (1, ())
    assert json.loads(json.dumps(meta))["positions"]["kafka"] == {"cards": {"0": [4, 9]}}
    assert kafka_of(meta) == {"cards": {"0": (4, 9)}}
    assert kafka_of(commit_entry(1, ["f"])) is None


def test_a_partition_added_during_the_run_starts_at_zero_unless_the_source_may_skip_data(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    """A partition added to the topic during the run has no start in the previous batch's offsets.
    Spark's Kafka source read it from its earliest offset, which with ``failOnDataLoss`` (the
    default) is 0 or the query failed: the range starts at 0. With ``failOnDataLoss=false`` the
    start is not known: the batch's positions are unknown (its commit records none, so a replay's
    horizon is after it), with a log line, and the batch runs."""
    import logging

    from deltawheel.executor.computation import Computation
    from deltawheel.executor.protocol.rescale import kafka_input
    from deltawheel.executor.sources.kafka import KafkaInjector

    class Cards(Computation):
        name = "cards"
        inputs = {"cards": "card"}

        def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
            pass

    chk = tmp_path / "ck"
    (chk / "sources" / "0").mkdir(parents=True)
    (chk / "sources" / "0" / "0").write_bytes(b'\x00v1\n{"cards":{"1":0,"0":1}}')
    _offsets(chk, 0, '{"cards":{"0":4,"1":3}}')
    _offsets(chk, 1, '{"cards":{"0":9,"1":3,"2":5}}')  # partition 2 appeared
    inj = KafkaInjector("cards", bootstrap_servers="127.0.0.1:1", topic="cards", schema="card STRING, ts BIGINT", key_column="card",
                        event_time_column=None, watermark_delay_ms=0)
    rec = kafka_input(Cards(), {"cards": inj}, checkpoint=str(chk))
    assert rec is not None
    assert rec.kafka_ranges(0) == {"cards": {"0": [1, 4], "1": [0, 3]}} and not rec.unknown
    assert rec.kafka_ranges(1) == {"cards": {"0": [4, 9], "2": [0, 5]}} and not rec.unknown
    lossy = KafkaInjector("cards", bootstrap_servers="127.0.0.1:1", topic="cards", schema="card STRING, ts BIGINT",
                          key_column="card", event_time_column=None, watermark_delay_ms=0,
                          options={"failOnDataLoss": "false"})
    rec = kafka_input(Cards(), {"cards": lossy}, checkpoint=str(chk))
    assert rec is not None
    assert rec.kafka_ranges(0) == {"cards": {"0": [1, 4], "1": [0, 3]}} and not rec.unknown
    with caplog.at_level(logging.WARNING, logger="deltawheel.executor.protocol.rescale"):
        assert rec.kafka_ranges(1) is None
    assert rec.unknown == {1}
    assert "input positions of micro-batch 1 are not recorded" in caplog.text and "topic cards" in caplog.text


def _delete_records(spark: Any, servers: str, topic: str, before: dict[int, int]) -> None:
    """Kafka's deleteRecords: partition -> the new earliest offset (what retention does)."""
    from deltawheel.statestore.delta.jvm import jvm

    j = jvm(spark)
    props = j.java.util.Properties()
    props.setProperty("bootstrap.servers", servers)
    admin = j.org.apache.kafka.clients.admin.Admin.create(props)
    try:
        # RecordsToDelete.beforeOffset by reflection (py4j does not always find the static method)
        cls = admin.getClass().getClassLoader().loadClass("org.apache.kafka.clients.admin.RecordsToDelete")
        factory = next(m for m in cls.getMethods() if m.getName() == "beforeOffset" and m.getParameterCount() == 1)
        m = j.java.util.HashMap()
        for p, off in before.items():
            args = spark.sparkContext._gateway.new_array(j.java.lang.Object, 1)
            args[0] = j.java.lang.Long.valueOf(str(off))
            m.put(j.org.apache.kafka.common.TopicPartition(topic, p), factory.invoke(None, args))
        admin.deleteRecords(m).all().get(60_000, j.java.util.concurrent.TimeUnit.MILLISECONDS)
    finally:
        admin.close()


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.slow  # a Kafka pipeline of several batches, a replay and a refusal: minutes on a loaded machine
@pytest.mark.timeout(1800)
def test_a_kafka_fed_computation_records_its_ranges_and_is_replayed_from_kafka(  # type: ignore[no-untyped-def]
        spark, kafka_broker, zk_config, tmp_path, capsys, monkeypatch) -> None:
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.replay import plan_replay, replay
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.exceptions import InputGoneError
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout
    from kafka_pipeline import NAME, CardCount, card_messages
    from test_kafka import kafka_ready, produce

    import deltawheel
    from deltawheel.cli import main
    from deltawheel.servers.kafka import create_topic

    kafka_ready(spark)
    servers, topic = kafka_broker.bootstrap_servers, "replay-cards"
    create_topic(spark, servers, topic, partitions=2)
    produce(spark, servers, topic, card_messages(0, 24, lag_ms=0))  # 12 per partition
    events = deltawheel.KafkaInjector("events", bootstrap_servers=servers, topic=topic,
                                      schema="card STRING, i BIGINT, ts BIGINT", key_column="card",
                                      event_time_column="ts", watermark_delay_ms=500, max_offsets_per_trigger=6)
    layout = StoreLayout(str(tmp_path / "store"))
    PipelineRunner(spark, layout, Pipeline(NAME, (events,), (CardCount(),)), zk=zk_config, end_of_input=False,
                   progress=lambda line: None).run()
    batches = [c for c in computation_commits(spark, layout, "card_count") if c.reruns]
    assert len(batches) >= 3, batches
    # every offset of each partition in exactly one batch's range
    for p in ("0", "1"):
        covered = [o for c in batches for o in range(*(c.kafka or {}).get(topic, {}).get(p, (0, 0)))]
        assert sorted(covered) == list(range(12)), (p, [c.kafka for c in batches])
    # a replay of unchanged code from the middle, as a user runs it: an empty diff
    monkeypatch.setenv("KAFKA_SERVERS", servers)
    monkeypatch.setenv("KAFKA_TOPIC", topic)
    monkeypatch.setenv("PYTHONPATH", "")  # --source puts its module's folder there; undone after the test
    mid = batches[len(batches) // 2 - 1].version
    out = tmp_path / "diff.json"
    rc = main(["replay", "--store", layout.root, "--pipeline", NAME, "--computation", "card_count",
               "--from-version", str(mid), "--into", str(tmp_path / "shadow"), "--zk", zk_config.hosts,
               "--zk-chroot", zk_config.chroot, "--source", "kafka_pipeline:pipeline", "--diff-out", str(out)])
    got = capsys.readouterr()
    assert rc == 0, got.out + got.err
    d = json.loads(out.read_text())
    assert d["empty"], got.out
    last = batches[-1]
    assert f"batch {last.batch_id} (live version {last.version}): " in got.out
    p, (s, e) = sorted(last.kafka[topic].items())[0]  # type: ignore[index]
    assert f"{topic}/{p} [{s}, {e})" in got.out  # the plan names the ranges it re-reads
    replayed = spark.read.format("delta").load(StoreLayout(str(tmp_path / "shadow")).stream("card_counts")).count()
    assert replayed == sum(e - s for c in batches if c.version > mid for s, e in c.kafka[topic].values())  # type: ignore[index]
    # records deleted (retention) inside the second batch's range of partition 0: a replay needing
    # them is refused, naming the newest commit whose range is gone as the horizon
    second = batches[1]
    s0, e0 = second.kafka[topic]["0"]  # type: ignore[index]
    _delete_records(spark, servers, topic, {0: s0 + 1})
    gone = [c for c in batches if c.kafka and c.kafka[topic].get("0", (0, 0))[0] < s0 + 1
            and c.kafka[topic]["0"][1] > c.kafka[topic]["0"][0]]
    horizon = max(c.version for c in gone)
    plan = plan_replay(spark, store=layout, into=StoreLayout(str(tmp_path / "shadow2")), pipeline=NAME,
                       computation="card_count", from_start=True)
    with pytest.raises(InputGoneError, match=rf"{topic}/0 offsets .*past the topic's retention.*horizon is rows "
                                             rf"version {horizon}: replay from rows version {horizon} or later"):
        replay(spark, plan, code=CardCount(), injectors=[events])
    assert not (tmp_path / "shadow2").exists()
    # from the horizon on the ranges are still there
    plan = plan_replay(spark, store=layout, into=StoreLayout(str(tmp_path / "shadow3")), pipeline=NAME,
                       computation="card_count", from_version=horizon)
    done = replay(spark, plan, code=CardCount(), injectors=[events])
    assert done.diff is not None and done.diff.empty


def _add_partitions(spark: Any, servers: str, topic: str, total: int) -> None:
    """Kafka's createPartitions: ``topic`` grows to ``total`` partitions."""
    from deltawheel.statestore.delta.jvm import jvm

    j = jvm(spark)
    props = j.java.util.Properties()
    props.setProperty("bootstrap.servers", servers)
    admin = j.org.apache.kafka.clients.admin.Admin.create(props)
    try:
        # NewPartitions.increaseTo by reflection (as RecordsToDelete.beforeOffset above)
        cls = admin.getClass().getClassLoader().loadClass("org.apache.kafka.clients.admin.NewPartitions")
        factory = next(m for m in cls.getMethods() if m.getName() == "increaseTo" and m.getParameterCount() == 1)
        args = spark.sparkContext._gateway.new_array(j.java.lang.Object, 1)
        args[0] = j.java.lang.Integer.valueOf(str(total))
        m = j.java.util.HashMap()
        m.put(topic, factory.invoke(None, args))
        admin.createPartitions(m).all().get(60_000, j.java.util.concurrent.TimeUnit.MILLISECONDS)
    finally:
        admin.close()


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.slow  # two runs of a Kafka pipeline, a replay and a refusal: minutes on a loaded machine
@pytest.mark.timeout(1800)
def test_a_partition_added_during_the_run_is_replayed_from_before_its_first_batch(  # type: ignore[no-untyped-def]
        spark, kafka_broker, zk_config, tmp_path, capsys, monkeypatch) -> None:
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.replay import plan_replay, replay
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.exceptions import InputGoneError
    from deltawheel.statestore.inspection.positions import computation_commits, replay_horizon
    from deltawheel.statestore.layout import StoreLayout
    from kafka_pipeline import NAME, CardCount, card_messages
    from test_kafka import kafka_ready, produce

    import deltawheel
    from deltawheel.cli import main
    from deltawheel.servers.kafka import create_topic

    kafka_ready(spark)
    servers, topic = kafka_broker.bootstrap_servers, "grown-cards"
    create_topic(spark, servers, topic, partitions=1)
    produce(spark, servers, topic, [(0, k, v) for _, k, v in card_messages(0, 8, lag_ms=0)])
    events = deltawheel.KafkaInjector("events", bootstrap_servers=servers, topic=topic,
                                      schema="card STRING, i BIGINT, ts BIGINT", key_column="card",
                                      event_time_column="ts", watermark_delay_ms=500, max_offsets_per_trigger=4)
    layout = StoreLayout(str(tmp_path / "store"))
    pipe = Pipeline(NAME, (events,), (CardCount(),))
    PipelineRunner(spark, layout, pipe, zk=zk_config, end_of_input=False, progress=lambda line: None).run()
    before = computation_commits(spark, layout, "card_count")[-1].version
    _add_partitions(spark, servers, topic, 2)
    produce(spark, servers, topic, card_messages(8, 8, lag_ms=0))  # 4 to each partition
    PipelineRunner(spark, layout, pipe, zk=zk_config, end_of_input=False, progress=lambda line: None).run()
    commits = computation_commits(spark, layout, "card_count")
    batches = [c for c in commits if c.reruns]
    assert replay_horizon(commits) is None  # every commit records its positions
    first = next(c for c in batches if "1" in (c.kafka or {}).get(topic, {}))
    assert first.version > before and first.kafka[topic]["1"][0] == 0  # type: ignore[index]
    for p, n in (("0", 12), ("1", 4)):  # every offset of each partition in exactly one batch's range
        covered = [o for c in batches for o in range(*(c.kafka or {}).get(topic, {}).get(p, (0, 0)))]
        assert sorted(covered) == list(range(n)), (p, [c.kafka for c in batches])
    # a replay from before the partition's first batch, as a user runs it: an empty diff
    monkeypatch.setenv("KAFKA_SERVERS", servers)
    monkeypatch.setenv("KAFKA_TOPIC", topic)
    monkeypatch.setenv("PYTHONPATH", "")  # --source puts its module's folder there; undone after the test
    out = tmp_path / "diff.json"
    rc = main(["replay", "--store", layout.root, "--pipeline", NAME, "--computation", "card_count",
               "--from-version", str(before), "--into", str(tmp_path / "shadow"), "--zk", zk_config.hosts,
               "--zk-chroot", zk_config.chroot, "--source", "kafka_pipeline:pipeline", "--diff-out", str(out)])
    got = capsys.readouterr()
    assert rc == 0, got.out + got.err
    assert json.loads(out.read_text())["empty"], got.out
    assert f"{topic}/1 [0, " in got.out  # the plan names the new partition's range from offset 0
    replayed = spark.read.format("delta").load(StoreLayout(str(tmp_path / "shadow")).stream("card_counts")).count()
    assert replayed == 8
    # the new partition's head gone (retention): a replay needing it is refused, naming it and the horizon
    _delete_records(spark, servers, topic, {1: 1})
    plan = plan_replay(spark, store=layout, into=StoreLayout(str(tmp_path / "shadow2")), pipeline=NAME,
                       computation="card_count", from_version=before)
    with pytest.raises(InputGoneError, match=rf"{topic}/1 offsets \[0, .*horizon is rows version {first.version}: "
                                             rf"replay from rows version {first.version} or later"):
        replay(spark, plan, code=CardCount(), injectors=[events])
    assert not (tmp_path / "shadow2").exists()
