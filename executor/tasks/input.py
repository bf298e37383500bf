"""Input preparation in the JVM, shared by both write paths' jobs (step 2 of a batch). Only the key UDF
is shipped to the workers: it captures plain values, never the session or clients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.rowtable.rows import MAX_KEY_BYTES

from ..computation import RECORD_KEY, Computation, key_or_reason

__all__ = ["prepare_input", "interval_of_key", "key_expression", "ahead_reason", "original_text",
           "original_texts", "positions_of", "with_original_text", "PREP_DDL", "DEFAULT_MAX_EVENT_AHEAD_MS", "MALFORMED_CODEC", "MALFORMED_REASON",
           "RAW_COLUMN", "MIN_EVENT_MS", "MAX_EVENT_MS", "range_reason", "FIELD_TYPES", "KafkaRead"]

#: The JSON schema's field types the direct Kafka read parses (Spark DDL names, as ``simpleString``)
FIELD_TYPES = ("string", "boolean", "int", "bigint", "double")


@dataclass(frozen=True, kw_only=True)
class KafkaRead:
    """What the tasks need to read and prepare a Kafka injector's records: plain values, pickled."""

    servers: str
    topic: str
    config: tuple[tuple[str, str], ...]  # further librdkafka settings (mapped from the injector's options)
    fields: tuple[tuple[str, str], ...]  # the JSON schema: (name, one of FIELD_TYPES)
    key_column: str | None  # None: the message key
    event_time_column: str | None  # None: the Kafka timestamp; else an int or bigint field
    value_columns: tuple[str, ...]  # sorted
    fail_on_data_loss: bool
    checkpoint: str | None = None  # the reading query's checkpoint (its offset log)


#: The prepared input's columns (:func:`prepare_input`) the tasks of either path get per record.
PREP_DDL = ("record_id STRING, key STRING, value BINARY, codec STRING, timestamp_ms BIGINT, stream STRING, "
            "position STRING, late BOOLEAN, _bad STRING")

_ERR = "\x00!"
DEFAULT_MAX_EVENT_AHEAD_MS = 86_400_000  # one day: records further ahead of the clock are dead letters
#: The codec of a record its source could not parse: its value is the raw input, a dead letter.
MALFORMED_CODEC = "malformed"
MALFORMED_REASON = "malformed input: the source could not parse it; raw_value holds the original text"
#: Event times (epoch ms) a TIMESTAMP and datetime can show; others are dead letters (no overflow in Spark).
MIN_EVENT_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
MAX_EVENT_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_RANGE = ("event time ", " ms is outside the years 1 to 9999 (epoch ms -62135596800000 to 253402300799999); "
          "fix the record's timestamp")
#: An input frame's optional BINARY column: a text source's original text, kept by dead letters.
RAW_COLUMN = "raw_value"


def interval_of_key(num_intervals: int, key: Any = None) -> Any:
    """The key interval of ``key`` as a Spark column (``zlib.crc32`` of the UTF-8 key, mod n)."""
    from pyspark.sql import functions as F

    k = F.col("key") if key is None else key
    return F.pmod(F.crc32(k.cast("binary")), F.lit(num_intervals)).cast("int")


def key_expression(comp: Computation) -> Any:
    """The key of a record of ``comp``'s input frame, as a Spark column (an error text for a bad one)."""
    from pyspark.sql import functions as F

    return _key_expression(comp, F.col("stream"))[0]


