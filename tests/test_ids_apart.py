"""Record ids apart from the state (``executor/tasks/image/idsfiles.py``): each batch adds a small
ids file per interval, the key rows no longer carry ids, the dedup reads the ids files (also
with a cold worker cache), files past the dedup horizon are dropped whole, files of one time
bucket merge by levels, and images written with ids in the key rows keep working."""

from __future__ import annotations

import os
import sys
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltawheel.executor.computation import Computation
from deltawheel.executor.tasks.image import idsfiles
from deltawheel.executor.tasks.image import interval as _imagetask
from deltawheel.executor.tasks.image.interval import ImageSpec, _run
from deltawheel.executor.tasks.input import PREP_DDL
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.rowtable.frames import arrow_schema as _arrow
from deltawheel.statestore.rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX, rows_file_ddl
from deltawheel.statestore.writepath.image.files import ids_level, is_ids_path
from deltawheel.statestore.writepath.image.summary import SUMMARY_DDL
from deltawheel.statestore.writepath.streams import stream_schema_ddl
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

N_IV = 2
SEQ = 3
RETENTION = 60_000


class Count(Computation):
    """Counts each key's records."""

    name = "count"
    inputs = {"events": "k"}
    outputs = ("out",)
    num_intervals = N_IV

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1


def _cold() -> None:
    """A Python worker that never saw the interval (a restart): no image, filter or ids file cached."""
    _imagetask._CACHE.clear()
    _imagetask._BLOOMS.clear()
    idsfiles._FILES.clear()


