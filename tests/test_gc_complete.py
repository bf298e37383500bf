"""gc's passes beyond compact and vacuum: Delta log checkpoints and cleanup, the replay horizon its
retentions leave (and the refusal to cut below one the user keeps), the ZooKeeper nodes of gone
instances and of finished replays."""

from __future__ import annotations

import json
import os
import re

import pytest
from deltawheel.gc.passes import ReplayHorizonError, run_gc
from deltawheel.statestore.writepath.streams import ensure_stream_table, stream_schema_ddl

pytestmark = pytest.mark.spark


def _append(spark, path: str, n: int) -> None:  # type: ignore[no-untyped-def]
    ddl = stream_schema_ddl().replace(" NOT NULL", "")
    for i in range(n):  # a commit each
        spark.createDataFrame([(f"r{i}", "k", b"1", "json", 1000 * i, None, "p", "c", 1)], ddl) \
            .write.format("delta").mode("append").save(path)


def _log_entries(path: str) -> int:
    return sum(1 for n in os.listdir(os.path.join(path, "_delta_log")) if n[:20].isdigit())


def test_gc_checkpoints_and_cleans_the_delta_log(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """With --log-retention-hours 0 on an idle store, gc checkpoints each table and deletes the
    log files before that checkpoint: the stream table's log shrinks to the checkpoint and its
    commit, its rows read back the same, and versions before the checkpoint can no longer be read
    (the replay horizon the report names)."""
    import time

    path = ensure_stream_table(spark, migrated_store, "clicks")
    _append(spark, path, 3)
    before = _log_entries(path)
    rows = sorted(r["record_id"] for r in spark.read.format("delta").load(path).collect())
    plan = run_gc(spark, migrated_store, now_ms=int(time.time() * 1000) + 1000, log_retention_ms=0)
    assert _log_entries(path) == before  # a dry run
    assert [a for a in plan.actions if a.pass_name == "log" and a.table == "clicks"]
    done = run_gc(spark, migrated_store, now_ms=int(time.time() * 1000) + 1000, apply=True,
                  vacuum_retain_hours=0, force=True, log_retention_ms=0)
    cleaned = next(a for a in done.actions if a.pass_name == "log" and a.table == "clicks")
    assert cleaned.count and cleaned.count > 0, cleaned
    after = _log_entries(path)
    assert after < before and after <= 3, (before, after, sorted(os.listdir(os.path.join(path, "_delta_log"))))
    assert sorted(r["record_id"] for r in spark.read.format("delta").load(path).collect()) == rows
    with pytest.raises(Exception, match=r"(?i)version|log|checkpoint"):  # time travel below the horizon
        spark.read.format("delta").option("versionAsOf", 1).load(path).collect()
    horizon = next(a for a in done.actions if a.pass_name == "replay_horizon")
    assert "0 h back" in horizon.detail, horizon


def test_gc_refuses_a_retention_below_the_replay_horizon_kept(spark, migrated_store, capsys) -> None:  # type: ignore[no-untyped-def]
    """A retention shorter than --keep-replay-hours is refused before anything changes, from the
    API and the command line."""
    import time

    from deltawheel.cli import main

    path = ensure_stream_table(spark, migrated_store, "clicks")
    _append(spark, path, 3)
    before = (_log_entries(path), spark.read.format("delta").load(path).count())
    now = int(time.time() * 1000) + 10_000
    with pytest.raises(ReplayHorizonError, match=r"--stream-retention-hours 0.5 would cut below the replay "
                                                 r"horizon of 2 h asked for"):
        run_gc(spark, migrated_store, now_ms=now, apply=True, stream_retention_ms=1_800_000,
               keep_replay_ms=7_200_000)
    with pytest.raises(ReplayHorizonError, match=r"--vacuum-retain-hours 1, --log-retention-hours 0 would cut"):
        run_gc(spark, migrated_store, now_ms=now, apply=True, vacuum_retain_hours=1, force=True,
               log_retention_ms=0, keep_replay_ms=7_200_000)
    assert (_log_entries(path), spark.read.format("delta").load(path).count()) == before  # nothing changed
    assert main(["gc", "--store", migrated_store.root, "--apply", "--skip-zk", "--log-retention-hours", "1",
                 "--keep-replay-hours", "24"]) == 3
    assert "ReplayHorizonError" in capsys.readouterr().err
    assert (_log_entries(path), spark.read.format("delta").load(path).count()) == before
    # a retention that keeps the horizon passes: test_gc_deletes_znodes_of_gone_instances_and_finished_replays


# --- ZooKeeper ---------------------------------------------------------------------------------


@pytest.mark.zk
def test_gc_deletes_znodes_of_gone_instances_and_finished_replays(spark, migrated_store, zk_config,
                                                                 tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Instances' estimates of an injector outlive the instances; replays with the live ZooKeeper
    leave a chroot each. ``deltawheel gc --apply`` deletes the estimates of gone instances that
    hold no watermark back (a gone one whose interval no later owner caught up on stays, as do a
    live member's and another store's), and the chroot of a replay whose shadow store is gone
    (one whose store is still there stays); the injector's watermark is unchanged. The plan keeps a
    replay horizon (--keep-replay-hours) its retentions leave, and names it."""
    from dataclasses import replace

    from deltawheel.statestore.delta.txn import TableLog
    from deltawheel.statestore.rowtable.tables import ensure_rows_table
    from deltawheel.statestore.zk.binding import bind_store
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.members import Membership
    from deltawheel.statestore.zk.watermarks import WatermarkAuthority

    from deltawheel.cli import main

    table_id = TableLog(spark, migrated_store.rows).table_id()
    ensure_rows_table(spark, migrated_store, "c")  # computation c's rows table: its replay horizon
    client = connect(zk_config)
    root = connect(replace(zk_config, chroot="/"))
    try:
        bind_store(client, "p", table_id=table_id, root=migrated_store.root)
        bind_store(client, "other", table_id="another-store", root=str(tmp_path / "elsewhere"))
        auth = WatermarkAuthority(client, pipeline="p")
        other = WatermarkAuthority(client, pipeline="other")
        Membership(client, pipeline="p", instance="live").join()
        auth.publish_instance_injector("src", "live", 5_000, held={"c": {0: 9}})
        auth.publish_instance_injector("src", "handing", 4_000, held={"c": {1: 5}})  # nobody caught up on 1
        auth.publish_instance_injector("src", "caught", 3_000, held={"c": {2: 3}})
        auth.publish_instance_injector("src", "idle", 2_000, held={})
        auth.record_caught_up("c", {2: 4})  # a later owner of interval 2 caught up
        other.publish_instance_injector("src", "gone", 1_000, held={})
        wm = auth.injector_watermark("src")
        base = "/pipelines/p/watermarks/instances/src"
        for name, store in (("gone", str(tmp_path / "deleted-shadow")), ("kept", migrated_store.root)):
            shadow = f"{zk_config.chroot}-replay-{name}"
            root.create(f"{shadow}/pipelines/p/store", b'{"format_version": 1, "root": "%s", "rows_table_id": "x"}'
                        % store.encode(), makepath=True)
        args = ["gc", "--store", migrated_store.root, "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
        assert main([*args, "--keep-replay-hours", "24"]) == 0  # the plan
        out = capsys.readouterr().out
        assert "replay_horizon   computations/c/rows: replay can start from versions committed after" in out, out
        assert "(168 h back): the oldest is version 0" in out, out
        assert "[plan] zk_instances     zk:/pipelines/p: would delete 2 estimates of gone instances" in out, out
        assert "would delete 1 chroots of replays whose shadow store is gone" in out, out
        assert sorted(client.get_children(base)) == ["caught", "handing", "idle", "live"]
        assert main([*args, "--apply"]) == 0
        out = capsys.readouterr().out
        assert "[done] zk_instances     zk:/pipelines/p: deleted 2 estimates" in out, out
        assert sorted(client.get_children(base)) == ["handing", "live"]
        assert client.get_children("/pipelines/other/watermarks/instances/src") == ["gone"]
        assert root.exists(f"{zk_config.chroot}-replay-gone") is None
        assert root.exists(f"{zk_config.chroot}-replay-kept") is not None
        assert auth.injector_watermark("src") == wm
    finally:
        client.stop()
        client.close()
        root.stop()
        root.close()


# --- gc from a running pipeline ----------------------------------------------------------------


def test_background_gc_refuses_bad_settings(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.gc.background import BackgroundGc
    from deltawheel.statestore.exceptions import ConfigError

    with pytest.raises(ConfigError, match=r"needs every_batches or every_s"):
        BackgroundGc(spark, migrated_store)
    with pytest.raises(ConfigError, match=r"every N > 0 batches or S > 0 seconds, got every_batches=0"):
        BackgroundGc(spark, migrated_store, every_batches=0)
    with pytest.raises(ConfigError, match=r"keeps VACUUM's safety minimum of 168 h \(got 24 h\)"):
        BackgroundGc(spark, migrated_store, every_batches=1, vacuum_retain_hours=24)
    with pytest.raises(ReplayHorizonError, match=r"--vacuum-retain-hours 168 would cut below the replay horizon"):
        BackgroundGc(spark, migrated_store, every_batches=1, keep_replay_ms=200 * 3_600_000)


@pytest.mark.zk
def test_a_running_pipeline_runs_gc_in_the_background(spark, migrated_store, zk_server,
                                                      tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``engine.run_pipeline(pipeline, background_gc=BackgroundGc(..., every_batches=2))``, as a user
    writes it, a bounded run of three batches (one file each) in one round: gc's passes run beside
    the batches, every 2 of them (the metrics table pruned, every table compacted, the logs
    checkpointed) and the pipeline's output is the count made without deltawheel."""
    from collections import Counter

    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltawheel.gc.background import BackgroundGc
    from deltawheel.statestore.layout import StoreLayout
    from executor_util import BucketCounter, stream_rows

    import deltawheel

    folder = tmp_path / "input"
    folder.mkdir()
    rows = [{"q": f"q{i % 4}", "ts": 1_000 * i} for i in range(60)]
    for part in range(3):
        pq.write_table(pa.Table.from_pylist(rows[part * 20:(part + 1) * 20]), folder / f"part-{part}.parquet")
    # a migrated copy: connect on a new store (migrated at the start) runs in test_connect.py
    store = migrated_store.root
    events = deltawheel.ParquetInjector("events", str(folder), key_column="q", event_time_column="ts",
                                        watermark_delay_ms=0, max_files_per_trigger=1)
    pipeline = deltawheel.Pipeline("bg", injectors=(events,), computations=(BucketCounter(),))
    background = BackgroundGc(spark, StoreLayout(store), every_batches=2, metrics_retention_ms=0)
    said: list[str] = []
    with deltawheel.connect(spark, store=store, zk=zk_server.hosts, zk_chroot="/bg-gc", pipeline="bg") as engine:
        summary = engine.run_pipeline(pipeline, background_gc=background, progress=said.append)
    assert [r.records_in for r in summary.reports["buckets"] if r.records_in] == [20, 20, 20]
    # counted per batch: the first run starts after the second batch, before the round ends
    assert [ln for ln in said if ln == "background gc #1 started" or ln.startswith("round 0 done")] == [
        "background gc #1 started", next(ln for ln in said if ln.startswith("round 0 done"))], said
    assert not background.running and not background.failures, background.failures
    assert background.reports, "no background gc ran"
    lines = [line for r in background.reports for line in r.lines()]
    assert any(line.startswith("[done] compact") and " rows: " in line for line in lines), lines
    assert any(line.startswith("[done] log") for line in lines), lines
    want = Counter((r["q"], r["ts"] - r["ts"] % 10_000) for r in rows)
    got: Counter[tuple[str, int]] = Counter()
    for _rid, _key, value, _ts in stream_rows(spark, StoreLayout(store), "counts"):
        v = json.loads(value)
        got[(v["q"], v["start"])] += v["n"]
    assert got == want


@pytest.mark.objectstore
@pytest.mark.zk
@pytest.mark.slow  # the object-store set; the log cleanup: test_gc_checkpoints_and_cleans_the_delta_log
def test_gc_cleans_the_delta_log_of_an_object_store(spark, migrated_s3_store, zk_server, capsys) -> None:  # type: ignore[no-untyped-def]
    """``deltawheel gc --apply --log-retention-hours 0`` on an ``s3a://`` store (the real S3Proxy),
    as docs/operations.md shows it: each table's log is checkpointed and the log files before the
    checkpoint are deleted from the bucket; the rows read back the same, and a version before the
    checkpoint can no longer be read."""
    import time

    from deltawheel.gc.logs import log_entries, log_files

    from deltawheel.cli import main

    path = ensure_stream_table(spark, migrated_s3_store, "clicks")
    _append(spark, path, 6)
    # the last commit's checksum goes up in the background (docs/objectstore.md): wait for it, or the
    # dry run below sees one more log file than was counted
    newest = int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["version"])
    deadline = time.monotonic() + 60
    while f"{newest:020d}.crc" not in (log_files(path, spark).listdir() or []) and time.monotonic() < deadline:
        time.sleep(0.1)
    before = log_entries(path, spark)
    assert before >= 7, before
    rows = sorted(r["record_id"] for r in spark.read.format("delta").load(path).collect())
    time.sleep(1.5)  # the commits' Last-Modified (whole seconds on S3Proxy) before the gc's "now"
    # the ZooKeeper that arbitrates the store's commits (the session's log store: conftest's s3_bucket)
    zk = ["--skip-zk", "--zk", zk_server.hosts, "--zk-chroot", "/deltawheel-tests-logstore"]
    assert main(["gc", "--store", migrated_s3_store.root, "--log-retention-hours", "0", *zk]) == 0  # a dry run
    assert log_entries(path, spark) == before
    assert main(["gc", "--store", migrated_s3_store.root, "--apply", "--log-retention-hours", "0",
                 "--vacuum-retain-hours", "0", "--force", *zk]) == 0
    out = capsys.readouterr().out
    done = re.search(r"\[done\] log +clicks: checkpointed at version (\d+); deleted (\d+) log files before version "
                     r"(\d+)", out)
    assert done, out
    after = log_entries(path, spark)
    assert after < before and after <= 3 and int(done.group(2)) >= 7, (before, after, out)
    assert sorted(r["record_id"] for r in spark.read.format("delta").load(path).collect()) == rows
    with pytest.raises(Exception, match=r"(?i)version|log|checkpoint"):  # time travel below the horizon
        spark.read.format("delta").option("versionAsOf", 1).load(path).collect()
