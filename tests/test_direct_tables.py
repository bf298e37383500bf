"""The direct read of a stream-table input (``tasks/image/direct.py``'s ``table_source``) and the
input positions of a stream-table batch without a Spark job (``statestore/delta/sourceoffsets.py``).

Real Spark, Delta and ZooKeeper: the files the offset log and the Delta log name for a batch are
the ones Delta's streaming source read in it (checked against ``input_file_name()`` of the
batch's own rows), the rows the tasks prepare from them are the ones the JVM prepares, and a
two-stage continuous pipeline whose second stage reads its input directly gives every row once,
across a batch that fails after its commit and runs again after the restart.
"""

from __future__ import annotations

import json
import sys
import threading
import types
from typing import Any

import pyarrow as pa
import pytest
from continuous_pipeline import click_rows, closing_row, expected, make, outputs, write_file
from deltawheel.executor.protocol.faults import FaultPoint
from deltawheel.executor.protocol.rescale import shared_input
from deltawheel.executor.tasks.image.direct import DirectBatch, batch_files, direct_table, table_source
from deltawheel.executor.tasks.image.job import ImageTasks
from deltawheel.executor.tasks.input import MALFORMED_CODEC, prepare_input
from deltawheel.statestore.delta.sourceoffsets import add_file_name, batch_adds
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import MAX_KEY_BYTES
from deltawheel.statestore.writepath.streams import ensure_stream_table, stream_schema_ddl
from executor_util import ByRecordKey
from pyspark import cloudpickle

import deltawheel

pytestmark = pytest.mark.spark
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# (record_id, key, codec, timestamp_ms): every check prepare_input makes on a stream table's records
ODD = [("odd-1", "k1", MALFORMED_CODEC, 1_000), ("", "k2", "json", 1_001), ("odd-3", "", "json", 1_002),
       ("odd-4", "\x00nul", "json", 1_003), ("odd-5", "\x00!upstream said no", "json", 1_004),
       ("odd-6", "x" * (MAX_KEY_BYTES + 1), "json", 1_005), ("odd-7", "k3", "json", None),
       ("odd-8", "ключ", None, -1_500), ("odd-9", "k4", "json", 9_000)]


def _append(spark: Any, path: str, tag: str, n: int, *, odd: bool = False, data_change: bool = True) -> None:
    """One commit of ``n`` records (two files) to the stream table at ``path``."""
    rows = [(f"{tag}-{i}", f"k{i % 7}", json.dumps({"n": i}).encode(), "json", 2_000 + 100 * i, None, "test",
             f"{tag}#{i}", 1) for i in range(n)]
    if odd:
        rows += [(rid, key, b'{"odd":1}', codec, ts, None, "test", f"{tag}#{rid}", 1) for rid, key, codec, ts in ODD]
    (spark.createDataFrame(rows, stream_schema_ddl()).repartition(2).write.format("delta")
     .option("dataChange", str(data_change).lower()).mode("append").save(path))


