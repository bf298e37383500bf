"""``deltawheel recover``: undelivered checkpoints found without leases, delivered with them,
once, and never while a running copy holds an interval."""

from __future__ import annotations

import json

import pytest
from deltawheel.executor.drivers.recover import computations_of, recover, scan
from deltawheel.executor.protocol.faults import FaultPoint
from deltawheel.statestore.exceptions import ConfigError, LeaseHeldError
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.leases import LeaseManager
from executor_util import BucketCounter, events, start_executor, stop_executor, stream_rows

from deltawheel.cli import main as cli_main

pytestmark = [pytest.mark.spark, pytest.mark.zk]

B1 = [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "cats", 12_000)]
# the windows B1 closes at watermark 11 s, as a run without faults delivers them
CLOSED = [("cats", '{"n": 1, "q": "cats", "start": 0}'), ("dogs", '{"n": 1, "q": "dogs", "start": 0}')]


class _Died(Exception):
    pass


def _die_after_commit(point: FaultPoint, batch_id: int) -> None:
    if point is FaultPoint.AFTER_COMMIT and batch_id == 1:
        raise _Died(point)


def _windows(spark, layout) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return sorted((k, v) for _, k, v, _ in stream_rows(spark, layout, "counts"))


def _crashed_after_commit(spark, layout, zk_config, write_path):  # type: ignore[no-untyped-def]
    """The second batch committed its rows (2 productions checkpointed), then the process died."""
    ex, client = start_executor(spark, layout, zk_config, BucketCounter(), write_path=write_path,
                                faults=_die_after_commit)
    ex.run_batch(events(spark, B1[:2]), 0, input_watermark_ms=None)
    with pytest.raises(_Died):
        ex.run_batch(events(spark, B1[2:]), 1, input_watermark_ms=11_000)
    client.stop()  # its leases go with its session
    client.close()


def _undelivered(statuses) -> int:  # type: ignore[no-untyped-def]
    return sum(sum(s.undelivered.values()) for s in statuses)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])  # merge: slow suite (time)
def test_recover_delivers_the_checkpoints_of_a_dead_pipeline_once(spark, migrated_store, zk_config,
                                                                   write_path) -> None:  # type: ignore[no-untyped-def]
    _crashed_after_commit(spark, migrated_store, zk_config, write_path)
    assert _windows(spark, migrated_store) == []
    client = connect(zk_config)
    try:
        assert computations_of(client, pipeline="test") == {"buckets": 4}
        found = scan(spark, migrated_store, client, pipeline="test")
        assert [s.interval for s in found] == [0, 1, 2, 3] and all(s.owner is None for s in found)
        assert sum(sum(s.checkpointed.values()) for s in found) == 2
        assert _undelivered(found) == 2
        assert _windows(spark, migrated_store) == []  # the scan wrote nothing

        # a running copy holds an interval: no delivery behind its back
        other = connect(zk_config)
        live = LeaseManager(other, pipeline="test", owner="running-copy")
        live.acquire("buckets", [2])
        with pytest.raises(LeaseHeldError, match="running-copy"):
            recover(spark, migrated_store, client, pipeline="test", computation="buckets", num_intervals=4)
        assert _windows(spark, migrated_store) == []
        live.release("buckets", [2])
        other.stop()
        other.close()

        r = recover(spark, migrated_store, client, pipeline="test", computation="buckets", num_intervals=4)
        assert r.appended + r.merged == 2 and r.intervals == (0, 1, 2, 3)
        assert _windows(spark, migrated_store) == CLOSED
        again = scan(spark, migrated_store, client, pipeline="test")
        assert _undelivered(again) == 0 and sum(sum(s.checkpointed.values()) for s in again) == 2
        r2 = recover(spark, migrated_store, client, pipeline="test", computation="buckets", num_intervals=4)
        # checkpoints of an image-path commit are known delivered by the stream's recorded version;
        # a MERGE-path commit's are handed to insert-if-absent again (its delivery records no
        # version), which adds nothing
        assert (r2.appended, r2.merged) == ((0, 0) if write_path == "image" else (0, 2))
        assert _windows(spark, migrated_store) == CLOSED
        assert all(r2.sequencers[iv] > r.sequencers[iv] for iv in range(4))  # each run fences the one before
    finally:
        client.stop()
        client.close()
    # the pipeline itself comes back: nothing redelivered, and it goes on
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), writer="back")
    try:
        # (a MERGE-path commit's checkpoints are handed to insert-if-absent again, adding nothing)
        assert ex.recovered == {"appended": 0, "merged": 0 if write_path == "image" else 2}
        ex.flush(input_watermark_ms=40_000)
    finally:
        stop_executor(ex, client)
    assert _windows(spark, migrated_store) == sorted(CLOSED + [("cats", '{"n": 1, "q": "cats", "start": 10000}')])


@pytest.mark.timeout(600)
def test_recover_cli_shows_then_applies(spark, migrated_store, zk_config, capsys) -> None:  # type: ignore[no-untyped-def]
    _crashed_after_commit(spark, migrated_store, zk_config, "image")
    args = ["--store", migrated_store.root, "--pipeline", "test", "--zk", zk_config.hosts,
            "--zk-chroot", zk_config.chroot]
    assert cli_main(["recover", *args]) == 0
    out = capsys.readouterr().out
    assert "2 checkpointed productions have not landed" in out and "(free)" in out
    assert _windows(spark, migrated_store) == []
    assert cli_main(["recover", *args, "--apply", "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert [(d["computation"], d["appended"], d["merged"]) for d in done] == [("buckets", 2, 0)]
    assert _windows(spark, migrated_store) == CLOSED
    assert cli_main(["recover", *args]) == 0
    assert "nothing to deliver" in capsys.readouterr().out
    assert cli_main(["recover", *args, "--computation", "nope"]) == 3
    assert "no computation 'nope'" in capsys.readouterr().err


def test_recover_names_an_unknown_pipeline(zk_config) -> None:  # type: ignore[no-untyped-def]
    client = connect(zk_config)
    try:
        with pytest.raises(ConfigError, match="has no computation in ZooKeeper"):
            computations_of(client, pipeline="never-ran")
    finally:
        client.stop()
        client.close()
