"""The foreachBatch executor on real Spark, Delta and ZooKeeper: exactly-once and timers."""

from __future__ import annotations

import os
import time

import pytest
from deltawheel.statestore.rowtable.rows import IDS_KEY_PREFIX
from deltawheel.statestore.writepath.streams import stream_schema_ddl
from executor_util import BucketCounter, events, start_executor, state_of, stop_executor, stream_rows

pytestmark = [pytest.mark.spark, pytest.mark.zk]

B1 = [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "cats", 12_000), ("r2", "dogs", 2_000)]
B2 = [("r4", "cats", 15_000), ("r5", "dogs", 21_000), ("r1", "cats", 1_000)]
# every window of B1 + B2 once, as (key, value) of the "counts" stream
ALL_WINDOWS = sorted([
    ("cats", '{"n": 1, "q": "cats", "start": 0}'), ("cats", '{"n": 2, "q": "cats", "start": 10000}'),
    ("dogs", '{"n": 1, "q": "dogs", "start": 0}'), ("dogs", '{"n": 1, "q": "dogs", "start": 20000}')])


def _windows(spark, layout) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """(key, value) of every row of the "counts" stream, sorted."""
    return sorted((k, v) for _, k, v, _ in stream_rows(spark, layout, "counts"))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])  # merge: slow suite (time)
def test_batches_timers_and_replay_are_exactly_once(spark, migrated_store, zk_config, write_path) -> None:  # type: ignore[no-untyped-def]
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path=write_path)
    assert ex.write_path == write_path
    try:
        r0 = ex.run_batch(events(spark, B1), 0, input_watermark_ms=None)
        assert (r0.records_in, r0.processed, r0.duplicates, r0.timers_fired) == (4, 3, 1, 0)
        r1 = ex.run_batch(events(spark, B2), 1, input_watermark_ms=11_000)
        # r1 is a replayed id; the [0,10s) buckets of cats and dogs fire (timer 9999 < 11000)
        assert (r1.processed, r1.duplicates, r1.timers_fired) == (2, 1, 2)
        # replaying batch 1 (Spark re-runs a batch after a crash) changes nothing
        again = ex.run_batch(events(spark, B2), 1, input_watermark_ms=11_000)
        assert (again.processed, again.duplicates, again.productions) == (0, 3, 0)
        assert ex.flush(input_watermark_ms=40_000).timers_fired == 2
        # a second timers-only batch under the same watermark has nothing to do: the image path
        # skips its Spark job (no processing-time timers here)
        idle = ex.flush(input_watermark_ms=40_000)
        assert idle.timers_fired == 0
        assert (idle.steps_s[0][0] == "skipped: nothing due") == (write_path == "image")
    finally:
        stop_executor(ex, client)
    counts = stream_rows(spark, migrated_store, "counts")
    assert [(k, v) for _, k, v, _ in counts] == [
        ("cats", '{"n": 1, "q": "cats", "start": 0}'), ("cats", '{"n": 2, "q": "cats", "start": 10000}'),
        ("dogs", '{"n": 1, "q": "dogs", "start": 0}'), ("dogs", '{"n": 1, "q": "dogs", "start": 20000}'),
    ] or sorted((k, v) for _, k, v, _ in counts) == ALL_WINDOWS
    # every key is empty now except the dedup ids: state None, no timers
    st = state_of(spark, migrated_store, "buckets")
    assert all(v == (None, []) for v in st.values()), st


class Crash(Exception):
    """Stands in for the process dying at a protocol step."""


def _run(spark, layout, zk_config, *, crash_at=None):  # type: ignore[no-untyped-def]
    """Batches B1, B2 and a final flush; optionally crash once at a fault point of batch 1, then
    restart (new ZooKeeper session and leases, recovery scan) and let Spark replay batch 1."""
    from deltawheel.executor.protocol.faults import FaultPoint

    fired = []

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point == crash_at and batch_id == 1 and not fired:
            fired.append(point)
            raise Crash(point)

    ex, client = start_executor(spark, layout, zk_config, BucketCounter(), faults=faults, writer="first")
    ex.run_batch(events(spark, B1), 0, input_watermark_ms=None)
    returned = False
    try:
        ex.run_batch(events(spark, B2), 1, input_watermark_ms=11_000)
        returned = True
        # a crash after batch 1's asynchronous delivery surfaces when the next batch settles it
        ex.flush(input_watermark_ms=40_000)
    except Crash:
        client.stop()  # the session dies with the process: its leases go
        client.close()
        ex, client = start_executor(spark, layout, zk_config, BucketCounter(), writer="second")
        if not returned:  # Spark replays the batch whose foreachBatch never returned
            ex.run_batch(events(spark, B2), 1, input_watermark_ms=11_000)
        ex.flush(input_watermark_ms=40_000)
    stop_executor(ex, client)
    assert fired == ([crash_at] if crash_at else [])
    return stream_rows(spark, layout, "counts"), state_of(spark, layout, "buckets")


