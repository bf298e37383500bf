"""deltawheel in the latency benchmark: a running count per key, one production per record."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
from deltawheel.executor.computation import RECORD_KEY, Computation

from .latency_engines import DEFAULT_TRIGGER, FileInput, SparkRun, StageOutput, _check_stages, key_number
from .latency_kafka import KafkaInput

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
        ctx.produce("counts", self.production(record, n))

    def production(self, record: Any, n: int) -> Any:
        """What the record produces: its key's new count."""
        return n


class PassOn(Computation):
    """A later stage: every record of ``counts`` passes its count on to ``counts2`` (no state)."""

    name = "stage2"
    inputs = {"counts": RECORD_KEY}
    outputs = ("counts2",)
    num_intervals = 2

    def process_record(self, ctx: Any, record: Any) -> None:
        """Produce the record's count to the next stream."""
        ctx.produce(self.outputs[0], record.value)


class PassOnAgain(PassOn):
    """The third stage: ``counts2`` to ``counts3``."""

    name = "stage3"
    inputs = {"counts2": RECORD_KEY}
    outputs = ("counts3",)


class KafkaRunningCount(RunningCount):
    """:class:`RunningCount` over Kafka: productions ``{"r": the benchmark's record id, "n": count}``."""

    def production(self, record: Any, n: int) -> Any:
        """The record's id and its key's new count."""
        return {"r": int(record.value["record_id"]), "n": n}


STAGES: tuple[type[Computation], ...] = (RunningCount, PassOn, PassOnAgain)


def _computation(intervals: int, base: type[Computation] = RunningCount) -> Computation:
    if intervals == base.num_intervals:
        return base()
    cls = type(base.__name__, (base,), {"num_intervals": intervals, "__module__": __name__})
    return cls()  # type: ignore[no-any-return]


def records_from_stream(t: pa.Table) -> pa.Table:
    """A stream table's rows as ``records``: the record id from the production id, count from the value."""
    rid = pc.replace_substring_regex(t.column("record_id"), pattern=r"^(?:[^:]*:)+(\d+)(?:#\d+)+$",
                                     replacement=r"\1")
    value = pc.cast(pc.cast(t.column("value"), pa.string()), pa.int64())
    return pa.table({"record_id": pc.cast(rid, pa.int64()), "key": key_number(t.column("key")), "count": value})


def records_from_kafka_stream(t: pa.Table) -> pa.Table:
    """A stream table of :class:`KafkaRunningCount`'s productions in the ``records`` kind."""
    value = pc.cast(t.column("value"), pa.string())
    rid = pc.struct_field(pc.extract_regex(value, pattern=r'"r":\s*(?P<r>\d+)'), "r")
    n = pc.struct_field(pc.extract_regex(value, pattern=r'"n":\s*(?P<n>\d+)'), "n")
    return pa.table({"record_id": pc.cast(rid, pa.int64()), "key": key_number(t.column("key")),
                     "count": pc.cast(n, pa.int64())})


