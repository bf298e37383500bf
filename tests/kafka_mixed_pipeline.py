"""A one-stage pipeline over a Kafka topic *and* a Parquet folder for the Kafka replay tests: a
running count per card over both inputs, one production per record. ``deltawheel replay --source
kafka_mixed_pipeline:pipeline`` builds it from ``$KAFKA_SERVERS``, ``$KAFKA_TOPIC`` and
``$CARDS_FOLDER``."""

from __future__ import annotations

import os
import sys

from pyspark import cloudpickle

from deltawheel import RECORD_KEY, Computation, KafkaInjector, ParquetInjector, Pipeline

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

NAME = "kafka_mixed"
SCHEMA = "card STRING, i BIGINT, ts BIGINT"


class MixedCount(Computation):
    """A running count per card over the topic's records and the folder's: each produces the card's
    new count and where the record came from."""

    name = "mixed_count"
    inputs = {"events": RECORD_KEY, "files": RECORD_KEY}
    outputs = ("mixed_counts",)

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        n = (ctx.state or 0) + 1
        ctx.state = n
        ctx.produce("mixed_counts", {"card": ctx.key, "n": n, "from": record.stream})


def make(servers: str, topic: str, folder: str) -> tuple[tuple[KafkaInjector, ParquetInjector], Pipeline]:
    """The injectors and the pipeline reading ``topic`` and ``folder``."""
    events = KafkaInjector("events", bootstrap_servers=servers, topic=topic, schema=SCHEMA, key_column="card",
                           event_time_column="ts", watermark_delay_ms=500, max_offsets_per_trigger=6)
    files = ParquetInjector("files", folder, schema=SCHEMA, key_column="card", event_time_column="ts",
                            max_files_per_trigger=1, watermark_delay_ms=500)
    return (events, files), Pipeline(NAME, (events, files), (MixedCount(),))


def pipeline() -> Pipeline:
    """``deltawheel replay --source kafka_mixed_pipeline:pipeline``."""
    return make(os.environ["KAFKA_SERVERS"], os.environ["KAFKA_TOPIC"], os.environ["CARDS_FOLDER"])[1]