@pytest.fixture(scope="module")
def clean_run(spark, zk_server, tmp_path_factory, migrated_template):  # type: ignore[no-untyped-def]
    """The outputs and state of the run that never crashed (computed once)."""
    from pathlib import Path

    from conftest import copy_migrated_store
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout

    layout = StoreLayout(str(tmp_path_factory.mktemp("clean") / "store"))
    copy_migrated_store(migrated_template, Path(layout.root))
    want = _run(spark, layout, ZkConfig(hosts=zk_server.hosts, chroot="/clean-run", session_timeout_s=6.0))
    assert len(want[0]) == 4
    return want


@pytest.mark.timeout(900)
# after_prepare and after_user_code: slow suite (time); [before_commit] covers them in the default run:
# all three crash before batch 1's commit, so the restart replays batch 1 on a store holding nothing of
# it (before_commit after the most: the files the tasks wrote, the dead letters, the late rows)
@pytest.mark.parametrize("point", [pytest.param("after_prepare", marks=pytest.mark.slow),
                                   pytest.param("after_user_code", marks=pytest.mark.slow),
                                   "before_commit", "after_commit", "after_delivery", "before_watermark"])
def test_crash_at_each_step_then_restart_gives_the_same_result(spark, migrated_store, zk_config, clean_run,
                                                               point) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.protocol.faults import FaultPoint

    assert _run(spark, migrated_store, zk_config, crash_at=FaultPoint(point)) == clean_run


@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", "merge"])
def test_an_owner_whose_sequencer_is_behind_a_fence_fails_at_start_and_gives_the_leases_back(
        spark, migrated_store, zk_config, write_path) -> None:  # type: ignore[no-untyped-def]
    """A fence row carries a greater sequencer than the lease just granted and than anything this
    ZooKeeper granted (e.g. the store was last written under another ZooKeeper ensemble, or its
    data was lost): start fails with CoordinatorStateLostError before anything is written or
    recovered, naming the interval and the recovery, and the intervals are free again."""
    from deltawheel.executor.protocol.executor import ComputationExecutor
    from deltawheel.statestore.exceptions import CoordinatorStateLostError
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager

    RowStore(spark, migrated_store, writer="elsewhere").fence("buckets", {2: 50}, claim_only=True)
    client = connect(zk_config)
    try:
        owner = IntervalOwner(RowStore(spark, migrated_store, writer="behind"),
                              LeaseManager(client, pipeline="test", owner="behind"), "buckets", num_intervals=4)
        ex = ComputationExecutor(spark, migrated_store, BucketCounter(), owner=owner, progress=print,
                                 write_path=write_path)
        with pytest.raises(CoordinatorStateLostError, match="interval 2: the store's fence carries sequencer 50.*"
                           "deltawheel reseed"):
            ex.start()
        assert owner.intervals == ()
        probe = LeaseManager(client, pipeline="test", owner="probe")  # free again: no wait needed
        assert sorted(probe.acquire("buckets", [0, 1, 2, 3], wait_s=0)) == [0, 1, 2, 3]
        probe.release("buckets", [0, 1, 2, 3])
    finally:
        client.stop()
        client.close()


@pytest.mark.timeout(900)
# merge: slow suite (time); its fenced MERGE refusing a stale sequencer: test_store.py::test_late_zombie_fails_and_writes_nothing
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])
def test_zombie_executor_lands_nothing_after_takeover(spark, migrated_store, zk_config, write_path) -> None:  # type: ignore[no-untyped-def]
    """The old instance keeps running after a new one took its intervals (its lease was broken
    while it was partitioned away): its batch fails with StaleSequencerError, nothing it
    computed is committed or delivered."""
    from deltawheel.statestore.exceptions import StaleSequencerError
    from deltawheel.statestore.zk.lease_tools import break_lease

    old, old_client = start_executor(spark, migrated_store, zk_config, BucketCounter(), writer="old",
                                     write_path=write_path)
    old.run_batch(events(spark, B1), 0, input_watermark_ms=None)
    for iv in range(4):  # the operator (or session expiry) takes the intervals away from "old"
        break_lease(old_client, pipeline="test", computation="buckets", interval=iv, apply=True)
    new, new_client = start_executor(spark, migrated_store, zk_config, BucketCounter(), writer="new",
                                     write_path=write_path)
    before = state_of(spark, migrated_store, "buckets")
    # the zombie still believes it owns the intervals: skip its local lease check, as a
    # partitioned process would (its ZooKeeper session looked fine to it)
    old.owner.check = lambda: None  # type: ignore[method-assign]
    with pytest.raises(StaleSequencerError, match="owned under sequencer"):
        old.run_batch(events(spark, B2), 1, input_watermark_ms=11_000)
    assert state_of(spark, migrated_store, "buckets") == before
    assert stream_rows(spark, migrated_store, "counts") == []
    r = new.run_batch(events(spark, B2), 1, input_watermark_ms=11_000)
    new.settle()  # the image path delivers asynchronously: wait for it
    assert r.timers_fired == 2 and len(stream_rows(spark, migrated_store, "counts")) == 2
    for c in (new_client, old_client):
        c.stop()
        c.close()


