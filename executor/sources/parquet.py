"""The Parquet folder injector, read by Spark's file streaming source or by the image tasks."""

from __future__ import annotations

import logging
from typing import Any, Sequence

from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.exceptions import ConfigError

from ..tasks.image.direct import DirectSource, direct_or_reason
from ..tasks.input import DEFAULT_MAX_EVENT_AHEAD_MS
from .estimates import PendingPercentile, check_percentile
from .folders import (
    _check_footer,
    _first_file_footer,
    _local_parquet_schema,
    _spark_schema,
    local_folder_token,
    make_local_dir,
)
from .injector import BatchStats, DataFrame, SparkSession, _MaxSeenInjector
from .jsonl import json_schema
from .schema import record_id_of, to_stream_schema

__all__ = ["ParquetInjector"]

_LOG = logging.getLogger(__name__)


class ParquetInjector(_MaxSeenInjector):
    """A folder of Parquet files read with Spark's file streaming source (docs/sources.md), in
    modification-time order, names starting with ``_`` or ``.`` ignored. ``record_id``:
    ``record_id_column`` (null or empty: a dead letter), else ``{name}/{file name}#{row index}``;
    ``commit_id``: ``file={file name}#row={row index}``. ``schema`` None: read from the files at
    :meth:`stream_df`; ``watermark_percentile`` in [0, 1): the estimate is that quantile of the unread
    files' event times (:mod:`.estimates`). ConfigError: an invalid name, count, delay, bound or
    percentile, or both per-trigger limits."""

    def __init__(self, name: str, folder: str, *, key_column: str | None, event_time_column: str,
                 value_columns: Sequence[str] | None = None, record_id_column: str | None = None,
                 max_files_per_trigger: int | None = None, watermark_delay_ms: int,
                 max_event_ahead_ms: int | None = DEFAULT_MAX_EVENT_AHEAD_MS,
                 watermark_percentile: float | None = None, schema: Any = None,
                 max_bytes_per_trigger: int | None = None) -> None:
        super().__init__(name, key_column=key_column, event_time_column=event_time_column,
                         value_columns=value_columns, record_id_column=record_id_column,
                         max_files_per_trigger=max_files_per_trigger, watermark_delay_ms=watermark_delay_ms,
                         max_event_ahead_ms=max_event_ahead_ms, max_bytes_per_trigger=max_bytes_per_trigger)
        self.schema = schema  # parsed at stream_df (a DDL string needs a running Spark session)
        self.folder = folder
        self._direct: DirectSource | None = None
        self.direct_refused: str | None = None  # why the image tasks cannot read the files (set by stream_df)
        self.watermark_percentile = watermark_percentile
        if watermark_percentile is not None:
            check_percentile(watermark_percentile)

    @property
    def tracks_files(self) -> bool:
        """True when the estimate needs the files each query read (``BatchStats.sources``)."""
        return self.watermark_percentile is not None

    def observe(self, stats: BatchStats, *, query: str = "") -> None:
        """Advance the estimate with a consumed batch (``query``: which computation's query read it)."""
        if isinstance(self._estimate, PendingPercentile):
            self._estimate.observe(stats, query=query)
        else:
            self._estimate.observe(stats)

    def input_token(self) -> tuple[tuple[str, int, int], ...] | None:
        """The folder's visible files with sizes and mtimes (None for a remote folder)."""
        return local_folder_token(self.folder)

    def direct_source(self) -> DirectSource | None:
        """How image tasks can read the files themselves, per the last :meth:`stream_df`; None: JVM needed."""
        return self._direct

    def stream_df(self, spark: SparkSession) -> DataFrame:
        """The folder as a streaming DataFrame in the stream schema; ConfigError: no schema to be had, a
        mismatch with the first file, or a named column missing."""
        from pyspark.errors import AnalysisException

        make_local_dir(self.folder)
        files = table_files(spark, self.folder)
        if self.watermark_percentile is not None and not isinstance(self._estimate, PendingPercentile):
            if files is None:
                raise ConfigError(f"injector {self.name}: watermark_percentile reads the pending files' event "
                                  f"times, which needs a folder Python reaches (local or s3a://); {self.folder} "
                                  "is not one")
            self._estimate = PendingPercentile(files, self.event_time_column, self.watermark_percentile,
                                               floor=self._estimate)
        found = _first_file_footer(self.folder, files)
        footer = None if found is None else found[1]
        given = None if self.schema is None else json_schema(self.schema)
        if given is not None:
            if found is not None:
                _check_footer(self.name, found[0], found[1], given)
            arrow = _given_arrow(given, footer)
        else:
            arrow = footer if _spark_schema(footer) is not None else None
        self._direct, self.direct_refused = None, None
        if arrow is not None and files is not None:
            self._direct, self.direct_refused = direct_or_reason(
                self.name, arrow, key_column=self.key_column, event_time_column=self.event_time_column,
                record_id_column=self.record_id_column, value_columns=self.value_columns, s3=files.s3)
        elif footer is not None and files is not None:
            self.direct_refused = _unread_column(footer)
        if self.direct_refused:
            _LOG.warning("injector %s: the image tasks cannot read its files themselves (%s); Spark's scan "
                         "and shuffle feed them, slower, and a worker's image cache hits less", self.name,
                         self.direct_refused)
        try:
            schema = given or _spark_schema(footer) or spark.read.parquet(self.folder).schema
        except AnalysisException as exc:
            raise ConfigError(f"injector {self.name}: cannot read a Parquet schema from {self.folder} "
                              f"({str(exc).splitlines()[0]}); put at least one Parquet file there, "
                              "or give schema=") from exc
        raw = spark.readStream.schema(schema).options(**self.read_limits).parquet(self.folder)
        return self._in_stream_schema(raw, schema)

    def files_df(self, spark: SparkSession, names: Sequence[str]) -> DataFrame:
        """The records of some of the folder's files (by name) as :meth:`stream_df` gives them, in a batch."""
        given = None if self.schema is None else json_schema(self.schema)
        schema = given or _local_parquet_schema(self.folder) or spark.read.parquet(self.folder).schema
        raw = spark.read.schema(schema).parquet(*[f"{self.folder.rstrip('/')}/{n}" for n in sorted(names)])
        return self._in_stream_schema(raw, schema)

    def _in_stream_schema(self, raw: DataFrame, schema: Any) -> DataFrame:
        from pyspark.sql import functions as F

        fname, row = F.col("_metadata.file_name"), F.col("_metadata.row_index").cast("string")
        position = F.concat(F.lit(f"{self.name}/"), fname, F.lit("#"), row)
        record_id = position if self.record_id_column is None else record_id_of(
            self.record_id_column, producer=self.name, columns=schema.fieldNames())  # none: a dead letter
        return to_stream_schema(
            raw, producer=self.name, key_column=self.key_column, event_time_column=self.event_time_column,
            value_columns=self.value_columns, record_id=record_id,
            commit_id=F.concat(F.lit("file="), fname, F.lit("#row="), row),
            exclude=() if self.record_id_column is None else (self.record_id_column,))


def _unread_column(footer: Any) -> str | None:
    """Why the tasks do not read files of schema ``footer`` whose columns Spark types itself (None: they would)."""
    import pyarrow as pa

    for f in footer:
        if _spark_schema(pa.schema([f])) is None:
            if pa.types.is_timestamp(f.type):
                return (f"column {f.name!r} is {f.type}; the tasks read a timestamp with a time zone (ms or us: "
                        "write it with tz='UTC')")
            return f"column {f.name!r} is {f.type}, a type only Spark reads"
    return None


def _given_arrow(given: Any, footer: Any | None) -> Any | None:
    """The Arrow schema the direct read expects: the file's types of the given columns, else the given."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    if footer is not None:
        return pa.schema([footer.field(f.name) for f in given.fields])
    try:
        return to_arrow_schema(given)
    except Exception:  # a type Arrow has no form for: the JVM reads the batches
        return None
