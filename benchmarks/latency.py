"""Latency benchmark: how long a record takes from its arrival to a durable, readable output.

Each engine runs a continuous query on its own copy of the same arrival schedule, one after the
other. A record's latency is the commit time of the first output version holding its output minus
its arrival; an output missing or repeating a record exits 1. docs/latency.md explains the figures."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .engines_spark import SPARK_BENCH_CONF, fresh_dir
from .isolated import build_bench_session
from .latency_deltawheel import DeltaWheelLatencyEngine
from .latency_engines import (
    INPUT_DDL,
    SQL_OUTPUT_DDL,
    FileInput,
    LatencyBenchError,
    LatencyEngine,
    SparkEngine,
    SparkRun,
    floor_query,
    spark_sql_query,
    spark_tws_query,
)
from .latency_input import Generator, Schedule, file_name
from .latency_kafka import KafkaGenerator, KafkaInput, read_arrivals, record_batches
from .latency_kafka import create as create_topic
from .latency_log import DeltaLogTail, LogWatcher, file_batches
from .latency_measure import (
    COMMIT_TIME_SOURCES,
    check_key_counts,
    check_records,
    engine_extras,
    format_table,
    percentiles,
    ratios,
    record_times,
    summarize,
    version_times,
)
from .memory import MemorySampler

__all__ = ["ENGINES", "LatencySettings", "LatencyBenchError", "run_latency", "run_from_args"]

ENGINES: dict[str, Callable[[LatencySettings], LatencyEngine]] = {
    "deltawheel": lambda st: DeltaWheelLatencyEngine(zk=st.zk, later_trigger=st.later_trigger),
    # the same with Spark's Kafka source on the record path (KafkaInjector(direct_read=False)); from files: the same
    "deltawheel_jvm": lambda st: DeltaWheelLatencyEngine(zk=st.zk, kafka_direct=False, name="deltawheel_jvm",
                                                         later_trigger=st.later_trigger),
    # every later stage run in the micro-batch of the stage before it (Pipeline.fused); one stage: as deltawheel
    "deltawheel_fused": lambda st: DeltaWheelLatencyEngine(zk=st.zk, fused=True, name="deltawheel_fused"),
    "spark_tws": lambda _st: SparkEngine(name="spark_tws", query=spark_tws_query),
    "spark_sql": lambda _st: SparkEngine(name="spark_sql", query=spark_sql_query, kind="key_counts",
                                         ddl=SQL_OUTPUT_DDL),
    "floor": lambda _st: SparkEngine(name="floor", query=floor_query, output="copy", ddl=INPUT_DDL),
}
Say = Callable[[str], None]
PREWARM_MAX_RATE = 1_000.0  # the pre-warm run warms code paths, not the engine's capacity
MEMORY_SAMPLE_S = 5.0  # the process tree's memory (PSS, from every process's smaps) sampled this often


@dataclass(frozen=True, kw_only=True)
class LatencySettings:
    """One latency run's settings (the command line's, parsed once)."""

    rate: float
    seconds: float
    engines: tuple[str, ...] = ("deltawheel", "spark_tws", "spark_sql", "floor")
    out: Path = Path("bench-out/latency")
    stages: int = 1
    source: str = "files"
    warmup_s: float = 10.0
    seed: int = 7
    keys: int = 50_000
    generator: str = "thread"
    drain_timeout_s: float = 120.0
    progress_every_s: float = 5.0
    commit_time: str = "mtime"
    watch_log: bool = False
    prewarm_s: float = 5.0
    zk: str | None = None  # deltawheel's ZooKeeper (host:port[/chroot]); None: the store's embedded server
    kafka: str | None = None  # --source kafka: the broker (host:port); None: a local broker started under --out
    later_trigger: str | None = None  # deltawheel's (unfused) stages after the first; None: as fast as possible

    def schedule(self) -> Schedule:
        """The input schedule every engine gets."""
        return Schedule(rate=self.rate, seconds=self.seconds, seed=self.seed, keys=self.keys)

    def check(self) -> None:
        """Refuse what this benchmark cannot run (before any engine starts).

        Raises:
            LatencyBenchError: an unknown engine or option value, or a warm-up that leaves no steady state.
        """
        unknown = [e for e in self.engines if e not in ENGINES]
        if unknown or not self.engines:
            raise LatencyBenchError(f"unknown engine(s) {unknown or '(none given)'}; choose among {sorted(ENGINES)}")
        if self.stages not in (1, 3):
            raise LatencyBenchError(f"--stages must be 1 or 3, not {self.stages}")
        if self.source not in ("files", "kafka"):
            raise LatencyBenchError(f"--source must be files or kafka, not {self.source!r}")
        if self.rate <= 0 or self.seconds <= 0:
            raise LatencyBenchError(f"--rate and --seconds must be positive (got {self.rate}, {self.seconds})")
        if self.warmup_s >= self.seconds:
            raise LatencyBenchError(f"--warmup {self.warmup_s:g} s leaves no steady state in --seconds "
                                    f"{self.seconds:g}: make the run longer or the warm-up shorter")
        if self.commit_time not in COMMIT_TIME_SOURCES:
            raise LatencyBenchError(f"--commit-time must be one of {COMMIT_TIME_SOURCES}, not {self.commit_time!r}")
        if self.prewarm_s < 0:
            raise LatencyBenchError(f"--prewarm must be >= 0 seconds, not {self.prewarm_s:g}")
        if self.later_trigger is not None:
            from deltawheel.executor.drivers.triggers import Trigger
            from deltawheel.statestore.exceptions import ConfigError

            try:
                Trigger.parse(self.later_trigger)
            except ConfigError as exc:
                raise LatencyBenchError(f"--later-trigger: {exc}") from None
        if self.generator not in Generator.MODES:
            raise LatencyBenchError(f"--generator must be one of {Generator.MODES}, not {self.generator!r}")


def _drained(tail: DeltaLogTail, kind: str, expected: int) -> bool:
    """Whether the last stage's output (``tail``) accounts for ``expected`` input records."""
    if (rows := tail.rows()) is None:
        return False
    if kind == "records":
        return int(np.unique(rows.column("record_id").to_numpy()).size) >= expected
    counts = rows.group_by("key").aggregate([("count", "max")])
    return int(np.asarray(counts.column("count_max").to_numpy()).sum()) >= expected


