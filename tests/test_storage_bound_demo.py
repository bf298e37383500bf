"""Bounded storage of the demo pipeline (``deltawheel demo``) as its input grows: ``--scale``.

Fast: ``deltawheel demo --scale X`` refuses what is not a positive number, before anything starts,
and generates X times ``--events``.

Slow (``test_demo_storage_stays_bounded_at_1x_5x_10x_and_a_kill_resumes_exactly``): the demo as a
user runs it, ``deltawheel demo --scale X --dedup-retention 60s --gc-every 5s``, at X = 1, 5 and 10
(20000, 100000 and 200000 queries, one store each), then ``deltawheel gc --apply`` on the idle
store (stream records kept 1 h: the generated event times are in 2025, so none; metrics rows 0 h;
VACUUM and the log 0 h, ``--force``). The figures of every table (live data files, their bytes,
versioned log entries), of Spark's streaming checkpoints and the ZooKeeper nodes are checked
against bounds that follow from the configuration, never from a measured figure but the first
stage's rate:

- data files of a table: one per partition after OPTIMIZE + VACUUM: the rows table is partitioned
  by (computation, interval): ``sum(num_intervals)`` = 12; every other table: 1;
- log entries of a table: a checkpoint at the newest version, its commit and checksum: 3;
- bytes: the metrics table and ``window_counts_dropped`` hold no row after the retentions: at
  most one file holding no row (``FILE_BYTES``); a stream table holds only the records whose
  productions are still checkpointed in the rows (stream retention keeps them: a restart may
  redeliver them; the next batch of their interval clears them, and a bounded run's last batch
  has no next): at most those, ``FILE_BYTES + pending x RECORD_BYTES``, ``pending`` the
  stream's checkpointed productions counted in the rows table; the rows table holds
  each computation's keys (at most ``n_queries`` = 50 each: the model's state is its last
  ``HISTORY`` windows, at most ``STATE_BYTES`` a key) and record ids:
  ``12 x FILE_BYTES + 3 x 50 x STATE_BYTES + (first + 2 x later) x ID_BYTES`` where
  ``first`` bounds the first stage's ids (``first_stage_ids_bound``): those seen within the dedup
  horizon H before its last batch, an ids file staying up to a quarter of H longer (its
  compaction bucket) and dropped by the next batch after that: at most
  ``rate x (H + H/4 + 2 batches)`` (a batch: the stage's longest), ``rate`` the first stage's peak
  rate over a span that long (records/s, from its progress lines): a bound that does not grow
  with the input; ``later`` =
  the window panes and predictions, the one batch each later stage runs in a bounded run (the
  runner runs a later stage on everything its upstream produced), whose ids and checkpointed
  productions each fit in ``ID_BYTES`` a record: this term grows with the input's event-time span;
- the first stage's ids in the rows table, counted: at most ``first`` at every scale;
- ``late_data``: the records past the allowed lateness are kept as they came (``late_fraction``
  of the input: nothing collects this table): ``FILE_BYTES + late x LATE_BYTES``;
- Spark's checkpoint of each stage: the offsets and commits of the last ``minBatchesToRetain``
  (100) batches and the file source's log (compacted every 10 batches), each file with its
  ``.crc``: ``2 x (2 x 100 + 100 + 10) + 3`` files;
- ``_meta`` (the migrations applied): written by ``deltawheel migrate`` alone, never by a run:
  a file per migration, a commit and checksum per migration and the table's creation;
- ZooKeeper: the nodes of the pipeline (its chroot folders, per computation its intervals'
  lease nodes and kept grants, the injector's and the stages' watermark nodes):
  ``zk_bound()`` below.

Then a run killed with SIGKILL (its whole process group, as ``tests/test_crash.py`` does) in the
middle of its first stage and the same command run again: every stream table, the late records
and each computation's state equal those of the uninterrupted 1x run.

``DELTAWHEEL_BOUND_SCALES=1,5`` (a comma list) runs other scales (the kill and resume only with 1);
``DELTAWHEEL_BOUND_RETENTION=30m`` another dedup horizon (a horizon longer than the run keeps every
id: the first stage's bound then fails at 5x and 10x).
Prints the figures as it goes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.zk]

DEFAULT_EVENTS = 20_000
STREAMS = ("window_counts", "predictions", "anomalies", "window_counts_dropped")


# --- the --scale option ------------------------------------------------------------------------


def test_scale_refuses_what_is_not_a_positive_number_and_starts_nothing(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.exceptions import ConfigError

    from deltawheel.cli import main
    from deltawheel.demo.zeitgeist import scaled_events

    assert scaled_events(DEFAULT_EVENTS, 10) == 200_000
    assert scaled_events(DEFAULT_EVENTS, 0.05) == 1_000
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="--scale must be a positive number"):
            scaled_events(DEFAULT_EVENTS, bad)
    with pytest.raises(ConfigError, match="rounds to none"):
        scaled_events(DEFAULT_EVENTS, 1e-6)
    with pytest.raises(ConfigError, match="--events must be >= 0"):
        scaled_events(-5, 2)
    store = tmp_path / "store"
    for bad in ("0", "-3", "nan", "1e-9"):
        capsys.readouterr()
        assert main(["demo", "--store", str(store), "--scale", bad]) == 3  # ConfigError's exit code
        assert "--scale" in capsys.readouterr().err
        assert not store.exists()  # nothing started, nothing written
    with pytest.raises(SystemExit):  # not a number at all: argparse's usage error
        main(["demo", "--store", str(store), "--scale", "ten"])
    assert main(["demo", "--store", str(store), "--follow", "--scale", "2"]) == 3
    assert "with --follow the input is generated live" in capsys.readouterr().err
    assert not store.exists()


def test_scale_sets_the_generated_input(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The input ``deltawheel demo --scale 0.05`` generates (without running the pipeline: the
    slow test below runs it at 1x, 5x and 10x)."""
    import pyarrow.parquet as pq
    from deltawheel.statestore.exceptions import ConfigError

    from deltawheel.cli import build_parser
    from deltawheel.cli.common import layout_from
    from deltawheel.cli.demo import demo_injector

    store = tmp_path / "store"
    args = build_parser().parse_args(["demo", "--store", str(store), "--scale", "0.05", "--events-per-batch", "400"])
    injector = demo_injector(args, layout_from(args))
    paths = injector.prepare()
    folder = store / "_input" / "seed7-n1000"  # 0.05 x the default 20000
    assert sorted(Path(p) for p in paths) == sorted(folder.glob("part-*.parquet"))
    assert len(paths) == 3 and sum(pq.read_metadata(p).num_rows for p in paths) == 1_000
    assert json.loads((folder / "_zeitgeist.json").read_text())["params"]["n_events"] == 1_000
    args = build_parser().parse_args(["demo", "--store", str(store), "--events", "300", "--scale", "10"])
    assert demo_injector(args, layout_from(args)).params.n_events == 3_000  # X times --events
    args.scale = 0
    with pytest.raises(ConfigError, match="--scale must be a positive number"):
        demo_injector(args, layout_from(args))


