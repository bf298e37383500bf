"""Kafka: a real single-node broker in KRaft mode (Kafka's jars from Maven Central, started once
per test session) read through Spark's Kafka connector by a KafkaInjector into a real executor.

The broker's jars (19 MiB) are fetched into ~/.cache/deltawheel/kafka-jars on first use; Spark's
connector (9.5 MiB) must be on the shared session's classpath from its start, which ``./dw setup``
arranges (build_spark adds it when cached).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A KRaft broker + controller for the whole run."""
    from deltawheel.servers.kafka import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


def kafka_ready(spark: Any) -> None:
    from deltawheel.statestore.delta.jvm import jvm

    if not jvm(spark).org.apache.spark.util.Utils.classIsLoadable("org.apache.spark.sql.kafka010.KafkaSourceProvider"):
        pytest.fail("Spark's Kafka connector is not on the test session's classpath: run ./dw setup "
                    "(it caches the connector, which build_spark then adds)")


def produce(spark: Any, servers: str, topic: str, messages: list[tuple[int, str, str]]) -> None:
    """Write (partition, key, value) messages in this order with Spark's Kafka sink."""
    df = spark.createDataFrame(messages, "partition INT, key STRING, value STRING").coalesce(1)
    df.write.format("kafka").option("kafka.bootstrap.servers", servers).option("topic", topic).save()


# partition 0 runs ahead in event time (5 s), partition 1 lags (2.5 s); one malformed message each,
# and partition 1 one without the key field
MESSAGES = [
    (0, "c1", '{"card": "c1", "amount": 10.0, "ts": 1000}'),
    (0, "c1", '{"card": "c1", "amount": 20.0, "ts": 5000}'),
    (0, "c1", "not json {"),
    (0, "c1", '{"card": "c1", "amount": 5.0, "ts": 3000}'),
    (1, "c2", '{"card": "c2", "amount": 1.0, "ts": 2000}'),
    (1, "c2", '{"card": "c2", "amount": "lots", "ts": 2200}'),
    (1, "c2", '{"card": "c2", "amount": 2.0, "ts": 2500}'),
    (1, "c2", '{ "amount": 3.0,  "ts": 2400 }'),
]


def payments_topic(spark: Any, broker: Any, topic: str) -> Any:
    """A two-partition ``topic`` holding MESSAGES, and the KafkaInjector "events" reading it."""
    import deltawheel
    from deltawheel.servers.kafka import create_topic

    kafka_ready(spark)
    create_topic(spark, broker.bootstrap_servers, topic, partitions=2)
    produce(spark, broker.bootstrap_servers, topic, MESSAGES)
    return deltawheel.KafkaInjector("events", bootstrap_servers=broker.bootstrap_servers, topic=topic,
                                    schema="card STRING, amount DOUBLE, ts BIGINT", key_column="card",
                                    event_time_column="ts", watermark_delay_ms=500)


