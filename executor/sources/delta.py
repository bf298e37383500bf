"""The Delta table injector: :class:`DeltaTableInjector`, read with Delta's streaming source."""

from __future__ import annotations

from typing import Sequence

from deltawheel.statestore.delta.log import latest_local_version
from deltawheel.statestore.exceptions import ConfigError

from ..tasks.input import DEFAULT_MAX_EVENT_AHEAD_MS
from .injector import DataFrame, SparkSession, _MaxSeenInjector
from .schema import record_id_of, to_stream_schema

__all__ = ["DeltaTableInjector"]


class DeltaTableInjector(_MaxSeenInjector):
    """A Delta table read with Delta's streaming source (``maxFilesPerTrigger``).

    ``record_id_column`` is required (the source has no row positions); ``commit_id`` is ``delta={record
    id}``; other arguments as for :class:`ParquetInjector`. ConfigError: an invalid name, count, delay
    or bound, or no ``record_id_column``."""

    def __init__(self, name: str, path: str, *, key_column: str | None, event_time_column: str,
                 value_columns: Sequence[str] | None = None, record_id_column: str | None = "record_id",
                 max_files_per_trigger: int = 1, watermark_delay_ms: int,
                 max_event_ahead_ms: int | None = DEFAULT_MAX_EVENT_AHEAD_MS) -> None:
        super().__init__(name, key_column=key_column, event_time_column=event_time_column,
                         value_columns=value_columns, record_id_column=record_id_column,
                         max_files_per_trigger=max_files_per_trigger, watermark_delay_ms=watermark_delay_ms,
                         max_event_ahead_ms=max_event_ahead_ms)
        if not record_id_column:
            raise ConfigError(f"injector {name}: a Delta table source needs record_id_column (Delta's "
                              "streaming source has no file positions to derive stable ids from)")
        self.record_id_column: str = record_id_column
        self.path = path

    def input_token(self) -> int | None:
        """The table's newest commit version (None for a remote table)."""
        return latest_local_version(self.path)

    def stream_df(self, spark: SparkSession) -> DataFrame:
        """The table as a streaming DataFrame in the stream schema; ConfigError: not a Delta table, or a
        named column is missing."""
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as F

        try:
            raw = (spark.readStream.format("delta").option("maxFilesPerTrigger", self.max_files_per_trigger)
                   .load(self.path))
            columns = raw.schema.fieldNames()
        except AnalysisException as exc:
            raise ConfigError(f"injector {self.name}: {self.path} is not a readable Delta table "
                              f"({str(exc).splitlines()[0]}); create it first") from exc
        rid = record_id_of(self.record_id_column, producer=self.name, columns=columns)
        row_hash = F.concat(F.lit("sha256:"), F.sha2(F.to_json(F.struct(*[F.col(c) for c in columns])), 256))
        return to_stream_schema(
            raw, producer=self.name, key_column=self.key_column, event_time_column=self.event_time_column,
            value_columns=self.value_columns, record_id=rid, commit_id=F.concat(F.lit("delta="), F.coalesce(rid, row_hash)),
            exclude=(self.record_id_column,))