# --- the --dedup-retention option --------------------------------------------------------------


def test_dedup_retention_refuses_what_is_not_a_positive_duration_and_starts_nothing(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from deltawheel.statestore.exceptions import ConfigError

    from deltawheel.cli import main
    from deltawheel.cli.demo import parse_retention

    assert parse_retention("60s") == timedelta(seconds=60)
    assert parse_retention("2.5m") == timedelta(seconds=150)
    assert parse_retention("1h") == timedelta(hours=1)
    for bad in ("0s", "-5m", "60", "m", "", "ten s", "1d", "nans", "infh"):
        with pytest.raises(ConfigError, match="--dedup-retention must be a positive duration with its unit"):
            parse_retention(bad)
    store = tmp_path / "store"
    for args in (["--dedup-retention", "0s"], ["--dedup-retention", "90"], ["--follow", "--dedup-retention=-1m"]):
        capsys.readouterr()
        assert main(["demo", "--store", str(store), *args]) == 3  # ConfigError's exit code
        assert "--dedup-retention must be a positive duration" in capsys.readouterr().err
        assert not store.exists()  # nothing started, nothing written


def test_dedup_retention_reaches_every_stage_and_its_spark_tasks(spark) -> None:  # type: ignore[no-untyped-def]
    """``demo --dedup-retention 90s``: every computation's horizon is 90 s, on the driver and in a
    Python worker the computations were shipped to (as the executor ships them in its tasks); the
    demo's classes (other pipelines' computations) keep the default."""
    from datetime import timedelta

    from deltawheel.executor.computation import Computation

    from deltawheel.cli import build_parser
    from deltawheel.cli.demo import demo_computations
    from deltawheel.demo.pipeline import Detector, Model, computations

    comps = demo_computations(build_parser().parse_args(["demo", "--dedup-retention", "90s"]))
    assert [c.name for c in comps] == ["window_counter", "model", "detector"]
    assert [c.dedup_retention_ms() for c in comps] == [90_000] * 3
    assert isinstance(comps[1], Model) and isinstance(comps[2], Detector)
    shipped = spark.sparkContext.parallelize([0], 1).map(
        lambda _: [(c.name, c.dedup_retention_ms()) for c in comps]).collect()
    assert shipped == [[("window_counter", 90_000), ("model", 90_000), ("detector", 90_000)]]
    default = Computation.dedup_retention
    assert Model.dedup_retention == Detector.dedup_retention == default == timedelta(minutes=10)
    assert [c.dedup_retention for c in demo_computations(build_parser().parse_args(["demo"]))] == [default] * 3
    live = computations(window_ms=2_000, dedup_retention=timedelta(seconds=5))  # --follow --window 2
    assert [c.dedup_retention_ms() for c in live] == [5_000] * 3 and live[1].window_ms == 2_000


# --- figures -----------------------------------------------------------------------------------


def zk_paths(hosts: str, chroot: str) -> list[str]:
    """Every node under ``chroot``, the chroot itself first."""
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.zk.client import connect

    client = connect(ZkConfig(hosts=hosts, chroot=chroot))
    try:
        def walk(path: str) -> list[str]:
            return [path] + [p for c in sorted(client.get_children(path)) for p in walk(f"{path.rstrip('/')}/{c}")]
        return walk("/")
    finally:
        client.stop()
        client.close()


def table_figures(path: Path) -> tuple[int, int, int]:
    """(data files, their bytes, versioned log entries) of a local Delta table, as they are on disk
    (the file system's hidden ``.crc`` files left out)."""
    files = size = 0
    for folder, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d != "_delta_log"]
        for n in names:
            if not n.startswith((".", "_")):
                files += 1
                size += os.path.getsize(os.path.join(folder, n))
    log = sum(1 for n in os.listdir(path / "_delta_log") if n[:20].isdigit())
    return files, size, log


