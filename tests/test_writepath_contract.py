"""The write-path contract (``statestore/writepath``), checked through its public interface on
both implementations: what a third write path has to pass too.

The batch a path commits comes from the user job paired with it (``executor/tasks/job.py``); the
test then calls the path's methods the way the executor's protocol does."""

from __future__ import annotations

import pytest
from deltawheel.executor.protocol.faults import FaultPoint
from deltawheel.statestore.exceptions import LeaseLostError, StaleSequencerError
from deltawheel.statestore.writepath import WritePath
from deltawheel.statestore.zk.lease_tools import break_lease
from executor_util import BucketCounter, events, start_executor, state_of, stop_executor, stream_rows

B1 = [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "cats", 12_000)]  # 2 windows due at 11 s
B2 = [("r4", "cats", 15_000), ("r5", "dogs", 21_000), ("r1", "cats", 1_000)]  # 1 more due at 22 s


class Crash(Exception):
    """Stands in for the process dying at a protocol step."""


def _batch(ex, spark, items, batch_id: int, wm: int):  # type: ignore[no-untyped-def]
    """Steps 2-4 of a batch through the executor's user job: the path's batch, not committed."""
    now = ex.clock.now_ms()
    prepared = ex.job.prepare(events(spark, items), wm_late=None, now=now)
    return ex.job.run(prepared, batch_id=batch_id, wm_in=wm, wm_late=None, now=now, horizon=None,
                      commit_id=f"buckets:{batch_id}:{now}", strong=True, mark=lambda _step: None)


@pytest.mark.parametrize(("write_path", "store"), [
    ("image", "local"), pytest.param("merge", "local", marks=pytest.mark.slow),  # merge: slow suite (time)
    pytest.param("image", "s3a", marks=[pytest.mark.objectstore, pytest.mark.timeout(600)]),
])
def test_both_write_paths_keep_the_contract(spark, zk_config, request,  # type: ignore[no-untyped-def]
                                            write_path: str, store: str) -> None:
    """A crash right after a commit: the new owner's acquire delivers the checkpointed
    productions once; the zombie's commit fails typed and lands nothing, its reload refuses;
    delivering a batch twice adds nothing; a second recovery adds nothing either. The image
    path keeps it on the object store too (``s3a://``: pyarrow's S3 files, Delta's commits)."""
    migrated_store = request.getfixturevalue("migrated_store" if store == "local" else "migrated_s3_store")
    crashed: list[int] = []

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point == FaultPoint.AFTER_COMMIT and not crashed:
            crashed.append(batch_id)
            raise Crash(point)

    old, old_client = start_executor(spark, migrated_store, zk_config, BucketCounter(), faults=faults, writer="old",
                                     write_path=write_path)
    new = new_client = None
    try:
        assert isinstance(old.path, WritePath)
        with pytest.raises(Crash):
            old.run_batch(events(spark, B1), 0, input_watermark_ms=11_000)
        assert stream_rows(spark, migrated_store, "counts") == []  # committed (checkpointed), not delivered
        zombie = _batch(old, spark, B2, 1, 22_000)  # the old owner's next batch, not committed yet
        for iv in range(4):
            break_lease(old_client, pipeline="test", computation="buckets", interval=iv, apply=True)

        # recover on acquisition: the checkpointed productions are delivered, once
        new, new_client = start_executor(spark, migrated_store, zk_config, BucketCounter(), writer="new",
                                         write_path=write_path)
        assert new.recovered["appended"] + new.recovered["merged"] == 2
        recovered = stream_rows(spark, migrated_store, "counts")
        assert len(recovered) == 2 and len({r[0] for r in recovered}) == 2
        state = state_of(spark, migrated_store, "buckets")

        # a writer taken over fails typed, never skips silently, and commits nothing
        with pytest.raises((StaleSequencerError, LeaseLostError), match=r"stale sequencer|not held|lease"):
            old.path.commit(zombie.batch, commit_id="zombie", meta={})
        with pytest.raises(StaleSequencerError, match=r"stale sequencer: interval \d of buckets is now owned"):
            old.path.load()
        assert state_of(spark, migrated_store, "buckets") == state

        # commit + deliver; a repeated delivery adds nothing
        run = _batch(new, spark, B2, 1, 22_000)
        assert run.counts.productions == 1
        assert new.path.commit(run.batch, commit_id="buckets:1:contract", meta={}) is True
        assert new.path.deliver(run.batch, strong=True) == 1
        delivered = stream_rows(spark, migrated_store, "counts")
        assert len(delivered) == 3
        new.path.deliver(run.batch, strong=True)
        assert stream_rows(spark, migrated_store, "counts") == delivered
        stop_executor(new, new_client)
        new = new_client = None

        # that batch's checkpoint is still in the rows (the next commit clears it): a recovery
        # hands it on again, and nothing is added
        again, again_client = start_executor(spark, migrated_store, zk_config, BucketCounter(), writer="again",
                                             write_path=write_path)
        stop_executor(again, again_client)
        assert stream_rows(spark, migrated_store, "counts") == delivered
    finally:
        for c in (new_client, old_client):
            if c is not None:
                c.stop()
                c.close()


def test_a_strong_delivery_read_before_another_landed_adds_nothing(spark, zk_config, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """The image path remembers which checkpoints a stream already holds. That memory can be older
    than the delivery's own transaction: a new owner's recovery reads it, then the zombie's
    in-flight delivery of the same checkpoint lands, then the recovery's transaction takes its
    snapshot (with the zombie's files in it, so Delta sees no conflict). Here the memory is made
    stale by hand after a delivery landed; delivering again must add nothing."""
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), writer="w", write_path="image")
    try:
        now = ex.clock.now_ms()
        prepared = ex.job.prepare(events(spark, B1), wm_late=None, now=now)
        run = ex.job.run(prepared, batch_id=0, wm_in=11_000, wm_late=None, now=now, horizon=None,
                         commit_id="buckets:0:stale", strong=True, mark=lambda _step: None)
        assert ex.path.commit(run.batch, commit_id="buckets:0:stale", meta={}) is True
        assert ex.path.deliver(run.batch, strong=True) == 2
        delivered = stream_rows(spark, migrated_store, "counts")
        assert len(delivered) == 2
        stale = {k: -1 for k in ex.path._delivered}  # as read before the delivery above landed
        assert stale
        ex.path._delivered.update(stale)
        ex.path._load()  # as a new owner's acquire: the images read back, then the recovery scan on that
        found = ex.path.recovery()  # stale memory: the checkpoints look undelivered
        assert len(found.appends) == 2
        ex.path.redeliver(found.appends)  # new production files, as a new owner's recovery writes them
        assert sorted(stream_rows(spark, migrated_store, "counts")) == sorted(delivered)
    finally:
        stop_executor(ex, client)
