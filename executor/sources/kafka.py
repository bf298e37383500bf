"""Kafka input: a topic of JSON messages read with Spark's Kafka source, watermarked per partition
(:class:`PerPartitionWatermark`). docs/sources.md, "Kafka"."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Mapping

from deltawheel.statestore.clock import Clock, SystemClock
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.zk.watermarks import END_OF_TIME, WatermarkAuthority

from ..tasks.image.direct import DirectSource
from ..tasks.input import DEFAULT_MAX_EVENT_AHEAD_MS, FIELD_TYPES, MAX_EVENT_MS, MIN_EVENT_MS, KafkaRead
from .injector import BatchStats, DataFrame, SparkSession, _check_common, _Estimating, publish_watermark
from .jsonl import CORRUPT_RECORD, event_time_of, json_schema, parse_json
from .schema import to_stream_schema

__all__ = ["KafkaInjector", "PerPartitionWatermark", "partition_stats"]


class PerPartitionWatermark:
    """min over partitions of (max event time seen in the partition - ``delay_ms``), with idleness;
    ConfigError: a negative ``delay_ms`` or a timeout <= 0.

    >>> from deltawheel.statestore.clock import ManualClock
    >>> w = PerPartitionWatermark(1_000, clock=ManualClock(0))
    >>> w.assign(["t/0", "t/1"])
    >>> w.observe_partitions({"t/0": 50_000}); w.watermark_ms() is None   # t/1 unknown yet
    True
    >>> w.observe_partitions({"t/1": 20_000}); w.watermark_ms()
    19000
    """

    def __init__(self, delay_ms: int, *, idle_timeout_ms: int | None = None, clock: Clock | None = None) -> None:
        if delay_ms < 0:
            raise ConfigError(f"watermark_delay_ms must be >= 0, got {delay_ms}")
        if idle_timeout_ms is not None and idle_timeout_ms <= 0:
            raise ConfigError(f"idle_timeout_ms must be > 0 (or None: never idle), got {idle_timeout_ms}")
        self.delay_ms = delay_ms
        self.idle_timeout_ms = idle_timeout_ms
        self.clock: Clock = clock or SystemClock()
        self.max_seen: dict[str, int | None] = {}
        self.last_active_ms: dict[str, int] = {}
        self.finished = False
        self._last: int | None = None

    def assign(self, partitions: Iterable[str]) -> None:
        """Declare partitions (e.g. the topic's, at start): unknown until they deliver or go idle."""
        now = self.clock.now_ms()
        for p in partitions:
            self.max_seen.setdefault(p, None)
            self.last_active_ms.setdefault(p, now)

    def observe_partitions(self, max_event_ms: Mapping[str, int | None]) -> None:
        """A batch's max event time per partition that had records (None: none with an event time)."""
        now = self.clock.now_ms()
        for p, mx in max_event_ms.items():
            old = self.max_seen.get(p)
            self.max_seen[p] = old if mx is None else (int(mx) if old is None else max(old, int(mx)))
            self.last_active_ms[p] = now

    def observe(self, stats: BatchStats) -> None:
        """Take a batch's per-partition maxima (``stats.partitions``); a batch without them moves nothing."""
        self.observe_partitions(dict(stats.partitions))

    def finish(self) -> None:
        """Declare the input exhausted: :data:`END_OF_TIME`."""
        self.finished = True

    def idle(self, partition: str) -> bool:
        """True if ``partition`` delivered nothing for ``idle_timeout_ms``."""
        if self.idle_timeout_ms is None:
            return False
        return self.clock.now_ms() - self.last_active_ms.get(partition, 0) >= self.idle_timeout_ms

    def watermark_ms(self) -> int | None:
        """The estimate (never moves back), or None while an active partition is unknown."""
        if self.finished:
            return int(END_OF_TIME)
        seen = [m for p, m in self.max_seen.items() if not self.idle(p)]
        if not seen or None in seen:  # every partition idle (or none known), or an active one unknown
            return self._last
        est = min(int(m) for m in seen if m is not None) - self.delay_ms
        self._last = est if self._last is None else max(self._last, est)
        return self._last


#: Spark Kafka source options the direct read honours as they are (they shape Spark's offsets, not the records)
_SPARK_OPTIONS = frozenset({"failOnDataLoss", "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
                            "minPartitions", "startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp",
                            "startingOffsetsByTimestampStrategy", "kafkaConsumer.pollTimeoutMs",
                            "fetchOffset.numRetries", "fetchOffset.retryIntervalMs"})
#: ``kafka.*`` consumer settings the direct read passes on to librdkafka (same names, same meaning)
_CLIENT_SETTINGS = frozenset({"client.id", "isolation.level"})


def _librdkafka_config(options: Mapping[str, str]) -> tuple[tuple[str, str], ...] | None:
    """The injector's options as librdkafka settings; None: one the direct read cannot honour (the JVM path)."""
    out = []
    for k, v in sorted(options.items()):
        if k.startswith("kafka."):
            name = k[len("kafka."):]
            if name == "security.protocol" and str(v).upper() == "PLAINTEXT":
                continue
            if name not in _CLIENT_SETTINGS:
                return None
            out.append((name, str(v)))
        elif k not in _SPARK_OPTIONS:
            return None
    return tuple(out)


def partition_stats(batch_df: DataFrame, *, now_ms: int, max_event_ahead_ms: int | None) -> BatchStats:
    """A Kafka batch's stats with the max event time per ``topic/partition``, in one aggregation; records
    more than ``max_event_ahead_ms`` ahead of ``now_ms``, or outside the years 1 to 9999, left out."""
    from pyspark.sql import functions as F

    ts = F.col("timestamp_ms")
    ts = F.when(ts.between(MIN_EVENT_MS, MAX_EVENT_MS), ts)  # outside: a dead letter
    if max_event_ahead_ms is not None:
        ts = F.when(ts <= F.lit(now_ms + max_event_ahead_ms), ts)
    part = F.regexp_extract("commit_id", r"^kafka=(.*)@\d+$", 1)
    rows = batch_df.groupBy(part.alias("p")).agg(F.count(F.lit(1)).alias("n"), F.min(ts).alias("lo"),
                                                 F.max(ts).alias("hi")).collect()
    maxima = {r["p"]: r["hi"] for r in rows}
    los = [r["lo"] for r in rows if r["lo"] is not None]
    return BatchStats(sum(int(r["n"]) for r in rows), min(los) if los else None,
                      max((h for h in maxima.values() if h is not None), default=None),
                      partitions=tuple(sorted(maxima.items())))


class KafkaInjector(_Estimating):
    """A Kafka topic of JSON messages, read with Spark's Kafka source, in the stream schema.

    Values are parsed as for :class:`~.jsonl.JsonLinesInjector`; ``record_id`` is
    ``{name}/{topic}/{partition}@{offset}``, ``commit_id`` ``kafka={topic}/{partition}@{offset}``.
    Feed the executor through :meth:`tracking` (it keeps the per-partition watermark). ``key_column``
    None: the message key; ``event_time_column`` None: the Kafka timestamp; ``options``: further
    ``kafka.*`` / source options (docs/sources.md, "Kafka"); ``direct_read``: the image tasks read each
    batch's offset ranges themselves where they can. ConfigError: an invalid name, no schema, a bad
    delay or timeout, or no topic or servers."""

    def __init__(self, name: str, *, bootstrap_servers: str, topic: str, schema: Any, key_column: str | None,
                 event_time_column: str | None, value_columns: list[str] | None = None, watermark_delay_ms: int,
                 idle_timeout_ms: int | None = None, starting_offsets: str = "earliest",
                 max_offsets_per_trigger: int | None = None, options: Mapping[str, str] | None = None,
                 max_event_ahead_ms: int | None = DEFAULT_MAX_EVENT_AHEAD_MS, timestamp_format: str | None = None,
                 clock: Clock | None = None, direct_read: bool = True) -> None:
        _check_common(name, max_event_ahead_ms=max_event_ahead_ms)
        if not bootstrap_servers or not topic:
            raise ConfigError(f"injector {name}: give bootstrap_servers and topic (got {bootstrap_servers!r}, "
                              f"{topic!r})")
        if schema is None:
            raise ConfigError(f"injector {name}: a Kafka source needs the messages' schema, e.g. "
                              "schema='card STRING, amount DOUBLE, ts BIGINT'")
        self.name = name
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.schema = schema  # parsed at stream_df (a DDL string needs a running Spark session)
        self.key_column = key_column
        self.event_time_column = event_time_column
        self.value_columns = None if value_columns is None else tuple(value_columns)
        self.starting_offsets = starting_offsets
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.options = dict(options or {})
        self.max_event_ahead_ms = max_event_ahead_ms
        self.timestamp_format = timestamp_format
        self.direct_read = direct_read
        self._direct: DirectSource | None = None
        self._estimate: PerPartitionWatermark = PerPartitionWatermark(
            watermark_delay_ms, idle_timeout_ms=idle_timeout_ms, clock=clock)

    @property
    def partitions(self) -> list[str]:
        """The partitions known so far (``topic/partition``)."""
        return sorted(self._estimate.max_seen)

    def partition_watermarks(self) -> dict[str, int | None]:
        """Each known partition's own estimate (max seen - bound; None: nothing seen yet)."""
        d = self._estimate.delay_ms
        return {p: None if m is None else m - d for p, m in sorted(self._estimate.max_seen.items())}

    def discover_partitions(self, spark: SparkSession) -> list[str]:
        """List the topic's partitions (none if it does not exist) and declare them to the estimate."""
        j, props = self._client(spark)
        admin = j.org.apache.kafka.clients.admin.Admin.create(props)
        try:
            desc = admin.describeTopics(j.java.util.Collections.singletonList(self.topic)).allTopicNames()
            try:
                got = desc.get(60_000, j.java.util.concurrent.TimeUnit.MILLISECONDS)
            except Exception as exc:
                if "UnknownTopicOrPartition" in str(exc):
                    return []
                raise ConfigError(f"injector {self.name}: cannot describe topic {self.topic} on "
                                  f"{self.bootstrap_servers} ({str(exc).splitlines()[0]}); is the broker "
                                  "reachable?") from exc
            n = got.get(self.topic).partitions().size()
        finally:
            admin.close()
        names = [f"{self.topic}/{i}" for i in range(int(n))]
        self._estimate.assign(names)
        return names

    def _client(self, spark: SparkSession) -> tuple[Any, Any]:
        """(the driver's JVM, the Kafka client properties: the servers and the ``kafka.*`` options)."""
        from deltawheel.statestore.delta.jvm import jvm

        j = jvm(spark)
        props = j.java.util.Properties()
        props.setProperty("bootstrap.servers", self.bootstrap_servers)
        for k, v in self._kafka_options().items():
            props.setProperty(k[len("kafka."):], v)
        return j, props

    def _kafka_options(self) -> dict[str, str]:
        return {k: v for k, v in self.options.items() if k.startswith("kafka.")}

    @property
    def fails_on_data_loss(self) -> bool:
        """Spark's ``failOnDataLoss`` is on: a partition added during the run was read from offset 0."""
        return str(self.options.get("failOnDataLoss", "true")).strip().lower() != "false"

    def earliest_offsets(self, spark: SparkSession, partitions: Iterable[str]) -> dict[str, int]:
        """The earliest offset still available of each of ``partitions`` (numbers as strings)."""
        j, props = self._client(spark)
        raw = "org.apache.kafka.common.serialization.ByteArrayDeserializer"
        props.setProperty("key.deserializer", raw)
        props.setProperty("value.deserializer", raw)
        consumer = j.org.apache.kafka.clients.consumer.KafkaConsumer(props)
        try:
            tps = {p: j.org.apache.kafka.common.TopicPartition(self.topic, int(p)) for p in partitions}
            wanted = j.java.util.ArrayList()
            for tp in tps.values():
                wanted.add(tp)
            got = consumer.beginningOffsets(wanted, j.java.time.Duration.ofSeconds(60))
            return {p: int(got.get(tp)) for p, tp in tps.items()}
        finally:
            consumer.close()

    def batch_df(self, spark: SparkSession, ranges: Mapping[str, Any]) -> DataFrame:
        """The records of ``ranges`` (``{partition: (start, end)}``, end exclusive; at least one not empty)
        in the stream schema. Only the partitions with records are assigned: a subscription assigns every
        partition of the topic, and Spark refuses offsets that leave some out (a batch in which a
        partition had no record)."""
        parts = {str(p): r for p, r in ranges.items() if int(r[1]) > int(r[0])}
        reader = (spark.read.format("kafka").option("kafka.bootstrap.servers", self.bootstrap_servers)
                  .option("assign", json.dumps({self.topic: sorted(int(p) for p in parts)}))
                  .option("startingOffsets", json.dumps({self.topic: {p: int(r[0]) for p, r in parts.items()}}))
                  .option("endingOffsets", json.dumps({self.topic: {p: int(r[1]) for p, r in parts.items()}}))
                  .option("failOnDataLoss", "true").options(**self._kafka_options()))
        return self._prepare(reader.load(), self._checked_schema())

    def _checked_schema(self) -> Any:
        schema = json_schema(self.schema)
        named = [("key_column", self.key_column), ("event_time_column", self.event_time_column)]
        for what, col in named + [("value_columns", c) for c in self.value_columns or ()]:
            if col is not None and col not in schema.fieldNames():
                raise ConfigError(f"injector {self.name}: {what} {col!r} is not a field of the schema "
                                  f"({', '.join(schema.fieldNames())}); fix the injector's configuration")
        return schema

    def stream_df(self, spark: SparkSession) -> DataFrame:
        """The topic as a streaming DataFrame in the stream schema (its partitions are listed first);
        ConfigError: no Kafka connector, no broker, or a bad schema or field name."""
        from pyspark.errors import AnalysisException

        schema = self._checked_schema()
        reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", self.bootstrap_servers)
                  .option("subscribe", self.topic).option("startingOffsets", self.starting_offsets)
                  .option("failOnDataLoss", "true"))
        if self.max_offsets_per_trigger is not None:
            reader = reader.option("maxOffsetsPerTrigger", self.max_offsets_per_trigger)
        for k, v in self.options.items():
            reader = reader.option(k, v)
        self.discover_partitions(spark)
        self._direct = self._direct_source(schema)
        try:
            raw = reader.load()
        except AnalysisException as exc:
            if "kafka" in str(exc).lower() and "find" in str(exc).lower():
                raise ConfigError("Spark's Kafka connector is not on the session's classpath: build the session "
                                  "with build_spark(SparkSettings(kafka=True)) or add spark.jars.packages="
                                  "org.apache.spark:spark-sql-kafka-0-10_2.13:<pyspark version> "
                                  "(docs/sources.md)") from exc
            raise
        return self._prepare(raw, schema)

    def direct_source(self) -> DirectSource | None:
        """How image tasks can read a batch's offset ranges themselves (None: the JVM reads the topic)."""
        return self._direct

    def _direct_source(self, schema: Any) -> DirectSource | None:
        fields = tuple((f.name, f.dataType.simpleString()) for f in schema.fields)
        types = dict(fields)
        config = _librdkafka_config(self.options)
        if (not self.direct_read or config is None or self.timestamp_format is not None or any(t not in FIELD_TYPES for _n, t in fields)
                or (self.key_column is not None and types[self.key_column] not in ("string", "int", "bigint"))
                or (self.event_time_column is not None and types[self.event_time_column] not in ("int", "bigint"))):
            return None
        values = self.value_columns
        if values is None:
            values = tuple(n for n, _t in fields if n != self.event_time_column)
        read = KafkaRead(servers=self.bootstrap_servers, topic=self.topic, config=config, fields=fields,
                         key_column=self.key_column, event_time_column=self.event_time_column,
                         value_columns=tuple(sorted(set(values))), fail_on_data_loss=self.fails_on_data_loss)
        return DirectSource(stream=self.name, key_column="key", event_time_column="timestamp_ms",
                            record_id_column="record_id", types=(), kafka=read)

    def _prepare(self, raw: DataFrame, schema: Any) -> DataFrame:
        """Spark's Kafka rows (streaming or batch) in the stream schema."""
        from pyspark.sql import functions as F

        fields = schema.fields
        parsed = raw.select(
            "topic", "partition", "offset", F.col("timestamp").alias("_kafka_ts"),
            F.col("key").cast("string").alias("_kafka_key"), F.col("value").alias("_kafka_value"),
            parse_json(F.col("value").cast("string"), schema).alias("_j"))
        # a value that is not UTF-8 is malformed (Jackson would read it with U+FFFD in place of its bytes);
        # a message key that is not (the key without key_column): to_stream_schema's check
        text = F.col("_kafka_value").cast("string")
        not_utf8 = ~F.coalesce(F.is_valid_utf8(text), F.lit(True))
        corrupt = F.when(not_utf8, F.coalesce(text, F.lit(""))).otherwise(F.col(f"_j.{CORRUPT_RECORD}"))
        parsed = parsed.select("topic", "partition", "offset", "_kafka_ts", "_kafka_key", "_kafka_value",
                               *[F.col(f"_j.{f.name}").alias(f.name) for f in fields], corrupt.alias(CORRUPT_RECORD))
        event_col = self.event_time_column or "_kafka_ts"
        parsed = event_time_of(parsed, event_col, self.timestamp_format)
        key_col = self.key_column or "_kafka_key"
        where = F.concat(F.col("topic"), F.lit("/"), F.col("partition").cast("string"), F.lit("@"),
                         F.col("offset").cast("string"))
        internal = ("topic", "partition", "offset", "_kafka_ts", "_kafka_key", "_kafka_value", CORRUPT_RECORD)
        return to_stream_schema(
            parsed, producer=self.name, key_column=key_col, event_time_column=event_col,
            value_columns=self.value_columns, record_id=F.concat(F.lit(f"{self.name}/"), where),
            commit_id=F.concat(F.lit("kafka="), where), exclude=internal, malformed=F.col(CORRUPT_RECORD),
            raw=F.col("_kafka_value"))

    def stats_of(self, batch_df: DataFrame) -> BatchStats:
        """The batch's stats with per-partition maxima (:func:`partition_stats`)."""
        return partition_stats(batch_df, now_ms=self._estimate.clock.now_ms(),
                               max_event_ahead_ms=self.max_event_ahead_ms)

    def tracking(self, executor: Callable[[Any, int], Any], authority: WatermarkAuthority, *,
                 sequencer: int = 0) -> Callable[[Any, int], None]:
        """A ``foreachBatch`` function: stats, ``executor(batch_df, batch_id)``, publish the watermark."""

        def run(batch_df: Any, batch_id: int) -> None:
            stats = self.stats_of(batch_df)
            executor(batch_df, batch_id)
            self.observe(stats)
            publish_watermark(authority, self, sequencer=sequencer)

        return run