@pytest.mark.timeout(900)
def test_bad_records_go_to_dead_letters_and_user_errors_name_the_record(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.computation import ErrorPolicy
    from deltawheel.executor.exceptions import UserCodeError
    from executor_util import J, Picky

    Picky.error_policy = ErrorPolicy.DEAD_LETTER
    ex, client = start_executor(spark, migrated_store, zk_config, Picky())
    df = events(spark, [("ok1", "cats", 1_000)]).unionByName(spark.createDataFrame(
        [("nokey", "", J.encode({"other": 1}), "json", 2_000, None, "t", "file=x#row=2", 1),
         ("garbled", "", b"\xff{not json", "json", 3_000, None, "t", "file=x#row=3", 1),
         ("boom", "", J.encode({"q": "dogs", "boom": True}), "json", 4_000, None, "t", "file=x#row=4", 1)],
        schema=events(spark, []).schema))
    r = ex.run_batch(df, 0, input_watermark_ms=None)
    assert (r.records_in, r.processed, r.dead_letters) == (4, 2, 3)
    dl = {d["record_id"]: d for d in spark.read.format("delta").load(migrated_store.dead_letters).collect()}
    assert set(dl) == {"nokey", "garbled", "boom"}
    assert "no field 'q'" in dl["nokey"]["error"] and dl["nokey"]["source_position"] == "file=x#row=2"
    assert dl["garbled"]["raw_value"] == b"\xff{not json"
    assert dl["boom"]["error"] == "ValueError: no booms here" and dl["boom"]["key"] == "dogs"
    assert dl["boom"]["source_position"] == "file=x#row=4"  # a task's dead letter keeps its position too
    # replaying the batch adds no second dead letter
    ex.run_batch(df, 0, input_watermark_ms=None)
    assert spark.read.format("delta").load(migrated_store.dead_letters).count() == 3
    # with the default policy a user exception fails the batch, naming key and record
    Picky.error_policy = ErrorPolicy.FAIL
    with pytest.raises(UserCodeError, match=r"key 'dogs' on record 'boom2'.*no booms here"):
        ex.run_batch(events(spark, []).unionByName(spark.createDataFrame(
            [("boom2", "", J.encode({"q": "dogs", "boom": True}), "json", 5_000, None, "t", "p", 1)],
            schema=events(spark, []).schema)), 1, input_watermark_ms=None)
    stop_executor(ex, client)


@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])  # merge: slow suite (time)
def test_a_record_without_key_goes_to_dead_letters(spark, migrated_store, zk_config, write_path) -> None:  # type: ignore[no-untyped-def]
    """A frame embedded by the user may carry a null key: the record is a dead letter, not dropped."""
    from executor_util import ByRecordKey, J

    ex, client = start_executor(spark, migrated_store, zk_config, ByRecordKey(), write_path=write_path)
    df = spark.createDataFrame(
        [{"record_id": rid, "key": key, "value": J.encode({"q": key}), "codec": "json", "timestamp_ms": ts,
          "event_time": None, "producer": "t", "commit_id": f"pos-{rid}", "format_version": 1}
         for rid, key, ts in [("a", "cats", 1_000), ("b", None, 2_000), ("c", "dogs", 3_000)]],
        schema=stream_schema_ddl().replace(" NOT NULL", ""))
    r = ex.run_batch(df, 0, input_watermark_ms=None)
    stop_executor(ex, client)
    assert (r.records_in, r.processed, r.dead_letters) == (3, 2, 1)
    dl = spark.read.format("delta").load(migrated_store.dead_letters).collect()
    assert [(d["record_id"], d["error"], d["source_position"]) for d in dl] == [("b", "record without key", "pos-b")]


def test_write_path_is_checked_against_the_store(spark, zk_config) -> None:  # type: ignore[no-untyped-def]
    """``auto`` takes the image path where Python reaches the store's files (local, ``file:``,
    ``s3a://``) and the MERGE path elsewhere, saying so; ``image`` elsewhere is refused."""
    from deltawheel.executor.protocol.executor import ComputationExecutor
    from deltawheel.statestore.delta.storefs import supports
    from deltawheel.statestore.exceptions import ConfigError
    from deltawheel.statestore.layout import StoreLayout

    assert supports("/data/store/rows") and supports("file:/data/store/rows") and supports("s3a://bucket/store/rows")
    assert not supports("abfss://c@acct.dfs.core.windows.net/s") and not supports("s3://bucket/store/rows")
    remote = StoreLayout("abfss://c@acct.dfs.core.windows.net/store")
    with pytest.raises(ConfigError, match="supports local, file: and s3a:// stores only; .* use write_path='merge' "
                                          "or 'auto'"):
        ComputationExecutor(spark, remote, BucketCounter(), owner=None, write_path="image")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="write_path must be one of auto, image, merge, not 'fast'"):
        ComputationExecutor(spark, remote, BucketCounter(), owner=None, write_path="fast")  # type: ignore[arg-type]
    fallback = ComputationExecutor(spark, remote, BucketCounter(), owner=None)  # type: ignore[arg-type]
    assert fallback.write_path == "merge" and "fenced MERGE path" in fallback.write_path_reason
    s3 = ComputationExecutor(spark, StoreLayout("s3a://bucket/store"), BucketCounter(), owner=None)  # type: ignore[arg-type]
    assert s3.write_path == "image" and s3.write_path_reason.startswith("auto")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])  # merge: slow suite (time)