def tables(store: Path) -> dict[str, Path]:
    """The store's Delta tables by their path in it (``rows``, ``streams/predictions``, ...)."""
    out = {}
    for folder, dirs, _names in os.walk(store):
        if "_delta_log" in dirs:
            out[os.path.relpath(folder, store)] = Path(folder)
            dirs.clear()
        dirs[:] = [d for d in dirs if d not in ("_input", "_zk", "_checkpoints")]
    return out


def checkpoint_figures(store: Path) -> dict[str, tuple[int, int]]:
    """(files, bytes) of Spark's streaming checkpoint of each stage (``.crc`` files included)."""
    out = {}
    root = store / "_checkpoints" / "zeitgeist"
    for stage in sorted(os.listdir(root)):
        files = [os.path.join(f, n) for f, _d, ns in os.walk(root / stage) for n in ns]
        out[stage] = (len(files), sum(os.path.getsize(f) for f in files))
    return out


def outputs(spark, store: Path) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """Every row a run leaves that must not depend on a kill: the stream tables, the late records
    and each computation's keys (state and timers; the ids rows, whose times are the run's own,
    left out)."""
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.rowtable.tables import rows_frame
    from pyspark.sql import functions as F

    layout = StoreLayout(str(store))
    out: dict[str, Any] = {}
    for s in STREAMS:
        out[s] = sorted((r["record_id"], r["key"], bytes(r["value"]), r["timestamp_ms"])
                        for r in spark.read.format("delta").load(layout.stream(s)).collect())
    out["late_data"] = sorted(json.dumps({k: v for k, v in r.asDict().items() if k != "recorded_ms"},
                                         sort_keys=True, default=str)  # recorded_ms: the run's clock
                              for r in spark.read.format("delta").load(layout.late_data).collect())
    frame = rows_frame(spark, layout)  # every computation's rows table
    assert frame is not None, store
    rows = frame.where(~F.col("key").startswith("\x00"))
    out["rows"] = sorted((r["computation"], r["key"], None if r["state"] is None else bytes(r["state"]),
                          sorted((t["tag"], t["time_ms"]) for t in r["timers"])) for r in rows.collect())
    return out


