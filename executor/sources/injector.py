"""The injector contract: a stream in the stream-table schema (its ``record_id`` the same on every re-run)
and a low watermark estimate. docs/injector-watermarks.md, docs/sources.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import validate_name
from deltawheel.statestore.zk.watermarks import END_OF_TIME, WatermarkAuthority

from ..tasks.input import DEFAULT_MAX_EVENT_AHEAD_MS
from .estimates import PendingPercentile

__all__ = ["BatchStats", "Injector", "MaxSeenMinusBound", "publish_watermark", "DEFAULT_MAX_EVENT_AHEAD_MS"]

DataFrame = Any  # pyspark.sql.DataFrame; pyspark is imported lazily (driver-side only)
SparkSession = Any


@dataclass(frozen=True)
class BatchStats:
    """One consumed micro-batch: ``sources`` its files, ``partitions`` max event time per Kafka partition."""

    count: int
    min_event_ms: int | None = None
    max_event_ms: int | None = None
    sources: frozenset[str] = frozenset()
    partitions: tuple[tuple[str, int | None], ...] = ()

    @classmethod
    def of(cls, batch_df: DataFrame) -> BatchStats:
        """Compute the stats of a batch in the stream schema with one Spark aggregation."""
        from pyspark.sql import functions as F

        row = batch_df.agg(
            F.count(F.lit(1)).alias("n"), F.min("timestamp_ms").alias("lo"), F.max("timestamp_ms").alias("hi"),
            F.collect_set(F.regexp_extract("commit_id", r"^file=([^#]*)#", 1)).alias("files"),
        ).collect()[0]
        files = frozenset(f for f in (row["files"] or ()) if f)
        return cls(int(row["n"]), row["lo"], row["hi"], files)


class MaxSeenMinusBound:
    """Watermark *max event time seen minus a bound*; ``None`` before any, :data:`END_OF_TIME` after finish;
    ConfigError: a negative ``delay_ms``.

    >>> w = MaxSeenMinusBound(10_000)
    >>> w.observe(BatchStats(2, 50_000, 60_000)); w.observe(BatchStats(1, 20_000, 20_000))
    >>> w.watermark_ms()
    50000
    """

    def __init__(self, delay_ms: int) -> None:
        if delay_ms < 0:
            raise ConfigError(f"watermark_delay_ms must be >= 0, got {delay_ms}")
        self.delay_ms = delay_ms
        self.max_seen_ms: int | None = None
        self.finished = False

    def observe(self, stats: BatchStats) -> None:
        """Take the batch's max event time into account."""
        if stats.max_event_ms is not None and (self.max_seen_ms is None or stats.max_event_ms > self.max_seen_ms):
            self.max_seen_ms = int(stats.max_event_ms)

    def finish(self) -> None:
        """Declare the input exhausted: the watermark becomes :data:`END_OF_TIME`."""
        self.finished = True

    def watermark_ms(self) -> int | None:
        """The current estimate (epoch ms), or ``None`` while nothing was seen."""
        if self.finished:
            return int(END_OF_TIME)
        return None if self.max_seen_ms is None else self.max_seen_ms - self.delay_ms


@runtime_checkable
class Injector(Protocol):
    """A source of a pipeline: a stream in the stream schema plus a watermark estimate.

    Optional: ``input_token() -> Hashable | None``, a cheap summary of the input available now
    (None: unknown); the runner skips a query whose inputs' tokens did not change."""

    name: str

    def stream_df(self, spark: SparkSession) -> DataFrame:
        """The input as a streaming DataFrame of the stream-table columns (plus ``raw_value`` for text)."""
        ...

    def observe(self, stats: BatchStats) -> None:
        """Called by the executor after each micro-batch it consumed."""
        ...

    def finish(self) -> None:
        """Called when the query ended because all input available was consumed."""
        ...

    def watermark_ms(self) -> int | None:
        """The injector low watermark to publish (epoch ms); ``None``: not known yet."""
        ...


def publish_watermark(authority: WatermarkAuthority, injector: Injector, *, sequencer: int = 0,
                      instance: str | None = None, held: Mapping[str, Mapping[int, int]] | None = None) -> int | None:
    """Publish ``injector``'s estimate (with ``instance``: as that job instance's); returns the stored
    watermark (never below an earlier one), None while there is no estimate. StaleSequencerError: another
    instance published with a newer sequencer; LeaseSuspendedError: ZooKeeper is suspended, retry later."""
    watermark = injector.watermark_ms()
    if watermark is None:
        return None
    if instance is not None:
        return authority.publish_instance_injector(injector.name, instance, watermark, sequencer=sequencer,
                                                   held=held)
    return int(authority.publish_injector(injector.name, watermark, sequencer=sequencer))


def _check_common(name: str, max_files_per_trigger: int | None = None, max_bytes_per_trigger: int | None = None,
                  max_event_ahead_ms: int | None = None) -> dict[str, int]:
    """The file source's per-trigger option (none or one) of an injector's shared settings; ConfigError
    for an invalid name, a limit below 1, a negative bound, or both limits."""
    validate_name("injector", name)
    limits = {"maxFilesPerTrigger": max_files_per_trigger, "maxBytesPerTrigger": max_bytes_per_trigger}
    for what, n in zip(("max_files_per_trigger", "max_bytes_per_trigger"), limits.values(), strict=True):
        if n is not None and n < 1:
            raise ConfigError(f"injector {name}: {what} must be >= 1, got {n}")
    if max_event_ahead_ms is not None and max_event_ahead_ms < 0:
        raise ConfigError(f"injector {name}: max_event_ahead_ms must be >= 0 (or None: no bound), "
                          f"got {max_event_ahead_ms}")
    if None not in limits.values():
        raise ConfigError(f"injector {name}: give max_files_per_trigger or max_bytes_per_trigger, not both "
                          "(Spark's file source takes one per-trigger limit)")
    return {k: v for k, v in limits.items() if v is not None}


class _Estimating:
    """An injector whose watermark is its ``_estimate``'s."""

    _estimate: Any

    def observe(self, stats: BatchStats) -> None:
        """Advance the estimate with a consumed batch."""
        self._estimate.observe(stats)

    def finish(self) -> None:
        """All input available was consumed: the watermark becomes :data:`END_OF_TIME`."""
        self._estimate.finish()

    def watermark_ms(self) -> int | None:
        """The estimate (epoch ms; the class docstring says which); ``None`` while unknown."""
        return self._estimate.watermark_ms()  # type: ignore[no-any-return]


class _MaxSeenInjector(_Estimating):
    """What the table injectors share: their column settings and a :class:`MaxSeenMinusBound` watermark."""

    def __init__(self, name: str, *, key_column: str | None, event_time_column: str,
                 value_columns: Sequence[str] | None, record_id_column: str | None,
                 max_files_per_trigger: int | None, watermark_delay_ms: int,
                 max_event_ahead_ms: int | None = DEFAULT_MAX_EVENT_AHEAD_MS,
                 max_bytes_per_trigger: int | None = None) -> None:
        self.read_limits = _check_common(name, max_files_per_trigger, max_bytes_per_trigger, max_event_ahead_ms)
        self.max_event_ahead_ms = max_event_ahead_ms
        self.name = name
        self.key_column = key_column
        self.event_time_column = event_time_column
        self.value_columns = None if value_columns is None else tuple(value_columns)
        self.record_id_column = record_id_column
        self.max_files_per_trigger = max_files_per_trigger
        self.max_bytes_per_trigger = max_bytes_per_trigger
        self._estimate: MaxSeenMinusBound | PendingPercentile = MaxSeenMinusBound(watermark_delay_ms)