def test_weak_productions_straggler_checkpointing(spark, migrated_store, zk_config, write_path) -> None:  # type: ignore[no-untyped-def]
    """A weak delivery outliving straggler_timeout_s makes the batch checkpoint its productions;
    a straggler that then fails is redelivered from the checkpoint before it is cleared."""
    import threading

    from deltawheel.executor.protocol.faults import FaultPoint
    from executor_util import WeakCounter
    from pyspark.sql import functions as F

    class Boom(Exception):
        pass

    committed = {0: threading.Event(), 1: threading.Event()}

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point is FaultPoint.AFTER_COMMIT and batch_id in committed:
            committed[batch_id].set()
        if point is FaultPoint.IN_WEAK_DELIVERY and batch_id in committed:
            # outlives straggler_timeout_s whatever the machine's speed: it goes on once its
            # batch has committed the checkpoint (which the batch does only after giving up on it)
            assert committed[batch_id].wait(120)
            if batch_id == 1:
                raise Boom("the stream table is unreachable")

    def pending() -> int:
        rows = spark.read.format("delta").load(migrated_store.rows_of("weak")).where(F.col("computation") == "weak")
        return int(rows.agg(F.sum(F.size("pending"))).collect()[0][0] or 0)

    ex, client = start_executor(spark, migrated_store, zk_config, WeakCounter(), faults=faults,
                                write_path=write_path)
    try:
        r0 = ex.run_batch(events(spark, B1), 0, input_watermark_ms=11_000)  # fires [0,10s) of cats, dogs
        assert r0.straggled and r0.productions == 2
        assert pending() == 2  # checkpointed in the rows, as a strong production would be
        r1 = ex.run_batch(events(spark, B2), 1, input_watermark_ms=22_000)  # fires [10s,20s) of cats
        assert r1.straggled and r1.productions == 1
        # batch 0's straggler finished; the checkpoint was cleared by batch 1's commit
        assert len(stream_rows(spark, migrated_store, "counts")) == 2
        ex.flush(input_watermark_ms=40_000)  # settles batch 1's failed straggler before its commit
    finally:
        stop_executor(ex, client)
    assert _windows(spark, migrated_store) == ALL_WINDOWS


