"""The stream-table columns of a source's rows (:func:`to_stream_schema`, for a source of your own too)."""

from __future__ import annotations

from typing import Any, Sequence

from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.writepath.streams import STREAM_FORMAT_VERSION

from ..tasks.input import MALFORMED_CODEC, MAX_EVENT_MS, MIN_EVENT_MS, RAW_COLUMN
from .injector import DataFrame

__all__ = ["record_id_of", "to_stream_schema", "union_inputs"]


def to_stream_schema(df: DataFrame, *, producer: str, key_column: str | None, event_time_column: str,
                     value_columns: Sequence[str] | None, record_id: Any, commit_id: Any,
                     exclude: Sequence[str] = (), malformed: Any = None, raw: Any = None) -> DataFrame:
    """Map a DataFrame of source rows to the stream-table columns, in the JVM (docs/sources.md).

    ``key_column`` None (or a null key): key ``""``; ``value_columns`` None: every column but
    ``event_time_column`` and ``exclude``, empty: no value; ``record_id``: a non-null, unique Column;
    ``commit_id``: the source position; ``malformed``: the raw text of a record the source could not
    parse (else null), a dead letter "malformed" as is a record with a key, id or STRING value not
    valid UTF-8; ``raw``: the original text its dead letters keep. ConfigError: a named column does
    not exist, or the event time column's type is unsupported."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, LongType, StringType, TimestampNTZType, TimestampType

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
    text = F.to_json(F.struct(*[F.col(c) for c in sorted(value_columns)])) if value_columns else None
    value = F.lit(None).cast("binary") if text is None else text.cast("binary")
    codec = F.lit("json")
    rid = record_id.cast("string")
    # text that is not UTF-8 (Spark reads a file's strings unchecked) would fail the batch in Python
    named = {*value_columns, *([] if key_column is None else [key_column])}
    texts = [F.col(c) for c in sorted(named) if isinstance(fields[c], StringType)]
    invalid = None
    for t in [rid, *texts]:
        bad_text = ~F.coalesce(F.is_valid_utf8(t), F.lit(True))
        invalid = bad_text if invalid is None else invalid | bad_text
    assert invalid is not None
    seen = F.make_valid_utf8(text) if text is not None else F.lit("{}")
    malformed = F.when(invalid, seen) if malformed is None else F.coalesce(malformed, F.when(invalid, seen))
    rid = F.when(invalid, F.make_valid_utf8(rid)).otherwise(rid)
    if malformed is not None:  # the raw text, and no key or event time that could move a watermark
        bad = malformed.isNotNull()
        key, value = F.when(bad, F.lit("")).otherwise(key), F.when(bad, malformed.cast("binary")).otherwise(value)
        codec, ts_ms = F.when(bad, F.lit(MALFORMED_CODEC)).otherwise(codec), F.when(~bad, ts_ms)
    shown = F.when(ts_ms.between(MIN_EVENT_MS, MAX_EVENT_MS), ts_ms)  # outside: a dead letter, not an overflow
    return df.select(
        rid.alias("record_id"), key.alias("key"), value.alias("value"), codec.alias("codec"),
        ts_ms.alias("timestamp_ms"), F.timestamp_millis(shown).alias("event_time"), F.lit(producer).alias("producer"),
        commit_id.cast("string").alias("commit_id"), F.lit(STREAM_FORMAT_VERSION).cast("int").alias("format_version"),
        *([] if raw is None else [raw.cast("binary").alias(RAW_COLUMN)]))


def record_id_of(column: str, *, producer: str, columns: Sequence[str]) -> Any:
    """The record id from a source's ``record_id_column``, as a STRING column; null or empty stays null
    (a dead letter: a position-made id would differ on a retry). ConfigError: not among ``columns``."""
    from pyspark.sql import functions as F

    if column not in columns:
        raise ConfigError(f"{producer}: record_id_column {column!r} is not a column of the source "
                          f"(columns: {', '.join(sorted(columns))})")
    return F.nullif(F.col(column).cast("string"), F.lit(""))


def union_inputs(frames: Sequence[DataFrame]) -> DataFrame:
    """A computation's input frames as one, by column name (``raw_value`` null where missing)."""
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f, allowMissingColumns=True)
    return out
