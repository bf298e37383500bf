"""Injectors: the sources of a pipeline, and how each estimates its low watermark.

An injector exposes its input as a *streaming DataFrame in the stream-table
schema* (:func:`deltawheel.statestore.writepath.streams.stream_schema_ddl`): ``value`` is
a JSON object of the source's columns (codec ``json``), ``record_id`` is unique
and the same on every re-run, ``timestamp_ms``/``event_time`` carry the event
time, ``producer`` the injector's name and ``commit_id`` the source position
(e.g. ``file=part-00003.parquet#row=17``; dead letters quote it).

The executor drives the watermark at the end of every micro-batch::

    injector.observe(BatchStats.of(batch_df))   # or BatchStats(count, min_ms, max_ms)
    publish_watermark(authority, injector, sequencer=seq)
    ...
    injector.finish()                            # an availableNow query ended: input exhausted
    publish_watermark(authority, injector, sequencer=seq)

Estimates (records an injector emits behind its published watermark are
late; the authority keeps published values monotonic anyway):

* :class:`ParquetInjector`, :class:`DeltaTableInjector`: *max event time seen
  minus a declared bound* (``watermark_delay_ms``), like Spark's
  ``withWatermark``; :data:`END_OF_TIME` after :meth:`finish`.
* :class:`GeneratorInjector`: the same with the generator's exact disorder
  bound (``max_disorder_ms``); :data:`END_OF_TIME` once the batch holding its
  last file was observed (or after :meth:`finish`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from deltawheel.statestore.delta.log import latest_local_version, local_path
from deltawheel.statestore.delta.storefs import TableFiles, table_files
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import validate_name
from deltawheel.statestore.writepath.streams import STREAM_FORMAT_VERSION
from deltawheel.statestore.zk.watermarks import END_OF_TIME, WatermarkAuthority

from ..tasks.image.direct import DirectSource, direct_source
from ..tasks.input import DEFAULT_MAX_EVENT_AHEAD_MS, MALFORMED_CODEC, RAW_COLUMN
from .estimates import PendingPercentile, check_percentile

__all__ = ["BatchStats", "Injector", "MaxSeenMinusBound", "ParquetInjector", "DeltaTableInjector",
           "publish_watermark", "to_stream_schema", "union_inputs", "DEFAULT_MAX_EVENT_AHEAD_MS"]

DataFrame = Any  # pyspark.sql.DataFrame; pyspark is imported lazily (driver-side only)
SparkSession = Any


@dataclass(frozen=True)
class BatchStats:
    """What an injector needs to know about one consumed micro-batch.

    Attributes:
        count: rows in the batch.
        min_event_ms: smallest ``timestamp_ms`` (``None``: empty or all null).
        max_event_ms: largest ``timestamp_ms``.
        sources: the files the rows came from (from ``commit_id``; may be empty).
        partitions: (source partition, its max event time) for sources with partitions
            (Kafka's ``topic/partition``; ``sources_kafka.partition_stats``); may be empty.
    """

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
    """Watermark estimate *max event time seen minus a bound* (Spark's ``withWatermark``).

    ``None`` until a batch with an event time was observed; never moves
    backwards (the max only grows); :data:`END_OF_TIME` after :meth:`finish`.

    >>> w = MaxSeenMinusBound(10_000)
    >>> w.observe(BatchStats(2, 50_000, 60_000)); w.observe(BatchStats(1, 20_000, 20_000))
    >>> w.watermark_ms()
    50000

    Args:
        delay_ms: the declared bound on disorder (>= 0).

    Raises:
        ConfigError: a negative bound.
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
    (None: unknown). The pipeline runner skips a later round's query of a computation whose every
    input still has the token it had when its last query started (nothing new to read).
    """

    name: str

    def stream_df(self, spark: SparkSession) -> DataFrame:
        """The input as a streaming DataFrame with exactly the stream-table columns (a text source's
        with ``raw_value`` after them: :func:`to_stream_schema`'s ``raw``)."""
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
    """Publish ``injector``'s current estimate under its name; with ``instance`` (job instances
    sharing intervals), as that instance's estimate: the injector's watermark is then the minimum
    over the live instances' (:meth:`.WatermarkAuthority.publish_instance_injector`).

    Returns:
        The stored watermark (never below an earlier one), or ``None`` when the
        injector has no estimate yet (nothing is published then) or, with ``instance``, while
        a live instance has none.

    Raises:
        StaleSequencerError: another instance published with a newer sequencer.
        LeaseSuspendedError: the ZooKeeper connection is suspended; retry later.
    """
    watermark = injector.watermark_ms()
    if watermark is None:
        return None
    if instance is not None:
        return authority.publish_instance_injector(injector.name, instance, watermark, sequencer=sequencer,
                                                   held=held)
    return int(authority.publish_injector(injector.name, watermark, sequencer=sequencer))


def to_stream_schema(df: DataFrame, *, producer: str, key_column: str | None, event_time_column: str,
                     value_columns: Sequence[str] | None, record_id: Any, commit_id: Any,
                     exclude: Sequence[str] = (), malformed: Any = None, raw: Any = None) -> DataFrame:
    """Map a DataFrame of source rows to the stream-table columns, in the JVM.

    Args:
        df: source rows (batch or streaming).
        producer: the injector name (``producer`` column).
        key_column: the natural key, cast to string (null keys become ``""``);
            ``None``: ``key`` is ``""`` and the consumer's key extractor derives it.
        event_time_column: a TIMESTAMP column, or a BIGINT/INT of epoch milliseconds.
        value_columns: columns of the JSON ``value`` object; ``None``: every column
            except ``event_time_column`` and ``exclude``. Keys come out sorted, as
            with the ``json`` codec. Empty: no value (``record.value`` is None), for
            computations that only read the key and the event time.
        record_id: Spark Column giving the record id (must be non-null and unique).
        commit_id: Spark Column giving the source position.
        exclude: columns left out of the default ``value_columns``.
        malformed: a STRING column, the raw text of a record the source could not parse
            (null for the others; e.g. Spark's ``_corrupt_record``). Such a record keeps that
            text as its ``value`` with codec ``malformed``, an empty key and no event time: the
            executor makes it a dead letter saying "malformed", its ``raw_value`` the original text.
        raw: a STRING or BINARY column, the record's original text (a text source's line or
            message). Given, the frame has one more column after the stream-table ones,
            ``raw_value`` (BINARY): every dead letter of the record (no usable key or timestamp,
            too far ahead, refused by user code, ...) keeps it as its ``raw_value``, where it
            would otherwise hold ``value`` (the re-encoded columns). Nothing else reads it.

    Raises:
        ConfigError: a named column does not exist, or the event time column has
            an unsupported type.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, LongType, TimestampNTZType, TimestampType

    fields = {f.name: f.dataType for f in df.schema.fields}
    wanted = [("key_column", key_column), ("event_time_column", event_time_column)]
    wanted += [("value_columns", c) for c in value_columns or ()]
    for what, col in wanted:
        if col is not None and col not in fields:
            raise ConfigError(f"{producer}: {what} {col!r} is not a column of the source "
                              f"(columns: {', '.join(sorted(fields))}); fix the injector's configuration")
    etype = fields[event_time_column]
    if isinstance(etype, (TimestampType, TimestampNTZType)):
        ts_ms = F.unix_millis(F.col(event_time_column).cast("timestamp"))
    elif isinstance(etype, (LongType, IntegerType)):
        ts_ms = F.col(event_time_column).cast("bigint")
    else:
        raise ConfigError(f"{producer}: event_time_column {event_time_column!r} has type {etype.simpleString()}; "
                          "use a TIMESTAMP or a BIGINT of epoch milliseconds")
    if value_columns is None:
        value_columns = [c for c in fields if c != event_time_column and c not in exclude]
    key = F.lit("") if key_column is None else F.coalesce(F.col(key_column).cast("string"), F.lit(""))
    # no value columns (the key and event time are all a computation reads): record.value is None
    value = (F.to_json(F.struct(*[F.col(c) for c in sorted(value_columns)])).cast("binary") if value_columns
             else F.lit(None).cast("binary"))
    codec = F.lit("json")
    if malformed is not None:  # the raw text, and no key or event time that could move a watermark
        bad = malformed.isNotNull()
        key, value = F.when(bad, F.lit("")).otherwise(key), F.when(bad, malformed.cast("binary")).otherwise(value)
        codec, ts_ms = F.when(bad, F.lit(MALFORMED_CODEC)).otherwise(codec), F.when(~bad, ts_ms)
    return df.select(
        record_id.cast("string").alias("record_id"),
        key.alias("key"),
        value.alias("value"),
        codec.alias("codec"),
        ts_ms.alias("timestamp_ms"),
        F.timestamp_millis(ts_ms).alias("event_time"),
        F.lit(producer).alias("producer"),
        commit_id.cast("string").alias("commit_id"),
        F.lit(STREAM_FORMAT_VERSION).cast("int").alias("format_version"),
        *([] if raw is None else [raw.cast("binary").alias(RAW_COLUMN)]),
    )


def union_inputs(frames: Sequence[DataFrame]) -> DataFrame:
    """A computation's input frames (each with its ``stream`` column) as one: by column name, an
    injector's ``raw_value`` (its records' original text, :func:`to_stream_schema`) null in the
    frames without it (stream tables, binary sources)."""
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f, allowMissingColumns=True)
    return out


def _check_common(name: str, max_files_per_trigger: int) -> None:
    validate_name("injector", name)
    if max_files_per_trigger < 1:
        raise ConfigError(f"injector {name}: max_files_per_trigger must be >= 1, got {max_files_per_trigger}")


def local_folder_token(folder: str) -> tuple[tuple[str, int, int], ...] | None:
    """(name, size, mtime in ns) of the files Spark's file source would read from a local folder
    (names starting with ``_`` or ``.`` are skipped); None for a remote folder or an unreadable one."""
    local = local_path(folder)
    if local is None:
        return None
    try:
        with os.scandir(local) as it:
            entries = [(e.name, e.stat()) for e in it if not e.name.startswith(("_", ".")) and e.is_file()]
    except OSError:
        return None
    return tuple(sorted((n, st.st_size, st.st_mtime_ns) for n, st in entries))


def _missing_local_dir(path: str) -> bool:
    """True for a local path (or ``file://`` URI) that is not a folder; URIs are not checked."""
    local = local_path(path)
    return local is not None and not os.path.isdir(local)


def _local_parquet_schema(folder: str) -> Any | None:
    """The Spark schema of a local Parquet folder read from its first visible file's footer with
    pyarrow (Spark's inference starts a job, ~0.1 s); ``None`` -- Spark must infer it -- for a
    remote folder, no readable file, or a column whose Spark type could differ from the plain
    Arrow mapping (timestamps without UTC adjustment or in nanoseconds, unsigned or nested types)."""
    return _spark_schema(_first_footer(folder))


def _first_footer(folder: str, files: TableFiles | None = None) -> Any | None:
    """The Arrow schema of a folder's first visible Parquet file (None: none, unreadable, or a remote
    folder not given as ``files``, the folder as Python reaches it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if files is not None and not files.is_local:
        try:
            names = sorted(n for n, _size, _mtime in files.list_files() or () if not n.startswith(("_", ".")))
            return files.read_schema(names[0]) if names else None
        except (OSError, pa.ArrowException):
            return None
    local, found = local_path(folder), local_folder_token(folder)
    if local is None or not found:
        return None
    try:
        return pq.read_schema(os.path.join(local, found[0][0]))
    except (OSError, pa.ArrowException):
        return None


def _spark_schema(arrow: Any | None) -> Any | None:
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StructField, StructType

    if arrow is None:
        return None
    t = pa.types
    fields = []
    for f in arrow:
        ty = f.type
        simple = (t.is_string(ty) or t.is_binary(ty) or t.is_boolean(ty) or t.is_signed_integer(ty)
                  or t.is_float32(ty) or t.is_float64(ty) or t.is_date32(ty) or t.is_decimal128(ty)
                  or (t.is_timestamp(ty) and ty.tz is not None and ty.unit in ("ms", "us")))
        if not simple:
            return None
        fields.append(StructField(f.name, from_arrow_type(ty), True))  # file sources read every column as nullable
    return StructType(fields)


class _MaxSeenInjector:
    """What the table injectors share: their column settings (checked by :func:`to_stream_schema`
    when the stream is built) and the watermark, :class:`MaxSeenMinusBound` with ``watermark_delay_ms``."""

    def __init__(self, name: str, *, key_column: str | None, event_time_column: str,
                 value_columns: Sequence[str] | None, record_id_column: str | None, max_files_per_trigger: int,
                 watermark_delay_ms: int, max_event_ahead_ms: int | None = DEFAULT_MAX_EVENT_AHEAD_MS) -> None:
        _check_common(name, max_files_per_trigger)
        if max_event_ahead_ms is not None and max_event_ahead_ms < 0:
            raise ConfigError(f"injector {name}: max_event_ahead_ms must be >= 0 (or None: no bound), "
                              f"got {max_event_ahead_ms}")
        self.max_event_ahead_ms = max_event_ahead_ms
        self.name = name
        self.key_column = key_column
        self.event_time_column = event_time_column
        self.value_columns = None if value_columns is None else tuple(value_columns)
        self.record_id_column = record_id_column
        self.max_files_per_trigger = max_files_per_trigger
        self._estimate: MaxSeenMinusBound | PendingPercentile = MaxSeenMinusBound(watermark_delay_ms)

    def observe(self, stats: BatchStats) -> None:
        """Advance the estimate with a consumed batch."""
        self._estimate.observe(stats)

    def finish(self) -> None:
        """All input available was consumed: the watermark becomes :data:`END_OF_TIME`."""
        self._estimate.finish()

    def watermark_ms(self) -> int | None:
        """Max event time seen minus ``watermark_delay_ms``; ``None`` before the first batch."""
        return self._estimate.watermark_ms()


class ParquetInjector(_MaxSeenInjector):
    """A folder of Parquet files read with Spark's file streaming source.

    Files are consumed in modification-time order, ``max_files_per_trigger``
    per micro-batch; the schema is taken from the files present when
    :meth:`stream_df` is called (in a local or ``s3a://`` folder whose columns have plain
    types, from the first visible file's footer, read with pyarrow; otherwise
    by Spark's inference). Files whose name starts with ``_`` or ``.``
    are ignored (Spark's rule), so writers can stage files under such names.

    ``record_id`` is ``record_id_column`` when given (a null falls back to the
    position), otherwise ``{name}/{file name}#{row index}``: deterministic as
    long as files are never rewritten. ``commit_id`` is
    ``file={file name}#row={row index}``.

    Watermark estimate: :class:`MaxSeenMinusBound` with ``watermark_delay_ms``,
    i.e. the max event time seen minus the declared disorder bound; records
    more than that behind the newest seen are late. :meth:`finish` (all files
    present were consumed) makes it :data:`END_OF_TIME`; files added after
    that are entirely late.

    Args:
        name: injector name (``producer`` column, watermark znode).
        folder: the Parquet folder (local path or URI).
        key_column: natural key column, or ``None`` (key ``""``).
        event_time_column: TIMESTAMP or epoch-ms BIGINT column.
        value_columns: columns of the JSON value; ``None``: all but the event
            time and record id columns; empty: no value (``record.value`` is None).
        record_id_column: unique id column, or ``None`` (position-based ids).
        max_files_per_trigger: files per micro-batch (default 1).
        watermark_delay_ms: the declared disorder bound: the watermark is the newest event time seen
            minus it. A record is late when behind the watermark the previous micro-batch acted on,
            i.e. the newest event time of the batches up to two before its own minus this bound: two
            files behind with one file per batch (docs/sources.md, "Watermark options").
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

    Raises:
        ConfigError: an invalid name, a local folder that does not exist, a
            bad count, delay, bound or percentile.
    """

    def __init__(self, name: str, folder: str, *, key_column: str | None, event_time_column: str,
                 value_columns: Sequence[str] | None = None, record_id_column: str | None = None,
                 max_files_per_trigger: int = 1, watermark_delay_ms: int,
                 max_event_ahead_ms: int | None = DEFAULT_MAX_EVENT_AHEAD_MS,
                 watermark_percentile: float | None = None) -> None:
        super().__init__(name, key_column=key_column, event_time_column=event_time_column,
                         value_columns=value_columns, record_id_column=record_id_column,
                         max_files_per_trigger=max_files_per_trigger, watermark_delay_ms=watermark_delay_ms,
                         max_event_ahead_ms=max_event_ahead_ms)
        if _missing_local_dir(folder):
            raise ConfigError(f"injector {name}: Parquet folder {folder} does not exist; create it "
                              "(or generate the input) before starting the pipeline")
        self.folder = folder
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
            ConfigError: no readable Parquet file in the folder, or a named
                column missing (see :func:`to_stream_schema`).
        """
        from pyspark.errors import AnalysisException

        files = table_files(spark, self.folder)
        if self.watermark_percentile is not None and not isinstance(self._estimate, PendingPercentile):
            if files is None:
                raise ConfigError(f"injector {self.name}: watermark_percentile reads the pending files' event "
                                  f"times, which needs a folder Python reaches (local or s3a://); {self.folder} "
                                  "is not one")
            self._estimate = PendingPercentile(files, self.event_time_column, self.watermark_percentile,
                                               floor=self._estimate)
        footer = _first_footer(self.folder, files)
        local_schema = _spark_schema(footer)
        self._direct = None if local_schema is None or files is None else direct_source(
            self.name, footer, key_column=self.key_column, event_time_column=self.event_time_column,
            record_id_column=self.record_id_column, value_columns=self.value_columns, s3=files.s3)
        try:
            schema = local_schema or spark.read.parquet(self.folder).schema
        except AnalysisException as exc:
            raise ConfigError(f"injector {self.name}: cannot read a Parquet schema from {self.folder} "
                              f"({str(exc).splitlines()[0]}); put at least one Parquet file there") from exc
        raw = (spark.readStream.schema(schema).option("maxFilesPerTrigger", self.max_files_per_trigger)
               .parquet(self.folder))
        return self._in_stream_schema(raw, schema)

    def files_df(self, spark: SparkSession, names: Sequence[str]) -> DataFrame:
        """The records of some of the folder's files (by file name), as a batch DataFrame in the
        stream schema with the same record ids as :meth:`stream_df` gives them: a new owner of a
        moved interval catches up with it (``executor/protocol/rescale.py``)."""
        footer = _first_footer(self.folder)
        schema = _spark_schema(footer) or spark.read.parquet(self.folder).schema
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
            record_id = F.coalesce(F.col(self.record_id_column).cast("string"), position)
        else:
            record_id = position
        return to_stream_schema(
            raw, producer=self.name, key_column=self.key_column, event_time_column=self.event_time_column,
            value_columns=self.value_columns, record_id=record_id,
            commit_id=F.concat(F.lit("file="), fname, F.lit("#row="), row),
            exclude=() if self.record_id_column is None else (self.record_id_column,))



class DeltaTableInjector(_MaxSeenInjector):
    """A Delta table read with Delta's streaming source (``maxFilesPerTrigger``).

    Delta's streaming source exposes neither file names nor row positions, so
    a ``record_id_column`` is required, and ``commit_id`` is
    ``delta={record id}`` (the id locates the row in the table).

    Watermark estimate: as :class:`ParquetInjector` (max event time seen minus
    ``watermark_delay_ms``; :data:`END_OF_TIME` after :meth:`finish`).

    Args:
        name: injector name.
        path: the Delta table's path.
        key_column: natural key column, or ``None``.
        event_time_column: TIMESTAMP or epoch-ms BIGINT column.
        value_columns: columns of the JSON value; ``None``: all but event time and record id;
            empty: no value (``record.value`` is None).
        record_id_column: the unique, stable id column.
        max_files_per_trigger: data files per micro-batch (default 1).
        watermark_delay_ms: the declared disorder bound: the watermark is the newest event time seen
            minus it. A record is late when behind the watermark the previous micro-batch acted on,
            i.e. the newest event time of the batches up to two before its own minus this bound: two
            files behind with one file per batch (docs/sources.md, "Watermark options").
        max_event_ahead_ms: as for :class:`ParquetInjector` (default one day; None: no bound).

    Raises:
        ConfigError: an invalid name, a bad count, delay or bound, or no ``record_id_column``.
    """

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
        """The table as a streaming DataFrame in the stream schema.

        Raises:
            ConfigError: ``path`` is not a Delta table, or a named column is missing.
        """
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as F

        try:
            raw = (spark.readStream.format("delta").option("maxFilesPerTrigger", self.max_files_per_trigger)
                   .load(self.path))
            columns = raw.schema.fieldNames()
        except AnalysisException as exc:
            raise ConfigError(f"injector {self.name}: {self.path} is not a readable Delta table "
                              f"({str(exc).splitlines()[0]}); create it first") from exc
        if self.record_id_column not in columns:
            raise ConfigError(f"{self.name}: record_id_column {self.record_id_column!r} is not a column "
                              f"of the source (columns: {', '.join(sorted(columns))})")
        rid = F.col(self.record_id_column).cast("string")
        return to_stream_schema(
            raw, producer=self.name, key_column=self.key_column, event_time_column=self.event_time_column,
            value_columns=self.value_columns, record_id=rid, commit_id=F.concat(F.lit("delta="), rid),
            exclude=(self.record_id_column,))