class Interval:
    """One computation's interval files in a folder, advanced as the driver's commits would."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.schema = _arrow(rows_file_ddl())
        self.images: dict[int, tuple[str, ...]] = {}
        os.makedirs(os.path.join(root, "out"), exist_ok=True)
        for iv in range(N_IV):
            fence = pa.Table.from_pylist([{"key": FENCE_KEY, "sequencer": SEQ, "record_ids": [], "timers": [],
                                           "pending": [], "format_version": 2}], schema=self.schema)
            pq.write_table(fence, os.path.join(root, f"init-{os.path.basename(root)}-{iv}.parquet"))
            self.images[iv] = (f"init-{os.path.basename(root)}-{iv}.parquet",)

    def batch(self, records: list[tuple[str, str]], *, now_ms: int, b: int) -> dict[str, int]:
        """Run ``records`` ((record id, key)) at processing time ``now_ms``; the summed counts."""
        spec = ImageSpec(comp=Count(), rows_root=TableFiles(self.root), images=dict(self.images),
                         sequencers={iv: SEQ for iv in range(N_IV)},
                         stream_roots={"out": TableFiles(os.path.join(self.root, "out"))}, wm=None, now_ms=now_ms,
                         horizon_ms=now_ms - RETENTION, commit_id=f"c{b}", rows_schema=self.schema,
                         stream_schema=_arrow(stream_schema_ddl()), stream_format_version=1, route_late=False,
                         summary_schema=_arrow(SUMMARY_DDL), strong=True)
        schema = _arrow(PREP_DDL).append(pa.field("interval", pa.int32())).append(pa.field("_m", pa.bool_()))
        rows = [{"record_id": rid, "key": key, "value": b"1", "codec": "json", "timestamp_ms": 1_000,
                 "stream": "events", "position": f"p{rid}", "late": False, "_bad": None,
                 "interval": zlib.crc32(key.encode()) % N_IV, "_m": False} for rid, key in records]
        rows += [{"interval": iv, "_m": True} for iv in range(N_IV)]
        counts = {"processed": 0, "duplicates": 0, "ids_expired": 0, "bloom_maybe": 0, "ids_removed": 0}
        for s in (s.to_row() for s in _run(spec, pa.Table.from_pylist(rows, schema=schema))):
            for c in ("processed", "duplicates", "ids_expired", "bloom_maybe"):
                counts[c] += s[c] or 0
            counts["ids_removed"] += len(s["ids_removed"] or ())
            if s.get("interval") is None:
                continue
            files = list(self.images[s["interval"]])
            if s.get("new_path"):
                files = [p for p in files if is_ids_path(p)] + [s["new_path"]]
            files = [p for p in files if p not in (s["ids_removed"] or ())]
            files += [s["ids_path"]] if s.get("ids_path") else []
            self.images[s["interval"]] = tuple(files)
        return counts

    def ids_files(self) -> list[str]:
        return [p for files in self.images.values() for p in files if is_ids_path(p)]

    def rows(self) -> list[dict]:
        return [r for files in self.images.values() for p in files
                for r in pq.read_table(os.path.join(self.root, p)).to_pylist()]


def test_a_redelivered_record_whose_id_is_only_in_an_older_ids_file_is_dropped_with_a_cold_cache(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Interval(str(tmp_path))
    t0 = 1_700_000_000_000
    for b in range(12):  # one new record a batch, on 3 keys
        got = store.batch([(f"r{b}", f"k{b % 3}")], now_ms=t0 + b * 1_000, b=b)
        assert got["processed"] == 1
    rows = store.rows()
    # the key rows hold no ids; the ids files hold every id run, under the reserved prefix
    assert all(not r["record_ids"] for r in rows if not r["key"].startswith(IDS_KEY_PREFIX))
    held = sorted(i["record_id"] for r in rows if r["key"].startswith(IDS_KEY_PREFIX) for i in r["record_ids"])
    assert held == sorted(f"r{b}" for b in range(12))
    # eight files of one level in one time bucket merged into one of the next level
    assert any(ids_level(p) >= 1 for p in store.ids_files())
    newest = {p: pq.read_table(os.path.join(store.root, p)).column("updated_ms")[0].as_py() for p in store.ids_files()}
    r0_file = [p for p in store.ids_files() if "r0" in str(pq.read_table(os.path.join(store.root, p)).to_pylist())]
    assert len(r0_file) == 1 and newest[r0_file[0]] < max(newest.values())  # an older file holds r0
    _cold()
    again = store.batch([("r0", "k0"), ("r12", "k0")], now_ms=t0 + 12_000, b=12)
    assert (again["processed"], again["duplicates"]) == (1, 1)
    assert again["bloom_maybe"] >= 1
    state = {r["key"]: r["state"] for r in store.rows() if r["key"].startswith("k")}
    assert state["k0"] == b"5"  # r0, r3, r6, r9 and r12 once each


def test_ids_files_past_the_dedup_horizon_are_dropped_whole(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Interval(str(tmp_path))
    t0 = 1_700_000_000_000
    for b in range(3):
        store.batch([(f"r{b}", f"k{b}")], now_ms=t0 + b * 1_000, b=b)
    assert len(store.ids_files()) == 3
    # 61 s after the second batch: the first two files left the horizon, the third is kept
    later = store.batch([], now_ms=t0 + 1_000 + RETENTION + 1, b=3)
    assert (later["ids_removed"], later["ids_expired"]) == (2, 2)
    assert len(store.ids_files()) == 1
    _cold()
    # r2 is still within the horizon: a duplicate; r0 left it: new again
    again = store.batch([("r0", "k0"), ("r2", "k2")], now_ms=t0 + 1_000 + RETENTION + 2, b=4)
    assert (again["processed"], again["duplicates"]) == (1, 1)


def test_an_image_holding_ids_in_its_key_rows_is_read_and_migrated(spark, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = Interval(str(tmp_path))
    t0 = 1_700_000_000_000
    monkeypatch.setenv("DELTAWHEEL_IDS_APART", "0")
    for b in range(2):
        store.batch([(f"r{b}", "k0"), (f"s{b}", "k1")], now_ms=t0 + b * 1_000, b=b)
    assert not store.ids_files()
    assert sorted(i["record_id"] for r in store.rows() for i in r["record_ids"]) == ["r0", "r1", "s0", "s1"]
    monkeypatch.setenv("DELTAWHEEL_IDS_APART", "1")
    _cold()
    again = store.batch([("r0", "k0"), ("x", "k2")], now_ms=t0 + 2_000, b=2)
    assert (again["processed"], again["duplicates"]) == (1, 1)
    rows = store.rows()
    assert all(not r["record_ids"] for r in rows if not r["key"].startswith(IDS_KEY_PREFIX))
    moved = sorted(i["record_id"] for r in rows if r["key"].startswith(IDS_KEY_PREFIX) for i in r["record_ids"])
    assert moved == ["r0", "r1", "s0", "s1", "x"]
    _cold()
    assert store.batch([("s1", "k1")], now_ms=t0 + 3_000, b=3)["duplicates"] == 1


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(600)
def test_the_views_show_one_row_per_key_and_count_the_ids_apart(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """Through the executor and the SQL views, as a user sees the store: a retry after a restart is a
    duplicate, ``state`` shows one row per key with its ids counted, and the ids rows show nowhere."""
    from deltawheel.statestore.clock import ManualClock
    from deltawheel.statestore.inspection.sqlviews import register_views
    from executor_util import BucketCounter, events, start_executor, stop_executor

    clock = ManualClock(1_700_000_000_000)
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image", clock=clock)
    try:
        for b in range(3):
            clock.advance(1_000)
            ex.run_batch(events(spark, [(f"r{b}", "cats", 1_000 + b), (f"d{b}", "dogs", 1_000 + b)]), b,
                         input_watermark_ms=None)
    finally:
        stop_executor(ex, client)
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image", clock=clock,
                                writer="w2")
    try:
        again = ex.run_batch(events(spark, [("r0", "cats", 1_000), ("d9", "dogs", 1_009)]), 3,
                             input_watermark_ms=None)
        assert (again.processed, again.duplicates) == (1, 1)
    finally:
        stop_executor(ex, client)
    register_views(spark, migrated_store)
    got = {r["key"]: r["n_record_ids"] for r in spark.sql("SELECT key, n_record_ids FROM state").collect()}
    assert got == {"cats": 3, "dogs": 4}
    assert spark.sql("SELECT count(*) AS n FROM rows WHERE key NOT IN ('cats', 'dogs')").collect()[0]["n"] == 0
