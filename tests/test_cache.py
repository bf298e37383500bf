"""The row cache: window-aware eviction vs LRU, and the cache benchmark's trace checked against the
workload's reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltawheel.benchmarks.cachebench import build_trace, replay, replay_opt, run_cache_bench
from deltawheel.benchmarks.rowcache import MISS, RowCache
from deltawheel.benchmarks.workload import WorkloadParams, ensure_workload
from deltawheel.statestore.exceptions import ConfigError


def _batch(cache: RowCache, wm: int, now: int, reads: list[str], writes: dict[str, int | None]) -> list[str]:
    """One batch: ``reads`` looked up (misses filled), ``writes`` key -> next event timer; returns the hits."""
    cache.begin_batch(watermark_ms=wm, now_ms=now)
    hits = [k for k in reads if cache.lookup(k) is not MISS]
    for k in reads:
        if k not in cache:
            cache.put(k, None, next_event_ms=None, next_processing_ms=None)
    for k, t in writes.items():
        cache.put(k, None, next_event_ms=t, next_processing_ms=None)
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


def _expected_access(cache: RowCache, key: str) -> float:
    """Batches from now until ``key``'s next expected access (inf: no expectation), as the policy ranks it."""
    return cache._rank(cache._entries[key])[0] - cache._batch


def test_expected_access_from_timers_and_repeats() -> None:
    cache = RowCache(10)
    _batch(cache, 0, 1_000, ["a", "b"], {"a": 20_000, "b": None})
    _batch(cache, 2_000, 2_000, ["b", "c"], {"c": None})  # the watermark advances 2 s per batch
    assert _expected_access(cache, "a") == 9  # (20,000 - 2,000) / 2,000 batches
    assert _expected_access(cache, "b") == 1  # read in consecutive batches
    assert _expected_access(cache, "c") == float("inf")  # read once, no timer: first to go
    proc = RowCache(10)
    proc.begin_batch(watermark_ms=None, now_ms=1_000)
    proc.begin_batch(watermark_ms=None, now_ms=1_500)  # 500 ms per batch
    proc.put("p", None, next_event_ms=None, next_processing_ms=4_000)
    assert _expected_access(proc, "p") == 5


def test_cache_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="positive number of rows, got 0"):
        RowCache(0)
    with pytest.raises(ConfigError, match=r"unknown cache policy 'mru'; choose one of \['window', 'lru'\]"):
        RowCache(10, policy="mru")


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
