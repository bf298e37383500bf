"""Delta log checkpoints of the store's tables are written by a background thread of the driver,
not inside the commits (``statestore/delta/maintenance.py``), and the readers (Python's and
Delta's) read exact snapshots across them, on both write paths."""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.computation import RECORD_KEY, Computation
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.delta.checkpoints import newest_checkpoint
from deltawheel.statestore.delta.log import read_snapshot
from deltawheel.statestore.delta.maintenance import REST, checkpointer
from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.delta.txn import TableLog, new_add
from deltawheel.statestore.rowtable.tables import ensure_rows_table
from deltawheel.statestore.writepath.streams import stream_schema_ddl
from executor_util import start_executor, stop_executor
from pyspark import cloudpickle

pytestmark = [pytest.mark.spark, pytest.mark.zk]

J = get_codec("json")
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Tally(Computation):
    """A running count per key, produced for every record (as the latency benchmark's)."""

    name = "tally"
    inputs = {"events": RECORD_KEY}
    outputs = ("tallies",)
    num_intervals = 2

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("tallies", {"n": ctx.state}, timestamp_ms=record.timestamp_ms)


def _frame(spark: Any, batch: int) -> Any:
    rows = [{"record_id": f"b{batch}-{i}", "key": f"k{i % 3}", "value": J.encode({}), "codec": "json",
             "timestamp_ms": 1_000 * batch + i, "event_time": None, "producer": "test",
             "commit_id": f"pos-{batch}-{i}", "format_version": 1} for i in range(4)]
    return spark.createDataFrame(rows, schema=stream_schema_ddl().replace(" NOT NULL", ""))


def _log_names(spark: Any, path: str) -> list[str]:
    return _files(spark, path).sub("_delta_log").listdir() or []


def _checkpoints(spark: Any, path: str) -> set[str]:
    return {n for n in _log_names(spark, path) if ".checkpoint." in n and not n.startswith(".")}


def _newest(spark: Any, path: str) -> int:
    cp, _ok = newest_checkpoint(_log_names(spark, path))
    return -1 if cp is None else cp.version


def _files(spark: Any, path: str) -> Any:
    """The table's files as Python reaches them (a local folder, or ``s3a://``)."""
    files = table_files(spark, path)
    assert files is not None
    return files


def _readers_agree(spark: Any, path: str) -> int:
    """Python's log replay and Delta's snapshot name the same version, files and app versions;
    returns the version."""
    jv, jfiles = TableLog(spark, path).files("true")  # no `where`: Delta's snapshot
    pv, pfiles = TableLog(spark, path).files("true", where=lambda pv: True)
    assert pv == jv
    assert {(f.path, f.size) for f in pfiles} == {(f.path, f.size) for f in jfiles}
    snap = read_snapshot(_files(spark, path))
    assert snap is not None and snap.version == jv
    log = TableLog(spark, path)._log  # Delta's own view of the app versions
    txn = log.startTransaction()
    assert {a: int(txn.txnVersion(a)) for a in snap.txns} == snap.txns
    return int(jv)


def test_the_rows_commit_writes_no_checkpoint_and_the_background_one_is_read_exactly(
        spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """100 commits to the rows table (Delta used to checkpoint inside the one making version 100):
    while the background thread is held, none of them leaves a checkpoint; released, it writes one
    of a version this process committed. A checkpoint cut short (Delta's hidden temporary file, as a
    killed process leaves it) is ignored by both readers."""
    rows = ensure_rows_table(spark, migrated_store, "ckpt")
    cp = checkpointer(spark)
    assert cp.idle(120)
    before = _checkpoints(spark, rows)
    log = TableLog(spark, rows)
    with cp.hold():
        for i in range(100):
            pv = {"computation": "t", "interval": str(i % 2)}
            v = log.commit(add=[new_add(f"computation=t/interval={i % 2}/part-{i}.snappy.parquet", pv, 100, 1)],
                           app_versions={"ckpt-test": i})
            assert _checkpoints(spark, rows) == before, f"the commit of version {v} wrote a checkpoint"
    assert v is not None and v >= 100
    assert cp.idle(300)
    assert _newest(spark, rows) == v  # the newest version, which this process committed
    assert _readers_agree(spark, rows) == v
    snap = read_snapshot(rows)
    assert snap is not None and snap.txns["ckpt-test"] == 99 and snap.bounded  # read from the checkpoint

    # a checkpoint of a newer version cut short: Delta's temporary name, half its bytes
    log.commit(app_versions={"ckpt-test": 100})
    src = Path(rows, "_delta_log", f"{v:020d}.checkpoint.parquet")
    half = src.read_bytes()[: src.stat().st_size // 2]
    Path(rows, "_delta_log", f".{v + 1:020d}.checkpoint.parquet.{uuid.uuid4()}.tmp").write_bytes(half)
    assert _readers_agree(spark, rows) == v + 1
    after = read_snapshot(rows)
    assert after is not None and after.txns["ckpt-test"] == 100


@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])  # merge: slow suite (time)
def test_batches_leave_log_checkpoints_to_the_background_on_both_write_paths(
        spark, migrated_store, zk_config, write_path: str) -> None:  # type: ignore[no-untyped-def]
    """Batches commit rows and deliver productions; with checkpoints due every 3 versions, the
    commits write none, the background thread then checkpoints the rows and the stream table, and
    both readers (and the data) stay exact before and after a later batch."""
    cp = checkpointer(spark)
    every, cp.every = cp.every, 3
    ex, client = start_executor(spark, migrated_store, zk_config, Tally(), write_path=write_path)
    rows, stream = migrated_store.rows_of(Tally.name), migrated_store.stream("tallies")
    try:
        assert cp.idle(120)
        before = (_checkpoints(spark, rows), _checkpoints(spark, stream))
        written = len(cp.written)
        with cp.hold():
            for b in range(3):
                ex.run_batch(_frame(spark, b), b)
                ex.settle()
                assert (_checkpoints(spark, rows), _checkpoints(spark, stream)) == before, f"batch {b} wrote a checkpoint"
        assert cp.idle(300)
        for path in (rows, stream):
            newest = _newest(spark, path)
            assert newest >= 3 and _checkpoints(spark, path) != before[path == stream]
            assert _readers_agree(spark, path) >= newest
        # the two were due together: the second started REST times the first's duration after it ended
        first, second = cp.written[written:written + 2]
        assert second.ended - second.seconds - first.ended >= REST * first.seconds * 0.99, (first, second)
        ex.run_batch(_frame(spark, 3), 3)
        ex.settle()
        assert cp.idle(300)
        for path in (rows, stream):
            _readers_agree(spark, path)
        out = spark.read.format("delta").load(stream).collect()
        assert len(out) == len({r["record_id"] for r in out}) == 16  # every record once
        finals: dict[str, int] = {}
        for r in out:
            finals[r["key"]] = max(finals.get(r["key"], 0), json.loads(r["value"])["n"])
        assert finals == {"k0": 8, "k1": 4, "k2": 4}
    finally:
        cp.every = every
        stop_executor(ex, client)


