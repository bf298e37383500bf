"""GC passes: dry run changes nothing; apply removes old stream records and compacts."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from deltawheel.gc.passes import run_gc
from deltawheel.statestore.writepath.streams import ensure_stream_table, stream_schema_ddl

pytestmark = pytest.mark.spark


def test_gc_dry_run_then_apply(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """Stream records and rows of the per-batch metrics table (it grows by a row per batch) older
    than their retentions: the dry run counts them and changes nothing, the run applied deletes them
    and compacts every table."""
    from deltawheel.executor.protocol.metrics import BatchMetrics, batch_row, read_batches
    from deltawheel.executor.protocol.reports import BatchReport

    path = ensure_stream_table(spark, migrated_store, "clicks")
    ddl = stream_schema_ddl().replace(" NOT NULL", "")
    for i in range(3):  # three appends: three files
        spark.createDataFrame([(f"r{i}", "k", b"1", "json", 1000 * i, None, "p", "c", 1)], ddl) \
            .write.format("delta").mode("append").save(path)
    # the metrics rows of batches 0, 1 and 2 as the executor writes them, recorded at 0.5, 1 and 3 s
    assert BatchMetrics(spark, migrated_store).append(*(
        batch_row(BatchReport.empty(b, input_watermark_ms=None, low_watermark_ms=None, wall_s=0.1), pipeline="p",
                  computation="c", instance=None, write_path="image", started_ms=0, recorded_ms=ms)
        for b, ms in enumerate((500, 1_000, 3_000))))
    retention = {"stream_retention_ms": 8_500, "metrics_retention_ms": 8_500}  # both cut at 1.5 s
    plan = run_gc(spark, migrated_store, now_ms=10_000, **retention)
    assert not plan.applied
    assert [a.count for a in plan.actions if a.pass_name == "stream_retention"] == [2]
    assert [a.count for a in plan.actions if a.pass_name == "metrics_retention"] == [2]
    assert spark.read.format("delta").load(path).count() == 3  # dry run changed nothing
    assert [r["batch_id"] for r in read_batches(migrated_store)] == [0, 1, 2]
    steps: list[tuple[str, int]] = []
    done = run_gc(spark, migrated_store, now_ms=10_000, apply=True,
                  progress=lambda what, total: steps.append((what, total)), **retention)
    assert any("[done] stream_retention" in line and "2 records" in line for line in done.lines())
    # the cutoff (now 10,000 ms - 8,500 ms) as a time a person reads, with the milliseconds the table holds
    assert any("2 records with timestamp before 1970-01-01 00:00:01 UTC (1500 ms)" in line for line in done.lines())
    # a progress line per pass over a table, the total known from the start
    assert steps and len(steps) == steps[0][1] and "stream retention of clicks" in steps[0][0]
    assert "vacuuming clicks" in [w for w, _ in steps]
    assert sorted(r["record_id"] for r in spark.read.format("delta").load(path).collect()) == ["r2"]
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    assert detail["numFiles"] == 1  # compacted
    assert [r["batch_id"] for r in read_batches(migrated_store)] == [2]
    assert any(a.table == "_metrics/batches" for a in done.actions if a.pass_name == "compact")


def _vacuum_line(report, table: str) -> str:  # type: ignore[no-untyped-def]
    return next(line for line in report.lines() if "vacuum" in line and f" {table}: " in line)


@pytest.mark.slow  # the dry run's plan: test_gc_dry_run_then_apply
def test_gc_dry_run_in_a_young_store_says_nothing_is_old_enough(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    import time

    path = ensure_stream_table(spark, migrated_store, "clicks")
    ddl = stream_schema_ddl().replace(" NOT NULL", "")
    for i in range(3):
        spark.createDataFrame([(f"r{i}", "k", b"1", "json", 1000 * i, None, "p", "c", 1)], ddl) \
            .write.format("delta").mode("append").save(path)
    spark.sql(f"OPTIMIZE delta.`{path}`")  # the three files are unreferenced now, and minutes old
    now = int(time.time() * 1000)
    plan = run_gc(spark, migrated_store, now_ms=now)  # a dry run: one plan serves both tables' lines
    line = _vacuum_line(plan, "clicks")
    n = int(line.split("clicks: ")[1].split()[0])  # the three data files (and their checksum files)
    assert n >= 3
    assert line.endswith(f"clicks: {n} unreferenced files, none older than the retention of 168 h yet: nothing to "
                         "remove now; a gc after they reach it removes them"), line
    later = _vacuum_line(run_gc(spark, migrated_store, now_ms=now + 8 * 24 * 3_600_000), "clicks")
    assert later.endswith(f"clicks: {n} unreferenced files older than the retention of 168 h would be removed"), later
    assert _vacuum_line(plan, "late_data").endswith("no unreferenced files")


# --- gc on an idle store: VACUUM keeps every live file --------------------------------------

EIGHT_DAYS_S = 8 * 24 * 3600


def _age_files(root: str, seconds: int) -> None:
    """Move every file's mtime back (a store nobody wrote for that long)."""
    import os

    for folder, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(folder, f)
            st = os.stat(p)
            os.utime(p, (st.st_atime - seconds, st.st_mtime - seconds))


