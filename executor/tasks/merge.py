"""The Spark side of a batch: JVM input preparation and user code in Spark tasks.

Everything here is driven from ``batch.py``. The closures built here are
shipped to Python workers (cloudpickle), so they capture only plain values
(the computation instance, watermark, clock readings, sequencers) — never the
session, the store or ZooKeeper clients: user code depends on no
driver-local state and runs the same on a cluster.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator, Mapping, Sequence

from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import CodecError, ConfigError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import FENCE_KEY, MAX_KEY_BYTES, KeyRow, rows_schema_ddl
from deltawheel.statestore.writepath.merge import MergeBatch, MergePath

from ..computation import RECORD_KEY, Computation, LatePolicy, Record, key_or_reason
from ..runtime.faults import BatchFailedError
from .job import BatchRun, Prepared
from .keyrun import run_key

__all__ = ["prepare_input", "run_in_tasks", "MergeTasks", "productions_frame", "dead_letter_frame",
           "routed_frame", "user_error_message", "interval_of_key", "key_expression", "ahead_reason", "DEFAULT_MAX_EVENT_AHEAD_MS",
           "MALFORMED_CODEC", "MALFORMED_REASON", "RAW_COLUMN", "original_text", "with_original_text"]

_PROD = "STRUCT<production_id: STRING, stream: STRING, key: STRING, value: BINARY, timestamp_ms: BIGINT, codec: STRING>"
_DEAD = ("STRUCT<record_id: STRING, key: STRING, raw_value: BINARY, error: STRING, position: STRING, "
         "event_time_ms: BIGINT, stream: STRING>")
_ROUTED = "STRUCT<record_id: STRING, key: STRING, value: BINARY, codec: STRING, timestamp_ms: BIGINT, stream: STRING>"
OUT_DDL = (rows_schema_ddl().replace(" NOT NULL", "") + f", _op STRING, new_prods ARRAY<{_PROD}>, dead ARRAY<{_DEAD}>, "
           f"routed ARRAY<{_ROUTED}>, processed INT, duplicates INT, fired INT, late INT, n_prods INT, n_dead INT, "
           "n_routed INT, ids_expired INT")
_ERR = "\x00!"
DEFAULT_MAX_EVENT_AHEAD_MS = 86_400_000  # one day: records further ahead of the clock are dead letters
#: The codec of a record its source could not parse (``sources_json.py``, ``sources_kafka.py``): its
#: value is the raw input (a JSON line, a Kafka message's value) and it becomes a dead letter.
MALFORMED_CODEC = "malformed"
MALFORMED_REASON = "malformed input: the source could not parse it; raw_value holds the original text"
#: An input frame's optional column (BINARY) beside the stream-table columns: the record's original
#: text from a text source (a JSON line, a Kafka message's value; ``sources.to_stream_schema``'s
#: ``raw``). Every dead letter of the record keeps it as its ``raw_value``; nothing else reads it.
RAW_COLUMN = "raw_value"


def interval_of_key(num_intervals: int, key: Any = None) -> Any:
    """The key interval of the ``key`` column (or of the column ``key``), as a Spark column (null
    for a null key): the one key -> interval mapping of every write path (``zlib.crc32`` of the
    UTF-8 key, mod n)."""
    from pyspark.sql import functions as F

    k = F.col("key") if key is None else key
    return F.pmod(F.crc32(k.cast("binary")), F.lit(num_intervals)).cast("int")


def key_expression(comp: Computation) -> Any:
    """The key the executor gives a record of ``comp``'s input frame (a ``stream`` column naming
    the input), as a Spark column: its key extractor per input, as step 2 prepares it (a bad
    record's key is an error text there; it becomes a dead letter)."""
    from pyspark.sql import functions as F

    return _key_expression(comp, F.col("stream"))[0]


def _key_udf(extractor: Callable[[Any], Any]) -> Any:
    """A callable key extractor as a scalar pandas UDF of (value, codec): the key, or an error text
    (``_ERR``...: a dead letter) when the extractor raises or returns anything but a string."""
    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    def extract(values: pd.Series, codecs: pd.Series) -> pd.Series:
        from .worker import freeze_spark_zips

        freeze_spark_zips()
        out = []
        for v, c in zip(values, codecs, strict=True):
            try:
                decoded = None if v is None else get_codec(c or "json").decode(v)
            except Exception as exc:  # noqa: BLE001 - an undecodable value; becomes a dead letter
                out.append(f"{_ERR}key extractor failed: {type(exc).__name__}: {exc}")
                continue
            k, why = key_or_reason(extractor, decoded)  # the testing harness keys records by it too
            out.append(f"{_ERR}{why}" if k is None else k)
        return pd.Series(out, dtype=object)

    # pandas_udf tells a scalar UDF by its type hints, which this module's postponed annotations
    # leave as strings naming a local import ("pd.Series"): give it the classes themselves
    extract.__annotations__ = {"values": pd.Series, "codecs": pd.Series, "return": pd.Series}
    return pandas_udf(extract, "string")  # type: ignore[call-overload]


def prepare_input(df: Any, comp: Computation, wm: int | None, *,
                  cache: dict[Any, Any] | None = None, ahead: tuple[int, Mapping[str, int]] | None = None) -> Any:
    """Stream-schema input → (record_id, key, value, codec, timestamp_ms, stream, position, late, _bad).

    ``cache``: a dict kept by the caller for the life of its session; the column expressions
    (one py4j call each) are then built once, only the late flag (the watermark) per batch.
    ``ahead``: (processing time now, {input stream: bound in ms}): a record of such a stream
    whose event time is more than the bound ahead of now is a dead letter (:func:`ahead_reason`;
    after the other checks, as ``_direct.py`` orders them).
    A frame with :data:`RAW_COLUMN` (a text source): a dead letter's ``value`` is that original text.
    Every DataFrame step is analysed eagerly, so the frame is built in as few steps as possible."""
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
    """The micro-batch ``df`` when it carries its records' original text (:data:`RAW_COLUMN`), else
    None: the tasks' dead letters (user code's) look theirs up in it by record id."""
    return df if df is not None and RAW_COLUMN in df.columns else None


def with_original_text(dead: Any, raw: Any) -> Any:
    """The tasks' dead letters (a frame with ``record_id`` and ``raw_value``) with ``raw_value`` the
    original text of their record in ``raw`` (:func:`original_text`; kept where it has none)."""
    from pyspark.sql import functions as F

    text = raw.select("record_id", F.col(RAW_COLUMN).alias("_raw")).where(F.col("_raw").isNotNull())
    cols = [F.coalesce(F.col("_raw"), F.col("raw_value")).alias("raw_value") if c == "raw_value" else F.col(c)
            for c in dead.columns]
    return dead.join(text.dropDuplicates(["record_id"]), "record_id", "left").select(*cols)


_AHEAD = ("event time ", " ms is more than {bound} ms ahead of the processing clock ({now} ms): refused so that it "
          "cannot move the watermark past every open window; fix the record's timestamp or raise the injector's "
          "max_event_ahead_ms")


def ahead_reason(ts_ms: int, bound_ms: int, now_ms: int) -> str:
    """The dead-letter reason of a record whose event time ``ts_ms`` is more than ``bound_ms`` ahead
    of the processing time ``now_ms`` (the same text on the JVM path and the direct read)."""
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
           .when(F.col("timestamp_ms").isNull(), F.lit("record without timestamp")))
    pos = F.col("commit_id") if has_commit_id else F.lit(None).cast("string")
    before = [F.col("record_id"), k.alias("key"), F.col("value"),  # at _VALUE
              F.coalesce("codec", F.lit("json")).alias("codec"),
              F.col("timestamp_ms"), stream.alias("stream"), pos.alias("position")]
    return (key if udf_key else None), before, bad