@pytest.mark.objectstore
def test_on_the_object_store_too(spark, migrated_s3_store) -> None:  # type: ignore[no-untyped-def]
    """On ``s3a://`` (Delta writes the checkpoint in place, one upload: the log store says partial
    writes are not visible) the commits write none and the background thread writes it."""
    rows = ensure_rows_table(spark, migrated_s3_store, "ckpt")
    cp = checkpointer(spark)
    every, cp.every = cp.every, 3
    try:
        assert cp.idle(120)
        before = _checkpoints(spark, rows)
        log = TableLog(spark, rows)
        with cp.hold():
            for i in range(4):
                v = log.commit(app_versions={"ckpt-s3": i})
                assert _checkpoints(spark, rows) == before, f"the commit of version {v} wrote a checkpoint"
        assert cp.idle(300)
        assert _newest(spark, rows) == v
        assert _readers_agree(spark, rows) == v
    finally:
        cp.every = every


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_during_a_background_checkpoint_leaves_the_table_readable(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A writer process whose log is checkpointed after every commit is killed (SIGKILL, its JVM
    too) the moment one of Delta's temporary checkpoint files is seen: no checkpoint file that is
    listed is partial, and both readers read the newest commit exactly."""
    import signal
    import subprocess
    import time

    import pyarrow.parquet as pq

    path = str(tmp_path / "t")
    writer = Path(__file__).with_name("ckpt_writer.py")
    proc = subprocess.Popen([sys.executable, str(writer), path], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    log_dir = Path(path, "_delta_log")
    seen_tmp = None
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 300
        for line in proc.stdout:  # until a few commits and a checkpoint are there
            assert time.monotonic() < deadline, "writer made no progress"
            if int(line.split()[1]) >= 5 and any(n.endswith(".checkpoint.parquet") for n in os.listdir(log_dir)):
                break
        until = time.monotonic() + 120
        while seen_tmp is None and time.monotonic() < until:
            seen_tmp = next((n for n in os.listdir(log_dir) if n.startswith(".") and ".checkpoint." in n
                             and n.endswith(".tmp")), None)
            if seen_tmp is None:
                time.sleep(0.001)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert seen_tmp is not None, "no checkpoint was seen being written in 2 minutes"
    print(f"killed while {seen_tmp} was being written; left: "
          f"{sorted(n for n in os.listdir(log_dir) if n.endswith('.tmp'))}")
    for name in os.listdir(log_dir):  # every checkpoint a reader lists is whole
        if name.endswith(".checkpoint.parquet"):
            assert pq.ParquetFile(log_dir / name).metadata.num_rows > 0, name
    newest_json = max(int(n.split(".")[0]) for n in os.listdir(log_dir) if n.endswith(".json") and n[0] != ".")
    assert _readers_agree(spark, path) == newest_json


def test_the_thread_warms_the_checkpoint_path_once_after_the_first_commits(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A process's first checkpoint is the slow one (Spark's code generation): after WARM_AFTER noted
    commits the thread checkpoints a scratch table once, and leaves no folder of it behind."""
    import tempfile

    from deltawheel.statestore.delta.maintenance import WARM_AFTER, LogCheckpointer

    cp = LogCheckpointer(spark)  # not the session's: its count of notes starts here
    path = str(tmp_path / "not-a-table")  # far below its interval: nothing to checkpoint there
    before = {p.name for p in Path(tempfile.gettempdir()).glob("deltawheel-warm-checkpoint-*")}
    for i in range(WARM_AFTER - 1):
        cp.committed(path, i)
    assert cp.idle(60) and cp.warmed_s is None
    cp.committed(path, WARM_AFTER)
    assert cp.idle(300) and cp.warmed_s is not None and cp.warmed_s > 0, cp.failures
    for i in range(WARM_AFTER + 1, 3 * WARM_AFTER):
        cp.committed(path, i)
    assert cp.idle(60)
    assert {p.name for p in Path(tempfile.gettempdir()).glob("deltawheel-warm-checkpoint-*")} == before
    assert cp.failures == [] and cp.written == []
