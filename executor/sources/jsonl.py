"""JSON input: a folder of JSON Lines files, and the JSON parse that Kafka messages share. A line that
does not parse, or is not UTF-8, is a dead letter holding it (``raw_value``); blank lines are skipped."""

from __future__ import annotations

from typing import Any, Sequence

from deltawheel.statestore.exceptions import ConfigError

from ..tasks.input import DEFAULT_MAX_EVENT_AHEAD_MS
from .folders import local_folder_token, make_local_dir
from .injector import DataFrame, SparkSession, _MaxSeenInjector
from .schema import record_id_of, to_stream_schema

__all__ = ["CORRUPT_RECORD", "JsonLinesInjector", "json_schema", "parse_json"]

#: Spark's name of the column holding a record that did not parse (``columnNameOfCorruptRecord``).
CORRUPT_RECORD = "_corrupt_record"


def json_schema(schema: Any) -> Any:
    """A StructType from a DDL string or a StructType, without Spark's ``_corrupt_record`` column;
    ConfigError: the DDL does not parse, or it is not a struct of columns."""
    from pyspark.sql.types import DataType, StructType

    if isinstance(schema, str):
        try:
            parsed = DataType.fromDDL(schema)
        except Exception as exc:
            raise ConfigError(f"schema {schema!r} is not a Spark DDL column list ({str(exc).splitlines()[0]}); "
                              "write it as 'name TYPE, name TYPE', e.g. 'card STRING, amount DOUBLE, ts BIGINT'") from exc
        schema = parsed
    if not isinstance(schema, StructType):
        raise ConfigError(f"schema must be a DDL string or a StructType, got {type(schema).__name__}")
    return StructType([f for f in schema.fields if f.name != CORRUPT_RECORD])


def parse_json(text: Any, schema: Any) -> Any:
    """``text`` parsed with ``schema`` in PERMISSIVE mode, plus ``_corrupt_record`` where it did not parse."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    full = StructType([*json_schema(schema).fields, StructField(CORRUPT_RECORD, StringType(), True)])
    return F.from_json(text, full, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_RECORD})


def event_time_of(parsed: DataFrame, column: str, timestamp_format: str | None) -> DataFrame:
    """Turn a STRING event time column into a TIMESTAMP (None format: ISO 8601); unparsable: null."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    fields = {f.name: f.dataType for f in parsed.schema.fields}
    if isinstance(fields.get(column), StringType):
        ts = F.try_to_timestamp(F.col(column)) if timestamp_format is None else F.try_to_timestamp(
            F.col(column), F.lit(timestamp_format))
        return parsed.withColumn(column, ts)
    return parsed


