"""Record ids apart from the state (``statestore/writepath/image/idsfiles.py``): each batch adds a small
ids file per interval, the key rows no longer carry ids, the dedup reads the ids files (also
with a cold worker cache), files past the dedup horizon are dropped whole, files of one time
bucket merge by levels, and images written with ids in the key rows keep working."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest
from deltawheel.statestore.rowtable.rows import IDS_KEY_PREFIX
from deltawheel.statestore.writepath.image.files import ids_level
from image_util import RETENTION
from image_util import Interval as _Interval
from image_util import cold as _cold

N_IV = 2


class Interval(_Interval):
    """The harness over two intervals; a batch's counts summed over them."""

    def __init__(self, root: str) -> None:
        super().__init__(root, N_IV)

    def batch(self, records: list[tuple[str, str]], *, now_ms: int, b: int) -> dict[str, int]:
        """Run ``records`` ((record id, key)) at processing time ``now_ms``; the summed counts."""
        counts = {"processed": 0, "duplicates": 0, "ids_expired": 0, "bloom_maybe": 0, "ids_removed": 0}
        for s in self.run(records, b=b, now_ms=now_ms):
            for c in ("processed", "duplicates", "ids_expired", "bloom_maybe"):
                counts[c] += s[c] or 0
            counts["ids_removed"] += len(s["ids_removed"] or ())
        return counts


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


