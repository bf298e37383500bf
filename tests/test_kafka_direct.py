"""The Kafka direct read (executor/tasks/image/kafkaread.py): image tasks reading a batch's offset
ranges with confluent-kafka, the offsets Spark's (its offset log), instead of Spark's Kafka source.

Compared with the JVM path on the same topic: the prepared rows per micro-batch (hypothesis-made
messages, however the topic is cut into batches), and whole runs (outputs, state, dead letters,
late records) including a crash after a commit; a batch whose records Kafka no longer holds fails
with a typed error.
"""

from __future__ import annotations

import json
import sys
import types
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import test_kafka
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
cloudpickle.register_pickle_by_value(sys.modules[__name__])
kafka_broker = test_kafka.kafka_broker  # the Kafka tests' broker fixture

SCHEMA = "card STRING, amount DOUBLE, n INT, ok BOOLEAN, ts BIGINT"


def _produce(servers: str, topic: str, messages: list[tuple[int, bytes | None, bytes | None]]) -> None:
    """(partition, key, value) messages, in order, with confluent-kafka's producer."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": servers, "linger.ms": 0})
    for part, key, value in messages:
        p.produce(topic, value=value, key=key, partition=part)
    assert p.flush(60) == 0


def _topic(spark: Any, servers: str, messages: list[tuple[int, bytes | None, bytes | None]], *,
           partitions: int = 3) -> str:
    from deltawheel.servers.kafka import create_topic

    topic = f"direct-{uuid.uuid4().hex[:10]}"
    create_topic(spark, servers, topic, partitions=partitions)
    _produce(servers, topic, messages)
    return topic


def _injector(servers: str, topic: str, **kw: Any) -> Any:
    from deltawheel import KafkaInjector

    return KafkaInjector("events", bootstrap_servers=servers, topic=topic, schema=SCHEMA, key_column="card",
                         event_time_column="ts", watermark_delay_ms=1_000, **kw)


def _decoded(row: dict[str, Any]) -> dict[str, Any]:
    """A prepared row with a JSON value decoded (the tasks' JSON text may differ in form, not in content)."""
    value = row["value"]
    if value is not None and row["codec"] == "json":
        try:
            value = json.loads(value, parse_constant=lambda c: c)
        except ValueError:  # a dead letter's value is the message as sent (e.g. empty)
            pass
    return {**row, "value": value}


_card = st.one_of(st.sampled_from(["c1", "c2", "ключ", "", "\x00nul"]), st.none())
_field = st.fixed_dictionaries({}, optional={
    "card": _card, "amount": st.one_of(st.floats(allow_nan=False, width=64), st.integers(-10**6, 10**6),
                                       st.sampled_from(["NaN", "lots", "Infinity"]), st.none()),
    "n": st.one_of(st.integers(-2**31, 2**31 - 1), st.sampled_from([2**40, 1.5]), st.none()),
    "ok": st.one_of(st.booleans(), st.none()),
    "ts": st.one_of(st.integers(0, 4_000), st.sampled_from([-1, 2**62, "soon"]), st.none())})
_value = st.one_of(
    _field.map(lambda d: json.dumps(d, ensure_ascii=False).encode()),
    st.sampled_from([b"not json {", b'{"card": "c1", "ts": oops}', b"\xff\xfe{}", b"[1, 2]", b"", b"null", b"17"]),
    st.none())  # a tombstone
_message = st.tuples(st.integers(0, 2), st.one_of(st.none(), st.sampled_from([b"k", b"\xc3\xa9"])), _value)


@pytest.mark.timeout(600)
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))  # a topic and a query each
@given(messages=st.lists(_message, min_size=1, max_size=30), per_trigger=st.sampled_from([4, 11, 1_000]))
@example(messages=[(2, None, b'{"card": "", "ts": -1, "ok": true}'), (0, b"\xc3\xa9", b""), (1, None, b"[1, 2]"),
                   (1, None, None)], per_trigger=4)  # an empty value's dead letter keeps it empty; a tombstone
