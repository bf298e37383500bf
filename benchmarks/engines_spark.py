"""Benchmark engines: the common interface (:class:`Engine`), and Spark's own stateful operators.

An engine runs WORKLOAD.md's window count in a given session; one with ``takes_store = True`` also
takes ``store=``, a folder URI for its state and output."""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import pyarrow as pa
import pyarrow.dataset as pads

from .memory import measured_run_ended
from .workload import OUT_SCHEMA, WIN_MS, WorkloadData, check_output

__all__ = ["ProgressFn", "Engine", "EngineResult", "build_result", "SPARK_BENCH_CONF", "ROCKSDB_PROVIDER",
           "SparkSqlEngine", "SparkTwsEngine", "StreamingRun", "run_streaming_query", "fresh_dir"]

ProgressFn = Callable[[str], None]

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

# Session settings every engine of one throughput run shares (passed to SparkSettings.extra).
SPARK_BENCH_CONF: Mapping[str, str] = {
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.streaming.numRecentProgressUpdates": "1000",
}

INPUT_DDL = "record_id string, key string, value long, event_time timestamp"
OUTPUT_DDL = "key string, window_start timestamp, count long"


@dataclass(frozen=True, kw_only=True)
class EngineResult:
    """One engine's run; ``wall_s`` as WORKLOAD.md section 4 (session start excluded)."""

    name: str
    records_per_s: float
    wall_s: float
    emitted_rows: int
    sum_counts: int
    correct: bool
    late_dropped: int | None = None
    open_events_at_end: int | None = None
    invariant_ok: bool | None = None  # emitted + late + open == N, when late and open are known
    session_start_s: float | None = None
    batches: int | None = None
    batch_s: tuple[float, ...] = ()  # per micro-batch duration, when the engine reports it
    settings: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    peak_memory: Mapping[str, Any] | None = None  # filled in by the throughput script
    rounds_records_per_s: tuple[float, ...] = ()  # every round's figure, with --rounds (this result: the median)

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready plain types (tuples and mappings as lists and dicts)."""
        return {**asdict(self), "settings": dict(self.settings), "notes": list(self.notes),
                "batch_s": list(self.batch_s), "rounds_records_per_s": list(self.rounds_records_per_s),
                "peak_memory": dict(self.peak_memory) if self.peak_memory is not None else None}


class Engine(Protocol):
    """What the throughput script runs. ``name`` is the registry name."""

    name: str

    def run(self, data: WorkloadData, *, out_dir: Path, spark: Any,
            progress: ProgressFn | None = None) -> EngineResult:
        """Run the workload ``data`` under ``out_dir`` and judge the output against its reference."""
        ...


def build_result(name: str, data: WorkloadData, *, output: pa.Table, wall_s: float, settings: Mapping[str, Any],
                 late_dropped: int | None = None, open_events_at_end: int | None = None,
                 batches: int | None = None, batch_s: Sequence[float] = (),
                 notes: Sequence[str] = ()) -> EngineResult:
    """Judge an engine's emitted rows against the reference and package the figures; a missing one of
    ``late_dropped`` / ``open_events_at_end`` is derived from the other."""
    chk = check_output(output, data.reference)
    notes = list(notes)
    if not chk.correct:
        notes.append(f"output differs from reference: {chk.missing} reference rows missing, "
                     f"{chk.unexpected} unexpected rows")
    invariant = None
    if late_dropped is not None and open_events_at_end is None:
        open_events_at_end = data.n - chk.sum_counts - late_dropped
        notes.append("open_events_at_end derived as N - sum_counts - late_dropped")
    elif open_events_at_end is not None and late_dropped is None:
        late_dropped = data.n - chk.sum_counts - open_events_at_end
        notes.append("late_dropped derived as N - sum_counts - open_events_at_end")
    elif late_dropped is not None and open_events_at_end is not None:
        invariant = chk.sum_counts + late_dropped + open_events_at_end == data.n
    return EngineResult(
        name=name, records_per_s=round(data.n / wall_s, 1) if wall_s > 0 else float("inf"),
        wall_s=round(wall_s, 3), emitted_rows=chk.emitted_rows, sum_counts=chk.sum_counts,
        correct=chk.correct, late_dropped=late_dropped, open_events_at_end=open_events_at_end,
        invariant_ok=invariant, batches=batches, batch_s=tuple(round(b, 3) for b in batch_s),
        settings=dict(settings), notes=tuple(notes),
    )


@dataclass(frozen=True)
class StreamingRun:
    """A finished streaming query: its wall time and every micro-batch's progress report."""

    wall_s: float
    progresses: tuple[dict[str, Any], ...]

    @property
    def batches(self) -> int:
        """The number of micro-batches the query ran."""
        return len(self.progresses)

    @property
    def batch_s(self) -> tuple[float, ...]:
        """Each micro-batch's trigger execution time, in seconds."""
        return tuple(p["durationMs"].get("triggerExecution", 0) / 1000 for p in self.progresses)

    def dropped_by_watermark(self) -> int:
        """Spark's numRowsDroppedByWatermark, summed over all batches and state operators."""
        return sum(int(op.get("numRowsDroppedByWatermark", 0))
                   for p in self.progresses for op in p.get("stateOperators", []))


