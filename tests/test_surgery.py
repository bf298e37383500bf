"""The surgery piece (``statestore/surgery/``): a tool's fenced replacing write of some intervals under
their leases, the hand-over request, and the audit table; real Spark, ZooKeeper and Delta."""

from __future__ import annotations

import json
from typing import Any

import pytest
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import LeaseHeldError, LeaseLostError, StaleSequencerError
from deltawheel.statestore.inspection.sqlviews import sql_frame
from deltawheel.statestore.rowtable.rows import interval_of
from deltawheel.statestore.rowtable.store import commit_metadata
from deltawheel.statestore.surgery.audit import read_audit
from deltawheel.statestore.surgery.replace import Held, Surgery, plan_replacement, replace_intervals
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.handover import read_handover
from deltawheel.statestore.zk.leases import LeaseManager
from executor_util import BucketCounter, events, start_executor, state_of, stop_executor

pytestmark = [pytest.mark.spark, pytest.mark.zk]

J = get_codec("json")
B1 = [("r1", "cats", 1_000), ("r2", "dogs", 2_000), ("r3", "cats", 3_000)]


def _ran_once(spark: Any, layout: Any, zk_config: Any) -> None:
    ex, client = start_executor(spark, layout, zk_config, BucketCounter())
    ex.run_batch(events(spark, B1), 0, input_watermark_ms=None)
    stop_executor(ex, client)


def _fix(held: Held) -> list[Any]:
    """cats' count set to 99, dogs removed (what a repair of two keys looks like)."""
    out = []
    for r in held.rows:
        if r.key == "cats":
            out.append(r.with_(state=J.encode({"0": 99})))
        elif r.key != "dogs":
            out.append(r)
    return out


def _replace(spark: Any, layout: Any, client: Any, **kw: Any) -> Any:
    args: dict[str, Any] = {"pipeline": "test", "computation": "buckets", "num_intervals": 4, "build": _fix,
                            "surgery": Surgery("repair", "set cats, drop dogs", who="tester@here"), **kw}
    return replace_intervals(spark, layout, client, **args)


@pytest.mark.slow  # about 3 min on a loaded machine (two executors, a replacing commit)
@pytest.mark.timeout(900)
def test_a_replacing_write_lands_once_is_audited_and_the_next_owner_goes_on_from_it(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config) -> None:
    _ran_once(spark, migrated_store, zk_config)
    before = state_of(spark, migrated_store, "buckets")
    assert before["cats"][0] == {"0": 2} and "dogs" in before
    plan = plan_replacement(spark, migrated_store, computation="buckets", num_intervals=4, build=_fix)
    assert plan.planned and [r.key for r in plan.upserted] == ["cats"] and [k for _, k in plan.deleted] == ["dogs"]
    assert state_of(spark, migrated_store, "buckets") == before  # the plan wrote nothing
    client = connect(zk_config)
    try:
        r = _replace(spark, migrated_store, client)
        assert read_handover(client, "test", "buckets") is None  # the request is gone with the tool
    finally:
        client.stop()
        client.close()
    after = state_of(spark, migrated_store, "buckets")
    assert after["cats"] == ({"0": 99}, before["cats"][1]) and "dogs" not in after
    assert r.rows_changed == 2 and r.version is not None
    # the audit record, as a user reads it
    got = sql_frame(spark, migrated_store, "SELECT who, tool, source, computation, intervals, rows_changed, "
                                           "commit_version FROM audit").collect()
    assert [tuple(x) for x in got] == [("tester@here", "repair", "set cats, drop dogs", "buckets", [0, 1, 2, 3], 2,
                                        r.version)]
    hist = {int(h["version"]): json.loads(h["userMetadata"]) for h in spark.sql(
        f"DESCRIBE HISTORY delta.`{migrated_store.rows_of('buckets')}`").collect() if h["userMetadata"]}
    assert hist[r.version]["kind"] == "repair" and hist[r.version]["audit_id"] == r.audit_id
    # the pipeline takes the intervals again and goes on from the replaced state
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    ex.run_batch(events(spark, [("r4", "cats", 4_000), ("r5", "dogs", 5_000)]), 1, input_watermark_ms=None)
    stop_executor(ex, client)
    final = state_of(spark, migrated_store, "buckets")
    assert final["cats"][0] == {"0": 100} and final["dogs"][0] == {"0": 1}