def _progress_line(name: str, elapsed: float, schedule: Schedule, log_renamed: np.ndarray, tail: DeltaLogTail,
                   new: pa.Table | None, batches: int, window_s: float) -> str:
    arrived = int(np.nansum(np.where(np.isnan(log_renamed), 0, schedule.counts)))
    line = f"[{name}] {elapsed:5.1f} s: {arrived:,} records in, {tail.row_count:,} output rows, {batches} batches"
    if new is not None and new.num_rows and "record_id" in new.column_names:
        rid = np.asarray(new.column("record_id").to_numpy())
        ok = (rid >= 0) & (rid < schedule.total)
        vt = version_times(tail.versions, "mtime")
        t = np.array([vt[int(v)] for v in np.asarray(new.column("version").to_numpy())[ok]])
        lat = t - log_renamed[schedule.file_of[rid[ok]]]
        p = percentiles(lat)
        if p["n"]:
            line += f"; last {window_s:.0f} s: p50 {p['p50']:.2f} s, max {p['max']:.2f} s"
    return line


def _stage_batches(batches: dict[str, Any], progress: list[Any], details: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """A stage's batches: its query's, or for a stage without a query (fused) its executor's reports."""
    if progress or not details:
        return batches
    walls = np.array([d["wall_s"] for d in details.values() if "wall_s" in d], float)
    return {"count": len(details), "duration_s": percentiles(walls)}


def _run_engine(name: str, st: LatencySettings, *, spark: Any, work: Path, say: Say) -> dict[str, Any]:
    schedule = st.schedule()
    source: FileInput | KafkaInput
    gen: Generator | KafkaGenerator
    if st.source == "kafka":
        assert st.kafka is not None
        source = create_topic(spark, st.kafka, f"latency-{name}-{uuid.uuid4().hex[:8]}")
        gen = KafkaGenerator(schedule, source=source, work=work / "producer", log=work / "input-log.jsonl")
    else:
        source = FileInput(work / "input")
        gen = Generator(schedule, folder=work / "input", staging=work / "staging", log=work / "input-log.jsonl",
                        mode=st.generator)
    gen.prime()
    t_start = time.time()
    try:
        run: SparkRun = ENGINES[name](st).start(source, spark=spark, work_dir=work, stages=st.stages)
    except BaseException:
        gen.stop()  # a child generator waits for its start
        raise
    start_s = time.time() - t_start
    say(f"[{name}] started in {start_s:.1f} s; input: {schedule.n_files} files, {schedule.total:,} records over "
        f"{st.seconds:g} s")
    tails = [DeltaLogTail(o.table, o.normalize) for o in run.outputs]
    watchers = [LogWatcher(o.table).start() for o in run.outputs] if st.watch_log else []
    error: str | None = None
    t0 = gen.start()
    gen_end = t0 + float(schedule.offsets_s[-1])
    last_tick = t0
    try:
        while True:
            time.sleep(1.0)
            now = time.time()
            generating = gen.running()
            if generating and now - last_tick < st.progress_every_s:
                continue
            run.poll()
            error = run.error()
            new = [t.poll() for t in tails][-1]
            if now - last_tick >= st.progress_every_s or error:
                say(_progress_line(name, now - t0, schedule, gen.read_log().renamed, tails[-1], new,
                                   len(run.progress(len(tails))), now - last_tick))
                last_tick = now
            if error:
                break
            if not generating:
                renamed = gen.read_log().renamed
                expected = int(schedule.counts[~np.isnan(renamed)].sum())
                if _drained(tails[-1], run.outputs[-1].kind, expected):
                    break
                if now > gen_end + st.drain_timeout_s:
                    error = (f"not drained: the output did not hold every input record {st.drain_timeout_s:g} s "
                             "after the last input file (the engine fell behind the rate; see --drain-timeout)")
                    break
    finally:
        gen.stop()
        try:
            run.stop()
        except Exception as exc:
            error = error or f"stop failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        seen = [w.stop() for w in watchers]
    for t in tails:
        t.poll()
    log = gen.read_log()
    record_batch: Callable[[Path], np.ndarray] | None = None
    if isinstance(source, KafkaInput):  # arrival: each message's append time; batches: the offset logs
        arrival, part, off = read_arrivals(spark, source, schedule)
        log = replace(log, arrival=arrival)
        topic = source.topic
        record_batch = lambda chk: record_batches(chk, topic, part, off)  # noqa: E731
    stages: list[dict[str, Any]] = []
    commits: list[np.ndarray] = []
    checks: list[dict[str, Any]] = []
    first_fb: np.ndarray | None = None
    first_rb: np.ndarray | None = None
    for i, (o, tail) in enumerate(zip(run.outputs, tails, strict=True)):
        # a later stage's batches are not mapped to records (no breakdown): key_counts keep the first's
        fb = np.full(schedule.n_files, -1)
        rb = None
        if o.reads_input_files:
            if record_batch is None:
                by_name = file_batches(o.checkpoint)
                fb = np.array([by_name.get(file_name(f), -1) for f in range(schedule.n_files)], np.int64)
            else:
                rb = record_batch(o.checkpoint)
        first_fb = fb if first_fb is None else first_fb
        first_rb = rb if i == 0 else first_rb
        rows = tail.rows()
        if o.kind == "records":
            cks = check_records(schedule, rows, renamed=log.renamed, counted=name != "floor")
        else:
            cks = check_key_counts(schedule, rows, file_batch=first_fb, renamed=log.renamed, record_batch=first_rb)
        checks += [{"stage": o.stage, **asdict(c)} for c in cks]
        vt = version_times(tail.versions, st.commit_time)
        commit, batch = record_times(schedule, rows, kind=o.kind, vtime=vt, file_batch=first_fb,
                                     record_batch=first_rb)
        if not o.reads_input_files:
            batch = np.full(schedule.total, -1)
        details = run.batch_details(o.stage)
        summary = summarize(schedule, log, t0=t0, warmup_s=st.warmup_s, commit=commit, batch=batch,
                            progress=run.progress(o.stage),
                            work_s={b: d["wall_s"] for b, d in details.items() if "wall_s" in d})
        extras = engine_extras(schedule, log, t0=t0, warmup_s=st.warmup_s, commit=commit, batch=batch,
                               progress=run.progress(o.stage), details=details, versions=tail.versions,
                               seen=seen[i] if seen else None)
        summary["batches"] = _stage_batches(summary["batches"], run.progress(o.stage), details)
        stage: dict[str, Any] = {"stage": o.stage, "output": o.name, "kind": o.kind, "table": str(o.table),
                                 "versions": len(tail.versions), "rows": tail.row_count, **summary, **extras}
        if commits:
            steady = log.arrivals(schedule) >= t0 + st.warmup_s
            stage["added_latency_s"] = percentiles((commit - commits[-1])[steady])
        commits.append(commit)
        stages.append(stage)
    _save_records(work / "records.parquet", schedule, log.arrivals(schedule), commits, t0)
    renamed = ~np.isnan(log.renamed)
    last = stages[-1]
    if len(stages) > 1:  # end to end is the last stage's latency; per stage what it added
        stages[0]["added_latency_s"] = stages[0]["latency_s"]
    ok = error is None and all(c["ok"] for c in checks)
    return {"ok": ok, "error": error, "start_s": round(start_s, 3), "checks": checks,
            "latency_s": last["latency_s"], "throughput": last["throughput"], "batches": last["batches"],
            "breakdown_s": last["breakdown_s"], "stages": stages,
            "input": {"files_renamed": int(renamed.sum()), "records": int(schedule.counts[renamed].sum()),
                      "t0": t0, "generator": "kafka producer" if st.source == "kafka" else st.generator,
                      "rename_lateness": log.lateness(), "source": st.source,
                      **({"topic": source.topic} if isinstance(source, KafkaInput) else {})},
            "settings": run.settings}


def _save_records(path: Path, schedule: Schedule, arrival: np.ndarray, commits: Sequence[np.ndarray],
                  t0: float) -> None:
    cols: dict[str, Any] = {"record_id": np.arange(schedule.total), "file": schedule.file_of,
                            "arrival_s": arrival - t0}
    for i, c in enumerate(commits, start=1):
        cols[f"latency_s_stage{i}"] = c - arrival
    pq.write_table(pa.table(cols), path)


def _machine(spark: Any) -> dict[str, Any]:
    from .throughput import _machine_info

    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True,
                                    text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        head, dirty = None, None
    return {**_machine_info(str(spark.version)), "commit": head, "commit_dirty": dirty}


def _run_engines(st: LatencySettings, *, session: Any, out: Path, say: Say) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each engine's pre-warm run, then its measured run; (results, pre-warm results) by engine."""
    engines: dict[str, dict[str, Any]] = {}
    prewarm: dict[str, Any] = {}
    for name in st.engines:
        if st.prewarm_s > 0:  # JVM classes, code generation, Python workers: not charged to the first engine
            warm = replace(st, rate=min(st.rate, PREWARM_MAX_RATE), seconds=st.prewarm_s, warmup_s=0.0,
                           seed=st.seed + 1, watch_log=False,
                           progress_every_s=max(st.progress_every_s, st.prewarm_s))
            say(f"[{name}] pre-warm run of {st.prewarm_s:g} s (not measured)")
            w = _run_engine(name, warm, spark=session, work=fresh_dir(out / "prewarm" / name), say=say)
            prewarm[name] = {"ok": w["ok"], "error": w["error"], "latency_s": w["latency_s"]}
        # every 5 s: reading each process's smaps every second took about a tenth of a core beside the engine
        with MemorySampler(interval_s=MEMORY_SAMPLE_S) as mem:
            res = _run_engine(name, st, spark=session, work=fresh_dir(out / "engines" / name), say=say)
        res["peak_memory"] = mem.peak.to_dict()
        engines[name] = res
        lat = res["latency_s"]
        say(f"[{name}] {'ok' if res['ok'] else 'FAILED'}: p50 {lat['p50']} s, p99 {lat['p99']} s, max {lat['max']} s "
            f"over {lat['n']:,} steady-state records")
        if threads := res["peak_memory"].get("driver_jvm_threads_cpu_s"):
            say(f"[{name}] driver JVM CPU seconds by thread: " + ", ".join(f"{g} {c:g}" for g, c in threads.items()))
    return engines, prewarm


def run_latency(st: LatencySettings, *, spark: Any = None, progress: Say | None = print) -> dict[str, Any]:
    """Run ``st.engines`` one after another on the same schedule; write and return the report.

    Raises:
        LatencyBenchError: as :meth:`LatencySettings.check`.
    """
    st.check()
    say = progress or (lambda _m: None)
    conf = {**SPARK_BENCH_CONF, "spark.sql.streaming.numRecentProgressUpdates": "10000"}
    out = Path(st.out)
    out.mkdir(parents=True, exist_ok=True)
    session, start_s = build_bench_session(conf, spark=spark, app_name="deltawheel-bench-latency",
                                           kafka=True if st.source == "kafka" else None)
    say(f"spark session ready in {start_s:.1f} s; engines one after another: {', '.join(st.engines)}")
    broker = None
    if st.source == "kafka" and st.kafka is None:  # a local broker for this run
        from deltawheel.servers.kafka import KafkaBroker

        broker = KafkaBroker(fresh_dir(out / "kafka"))
        broker.start()
        st = replace(st, kafka=broker.bootstrap_servers)
        say(f"Kafka broker started on {st.kafka} (data in {out / 'kafka'})")
    try:
        engines, prewarm = _run_engines(st, session=session, out=out, say=say)
    finally:
        if broker is not None:
            from deltawheel.executor.tasks.image.kafkaread import close_consumers

            close_consumers()  # before the broker: a kept consumer polling a stopped one logs every retry
            broker.stop()
    schedule = st.schedule()
    report: dict[str, Any] = {
        "benchmark": "latency", "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "settings": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(st).items()},
                     "schedule": schedule.to_dict(), "run_order": "one engine at a time, each on its own copy "
                     "of the same schedule (same seed), in one Spark session",
                     "latency": "commit time of the output's Delta version (the <v>.json mtime, or commitInfo) "
                                "minus the input file's rename time"},
        "machine": _machine(session), "spark_conf": conf, "engines": engines, "ratios": ratios(engines),
        "prewarm": prewarm,
    }
    (out / "latency.json").write_text(json.dumps(report, indent=1, default=str))
    from .plot import plot_latency

    plot_latency(report, out / "latency.png")
    say(format_table(report))
    say(f"wrote {out / 'latency.json'} and {out / 'latency.png'}")
    return report


#: the command line's option of each setting named otherwise
_OPTIONS = {"warmup_s": "warmup", "drain_timeout_s": "drain_timeout", "progress_every_s": "progress_every",
            "prewarm_s": "prewarm"}


def settings_from_args(args: argparse.Namespace) -> LatencySettings:
    """The parsed command line as :class:`LatencySettings`."""
    got: dict[str, Any] = {f.name: getattr(args, _OPTIONS.get(f.name, f.name), f.default)
                           for f in fields(LatencySettings)}
    got["engines"] = tuple(e.strip() for e in str(args.engines).split(",") if e.strip())
    return LatencySettings(**{**got, "out": Path(args.out)})


def run_from_args(args: argparse.Namespace) -> int:
    """``deltawheel bench latency``: 0 if every engine's output passed its checks, else 1."""
    report = run_latency(settings_from_args(args))
    return 0 if all(e["ok"] for e in report["engines"].values()) else 1