def fresh_dir(path: Path) -> Path:
    """``path`` made an empty folder (its old content deleted)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def run_streaming_query(writer: Any, *, name: str, progress: ProgressFn | None) -> StreamingRun:
    """Start ``writer`` (a configured DataStreamWriter), wait for it, report each batch."""
    t0 = time.perf_counter()
    q = writer.start()
    seen = -1
    while True:
        done = q.awaitTermination(1.0)
        lp = q.lastProgress
        if progress is not None and lp is not None and lp["batchId"] != seen:
            seen = lp["batchId"]
            wm = lp.get("eventTime", {}).get("watermark", "-")
            progress(f"[{name}] batch {seen}: {lp['numInputRows']} rows, "
                     f"{lp['durationMs'].get('triggerExecution', 0) / 1000:.2f} s, watermark {wm}, "
                     f"elapsed {time.perf_counter() - t0:.1f} s")
        if done:
            break
    wall = time.perf_counter() - t0
    measured_run_ended()  # reading the output to check it is not the run's memory
    if (exc := q.exception()) is not None:
        raise RuntimeError(f"{name}: streaming query failed: {exc}")
    return StreamingRun(wall_s=wall, progresses=tuple(q.recentProgress))


def _read_sink(spark: Any, sink: Path | str) -> pa.Table:
    """The file sink's rows: a local folder's files, or through Spark (its ``_spark_metadata`` log)."""
    if not isinstance(sink, Path):
        return spark.read.parquet(sink).select("key", "window_start", "count").toArrow()
    files = sorted(str(p) for p in sink.glob("*.parquet"))
    return pads.dataset(files, format="parquet").to_table() if files else OUT_SCHEMA.empty_table()


_SETTING_KEYS = ("spark.master", "spark.sql.shuffle.partitions", "spark.driver.memory",
                 "spark.sql.streaming.stateStore.providerClass",
                 "spark.sql.streaming.noDataMicroBatches.enabled",
                 "spark.sql.streaming.checkpointFileManagerClass")
#: what both Spark engines share: a parquet file sink, availableNow, one file per batch
_FILE_SINK = {"exactly_once": True, "strong_productions": False,
              "sink": "parquet (file sink, _spark_metadata log)", "trigger": "availableNow",
              "maxFilesPerTrigger": 1}
_WALL_NOTE = "wall_s = writeStream.start() to termination (includes query planning)"


def _spark_settings(spark: Any, **extra: Any) -> dict[str, Any]:
    conf = {k: spark.conf.get(k, None) for k in _SETTING_KEYS}
    return {**conf, "spark_version": spark.version, **_FILE_SINK, **extra}


def _input_stream(spark: Any, data: WorkloadData) -> Any:
    return spark.readStream.schema(INPUT_DDL).option("maxFilesPerTrigger", 1).parquet(str(data.input_dir))


def _run_to_parquet(name: str, df: Any, *, sink: Path | str, ckpt: Path | str,
                    progress: ProgressFn | None) -> StreamingRun:
    """Run ``df`` into a parquet file sink (availableNow) and wait for it."""
    writer = (df.writeStream.format("parquet").outputMode("append")
              .option("path", str(sink)).option("checkpointLocation", str(ckpt))
              .trigger(availableNow=True).queryName(f"bench_{name}"))
    return run_streaming_query(writer, name=name, progress=progress)


class SparkSqlEngine:
    """Spark's built-in streaming window aggregation."""

    name = "spark_sql"
    takes_store = True  # run(store=...) puts the state checkpoint and the sink there

    def run(self, data: WorkloadData, *, out_dir: Path, spark: Any,
            progress: ProgressFn | None = None, store: str | None = None) -> EngineResult:
        """Run ``groupBy(key, window).count()`` over the input files and judge it (state below ``store``)."""
        from pyspark.sql import functions as F

        sink: Path | str
        ckpt: Path | str
        if store is None:
            base = fresh_dir(Path(out_dir) / self.name)
            sink, ckpt = base / "output", base / "checkpoint"
        else:
            sink, ckpt = f"{store}/{self.name}/output", f"{store}/{self.name}/checkpoint"
        agg = (_input_stream(spark, data)
               .withWatermark("event_time", "10 seconds")
               .groupBy("key", F.window("event_time", "10 seconds"))
               .count()
               .select("key", F.col("window.start").alias("window_start"), "count"))
        run = _run_to_parquet(self.name, agg, sink=sink, ckpt=ckpt, progress=progress)
        notes = [_WALL_NOTE]
        open_events: int | None = None
        try:
            st = spark.read.format("statestore").load(str(ckpt))
            open_events = int(st.selectExpr("coalesce(sum(value.count), 0) AS s").first()["s"])
            notes.append("open_events_at_end read from the final state with the statestore data source")
        except Exception as exc:
            notes.append(f"state not readable ({type(exc).__name__}); open events unknown")
        notes.append(f"Spark metric numRowsDroppedByWatermark (counts partially aggregated rows) "
                     f"= {run.dropped_by_watermark()}")
        settings = _spark_settings(spark, operator="groupBy(key, window).count()",
                                   **({} if store is None else {"store": store}))
        return build_result(self.name, data, output=_read_sink(spark, sink), wall_s=run.wall_s,
                            settings=settings, open_events_at_end=open_events, batches=run.batches,
                            batch_s=run.batch_s, notes=notes)


