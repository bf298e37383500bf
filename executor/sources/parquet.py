"""The Parquet folder injector: :class:`ParquetInjector`, read with Spark's file streaming
source (or by the image tasks themselves: ``executor/tasks/image/direct.py``)."""

from __future__ import annotations

from typing import Any, Sequence

from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.exceptions import ConfigError

from ..tasks.image.direct import DirectSource, direct_source
from ..tasks.input import DEFAULT_MAX_EVENT_AHEAD_MS
from .estimates import PendingPercentile, check_percentile
from .folders import (
    _check_footer,
    _first_file_footer,
    _first_footer,
    _spark_schema,
    local_folder_token,
    make_local_dir,
)
from .injector import BatchStats, DataFrame, SparkSession, _MaxSeenInjector
from .jsonl import json_schema
from .schema import record_id_of, to_stream_schema

__all__ = ["ParquetInjector"]


class ParquetInjector(_MaxSeenInjector):
    """A folder of Parquet files read with Spark's file streaming source.

    Files are consumed in modification-time order, every new file in each micro-batch unless
    ``max_files_per_trigger`` or ``max_bytes_per_trigger`` caps it. The schema is ``schema`` when
    given (the folder may then be empty when :meth:`stream_df` is called; its first file's footer,
    when there is one, is checked against it), otherwise taken from the files present when
    :meth:`stream_df` is called (in a local or ``s3a://`` folder whose columns have plain
    types, from the first visible file's footer, read with pyarrow; otherwise
    by Spark's inference). Files whose name starts with ``_`` or ``.``
    are ignored (Spark's rule), so writers can stage files under such names.

    ``record_id`` is ``record_id_column`` when given, otherwise
    ``{name}/{file name}#{row index}``: deterministic as long as files are never rewritten. Under
    ``record_id_column`` a record whose id is null or empty is a dead letter "record without
    record_id". ``commit_id`` is ``file={file name}#row={row index}``.

    Watermark estimate: :class:`MaxSeenMinusBound` with ``watermark_delay_ms``,
    i.e. the max event time seen minus the declared disorder bound; records
    more than that behind the newest seen are late. :meth:`finish` (all files
    present were consumed) makes it :data:`END_OF_TIME`; files added after
    that are entirely late.

    Args:
        name: injector name (``producer`` column, watermark znode).
        folder: the Parquet folder (local path or URI).
        schema: the files' columns, a DDL string (``"user STRING, ts BIGINT"``) or a StructType;
            None: read from the files present at :meth:`stream_df` (at least one is needed then).
        key_column: natural key column, or ``None`` (key ``""``).
        event_time_column: TIMESTAMP or epoch-ms BIGINT column.
        value_columns: columns of the JSON value; ``None``: all but the event
            time and record id columns; empty: no value (``record.value`` is None).
        record_id_column: unique id column, or ``None`` (position-based ids).
        max_files_per_trigger: at most this many files per micro-batch; None (default): every new
            file (Spark's default), so a backlog never outgrows one batch.
        max_bytes_per_trigger: instead, at most about this many bytes of files per micro-batch
            (Spark's ``maxBytesPerTrigger``; at least one file); not with ``max_files_per_trigger``.
        watermark_delay_ms: the declared disorder bound: the watermark is the newest event time seen
            minus it. A record is late when behind the watermark computed at the end of the batch
            before its own: the newest event time of the earlier batches minus this bound, as
            Spark's own operators judge it (docs/sources.md, "Watermark options").
        max_event_ahead_ms: records whose event time is more than this ahead of the
            processing clock (default one day) become dead letters with the reason and
            do not move the watermark (one record dated 2100 would otherwise close every
            window); None: no bound.
        watermark_percentile: None: the estimate above. A share ``p`` in [0, 1):
            MillWheel's estimate from the pending input instead, the ``p``-quantile of the
            event times of the folder's files no query has read yet (0: their minimum,
            exact: nothing pending becomes late; above 0: up to that share of pending records
            may become late, for less lag); max-seen-minus-bound while nothing is pending
            (:mod:`.estimates`).

    A local folder that does not exist yet is made when the stream is built (:meth:`stream_df`,
    when the pipeline starts), so a job module can build the injector before its input is there.

    Raises:
        ConfigError: an invalid name, a bad count, delay, bound or percentile, both per-trigger
            limits (a schema that does not parse, or a file that does not match it: at
            :meth:`stream_df`).
    """

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
        self.folder = folder  # a local folder that does not exist yet is made at stream_df
        self._direct: DirectSource | None = None
        self.watermark_percentile = watermark_percentile
        if watermark_percentile is not None:  # checked now; the folder's files are reached at stream_df
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

    def watermark_ms(self) -> int | None:
        """The estimate: max event time seen minus ``watermark_delay_ms``, or with
        ``watermark_percentile`` the percentile of the pending files' event times
        (:mod:`.estimates`); ``None`` while unknown."""
        return self._estimate.watermark_ms()

    def input_token(self) -> tuple[tuple[str, int, int], ...] | None:
        """The folder's visible files with sizes and mtimes (None for a remote folder)."""
        return local_folder_token(self.folder)

    def direct_source(self) -> DirectSource | None:
        """How image tasks can read this folder's files themselves (``executor/tasks/image/direct.py``), as
        found by the last :meth:`stream_df`: a folder Python reaches (local, ``file:``, ``s3a://``), a string key column, a string record
        id column (or none), a UTC timestamp or int event time column and value columns of
        strings, booleans, signed integers or doubles (or none); otherwise None (the JVM reads
        and prepares the batches)."""
        return self._direct

    def stream_df(self, spark: SparkSession) -> DataFrame:
        """The folder as a streaming DataFrame in the stream schema.

        Raises:
            ConfigError: no ``schema`` and no readable Parquet file in the folder, a ``schema`` that
                does not parse or that the first file does not match, or a named column missing
                (see :func:`to_stream_schema`).
        """
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
        self._direct = None if arrow is None or files is None else direct_source(
            self.name, arrow, key_column=self.key_column, event_time_column=self.event_time_column,
            record_id_column=self.record_id_column, value_columns=self.value_columns, s3=files.s3)
        try:
            schema = given or _spark_schema(footer) or spark.read.parquet(self.folder).schema
        except AnalysisException as exc:
            raise ConfigError(f"injector {self.name}: cannot read a Parquet schema from {self.folder} "
                              f"({str(exc).splitlines()[0]}); put at least one Parquet file there, "
                              "or give schema=") from exc
        raw = spark.readStream.schema(schema).options(**self.read_limits).parquet(self.folder)
        return self._in_stream_schema(raw, schema)

    def files_df(self, spark: SparkSession, names: Sequence[str]) -> DataFrame:
        """The records of some of the folder's files (by file name), as a batch DataFrame in the
        stream schema with the same record ids as :meth:`stream_df` gives them: a new owner of a
        moved interval catches up with it (``executor/protocol/rescale.py``)."""
        given = None if self.schema is None else json_schema(self.schema)
        schema = given or _spark_schema(_first_footer(self.folder)) or spark.read.parquet(self.folder).schema
        raw = spark.read.schema(schema).parquet(*[f"{self.folder.rstrip('/')}/{n}" for n in sorted(names)])
        return self._in_stream_schema(raw, schema)

    def _in_stream_schema(self, raw: DataFrame, schema: Any) -> DataFrame:
        from pyspark.sql import functions as F

        fname, row = F.col("_metadata.file_name"), F.col("_metadata.row_index").cast("string")
        position = F.concat(F.lit(f"{self.name}/"), fname, F.lit("#"), row)
        if self.record_id_column is not None:
            if self.record_id_column not in schema.fieldNames():
                raise ConfigError(f"{self.name}: record_id_column {self.record_id_column!r} is not a column "
                                  f"of the source (columns: {', '.join(sorted(schema.fieldNames()))})")
            record_id = record_id_of(self.record_id_column)  # none: a dead letter, not a position
        else:
            record_id = position
        return to_stream_schema(
            raw, producer=self.name, key_column=self.key_column, event_time_column=self.event_time_column,
            value_columns=self.value_columns, record_id=record_id,
            commit_id=F.concat(F.lit("file="), fname, F.lit("#row="), row),
            exclude=() if self.record_id_column is None else (self.record_id_column,))


def _given_arrow(given: Any, footer: Any | None) -> Any | None:
    """The Arrow schema the direct read expects under a given schema: the matching file's own types
    for the given columns (as Spark reads them), or with no file yet the given schema in Arrow; None
    when it has no Arrow form."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    if footer is not None:
        return pa.schema([footer.field(f.name) for f in given.fields])
    try:
        return to_arrow_schema(given)
    except Exception:  # a type Arrow has no form for: the JVM reads the batches
        return None
