"""Delta files of the image path (``executor/tasks/image/deltas.py``): a batch writes only the rows
of the keys it changed and marks their older rows deleted with Delta deletion vectors; the tasks
read an interval from its files and their vectors (also with a cold worker cache), an interval
is rewritten whole by the compaction rule, and every Delta reader (Spark's, the SQL views) sees
one row per key."""

from __future__ import annotations

import json
import os

import pytest
from deltawheel.executor.tasks.image import deltas
from deltawheel.executor.tasks.image import interval as _imagetask
from deltawheel.statestore.delta.deletionvectors import (
    deleted_rows,
    inline_descriptor,
    vector_file_name,
    write_vectors,
    z85_decode,
    z85_encode,
)
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import StoreDamagedError
from deltawheel.statestore.rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX
from image_util import Interval as _Interval
from image_util import cold as _cold


class Interval(_Interval):
    """The harness over one interval, its batches writing delta files unless told not to."""

    def spec(self, b: int, *, now_ms: int | None = None, deltas: bool = True):  # type: ignore[no-untyped-def]
        return super().spec(b, now_ms=now_ms, deltas=deltas)

    def batch(self, records: list[tuple[str, str]], *, b: int, deltas: bool = True) -> dict:
        """Run ``records`` ((record id, key)); the interval's summary row."""
        return [s for s in self.run(records, b=b, deltas=deltas) if s.get("interval") == 0][0]

    def states(self) -> dict[str, int]:
        """key -> state, from the files and their deletion vectors, as any Delta reader reads them."""
        out: dict[str, int] = {}
        for r in self.rows():
            if r["key"] != FENCE_KEY and not r["key"].startswith(IDS_KEY_PREFIX):
                assert r["key"] not in out, f"two live rows of {r['key']}"
                out[r["key"]] = int(r["state"])
        return out


def test_the_switch_is_read_from_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.exceptions import ConfigError
    from deltawheel.statestore.writepath.image.files import IMAGE_DELTAS_ENV, image_deltas

    monkeypatch.delenv(IMAGE_DELTAS_ENV, raising=False)
    assert not image_deltas()  # off by default: whole images
    for off in ("0", "false", " OFF ", "no", ""):
        monkeypatch.setenv(IMAGE_DELTAS_ENV, off)
        assert not image_deltas()
    for on in ("1", "true", "On", " yes "):
        monkeypatch.setenv(IMAGE_DELTAS_ENV, on)
        assert image_deltas()
    monkeypatch.setenv(IMAGE_DELTAS_ENV, "whole")
    with pytest.raises(ConfigError, match="DELTAWHEEL_IMAGE_DELTAS='whole' is not a switch: set it to 1 .* or 0"):
        image_deltas()


def test_a_deletion_vector_written_here_reads_back_as_the_rows_it_marks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cases = ([0], [3, 1, 3, 70_000, 2**32 + 5], list(range(0, 20_000, 3)), list(range(5_000)))
    files = TableFiles(str(tmp_path))
    dvs = write_vectors(files, cases)  # one file, several vectors
    assert {dv["storageType"] for dv in dvs} == {"u"} and len({dv["pathOrInlineDv"] for dv in dvs}) == 1
    assert [dv["offset"] for dv in dvs][0] == 1  # after the file's version byte
    for rows, dv in zip(cases, dvs, strict=True):
        assert dv["cardinality"] == len(set(rows))
        assert deleted_rows(files, dv) == frozenset(rows)
    import uuid

    name = vector_file_name(uuid.UUID(bytes=z85_decode(dvs[0]["pathOrInlineDv"])))
    assert os.listdir(tmp_path) == [name]  # in the table's root folder
    assert write_vectors(files, []) == [] and os.listdir(tmp_path) == [name]
    for rows in ([], [0], [3, 1, 3, 70_000, 2**32 + 5]):  # inline vectors (stores written before) still read
        dv = inline_descriptor(rows)
        assert deleted_rows(TableFiles("/nonexistent"), dv) == frozenset(rows)
    assert z85_encode(z85_decode("HelloWorld")) == "HelloWorld"


def test_a_damaged_or_missing_vector_file_is_a_typed_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import uuid

    files = TableFiles(str(tmp_path))
    dv = write_vectors(files, [[1, 2, 3]])[0]
    path = tmp_path / vector_file_name(uuid.UUID(bytes=z85_decode(dv["pathOrInlineDv"])))
    data = bytearray(path.read_bytes())
    data[dv["offset"] + 4 + 14] ^= 0x01  # a bit of the bitmap flipped
    path.write_bytes(bytes(data))
    with pytest.raises(StoreDamagedError, match="fails its CRC-32 check.*restore it from a backup"):
        deleted_rows(files, dv)
    with pytest.raises(StoreDamagedError, match="its descriptor says 99"):
        deleted_rows(files, {**dv, "sizeInBytes": 99})
    path.unlink()
    with pytest.raises(StoreDamagedError, match="cannot be read.*FileNotFoundError"):
        deleted_rows(files, dv)