def _make_processor() -> Any:
    """The StatefulProcessor, built lazily so importing this module does not import pyspark."""
    import numpy as np
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class WindowCountProcessor(StatefulProcessor):
        """Per key: MapState window_start -> count; timer at window_end - 1 ms emits the window."""

        def init(self, handle: Any) -> None:
            self._handle = handle
            self._counts = handle.getMapState("counts", "ws long", "c long")

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            parts = [pdf["event_time"].to_numpy(dtype="datetime64[ms]").astype(np.int64) for pdf in rows]
            if not parts:
                return iter(())
            ms = np.concatenate(parts)
            ws_arr, n_arr = np.unique(ms - ms % WIN_MS, return_counts=True)
            for ws, n in zip(ws_arr.tolist(), n_arr.tolist(), strict=True):
                if self._counts.containsKey((ws,)):
                    c = self._counts.getValue((ws,))[0] + n
                else:
                    c = n
                    self._handle.registerTimer(ws + WIN_MS - 1)
                self._counts.updateValue((ws,), (c,))
            return iter(())

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            ws = expiredTimerInfo.getExpiryTimeInMs() + 1 - WIN_MS
            if (v := self._counts.getValue((ws,))) is None:
                return iter(())
            self._counts.removeKey((ws,))
            return iter([pd.DataFrame({
                "key": [key[0]],
                "window_start": pd.to_datetime([ws], unit="ms", utc=True),
                "count": np.array([v[0]], dtype=np.int64),
            })])

    return WindowCountProcessor()


class SparkTwsEngine:
    """``transformWithStateInPandas`` with per-key MapState and event-time timers."""

    name = "spark_tws"

    def run(self, data: WorkloadData, *, out_dir: Path, spark: Any,
            progress: ProgressFn | None = None) -> EngineResult:
        """Run the per-key window count processor over the input files (availableNow) and judge it."""
        base = fresh_dir(Path(out_dir) / self.name)
        sink, ckpt = base / "output", base / "checkpoint"
        out = (_input_stream(spark, data)
               .select("key", "event_time")
               .withWatermark("event_time", "10 seconds")
               .groupBy("key")
               .transformWithStateInPandas(statefulProcessor=_make_processor(),
                                           outputStructType=OUTPUT_DDL, outputMode="Append",
                                           timeMode="EventTime"))
        run = _run_to_parquet(self.name, out, sink=sink, ckpt=ckpt, progress=progress)
        notes = [_WALL_NOTE, "late_dropped = Spark metric numRowsDroppedByWatermark (rows dropped before the "
                 "operator, by event time)"]
        settings = _spark_settings(spark, operator="transformWithStateInPandas(MapState + event-time timers)",
                                   timer="window_end - 1 ms")
        return build_result(self.name, data, output=_read_sink(spark, sink), wall_s=run.wall_s,
                            settings=settings, late_dropped=run.dropped_by_watermark(),
                            batches=run.batches, batch_s=run.batch_s, notes=notes)
