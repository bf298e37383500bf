"""deltawheel in the latency benchmark: a running count per key, one production per record.

:class:`RunningCount` keeps an int per key in state and produces ``count`` to the ``counts``
stream for every record (the production's id is ``running_count:<record id>#1``, so the stream
table names each input record). Exactly-once and strong productions are on (the defaults): a
record's output is readable once the delivery commit to ``<store>/streams/counts`` lands,
after its batch's fenced rows commit.

It runs as users embed it: ``deltawheel.connect(spark, store=...)`` (the store's embedded
ZooKeeper) and ``engine.start(injector, computation)`` -- one continuous query with the
default trigger, the tasks reading the input files themselves (the direct read). The
:class:`ParquetInjector` reads every new file per micro-batch (its default), so no backlog grows
with files arriving every 100-200 ms. It takes its
schema from a file in the folder, so the benchmark puts the first file (the primer) in place
before starting any engine.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltawheel.executor.computation import RECORD_KEY, Computation

from .latency_engines import DEFAULT_TRIGGER, FileInput, SparkRun, StageOutput, _check_stages, key_number

__all__ = ["RunningCount", "DeltaWheelLatencyEngine", "records_from_stream"]



class RunningCount(Computation):
    """A count per key; every record produces its key's new count."""

    name = "running_count"
    inputs = {"events": RECORD_KEY}
    outputs = ("counts",)
    num_intervals = 2  # as many parts as Spark SQL's state (spark.sql.shuffle.partitions of the session)

    def process_record(self, ctx: Any, record: Any) -> None:
        """Count the record into its key's state and produce the new count."""
        n = (ctx.state or 0) + 1
        ctx.state = n
        ctx.produce("counts", n)


def _computation(intervals: int) -> Computation:
    if intervals == RunningCount.num_intervals:
        return RunningCount()
    cls = type("RunningCount", (RunningCount,), {"num_intervals": intervals, "__module__": __name__})
    return cls()  # type: ignore[no-any-return]


def records_from_stream(t: pa.Table) -> pa.Table:
    """The ``counts`` stream table's rows in the ``records`` kind: the input record id from the
    production id, the count from the JSON value."""
    rid = pc.replace_substring_regex(t.column("record_id"), pattern=r"^[^:]*:(\d+)#\d+$", replacement=r"\1")
    value = pc.cast(pc.cast(t.column("value"), pa.string()), pa.int64())
    return pa.table({"record_id": pc.cast(rid, pa.int64()), "key": key_number(t.column("key")), "count": value})


class _DeltaWheelRun(SparkRun):
    def __init__(self, engine: Any, query: Any, executor: Any, outputs: tuple[StageOutput, ...],
                 settings: dict[str, Any]) -> None:
        super().__init__([query], outputs, settings)
        self.engine = engine
        self.executor = executor
        self._reports: dict[int, dict[str, Any]] = {}

    def batch_details(self, stage: int) -> dict[int, dict[str, Any]]:
        """The executor's batch reports by batch id (steps, records, watermarks)."""
        for r in list(self.executor.reports):
            d = asdict(r)
            d["steps_s"] = dict(r.steps_s)
            self._reports[r.batch_id] = d
        return dict(self._reports)

    def stop(self) -> None:
        """Stop the query and the executor (the last delivery lands, leases go back), close the engine."""
        self.poll()
        self.batch_details(1)
        self.engine.close()


class DeltaWheelLatencyEngine:
    """The running count through ``deltawheel.connect`` + ``engine.start`` (module docstring)."""

    name = "deltawheel"
    stages: tuple[int, ...] = (1,)

    def __init__(self, *, zk: str | None = None) -> None:
        self.zk = zk  # host:port[,host:port]; None: the store's embedded ZooKeeper

    def start(self, source: FileInput, *, spark: Any, work_dir: Path, stages: int = 1) -> _DeltaWheelRun:
        """Connect a fresh store under ``work_dir`` and start the computation's query."""
        from deltawheel.executor.sources.parquet import ParquetInjector

        import deltawheel

        _check_stages(self.name, stages)
        store, chk = work_dir / "store", work_dir / "checkpoint"
        intervals = int(spark.conf.get("spark.sql.shuffle.partitions"))
        # a chroot of this store's own on a shared ZooKeeper (a fresh store: nothing of an earlier run)
        engine = deltawheel.connect(spark, store=str(store), pipeline="latency", zk=self.zk,
                                    zk_chroot=f"/deltawheel-latency-{uuid.uuid4().hex[:12]}")
        try:
            inj = ParquetInjector("events", str(source.folder), key_column="key", event_time_column="event_time",
                                  value_columns=[], record_id_column="record_id",
                                  watermark_delay_ms=1_000)
            comp = _computation(intervals)
            query = engine.start(inj, comp, checkpoint=str(chk))
            executor = engine.executors[-1]
        except BaseException:
            engine.close()
            raise
        outputs = (StageOutput(1, "counts", Path(engine.layout.stream("counts")), chk, "records",
                               records_from_stream),)
        settings = {"trigger": DEFAULT_TRIGGER, "max_files_per_trigger": inj.max_files_per_trigger,
                    "exactly_once": True, "strong_productions": True, "num_intervals": intervals,
                    "codec": RunningCount.codec, "write_path": executor.write_path,
                    "direct_read": executor.direct_source is not None,
                    "watermark_delay_ms": 1_000,
                    "zookeeper": "the store's embedded server" if self.zk is None else self.zk,
                    "operator": "Computation.process_record: state += 1, produce(count) per record",
                    "output": "the counts stream table, one delivery commit per batch after the rows commit"}
        return _DeltaWheelRun(engine, query, executor, outputs, settings)