@pytest.mark.objectstore
def test_vector_files_are_written_and_read_on_an_s3a_store(object_store) -> None:  # type: ignore[no-untyped-def]
    """The vector file goes through the store's file seam (``TableFiles``) on S3 as locally."""
    import uuid

    from deltawheel.statestore.delta.storefs import S3Settings, files_for

    object_store.create_bucket("dw-vectors")
    ep = object_store.endpoint
    settings = S3Settings(endpoint=ep.url.split("://", 1)[1], scheme="http", access_key=ep.access_key,
                          secret_key=ep.secret_key, path_style=True)
    table = files_for(f"s3a://dw-vectors/{uuid.uuid4().hex}", settings)
    assert table is not None and not table.is_local
    cases = ([5, 9], list(range(0, 70_000, 7)))
    dvs = write_vectors(table, cases)
    name = vector_file_name(uuid.UUID(bytes=z85_decode(dvs[0]["pathOrInlineDv"])))
    assert table.listdir() == [name]
    assert [deleted_rows(table, dv) for dv in dvs] == [frozenset(c) for c in cases]


def test_a_key_changed_in_batch_two_reads_back_from_base_plus_delta_with_a_cold_cache(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Interval(str(tmp_path))
    first = store.batch([(f"a{i}", f"k{i}") for i in range(20)], b=0)
    # a delta beside the interval's first file (the fence row, as a claim writes it), nothing marked
    assert first["delta"] and first["new_rows"] == 20 and not first["dvs"]
    second = store.batch([("b0", "k3"), ("b1", "new")], b=1)
    # the delta holds the changed key's and the new key's rows only (no fence row: no input files here)
    assert second["delta"] and second["new_rows"] == 2
    assert [d["path"] for d in second["dvs"]] == [first["new_path"]]
    assert deleted_rows(TableFiles(str(tmp_path)), store.dvs[first["new_path"]]) != frozenset()
    assert store.dvs[first["new_path"]]["storageType"] == "u"  # a vector file beside the data
    assert len(store.state_files()) == 3
    _cold()
    # the image a task reads: one row per key, the changed key's from the delta
    image, _place = _imagetask._load(store.spec(2), 0)
    keys = image.column("key").to_pylist()
    assert len(keys) == len(set(keys)) == 22  # 21 keys and the fence row
    assert {k: s for k, s in zip(keys, image.column("state").to_pylist(), strict=True)}["k3"] == b"2"
    _cold()
    again = store.batch([("b0", "k3"), ("c0", "k3"), ("c1", "k4")], b=2)  # b0: a retry of batch 1
    assert (again["processed"], again["duplicates"]) == (2, 1)
    assert again["images_read"] == 1  # read from the files, not the worker's cache
    got = store.states()
    assert got["k3"] == 3 and got["k4"] == 2 and got["new"] == 1 and got["k0"] == 1
    assert len(got) == 21


def test_an_interval_is_rewritten_whole_by_the_compaction_rule(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Interval(str(tmp_path))
    store.batch([(f"a{i}", f"k{i}") for i in range(40)], b=0)
    # one key a batch: a delta each time, until the next would make more than MAX_FILES files
    b = 1
    while len(store.state_files()) < deltas.MAX_FILES:
        assert store.batch([(f"x{b}", f"k{b}")], b=b)["delta"]
        b += 1
    s = store.batch([(f"x{b}", f"k{b}")], b=b)
    assert not s["delta"] and s["new_rows"] == 41 and len(store.state_files()) == 1
    # every key changed: 41 of 81 stored rows live, a delta; every key again: 41 of 122, whole
    assert store.batch([(f"y{i}", f"k{i}") for i in range(40)], b=b + 1)["delta"]
    s = store.batch([(f"w{i}", f"k{i}") for i in range(40)], b=b + 2)
    assert not s["delta"] and len(store.state_files()) == 1
    assert store.batch([("v", "k1")], b=b + 3)["delta"]
    s = store.batch([("z", "k0")], b=b + 4, deltas=False)  # the switch off: whole images
    assert not s["delta"] and len(store.state_files()) == 1
    _cold()
    got = store.states()
    assert (got["k0"], got["k1"], got["k9"], got["k39"]) == (4, 5, 3, 3) and len(got) == 40


def _rows_adds(layout) -> list[dict]:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.delta.log import read_snapshot

    snap = read_snapshot(layout.rows)
    assert snap is not None
    return [a for a in snap.adds if (a.get("partitionValues") or {}).get("computation") == "buckets"]


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(900)
def test_delta_batches_show_one_row_per_key_to_spark_and_the_views_and_survive_a_crash_and_restart(
        spark, migrated_store, zk_config, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Through the executor, as a user runs it: batches that change a few keys each add delta files
    and deletion vectors; a writer that dies after its tasks wrote a batch's delta files and before
    the commit leaves the state as before; Spark's Delta reader and the ``state`` view see one row
    per key with its newest state; a new writer (its recovery scan and its tasks reading the files
    and their vectors) runs the batch again, dropping a retried record."""
    from pathlib import Path

    from deltawheel.executor.protocol.faults import FaultPoint
    from deltawheel.statestore.clock import ManualClock
    from deltawheel.statestore.inspection.sqlviews import inspect_key, register_views
    from executor_util import BucketCounter, events, start_executor, stop_executor

    class Crash(Exception):
        pass

    def faults(point: FaultPoint, batch_id: int) -> None:
        if point is FaultPoint.BEFORE_COMMIT and batch_id == 5:
            raise Crash("killed after the tasks wrote the delta files, before the commit")

    monkeypatch.setenv("DELTAWHEEL_IMAGE_DELTAS", "1")  # the driver's switch, as a user turns the delta files on
    last = [("c4", "q0", 1_000), ("d0", "q0", 1_000), ("d1", "q5", 1_000)]
    clock = ManualClock(1_700_000_000_000)
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image", clock=clock,
                                faults=faults)
    try:
        clock.advance(1_000)
        ex.run_batch(events(spark, [(f"a{i}", f"q{i}", 1_000) for i in range(24)]), 0, input_watermark_ms=None)
        for b in range(1, 5):
            clock.advance(1_000)
            ex.run_batch(events(spark, [(f"b{b}", f"q{b}", 1_000), (f"c{b}", "q0", 1_000)]), b,
                         input_watermark_ms=None)
        clock.advance(1_000)
        with pytest.raises(Crash):
            ex.run_batch(events(spark, last), 5, input_watermark_ms=None)
    finally:
        stop_executor(ex, client)
    adds = _rows_adds(migrated_store)
    assert any(a.get("deletionVector") for a in adds)  # older files carry the changed keys' old rows, marked
    assert max(json.loads(a["stats"])["numRecords"] for a in adds) > 5 > min(
        json.loads(a["stats"])["numRecords"] for a in adds)  # small deltas beside the first images
    log = Path(migrated_store.rows, "_delta_log")
    named = {json.loads(line)["add"]["path"] for f in log.glob("*.json") for line in f.read_text().splitlines()
             if '"add"' in line and "add" in json.loads(line)}
    on_disk = {str(f.relative_to(migrated_store.rows)) for f in Path(migrated_store.rows).glob("computation=buckets/*/*.parquet")}
    assert on_disk - named  # the crashed attempt's files: written, never committed
    rows = spark.read.format("delta").load(migrated_store.rows).where("computation = 'buckets'").collect()
    keys = [r["key"] for r in rows if not r["key"].startswith("\x00")]
    assert sorted(keys) == sorted(f"q{i}" for i in range(24))  # one row per key
    register_views(spark, migrated_store)
    got = {r["key"]: json.loads(r["state_json"]) for r in spark.sql("SELECT key, state_json FROM state").collect()}
    # the state of batch 4: nothing of the crashed batch 5
    assert got["q0"] == {"0": 5} and got["q3"] == {"0": 2} and got["q5"] == {"0": 1} and len(got) == 24
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image", clock=clock,
                                writer="w2")
    try:
        again = ex.run_batch(events(spark, last), 5, input_watermark_ms=None)
        assert (again.processed, again.duplicates) == (2, 1)
    finally:
        stop_executor(ex, client)
    assert inspect_key(spark, migrated_store, computation="buckets", key="q0")["state"] == {"0": 6}
    assert inspect_key(spark, migrated_store, computation="buckets", key="q5")["state"] == {"0": 2}
    assert inspect_key(spark, migrated_store, computation="buckets", key="q7")["state"] == {"0": 1}
    # the vectors are files in the table's root folder (``u``), which Spark decoded above; the
    # crashed attempt's vector file is unreferenced: VACUUM (gc) removes it and keeps the live ones
    from deltawheel.gc.passes import run_gc

    assert {a["deletionVector"]["storageType"] for a in _rows_adds(migrated_store) if a.get("deletionVector")} == {"u"}
    before = {f.name for f in Path(migrated_store.rows).glob("deletion_vector_*.bin")}
    assert before - _vector_files(migrated_store)  # the crashed attempt's (and superseded ones)
    spark_rows = _spark_states(spark, migrated_store)
    assert _python_states(migrated_store) == spark_rows  # the Python reader sees what Spark sees
    run_gc(spark, migrated_store, now_ms=clock.now_ms(), apply=True, vacuum_retain_hours=0, force=True)
    assert {f.name for f in Path(migrated_store.rows).glob("deletion_vector_*.bin")} == _vector_files(migrated_store)
    assert _spark_states(spark, migrated_store) == spark_rows == _python_states(migrated_store)


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(900)
def test_with_the_switch_off_batches_write_whole_images_and_purge_the_vectors_they_find(
        spark, migrated_store, zk_config, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``DELTAWHEEL_IMAGE_DELTAS=0``, as a user turns the delta files off: a writer taking intervals
    whose files carry deletion vectors (written with the switch on) rewrites each interval it
    changes as one file without vectors, and the state is the same as with delta files."""
    from deltawheel.statestore.clock import ManualClock
    from deltawheel.statestore.inspection.sqlviews import register_views
    from deltawheel.statestore.writepath.image.files import is_ids_path
    from executor_util import BucketCounter, events, start_executor, stop_executor

    def run(writer: str, batches: range) -> None:
        ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), write_path="image",
                                    clock=clock, writer=writer)
        try:
            for b in batches:
                clock.advance(1_000)
                recs = [(f"a{i}", f"q{i}", 1_000) for i in range(24)] if b == 0 else [
                    (f"b{b}", f"q{b}", 1_000), (f"c{b}", "q0", 1_000)]
                ex.run_batch(events(spark, recs), b, input_watermark_ms=None)
        finally:
            stop_executor(ex, client)

    def state_files() -> dict[int, list[dict]]:
        out: dict[int, list[dict]] = {}
        for a in _rows_adds(migrated_store):
            if not is_ids_path(a["path"]):
                out.setdefault(int(a["partitionValues"]["interval"]), []).append(a)
        return out

    clock = ManualClock(1_700_000_000_000)
    monkeypatch.setenv("DELTAWHEEL_IMAGE_DELTAS", "1")
    run("w1", range(0, 3))
    assert any(a.get("deletionVector") for fs in state_files().values() for a in fs)  # switched on: delta files
    monkeypatch.setenv("DELTAWHEEL_IMAGE_DELTAS", "0")
    run("w2", range(3, 5))
    files = state_files()
    assert files and all(len(fs) == 1 and not fs[0].get("deletionVector") for fs in files.values())
    assert not list(_vector_files(migrated_store))  # no file of the current version names a vector
    register_views(spark, migrated_store)
    got = {r["key"]: json.loads(r["state_json"]) for r in spark.sql("SELECT key, state_json FROM state").collect()}
    assert got["q0"] == {"0": 5} and got["q3"] == {"0": 2} and got["q4"] == {"0": 2} and got["q7"] == {"0": 1}
    assert len(got) == 24


def _vector_files(layout) -> set[str]:  # type: ignore[no-untyped-def]
    """The vector files the rows table's current version names (every computation's)."""
    import uuid

    from deltawheel.statestore.delta.log import read_snapshot

    snap = read_snapshot(layout.rows)
    assert snap is not None
    return {vector_file_name(uuid.UUID(bytes=z85_decode(a["deletionVector"]["pathOrInlineDv"][-20:])))
            for a in snap.adds if (a.get("deletionVector") or {}).get("storageType") == "u"}


def _spark_states(spark, layout) -> list[tuple[int, str, bytes | None]]:  # type: ignore[no-untyped-def]
    """(interval, key, state) of the live rows (user keys, fence rows, ids rows), sorted, as Spark reads them."""
    rows = spark.read.format("delta").load(layout.rows).where("computation = 'buckets'").select(
        "interval", "key", "state").collect()
    return _one_per_key([(int(r["interval"]), r["key"], None if r["state"] is None else bytes(r["state"])) for r in rows])


def _python_states(layout) -> list[tuple[int, str, bytes | None]]:  # type: ignore[no-untyped-def]
    """The same rows through the Python reader (``live_table``: each file less its vector's rows)."""
    from deltawheel.statestore.delta.deletionvectors import live_table
    from deltawheel.statestore.delta.txn import decode_path

    out = []
    for a in _rows_adds(layout):
        t = live_table(TableFiles(layout.rows), decode_path(a["path"]), a.get("deletionVector"), columns=["key", "state"])
        iv = int(a["partitionValues"]["interval"])
        out += [(iv, k, v) for k, v in zip(t.column("key").to_pylist(), t.column("state").to_pylist(), strict=True)]
    return _one_per_key(out)


def _one_per_key(rows: list[tuple[int, str, bytes | None]]) -> list[tuple[int, str, bytes | None]]:
    """``rows`` sorted, after checking there is one row per interval and state key (ids rows may repeat)."""
    state = [(iv, k) for iv, k, _v in rows if not k.startswith(IDS_KEY_PREFIX)]
    assert len(state) == len(set(state)) > 24
    return sorted(rows, key=lambda r: (r[0], r[1], r[2] or b""))
