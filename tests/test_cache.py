"""The row cache: window-aware eviction vs LRU, grants, the owner's cache-first reads on a real
store, and the cache benchmark's trace checked against the workload's reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltawheel.benchmarks.cachebench import build_trace, replay, replay_opt, run_cache_bench
from deltawheel.benchmarks.workload import WorkloadParams, ensure_workload
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import ConfigError, LeaseLostError, NotOwnerError, StaleSequencerError
from deltawheel.statestore.ownership.owner import IntervalOwner
from deltawheel.statestore.rowtable.cache import MISS, RowCache
from deltawheel.statestore.rowtable.rows import KeyRow, SeenId, TimeDomain, Timer, interval_of
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.leases import LeaseManager, break_lease

J = get_codec("json")


def _batch(cache: RowCache, wm: int, now: int, reads: list[str], writes: dict[str, int | None]) -> list[str]:
    """One batch: ``reads`` looked up (misses filled), ``writes`` key -> next event timer; returns the hits."""
    cache.begin_batch(watermark_ms=wm, now_ms=now)
    hits = [k for k in reads if cache.lookup(k, interval=0, sequencer=1) is not MISS]
    for k in reads:
        if k not in cache:
            cache.put(k, None, interval=0, sequencer=1, next_event_ms=None, next_processing_ms=None)
    for k, t in writes.items():
        cache.put(k, None, interval=0, sequencer=1, next_event_ms=t, next_processing_ms=None)
    cache.end_batch()
    return hits


@pytest.mark.parametrize("policy", ["window", "lru"])
def test_window_aware_eviction_keeps_the_row_whose_timer_comes_next(policy: str) -> None:
    cache = RowCache(2, policy=policy)
    # batch 1 (watermark 0): "soon" has a timer the watermark passes next batch, "far" one in 50 s,
    # "once" none (no expectation); "soon" was read first, so LRU drops it
    _batch(cache, 0, 1_000, ["soon", "far", "once"], {"soon": 900, "far": 50_000, "once": None})
    kept = {k for k in ("soon", "far", "once") if k in cache}
    hits = _batch(cache, 1_000, 2_000, ["soon"], {"soon": None})
    if policy == "window":
        assert kept == {"soon", "far"} and hits == ["soon"]
    else:
        assert kept == {"far", "once"} and hits == []


def test_expected_access_from_timers_and_repeats() -> None:
    cache = RowCache(10)
    _batch(cache, 0, 1_000, ["a", "b"], {"a": 20_000, "b": None})
    _batch(cache, 2_000, 2_000, ["b", "c"], {"c": None})  # the watermark advances 2 s per batch
    assert cache.expected_access("a") == 9  # (20,000 - 2,000) / 2,000 batches
    assert cache.expected_access("b") == 1  # read in consecutive batches
    assert cache.expected_access("c") == float("inf")  # read once, no timer: first to go
    proc = RowCache(10)
    proc.begin_batch(watermark_ms=None, now_ms=1_000)
    proc.begin_batch(watermark_ms=None, now_ms=1_500)  # 500 ms per batch
    proc.put("p", KeyRow("c", "p", 0, timers=(Timer(4_000, "t", TimeDomain.PROCESSING_TIME),)), interval=0,
             sequencer=1)
    assert proc.expected_access("p") == 5


def test_an_entry_is_served_only_under_its_own_grant() -> None:
    cache = RowCache(4)
    row = KeyRow("c", "k", 2, state=J.encode(1))
    cache.put("k", row, interval=2, sequencer=7)
    assert cache.lookup("k", interval=2, sequencer=7) == row
    assert cache.lookup("k", interval=2, sequencer=8) is MISS  # a later grant: read the table
    assert "k" not in cache and (cache.stats.hits, cache.stats.misses, cache.stats.stale) == (1, 1, 1)
    cache.put("gone", None, interval=2, sequencer=8)
    assert cache.lookup("gone", interval=2, sequencer=8) is None  # known to have no row
    cache.put("x", None, interval=3, sequencer=8)
    assert cache.invalidate([2]) == 1 and "x" in cache and "gone" not in cache


def test_cache_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="positive number of rows, got 0"):
        RowCache(0)
    with pytest.raises(ConfigError, match=r"unknown cache policy 'mru'; choose one of \['window', 'lru'\]"):
        RowCache(10, policy="mru")


@pytest.mark.spark
@pytest.mark.zk
def test_owner_reads_cache_first_and_never_serves_a_row_of_a_lost_lease(spark, migrated_store,
                                                                         zk_config) -> None:  # type: ignore[no-untyped-def]
    a_client, b_client, admin = connect(zk_config), connect(zk_config), connect(zk_config)
    try:
        store = RowStore(spark, migrated_store, writer="a")
        a = IntervalOwner(store, LeaseManager(a_client, pipeline="p", owner="a"), "c", num_intervals=1,
                          cache=RowCache(100))
        a.acquire()
        a.commit([KeyRow("c", "k1", 0, state=J.encode(1), record_ids=(SeenId("r1", 5),)),
                  KeyRow("c", "k2", 0, state=J.encode(2), timers=(Timer(9_000, "w"),))])
        before = store.stats.keys_read
        got = a.read(["k1", "k2", "nothing"])
        assert store.stats.keys_read == before  # all three answered from memory (incl. "no row")
        assert got == store.read_keys("c", ["k1", "k2", "nothing"], num_intervals=1)  # = the table, exactly
        a.commit([got["k1"].with_(state=J.encode(10))], deletes=[(0, "k2")])
        assert {k: J.decode(r.state) for k, r in a.read(["k1", "k2"]).items()} == {"k1": 10}
        assert store.stats.keys_read == before + 3

        # a takeover a does not notice: its lease is broken, b fences and writes k1
        break_lease(admin, pipeline="p", computation="c", interval=0, apply=True)
        b_store = RowStore(spark, migrated_store, writer="b")
        b = IntervalOwner(b_store, LeaseManager(b_client, pipeline="p", owner="b"), "c", num_intervals=1)
        b.acquire()
        b.commit([KeyRow("c", "k1", 0, state=J.encode(99))])
        # the zombie may still read its memory, but nothing it computes from it can land
        with pytest.raises(StaleSequencerError):
            a.commit([a.read(["k1"])["k1"].with_(state=J.encode(11))])
        assert len(a.cache or ()) == 0  # its cache went with its grants
        with pytest.raises(LeaseLostError, match="no intervals of 'c' are held"):
            a.read(["k1"])
        b.release()
        a.acquire()  # a new grant for a: what it cached before is worthless
        assert J.decode(a.read(["k1"])["k1"].state) == 99
        half = IntervalOwner(store, a.leases, "c2", num_intervals=2, cache=RowCache(10))
        half.acquire([0])
        other = next(k for k in (f"k{i}" for i in range(100)) if interval_of(k, 2) == 1)
        with pytest.raises(NotOwnerError, match=f"key '{other}' is in interval 1 of 'c2', which this instance"):
            half.read([other])
        a.release()
        assert len(a.cache or ()) == 0
    finally:
        for c in (a_client, b_client, admin):
            c.stop()
            c.close()


def test_cache_bench_trace_matches_the_workload_and_opt_bounds_both(tmp_path: Path) -> None:
    data = ensure_workload("tiny", root=tmp_path / "data", params=WorkloadParams(n=20_000, b=2_000, k=500, rate=100))
    trace = build_trace(data.files)
    ref = data.reference
    assert (trace.fired, trace.late) == (ref.emitted_rows, ref.late_dropped)  # every window fired once
    assert len(trace.batches) == data.params.n_files + 1
    for cap in (25, 100, 300):
        lru, win, opt = replay(trace, "lru", cap), replay(trace, "window", cap), replay_opt(trace, cap)
        for r in (lru, win, opt):
            assert r["hits"] + r["misses"] == trace.lookups and r["misses"] >= trace.distinct_keys
        assert opt["hits"] >= win["hits"] and opt["hits"] >= lru["hits"]
    lines: list[str] = []
    report = run_cache_bench("tiny", out=tmp_path / "out", capacities=(0.1, 0.3), data_root=tmp_path / "data",
                             params=data.params, progress=lines.append)
    saved = json.loads((tmp_path / "out" / "cache.json").read_text())
    assert saved["runs"] == report["runs"] and [r["capacity"] for r in saved["runs"]] == [
        round(0.1 * trace.distinct_keys), round(0.3 * trace.distinct_keys)]
    assert (tmp_path / "out" / "cache.png").stat().st_size > 0 and len(lines) == 3
