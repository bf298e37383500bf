"""The demo pipeline end to end: deterministic, same on a cluster, resumes after SIGKILL,
and two concurrent copies never both write."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.rowtable.tables import list_computations

pytestmark = [pytest.mark.spark, pytest.mark.zk]

J = get_codec("json")
EVENTS, PER_BATCH = 3_000, 1_000


def demo_cmd(store: Path | str, zk_hosts: str, chroot: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "deltawheel.cli", "demo", "--store", str(store), "--events", str(EVENTS),
            "--events-per-batch", str(PER_BATCH), "--zk", zk_hosts, "--zk-chroot", chroot, *extra]


def outputs(spark, store: Path | str) -> dict[str, list[tuple[str, str]]]:  # type: ignore[no-untyped-def]
    out = {}
    for stream in ("window_counts", "predictions", "anomalies"):
        df = spark.read.format("delta").load(f"{store}/streams/{stream}")  # a folder or an s3a:// URI
        out[stream] = sorted((r["record_id"], r["key"] + "|" + r["value"].decode()) for r in df.collect())
    return out


def run_in_process(spark, store: Path, zk_config) -> dict[str, list[tuple[str, str]]]:  # type: ignore[no-untyped-def]
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.layout import StoreLayout

    from deltawheel.demo.pipeline import computations
    from deltawheel.demo.zeitgeist import GeneratorInjector, ZeitgeistParams

    layout = StoreLayout(str(store))
    inj = GeneratorInjector("queries", str(store / "_input"), ZeitgeistParams(n_events=EVENTS, seed=7),
                            events_per_batch=PER_BATCH)
    summary = PipelineRunner(spark, layout, Pipeline("zeitgeist", (inj,), computations()), zk=zk_config).run()
    assert sum(r.records_in for r in summary.reports["window_counter"]) == EVENTS
    return outputs(spark, store)


@pytest.fixture(scope="module")
def reference(spark, zk_server, tmp_path_factory, migrated_template):  # type: ignore[no-untyped-def]
    from conftest import copy_migrated_store
    from deltawheel.statestore.config import ZkConfig

    store = tmp_path_factory.mktemp("ref") / "store"
    # a migrated copy: the migration a start runs on a new store is tested in test_migrations.py
    # (apply_when_pending), and the demo command of the SIGKILL test below migrates its own new store
    copy_migrated_store(migrated_template, store)
    # a chroot per instance: test_cluster uses this fixture too, so a run of both modules makes two
    out = run_in_process(spark, store, ZkConfig(hosts=zk_server.hosts, chroot=f"/pipeline-{store.parent.name}"))
    # the pipeline did its job: panes for every query window, the model predicted, the detector ran
    counts = [J.decode(v.split("|", 1)[1].encode()) for _, v in out["window_counts"]]
    assert counts and sum(c["value"] for c in counts if not c["retraction"] and c["timing"] != "LATE") > 0
    assert out["predictions"]
    return out


@pytest.mark.slow  # the SIGKILL test below compares with the same reference already
@pytest.mark.timeout(900)
def test_demo_is_deterministic(spark, zk_config, tmp_path, reference) -> None:  # type: ignore[no-untyped-def]
    assert run_in_process(spark, tmp_path / "again", zk_config) == reference


@pytest.mark.slow  # about 60 s quiet; the demo's SIGKILL test keeps its reference in the default suite
@pytest.mark.timeout(1200)
def test_local_cluster_gives_the_same_outputs(spark, zk_server, tmp_path, reference) -> None:  # type: ignore[no-untyped-def]
    """Separate executor JVMs and Python workers: nothing may depend on driver-local state."""
    store = tmp_path / "cluster"
    proc = subprocess.run(demo_cmd(store, zk_server.hosts, "/cluster", "--master", "local-cluster[2,1,1024]"),
                          capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert outputs(spark, store) == reference


@pytest.mark.timeout(1500)
@pytest.mark.slow  # the demo SIGKILLed and rerun in subprocesses; SIGKILL mid-commit: test_crash.py
def test_demo_resumes_after_sigkill_with_exactly_the_same_rows(spark, zk_server, tmp_path, reference) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "killed"
    # the killed run's leases stay held for its ZooKeeper session: 6 s instead of the default 20 s
    cmd = demo_cmd(store, zk_server.hosts, "/killed", "--wait", "120", "--zk-session-timeout", "6")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # kill it in the middle of the first stage's batches
        if "window_counter batch 1" in line:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    # the same command again: waits for the dead session's leases, recovers, finishes
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert outputs(spark, store) == reference
    # its summary says its counts are its own (batch 0 was committed before the kill)
    assert f"in this run, of {EVENTS} generated" in again.stdout, again.stdout[-2000:]


@pytest.mark.slow  # about 4 min on a loaded 2-core machine (gc's passes beside the batches); the API-level
@pytest.mark.timeout(1200)  # check is test_gc_complete.py's test_a_running_pipeline_runs_gc_in_the_background
def test_bounded_demo_with_gc_every_2_runs_gc_beside_its_batches(spark, zk_server, tmp_path, reference) -> None:  # type: ignore[no-untyped-def]
    """``deltawheel demo --gc-every 2`` without ``--follow`` (a bounded run of 3 input batches, then
    the later stages): gc's Delta passes run from the pipeline, every 2 batches of any stage, and
    the streams hold exactly the rows of a run without gc. Shown by the command's own lines and by
    the store: an OPTIMIZE in the rows table's history and a checkpoint in the log of a table whose
    few commits Delta would not checkpoint itself (``late_data``, ``dead_letters``)."""
    import re

    from deltawheel.statestore.layout import StoreLayout

    store = tmp_path / "gc_every"
    proc = subprocess.run(demo_cmd(store, zk_server.hosts, "/gc-every", "--gc-every", "2"),
                          capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    said = [ln for ln in lines if "background gc #" in ln]
    batches = [ln for ln in lines if re.search(r"\] \w+ batch \d+: ", ln)]
    print("\n".join(said), f"\n{len(batches)} batches")
    done = [ln for ln in said if re.search(r"background gc #\d+ done in [\d.]+s: compacted \d+ tables", ln)]
    assert done, "\n".join(lines[-40:])
    # the first run starts within the first round, once its batches are counted (not at a round's end)
    first = next(i for i, ln in enumerate(lines) if ln.endswith("background gc #1 started"))
    round0 = next(i for i, ln in enumerate(lines) if "round 0 done:" in ln)
    assert first < round0, "\n".join(lines[:round0 + 1])
    assert not [ln for ln in said if "failed" in ln], said
    assert outputs(spark, store) == reference
    layout = StoreLayout(str(store))
    hist = [r["operation"] for c in list_computations(spark, layout)
            for r in spark.sql(f"DESCRIBE HISTORY delta.`{layout.rows_of(c)}`").select("operation").collect()]
    assert "OPTIMIZE" in hist, hist
    for path in (layout.late_data, layout.dead_letters):
        assert any(".checkpoint." in n for n in os.listdir(os.path.join(path, "_delta_log"))), path


@pytest.mark.slow  # about 60 s quiet; the demo's SIGKILL test keeps its reference in the default suite
@pytest.mark.timeout(1500)
def test_two_concurrent_copies_never_both_write(spark, zk_server, tmp_path, reference) -> None:  # type: ignore[no-untyped-def]
    store = tmp_path / "twice"
    cmd = demo_cmd(store, zk_server.hosts, "/twice", "--wait", "600")
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    logs = [p.communicate(timeout=1400)[0] for p in procs]
    codes = [p.returncode for p in procs]
    # one took the leases and ran; the other waited for them (then found nothing to do) or stopped
    # with a lease error — either way every commit in the log belongs to one owner at a time
    assert all(c == 0 or "LeaseHeldError" in log for c, log in zip(codes, logs, strict=True)), logs
    assert 0 in codes
    assert outputs(spark, store) == reference
    _ = time


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_concurrent_instances_share_the_demo_and_count_every_record_once(spark, zk_server, tmp_path,  # type: ignore[no-untyped-def]
                                                                          reference) -> None:
    """Two job instances of the windowed demo at once on one store: each takes half of every
    computation's intervals, reads the input with its own query, and the first to finish gives
    its intervals to the other (catch-up). Every record is counted once: each (query, window)
    sums to one instance's count. Which panes carry them can differ: the instances' watermark
    is the slower one's, so a record one instance would have put in a late pane can still be on
    time (docs/rescaling.md, "Limits")."""
    store = tmp_path / "instances"
    procs = [subprocess.Popen(demo_cmd(store, zk_server.hosts, "/instances", "--wait", "600", "--instance", name),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for name in ("a", "b")]
    logs = [p.communicate(timeout=1400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [log[-3000:] for log in logs]

    def totals(rows: list[tuple[str, str]]) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for _, kv in rows:
            pane = J.decode(kv.split("|", 1)[1].encode())
            k = (pane["key"], pane["window_start"])
            out[k] = out.get(k, 0) + (-pane["value"] if pane["retraction"] else pane["value"])
        return out

    got = outputs(spark, store)
    assert totals(got["window_counts"]) == totals(reference["window_counts"])
    assert got["predictions"]  # the downstream stages ran on the shared counts


@pytest.mark.timeout(600)
def test_a_later_round_reads_new_input_and_starts_no_query_when_nothing_changed(
        spark, migrated_store, zk_config, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector
    from executor_util import Copier, CopyCounter, state_of
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    folder = tmp_path / "in"
    folder.mkdir()

    def write(n: int, first: int) -> None:
        ids = range(first, first + 50)
        pq.write_table(pa.table({"record_id": [f"r{i}" for i in ids], "key": [f"k{i % 5}" for i in ids],
                                 "event_time": pa.array([1_000 * i for i in ids], pa.timestamp("ms", "UTC"))}),
                       folder / f"part-{n}.parquet")

    write(0, 0)
    started: list[str] = []
    real_start = DataStreamWriter.start

    def counting_start(self, *a, **k):  # type: ignore[no-untyped-def]
        q = real_start(self, *a, **k)
        started.append(q.name)
        return q

    monkeypatch.setattr(DataStreamWriter, "start", counting_start)

    def progress(line: str) -> None:  # a file arrives while the bounded run is going
        if line.startswith("round 0 done"):
            write(1, 50)

    inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="event_time",
                          value_columns=[], record_id_column="record_id", watermark_delay_ms=1_000, max_files_per_trigger=1)
    summary = PipelineRunner(spark, migrated_store, Pipeline("rounds", (inj,), (Copier(), CopyCounter())),
                             zk=zk_config, end_of_input=False, progress=progress).run()
    # round 0 read part-0, round 1 part-1 (its folder changed) and the copies; round 2 started nothing
    assert sum(r.records_in for r in summary.reports["copier"]) == 100
    assert sum(r.records_in for r in summary.reports["copy_counter"]) == 100
    assert state_of(spark, migrated_store, "copy_counter") == {f"k{i}": (20, []) for i in range(5)}
    assert started == ["dw_rounds_copier", "dw_rounds_copy_counter"] * 2


@pytest.mark.timeout(600)
def test_a_second_copy_waits_for_the_first_computations_leases_before_taking_later_ones(
        spark, migrated_store, zk_config, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two copies of a pipeline started at once must not deadlock: a runner takes its
    computations' leases in the pipeline's order, each before the next. Another owner holds the
    first stage's intervals; a runner started then waits for them and takes none of the second
    stage's meanwhile (so the other owner can take those too, as an earlier copy that went first
    would), then runs normally once both are given back."""
    import threading

    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltawheel.executor.drivers.pipeline import Pipeline
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.executor.sources.parquet import ParquetInjector
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager
    from executor_util import Copier, CopyCounter, state_of

    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(pa.table({"record_id": [f"r{i}" for i in range(40)], "key": [f"k{i % 4}" for i in range(40)],
                             "event_time": pa.array([1_000 * i for i in range(40)], pa.timestamp("ms", "UTC"))}),
                   folder / "part-0.parquet")
    layout = migrated_store
    client = connect(zk_config)
    other = LeaseManager(client, pipeline="ordered", owner="the-first-copy")
    other.acquire("copier", range(Copier.num_intervals))
    lines: list[str] = []
    result: dict[str, object] = {}

    def run() -> None:
        inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="event_time",
                              value_columns=[], record_id_column="record_id", watermark_delay_ms=1_000, max_files_per_trigger=1)
        try:
            result["summary"] = PipelineRunner(spark, layout, Pipeline("ordered", (inj,), (Copier(), CopyCounter())),
                                               zk=zk_config, wait_s=120, progress=lines.append).run()
        except BaseException as exc:
            result["error"] = exc

    t = threading.Thread(target=run)
    try:
        t.start()
        deadline = time.monotonic() + 120
        while not any("copier: waiting for leases" in line for line in lines):
            assert time.monotonic() < deadline and t.is_alive(), (lines, result)
            time.sleep(0.1)
        time.sleep(3.0)  # the runner is waiting for the copier's intervals
        # the second stage's intervals are still free: the waiting runner took none of them
        other.acquire("copy_counter", range(CopyCounter.num_intervals), wait_s=0.0)
        other.release("copy_counter", list(range(CopyCounter.num_intervals)))
        other.release("copier", list(range(Copier.num_intervals)))
        t.join(timeout=300)
        assert not t.is_alive() and "error" not in result, (result, lines[-20:])
        assert state_of(spark, layout, "copy_counter") == {f"k{i}": (10, []) for i in range(4)}
    finally:
        other.close()
        client.stop()
        client.close()
        t.join(timeout=60)