def _collect(reports: Any, seen: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Add an executor's batch reports (steps, records, watermarks) to ``seen`` by batch id."""
    for r in list(reports):
        seen[r.batch_id] = {**asdict(r), "steps_s": dict(r.steps_s)}
    return dict(seen)


class _DeltaWheelRun(SparkRun):
    """deltawheel's queries, one per stage; ``executor(stage)`` reports its batches, ``check`` raises a
    stage's failed batch (its typed error)."""

    def __init__(self, engine: Any, queries: list[Any], executor: Callable[[int], Any],
                 outputs: tuple[StageOutput, ...], settings: dict[str, Any],
                 check: Callable[[], None] | None = None) -> None:
        super().__init__(queries, outputs, settings)
        self.engine, self.executor, self.check = engine, executor, check
        self._reports: list[dict[int, dict[str, Any]]] = [{} for _ in outputs]

    def batch_details(self, stage: int) -> dict[int, dict[str, Any]]:
        """The stage's executor's batch reports by batch id."""
        return _collect(self.executor(stage).reports, self._reports[stage - 1])

    def error(self) -> str | None:
        """A stage's failed batch, or a query that ended."""
        try:
            if self.check is not None:
                self.check()
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        return super().error()

    def stop(self) -> None:
        """Stop gracefully (every stage's batch in flight ends, deliveries land, leases go back)."""
        self.poll()
        for stage in range(1, len(self.outputs) + 1):
            self.batch_details(stage)
        self.engine.close()


def _connect(spark: Any, work_dir: Path, zk: str | None) -> Any:
    import deltawheel

    return deltawheel.connect(spark, store=str(work_dir / "store"), pipeline="latency", zk=zk,
                              zk_chroot=f"/deltawheel-latency-{uuid.uuid4().hex[:12]}")


def _file_injector(source: FileInput) -> Any:
    from deltawheel.executor.sources.parquet import ParquetInjector

    return ParquetInjector("events", str(source.folder), key_column="key", event_time_column="event_time",
                           value_columns=[], record_id_column="record_id", watermark_delay_ms=1_000)


def _settings(zk: str | None, *, intervals: int, inj: Any, executor: Any, **extra: str) -> dict[str, Any]:
    return {"trigger": DEFAULT_TRIGGER, "max_files_per_trigger": getattr(inj, "max_files_per_trigger", None),
            "exactly_once": True, "strong_productions": True, "num_intervals": intervals,
            "codec": RunningCount.codec, "write_path": executor.write_path,
            "direct_read": executor.inputs.direct_source is not None,
            "watermark_delay_ms": 1_000, "zookeeper": "the store's embedded server" if zk is None else zk,
            **extra}


class DeltaWheelLatencyEngine:
    """The running count through ``engine.start``; with 3 stages or Kafka, ``engine.start_pipeline``."""

    name = "deltawheel"
    stages: tuple[int, ...] = (1, 3)

    def __init__(self, *, zk: str | None = None, kafka_direct: bool = True, name: str = "deltawheel",
                 fused: bool = False, later_trigger: str | None = None) -> None:
        self.zk = zk  # host:port[,host:port]; None: the store's embedded ZooKeeper
        self.kafka_direct = kafka_direct  # the tasks read a Kafka batch's offset ranges (else the JVM reads)
        self.name = name
        self.fused = fused  # every later stage runs in the stage before it's micro-batch (Pipeline.fused)
        self.later_trigger = later_trigger  # the trigger of every (unfused) stage after the first; None: stage 1's

    def start(self, source: FileInput | KafkaInput, *, spark: Any, work_dir: Path, stages: int = 1) -> SparkRun:
        """Connect a fresh store under ``work_dir`` and start the computation's query."""
        _check_stages(self.name, stages, self.stages)
        chk = work_dir / "checkpoint"
        intervals = int(spark.conf.get("spark.sql.shuffle.partitions"))
        engine = _connect(spark, work_dir, self.zk)
        try:
            if stages > 1 or isinstance(source, KafkaInput) or self.fused:
                return self._start_pipeline(engine, source, intervals=intervals, stages=stages)
            inj = _file_injector(source)
            query = engine.start(inj, _computation(intervals), checkpoint=str(chk))
            executor = engine.executors[-1]
        except BaseException:
            engine.close()
            raise
        outputs = (StageOutput(stage=1, name="counts", table=Path(engine.layout.stream("counts")),
                               checkpoint=chk, kind="records", normalize=records_from_stream),)
        settings = _settings(self.zk, intervals=intervals, inj=inj, executor=executor,
                             operator="Computation.process_record: state += 1, produce(count) per record",
                             output="the counts stream table, one delivery commit per batch after the rows "
                                    "commit")
        return _DeltaWheelRun(engine, [query], lambda _stage: executor, outputs, settings)

    def _start_pipeline(self, engine: Any, source: FileInput | KafkaInput, *, intervals: int,
                        stages: int) -> _DeltaWheelRun:
        """``stages`` computations (:data:`STAGES`) on ``engine``, every stage's query live at once."""
        from deltawheel.executor.drivers.pipeline import Pipeline
        from deltawheel.executor.sources.kafka import KafkaInjector

        engine.progress = False
        inj: Any
        bases = list(STAGES[:stages])
        if isinstance(source, KafkaInput):
            inj = KafkaInjector("events", bootstrap_servers=source.bootstrap_servers, topic=source.topic,
                                schema=source.schema_ddl, key_column="key", event_time_column="event_time",
                                value_columns=["record_id"], watermark_delay_ms=1_000, direct_read=self.kafka_direct)
            bases[0] = KafkaRunningCount
        else:
            inj = _file_injector(source)
        comps = tuple(_computation(intervals, base) for base in bases)
        names = [c.name for c in comps]
        fused = tuple(zip(names, names[1:], strict=False)) if self.fused else ()
        later = {n: self.later_trigger for n in names[1:]} if self.later_trigger and not fused else None
        run = engine.start_pipeline(Pipeline("latency", (inj,), comps, fused=fused), triggers=later)
        outputs = tuple(
            StageOutput(stage=i, name=c.outputs[0], table=Path(engine.layout.stream(c.outputs[0])),
                        checkpoint=Path(f"{engine.layout.root}/_checkpoints/latency/{c.name}"),
                        kind="records",
                        normalize=records_from_kafka_stream if isinstance(source, KafkaInput) else records_from_stream,
                        reads_input_files=i == 1)
            for i, c in enumerate(comps, start=1))
        settings = _settings(
            self.zk, intervals=intervals, inj=inj, executor=run.executors[names[0]],
            runner="engine.start_pipeline (ContinuousRun: " + (
                "stage 1 live, each later stage fused: run in the micro-batch of the stage before it"
                if fused else "every stage live") + ")",
            **({"kafka_direct_read": str(self.kafka_direct)} if isinstance(source, KafkaInput) else {}),
            **({"later_trigger": f"stages 2..{stages}: every {self.later_trigger}"} if later else {}),
            operator="stage 1: Computation.process_record: state += 1, produce(count) per record; "
                     "stages 2..n: produce the record's count on (no state)",
            output="each stage's stream table, one delivery commit per batch after the rows commit; "
                   "a later stage reads its upstream's stream table (Delta source)")
        return _DeltaWheelRun(engine, [run.queries.get(n) for n in names], lambda stage: run.executors[names[stage - 1]],
                              outputs, settings, check=run.check)