class JsonLinesInjector(_MaxSeenInjector):
    """A folder of JSON Lines files read with Spark's file streaming source, each file whole (it must
    fit in one task's memory). ``record_id``: ``record_id_column``, else ``{name}/{file name}#{line}``
    (1-based); ``commit_id``: ``file={file name}#line={line}``. ``schema`` None: inferred at
    :meth:`stream_df`; ``timestamp_format``: the Spark pattern of a STRING event time (None: ISO 8601).
    Other arguments and the errors: as for ``ParquetInjector``."""

    def __init__(self, name: str, folder: str, *, schema: Any = None, key_column: str | None,
                 event_time_column: str, value_columns: Sequence[str] | None = None,
                 record_id_column: str | None = None, max_files_per_trigger: int | None = None,
                 watermark_delay_ms: int, max_event_ahead_ms: int | None = DEFAULT_MAX_EVENT_AHEAD_MS,
                 timestamp_format: str | None = None, max_bytes_per_trigger: int | None = None) -> None:
        super().__init__(name, key_column=key_column, event_time_column=event_time_column,
                         value_columns=value_columns, record_id_column=record_id_column,
                         max_files_per_trigger=max_files_per_trigger, watermark_delay_ms=watermark_delay_ms,
                         max_event_ahead_ms=max_event_ahead_ms, max_bytes_per_trigger=max_bytes_per_trigger)
        self.folder = folder  # a local folder that does not exist yet is made at stream_df
        self.schema = schema  # parsed by resolved_schema (a DDL string needs a running Spark session)
        self.timestamp_format = timestamp_format

    def input_token(self) -> tuple[tuple[str, int, int], ...] | None:
        """The folder's visible files with sizes and mtimes (None for a remote folder)."""
        return local_folder_token(self.folder)

    def resolved_schema(self, spark: SparkSession) -> Any:
        """``schema``, or Spark's inference over the files present (without ``_corrupt_record``);
        ConfigError: a schema that does not parse, or none given and none to infer."""
        if self.schema is not None:
            return json_schema(self.schema)
        from pyspark.errors import AnalysisException

        try:
            inferred = spark.read.option("mode", "PERMISSIVE").json(self.folder).schema
        except AnalysisException as exc:
            raise ConfigError(f"injector {self.name}: cannot infer a JSON schema from {self.folder} "
                              f"({str(exc).splitlines()[0]}); put a file there or give schema=") from exc
        schema = json_schema(inferred)
        if not schema.fields:
            raise ConfigError(f"injector {self.name}: no JSON object line in {self.folder} to infer a schema "
                              "from; give schema=")
        return schema

    def stream_df(self, spark: SparkSession) -> DataFrame:
        """The folder as a streaming DataFrame in the stream schema; ConfigError: no schema to use, or a
        named column is missing."""
        from pyspark.sql import functions as F

        make_local_dir(self.folder)
        schema = self.resolved_schema(spark)
        files = (spark.readStream.options(**self.read_limits)
                 .text(self.folder, wholetext=True).select(F.col("_metadata.file_name").alias("_file"), "value"))
        # split as ISO-8859-1 (a char per byte), so each line keeps its bytes even where they are not UTF-8
        bytewise = F.decode(F.col("value").cast("binary"), "ISO-8859-1")
        lines = files.select("_file", F.posexplode(F.split(bytewise, r"\r?\n")).alias("_pos", "_bytes"))
        lines = lines.select("_file", "_pos", F.encode("_bytes", "ISO-8859-1").cast("string").alias("_line"))
        lines = lines.where(F.trim(F.col("_line")) != "").select(
            "_file", (F.col("_pos") + 1).alias("_lineno"), "_line", parse_json(F.col("_line"), schema).alias("_j"))
        # a line that is not UTF-8 is malformed: Jackson would read it with U+FFFD in place of its bytes
        corrupt = F.when(~F.is_valid_utf8("_line"), F.col("_line")).otherwise(F.col(f"_j.{CORRUPT_RECORD}"))
        parsed = lines.select("_file", "_lineno", "_line", *[F.col(f"_j.{f.name}").alias(f.name) for f in schema.fields],
                              corrupt.alias(CORRUPT_RECORD))
        parsed = event_time_of(parsed, self.event_time_column, self.timestamp_format)
        lineno = F.col("_lineno").cast("string")
        position = F.concat(F.lit(f"{self.name}/"), F.col("_file"), F.lit("#"), lineno)
        record_id, exclude = position, ["_file", "_lineno", "_line", CORRUPT_RECORD]
        if self.record_id_column is not None:
            # none: a dead letter, not a position; a malformed line (a dead letter anyway) keeps its position
            record_id = F.when(F.col(CORRUPT_RECORD).isNotNull(), position).otherwise(
                record_id_of(self.record_id_column, producer=self.name, columns=schema.fieldNames()))
            exclude.append(self.record_id_column)
        return to_stream_schema(
            parsed, producer=self.name, key_column=self.key_column, event_time_column=self.event_time_column,
            value_columns=self.value_columns, record_id=record_id,
            commit_id=F.concat(F.lit("file="), F.col("_file"), F.lit("#line="), lineno), exclude=exclude,
            malformed=F.col(CORRUPT_RECORD), raw=F.col("_line"))
