"""The recovery scan rebuilt from real rows: rows, timers, pending productions, Bloom filters."""

from __future__ import annotations

import heapq

import pytest
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.rowtable.recovery import TimerEntry, rebuild, recover
from deltawheel.statestore.rowtable.rows import KeyRow, Production, SeenId, TimeDomain, Timer, interval_of
from deltawheel.statestore.rowtable.store import RowStore

N = 4
J = get_codec("json")


def _rows() -> list[KeyRow]:
    rows = []
    for i in range(40):
        k = f"key{i}"
        rows.append(KeyRow(computation="dedup", key=k, interval=interval_of(k, N), state=J.encode(i),
                           timers=(Timer(10_000 - i * 7, "w"), Timer(500 + i, "p", TimeDomain.PROCESSING_TIME)),
                           record_ids=tuple(SeenId(f"{k}/r{j}", j) for j in range(5)),
                           pending=(Production(f"{k}/out", "out", k, J.encode({"i": i}), 1000 + i),) if i % 3 == 0 else ()))
    return rows


@pytest.mark.spark
def test_the_recovery_scan_rebuilds_from_real_rows(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    store = RowStore(spark, migrated_store, writer="w")
    seqs = {iv: 3 for iv in range(N)}
    store.fence("dedup", seqs)
    rows = _rows()
    store.commit("dedup", rows, sequencers=seqs, num_intervals=N)

    rec = recover(store, "dedup", range(N))
    # the rebuilt structures match the rows
    assert rec.rows == {r.key: r.with_(sequencer=3, commit_id=rec.rows[r.key].commit_id,
                                       updated_ms=rec.rows[r.key].updated_ms) for r in rows}
    want_timers = sorted(TimerEntry(t.time_ms, t.domain, r.key, t.tag) for r in rows for t in r.timers)
    assert [heapq.heappop(h) for h in [list(rec.timers)] for _ in range(len(want_timers))] == want_timers
    assert sorted(p.production_id for _, p in rec.pending) == sorted(
        p.production_id for r in rows for p in r.pending)
    assert all(rec.blooms[r.interval].might_contain(s.record_id) for r in rows for s in r.record_ids)
    assert rec.due_timers(domain=TimeDomain.PROCESSING_TIME, up_to_ms=502) == [
        TimerEntry(500, TimeDomain.PROCESSING_TIME, "key0", "p"),
        TimerEntry(501, TimeDomain.PROCESSING_TIME, "key1", "p"),
        TimerEntry(502, TimeDomain.PROCESSING_TIME, "key2", "p")]


def test_rebuild_skips_fences_and_orders_timers() -> None:
    rows = [KeyRow(computation="c", key="\x00fence", interval=0, sequencer=9),
            KeyRow(computation="c", key="b", interval=0, timers=(Timer(5, "x"), Timer(1, "y"))),
            KeyRow(computation="c", key="a", interval=0, timers=(Timer(5, "x"),))]
    rec = rebuild("c", [0], rows)
    assert sorted(rec.rows) == ["a", "b"]
    assert [heapq.heappop(rec.timers) for _ in range(3)] == [
        TimerEntry(1, TimeDomain.EVENT_TIME, "b", "y"), TimerEntry(5, TimeDomain.EVENT_TIME, "a", "x"),
        TimerEntry(5, TimeDomain.EVENT_TIME, "b", "x")]