def _key_udf(extractor: Callable[[Any], Any]) -> Any:
    """A callable key extractor as a pandas UDF of (value, codec): the key, or an ``_ERR`` text."""
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    def extract(values: pd.Series, codecs: pd.Series) -> pd.Series:
        from .worker import freeze_spark_zips

        freeze_spark_zips()
        out = []
        for v, c in zip(values, codecs, strict=True):
            try:
                decoded = None if v is None else get_codec(c or "json").decode(v)
            except Exception as exc:
                out.append(f"{_ERR}key extractor failed: {type(exc).__name__}: {exc}")
                continue
            k, why = key_or_reason(extractor, decoded)  # the testing harness keys records by it too
            out.append(f"{_ERR}{why}" if k is None else k)
        return pd.Series(out, dtype=object)

    # pandas_udf reads its type hints: give it the classes, not postponed strings
    extract.__annotations__ = {"values": pd.Series, "codecs": pd.Series, "return": pd.Series}
    return pandas_udf(extract, "string")  # type: ignore[call-overload]


def prepare_input(df: Any, comp: Computation, wm: int | None, *,
                  cache: dict[Any, Any] | None = None, ahead: tuple[int, Mapping[str, int]] | None = None) -> Any:
    """Stream-schema input -> the prepared columns (:data:`PREP_DDL`); ``cache`` keeps built expressions."""
    from pyspark.sql import functions as F

    names = set(df.columns)
    flags = ("stream" in names, "commit_id" in names, RAW_COLUMN in names)
    parts = None if cache is None else cache.get(flags)
    if parts is None:
        parts = _prep_columns(comp, *flags[:2])
        if cache is not None:
            cache[flags] = parts
    udf_key, before, after = parts
    if udf_key is not None:  # a Python UDF must run once per record: materialise the key first
        df = df.withColumn("_k", udf_key)
    late = F.lit(False) if wm is None else F.coalesce(F.col("timestamp_ms") < F.lit(wm), F.lit(False))
    bad = after
    if ahead is not None and ahead[1]:
        now, bounds = ahead
        stream = F.col("stream") if flags[0] else F.lit(next(iter(comp.inputs)))
        ts = F.col("timestamp_ms")
        far = None
        for name, bound in sorted(bounds.items()):
            cond = (stream == name) & (ts > F.lit(now + bound))
            why = F.concat(F.lit(_AHEAD[0]), ts.cast("string"), F.lit(_AHEAD[1].format(bound=bound, now=now)))
            far = F.when(cond, why) if far is None else far.when(cond, why)
        assert far is not None
        bad = F.coalesce(after, far)
    if flags[2]:  # a dead letter's value is its original text, where the source kept it
        value = F.when(bad.isNotNull(), F.coalesce(F.col(RAW_COLUMN), F.col("value"))).otherwise(F.col("value"))
        before = [value.alias("value") if i == _VALUE else c for i, c in enumerate(before)]
    return df.select(*before, late.alias("late"), bad.alias("_bad"))


def original_text(df: Any | None) -> Any | None:
    """The micro-batch ``df`` when it carries :data:`RAW_COLUMN`, else None."""
    return df if df is not None and RAW_COLUMN in df.columns else None


def _by_id(df: Any, column: str, ids: Iterable[str]) -> dict[str, Any]:
    """Record id -> its ``column`` in ``df``, for ``ids`` (one small Spark job)."""
    from pyspark.sql import functions as F

    got = df.where(F.col("record_id").isin(sorted(set(ids)))).select("record_id", column).collect()
    return {r["record_id"]: r[column] for r in got}


def original_texts(raw: Any, ids: Iterable[str]) -> dict[str, bytes]:
    """Record id -> its original text in ``raw``, for ``ids``."""
    return {k: bytes(v) for k, v in _by_id(raw, RAW_COLUMN, ids).items() if v is not None}


def positions_of(prep: Any, ids: Iterable[str]) -> dict[str, Any]:
    """Record id -> its source position in ``prep``, for ``ids``."""
    return _by_id(prep, "position", ids)


def with_original_text(dead: Any, raw: Any) -> Any:
    """The tasks' dead letters with ``raw_value`` set to their record's original text in ``raw``."""
    from pyspark.sql import functions as F

    text = raw.select("record_id", F.col(RAW_COLUMN).alias("_raw")).where(F.col("_raw").isNotNull())
    cols = [F.coalesce(F.col("_raw"), F.col("raw_value")).alias("raw_value") if c == "raw_value" else F.col(c)
            for c in dead.columns]
    return dead.join(text.dropDuplicates(["record_id"]), "record_id", "left").select(*cols)


