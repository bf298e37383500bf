"""The latency benchmark's engines: the interface (:class:`LatencyEngine`), and Spark's own peers.

An engine starts continuous queries and names, per stage, the Delta table to measure (docs/latency.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from deltawheel.statestore.exceptions import ConfigError

from .latency_kafka import KafkaInput

__all__ = ["LatencyBenchError", "INPUT_DDL", "FileInput", "StageOutput", "LatencyEngine", "SparkRun",
           "SparkEngine", "floor_query", "spark_sql_query", "spark_tws_query", "records_from_spark", "key_number"]

INPUT_DDL = "record_id string, key string, event_time timestamp"
SQL_OUTPUT_DDL = "key string, count long, batch_id long"
TWS_OUTPUT_DDL = "record_id string, key string, count long"
DEFAULT_TRIGGER = "default (ProcessingTime(0): the next micro-batch as soon as the last one ended and new input is listed)"


class LatencyBenchError(ConfigError):
    """The latency benchmark cannot run as asked (e.g. settings that leave no steady state)."""


@dataclass(frozen=True)
class FileInput:
    """The input folder the generator renames files into."""

    folder: Path
    schema_ddl: str = INPUT_DDL


@dataclass(frozen=True, kw_only=True)
class StageOutput:
    """A Delta table to measure: its stage (1..), kind and row normalization, and its query's checkpoint."""

    stage: int
    name: str
    table: Path
    checkpoint: Path
    kind: str  # "records" or "key_counts" (latency_measure)
    normalize: Callable[[pa.Table], pa.Table] = field(repr=False)
    reads_input_files: bool = True  # False: a later stage, reading its upstream's table (no file log)


class LatencyEngine(Protocol):
    """What ``bench latency`` runs."""

    name: str
    stages: tuple[int, ...]

    def start(self, source: FileInput | KafkaInput, *, spark: Any, work_dir: Path, stages: int = 1) -> SparkRun:
        """Start the engine's queries on ``source``, keeping everything under ``work_dir``."""
        ...


def key_number(keys: pa.ChunkedArray | pa.Array) -> pa.Array:
    """``k00123`` -> 123."""
    return pc.cast(pc.utf8_slice_codeunits(keys, 1), pa.int64())


def records_from_spark(t: pa.Table) -> pa.Table:
    """A Spark output of input records (``record_id``, ``key``, optional ``count``) in the ``records`` kind."""
    count = t.column("count") if "count" in t.column_names else pa.nulls(t.num_rows, pa.int64())
    return pa.table({"record_id": pc.cast(t.column("record_id"), pa.int64()), "key": key_number(t.column("key")),
                     "count": pc.cast(count, pa.int64())})


def key_counts_from_spark(t: pa.Table) -> pa.Table:
    """The SQL engine's (``key``, ``count``, ``batch_id``) rows in the ``key_counts`` kind."""
    return pa.table({"batch_id": pc.cast(t.column("batch_id"), pa.int64()), "key": key_number(t.column("key")),
                     "count": pc.cast(t.column("count"), pa.int64())})


def progress_dicts(query: Any) -> list[dict[str, Any]]:
    """A query's recent progress reports as plain dicts."""
    return [json.loads(raw if isinstance(raw := getattr(p, "json", None), str)
                       else json.dumps(p, default=str)) for p in query.recentProgress]