def run_in_tasks(spark: Any, layout: StoreLayout, comp: Computation, prep: Any | None, *,
                 intervals: Sequence[int], input_watermark_ms: int | None, now_ms: int,
                 dedup_horizon_ms: int | None, partitions: int, sequencers: dict[int, int],
                 commit_id: str) -> Any:
    """Join input with the rows it needs and run user code per key in tasks (lazy DataFrame)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import DataType

    n = comp.num_intervals
    ivs = list(intervals)
    if prep is not None:  # join within one session: foreachBatch frames live in the query's clone
        spark = prep.sparkSession
    rows = (spark.read.format("delta").load(layout.rows)
            .where((F.col("computation") == comp.name) & F.col("interval").isin(ivs) & (F.col("key") != FENCE_KEY)))
    due = (F.size("pending") > 0) | (F.col("next_processing_timer_ms") <= F.lit(now_ms))
    if input_watermark_ms is not None:
        due = due | (F.col("next_event_timer_ms") < F.lit(input_watermark_ms))
    if dedup_horizon_ms is not None and comp.exactly_once:
        # a row holding record ids past the dedup horizon is run too (no records: only its due
        # timers fire), so its ids are trimmed even when no later batch has records of its key
        # (otherwise the ids of a key seen once would stay forever)
        due = due | F.exists("record_ids", lambda x: x["seen_ms"] < F.lit(dedup_horizon_ms))
    if prep is None:
        joined = rows.where(due).withColumn("recs", F.lit(None))
    else:
        owned = prep.withColumn("interval", interval_of_key(n))
        owned = owned.where(F.col("interval").isin(ivs))
        recs = owned.groupBy("key", "interval").agg(F.collect_list(F.struct(
            "record_id", "value", "codec", "timestamp_ms", "late", "stream", "position")).alias("recs"))
        joined = recs.join(rows, ["key", "interval"], "full_outer").where(F.col("recs").isNotNull() | due)
    schema = DataType.fromDDL(OUT_DDL)
    arrow = to_arrow_schema(schema, timezone="UTC")  # type: ignore[arg-type]  # a StructType (parsed from OUT_DDL)
    fn = _task_fn(comp, input_watermark_ms, now_ms, dedup_horizon_ms, arrow, sequencers, commit_id)
    return joined.repartition(partitions, "interval").mapInArrow(fn, schema)


def _task_fn(comp: Computation, wm: int | None, now: int, horizon: int | None, arrow_schema: Any,
             sequencers: dict[int, int], commit_id: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    name = comp.name

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from .worker import freeze_spark_zips

        freeze_spark_zips()
        for b in batches:
            out = [_one_key(comp, name, r, wm, now, horizon, sequencers, commit_id) for r in b.to_pylist()]
            yield pa.RecordBatch.from_pylist(out, schema=arrow_schema)

    return fn


def _one_key(comp: Computation, name: str, r: dict[str, Any], wm: int | None, now: int,
             horizon: int | None, sequencers: dict[int, int], commit_id: str) -> dict[str, Any]:
    key, iv = r["key"], int(r["interval"])
    row = None
    cleared = False
    if r.get("sequencer") is not None:
        row = KeyRow.from_row({**r, "computation": name})
        cleared = bool(row.pending)
        row = row.with_(pending=())  # delivered by the previous batch or by recovery
    records: list[Record] = []
    dead: list[dict[str, Any]] = []
    recs = r.get("recs") or ()
    routed: list[dict[str, Any]] = []
    if comp.late_policy is LatePolicy.ROUTE and any(x["late"] for x in recs):
        # dedup first: a late record whose id the row holds is a retry of one run on time (a
        # duplicate, dropped below); the other late records go to the late-data table, once
        held = ({s.record_id for s in row.record_ids if horizon is None or s.seen_ms >= horizon}
                if (row is not None and comp.exactly_once) else set())  # as run_key's dedup decides
        kept, ids = [], set()
        for x in recs:
            if x["late"] and x["record_id"] not in held:
                if x["record_id"] not in ids:  # a record twice in the batch: routed once
                    ids.add(x["record_id"])
                    routed.append({c: x[c] for c in ("record_id", "value", "codec", "timestamp_ms", "stream")}
                                  | {"key": key})
            else:
                kept.append(x)
        recs = kept
    for x in recs:
        try:
            value = None if x["value"] is None else get_codec(x["codec"]).decode(x["value"])
        except CodecError as exc:
            dead.append(_dead(x, key, f"CodecError: {exc}"))
            continue
        records.append(Record(key, value, int(x["timestamp_ms"]), x["record_id"], x["stream"] or "", bool(x["late"])))
    o = run_key(comp, key=key, interval=iv, row=row, records=records, input_watermark_ms=wm, now_ms=now,
                dedup_horizon_ms=horizon)
    by_id = {x["record_id"]: x for x in recs}
    dead += [_dead(by_id[rec.record_id], key, err) for rec, err in o.dead_letters]
    if o.row is None:
        op = "delete" if row is not None else "none"
        img = KeyRow(name, key, iv).to_row()
    else:
        op = "upsert" if (o.changed or cleared or row is None) else "none"
        img = o.row.with_(computation=name, interval=iv).to_row()
    img.update(sequencer=sequencers[iv], commit_id=commit_id, updated_ms=now, _op=op,
               new_prods=[p.to_row() for p in o.productions], dead=dead, routed=routed, processed=o.processed,
               duplicates=o.duplicates, fired=o.timers_fired, late=o.late, n_prods=len(o.productions),
               n_dead=len(dead), n_routed=len(routed), ids_expired=o.ids_expired)
    return img


def _dead(x: dict[str, Any], key: str, error: str) -> dict[str, Any]:
    return {"record_id": x["record_id"], "key": key, "raw_value": x["value"], "error": error,
            "position": x.get("position"), "event_time_ms": x.get("timestamp_ms"), "stream": x.get("stream")}


def productions_frame(out: Any) -> Any:
    """The productions the tasks made (one row each, from the ``new_prods`` column of ``out``)."""
    from pyspark.sql import functions as F

    return out.select(F.explode("new_prods").alias("p")).select("p.*")


def dead_letter_frame(out: Any) -> Any:
    """The dead letters the tasks produced (one row each, from the ``dead`` column of ``out``)."""
    from pyspark.sql import functions as F

    return out.select(F.explode("dead").alias("d")).select("d.*")


def routed_frame(out: Any) -> Any:
    """The late records the tasks routed to the late-data table (``LatePolicy.ROUTE``)."""
    from pyspark.sql import functions as F

    return out.select(F.explode("routed").alias("r")).select("r.*")


def user_error_message(exc: BaseException, computation: str, batch_id: int) -> str:
    """A one-line message for a batch that failed in a Spark task: the user code's error when it is found."""
    text = str(exc)
    m = re.search(r"UserCodeError: (.*?)(?:\n|$)", text) or re.search(r"(\w+Error: .*?)(?:\n|$)", text)
    detail = m.group(1) if m else text.strip().splitlines()[0][:500] if text.strip() else type(exc).__name__
    return f"{computation} batch {batch_id} failed in a Spark task: {detail}"