def test_a_worker_forgets_the_ids_files_a_compaction_took_in_and_still_drops_their_redeliveries(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.writepath.image import idsfiles

    store = Interval(str(tmp_path))
    t0 = 1_700_000_000_000
    _cold()
    for b in range(12):
        store.batch([(f"r{b}", f"k{b % 3}")], now_ms=t0 + b * 1_000, b=b)
    live = set(store.ids_files())
    folders = {p.rsplit("/", 1)[0] for p in live}
    cached = {p for p in idsfiles._FILES if p.rsplit("/", 1)[0] in folders}
    assert any(ids_level(p) >= 1 for p in live)
    assert cached == live  # every live file, and none of the level-0 files merged into a level-1 one
    again = store.batch([(f"r{b}", f"k{b % 3}") for b in range(12)] + [("r12", "k0")], now_ms=t0 + 12_000, b=12)
    assert (again["processed"], again["duplicates"]) == (1, 12)


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


def test_an_image_holding_ids_in_its_key_rows_is_read_and_migrated(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An image written before the ids files (each key's ids in its row): its ids dedup, and the
    interval's next write moves them into an ids file."""
    import pyarrow as pa
    from deltawheel.statestore.rowtable.frames import arrow_schema
    from deltawheel.statestore.rowtable.rows import FENCE_KEY, rows_file_ddl

    store = Interval(str(tmp_path))
    t0 = 1_700_000_000_000
    for iv in range(N_IV):  # each interval's keys of two batches, their ids in their rows
        keys = [k for k in ("k0", "k1") if store_interval(k) == iv]
        ids = {"k0": ["r0", "r1"], "k1": ["s0", "s1"]}
        old = [{"key": FENCE_KEY, "sequencer": 3, "record_ids": [], "timers": [], "pending": [], "format_version": 2}]
        old += [{"key": k, "state": b"2", "codec": "json", "sequencer": 3, "timers": [], "pending": [],
                 "record_ids": [{"record_id": r, "seen_ms": t0 + n * 1_000} for n, r in enumerate(ids[k])],
                 "format_version": 2} for k in keys]
        name = f"old-{iv}.parquet"
        pq.write_table(pa.Table.from_pylist(old, schema=arrow_schema(rows_file_ddl())), os.path.join(store.root, name))
        store.images[iv] = [name]
    assert not store.ids_files()
    assert sorted(i["record_id"] for r in store.rows() for i in r["record_ids"]) == ["r0", "r1", "s0", "s1"]
    _cold()
    again = store.batch([("r0", "k0"), ("x", "k2")], now_ms=t0 + 2_000, b=2)
    assert (again["processed"], again["duplicates"]) == (1, 1)
    rows = store.rows()
    assert all(not r["record_ids"] for r in rows if not r["key"].startswith(IDS_KEY_PREFIX))
    moved = sorted(i["record_id"] for r in rows if r["key"].startswith(IDS_KEY_PREFIX) for i in r["record_ids"])
    assert moved == ["r0", "r1", "s0", "s1", "x"]
    _cold()
    assert store.batch([("s1", "k1")], now_ms=t0 + 3_000, b=3)["duplicates"] == 1


def store_interval(key: str) -> int:
    """The interval the harness gives ``key`` (``image_util.Interval.run``)."""
    import zlib

    return zlib.crc32(key.encode()) % N_IV


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(600)
def test_the_views_show_one_row_per_key_and_count_the_ids_apart(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """Through the executor and the SQL views, as a user sees the store: a retry after a restart is a
    duplicate, ``state`` shows one row per key with its ids counted, and the ids rows show nowhere."""
    from deltawheel.statestore.clock import ManualClock
    from executor_util import BucketCounter, events, start_executor, stop_executor, store_sql

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
    got = {r["key"]: r["n_record_ids"] for r in store_sql(spark, migrated_store, "SELECT key, n_record_ids FROM state")}
    assert got == {"cats": 3, "dogs": 4}
    assert store_sql(spark, migrated_store, "SELECT count(*) AS n FROM rows WHERE key NOT IN ('cats', 'dogs')")[0]["n"] == 0


@pytest.mark.parametrize("ordered", [True, False])
def test_an_ids_file_holds_one_row_per_key_in_key_order_whatever_its_input_order(spark, tmp_path, ordered) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa
    from deltawheel.statestore.delta.storefs import TableFiles
    from deltawheel.statestore.rowtable.frames import arrow_schema
    from deltawheel.statestore.rowtable.rows import rows_file_ddl
    from deltawheel.statestore.writepath.image.idsfiles import write_ids_file

    rows = [("a", "r1", 5), ("a", "r2", 5), ("b", "r3", 4), ("b", "r4", 6), ("c", "r5", 5)]
    if not ordered:  # e.g. a compaction's files after the batch's own ids
        rows = [rows[3], rows[4], rows[0], rows[2], rows[1]]
    flat = pa.table({"key": [r[0] for r in rows], "record_id": [r[1] for r in rows], "seen_ms": [r[2] for r in rows]})
    written, got = write_ids_file(flat, TableFiles(str(tmp_path)), computation="c", interval=0, level=0,
                                  schema=arrow_schema(rows_file_ddl()), sequencer=1, commit_id="x", now_ms=9,
                                  format_version=1)
    back = pq.read_table(os.path.join(tmp_path, written.path)).to_pylist()
    assert [(r["key"], [(i["record_id"], i["seen_ms"]) for i in r["record_ids"]]) for r in back] == [
        (IDS_KEY_PREFIX + "a", [("r1", 5), ("r2", 5)]), (IDS_KEY_PREFIX + "b", [("r3", 4), ("r4", 6)]),
        (IDS_KEY_PREFIX + "c", [("r5", 5)])]
    assert got.flat.column("key").to_pylist() == ["a", "a", "b", "b", "c"]



@pytest.mark.parametrize("seed", range(5))
def test_picking_candidate_ids_by_hash_bucket_finds_exactly_what_a_full_scan_finds(seed) -> None:  # type: ignore[no-untyped-def]
    """pick_ids (each ids file's rows in the candidates' hash buckets, then the exact comparison)
    against a scan of every stored id: same rows, for candidates held once, in several files, under
    several keys, not at all; for empty, tiny and larger files."""
    import random

    import pyarrow as pa
    import pyarrow.compute as pc
    from deltawheel.statestore.writepath.image.idhash import id_hashes
    from deltawheel.statestore.writepath.image.idsfiles import IdsFile, pick_ids

    rnd = random.Random(seed)
    files = []
    for n in (0, 1, 7, rnd.randint(50, 400), rnd.randint(1_000, 5_000)):
        ids = [f"id-{rnd.randint(0, 20_000)}" for _ in range(n)]
        flat = pa.table({"key": pa.array([rnd.choice("abcdef") for _ in ids], pa.string()),
                         "record_id": pa.array(ids, pa.string()),
                         "seen_ms": pa.array([rnd.randint(0, 99) for _ in ids], pa.int64())})
        files.append(IdsFile(f"c/interval=0/part-{seed}-{n}-dwids0.parquet", 0, 1, flat))
    stored = [r for f in files for r in f.flat.column("record_id").to_pylist()]
    cand = sorted(set(rnd.sample(stored, min(30, len(stored))) + [f"absent-{i}" for i in range(10)]))
    cand_arr = pa.array(cand, pa.string())
    got = pick_ids(files, cand_arr, id_hashes(cand_arr))
    every = pa.concat_tables([f.flat for f in files])
    want = every.filter(pc.is_in(every.column("record_id"), value_set=cand_arr))
    as_set = lambda t: sorted(zip(*(t.column(c).to_pylist() for c in ("key", "record_id", "seen_ms")), strict=True))  # noqa: E731
    assert as_set(got) == as_set(want)
    assert got.num_rows == want.num_rows > 0
    assert pick_ids(files, pa.array([], pa.string()), id_hashes(pa.array([], pa.string()))).num_rows == 0


def _ids_of(store: Interval) -> list[tuple[str, str]]:
    """Every (key, record id) the live ids files hold, sorted (with repeats)."""
    return sorted((r["key"][len(IDS_KEY_PREFIX):], i["record_id"]) for p in store.ids_files()
                  for r in pq.read_table(os.path.join(store.root, p)).to_pylist() for i in r["record_ids"])


def test_a_compaction_prepared_in_the_background_commits_beside_the_batchs_own_ids(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The batch that compacts commits the merge its worker prepared after the batch before (a
    level-1 file) and a level-0 file of its own ids, and removes the files merged; the live files
    hold every id once, and a redelivery of every record is dropped whole."""
    from deltawheel.statestore.writepath.image import idsmerge

    store = Interval(str(tmp_path))
    t0 = 1_700_000_000_000
    _cold()
    idsmerge._PREPARED.clear()
    records = [(f"r{b}-{i}", f"k{(b + i) % 5}") for b in range(20) for i in range(6)]
    merged = []
    for b in range(20):
        out = store.run(records[6 * b:6 * b + 6], b=b, now_ms=t0 + b * 1_000)
        merged += [s["merged_path"] for s in out if s.get("merged_path")]
        for s in out:
            if s.get("merged_path"):  # committed beside the batch's own ids, the files merged removed
                assert ids_level(s["merged_path"]) == 1 and ids_level(s["ids_path"]) == 0
                assert len(s["ids_removed"]) == 7
    assert len(merged) >= 2  # each interval's compaction at least once
    assert any(ids_level(p) >= 1 for p in store.ids_files())
    want = sorted((k, r) for r, k in records)
    assert _ids_of(store) == want  # every id once: none lost, none twice
    again = store.batch(records + [("new", "k0")], now_ms=t0 + 20_000, b=20)
    assert (again["processed"], again["duplicates"]) == (1, len(records))


def test_a_prepared_merge_that_no_longer_fits_is_not_used(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The next batch's task merges itself when the prepared merge is not what the compaction would
    write: another sequencer (a takeover between the two batches), or none in this worker."""
    from deltawheel.statestore.writepath.image import idsmerge

    store = Interval(str(tmp_path))
    t0 = 1_700_000_000_000
    _cold()
    idsmerge._PREPARED.clear()
    records = [(f"r{b}-{i}", f"k{(b + i) % 5}") for b in range(9) for i in range(6)]
    for b in range(7):
        store.run(records[6 * b:6 * b + 6], b=b, now_ms=t0 + b * 1_000)
    assert idsmerge._PREPARED  # the next batch compacts: prepared for it
    for prep in idsmerge._PREPARED.values():
        prep.sequencer += 1  # as if prepared under an earlier lease
    out = store.run(records[42:48], b=7, now_ms=t0 + 7_000)
    compacted = [s for s in out if s.get("ids_removed")]
    assert compacted and all(not s.get("merged_path") and ids_level(s["ids_path"]) == 1 for s in compacted)
    assert _ids_of(store) == sorted((k, r) for r, k in records[:48])


@pytest.mark.parametrize("ordered", [True, False])
def test_the_index_kept_from_the_inputs_hashes_is_the_one_made_from_the_file(spark, tmp_path, ordered) -> None:  # type: ignore[no-untyped-def]
    """A batch's own ids file keeps the hash-bucket index made from the input's hashes (in the
    ids' order, reordered with them when the file sorts them): the same index a worker makes from
    the file's ids at its first lookup, so the lookups find the same rows."""
    import numpy as np
    import pyarrow as pa
    from deltawheel.statestore.delta.storefs import TableFiles
    from deltawheel.statestore.rowtable.frames import arrow_schema
    from deltawheel.statestore.rowtable.rows import rows_file_ddl
    from deltawheel.statestore.writepath.image import idsfiles
    from deltawheel.statestore.writepath.image.idhash import id_hashes

    keys = [f"k{i % 37:02d}" for i in range(500)]
    ids = [f"id-{i}" for i in range(500)]
    pairs = sorted(zip(keys, ids, strict=True)) if ordered else list(zip(keys, ids, strict=True))
    flat = pa.table({"key": [k for k, _ in pairs], "record_id": [r for _, r in pairs], "seen_ms": [7] * len(pairs)})
    hashes = id_hashes(flat.column("record_id"))
    _, got = idsfiles.write_ids_file(flat, TableFiles(str(tmp_path)), computation="c", interval=0, level=0,
                                     schema=arrow_schema(rows_file_ddl()), sequencer=1, commit_id="x", now_ms=9,
                                     format_version=1, hashes=hashes)
    kept = idsfiles._INDEX[got.path]
    fresh = idsfiles.hash_index(got.flat.num_rows, id_hashes(got.flat.column("record_id")))
    assert kept[2] == fresh[2] and np.array_equal(kept[0], fresh[0]) and np.array_equal(kept[1], fresh[1])
    cand = pa.array(["id-3", "id-250", "nope"])
    assert sorted(idsfiles.pick_ids([got], cand, id_hashes(cand)).column("record_id").to_pylist()) == ["id-250", "id-3"]
    with pytest.raises(ValueError, match="3 hashes for 500 ids"):
        idsfiles.write_ids_file(flat, TableFiles(str(tmp_path)), computation="c", interval=0, level=0,
                                schema=arrow_schema(rows_file_ddl()), sequencer=1, commit_id="x", now_ms=9,
                                format_version=1, hashes=hashes[:3])
