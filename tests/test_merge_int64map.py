"""A columnar computation (``process_columns``, state in the ``int64map`` codec) run on the MERGE
write path, end to end through the executor: the MERGE path has no columnar call, so every key
runs per record on the packed state. The same batches (a replay of a processed record, a late
record, windows fired by the watermark across batches) on the image path and on the MERGE path
give the same state, timers and stream records, and the MERGE path's rows keep the ``int64map``
codec."""

from __future__ import annotations

import dataclasses
import sys

import pytest
from deltawheel.statestore.codecs import get_codec
from executor_util import events, start_executor, stop_executor
from pyspark import cloudpickle
from restart_job import WinCount

pytestmark = [pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules


class PackedCount(WinCount):
    """restart_job's count per key and 10-s window in ``int64map`` state (declaring the columnar path
    too), over the executor tests' events, keyed by their query ``q``."""

    name = "packed"
    inputs = {"events": "q"}
    num_intervals = 2


BATCHES: list[tuple[list[tuple[str, str, int]], int | None]] = [
    ([("r1", "cats", 1_000), ("r2", "cats", 2_000), ("r3", "dogs", 3_000), ("r4", "cats", 12_000)], None),
    ([("r2", "cats", 2_000), ("r5", "dogs", 14_000), ("r6", "owls", 15_000)], 11_000),  # r2 again
    ([("r7", "cats", 21_000), ("r8", "dogs", 4_000), ("r9", "owls", 16_000)], 30_000),  # r8: late
]


def _run(spark, layout, zk_config, write_path: str):  # type: ignore[no-untyped-def]
    ex, client = start_executor(spark, layout, zk_config, PackedCount(), write_path=write_path)
    try:
        assert ex.write_path == write_path
        reports = [ex.run_batch(events(spark, items), b, input_watermark_ms=wm)
                   for b, (items, wm) in enumerate(BATCHES)]
        reports.append(ex.flush(input_watermark_ms=60_000))
    finally:
        stop_executor(ex, client)
    rows = spark.read.format("delta").load(layout.rows_of("packed")).where("computation = 'packed' AND key NOT LIKE '\u0000%'")
    state = {r["key"]: (r["codec"], None if r["state"] is None else get_codec(r["codec"]).decode(r["state"]),
                        sorted((t["tag"], t["time_ms"]) for t in r["timers"])) for r in rows.collect()}
    out = sorted((r["record_id"], r["key"], r["codec"], tuple(get_codec(r["codec"]).decode(r["value"])),
                  r["timestamp_ms"])
                 for r in spark.read.format("delta").load(layout.stream("counts")).collect())
    counts = [(r.processed, r.duplicates) for r in reports]
    return state, out, counts


@pytest.mark.timeout(900)
@pytest.mark.slow  # two write paths over one job; each path's int64 map: test_columnar.py, test_writepath_contract.py
def test_an_int64map_computation_on_the_merge_path_matches_the_image_path(  # type: ignore[no-untyped-def]
        spark, zk_config, migrated_template, tmp_path) -> None:
    from conftest import copy_migrated_store  # the session's migrated store, copied
    from deltawheel.statestore.layout import StoreLayout

    results = {}
    for path in ("image", "merge"):
        layout = StoreLayout(str(tmp_path / path))
        copy_migrated_store(migrated_template, tmp_path / path)
        # a pipeline's ZooKeeper state is bound to one store: each store its own chroot
        results[path] = _run(spark, layout, dataclasses.replace(zk_config, chroot=f"{zk_config.chroot}-{path}"), path)
    image, merge = results["image"], results["merge"]
    state, out, counts = merge
    assert counts[1] == (2, 1)  # r2 was a duplicate
    assert sum(p for p, _ in counts) == 9  # every distinct record once
    # every window fired once with its count; the late r8 reopened dogs' closed window 0 and fired it again
    assert sorted(v for _, _, _, v, _ in out) == sorted([
        ("cats", 0, 2), ("cats", 10_000, 1), ("cats", 20_000, 1), ("dogs", 0, 1), ("dogs", 0, 1),
        ("dogs", 10_000, 1), ("owls", 10_000, 2)])
    assert {c for _, _, c, _, _ in out} == {"int64map"}
    assert merge == image
    assert all(st is None and not timers for _, st, timers in state.values())