def test_the_tasks_read_the_rows_the_jvm_prepares(spark: Any, kafka_broker: Any, tmp_path_factory: Any,
                                                  messages: list[Any], per_trigger: int) -> None:
    """Per micro-batch, the rows the tasks read from the batch's offset ranges (Spark's offset log)
    equal what the JVM prepares from Spark's Kafka source, for every interval subset; the driver's
    per-partition statistics equal the JVM's."""
    from deltawheel.executor.sources.injector import BatchStats
    from deltawheel.executor.tasks.image import kafkaread
    from deltawheel.executor.tasks.image.direct import DirectBatch
    from deltawheel.executor.tasks.image.job import ImageTasks
    from deltawheel.executor.tasks.image.kafkaread import (
        KafkaRows,
        batch_ranges,
        partition_maxima,
        prepare_records,
        read_ranges,
    )
    from deltawheel.executor.tasks.input import prepare_input
    from executor_util import ByRecordKey
    from pyspark.sql import functions as F

    test_kafka.kafka_ready(spark)
    servers = kafka_broker.bootstrap_servers
    topic = _topic(spark, servers, messages)
    inj = _injector(servers, topic, max_offsets_per_trigger=per_trigger)
    chk = str(tmp_path_factory.mktemp("chk"))
    df = inj.stream_df(spark).withColumn("stream", F.lit("events"))
    source = inj.direct_source()
    assert source is not None and source.kafka is not None
    read = source.kafka.__class__(**{**source.kafka.__dict__, "checkpoint": chk})
    comp = ByRecordKey()
    n = comp.num_intervals
    place = tuple((iv, 0) for iv in range(n))
    writer = types.SimpleNamespace(comp=comp, _data_cols=None)  # what ImageTasks._data_columns reads
    seen: list[int] = []

    def check(batch: Any, batch_id: int) -> None:
        wm, now = 2_000, 10_000_000  # some records are behind it, one is too far ahead
        cols, _keep = ImageTasks._data_columns(writer, place)  # type: ignore[arg-type]
        jvm = prepare_input(batch, comp, wm, ahead=(now, {"events": 86_400_000})).select(*cols).toArrow()
        ranges = batch_ranges(read, batch_id)
        assert ranges is not None
        assert sum(hi - lo for _p, lo, hi in ranges) == jvm.num_rows
        src = source.__class__(**{**source.__dict__, "kafka": read})
        direct = DirectBatch(source=src, files=(), num_intervals=n, late_before=wm, tasks=(),
                             ahead=(now, 86_400_000), ranges=ranges)
        tasks = KafkaRows(direct)
        for ivs in ([0, 1, 2, 3], [1, 3], [0]):
            got = tasks.rows_of(ivs)
            assert got.filter(got.column("_m")).column("interval").to_pylist() == ivs
            want = jvm.filter(pa.compute.is_in(jvm.column("interval"), pa.array(ivs, pa.int32())))
            assert [(f.name, str(f.type)) for f in got.schema] == [(f.name, str(f.type)) for f in jvm.schema]
            rows = sorted(map(_decoded, got.filter(pa.compute.invert(got.column("_m"))).to_pylist()), key=repr)
            assert rows == sorted(map(_decoded, want.to_pylist()), key=repr)
        prep = prepare_records(read, "events", read_ranges(read, ranges))
        assert kafkaread._CONSUMERS  # kept for the next batch
        kafkaread.close_consumers()  # as the latency bench does before it stops its broker
        assert not kafkaread._CONSUMERS
        assert prepare_records(read, "events", read_ranges(read, ranges)).record_id == prep.record_id  # a new one
        count, lo, hi, parts = partition_maxima(read, prep, now_ms=now, max_event_ahead_ms=86_400_000)
        from deltawheel.executor.sources.kafka import partition_stats

        assert BatchStats(count, lo, hi, partitions=parts) == partition_stats(batch, now_ms=now,
                                                                              max_event_ahead_ms=86_400_000)
        seen.append(batch_id)

    q = df.writeStream.foreachBatch(check).trigger(availableNow=True).option("checkpointLocation", chk).start()
    q.awaitTermination()
    kafkaread.close_consumers()
    assert q.exception() is None
    assert seen and seen == list(range(len(seen)))