_AHEAD = ("event time ", " ms is more than {bound} ms ahead of the processing clock ({now} ms): refused so that it "
          "cannot move the watermark past every open window; fix the record's timestamp or raise the injector's "
          "max_event_ahead_ms")


def range_reason(ts_ms: int) -> str:
    """The dead-letter reason of an event time outside :data:`MIN_EVENT_MS` .. :data:`MAX_EVENT_MS`."""
    return f"{_RANGE[0]}{ts_ms}{_RANGE[1]}"


def ahead_reason(ts_ms: int, bound_ms: int, now_ms: int) -> str:
    """The dead-letter reason of an event time more than ``bound_ms`` ahead of ``now_ms``."""
    return f"{_AHEAD[0]}{ts_ms}{_AHEAD[1].format(bound=bound_ms, now=now_ms)}"


def _key_expression(comp: Computation, stream: Any) -> tuple[Any, bool]:
    """(the key of a record of ``comp``'s input as a column, whether a Python UDF computes it)."""
    from pyspark.sql import functions as F

    key = None
    udf_key = False
    for name, ex in comp.inputs.items():
        if ex == RECORD_KEY:
            e = F.col("key")
        elif isinstance(ex, str):
            e = F.coalesce(F.get_json_object(F.col("value").cast("string"), f"$.{ex}"),
                           F.lit(f"{_ERR}no field {ex!r} in the value"))
        else:
            e = _key_udf(ex)(F.col("value"), F.col("codec"))
            udf_key = True
        cond = stream == name
        key = F.when(cond, e) if key is None else key.when(cond, e)
    assert key is not None
    key = key.otherwise(F.lit(f"{_ERR}record of an undeclared input stream"))
    return key, udf_key


_VALUE = 2  # the value's place among the prepared columns


def _prep_columns(comp: Computation, has_stream: bool, has_commit_id: bool) -> tuple[Any, ...]:
    from pyspark.sql import functions as F

    if not has_stream and len(comp.inputs) != 1:
        raise ConfigError(f"{comp.name} has several inputs, so its batch needs a 'stream' column")
    stream = F.col("stream") if has_stream else F.lit(next(iter(comp.inputs)))
    key, udf_key = _key_expression(comp, stream)
    k = F.col("_k") if udf_key else key
    bad = (F.when(F.col("codec") == MALFORMED_CODEC, F.lit(MALFORMED_REASON))  # a source could not parse it
           .when(k.isNull(), F.lit("record without key"))  # a null key column (frames a user embeds)
           .when(k.startswith(_ERR), F.substring(k, 3, 1000))
           .when(k == "", F.lit("key extractor returned an empty key"))
           .when(k.startswith("\x00"), F.lit("keys starting with NUL are reserved"))
           .when(F.octet_length(k) > MAX_KEY_BYTES, F.lit(f"key longer than {MAX_KEY_BYTES} bytes"))
           .when(F.col("record_id").isNull() | (F.col("record_id") == ""), F.lit("record without record_id"))
           .when(F.col("timestamp_ms").isNull(), F.lit("record without timestamp"))
           .when(~F.col("timestamp_ms").between(MIN_EVENT_MS, MAX_EVENT_MS),
                 F.concat(F.lit(_RANGE[0]), F.col("timestamp_ms").cast("string"), F.lit(_RANGE[1]))))
    pos = F.col("commit_id") if has_commit_id else F.lit(None).cast("string")
    before = [F.col("record_id"), k.alias("key"), F.col("value"),  # at _VALUE
              F.coalesce("codec", F.lit("json")).alias("codec"),
              F.col("timestamp_ms"), stream.alias("stream"), pos.alias("position")]
    return (key if udf_key else None), before, bad
