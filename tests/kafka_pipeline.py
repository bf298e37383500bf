"""A one-stage pipeline over a Kafka topic for the Kafka tests: a running count per card, one
production per message. ``deltawheel run kafka_pipeline:pipeline`` builds it from
``$KAFKA_SERVERS`` and ``$KAFKA_TOPIC`` (the tests' child processes)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from pyspark import cloudpickle

from deltawheel import RECORD_KEY, Computation, KafkaInjector, Pipeline

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

NAME = "kafka_live"


class CardCount(Computation):
    """A running count per card: every message produces its card's new count."""

    name = "card_count"
    inputs = {"events": RECORD_KEY}
    outputs = ("card_counts",)

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        n = (ctx.state or 0) + 1
        ctx.state = n
        ctx.produce("card_counts", {"card": ctx.key, "n": n})


def make(servers: str, topic: str) -> tuple[KafkaInjector, Pipeline]:
    """The injector and the pipeline reading ``topic``."""
    events = KafkaInjector("events", bootstrap_servers=servers, topic=topic, schema="card STRING, i BIGINT, ts BIGINT",
                           key_column="card", event_time_column="ts", watermark_delay_ms=500)
    return events, Pipeline(NAME, (events,), (CardCount(),))


def pipeline() -> Pipeline:
    """``deltawheel run kafka_pipeline:pipeline``."""
    return make(os.environ["KAFKA_SERVERS"], os.environ["KAFKA_TOPIC"])[1]


def card_messages(first: int, count: int, *, lag_ms: int) -> list[tuple[int, str, str]]:
    """``count`` (partition, key, value) messages from number ``first`` on, cards c0..c4; partition
    1's event times lag partition 0's by ``lag_ms``."""
    out = []
    for i in range(first, first + count):
        part = i % 2
        ts = 1_000_000 + i * 100 - (lag_ms if part else 0)
        out.append((part, f"c{i % 5}", json.dumps({"card": f"c{i % 5}", "i": i, "ts": ts})))
    return out


def card_counts(spark: Any, stream_table: str) -> tuple[int, int, list[tuple[str, int]]]:
    """(rows, distinct record ids, sorted (card, count) values) of the output stream table."""
    rows = spark.read.format("delta").load(stream_table).collect()
    values = [json.loads(bytes(r.value)) for r in rows]
    return len(rows), len({r.record_id for r in rows}), sorted((v["card"], v["n"]) for v in values)


def want_counts(total: int) -> list[tuple[str, int]]:
    """The (card, count) values of messages 0..total-1, each once."""
    per_card: dict[str, int] = {}
    for i in range(total):
        per_card[f"c{i % 5}"] = per_card.get(f"c{i % 5}", 0) + 1
    return sorted((c, n) for c, m in per_card.items() for n in range(1, m + 1))