@pytest.mark.timeout(600)
def test_a_zombies_delivery_in_flight_at_the_takeover_adds_nothing(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """Image path: the old owner's batch committed just before the takeover and its delivery is
    still in flight; the new owner redelivers the checkpoint at start, recording that commit's
    version. When the old delivery goes on, it finds the commit delivered (or, had it read the
    versions before, the new owner's claim) and lands nothing: each window once."""
    import threading

    from deltawheel.statestore.exceptions import DeltaWheelError
    from deltawheel.statestore.zk.lease_tools import break_lease

    gate = threading.Event()
    old, old_client = start_executor(spark, migrated_store, zk_config, BucketCounter(), writer="old",
                                     write_path="image")
    real = old.path.deliver

    def slow(out, *, strong):  # type: ignore[no-untyped-def]
        assert gate.wait(120)
        return real(out, strong=strong)

    old.path.deliver = slow
    new_client = None
    try:
        r0 = old.run_batch(events(spark, B1), 0, input_watermark_ms=11_000)  # commits 2 windows, delivery waits
        assert r0.productions == 2 and stream_rows(spark, migrated_store, "counts") == []
        for iv in range(4):
            break_lease(old_client, pipeline="test", computation="buckets", interval=iv, apply=True)
        new, new_client = start_executor(spark, migrated_store, zk_config, BucketCounter(), writer="new",
                                         write_path="image")  # recovery redelivers the 2 windows
        assert len(stream_rows(spark, migrated_store, "counts")) == 2
        gate.set()
        # the new owner delivered that commit as its own delivery (same application version): the
        # old delivery finds it delivered and appends nothing
        old.settle()
        rows = stream_rows(spark, migrated_store, "counts")
        assert len(rows) == 2 and len({r[0] for r in rows}) == 2
        with pytest.raises(DeltaWheelError):  # and the zombie's next batch lands nothing
            old.run_batch(events(spark, B2), 1, input_watermark_ms=22_000)
        assert len(stream_rows(spark, migrated_store, "counts")) == 2
        new.run_batch(events(spark, B2), 1, input_watermark_ms=22_000)
        new.flush(input_watermark_ms=40_000)
        new.settle()
        assert _windows(spark, migrated_store) == ALL_WINDOWS
    finally:
        gate.set()
        for c in (new_client, old_client):
            if c is not None:
                c.stop()
                c.close()


def _calls_begun(calls: list[int | None], n: int, timeout_s: float = 30.0) -> int:
    """How many background deliveries have begun, once n have or timeout_s has passed."""
    deadline = time.monotonic() + timeout_s
    while len(calls) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(calls)


@pytest.mark.timeout(600)
def test_strong_delivery_is_asynchronous_holds_the_watermark_and_is_redelivered(spark, migrated_store,
                                                                                zk_config) -> None:  # type: ignore[no-untyped-def]
    """Image path: a batch returns while its checkpointed productions are still being delivered;
    the low watermark stays held at them until they land; a delivery that fails is redelivered
    from the checkpoint when the next batch settles it — each production lands exactly once."""
    import threading

    gate = threading.Event()
    calls: list[int | None] = []

    class Boom(Exception):
        pass

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image",
                                watermarks=True)
    real = ex.path.deliver

    def deliver(out, *, strong):  # type: ignore[no-untyped-def]
        calls.append(out.version)
        if len(calls) == 1:
            assert gate.wait(60)  # batch 0's delivery stays in flight
        if len(calls) == 2:
            raise Boom("the stream table is unreachable")  # batch 1's first attempt
        return real(out, strong=strong)

    ex.path.deliver = deliver
    try:
        r0 = ex.run_batch(events(spark, B1), 0, input_watermark_ms=11_000)  # fires [0,10s) of cats, dogs
        assert r0.productions == 2
        assert _calls_begun(calls, 1) == 1  # its delivery runs in the background: it may not have begun
        assert stream_rows(spark, migrated_store, "counts") == []  # returned before the delivery landed
        held = ex.authority.published_low_watermark("buckets")
        gate.set()
        assert ex.settle()
        landed = stream_rows(spark, migrated_store, "counts")
        assert len(landed) == 2
        assert held is not None and held <= min(ts for *_, ts in landed)  # held at the productions
        released = ex.authority.published_low_watermark("buckets")
        assert released is not None and released > held
        r1 = ex.run_batch(events(spark, B2), 1, input_watermark_ms=22_000)  # fires [10s,20s) of cats
        assert r1.productions == 1
        assert _calls_begun(calls, 2) == 2  # runs (and fails) in the background
        ex.flush(input_watermark_ms=40_000)  # settles it first: redelivered from the checkpoint
        assert len(calls) >= 3
    finally:
        gate.set()
        stop_executor(ex, client)
    assert _windows(spark, migrated_store) == ALL_WINDOWS


