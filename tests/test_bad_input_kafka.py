"""Kafka messages that are not the expected format, generated: a value that is not JSON, not an
object, of another type than the schema, not UTF-8, a tombstone, without its key field, with an
event time outside the years 1 to 9999. Each is one dead letter holding the message's value byte for
byte, its reason, and its ``kafka=<topic>/<partition>@<offset>`` position; each good message's
effect is in the state once. A real KRaft broker (``tests/test_kafka.py``'s, once per session).
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.layout import StoreLayout
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle
from test_bad_input import Ids
from test_kafka import kafka_broker, kafka_ready  # noqa: F401 (the session's broker, a fixture)

import deltawheel
from deltawheel import RECORD_KEY, KafkaInjector, Pipeline

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MALFORMED = "malformed input: the source could not parse it"


class KafkaIds(Ids):
    name = "kafka_ids"
    inputs = {"payments": RECORD_KEY}


def _msg(card: Any, ts: Any, **more: Any) -> bytes:
    return json.dumps({"card": card, "amount": 1.5, "ts": ts, **more}, ensure_ascii=False).encode()


@st.composite
def message(draw: Any, kind: str) -> tuple[bytes | None, str | None, str | None]:
    """(value, reason of its dead letter or None, key of a good one)."""
    card = draw(st.text(alphabet="abc€", min_size=1, max_size=4))
    ts = draw(st.integers(-62_135_596_800_000, 253_402_300_799_999))
    if kind == "good":
        return _msg(card, ts), None, card
    if kind == "not_json":
        return draw(st.sampled_from([b"not json {", b"{", b'{"card": "a", "amount": 1.5, "ts": 1'])), MALFORMED, None
    if kind == "not_object":
        return draw(st.sampled_from([b"[1]", b"null", b"42", b'"x"'])), MALFORMED, None
    if kind == "wrong_type":
        return _msg(card, ts).replace(b'"amount": 1.5', b'"amount": "lots"'), MALFORMED, None
    if kind == "not_utf8":
        return b'{"card": "' + card.encode() + b'\xff", "amount": 1.5, "ts": 5}', MALFORMED, None
    if kind == "tombstone":
        return None, "key extractor returned an empty key", None
    if kind == "no_key":
        return json.dumps({"amount": 1.5, "ts": ts}).encode(), "key extractor returned an empty key", None
    assert kind == "ts_out_of_range"
    return _msg(card, draw(st.sampled_from([2**63 - 1, 253_402_300_800_000, -(2**62)]))), "outside the years 1 to 9999", None


KINDS = ("good", "not_json", "not_object", "wrong_type", "not_utf8", "tombstone", "no_key", "ts_out_of_range")


@st.composite
def messages(draw: Any) -> list[tuple[int, bytes | None, str | None, str | None]]:
    out = [(draw(st.integers(0, 1)), *draw(message(k))) for k in KINDS for _ in range(draw(st.integers(1, 2)))]
    return list(draw(st.permutations(out)))


@pytest.mark.timeout(900)
@settings(max_examples=1, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(msgs=messages())
def test_kafka_messages_not_in_the_expected_format_are_dead_letters_with_their_bytes(  # type: ignore[no-untyped-def]
        spark, kafka_broker, migrated_template, zk_server, tmp_path, msgs) -> None:  # noqa: F811
    from conftest import copy_migrated_store
    from pyspark.sql import functions as F

    from deltawheel.servers.kafka import create_topic

    kafka_ready(spark)
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    create_topic(spark, kafka_broker.bootstrap_servers, topic, partitions=2)
    df = spark.createDataFrame([(p, b"k", bytearray(v) if v is not None else None) for p, v, _, _ in msgs],
                               "partition INT, key BINARY, value BINARY").coalesce(1)
    df.write.format("kafka").option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers).option(
        "topic", topic).save()
    offsets = {0: 0, 1: 0}
    where = {}
    for p, v, why, key in msgs:  # one writer, in order: each partition's offsets count up from 0
        where[f"kafka={topic}/{p}@{offsets[p]}"] = (v, why, key)
        offsets[p] += 1
    store = StoreLayout(str(tmp_path / uuid.uuid4().hex[:8] / "store"))
    copy_migrated_store(migrated_template, Path(store.root))
    payments = KafkaInjector("payments", bootstrap_servers=kafka_broker.bootstrap_servers, topic=topic,
                             schema="card STRING, amount DOUBLE, ts BIGINT", key_column="card",
                             event_time_column="ts", watermark_delay_ms=0, max_event_ahead_ms=None)
    with deltawheel.connect(spark, store=store.root, zk=zk_server.hosts, zk_chroot=f"/bad-{uuid.uuid4().hex[:8]}",
                            pipeline="payments") as engine:
        engine.run_pipeline(Pipeline("payments", (payments,), (KafkaIds(),)), progress=False)
    codec = get_codec("json")
    got = {r["key"]: codec.decode(r["state"]) for r in spark.read.format("delta").load(store.rows_of(KafkaIds.name)).where(
        ~F.col("key").startswith("\x00")).collect()}
    want: dict[str, list[str]] = {}
    for pos, (_, why, key) in where.items():
        if why is None:
            assert key is not None
            want.setdefault(key, []).append(f"payments/{pos.removeprefix('kafka=')}")
    assert got == {k: sorted(v) for k, v in want.items()}
    dead = spark.read.format("delta").load(store.dead_letters).collect()
    assert sorted(r["source_position"] for r in dead) == sorted(p for p, (_, why, _) in where.items() if why)
    for r in dead:
        value, why, _ = where[r["source_position"]]
        assert why is not None and why in r["error"], (r["source_position"], r["error"])
        if value is None:  # a tombstone: no value was sent; its parse, no fields, is what the row holds
            assert r["raw_value"] is None or json.loads(bytes(r["raw_value"])) == {}
        else:
            assert bytes(r["raw_value"]) == value  # the value as sent, byte for byte
