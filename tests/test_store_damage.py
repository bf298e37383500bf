"""A damaged rows-table log (its newest commit deleted or truncated) refuses the start with a
typed error naming the table, file and versions; after the documented recovery (restore the
commit from a backup, docs/store-damage.md) the run ends with the rows of a clean run."""

from __future__ import annotations

import os
import shutil

import pytest
from deltawheel.statestore.delta.log import read_snapshot
from deltawheel.statestore.exceptions import StoreDamagedError
from deltawheel.statestore.inspection.damage import check_log
from executor_util import BucketCounter, events, state_of, stop_executor, stream_rows

pytestmark = [pytest.mark.spark, pytest.mark.zk]

B1 = [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "cats", 12_000), ("r6", "owls", 3_000)]
B2 = [("r4", "cats", 15_000), ("r5", "dogs", 21_000), ("r1", "cats", 1_000)]


def _start(spark, layout, zk_config, writer):  # type: ignore[no-untyped-def]
    """start_executor, but a refused start closes its ZooKeeper client before raising."""
    from deltawheel.executor.protocol.executor import ComputationExecutor
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager

    client = connect(zk_config)
    try:
        owner = IntervalOwner(RowStore(spark, layout, writer=writer), LeaseManager(client, pipeline="test", owner=writer),
                              "buckets", num_intervals=BucketCounter.num_intervals)
        ex = ComputationExecutor(spark, layout, BucketCounter(), owner=owner, progress=print, write_path="image")
        ex.start(wait_s=20)
    except BaseException:
        client.stop()
        client.close()
        raise
    return ex, client


def _first_batch(spark, layout, zk_config) -> str:  # type: ignore[no-untyped-def]
    ex, client = _start(spark, layout, zk_config, "w1")
    assert ex.run_batch(events(spark, B1), 0, input_watermark_ms=11_000).productions == 3
    stop_executor(ex, client)  # settles the delivery
    snap = read_snapshot(layout.rows_of("buckets"))
    assert snap is not None
    return os.path.join(layout.rows_of("buckets"), "_delta_log", f"{snap.version:020d}.json")


def _rest(spark, layout, zk_config, writer):  # type: ignore[no-untyped-def]
    ex, client = _start(spark, layout, zk_config, writer)
    ex.run_batch(events(spark, B2), 1, input_watermark_ms=22_000)
    ex.flush(input_watermark_ms=40_000)
    stop_executor(ex, client)
    return stream_rows(spark, layout, "counts"), state_of(spark, layout, "buckets")


@pytest.fixture(scope="module")
def clean(spark, zk_server, tmp_path_factory, migrated_template):  # type: ignore[no-untyped-def]
    from pathlib import Path

    from conftest import copy_migrated_store
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout

    layout = StoreLayout(str(tmp_path_factory.mktemp("clean") / "store"))
    copy_migrated_store(migrated_template, Path(layout.root))
    zk = ZkConfig(hosts=zk_server.hosts, chroot="/damage-clean", session_timeout_s=6.0)
    _first_batch(spark, layout, zk)
    return _rest(spark, layout, zk, "w2")


@pytest.mark.timeout(900)
def test_a_deleted_newest_commit_is_refused_then_restored_gives_the_clean_rows(
        spark, migrated_store, zk_config, tmp_path, clean) -> None:  # type: ignore[no-untyped-def]
    newest = _first_batch(spark, migrated_store, zk_config)
    version = int(os.path.basename(newest)[:20])
    backup = tmp_path / "backup"
    backup.mkdir()
    crc = newest[:-len(".json")] + ".crc"
    for f in (newest, crc):
        shutil.copy(f, backup)
    os.remove(newest)  # the operator's accident, between two runs
    with pytest.raises(StoreDamagedError, match=rf"rows table .*expected at least version {version}, "
                                                rf"found {version - 1}.*{os.path.basename(newest)} is missing"):
        _start(spark, migrated_store, zk_config, "w2")
    os.remove(crc)  # Delta's checksum gone too: the stream's delivery still shows the loss
    with pytest.raises(StoreDamagedError, match=rf"behind what was delivered: stream 'counts' records the "
                                                rf"productions of rows commit {version}.*expected at least "
                                                rf"version {version}, found {version - 1}"):
        _start(spark, migrated_store, zk_config, "w2")
    for f in backup.iterdir():  # the documented recovery: restore the commit from the backup
        shutil.copy(f, os.path.join(migrated_store.rows_of("buckets"), "_delta_log"))
    assert _rest(spark, migrated_store, zk_config, "w3") == clean


@pytest.mark.timeout(900)
def test_a_truncated_newest_commit_is_refused_naming_the_file_then_restored_gives_the_clean_rows(
        spark, migrated_store, zk_config, tmp_path, clean) -> None:  # type: ignore[no-untyped-def]
    newest = _first_batch(spark, migrated_store, zk_config)
    whole = open(newest, "rb").read()
    with open(newest, "wb") as fh:
        fh.write(whole[: len(whole) // 2])
    with pytest.raises(StoreDamagedError, match=rf"Delta log entry {newest} is truncated or corrupt"):
        _start(spark, migrated_store, zk_config, "w2")
    with open(newest, "wb") as fh:  # restored from the backup
        fh.write(whole)
    assert _rest(spark, migrated_store, zk_config, "w3") == clean


def test_check_log_finds_a_gap_and_passes_a_whole_log(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    log = os.path.join(migrated_store.rows, "_delta_log")
    newest = check_log(migrated_store.rows, table="rows")
    assert newest is not None and newest >= 1
    assert check_log(str(migrated_store.rows) + "-absent", table="rows") is None
    os.rename(os.path.join(log, f"{0:020d}.json"), os.path.join(log, "moved"))
    with pytest.raises(StoreDamagedError, match=r"commit\(s\) \[0\] are missing"):
        check_log(migrated_store.rows, table="rows")
