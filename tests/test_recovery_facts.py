"""A restart's recovery takes each interval's facts (oldest work, next processing time, fence) from
the tags of the files the image path's commits added, not from reading the images
(``statestore/writepath/image/recovery.py``). Whatever batches came before, and whether the last
one crashed after its commit (checkpoints left to deliver), the recovery with the tags finds what
reading every file finds."""

from __future__ import annotations

import random

import pytest
from deltawheel.executor.protocol.faults import FaultPoint
from deltawheel.statestore.writepath.image.recovery import _facts, scan
from executor_util import BucketCounter, events, start_executor, stop_executor

pytestmark = [pytest.mark.spark, pytest.mark.zk]


class Crash(Exception):
    """The process dying right after a commit."""


def _both(ex):  # type: ignore[no-untyped-def]
    """The recovery with the tags and by reading every file, on the files a new owner reads."""
    path = ex.path
    path._load()
    args = dict(name=path.name, sequencers=path.owner.sequencers, retention_ms=path.retention_ms)
    fast = scan(path.rows_files, path.files, use_facts=True, **args)
    full = scan(path.rows_files, path.files, use_facts=False, **args)
    used = [iv for iv, fs in path.files.items() if fs and _facts(fs, path.retention_ms) is not None]
    return fast, full, used


def _checkpoints(found):  # type: ignore[no-untyped-def]
    return sorted((c.stream, c.interval, c.commit_id, sorted(p.production_id for p in c.prods)) for c in found[1])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_recovery_from_the_tags_finds_what_reading_the_images_finds(spark, zk_config, migrated_store,  # type: ignore[no-untyped-def]
                                                                        seed: int) -> None:
    rng = random.Random(seed)
    crash_at = rng.randrange(2, 5)

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point == FaultPoint.AFTER_COMMIT and batch_id == crash_at:
            raise Crash(point)

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), faults=faults,
                                write_path="image")
    used_any = False
    try:
        seen: list[tuple[str, str, int]] = []
        t = 0
        for b in range(crash_at + 1):
            items = []
            for _ in range(rng.randrange(1, 12)):
                t += rng.randrange(0, 4_000)
                if seen and rng.random() < 0.2:  # a record again: a duplicate
                    items.append(rng.choice(seen))
                else:
                    items.append((f"s{seed}-b{b}-{len(items)}", rng.choice("abcdefg"), t))
            seen += items
            # the crashed batch passes every bucket: its productions are the checkpoints left
            wm = t + 20_000 if b == crash_at else t - rng.randrange(0, 15_000)
            if b == crash_at:
                with pytest.raises(Crash):
                    ex.run_batch(events(spark, items), b, input_watermark_ms=wm)
            else:
                ex.run_batch(events(spark, items), b, input_watermark_ms=wm)
            fast, full, used = _both(ex)
            used_any = used_any or bool(used)
            assert fast[0].oldest == full[0].oldest, b
            assert fast[0].next_processing == full[0].next_processing, b
            assert _checkpoints(fast) == _checkpoints(full), b
        # the crashed batch left checkpoints: those intervals are read, not taken from the tags
        pending = {c.interval for c in full[1]}
        assert pending and not pending & set(used)
        # a Delta checkpoint of the log (files from it: the tags as a map, added_at a bound)
        from deltawheel.gc.logs import checkpoint_newest

        assert checkpoint_newest(spark, ex.path.layout.rows_of(ex.path.name)) is not None
        fast, full, used_after = _both(ex)
        assert (fast[0].oldest, fast[0].next_processing, _checkpoints(fast)) == \
            (full[0].oldest, full[0].next_processing, _checkpoints(full))
        assert set(used_after) == set(used)
    finally:
        stop_executor(ex, client)
    assert used_any  # the tags were used, not only read past