class SparkRun:
    """A started engine: its queries (one per stage), the tables they write and their progress reports."""

    def __init__(self, queries: list[Any], outputs: tuple[StageOutput, ...], settings: Mapping[str, Any]) -> None:
        self.stage_queries = queries  # per stage; None: a stage run in the one before it's batches (fused)
        self.queries = [q for q in queries if q is not None]
        self.outputs = outputs
        self.settings = dict(settings)
        self._progress: list[dict[int, dict[str, Any]]] = [{} for _ in queries]

    def poll(self) -> None:
        """Keep every executed batch's report (idle triggers report no ``addBatch``)."""
        for q, seen in zip(self.stage_queries, self._progress, strict=True):
            for p in progress_dicts(q) if q is not None else ():
                if "addBatch" in p.get("durationMs", {}):
                    seen[int(p["batchId"])] = p

    def progress(self, stage: int) -> list[dict[str, Any]]:
        """Executed batches' reports of ``stage``, by batch id."""
        return [p for _b, p in sorted(self._progress[stage - 1].items())]

    def batch_details(self, stage: int) -> dict[int, dict[str, Any]]:
        """The engine's own figures per batch id (Spark's engines: none beyond the progress reports)."""
        return {}

    def error(self) -> str | None:
        """The first failed query's exception."""
        for q in self.queries:
            if (exc := q.exception()) is not None:
                return str(exc).splitlines()[0]
            if not q.isActive:
                return "the query stopped"
        return None

    def stop(self) -> None:
        """Stop every query (after a last poll of their reports)."""
        self.poll()
        for q in self.queries:
            if q.isActive:
                q.stop()


def _settings(spark: Any, **extra: Any) -> dict[str, Any]:
    return {"trigger": DEFAULT_TRIGGER, "maxFilesPerTrigger": "unset (every new file)",
            "spark.sql.shuffle.partitions": spark.conf.get("spark.sql.shuffle.partitions"),
            "state_store": spark.conf.get("spark.sql.streaming.stateStore.providerClass", None), **extra}


def _input(spark: Any, source: FileInput | KafkaInput) -> Any:
    if isinstance(source, KafkaInput):
        return source.stream(spark)
    return spark.readStream.schema(source.schema_ddl).parquet(str(source.folder))


def _check_stages(name: str, stages: int, supported: tuple[int, ...] = (1,)) -> None:
    if stages not in supported:
        raise LatencyBenchError(f"engine {name} runs {' or '.join(map(str, supported))} stage(s), not {stages}")


def _empty_table(spark: Any, path: Path, ddl: str) -> None:
    spark.createDataFrame([], ddl).write.format("delta").save(str(path))


LATER_STAGES = ("stages 2..n: each a query reading the previous stage's Delta table as a stream (Delta source) "
                "and appending its rows unchanged to its own Delta table (Delta sink): a per-record pass-through")


def chain(spark: Any, *, first: StageOutput, ddl: str, work_dir: Path, name: str, stages: int) -> tuple[
        list[Any], list[StageOutput], dict[str, str]]:
    """Stages 2..``stages``, each copying the previous one's rows: their queries, outputs and settings."""
    queries, outputs = [], []
    if stages > 1:
        _empty_table(spark, first.table, ddl)
    upstream = first
    for stage in range(2, stages + 1):
        out, chk = work_dir / f"output{stage}", work_dir / f"checkpoint{stage}"
        _empty_table(spark, out, ddl)
        q = _delta_sink(spark.readStream.format("delta").load(str(upstream.table)), chk=chk,
                        name=f"latency_{name}_{stage}", out=out)
        upstream = StageOutput(stage=stage, name=f"{first.name}{stage}", table=out, checkpoint=chk,
                               kind=first.kind, normalize=first.normalize, reads_input_files=False)
        queries.append(q)
        outputs.append(upstream)
    return queries, outputs, {"later_stages": LATER_STAGES} if stages > 1 else {}


