"""The Python worker's image cache (``executor/tasks/image/cache.py``): bounded by bytes, evicting
the image whose next use is furthest away (its timers against the watermark, its rhythm of use),
and its hit rate in the batch line and the metrics table."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest
from deltawheel.executor.protocol.metrics import METRICS_COLUMNS, BatchMetrics, batch_row, read_batches
from deltawheel.executor.protocol.reports import BatchReport, format_report
from deltawheel.executor.tasks.image.cache import ImageCache, image_facts, max_bytes_from_env
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout


def _put(cache: ImageCache, iv: int, next_ev: int | None, size: int = 100) -> None:
    key = (f"img-{iv}",)
    assert cache.get(key, slot=("c", iv)) is None
    cache.put(key, f"image {iv}", nbytes=size, next_ev=next_ev, slot=("c", iv), group="c")


@pytest.mark.parametrize("timers", [(900, None), (1_300, 900_000)])
def test_the_cache_holds_at_most_its_bytes_and_keeps_the_image_due_soonest(timers) -> None:  # type: ignore[no-untyped-def]
    """Room for two images; interval 0's earliest timer falls due before interval 1's (already
    due / in 2 batches against 9,000, or 1 has none): when a third comes, the window-aware cache
    drops 1, LRU drops 0 (the older)."""
    kept = {}
    for policy in ("window", "lru"):
        cache = ImageCache(200, policy=policy)
        cache.observe("c", 1_000)
        cache.observe("c", 1_100)  # the watermark advances 100 ms per batch
        _put(cache, 0, timers[0])
        _put(cache, 1, timers[1])
        _put(cache, 2, None)
        assert cache.bytes == 200 and len(cache) == 2 and cache.evictions == 1
        kept[policy] = {iv for iv in range(3) if (f"img-{iv}",) in cache}
    assert kept == {"window": {0, 2}, "lru": {1, 2}}


def test_an_interval_used_every_batch_is_kept_over_one_used_once() -> None:
    cache = ImageCache(200)
    for _ in range(3):  # interval 0 comes round every batch: hits after the first
        cache.get(("img-0",), slot=("c", 0)) or cache.put(("img-0",), "0", nbytes=100, slot=("c", 0), group="c")
        cache.get(("x",), slot=("c", 9))  # another interval's lookup in between
    _put(cache, 1, None)
    _put(cache, 2, None)  # full: 1 (used once, no timer) goes, 0 stays
    assert ("img-0",) in cache and ("img-1",) not in cache
    assert cache.hits == 2 and cache.lookups == 8


@pytest.mark.parametrize("intervals,room", [(4, 1), (8, 1), (8, 2), (16, 1), (16, 4), (32, 6)])
def test_a_worker_holding_more_intervals_than_fit_keeps_some_instead_of_evicting_each_before_its_use(
        intervals, room) -> None:  # type: ignore[no-untyped-def]
    """Each batch looks up every interval in turn and writes its new image; room for ``room`` of
    them and half of one more. LRU evicts every image before its next use; the window-aware policy does not
    keep a new image whose next use is further than every kept one's, and closes at least half of
    LRU's gap to Belady's optimum on the same lookups."""
    from deltawheel.benchmarks.cachebench import replay_trace, replay_trace_opt

    events = []
    for b in range(10):
        for iv in range(intervals):
            events.append({"op": "get", "comp": "c", "iv": iv, "paths": [f"iv{iv}-b{b - 1}"] if b else [],
                           "bytes": 100 if b else 0, "wm": None, "next_ev": None})
            events.append({"op": "put", "comp": "c", "iv": iv, "paths": [f"iv{iv}-b{b}"], "bytes": 100,
                           "next_ev": None})
    bound = room * 100 + 50
    lru, window = (replay_trace(events, p, bound)["hits"] for p in ("lru", "window"))
    best = replay_trace_opt(events, bound)["hits"]
    assert lru == 0 and best > 0
    assert window - lru >= (best - lru) / 2


def test_an_image_whose_interval_another_worker_took_goes_before_the_ones_still_used() -> None:
    """Four intervals every batch, then interval 0 runs on another worker: its last image here is
    no longer looked up. Once its use is missed by a whole batch it is expected no more, and goes
    before the images of the three intervals still run here (room for three and a half)."""
    cache = ImageCache(350)
    hits = []
    for b in range(10):
        for iv in range(4) if b < 3 else range(1, 4):
            before = cache.hits
            cache.get((f"iv{iv}-b{b - 1}",), slot=("c", iv))
            hits.append(cache.hits - before)
            cache.put((f"iv{iv}-b{b}",), "x", nbytes=100, slot=("c", iv), group="c")
    assert ("iv0-b2",) not in cache
    assert hits[-9:] == [1] * 9  # the last three batches: every lookup a hit


def _held(cache: ImageCache, iv: int, n: int) -> list[int]:
    return [b for b in range(n) if (f"iv{iv}-b{b}",) in cache]


def test_an_intervals_images_before_its_previous_one_are_dropped_though_there_is_room() -> None:
    """A worker keeps an interval's current image and the one before it (a retried batch reads
    that), not every image the interval had: the bound is far from reached."""
    cache = ImageCache(2**30)
    cache.put(("iv1-b0",), "other", nbytes=100, slot=("c", 1), group="c")
    for b in range(4):  # images put without a lookup in between
        cache.put((f"iv0-b{b}",), f"b{b}", nbytes=100, slot=("c", 0), group="c")
    assert _held(cache, 0, 4) == [2, 3]
    assert ("iv1-b0",) in cache and cache.bytes == 300 and cache.evictions == 0


def test_the_previous_image_goes_when_the_next_batch_looks_up_the_current_and_a_retry_reads_it() -> None:
    """Batch b reads the image batch b-1 wrote and writes its own; the image before (kept for a
    retry of batch b-1) goes at that lookup: batch b-1 has committed. A retry of batch b reads
    batch b-1's image again, and batch b's own (never committed) goes."""
    cache = ImageCache(2**30)
    cache.put(("iv1-b0",), "other", nbytes=100, slot=("c", 1), group="c")
    cache.put(("iv0-b0",), "b0", nbytes=100, slot=("c", 0), group="c")
    for b in range(1, 4):
        assert cache.get((f"iv0-b{b - 1}",), slot=("c", 0)) == f"b{b - 1}"
        assert _held(cache, 0, 4) == [b - 1]
        cache.put((f"iv0-b{b}",), f"b{b}", nbytes=100, slot=("c", 0), group="c")
        assert _held(cache, 0, 4) == [b - 1, b]
    assert cache.get(("iv0-b2",), slot=("c", 0)) == "b2"  # batch 3 did not commit: its retry
    assert _held(cache, 0, 4) == [2] and cache.get(("iv0-b2",), slot=("c", 0)) == "b2"
    cache.put(("iv0-b3",), "b3 again", nbytes=100, slot=("c", 0), group="c")
    assert cache.get(("iv0-b3",), slot=("c", 0)) == "b3 again" and _held(cache, 0, 4) == [3]
    assert ("iv1-b0",) in cache and cache.bytes == 200 and cache.evictions == 0
    assert cache.hits == 6 and cache.lookups == 6


def test_an_image_alone_over_the_bound_is_not_kept_and_a_bad_bound_is_refused(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cache = ImageCache(50)
    cache.put(("big",), "x", nbytes=80, slot=("c", 0), group="c")
    assert ("big",) not in cache and cache.bytes == 0
    monkeypatch.setenv("DELTAWHEEL_IMAGE_CACHE_BYTES", "512m")
    assert max_bytes_from_env() == 512 * 2**20
    monkeypatch.setenv("DELTAWHEEL_IMAGE_CACHE_BYTES", "lots")
    with pytest.raises(ConfigError, match="DELTAWHEEL_IMAGE_CACHE_BYTES='lots' is not a size"):
        max_bytes_from_env()
    with pytest.raises(ConfigError, match="unknown image cache policy 'fifo'"):
        ImageCache(10, policy="fifo")


def test_an_images_earliest_timer_is_read_from_its_rows() -> None:
    t = pa.table({"key": ["a", "b", "c"], "next_event_timer_ms": pa.array([None, 7, 3], pa.int64())})
    assert image_facts(t) == 3
    assert image_facts(t.slice(0, 1)) is None


def test_the_batch_line_shows_the_image_cache_hit_rate() -> None:
    report = dataclasses.replace(BatchReport.empty(3, input_watermark_ms=None, low_watermark_ms=None, wall_s=0.1),
                                 intervals_run=4, images_read=1)
    assert report.image_cache_hit_rate == 0.75
    assert "1/4 images read (cache hit 75 %)" in format_report("c", report)


def test_a_metrics_table_of_an_older_deltawheel_gets_the_hit_rate_column(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    layout = StoreLayout(str(tmp_path / "store"))
    old_columns = METRICS_COLUMNS.replace(", image_cache_hit_rate DOUBLE", "")
    assert old_columns != METRICS_COLUMNS
    spark.sql(f"CREATE TABLE delta.`{layout.metrics_batches}` ({old_columns}) USING DELTA")
    report = dataclasses.replace(BatchReport.empty(7, input_watermark_ms=None, low_watermark_ms=None, wall_s=0.1),
                                 intervals_run=2, images_read=1)
    metrics = BatchMetrics(spark, layout)
    assert metrics.append(batch_row(report, pipeline="p", computation="c", instance=None, write_path="image",
                                    started_ms=0))
    assert "image_cache_hit_rate" in spark.read.format("delta").load(layout.metrics_batches).columns
    assert [(r["batch_id"], r["image_cache_hit_rate"]) for r in read_batches(layout)] == [(7, 0.5)]


def test_bench_cache_replays_the_batch_paths_recorded_trace(spark, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The image task records its lookups (``DELTAWHEEL_IMAGE_CACHE_TRACE``); ``deltawheel bench cache
    --trace`` replays them through the window-aware cache, LRU and the offline optimum."""
    import json
    import os
    import random

    from deltawheel.executor.tasks.image import cache
    from test_vectorised import WindowSum, _batches, _run_image

    from deltawheel.cli import main

    folder = tmp_path / "trace"
    folder.mkdir()
    monkeypatch.setattr(cache, "_TRACED", str(folder))
    cache._IMAGES.clear()
    os.makedirs(tmp_path / "run")
    _run_image(WindowSum(), str(tmp_path / "run"), _batches(random.Random(3), 8), True)
    events = [json.loads(line) for f in folder.glob("images-*.jsonl") for line in f.read_text().splitlines()]
    gets = [e for e in events if e["op"] == "get"]
    assert len(gets) == 2 * 8 and {e["iv"] for e in gets} == {0, 1}
    assert sum(e["hit"] for e in gets) == 2 * 7  # the worker held each image it wrote the batch before
    assert main(["bench", "cache", "--trace", str(folder), "--out", str(tmp_path / "out"),
                 "--capacities", "0.5,1"]) == 0
    report = json.loads((tmp_path / "out" / "cache_trace.json").read_text())
    full = report["runs"][1]
    # at the peak of live bytes the window-aware cache keeps every current image (an interval's
    # previous image, wanted only by a retry, goes first); LRU drops the other interval's instead
    assert report["recorded_hit_rate"] == full["window"]["hit_rate"] == full["opt"]["hit_rate"] == 0.875
    assert full["lru"]["hit_rate"] < 0.875
    half = report["runs"][0]
    assert half["opt"]["hit_rate"] >= max(half["window"]["hit_rate"], half["lru"]["hit_rate"])
    assert "image lookups" in capsys.readouterr().out
    assert main(["bench", "cache", "--trace", str(tmp_path / "out"), "--out", str(tmp_path / "out2")]) \
        == ConfigError.exit_code
    assert "ConfigError: " in (err := capsys.readouterr().err) and "no image cache trace" in err
