"""Per-batch figures: a metrics table per computation (never failing a batch), observed metrics."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from typing import Any, Mapping, Sequence

from deltawheel.statestore.layout import StoreLayout

__all__ = ["METRICS_COLUMNS", "METRICS_FORMAT_VERSION", "BatchMetrics", "batch_row", "read_batches",
           "observe_input", "OBSERVED_NAME"]

_LOG = logging.getLogger(__name__)
METRICS_FORMAT_VERSION = 1
OBSERVED_NAME = "deltawheel"
METRICS_COLUMNS = (
    "pipeline STRING, computation STRING, instance STRING, write_path STRING, batch_id BIGINT, "
    "started_ms BIGINT, recorded_ms BIGINT, wall_s DOUBLE, commit_s DOUBLE, steps_s MAP<STRING, DOUBLE>, "
    "records_in BIGINT, processed BIGINT, duplicates BIGINT, late BIGINT, late_routed BIGINT, "
    "dead_letters BIGINT, timers_fired BIGINT, productions BIGINT, pending_productions BIGINT, "
    "keys_written BIGINT, input_watermark_ms BIGINT, low_watermark_ms BIGINT, state_rows BIGINT, "
    "state_bytes BIGINT, format_version INT, keys_expired BIGINT, image_cache_hit_rate DOUBLE"
)
# columns added after the table's first version: a table created before them gets them on first use
_ADDED_COLUMNS = ("keys_expired BIGINT", "image_cache_hit_rate DOUBLE")


def _columns() -> list[tuple[str, str]]:
    """(name, Spark SQL type) of each of :data:`METRICS_COLUMNS`."""
    cols = METRICS_COLUMNS.replace("MAP<STRING, DOUBLE>", "MAP<STRING;DOUBLE>").split(",")
    return [(n, t.replace(";", ", ")) for n, t in (c.strip().split(" ", 1) for c in cols)]


_NAMES = tuple(n for n, _ in _columns())


METRICS_PROPERTIES = {"deltawheel.table": "metrics_batches", "delta.checkpointInterval": "100",
                      "deltawheel.format_version": str(METRICS_FORMAT_VERSION)}


def metrics_schema_json() -> str:
    """The table's schema as Delta records it (``schemaString``) for :data:`METRICS_COLUMNS`."""
    from deltawheel.statestore.delta.create import spark_type_json

    fields = [{"name": n, "type": spark_type_json(t), "nullable": True, "metadata": {}} for n, t in _columns()]
    return json.dumps({"type": "struct", "fields": fields}, separators=(",", ":"))


def _first_columns(folder: str) -> set[str] | None:
    """The column names the local table's first commit gave it (None: that commit is gone)."""
    import os

    try:
        with open(os.path.join(folder, "_delta_log", f"{0:020d}.json"), encoding="utf-8") as f:
            for line in f:
                meta = json.loads(line).get("metaData") if line.strip() else None
                if meta:
                    return {c["name"] for c in json.loads(meta["schemaString"])["fields"]}
    except (OSError, ValueError, KeyError):
        return None
    return None


def _arrow_schema() -> Any:
    import pyarrow as pa

    types = {"STRING": pa.string(), "BIGINT": pa.int64(), "DOUBLE": pa.float64(), "INT": pa.int32(),
             "MAP<STRING, DOUBLE>": pa.map_(pa.string(), pa.float64())}
    return pa.schema([pa.field(n, types[t]) for n, t in _columns()])


_FROM_REPORT = ("records_in", "processed", "duplicates", "late", "late_routed", "dead_letters",
                "timers_fired", "productions", "keys_written", "input_watermark_ms", "low_watermark_ms")


def batch_row(report: Any, *, pipeline: str | None, computation: str, instance: str | None, write_path: str,
              started_ms: int, pending_productions: int = 0, state: tuple[int | None, int | None] = (None, None),
              recorded_ms: int | None = None) -> dict[str, Any]:
    """The metrics row of one :class:`~.reports.BatchReport` (steps that ran twice are summed)."""
    steps: dict[str, float] = {}
    for name, secs in report.steps_s:
        steps[name] = round(steps.get(name, 0.0) + float(secs), 3)
    return {"pipeline": pipeline, "computation": computation, "instance": instance, "write_path": write_path,
            "batch_id": int(report.batch_id), "started_ms": int(started_ms),
            "recorded_ms": int(time.time() * 1000) if recorded_ms is None else int(recorded_ms),
            "wall_s": round(float(report.wall_s), 3), "commit_s": round(float(report.commit_s), 3), "steps_s": steps,
            **{c: getattr(report, c) for c in _FROM_REPORT}, "pending_productions": int(pending_productions),
            "state_rows": state[0], "state_bytes": state[1], "format_version": METRICS_FORMAT_VERSION,
            "keys_expired": int(getattr(report, "keys_expired", 0)),
            "image_cache_hit_rate": None if (rate := getattr(report, "image_cache_hit_rate", None)) is None
            else round(float(rate), 4)}