@pytest.mark.timeout(600)
def test_a_hung_delivery_fails_the_next_batch_after_delivery_timeout(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """A delivery that never finishes must not block the pipeline forever: settling gives up after
    delivery_timeout_s and fails the batch (nothing of it committed); the productions stay
    checkpointed, so a restarted executor redelivers them."""
    import threading

    from deltawheel.executor.protocol.faults import BatchFailedError

    impatient = BucketCounter()
    impatient.delivery_timeout_s = 1.0  # read by the driver only

    gate = threading.Event()
    ex, client = start_executor(spark, migrated_store, zk_config, impatient, write_path="image", writer="hung")
    real = ex.path.deliver

    def hang(out, *, strong):  # type: ignore[no-untyped-def]
        assert gate.wait(120)
        return real(out, strong=strong)

    ex.path.deliver = hang
    try:
        assert ex.run_batch(events(spark, B1), 0, input_watermark_ms=11_000).productions == 2
        before = state_of(spark, migrated_store, "buckets")
        with pytest.raises(BatchFailedError, match="still running after delivery_timeout_s=1.0s"):
            ex.run_batch(events(spark, B2), 1, input_watermark_ms=22_000)
        assert state_of(spark, migrated_store, "buckets") == before  # batch 1 did not commit
    finally:
        gate.set()
        if ex.inflight.open is not None:  # let the released delivery end before the restart redelivers
            ex.inflight.open.thread.join(60)
        client.stop()  # the process dies: leases go
        client.close()
    ex2, client2 = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image", writer="next")
    try:
        ex2.run_batch(events(spark, B2), 1, input_watermark_ms=22_000)
        ex2.flush(input_watermark_ms=40_000)
    finally:
        stop_executor(ex2, client2)
    assert _windows(spark, migrated_store) == ALL_WINDOWS


def test_a_restart_after_a_delivered_batch_skips_the_redelivery(spark, migrated_store, zk_config,
                                                                  monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Image path: the last batch's checkpointed productions landed (the stream records the
    interval's application version = that rows commit): a restart does not redeliver them. A
    checkpoint whose delivery did not land is delivered at the restart as that commit's own
    delivery would have been (an append recording its version, its commit id), once; also when its
    file's add is only bounded (folded into a Delta checkpoint): the commit is found by its id."""
    from deltawheel.statestore.delta.log import read_snapshot
    from deltawheel.statestore.writepath.image import path as image_mod

    merged: list[int] = []
    real = image_mod.deliver_productions

    def spy(spark_, layout, pending, **kw):  # type: ignore[no-untyped-def]
        merged.append(len(pending))
        return real(spark_, layout, pending, **kw)

    monkeypatch.setattr(image_mod, "deliver_productions", spy)

    def restart(writer: str):  # type: ignore[no-untyped-def]
        return start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image", writer=writer)

    ex, client = restart("w")
    r0 = ex.run_batch(events(spark, B1), 0, input_watermark_ms=11_000)  # 2 windows, delivered
    assert r0.productions == 2
    stop_executor(ex, client)  # settles the delivery
    assert len(stream_rows(spark, migrated_store, "counts")) == 2
    ex, client = restart("w2")
    assert merged == []  # the checkpoint is still in the rows, but it landed
    # the next batch's delivery does not land (the process "dies" before it): the restart delivers it
    ex.path.deliver = lambda out, *, strong: 0
    r1 = ex.run_batch(events(spark, B2), 1, input_watermark_ms=22_000)
    assert r1.productions == 1
    ex.stop()
    client.stop()
    client.close()
    rows_version = read_snapshot(migrated_store.rows_of("buckets")).version
    assert len(stream_rows(spark, migrated_store, "counts")) == 2
    ex, client = restart("w3")
    assert merged == []  # appended, not merged: the stream now records that commit's version
    txns = read_snapshot(migrated_store.stream("counts")).txns
    assert max(txns.values()) == rows_version
    assert len(stream_rows(spark, migrated_store, "counts")) == 3
    ids = spark.read.format("delta").load(migrated_store.stream("counts")).where("commit_id LIKE 'buckets:1:%'")
    assert ids.count() == 1  # written with the commit id of the batch that checkpointed it
    stop_executor(ex, client)
    ex, client = restart("w4")  # nothing left to deliver: no second copy
    assert merged == [] and len(stream_rows(spark, migrated_store, "counts")) == 3
    # a checkpoint whose file's add is only bounded (a Delta checkpoint of the rows table folded
    # it in): its commit is looked up by the commit id in its rows, and delivered as that commit
    ex.path.deliver = lambda out, *, strong: 0
    r2 = ex.flush(input_watermark_ms=40_000)  # the last window
    assert r2.productions == 1
    ex.stop()
    client.stop()
    client.close()
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, migrated_store.rows_of("buckets"))
    none = spark._jvm.scala.Option.empty()
    log.checkpoint(log.update(False, none, none), none)
    ex, client = restart("w5")
    assert merged == [] and ex.recovered == {"appended": 1, "merged": 0}
    stop_executor(ex, client)
    assert _windows(spark, migrated_store) == ALL_WINDOWS


@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])  # merge: slow suite (time)
def test_dedup_ids_of_keys_not_run_are_trimmed_past_the_horizon(spark, migrated_store, zk_config,
                                                                 write_path) -> None:  # type: ignore[no-untyped-def]
    """A key's record ids leave its row once older than the dedup horizon
    (``dedup_retention``, 10 min) even when no later batch has records of that key (image path:
    when its interval's image is rewritten; MERGE path: the row is run without records); the
    keys with records keep what the horizon needs."""
    import zlib

    from deltawheel.statestore.clock import ManualClock

    def interval(key: str) -> int:
        return zlib.crc32(key.encode()) % BucketCounter.num_intervals

    quiet = "cats"
    busy = next(k for k in (f"k{i}" for i in range(1000)) if interval(k) == interval(quiet))

    def ids(key: str) -> list[str]:  # in the key's row, or in the image path's ids files
        from pyspark.sql import functions as F

        rows = spark.read.format("delta").load(migrated_store.rows_of("buckets")).where(
            (F.col("computation") == "buckets") & F.col("key").isin(key, IDS_KEY_PREFIX + key)).collect()
        assert any(r["key"] == key for r in rows)
        return sorted(i["record_id"] for r in rows for i in r["record_ids"] or ())

    clock = ManualClock(1_700_000_000_000)
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path=write_path,
                                clock=clock)
    try:
        ex.run_batch(events(spark, [("q0", quiet, 1_000), ("b0", busy, 1_000)]), 0, input_watermark_ms=None)
        for b in (1, 2):  # a batch every 4 minutes
            clock.advance(240_000)
            ex.run_batch(events(spark, [(f"b{b}", busy, 1_000 + b)]), b, input_watermark_ms=None)
        assert ids(quiet) == ["q0"]  # within the horizon (seen 8 minutes ago)
        clock.advance(240_000)
        ex.run_batch(events(spark, [("b3", busy, 1_003)]), 3, input_watermark_ms=None)
        assert ids(quiet) == []  # seen 12 minutes ago, its key not run since: trimmed
        assert ids(busy) == ["b1", "b2", "b3"]
    finally:
        stop_executor(ex, client)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("write_path", ["image", pytest.param("merge", marks=pytest.mark.slow)])  # merge: slow suite (time)