@dataclass(kw_only=True)
class SparkEngine:
    """A Spark engine: ``query(df, out=, chk=, work_dir=)`` starts its query of the input into the first
    stage's table and returns it and its settings; later stages copy that table (:func:`chain`)."""

    name: str
    query: Callable[..., tuple[Any, dict[str, str]]]
    output: str = "counts"  # the first stage's output, its kind and DDL
    kind: str = "records"
    ddl: str = TWS_OUTPUT_DDL
    stages: tuple[int, ...] = (1, 3)

    def start(self, source: FileInput | KafkaInput, *, spark: Any, work_dir: Path, stages: int = 1) -> SparkRun:
        """Start the engine's query on ``source`` (and, for several stages, the copies of its output)."""
        _check_stages(self.name, stages, self.stages)
        out, chk = work_dir / "output", work_dir / "checkpoint"
        first = StageOutput(stage=1, name=self.output, table=out, checkpoint=chk, kind=self.kind,
                            normalize=key_counts_from_spark if self.kind == "key_counts" else records_from_spark)
        later_q, later_out, later = chain(spark, first=first, ddl=self.ddl, work_dir=work_dir, name=self.name,
                                          stages=stages)
        q, settings = self.query(_input(spark, source), out=out, chk=chk, work_dir=work_dir)
        return SparkRun([q, *later_q], (first, *later_out), _settings(spark, **settings, **later))


DELTA_SINK = "Delta sink (append; exactly-once by its txn per batch)"


def _delta_sink(df: Any, *, chk: Path, name: str, out: Path) -> Any:
    return (df.writeStream.format("delta").outputMode("append").option("checkpointLocation", str(chk))
            .queryName(name).start(str(out)))


def floor_query(df: Any, *, out: Path, chk: Path, work_dir: Path) -> tuple[Any, dict[str, str]]:
    """Parquet -> Delta, no state."""
    return (_delta_sink(df, chk=chk, name="latency_floor", out=out),
            {"sink": DELTA_SINK, "operator": "none (stateless copy)"})


def spark_sql_query(df: Any, *, out: Path, chk: Path, work_dir: Path) -> tuple[Any, dict[str, str]]:
    """Spark SQL's running count per key: ``groupBy(key).count()`` in update mode into Delta by foreachBatch."""
    from pyspark.sql import functions as F

    app_id = f"latency-spark-sql-{work_dir.name}"

    def write(batch: Any, batch_id: int) -> None:
        (batch.withColumn("batch_id", F.lit(batch_id).cast("long")).write.format("delta").mode("append")
         .option("txnAppId", app_id).option("txnVersion", batch_id).save(str(out)))

    q = (df.groupBy("key").count().writeStream.outputMode("update")
         .foreachBatch(write).option("checkpointLocation", str(chk)).queryName("latency_spark_sql").start())
    return q, {"operator": "groupBy(key).count(), output mode update",
               "sink": "foreachBatch: each batch's changed (key, count) rows appended to Delta with "
                       "txnAppId/txnVersion = batch id (exactly-once)"}


def _make_processor() -> Any:
    """The running count as a StatefulProcessor (built lazily: importing this module needs no pyspark)."""
    import numpy as np
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class RunningCountProcessor(StatefulProcessor):
        """Per key a ValueState count; one output row per input record with its running count."""

        def init(self, handle: Any) -> None:
            self._count = handle.getValueState("count", "c long")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            n = int(self._count.get()[0]) if self._count.exists() else 0
            for pdf in rows:
                m = len(pdf)
                yield pd.DataFrame({"record_id": pdf["record_id"].to_numpy(), "key": [key[0]] * m,
                                    "count": np.arange(n + 1, n + m + 1, dtype=np.int64)})
                n += m
            self._count.update((n,))

    return RunningCountProcessor()


def spark_tws_query(df: Any, *, out: Path, chk: Path, work_dir: Path) -> tuple[Any, dict[str, str]]:
    """transformWithStateInPandas with RocksDB: the per-record running count into a Delta sink."""
    df = (df.select("record_id", "key").groupBy("key")
          .transformWithStateInPandas(statefulProcessor=_make_processor(), outputStructType=TWS_OUTPUT_DDL,
                                      outputMode="Append", timeMode="None"))
    return (_delta_sink(df, chk=chk, name="latency_spark_tws", out=out),
            {"operator": "transformWithStateInPandas (ValueState count per key, one row per record)",
             "sink": DELTA_SINK})
