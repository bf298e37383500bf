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
from deltawheel.statestore.delta.maintenance import checkpointer
from deltawheel.statestore.delta.txn import TableLog, new_add
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


def _checkpoints(path: str) -> set[str]:
    return {n for n in os.listdir(os.path.join(path, "_delta_log")) if ".checkpoint." in n and not n.startswith(".")}


def _newest(path: str) -> int:
    cp, _ok = newest_checkpoint(os.listdir(os.path.join(path, "_delta_log")))
    return -1 if cp is None else cp.version


def _readers_agree(spark: Any, path: str) -> int:
    """Python's log replay and Delta's snapshot name the same version, files and app versions;
    returns the version."""
    jv, jfiles = TableLog(spark, path).files("true")  # no `where`: Delta's snapshot
    pv, pfiles = TableLog(spark, path).files("true", where=lambda pv: True)
    assert pv == jv
    assert {(f.path, f.size) for f in pfiles} == {(f.path, f.size) for f in jfiles}
    snap = read_snapshot(path)
    assert snap is not None and snap.version == jv
    log = TableLog(spark, path)._log  # noqa: SLF001 - Delta's own view of the app versions
    txn = log.startTransaction()
    assert {a: int(txn.txnVersion(a)) for a in snap.txns} == snap.txns
    return int(jv)


def test_the_rows_commit_writes_no_checkpoint_and_the_background_one_is_read_exactly(
        spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """100 commits to the rows table (Delta used to checkpoint inside the one making version 100):
    while the background thread is held, none of them leaves a checkpoint; released, it writes one
    of a version this process committed. A checkpoint cut short (Delta's hidden temporary file, as a
    killed process leaves it) is ignored by both readers."""
    rows = migrated_store.rows
    cp = checkpointer(spark)
    assert cp.idle(120)
    before = _checkpoints(rows)
    log = TableLog(spark, rows)
    with cp.hold():
        for i in range(100):
            pv = {"computation": "t", "interval": str(i % 2)}
            v = log.commit(add=[new_add(f"computation=t/interval={i % 2}/part-{i}.snappy.parquet", pv, 100, 1)],
                           app_versions={"ckpt-test": i})
            assert _checkpoints(rows) == before, f"the commit of version {v} wrote a checkpoint"
    assert v is not None and v >= 100
    assert cp.idle(300)
    assert _newest(rows) == v  # the newest version, which this process committed
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


@pytest.mark.parametrize("write_path", ["image", "merge"])
def test_batches_leave_log_checkpoints_to_the_background_on_both_write_paths(
        spark, migrated_store, zk_config, write_path: str) -> None:  # type: ignore[no-untyped-def]
    """Batches commit rows and deliver productions; with checkpoints due every 3 versions, the
    commits write none, the background thread then checkpoints the rows and the stream table, and
    both readers (and the data) stay exact before and after a later batch."""
    cp = checkpointer(spark)
    every, cp.every = cp.every, 3
    ex, client = start_executor(spark, migrated_store, zk_config, Tally(), write_path=write_path)
    rows, stream = migrated_store.rows, migrated_store.stream("tallies")
    try:
        assert cp.idle(120)
        before = (_checkpoints(rows), _checkpoints(stream))
        with cp.hold():
            for b in range(4):
                ex.run_batch(_frame(spark, b), b)
                ex.settle()
                assert (_checkpoints(rows), _checkpoints(stream)) == before, f"batch {b} wrote a checkpoint"
        assert cp.idle(300)
        for path in (rows, stream):
            newest = _newest(path)
            assert newest >= 3 and _checkpoints(path) != before[path == stream]
            assert _readers_agree(spark, path) >= newest
        ex.run_batch(_frame(spark, 4), 4)
        ex.settle()
        assert cp.idle(300)
        for path in (rows, stream):
            _readers_agree(spark, path)
        out = spark.read.format("delta").load(stream).collect()
        assert len(out) == len({r["record_id"] for r in out}) == 20  # every record once
        finals: dict[str, int] = {}
        for r in out:
            finals[r["key"]] = max(finals.get(r["key"], 0), json.loads(r["value"])["n"])
        assert finals == {"k0": 10, "k1": 5, "k2": 5}
    finally:
        cp.every = every
        stop_executor(ex, client)
