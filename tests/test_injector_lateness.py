"""How far behind an injector's newest data a record must be to be late, with the default
settings (``max_files_per_trigger=1``, the bound estimate): a record of file k is late when its
event time is behind the newest event time of files 0..k-1 minus ``watermark_delay_ms`` -- the
watermark computed at the end of the batch before, as Spark's own stateful operators judge it, and
the one the injector's low watermark already promised downstream.

Checked with a real run: ``deltawheel.connect`` and ``engine.run`` over a JSON Lines folder, late
records routed to ``late_data`` (docs/sources.md, docs/injector-watermarks.md say the same).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.computation import Computation, LatePolicy
from pyspark import cloudpickle

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

DELAY_MS = 1_000
# one file per micro-batch (the default); after file 1 each holds two probes: one behind file k-2's
# newest event time minus the delay, one behind only file k-1's (late too)
FILES = [[10_000], [20_000], [30_000, 8_000, 15_000], [40_000, 18_500, 25_000]]


class Routed(Computation):
    name = "routed"
    inputs = {"clicks": "user"}
    late_policy = LatePolicy.ROUTE

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1


def threshold(k: int, behind: int) -> int | None:
    """The newest event time of the files ``behind`` before file k and earlier, minus the delay."""
    seen = [ts for f in FILES[:max(k - behind + 1, 0)] for ts in f]
    return max(seen) - DELAY_MS if seen else None


def late(behind: int) -> set[tuple[int, int]]:
    """(event time, threshold) of the records that rule makes late."""
    return {(ts, t) for k, f in enumerate(FILES) for ts in f
            if (t := threshold(k, behind)) is not None and ts < t}


def test_a_record_is_late_one_file_behind_with_the_default_settings(spark: Any, zk_server: Any,
                                                                     tmp_path: Path, migrated_at: Any) -> None:
    folder = tmp_path / "clicks"
    folder.mkdir()
    for k, times in enumerate(FILES):
        (folder / f"part-{k}.jsonl").write_text("".join(json.dumps({"user": f"u{ts}", "ts": ts}) + "\n"
                                                        for ts in times))
        os.utime(folder / f"part-{k}.jsonl", (1_700_000_000 + k, 1_700_000_000 + k))  # read in this order
    clicks = deltawheel.JsonLinesInjector("clicks", str(folder), schema="user STRING, ts BIGINT", key_column=None,
                                          event_time_column="ts", watermark_delay_ms=DELAY_MS, max_files_per_trigger=1)
    store = migrated_at(tmp_path / "store").root  # a migrated copy: connect migrating a new store runs in test_connect.py
    with deltawheel.connect(spark, store=store, zk=zk_server.hosts, pipeline="late") as engine:
        reports = engine.run(clicks, Routed())
        rows = spark.read.format("delta").load(engine.layout.late_data).collect()
    assert [r.records_in for r in reports if r.records_in] == [len(f) for f in FILES]  # a file per batch
    got = {(r["event_time_ms"], r["watermark_ms"]) for r in rows}
    assert got == late(behind=1)
    assert got != late(behind=2)  # judged against the previous file's newest event time, not the one before