def test_two_instances_splitting_the_intervals_give_the_rows_of_one(spark, migrated_store, migrated_template, zk_config,
                                                                   tmp_path, write_path) -> None:  # type: ignore[no-untyped-def]
    """Two executors of one computation, each holding half the intervals, read the same input
    and run each batch at the same time (two job instances): together they write exactly what
    one executor holding all of them writes — each key's records processed once, by its
    interval's owner; a dead letter written once. Their commits to the rows table (other
    partitions), deliveries to the same stream and dead-letter writes race each other."""
    import threading
    import zlib

    from conftest import copy_migrated_store
    from deltawheel.executor.protocol.executor import ComputationExecutor
    from deltawheel.statestore.exceptions import ConfigError
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager
    from executor_util import J

    def interval(key: str) -> int:
        return zlib.crc32(key.encode()) % 4

    keys = ["cats", "dogs", "eels", "fish", "gnus", "hens"]
    assert len({interval(k) < 2 for k in keys}) == 2  # both halves get records
    batches = [[(f"r{b}-{k}", k, 1_000 + 10_000 * b + i) for i, k in enumerate(keys)] for b in range(3)]

    def frame(items):  # type: ignore[no-untyped-def]
        df = events(spark, items)
        if items is batches[0]:  # one record whose key extractor fails: a dead letter
            bad = spark.createDataFrame([{"record_id": "bad", "key": "", "value": J.encode({"nope": 1}),
                                          "codec": "json", "timestamp_ms": 1_500, "event_time": None,
                                          "producer": "test", "commit_id": "pos-bad", "format_version": 1}],
                                        schema=df.schema)
            df = df.unionByName(bad)
        return df

    def run(layout, halves):  # type: ignore[no-untyped-def]
        exs = []
        for n, ivs in enumerate(halves):
            client = connect(zk_config)
            owner = IntervalOwner(RowStore(spark, layout, writer=f"i{n}"),
                                  LeaseManager(client, pipeline=f"split_{len(halves)}", owner=f"i{n}"),
                                  "buckets", num_intervals=4)
            ex = ComputationExecutor(spark, layout, BucketCounter(), owner=owner, write_path=write_path,
                                     intervals=ivs)
            ex.start(wait_s=10)
            exs.append((ex, client))
        gate = threading.Barrier(len(exs))
        errors: list[BaseException] = []

        def instance(ex):  # type: ignore[no-untyped-def]
            try:
                for b, items in enumerate(batches):
                    df = frame(items)
                    gate.wait(timeout=120)  # every instance starts batch b together
                    ex.run_batch(df, b, input_watermark_ms=10_000 * b)
                gate.wait(timeout=120)
                ex.flush(input_watermark_ms=100_000)
            except BaseException as e:
                errors.append(e)
                gate.abort()

        try:
            threads = [threading.Thread(target=instance, args=(ex,)) for ex, _c in exs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=500)
            assert not any(t.is_alive() for t in threads), "an instance hung"
            if errors:
                raise errors[0]
            return [ex.reports for ex, _c in exs]
        finally:
            for ex, client in exs:
                stop_executor(ex, client)

    ref = StoreLayout(str(tmp_path / "ref"))
    copy_migrated_store(migrated_template, tmp_path / "ref")
    one = run(ref, [None])
    two = run(migrated_store, [[0, 1], [2, 3]])
    assert _windows(spark, migrated_store) == _windows(spark, ref) and len(_windows(spark, ref)) == 3 * len(keys)
    assert state_of(spark, migrated_store, "buckets") == state_of(spark, ref, "buckets")
    processed = [sum(r.processed for r in reps) for reps in two]
    assert sum(processed) == sum(r.processed for r in one[0]) == 3 * len(keys) and min(processed) > 0
    assert sum(r.dead_letters for reps in two for r in reps) == 1  # by one instance (the table is idempotent)
    for layout in (ref, migrated_store):
        dl = spark.read.format("delta").load(layout.dead_letters).collect()
        assert [d["record_id"] for d in dl] == ["bad"]
    with pytest.raises(ConfigError, match="intervals must be a non-empty subset of 0..3, got \\[4\\]"):
        ComputationExecutor(spark, ref, BucketCounter(), owner=None, intervals=[4])  # type: ignore[arg-type]