@pytest.mark.timeout(600)
def test_a_batch_reads_the_files_delta_read_and_the_rows_the_jvm_prepares(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Per micro-batch of a Delta streaming query over a stream table: the files the offset log and
    the Delta log name are the files of the batch's rows (several commits in one batch; a rewrite
    without data change left out), the rows the tasks prepare from them are the JVM's, dead
    letters included; the first batch and a version cut by a per-trigger limit are not known
    there (None: the JVM path)."""
    from pyspark.sql import functions as F

    layout = StoreLayout(str(tmp_path / "store"))
    path = ensure_stream_table(spark, layout, "events")
    chk = str(tmp_path / "chk")
    comp = ByRecordKey()
    n = comp.num_intervals
    source = table_source("events", path, checkpoint=chk)
    assert source is not None
    place = tuple((iv, 0) for iv in range(n))
    writer = types.SimpleNamespace(comp=comp, _data_cols=None)  # what ImageTasks._data_columns reads
    seen: dict[int, tuple[set[str], tuple[str, ...] | None]] = {}
    compared: list[int] = []

    def check(batch: Any, batch_id: int) -> None:
        spark_files = {r[0] for r in batch.select(F.regexp_extract(F.input_file_name(), r"([^/]*)$", 1))
                       .distinct().collect()}
        adds = batch_adds(chk, batch_id, path)
        seen[batch_id] = (spark_files, None if adds is None else tuple(add_file_name(a) for a in adds))
        files = batch_files(batch, source, batch_id=batch_id)
        assert (files is None) == (adds is None)
        if files is None:
            return
        wm = 2_500  # some records are behind it
        cols, _keep = ImageTasks._data_columns(writer, place)  # type: ignore[arg-type]
        jvm = prepare_input(batch, comp, wm).select(*cols).toArrow()
        for ivs in ([0, 1, 2, 3], [1, 3], [0]):
            got = direct_table(DirectBatch(source=source, files=files, num_intervals=n, late_before=wm,
                                           tasks=()), ivs)
            assert got.filter(got.column("_m")).column("interval").to_pylist() == ivs
            want = jvm.filter(pa.compute.is_in(jvm.column("interval"), pa.array(ivs, pa.int32())))
            assert [(f.name, str(f.type)) for f in got.schema] == [(f.name, str(f.type)) for f in jvm.schema]
            rows = got.filter(pa.compute.invert(got.column("_m"))).to_pylist()
            assert sorted(rows, key=repr) == sorted(want.to_pylist(), key=repr)
        compared.append(batch_id)

    def run(**options: Any) -> None:
        reader = spark.readStream.format("delta")
        for k, v in options.items():
            reader = reader.option(k, v)
        q = (reader.load(path).withColumn("stream", F.lit("events")).writeStream.foreachBatch(check)
             .trigger(availableNow=True).option("checkpointLocation", chk).start())
        q.awaitTermination()
        assert q.exception() is None

    _append(spark, path, "a", 6)
    run()  # batch 0: the snapshot the query starts from
    _append(spark, path, "b", 8, odd=True)
    _append(spark, path, "c", 5)
    _append(spark, path, "r", 4, data_change=False)  # a rewrite: Delta's source skips it
    run()  # batch 1: two commits (and the rewrite)
    _append(spark, path, "d", 6)
    run(maxFilesPerTrigger=1)  # batches 2 and 3: the version's two files one by one
    _append(spark, path, "e", 3)
    _append(spark, path, "f", 3)
    run()  # batch 4: from the end of a version cut by the limit to two new versions

    assert sorted(seen) == [0, 1, 2, 3, 4]
    assert seen[0][1] is None and seen[2][1] is None and seen[3][1] is None
    for b in (1, 4):
        spark_files, adds = seen[b]
        assert adds is not None and len(adds) == 4 and set(adds) == spark_files, (b, seen[b])
    assert compared == [1, 4]
    # the input positions a commit of a computation reading the table records (replay)
    shared = shared_input(comp, {}, table_of=layout.stream, checkpoint=chk)
    assert shared.table_positions(1) == sorted(f"events/{f}" for f in seen[1][0])
    assert shared.table_positions(2) is None


@pytest.mark.zk
@pytest.mark.timeout(900)
def test_a_second_stage_reading_directly_gives_every_row_once_across_a_failed_batch(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, migrated_at) -> None:
    """Two live stages (``engine.start_pipeline``), the second reading the first's stream table
    directly: its batch 1 fails after its commit (the query ends), the pipeline is started again
    and Spark runs the batch again on the same offsets; both streams end with exactly the rows
    counted here, each once, and the second stage's batches read directly."""
    rows = click_rows(160)
    closing = closing_row(rows)
    folder = tmp_path / "input"
    write_file(folder, "part-0.parquet", rows[:50])
    pipeline = make(str(folder))
    store = tmp_path / "store"
    migrated_at(store)  # a migrated copy: connect migrating a new store runs in test_connect.py
    failed: list[int] = []

    def fail_once(point: FaultPoint, batch_id: int) -> None:
        tick = threading.current_thread().name.startswith("deltawheel-ticks")  # a timers-only batch
        # the first batch after one that read records (stage 2's batch 0 may find its upstream
        # table still empty, depending on how fast stage 1 delivers)
        if point is FaultPoint.AFTER_COMMIT and totals.records_in_total > 0 and not failed and not tick:
            failed.append(batch_id)
            raise RuntimeError(f"injected: batch {batch_id} fails after its commit")

    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks") as engine:
        from test_continuous import wait_for

        run = engine.start_pipeline(pipeline)
        totals = run.executors["minute_totals"]
        totals.faults = fail_once
        wait_for("stage 2 read stage 1's first delivery", lambda: totals.records_in_total > 0, runs=(run,))
        write_file(folder, "part-1.parquet", rows[50:110])
        with pytest.raises(Exception, match=r"minute_totals"):
            wait_for("stage 2's batch failed", lambda: False, runs=(run,), timeout_s=300)
        run.stop()
        assert failed  # batch 1 committed and failed: its report never came
        write_file(folder, "part-2.parquet", rows[110:] + [closing])
        again = engine.start_pipeline(pipeline)
        want_users, want_totals = expected(rows)
        totals = again.executors["minute_totals"]
        wait_for("stage 2 produced every minute's total",
                 lambda: len(outputs(spark, engine.layout)[1]) >= len(want_totals), runs=(again,), poll_s=3.0)
        again.stop()
        got_users, got_totals = outputs(spark, engine.layout)
        assert got_users == want_users
        assert got_totals == want_totals
        reports = list(totals.reports)
        assert reports[0].batch_id == failed[0] and reports[0].direct  # the failed batch ran again first, directly
        assert all(r.direct for r in reports if r.records_in)
