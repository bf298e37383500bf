"""The interval's Bloom filter of record ids after a batch with no input that still changes the
interval's files (ids files past the dedup horizon dropped): the worker keeps the filter it had
for the new file list (its ids are a subset of the old ones), so the next batch with input does
not build it again from every id (``executor/tasks/image/dedup.py``, ``carry_bloom``)."""

from __future__ import annotations

from deltawheel.executor.tasks.image import dedup
from image_util import RETENTION, T0, Interval, cold


def _iv(out):  # type: ignore[no-untyped-def]
    return next(s for s in out if s.get("interval") == 0)


def test_a_batch_without_input_that_drops_ids_files_keeps_the_filter(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cold()
    store = Interval(str(tmp_path))
    for b in range(3):
        assert _iv(store.run([(f"r{b}", f"k{b}")], b=b, now_ms=T0 + b * 1_000))["processed"] == 1
    built = next(reversed(dedup._BLOOMS.values()))  # the filter of the interval's current files
    out = _iv(store.run([], b=3, now_ms=T0 + 1_000 + RETENTION + 1))  # two ids files leave the horizon
    assert len(out["ids_removed"]) == 2 and len(store.ids_files()) == 1
    assert next(reversed(dedup._BLOOMS.values())) is built  # kept for the new file list
    # the next batch with input uses it (none built), and dedup stays exact: r2 within the horizon
    again = _iv(store.run([("r2", "k2"), ("r9", "k9")], b=4, now_ms=T0 + 1_000 + RETENTION + 2))
    assert (again["processed"], again["duplicates"]) == (1, 1)
    assert next(reversed(dedup._BLOOMS.values())) is built