def state_size(files: Mapping[int, Sequence[Any]] | None) -> tuple[int | None, int | None]:
    """(rows, bytes) of an image path's interval images; (None, None) when not known."""
    if not files:
        return None, None
    rows: int | None = 0
    size = 0
    for entries in files.values():
        for f in entries:
            size += int(f.size)
            try:
                n = json.loads(json.loads(f.action_json)["add"]["stats"])["numRecords"]
            except (KeyError, TypeError, ValueError):
                n = None
            rows = None if rows is None or n is None else rows + int(n)
    return rows, size


class BatchMetrics:
    """Appends the executor's per-batch rows to its computation's metrics table from one background
    thread (``computation`` None: the store-wide ``_metrics/batches`` of older deltawheels)."""

    MAX_QUEUED = 1000  # rows waiting beyond this are dropped (with a warning): the writer is stuck
    interval_s = 5.0  # rows are gathered this long before one append (status and report lag by as much)

    def __init__(self, spark: Any, layout: StoreLayout, computation: str | None = None) -> None:
        self.spark = spark
        self.layout = layout
        self.computation = computation
        self._created = False
        self._log: Any = None  # TableLog of the table (the pyarrow route), built on first use
        self._files: Any = None
        self._warned = 0.0
        self._queue: queue.Queue[Mapping[str, Any]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._now = threading.Event()  # flush: write what waits without waiting out the interval

    @property
    def path(self) -> str:
        """The table's path."""
        return self.layout.metrics_batches if self.computation is None else self.layout.metrics_of(self.computation)

    def submit(self, row: Mapping[str, Any]) -> None:
        """Append ``row`` in the background (:meth:`append` in the writer thread)."""
        if self._queue.qsize() >= self.MAX_QUEUED:
            self._warn(RuntimeError(f"{self.MAX_QUEUED} rows are waiting; dropping batch {row.get('batch_id')}'s"))
            return
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._drain, name="deltawheel-metrics", daemon=True)
                self._thread.start()
        self._queue.put(dict(row))

    def flush(self, timeout_s: float | None = 60.0) -> bool:
        """Wait until every submitted row is written (or failed); False if ``timeout_s`` passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            self._now.set()
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _drain(self) -> None:
        while True:
            rows = [self._queue.get()]
            self._now.wait(self.interval_s)  # gather the rows of the interval (flush: no wait)
            self._now.clear()
            while not self._queue.empty():  # (this thread alone takes rows)
                rows.append(self._queue.get_nowait())
            try:
                self.append(*rows)
            finally:
                for _ in rows:
                    self._queue.task_done()

    def append(self, *rows: Mapping[str, Any]) -> bool:
        """Append ``rows`` now, in one commit; returns whether written. Never raises (a warning is logged)."""
        if not rows:
            return True
        try:
            self._append(rows)
            return True
        except Exception as exc:
            self._warn(exc)
            self._created = False
            self._log = None
            return False

    def _warn(self, exc: Exception) -> None:
        now = time.monotonic()
        if now - self._warned > 60:
            self._warned = now
            _LOG.warning("deltawheel: could not append batch metrics to %s (%s: %s); the batch itself is "
                         "committed. Check the store's permissions and space; 'deltawheel status' shows "
                         "older figures meanwhile", self.path, type(exc).__name__, exc)

    def _append(self, rows: Sequence[Mapping[str, Any]]) -> None:
        from deltawheel.statestore.delta.jvm import activate

        activate(self.spark)  # this writer's thread: Delta's post-commit work needs a session
        if not self._created:
            self._create()
        if self._files is None:
            df = self.spark.createDataFrame([tuple(r.get(n) for n in _NAMES) for r in rows], schema=METRICS_COLUMNS)
            df.write.format("delta").mode("append").save(self.path)
            return
        import pyarrow as pa
        from deltawheel.statestore.delta.txn import TableLog, new_add

        table = pa.Table.from_pylist([dict(r) for r in rows], schema=_arrow_schema())
        rel = f"part-{uuid.uuid4().hex}-m.snappy.parquet"
        size = self._files.write_parquet(table, rel, compression="snappy")
        if self._log is None:
            self._log = TableLog(self.spark, self.path)
        self._log.commit(add=[new_add(rel, {}, size, table.num_rows)])

    def _create(self) -> None:
        from deltawheel.statestore.delta.create import create_local_table
        from deltawheel.statestore.delta.log import local_path, local_table_exists
        from deltawheel.statestore.delta.storefs import table_files
        from deltawheel.statestore.sqltext import sql_path, sql_str

        # a local store's table is made and read from Python, without a Spark statement
        folder = local_path(self.path)
        have: set[str] | None = None
        if folder is not None and (local_table_exists(self.path)
                                   or create_local_table(self.spark, folder, schema_json=metrics_schema_json(),
                                                         properties=METRICS_PROPERTIES)):
            have = _first_columns(folder)
            if have is not None and any(c.split(" ", 1)[0] not in have for c in _ADDED_COLUMNS):
                have = None  # made by an older deltawheel (altered since or not): Spark reads the schema
        if have is None:
            props = ", ".join(f"{sql_str(k)} = {sql_str(v)}" for k, v in METRICS_PROPERTIES.items())
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS {sql_path(self.path)} ({METRICS_COLUMNS}) USING DELTA "
                           f"TBLPROPERTIES ({props})")
            have = {f.name for f in self.spark.read.format("delta").load(self.path).schema.fields}
        missing = [c for c in _ADDED_COLUMNS if c.split(" ", 1)[0] not in have]
        if missing:  # a table of an older deltawheel: add the new columns (its old rows read them as null)
            self.spark.sql(f"ALTER TABLE {sql_path(self.path)} ADD COLUMNS ({', '.join(missing)})")
        self._files = table_files(self.spark, self.path)
        self._created = True


def metrics_tables(layout: StoreLayout, spark: Any = None) -> list[str]:
    """The paths of the store's metrics tables: each computation's, and the store-wide one of older
    deltawheels (listed whether or not it exists)."""
    from deltawheel.statestore.delta.create import tables_below

    return [layout.metrics_batches] + [layout.metrics_of(c) for c in tables_below(spark, layout.metrics_root,
                                                                                  what="metrics tables")]


def read_batches(layout: StoreLayout, *, spark: Any = None, pipeline: str | None = None) -> list[dict[str, Any]]:
    """The metrics rows of ``layout`` (every metrics table), oldest first ([] before any exists)."""
    rows = [r for path in metrics_tables(layout, spark) for r in _read_table(path, spark)]
    if pipeline is not None:
        rows = [r for r in rows if r["pipeline"] == pipeline]
    return sorted(rows, key=lambda r: (r["recorded_ms"], r["computation"], r["batch_id"]))


def _read_table(path: str, spark: Any) -> list[dict[str, Any]]:
    """The rows of one metrics table ([] before it exists)."""
    from deltawheel.statestore.delta.log import local_table_exists, read_snapshot
    from deltawheel.statestore.delta.storefs import local_path

    local = local_path(path)
    if local is not None and not local_table_exists(path):
        return []
    snap = read_snapshot(path) if local is not None else None
    if snap is not None:
        import pyarrow.parquet as pq
        from deltawheel.statestore.delta.txn import decode_path

        rows: list[dict[str, Any]] = [r for add in snap.adds
                                      for r in pq.read_table(f"{local}/{decode_path(add['path'])}").to_pylist()]
    else:
        if spark is None:
            raise ValueError(f"reading {path} needs a SparkSession (not a local store)")
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(spark, path):
            return []
        rows = [r.asDict(recursive=True) for r in spark.read.format("delta").load(path).collect()]
    for r in rows:  # pyarrow reads a map as [(k, v), ...]
        if isinstance(r.get("steps_s"), list):
            r["steps_s"] = dict(r["steps_s"])
        for n in _NAMES:  # a file written before a column was added has none: null, as Spark reads it
            r.setdefault(n, None)
    return rows


def observe_input(df: Any, *, name: str = OBSERVED_NAME, event_time_column: str = "timestamp_ms") -> Any:
    """``df`` observed as ``name``: per micro-batch input figures in ``observedMetrics[name]``. Call it on
    the *streaming* frame: ``observe_input(stream).writeStream.foreachBatch(executor).start()``."""
    from pyspark.sql import functions as F

    ts = F.col(event_time_column)
    return df.observe(name, F.count(F.lit(1)).alias("records"), F.min(ts).alias("min_event_ms"),
                      F.max(ts).alias("max_event_ms"),
                      F.sum(F.when(ts.isNull(), 1).otherwise(0)).alias("records_without_time"))