# cards c0..c6 over three partitions, event times rising with a per-partition lag (late records once
# the watermark passes them), plus malformed, keyless and timeless messages; RoutedLate refuses
# k6's records at whole 1.2 s (dead letters whose text the driver reads back from Kafka)
def _run_messages() -> list[tuple[int, bytes | None, bytes | None]]:
    out: list[tuple[int, bytes | None, bytes | None]] = []
    for i in range(60):
        part = i % 3
        ts = 1_000 + i * 200 - part * 1_500
        out.append((part, None, json.dumps({"card": f"k{i % 7}", "amount": i / 4, "ts": ts}).encode()))
    out += [(0, None, b"not json {"), (1, None, b'{"amount": 1.0, "ts": 3000}'), (2, None, b'{"card": "k1"}'),
            (1, None, b"\xff\xfe"), (2, None, None), (0, None, json.dumps({"card": "k6", "ts": 12_000}).encode())]
    return out + [(p, None, json.dumps({"card": "k2", "amount": 0.5, "ts": 500}).encode()) for p in range(3)]  # late


def _run(spark: Any, servers: str, topic: str, store: Path, zk_config: Any, *, direct: bool,
         crash_at: Any = None) -> tuple[tuple[Any, ...], list[bool]]:
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.layout import StoreLayout
    from executor_util import RoutedLate
    from test_direct import _outputs

    layout = StoreLayout(str(store))
    crashed: list[int] = []

    def faults(point: Any, batch_id: int) -> None:
        if point is crash_at and batch_id == 1 and not crashed:
            crashed.append(batch_id)
            raise RuntimeError(f"_Crash at {point}")

    def runner() -> Any:  # a fresh injector, as a restarted process has
        inj = _injector(servers, topic, max_offsets_per_trigger=25, direct_read=direct)
        return PipelineRunner(spark, layout, Pipeline("direct", (inj,), (RoutedLate(),)), zk=zk_config,
                              faults=faults, progress=print, end_of_input=False)

    if crash_at is not None:
        with pytest.raises(Exception, match="_Crash"):
            runner().run()
        assert crashed == [1]
    summary = runner().run()
    return _outputs(spark, layout), [r.direct_ranges for r in summary.reports["routed"] if r.records_in]


@pytest.fixture(scope="module")
def jvm_run(spark, kafka_broker, zk_server, tmp_path_factory, migrated_template):  # type: ignore[no-untyped-def]
    from conftest import copy_migrated_store
    from deltawheel.statestore.config import ZkConfig

    test_kafka.kafka_ready(spark)
    base = tmp_path_factory.mktemp("kafka-jvm")
    topic = _topic(spark, kafka_broker.bootstrap_servers, _run_messages())
    copy_migrated_store(migrated_template, base / "store")
    out, direct = _run(spark, kafka_broker.bootstrap_servers, topic, base / "store",
                       ZkConfig(hosts=zk_server.hosts, chroot=f"/kafka-jvm-{uuid.uuid4().hex[:8]}"), direct=False)
    assert direct and not any(direct)
    return topic, out