def _rows(spark, layout) -> list[dict]:  # type: ignore[no-untyped-def]
    """Every computation's rows (each in its own table)."""
    from deltawheel.statestore.rowtable.tables import rows_frame

    frame = rows_frame(spark, layout)
    got = [] if frame is None else [r.asDict(recursive=True) for r in frame.collect()]
    return sorted(got, key=lambda r: (r["computation"], r["key"], r["sequencer"]))


def _rows_by_delta_rs(layout) -> list[tuple]:  # type: ignore[no-untyped-def]
    """Every rows table read without Spark: ``deltalake`` (delta-rs) replays its log, pyarrow reads
    the live files it lists (delta-rs reads no deletion vectors: the test asserts there are none)."""
    import os
    from urllib.parse import unquote

    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from deltawheel.statestore.rowtable.tables import rows_tables

    out = []
    for table in rows_tables(None, layout).values():
        adds = pa.table(DeltaTable(table).get_add_actions(flatten=True)).to_pylist()
        assert not any(v for a in adds for k, v in a.items() if k.startswith("deletionVector")), adds
        for a in adds:
            t = pq.read_table(os.path.join(table, unquote(a["path"])))
            for r in t.to_pylist():
                out.append((a["partition.computation"], int(a["partition.interval"]), r["key"], r["state"],
                            r["sequencer"]))
    return sorted(out)


def _run_phase(spark, layout, zk_config, write_path, batches, wm) -> None:  # type: ignore[no-untyped-def]
    from executor_util import BucketCounter, events, start_executor, stop_executor

    ex, client = start_executor(spark, layout, zk_config, BucketCounter(), write_path=write_path)
    try:
        for b in batches:
            ex(events(spark, [(f"r{b}-{i}", f"q{i % 5}", 1_000 * (10 * b + i)) for i in range(12)]), b)
        ex.flush(input_watermark_ms=wm)
    finally:
        stop_executor(ex, client)


@pytest.mark.zk
@pytest.mark.slow  # ~5 min per write path on a shared 2-core machine; fast cases below
@pytest.mark.parametrize("write_path", ["image", "merge"])
def test_gc_apply_on_idle_store_keeps_live_state(spark, zk_server, tmp_path, write_path) -> None:  # type: ignore[no-untyped-def]
    """A store nobody wrote for 8 days (older than VACUUM's 168 h): ``deltawheel gc --apply``, as a
    user runs it, leaves the rows as they were (Spark and delta-rs read them back), a further run
    works and ends with the rows and outputs of the same runs on a store never gc'ed. (On the image
    path VACUUM deleted every live rows file: their logged paths were URL-quoted.)"""
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from executor_util import state_of, stream_rows

    from deltawheel import migrations
    from deltawheel.cli import main

    outcome = {}
    for name in ("clean", "gcd"):
        layout = StoreLayout(str(tmp_path / name))
        migrations.apply(spark, layout, dry_run=False)
        zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/gc-{write_path}-{name}", session_timeout_s=6.0)
        _run_phase(spark, layout, zk, write_path, range(3), 15_000)
        if name == "gcd":
            before = _rows(spark, layout)
            _age_files(layout.root, EIGHT_DAYS_S)
            assert main(["gc", "--store", layout.root, "--apply"]) == 0
            assert _rows(spark, layout) == before
            assert _rows_by_delta_rs(layout) == sorted(
                (r["computation"], r["interval"], r["key"], r["state"], r["sequencer"]) for r in before)
        _run_phase(spark, layout, zk, write_path, range(3, 5), 1 << 60)
        outcome[name] = (state_of(spark, layout, "buckets"), stream_rows(spark, layout, "counts"))
    assert outcome["clean"][1], "the runs produced nothing: the comparison would prove nothing"
    assert outcome["gcd"] == outcome["clean"]