@pytest.mark.timeout(600)
def test_a_commit_of_another_process_between_batches_is_kept(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """The image path commits on the table snapshot this JVM already holds. Another process
    commits in between (a commit file this JVM never read, adding a file to another
    computation's partition): the next batch still commits, on the version after it, and the
    other commit's file stays in the table."""
    import json
    import shutil
    import time
    from pathlib import Path

    from deltawheel.statestore.delta.txn import new_add

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image")
    try:
        ex.run_batch(events(spark, B1), 0, input_watermark_ms=None)
        v = ex.path.version
        rows = Path(migrated_store.rows_of("buckets"))
        ours = next(rows.glob("computation=buckets/interval=*/*.parquet"))
        rel = "computation=other/interval=0/part-00000-from-elsewhere.snappy.parquet"
        (rows / rel).parent.mkdir(parents=True)
        shutil.copy(ours, rows / rel)
        info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "WRITE",
                               "operationParameters": {"mode": "Append"}, "readVersion": v, "isBlindAppend": True}}
        add = new_add(rel, {"computation": "other", "interval": "0"}, (rows / rel).stat().st_size, 1)
        (rows / "_delta_log" / f"{v + 1:020d}.json").write_text(json.dumps(info) + "\n" + add + "\n")

        r1 = ex.run_batch(events(spark, B2), 1, input_watermark_ms=11_000)
        assert (r1.processed, r1.duplicates, r1.timers_fired) == (2, 1, 2)
        assert ex.path.version == v + 2
        hist = {r.version: r.readVersion for r in
                spark.sql(f"DESCRIBE HISTORY delta.`{migrated_store.rows_of('buckets')}`").select("version", "readVersion").collect()}
        assert hist[v + 2] == v  # read on the held snapshot, which had not seen v + 1
        ex.flush(input_watermark_ms=40_000)
        ex.settle()
    finally:
        stop_executor(ex, client)
    assert _windows(spark, migrated_store) == ALL_WINDOWS
    paths = {r.p for r in spark.read.format("delta").load(migrated_store.rows_of("buckets"))
             .where("computation = 'other'").selectExpr("input_file_name() AS p").collect()}
    assert len(paths) == 1 and next(iter(paths)).endswith("part-00000-from-elsewhere.snappy.parquet")


@pytest.mark.timeout(600)
def test_a_timers_only_batch_whose_watermark_passes_no_timer_publishes_it_without_a_job(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config) -> None:
    """The upstream watermark moves but passes no timer: the timers-only batch runs no Spark job and
    commits nothing, yet the low watermark it moved is published; once it passes a timer the
    batch runs and fires it."""
    from deltawheel.executor.protocol.executor import ComputationExecutor
    from deltawheel.executor.protocol.hooks import InjectorHook
    from deltawheel.executor.sources.injector import BatchStats
    from deltawheel.executor.sources.parquet import ParquetInjector
    from deltawheel.statestore.delta.log import latest_local_version
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.leases import LeaseManager
    from deltawheel.statestore.zk.watermarks import WatermarkAuthority

    comp = BucketCounter()
    client = connect(zk_config)
    authority = WatermarkAuthority(client, pipeline="idle")
    owner = IntervalOwner(RowStore(spark, migrated_store, writer="w"), LeaseManager(client, pipeline="idle", owner="w"),
                          comp.name, num_intervals=comp.num_intervals)
    folder = migrated_store.root + "/input"
    os.makedirs(folder)
    inj = ParquetInjector("events", folder, key_column=None, event_time_column="ts", watermark_delay_ms=0,
                          schema="q STRING, ts BIGINT")
    ex = ComputationExecutor(spark, migrated_store, comp, owner=owner, authority=authority,
                             upstream=["injector:events"], progress=print,
                             on_batch_end=InjectorHook(authority, [inj], checkpoint=None))
    try:
        authority.publish_injector("events", 5_000)
        ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 0)  # a timer at 9,999
        version = latest_local_version(migrated_store.rows_of(comp.name))
        authority.publish_injector("events", 8_000)
        idle = ex.flush()
        assert idle.steps_s[0][0] == "skipped: nothing due, low watermark published"
        assert latest_local_version(migrated_store.rows_of(comp.name)) == version  # no commit
        assert authority.published_low_watermark(comp.name) == 8_000
        authority.publish_injector("events", 12_000)
        due = ex.flush()
        assert due.timers_fired == 1 and not due.steps_s[0][0].startswith("skipped")
        ex.settle()  # its production's delivery held the low watermark
        assert authority.published_low_watermark(comp.name) == 12_000
        # the watermark moves again, and the injector's estimate is ahead of it: the batch runs
        # (its commit records the estimate, its step 7 publishes it)
        inj.observe(BatchStats(count=1, min_event_ms=30_000, max_event_ms=30_000, sources=frozenset()))
        authority.publish_injector("events", 15_000)
        ahead = ex.flush()
        assert not ahead.steps_s[0][0].startswith("skipped")
        assert authority.injector_watermark("events") == 30_000
    finally:
        stop_executor(ex, client)
    assert [(k, v) for _, k, v, _ in stream_rows(spark, migrated_store, "counts")] == [
        ("cats", '{"n": 1, "q": "cats", "start": 0}')]