# --- the bounds (from the configuration) -------------------------------------------------------

FILE_BYTES = 16 * 1024  # a Parquet file's own cost: magic, schema, footer, row group and column metadata
STATE_BYTES = 1024  # a key's row: the model's last HISTORY windows (12 x [start, count]) and its average, a timer
ID_BYTES = 48  # a record id ("q7-0000123456"), its key and seen time, uncompressed
LATE_BYTES = 512  # a late record as routed: its id, key, value, times and reason, uncompressed
RECORD_BYTES = 256  # a stream record: its production id, key, value, times, producer and commit id, uncompressed


def scales() -> tuple[float, ...]:
    return tuple(float(x) for x in os.environ.get("DELTAWHEEL_BOUND_SCALES", "1,5,10").split(","))


def gc_args(store: Path, hosts: str, chroot: str) -> list[str]:
    """``deltawheel gc`` as a user runs it on an idle store, every retention at its shortest."""
    return ["gc", "--store", str(store), "--apply", "--zk", hosts, "--zk-chroot", chroot,
            "--stream-retention-hours", "1", "--metrics-retention-hours", "0", "--vacuum-retain-hours", "0",
            "--log-retention-hours", "0", "--force"]


def retention() -> str:
    """The demo runs' dedup horizon (``--dedup-retention``): shorter than the runs at 5x and 10x."""
    return os.environ.get("DELTAWHEEL_BOUND_RETENTION", "60s")


def demo_args(store: Path, scale: float, hosts: str, chroot: str) -> list[str]:
    return ["demo", "--store", str(store), "--scale", f"{scale:g}", "--dedup-retention", retention(),
            "--gc-every", "5s", "--zk", hosts, "--zk-chroot", chroot, "--wait", "120", "--zk-session-timeout", "6"]


_BATCH_LINE = re.compile(r"^\[\s*([\d.]+)s\] window_counter batch \d+: (\d+) in,.*; took ([\d.]+)s", re.MULTILINE)


def first_stage_ids_bound(said: str, horizon_s: float) -> tuple[int, float, float]:
    """(bound, rate, span) of the first stage's record ids a run leaves, from its progress lines
    (``[  t s] window_counter batch N: R in, ...; took W s (...)``, printed as each batch ends): an
    id leaves with the first batch after its horizon that runs its interval, its ids file up to a
    compaction bucket (H/4) later, so the ids kept are those of the batches that ended within
    ``span = H + H/4 + 2 batches`` (the longest batch ``W``, once at each end) of the last one that
    ran; at most ``rate x span``, ``rate`` the stage's peak rate over any span that long (records/s)."""
    ends = [(float(t), int(n), float(w)) for t, n, w in _BATCH_LINE.findall(said)]
    assert len(ends) >= 2, said[-2000:]
    span = horizon_s * 1.25 + 2 * max(w for _, _, w in ends)
    bound = max(sum(n for t, n, _ in ends if end - span <= t <= end) for end, _, _ in ends)
    return bound, bound / span, span


def test_first_stage_ids_bound_counts_the_records_of_the_last_span() -> None:
    """The bound of the slow test below on lines as a run prints them: 40 batches of 2000 records
    every 10 s (5 s each), then, after the later stages ran, one that only drops expired ids."""
    lines = [f"[{100 + 10 * i:7.1f}s] window_counter batch {i}: 2000 in, 2000 processed, 0 dup; 50 keys "
             f"written; wm in unknown low unknown; took 5.0s (prepare 1.0)" for i in range(40)]
    lines += ["[ 900.0s] model batch 0: 1930 in, 1930 processed; took 60.0s (plan 1.0)",
              "[1000.0s] window_counter batch 40: 0 in, 0 processed; 2000 ids expired; took 44.0s (plan 0.1)"]
    bound, rate, span = first_stage_ids_bound("\n".join(lines), 60)
    assert span == 60 * 1.25 + 2 * 44.0  # the longest batch, not the gap while the later stages ran
    assert bound == 17 * 2000 and rate == pytest.approx(bound / span)  # batches ending in 163 s: 17
    assert first_stage_ids_bound("\n".join(lines), 3600)[0] == 40 * 2000  # a horizon longer than the run