@pytest.mark.parametrize("old_quoting", [False, pytest.param(True, marks=pytest.mark.slow)])  # True: slow suite (time)
def test_vacuum_keeps_files_the_image_path_wrote(spark, migrated_store, old_quoting, capsys) -> None:  # type: ignore[no-untyped-def]
    """A rows file committed as the image path commits it sits beside a file Delta wrote for the
    same computation, under the same path form; 8 days old and vacuumed with retention 0 (forced:
    ``deltawheel gc --apply --vacuum-retain-hours 0 --force``), both are still read back by Spark and
    by delta-rs. With the URL-quoted path of older versions (``computation%3Dc``), gc re-records it
    first (without that, VACUUM deleted it)."""
    import json
    import re
    from urllib.parse import quote

    import pyarrow as pa
    from deltawheel.statestore.delta.storefs import TableFiles
    from deltawheel.statestore.delta.txn import TableLog, new_add, partition_file_name, write_file
    from deltawheel.statestore.rowtable.frames import arrow_schema
    from deltawheel.statestore.rowtable.rows import ROW_FORMAT_VERSION, rows_file_ddl, rows_schema_ddl
    from deltawheel.statestore.rowtable.tables import ensure_rows_table

    from deltawheel.cli import main

    rows = ensure_rows_table(spark, migrated_store, "c")  # computation c's rows table
    spark.createDataFrame([("c", 0, "by_delta", b"1", "json", [], None, None, [], [], None, 0, None, None,
                            ROW_FORMAT_VERSION, 0)],
                          rows_schema_ddl()).write.format("delta").mode("append").save(rows)
    t = pa.Table.from_pylist([{"key": "by_image", "state": b"2", "codec": "json", "timers": [], "record_ids": [],
                               "pending": [], "sequencer": 0, "format_version": ROW_FORMAT_VERSION, "timer_seq": 0}],
                              schema=arrow_schema(rows_file_ddl()))
    rel = partition_file_name("c", 1, "dw")
    add = json.loads(new_add(rel, {"computation": "c", "interval": "1"}, write_file(t, TableFiles(rows), rel), 1))
    if old_quoting:
        add["add"]["path"] = quote(rel)
    TableLog(spark, rows).commit(add=[json.dumps(add)])
    logged = sorted(r["path"] for r in _live_paths(migrated_store))
    assert [p.rsplit("/", 1)[0] for p in logged] == (
        ["computation%3Dc/interval%3D1", "computation=c/interval=0"] if old_quoting
        else ["computation=c/interval=0", "computation=c/interval=1"])
    stray = Path(rows) / "computation=c" / "interval=1" / "stray.parquet"  # unreferenced: VACUUM has work
    stray.write_bytes(b"x")
    _age_files(migrated_store.root, EIGHT_DAYS_S)
    # as a user runs it, the store's own ZooKeeper started for the ZooKeeper passes
    assert main(["gc", "--store", migrated_store.root, "--apply", "--vacuum-retain-hours", "0", "--force"]) == 0
    out = capsys.readouterr().out
    assert "vacuumed files older than 0 h" in out and not stray.exists(), out
    assert re.findall(r"\[done\] paths +computations/c/rows: (\d+) live files recorded under URL-quoted paths", out) == (
        ["1"] if old_quoting else []), out
    want = [("c", 0, "by_delta", b"1", 0), ("c", 1, "by_image", b"2", 0)]
    got = sorted((r["computation"], r["interval"], r["key"], bytes(r["state"]), r["sequencer"])
                 for r in spark.read.format("delta").load(rows).collect())
    assert got == want
    assert _rows_by_delta_rs(migrated_store) == want


def _live_paths(layout) -> list[dict]:  # type: ignore[no-untyped-def]
    import pyarrow as pa
    from deltalake import DeltaTable

    return pa.table(DeltaTable(layout.rows_of("c")).get_add_actions(flatten=True)).select(["path"]).to_pylist()