class MergeTasks:
    """The MERGE path's batch job: input prepared in the JVM, joined with the rows it needs,
    user code per key in tasks (:func:`run_in_tasks`), materialized once.

    Args:
        spark: the session.
        comp: the computation.
        layout: the store.
        path: the MERGE write path (its owner's intervals and sequencers).
        partitions: tasks per batch.
        event_ahead_ms: per input stream, how far a record's event time may be ahead of the clock.
    """

    direct_source = None  # the MERGE path's tasks never read the input files themselves

    def __init__(self, spark: Any, comp: Computation, layout: StoreLayout, path: MergePath, *, partitions: int,
                 event_ahead_ms: Mapping[str, int]) -> None:
        self.spark = spark
        self.comp = comp
        self.layout = layout
        self.path = path
        self.partitions = partitions
        self.event_ahead_ms = event_ahead_ms
        self._prep_cache: dict[Any, Any] = {}  # input-preparation column expressions (prepare_input)

    def prepare(self, df: Any | None, *, wm_late: int | None, now: int) -> Prepared:
        """The input of the owned intervals, materialized; its input-level dead letters apart."""
        from pyspark.sql import functions as F

        if df is None:
            return Prepared(None)
        comp, owned = self.comp, self.path.owner.intervals
        prep = prepare_input(df, comp, wm_late, cache=self._prep_cache, ahead=(now, self.event_ahead_ms))
        if len(owned) < comp.num_intervals:  # the records of our intervals only
            iv = interval_of_key(comp.num_intervals)
            prep = prep.where(F.coalesce(iv, F.lit(0)).isin(list(owned)))
        prep = prep.localCheckpoint(eager=True)
        ok_ts = F.when(F.col("_bad").isNull(), F.col("timestamp_ms"))  # dead letters move no watermark
        agg = prep.agg(F.count(F.lit(1)).alias("n"), F.max(ok_ts).alias("mx"), F.min(ok_ts).alias("mn"),
                       F.sum(F.when(F.col("_bad").isNotNull(), 1).otherwise(0)).alias("bad")).collect()[0]
        dead_in = int(agg["bad"] or 0)
        # late records are routed by the tasks, after dedup (a retry of a record run on time is a
        # duplicate, not late data)
        return Prepared(prep.where(F.col("_bad").isNull()),
                        dead=prep.where(F.col("_bad").isNotNull()) if dead_in else None,
                        records_in=int(agg["n"]), dead_in=dead_in, obs_min=agg["mn"], obs_max=agg["mx"],
                        raw=original_text(df))

    def run(self, prepared: Prepared, *, batch_id: int, wm_in: int | None, wm_late: int | None, now: int,
            horizon: int | None, commit_id: str, strong: bool, mark: Callable[[str], None]) -> BatchRun[MergeBatch]:
        """Load the rows (one join), run user code, materialize once; count what it did."""
        from pyspark.sql import functions as F

        comp, owner = self.comp, self.path.owner
        out = run_in_tasks(self.spark, self.layout, comp, prepared.input, intervals=owner.intervals,
                           input_watermark_ms=wm_in, now_ms=now, dedup_horizon_ms=horizon,
                           partitions=self.partitions, sequencers=owner.sequencers, commit_id=commit_id)
        try:
            out = out.localCheckpoint(eager=True)
        except Exception as exc:  # noqa: BLE001 - user code errors surface here
            raise BatchFailedError(user_error_message(exc, comp.name, batch_id)) from exc
        stats = out.agg(*[F.sum(c).alias(c) for c in ("processed", "duplicates", "fired", "late", "n_prods",
                                                       "n_dead", "n_routed", "ids_expired")],
                        F.sum(F.when(F.col("_op") != "none", 1).otherwise(0)).alias("written"),
                        F.min(F.when(F.col("_op") != "delete", F.col("next_event_timer_ms"))).alias("event_timer")
                        ).collect()[0]
        st = {k: int(v or 0) for k, v in stats.asDict().items() if k != "event_timer"}
        mark("load_and_user_code")
        counts = {"records_in": prepared.records_in, "processed": st["processed"], "duplicates": st["duplicates"],
                  "late": st["late"], "dead_letters": st["n_dead"] + prepared.dead_in, "timers_fired": st["fired"],
                  "productions": st["n_prods"], "keys_written": st["written"], "ids_expired": st["ids_expired"]}
        batch = MergeBatch(out.where(F.col("_op") != "none"), productions_frame(out), st["written"], st["n_prods"])
        dead = dead_letter_frame(out) if st["n_dead"] else None
        if dead is not None and prepared.raw is not None:
            dead = with_original_text(dead, prepared.raw)
        return BatchRun(batch, counts, dead=dead,
                        late=routed_frame(out) if st["n_routed"] else None, event_timer_ms=stats["event_timer"],
                        obs_min=prepared.obs_min, obs_max=prepared.obs_max)

    def checkpoint(self, run: BatchRun[MergeBatch]) -> bool:
        """The productions are at hand: the commit writes them into the rows' ``pending``."""
        from pyspark.sql import functions as F

        run.batch.checkpointed = True
        run.prod_min_ts = run.batch.prods.agg(F.min("timestamp_ms")).collect()[0][0]
        return True

    def observe(self, run: BatchRun[MergeBatch]) -> None:
        """Nothing to learn: Spark places the tasks."""