def ids_per_computation(spark, store: Path) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """The record ids the rows tables hold, per computation (ids files and key rows alike)."""
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.rowtable.tables import rows_frame
    from pyspark.sql import functions as F

    rows = rows_frame(spark, StoreLayout(str(store)))
    assert rows is not None, store
    return {r["computation"]: int(r["ids"]) for r in rows.groupBy("computation")
            .agg(F.sum(F.size("record_ids")).alias("ids")).collect()}


def pending_per_stream(spark, store: Path) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """The productions the rows tables still hold checkpointed, per stream table (``streams/S``)."""
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.rowtable.tables import rows_frame
    from pyspark.sql import functions as F

    rows = rows_frame(spark, StoreLayout(str(store)))
    assert rows is not None, store
    return {f"streams/{r['stream']}": int(r["n"]) for r in rows.select(F.explode("pending").alias("p"))
            .groupBy(F.col("p.stream").alias("stream")).agg(F.count("*").alias("n")).collect()}


def zk_bound(computations: Any, *, injectors: int = 1) -> int:
    """The ZooKeeper nodes a finished pipeline leaves under its chroot (``zk_paths``): 14 folders
    (``/``, ``/layout``, ``/locks/migrate/{p}`` and its 2 parents, ``/pipelines``, ``/pipelines/{p}``,
    its ``computations``, ``store``, ``topology``, ``watermarks`` and the latter's ``computations``,
    ``injectors`` and ``low``); per injector its watermark; per computation 5 (its folder, its
    ``intervals`` folder, its topology, its watermarks folder and low watermark); per interval 3
    (its node, its ``grants`` folder, its watermark) and the grant nodes a lease manager keeps
    (``keep_grants``). Members and lease owners are EPHEMERAL (gone with the run); the estimates of
    gone instances and finished replays' chroots are gc's."""
    import inspect

    from deltawheel.statestore.zk.leases import LeaseManager

    keep_grants = int(inspect.signature(LeaseManager).parameters["keep_grants"].default)
    return 14 + injectors + sum(5 + c.num_intervals * (3 + keep_grants) for c in computations)