def test_gc_refuses_a_retention_below_deltas_minimum(spark, migrated_store, capsys) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.gc.passes import VacuumRetentionError

    from deltawheel.cli import main

    with pytest.raises(VacuumRetentionError, match=r"retention 0 h is shorter than Delta's safety minimum of 168 h"):
        run_gc(spark, migrated_store, now_ms=0, apply=True, vacuum_retain_hours=0)
    with pytest.raises(VacuumRetentionError, match=r"must be >= 0 hours"):
        run_gc(spark, migrated_store, now_ms=0, apply=True, vacuum_retain_hours=-1, force=True)
    assert main(["gc", "--store", migrated_store.root, "--apply", "--vacuum-retain-hours", "24"]) == 3
    assert "VacuumRetentionError" in capsys.readouterr().err
    # with --force it runs: test_vacuum_keeps_files_the_image_path_wrote


def test_gc_refuses_a_negative_metrics_retention(migrated_store, capsys) -> None:  # type: ignore[no-untyped-def]
    """The command line refuses a retention below 0 h before touching anything (the metrics pass
    itself: test_gc_dry_run_then_apply)."""
    from deltawheel.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["gc", "--store", migrated_store.root, "--metrics-retention-hours", "-1"])
    assert exit_.value.code == 2
    assert "must be >= 0 hours, got -1" in capsys.readouterr().err


def test_gc_takes_inf_as_keep_all_and_as_a_bound_to_hold(spark, migrated_store, capsys) -> None:  # type: ignore[no-untyped-def]
    """'inf' for a retention keeps everything (a dry run plans no deletion); as --keep-replay-hours it is a
    horizon no finite retention meets: a typed refusal, not a crash."""
    from deltawheel.gc.exceptions import ReplayHorizonError
    from deltawheel.statestore.exceptions import exit_code

    from deltawheel.cli import main

    assert main(["gc", "--store", migrated_store.root, "--skip-zk", "--stream-retention-hours", "inf",
                 "--log-retention-hours", "inf", "--late-data-retention-hours", "inf"]) == 0
    out = capsys.readouterr().out
    assert "stream_retention" not in out and "log files before version" not in out, out
    assert main(["gc", "--store", migrated_store.root, "--skip-zk", "--keep-replay-hours", "inf"]) == \
        exit_code(ReplayHorizonError("x"))
    assert "ReplayHorizonError" in capsys.readouterr().err


def test_a_commit_conflict_is_told_apart_from_other_failures() -> None:
    """gc's compaction plans again after Delta refused it for a concurrent commit (a batch removing
    files it read); any other failure is raised."""
    from deltawheel.statestore.rowtable.fencing import is_conflict

    assert is_conflict(RuntimeError("io.delta.exceptions.ConcurrentDeleteReadException: This transaction "
                                    "attempted to read one or more files that were deleted"))
    assert is_conflict(RuntimeError("[DELTA_CONCURRENT_APPEND] Files were added"))
    assert not is_conflict(RuntimeError("java.io.FileNotFoundException: part-0001.parquet"))


def test_a_maintenance_write_losing_to_batches_tries_again_and_any_other_failure_is_raised_at_once() -> None:
    """gc's OPTIMIZE, deletes and retention MERGE beside a running pipeline: a write refused for a
    concurrent commit runs again (with a growing wait) until it lands or its attempts are spent."""
    from deltawheel.statestore.rowtable.fencing import on_conflict_again

    calls: list[int] = []

    def loses(times: int, error: str) -> Callable[[], int]:
        def write() -> int:
            calls.append(1)
            if len(calls) <= times:
                raise RuntimeError(error)
            return len(calls)
        return write

    conflict = "io.delta.exceptions.ConcurrentDeleteReadException: files were deleted"
    assert on_conflict_again(loses(4, conflict), first_wait_s=0.001) == 5
    calls.clear()
    with pytest.raises(RuntimeError, match="ConcurrentDeleteRead"):
        on_conflict_again(loses(99, conflict), attempts=3, first_wait_s=0.001)
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(RuntimeError, match="FileNotFound"):
        on_conflict_again(loses(99, "java.io.FileNotFoundException: part-0001.parquet"), first_wait_s=0.001)
    assert len(calls) == 1