@pytest.mark.slow  # two pipeline runs and a restart: over a minute
@pytest.mark.zk
@pytest.mark.timeout(900)
@pytest.mark.parametrize("crash", [False, True])
def test_a_pipeline_reading_kafka_directly_gives_what_the_jvm_read_gives(spark, kafka_broker, zk_config, tmp_path,  # type: ignore[no-untyped-def]
                                                                         jvm_run, migrated_at, crash) -> None:
    """The same topic, cut into the same micro-batches, through the tasks' direct read: the same
    outputs, state, dead letters (raw bytes, reasons, positions) and late records; with a crash
    after batch 1's commit and a restart, exactly once."""
    from deltawheel.executor.protocol.faults import FaultPoint

    topic, want = jvm_run
    migrated_at(tmp_path / "store")
    counts, _state, dead, late, _ids = want
    assert counts and late and dead  # the comparison has something to compare
    assert {d[5].split(":")[0] for d in dead} >= {"malformed input", "key extractor returned an empty key",
                                                  "record without timestamp", "ValueError"}
    assert any(d[4] == b"\xff\xfe" for d in dead)  # the message's bytes as sent
    got, direct = _run(spark, kafka_broker.bootstrap_servers, topic, tmp_path / "store", zk_config, direct=True,
                       crash_at=FaultPoint.AFTER_COMMIT if crash else None)
    assert direct and all(direct)
    assert got[:4] == want[:4]
    assert crash or got[4] == want[4]  # (the record ids kept depend on the batches an executor counted)


@pytest.mark.zk
@pytest.mark.timeout(600)
def test_engine_run_reads_a_topic_directly_and_fails_on_records_kafka_no_longer_holds(  # type: ignore[no-untyped-def]
        spark, kafka_broker, zk_config, tmp_path, migrated_at) -> None:
    """As a user would: ``engine.run`` of a Kafka injector, the batches read by the tasks, every
    message counted once; a planned batch whose records were deleted (as retention does) before it
    ran fails with KafkaDataLossError, and nothing of it is committed."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient
    from deltawheel.executor.exceptions import KafkaDataLossError
    from deltawheel.executor.protocol.faults import FaultPoint
    from executor_util import ByRecordKey, stream_rows

    import deltawheel

    test_kafka.kafka_ready(spark)
    servers = kafka_broker.bootstrap_servers
    msgs = [(i % 2, None, json.dumps({"card": f"c{i % 3}", "ts": 1_000 + i}).encode()) for i in range(12)]
    topic = _topic(spark, servers, msgs, partitions=2)
    store = tmp_path / "store"
    migrated_at(store)
    chk = str(tmp_path / "chk")
    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="kafka_direct") as engine:
        engine.progress = False
        reports = engine.run(_injector(servers, topic), ByRecordKey(), checkpoint=chk)
        assert [r.direct_ranges for r in reports if r.records_in] == [True]
        assert sum(r.records_in for r in reports) == 12
        counts = stream_rows(spark, engine.layout, "counts")  # each key's bucket, closed at the input's end
        assert {json.loads(v)["q"]: json.loads(v)["n"] for _r, _k, v, _t in counts} == {"c0": 4, "c1": 4, "c2": 4}
    _produce(servers, topic, [(0, None, json.dumps({"card": "c0", "ts": 2_000}).encode())])

    def crash(point: Any, batch_id: int) -> None:  # the next batch is planned, then the process dies
        if point is FaultPoint.AFTER_PREPARE:
            raise RuntimeError("_Crash after prepare")

    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="kafka_direct") as engine:
        engine.progress = False
        with pytest.raises(Exception, match="_Crash"):
            engine.run(_injector(servers, topic), ByRecordKey(), checkpoint=chk, faults=crash)
    admin = AdminClient({"bootstrap.servers": servers})
    for fut in admin.delete_records([TopicPartition(topic, 0, 7)]).values():  # retention, at once
        fut.result(60)
    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="kafka_direct") as engine:
        engine.progress = False
        with pytest.raises(KafkaDataLossError, match=f"topic {topic} partition 0: the batch's offsets 6 to 7"):
            engine.run(_injector(servers, topic), ByRecordKey(), checkpoint=chk)
        assert stream_rows(spark, engine.layout, "counts") == counts