def _kill_mid_run(cmd: list[str]) -> None:
    """Run ``cmd`` and SIGKILL its whole process group (the driver, Spark's JVM and workers) in the
    middle of the first stage's batches."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "window_counter batch 4:" in line:
                break
        else:
            raise AssertionError("the run ended before its first stage's batch 4: " + "".join(seen[-30:]))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_demo_storage_stays_bounded_at_1x_5x_10x_and_a_kill_resumes_exactly(spark, zk_server, tmp_path,  # type: ignore[no-untyped-def]
                                                                           capsys) -> None:
    from deltawheel.migrations import MIGRATIONS

    from deltawheel.cli import main
    from deltawheel.cli.demo import parse_retention
    from deltawheel.demo.pipeline import computations
    from deltawheel.demo.zeitgeist import ZeitgeistParams

    horizon_s = parse_retention(retention()).total_seconds()
    comps = computations(dedup_retention=parse_retention(retention()))
    partitions = sum(c.num_intervals for c in comps)
    n_queries = ZeitgeistParams(n_events=0, seed=7).n_queries
    retain = int(spark.conf.get("spark.sql.streaming.minBatchesToRetain", "100"))
    checkpoint_bound = 2 * (3 * retain + 10) + 2
    reference: dict[str, Any] = {}
    report: list[str] = []
    for scale in scales():
        store, chroot = tmp_path / f"x{scale:g}", f"/bound-x{scale:g}"
        started = time.monotonic()
        assert main(demo_args(store, scale, zk_server.hosts, chroot)) == 0
        ran_s = time.monotonic() - started
        events = int(round(DEFAULT_EVENTS * scale))
        said = capsys.readouterr().out
        assert f"records read by window_counter : {events}\n" in said, said[-2000:]
        # gc ran from the pipeline too (every 5 s: a 1x run may end within 15 s; looked at after each batch: a run may fail on a
        # conflict with a batch's commit to the same rows partition; logged, the pipeline goes on)
        assert "background gc #1 started" in said, said[-3000:]
        out = outputs(spark, store)
        if scale == 1:
            reference = out
        first, rate, span = first_stage_ids_bound(said, horizon_s)
        later = len(out["window_counts"]) + len(out["predictions"])  # the later stages' one batch each
        late = len(out["late_data"])
        started = time.monotonic()
        assert main(gc_args(store, zk_server.hosts, chroot)) == 0
        gc_s = time.monotonic() - started
        capsys.readouterr()
        figs = {name: table_figures(path) for name, path in sorted(tables(store).items())}
        ckpt = checkpoint_figures(store)
        nodes = zk_paths(zk_server.hosts, chroot)
        ids = ids_per_computation(spark, store)
        pending = pending_per_stream(spark, store)
        # the rows tables: each computation's (its intervals' files), their bytes together as one table's were;
        # the store's first one holds nothing since migration 8
        rows_bytes = partitions * FILE_BYTES + len(comps) * n_queries * STATE_BYTES + (first + 2 * later) * ID_BYTES
        intervals_of = {f"computations/{c.name}/rows": c.num_intervals for c in comps}
        bounds = {name: (intervals_of[name], 3, rows_bytes) if name in intervals_of
                  else (0, 3, 0) if name == "rows"
                  else (1, 3, FILE_BYTES + late * LATE_BYTES if name == "late_data"
                        else FILE_BYTES + pending.get(name, 0) * RECORD_BYTES)
                  for name in figs}
        assert set(intervals_of) <= set(figs), (scale, sorted(figs))
        assert sum(figs[t][1] for t in intervals_of) <= rows_bytes, (scale, {t: figs[t] for t in intervals_of})
        # a stream table keeps only the records still checkpointed (stream retention's rule)
        for name in (t for t in figs if t.startswith("streams/")):
            kept = spark.read.format("delta").load(str(tables(store)[name])).count()
            assert kept <= pending.get(name, 0), (scale, name, kept, pending)
        # _meta is written by `deltawheel migrate` alone: a file and a commit per migration
        bounds["_meta"] = (len(MIGRATIONS), 2 * (len(MIGRATIONS) + 1), len(MIGRATIONS) * FILE_BYTES)
        line = (f"{scale:g}x ({events} queries; demo {ran_s:.0f} s, gc {gc_s:.0f} s, load {os.getloadavg()[0]:.1f}): "
                + "; ".join(f"{t}: {f} files, {b} B, {lg} log (bound {bf}, {bb} B, {bl})"
                            for t, ((f, b, lg), (bf, bl, bb)) in ((t, (figs[t], bounds[t])) for t in figs))
                + "; checkpoints: " + ", ".join(f"{s} {f} files {b} B" for s, (f, b) in ckpt.items())
                + f" (bound {checkpoint_bound} files); zookeeper: {len(nodes)} nodes (bound {zk_bound(comps)})"
                + f"; ids {ids} (window_counter bound {first}: {rate:.0f}/s x {span:.0f} s; later stages' batch "
                  f"{later}); background gc runs {len(re.findall(r'background gc #[0-9]+ started', said))} "
                  f"({len(re.findall(r'background gc #[0-9]+ done', said))} done)")
        report.append(line)
        with capsys.disabled():
            print("\n" + line, flush=True)
        for t, (files, size, log) in figs.items():
            bound_files, bound_log, bound_bytes = bounds[t]
            assert files <= bound_files and log <= bound_log and size <= bound_bytes, (scale, t, figs[t], bounds[t])
        assert all(files <= checkpoint_bound for files, _ in ckpt.values()), (scale, ckpt)
        assert len(nodes) <= zk_bound(comps), (scale, nodes)
        assert ids.get("window_counter", 0) <= first, (scale, ids, first, rate, span)
        if scale == 1:  # a run killed mid-way, then the same command again: the uninterrupted run's rows
            killed = tmp_path / "killed"
            args = demo_args(killed, scale, zk_server.hosts, "/bound-killed")
            _kill_mid_run([sys.executable, "-m", "deltawheel.cli", *args])
            assert main(args) == 0
            assert "in this run, of 20000 generated" in capsys.readouterr().out
            assert outputs(spark, killed) == reference
    assert reference or 1 not in scales()  # the kill and resume runs after the 1x run (when the scales have 1)