@pytest.mark.timeout(600)
def test_a_live_owner_is_refused_at_once_with_no_wait_and_waited_for_otherwise(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config) -> None:
    _ran_once(spark, migrated_store, zk_config)
    before = state_of(spark, migrated_store, "buckets")
    other = connect(zk_config)
    client = connect(zk_config)
    try:
        live = LeaseManager(other, pipeline="test", owner="running-copy")
        live.acquire("buckets", [interval_of("cats", 4)])  # an owner that never hands over
        with pytest.raises(LeaseHeldError, match="--no-wait: intervals .* held by a running owner .running-copy"):
            _replace(spark, migrated_store, client, no_wait=True)
        assert read_handover(client, "test", "buckets") is None  # refused before asking anybody
        with pytest.raises(LeaseHeldError, match="is held by 'running-copy'"):
            _replace(spark, migrated_store, client, wait_s=1.0)
        assert read_handover(client, "test", "buckets") is None
        # a second tool while one's request is open
        from deltawheel.statestore.zk.handover import request_handover

        request_handover(other, pipeline="test", computation="buckets", intervals=[0], tool="promote", by="x")
        with pytest.raises(LeaseHeldError, match="another tool is changing test/buckets .*promote by x"):
            _replace(spark, migrated_store, client)
        live.close()
    finally:
        for c in (other, client):
            c.stop()
            c.close()
    assert state_of(spark, migrated_store, "buckets") == before
    assert read_audit(spark, migrated_store) == []