@pytest.mark.zk
def test_kafka_topic_through_the_executor(spark: Any, kafka_broker: Any, migrated_store: Any, zk_config: Any,
                                          tmp_path: Path) -> None:
    from tests.executor_util import ByRecordKey, start_executor, state_of, stop_executor, store_sql

    events = payments_topic(spark, kafka_broker, "payments")
    ex, client = start_executor(spark, migrated_store, zk_config, ByRecordKey(), watermarks=True)
    try:
        df = events.stream_df(spark)
        assert events.partitions == ["payments/0", "payments/1"]
        query = (df.writeStream.foreachBatch(events.tracking(ex, ex.authority)).trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        assert query.awaitTermination(180)
        # per partition: 5000 - 500 and 2500 - 500; the injector's is their minimum, not 5000 - 500
        assert events.partition_watermarks() == {"payments/0": 4_500, "payments/1": 2_000}
        assert events.watermark_ms() == 2_000
        assert ex.authority.injector_watermark("events") == 2_000
    finally:
        stop_executor(ex, client)
    assert state_of(spark, migrated_store, "by_record_key") == {
        "c1": ({"0": 3}, [("0", 9_999)]), "c2": ({"0": 2}, [("0", 9_999)])}
    dead = sorted((r["source_position"], r["record_id"], bytes(r["raw_value"]).decode(), r["error"])
                  for r in store_sql(spark, migrated_store, "SELECT * FROM dead_letters"))
    reason = "malformed input: the source could not parse it; raw_value holds the original text"
    assert dead == [("kafka=payments/0@2", "events/payments/0@2", "not json {", reason),
                    ("kafka=payments/1@1", "events/payments/1@1", '{"card": "c2", "amount": "lots", "ts": 2200}',
                     reason),
                    # no key field: the message's value as it was sent, not its re-encoded fields
                    ("kafka=payments/1@3", "events/payments/1@3", '{ "amount": 3.0,  "ts": 2400 }',
                     "key extractor returned an empty key")]


def test_kafka_rows_in_the_stream_schema(spark: Any, kafka_broker: Any, tmp_path: Path) -> None:
    from deltawheel.executor.sources.kafka import KafkaInjector
    from deltawheel.statestore.exceptions import ConfigError
    from deltawheel.statestore.writepath.streams import stream_schema_ddl

    from deltawheel.servers.kafka import create_topic

    kafka_ready(spark)
    servers = kafka_broker.bootstrap_servers
    with pytest.raises(ConfigError, match=r"key_column 'user' is not a field of the schema \(page\)"):
        KafkaInjector("clicks", bootstrap_servers=servers, topic="clicks", schema="page STRING", key_column="user",
                      event_time_column=None, watermark_delay_ms=0).stream_df(spark)
    create_topic(spark, servers, "clicks", partitions=1)
    produce(spark, servers, "clicks", [(0, "u1", '{"page": "/a"}'), (0, None, '{"page": "/b"}')])
    # no key field: the message key; no event time field: the Kafka record timestamp
    inj = KafkaInjector("clicks", bootstrap_servers=servers, topic="clicks", schema="page STRING", key_column=None,
                        event_time_column=None, watermark_delay_ms=0)
    df = inj.stream_df(spark)
    want = spark.createDataFrame([], stream_schema_ddl() + ", raw_value BINARY").schema  # + the message's text
    assert [(f.name, f.dataType) for f in df.schema.fields] == [(f.name, f.dataType) for f in want.fields]
    got: list[Any] = []
    query = (df.writeStream.foreachBatch(lambda b, _i: got.extend(b.collect())).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    assert query.awaitTermination(120)
    assert [(r.record_id, r.key, json.loads(bytes(r.value)), r.commit_id, r.codec) for r in got] == [
        ("clicks/clicks/0@0", "u1", {"page": "/a"}, "kafka=clicks/0@0", "json"),
        ("clicks/clicks/0@1", "", {"page": "/b"}, "kafka=clicks/0@1", "json")]
    assert all(r.timestamp_ms is not None and r.timestamp_ms > 1_600_000_000_000 for r in got)


def test_a_replayed_batch_in_which_a_partition_had_no_record_reads_the_others(spark: Any, kafka_broker: Any) -> None:
    """A live batch's ranges with one partition empty (it had no record then): the replay's read of
    them returns the other partition's records. Subscribed to the whole topic, Spark refused the
    offsets ("Partitions specified for Kafka start offsets don't match what are assigned")."""
    from deltawheel.executor.sources.kafka import KafkaInjector

    from deltawheel.servers.kafka import create_topic

    kafka_ready(spark)
    servers = kafka_broker.bootstrap_servers
    create_topic(spark, servers, "quiet-partition", partitions=2)
    produce(spark, servers, "quiet-partition", [(0, f"u{i}", f'{{"page": "/{i}"}}') for i in range(3)])
    inj = KafkaInjector("clicks", bootstrap_servers=servers, topic="quiet-partition", schema="page STRING",
                        key_column=None, event_time_column=None, watermark_delay_ms=0)
    rows = inj.batch_df(spark, {"0": (1, 3), "1": (0, 0)}).collect()
    assert sorted(r.record_id for r in rows) == ["clicks/quiet-partition/0@1", "clicks/quiet-partition/0@2"]


def test_broker_errors_say_what_to_do(spark: Any, kafka_broker: Any, tmp_path: Path) -> None:
    from deltawheel.executor.exceptions import KafkaServerError
    from deltawheel.statestore.process import free_ports

    from deltawheel.servers.kafka import KafkaBroker, create_topic

    taken = KafkaBroker(tmp_path / "other", port=kafka_broker.port, controller_port=free_ports(1)[0])
    with pytest.raises(KafkaServerError, match=f"port {kafka_broker.port} on 127.0.0.1 is in use by another "
                                               "process; stop it or give KafkaBroker other ports"):
        taken.start()
    nobody = f"127.0.0.1:{free_ports(1)[0]}"
    with pytest.raises(KafkaServerError, match=f"could not create topic t on {nobody}: .*is the broker running"):
        create_topic(spark, nobody, "t", partitions=1, timeout_s=2.0)


@pytest.mark.zk
def test_the_pipeline_runner_moves_a_kafka_watermark_per_partition(spark: Any, kafka_broker: Any, zk_config: Any,
                                                                   tmp_path: Path, migrated_at: Any) -> None:
    """Under PipelineRunner (no hand-wired ``tracking``), a Kafka injector's watermark follows its
    partitions batch by batch: the lagging partition holds it, not the overall max."""
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.watermarks import WatermarkAuthority

    from tests.executor_util import ByRecordKey, state_of

    events = payments_topic(spark, kafka_broker, "runner-payments")
    layout = migrated_at(tmp_path / "store")  # a migrated copy: connect migrating a new store runs in test_connect.py
    summary = PipelineRunner(spark, layout, Pipeline("kafka_runner", (events,), (ByRecordKey(),)), zk=zk_config,
                             end_of_input=False, progress=lambda line: None).run()
    assert sum(r.records_in for r in summary.reports["by_record_key"]) == len(MESSAGES)
    assert events.partition_watermarks() == {"runner-payments/0": 4_500, "runner-payments/1": 2_000}
    client = connect(zk_config)
    try:
        assert WatermarkAuthority(client, pipeline="kafka_runner").injector_watermark("events") == 2_000
    finally:
        client.stop()
        client.close()
    # no timer is due under 2 s: the counts wait in state for their bucket's end
    assert state_of(spark, layout, "by_record_key") == {
        "c1": ({"0": 3}, [("0", 9_999)]), "c2": ({"0": 2}, [("0", 9_999)])}



@pytest.mark.zk
@pytest.mark.timeout(600)
def test_a_kafka_topic_through_a_continuous_pipeline_is_exactly_once_across_a_restart(
        spark: Any, kafka_broker: Any, zk_config: Any, tmp_path: Path, migrated_at: Any) -> None:
    """``engine.start_pipeline`` on a KafkaInjector: messages appended while the pipeline runs are
    read, its watermark is the minimum over the partitions (the lagging one holds it), and after a
    stop, more messages and a start of a new process's objects on the same store, every message
    has exactly one output with the right running count."""
    from kafka_pipeline import card_counts, card_messages, make, want_counts

    import deltawheel
    from deltawheel.servers.kafka import create_topic

    kafka_ready(spark)
    servers = kafka_broker.bootstrap_servers
    create_topic(spark, servers, "live-cards", partitions=2)
    produce(spark, servers, "live-cards", card_messages(0, 20, lag_ms=3_000))
    store = tmp_path / "store"
    migrated_at(store)  # a migrated copy: connect migrating a new store runs in test_connect.py
    total = 0
    for run_no, (first, count) in enumerate([(20, 30), (50, 40)]):
        events, p = make(servers, "live-cards")  # what a restarted process builds again
        with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                                pipeline="kafka_live") as engine:
            engine.progress = False
            run = engine.start_pipeline(p)
            ex = run.executors["card_count"]
            produce(spark, servers, "live-cards", card_messages(first, count, lag_ms=3_000))  # while it runs
            want = (first + count) - total
            deadline = time.monotonic() + 240
            while ex.records_in_total < want:
                run.check()
                assert time.monotonic() < deadline, f"run {run_no}: {ex.records_in_total} of {want} messages read"
                time.sleep(0.5)
            stop = run.stop()
            assert stop.records_in == want
            # the stop waited for Spark's commit log: the next start plans a new batch, it reads none again
            from deltawheel.executor.drivers.querystart import pending_batch
            assert pending_batch(run.stages["card_count"].checkpoint) is None
            total = first + count
            last = first + count - 1
            # partition 0 (even numbers) is ahead; partition 1 (odd numbers) lags 3 s
            p0 = max(i for i in range(last + 1) if i % 2 == 0)
            p1 = max(i for i in range(last + 1) if i % 2 == 1)
            marks = events.partition_watermarks()
            assert marks == {"live-cards/0": 1_000_000 + p0 * 100 - 500,
                             "live-cards/1": 1_000_000 + p1 * 100 - 3_000 - 500}
            assert events.watermark_ms() == marks["live-cards/1"]
            assert engine.authority.injector_watermark("events") == marks["live-cards/1"]
    assert card_counts(spark, str(store / "streams" / "card_counts")) == (total, total, want_counts(total))


@pytest.mark.slow
@pytest.mark.zk
@pytest.mark.timeout(1200)
def test_deltawheel_run_on_kafka_killed_resumes_exactly_once(spark: Any, kafka_broker: Any, zk_config: Any,
                                                             tmp_path: Path) -> None:
    """``deltawheel run`` of a Kafka pipeline in a child process, its tasks reading the offset ranges
    (the direct read), SIGKILLed after its first batch; messages appended while it is down and after
    the same command started again: every message has exactly one output with its running count,
    and SIGTERM stops it with status 0."""
    from kafka_pipeline import card_counts, card_messages, want_counts
    from test_continuous import Child, wait_for

    from deltawheel.servers.kafka import create_topic

    kafka_ready(spark)
    servers = kafka_broker.bootstrap_servers
    create_topic(spark, servers, "killed-cards", partitions=2)
    produce(spark, servers, "killed-cards", card_messages(0, 20, lag_ms=1_000))
    store = tmp_path / "store"
    env = {**os.environ, "KAFKA_SERVERS": servers, "KAFKA_TOPIC": "killed-cards",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "deltawheel.cli", "run", "kafka_pipeline:pipeline", "--store", str(store),
           "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot, "--zk-session-timeout", "6"]
    first = Child(cmd, env)
    # the tasks read the batch's offset ranges themselves (the direct read, KafkaInjector's default)
    wait_for("the first run's first batch", lambda: first.saw(r"card_count batch 0: .*\(offset ranges read by the "
                                                                r"tasks\)"), timeout_s=600)
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait(timeout=60)
    produce(spark, servers, "killed-cards", card_messages(20, 30, lag_ms=1_000))  # while nothing runs
    again = Child(cmd, env)
    wait_for("the restart running", lambda: again.saw("running"), timeout_s=600)
    produce(spark, servers, "killed-cards", card_messages(50, 20, lag_ms=1_000))  # while it runs
    table = str(store / "streams" / "card_counts")
    wait_for("every message has an output", lambda: card_counts(spark, table)[1] >= 70, timeout_s=600)
    os.killpg(again.proc.pid, signal.SIGTERM)
    assert again.proc.wait(timeout=180) == 0, "\n".join(again.lines[-40:])
    assert card_counts(spark, table) == (70, 70, want_counts(70))