@pytest.mark.slow  # over a minute on a loaded machine
@pytest.mark.timeout(900)
def test_a_takeover_racing_the_tool_is_decided_by_the_fence(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """The lease is broken and a new owner fences the intervals between the tool's build and its
    commit: the commit fails typed, nothing of it lands, no audit record."""
    from deltawheel.statestore.ownership.owner import IntervalOwner
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.zk.lease_tools import break_lease

    _ran_once(spark, migrated_store, zk_config)
    before = state_of(spark, migrated_store, "buckets")
    other = connect(zk_config)
    client = connect(zk_config)
    taken: dict[int, int] = {}

    def take_over(seqs: Any) -> None:
        for iv in seqs:
            break_lease(other, pipeline="test", computation="buckets", interval=iv, apply=True)
        newer = IntervalOwner(RowStore(spark, migrated_store, writer="newer"),
                              LeaseManager(other, pipeline="test", owner="newer"), "buckets", num_intervals=4)
        newer.acquire(wait_s=5)
        taken.update(newer.sequencers)

    try:
        with pytest.raises((StaleSequencerError, LeaseLostError), match="stale sequencer|taken over|lost|not held"):
            _replace(spark, migrated_store, client, before_commit=take_over)
    finally:
        for c in (other, client):
            c.stop()
            c.close()
    assert taken  # the takeover happened
    assert state_of(spark, migrated_store, "buckets") == before
    assert read_audit(spark, migrated_store) == []


@pytest.mark.slow  # two tool runs after an executor's batch: minutes on a loaded machine
@pytest.mark.timeout(1800)
def test_a_tool_dying_between_its_commit_and_its_audit_row_leaves_a_row_the_next_run_appends(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config) -> None:
    from deltawheel.statestore.surgery.audit import recover_audit

    _ran_once(spark, migrated_store, zk_config)

    def crash(version: int | None) -> None:
        raise RuntimeError(f"killed after rows version {version}")

    client = connect(zk_config)
    try:
        with pytest.raises(RuntimeError, match="killed after rows version"):
            _replace(spark, migrated_store, client, before_audit=crash)
        assert state_of(spark, migrated_store, "buckets")["cats"][0] == {"0": 99}  # the commit landed ...
        assert read_audit(spark, migrated_store) == []  # ... its audit row did not
        # the next tool run appends it first (here one that changes nothing)
        r = _replace(spark, migrated_store, client, build=lambda held: list(held.rows))
    finally:
        client.stop()
        client.close()
    audit = read_audit(spark, migrated_store)
    assert len(audit) == 2 and audit[1]["audit_id"] == r.audit_id and audit[1]["rows_changed"] == 0
    lost = audit[0]
    version = next(v for v, m in commit_metadata(spark, migrated_store, "buckets") if m and m.get("audit_id") == lost["audit_id"])
    assert (lost["tool"], lost["who"], lost["pipeline"], lost["computation"], lost["commit_version"]) == (
        "repair", "tester@here", "test", "buckets", version)
    assert (lost["rows_upserted"], lost["rows_deleted"], lost["source"]) == (1, 1, "set cats, drop dogs")
    assert json.loads(lost["detail"])["recovered"] is True
    assert recover_audit(spark, migrated_store) == [] and len(read_audit(spark, migrated_store)) == 2  # once


@pytest.mark.slow  # an executor's batch and a replacing commit: minutes on a loaded machine
@pytest.mark.timeout(1200)
def test_a_replacement_writes_no_empty_rows_and_gives_the_intervals_back_before_its_audit_row(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config) -> None:
    """A promote wrote a row for every key the replay's state TTL had dropped (record ids alone):
    such a row for a key that has none is not written; one that empties an existing key is. The
    pipeline gets the intervals back as soon as the commit landed (the request gone, no owner)
    while the audit row is still to append. The recovery scan the tool ran on (read in Python)
    holds what Spark reads; the old owner's checkpointed productions already in their stream are
    not delivered again, and the rows it writes no longer hold them (the owner's recovery would
    deliver them again)."""
    from deltawheel.statestore.rowtable.rows import KeyRow, Production, SeenId
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.writepath.delivery import deliver_productions, undelivered

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    ex.run_batch(events(spark, B1), 0, input_watermark_ms=None)
    ex.run_batch(events(spark, [("r4", "cats", 15_000)]), 1, input_watermark_ms=12_000)  # fires cats', dogs' 0 s
    stop_executor(ex, client)  # their productions delivered, still checkpointed in the rows
    held = {r.key: r for r in RowStore(spark, migrated_store, writer="t").scan_intervals("buckets", range(4))}
    assert held["cats"].pending and held["dogs"].pending
    # the rows of the intervals as the recovery scan reads them (Python) and as Spark reads them
    store = RowStore(spark, migrated_store, writer="t")
    scanned = store.scan_intervals("buckets", range(4), include_fences=True)
    by_spark = [KeyRow.from_row(r) for r in spark.read.format("delta").load(migrated_store.rows_of("buckets"))
                .where("computation = 'buckets'").collect()]
    def rows(got: list[Any]) -> list[str]:
        return sorted(json.dumps(r.to_row(), sort_keys=True, default=repr) for r in got)

    assert rows(scanned) == rows([r for r in by_spark if not r.key.startswith("\x00id:")])
    assert {r.key for r in scanned} >= {"cats", "dogs"} and any(r.is_fence for r in scanned)
    # productions: one in its stream already, one not
    landed, missing = (Production(f"p-{i}", "counts", "cats", J.encode({"n": i}), 5_000, "json") for i in (1, 2))
    deliver_productions(spark, migrated_store, [landed], producer="buckets")
    assert undelivered(spark, migrated_store, [landed, missing]) == [missing]

    seen: dict[str, Any] = {}

    def empty_ghost(held: Held) -> list[Any]:
        # cats emptied (no state, no timers): an existing key's change, written
        out = [r.with_(state=None, timers=()) if r.key == "cats" else r for r in held.rows]
        ghost = KeyRow(computation="buckets", key="ghost", interval=interval_of("ghost", 4),
                       record_ids=(SeenId("r9", 1),))
        return out + [ghost]  # ids alone, for a key with no row: not written

    client = connect(zk_config)

    def at_audit(version: int | None) -> None:
        from deltawheel.statestore.zk.lease_tools import list_leases

        seen["request"] = read_handover(client, "test", "buckets")
        seen["owners"] = {x["owner"] for x in list_leases(client, pipeline="test") if x["computation"] == "buckets"}
        seen["version"] = version

    try:
        r = _replace(spark, migrated_store, client, build=empty_ghost, before_audit=at_audit)
    finally:
        client.stop()
        client.close()
    # given back before the audit row: no request, no owner
    assert seen == {"request": None, "owners": {None}, "version": r.version} and r.version is not None
    assert [x.key for x in r.upserted] == ["cats"] and r.deleted == ()
    after = state_of(spark, migrated_store, "buckets")
    assert "ghost" not in after and after["cats"] == (None, [])
    now = {x.key: x for x in RowStore(spark, migrated_store, writer="t").scan_intervals("buckets", range(4))}
    assert now["cats"].pending == () and now["dogs"].pending == held["dogs"].pending  # only the row written
    ids = [x["record_id"] for x in spark.read.format("delta").load(migrated_store.stream("counts")).collect()]
    assert sorted(ids) == sorted({*ids}) and {p.production_id for p in held["cats"].pending} <= set(ids)
    assert [a["audit_id"] for a in read_audit(spark, migrated_store)] == [r.audit_id]
