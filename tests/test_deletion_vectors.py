"""Deletion vectors in the rows table: the reader (``statestore/delta/deletionvectors.py``) reads
what the tests write and what Delta writes, a damaged vector is a typed error, and a writer of
the image path taking intervals whose files carry vectors (a MERGE, an UPDATE left them) rewrites
each interval it changes as one plain file, the state unchanged."""

from __future__ import annotations

import json
import os

import pytest
from deltawheel.statestore.delta.deletionvectors import deleted_rows, vector_file_name, z85_decode
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import StoreDamagedError
from deltawheel.statestore.rowtable.rows import IDS_KEY_PREFIX
from dv_util import inline_descriptor, mark_deleted, write_vectors, z85_encode


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


def _rows_adds(layout) -> list[dict]:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.delta.log import read_snapshot

    snap = read_snapshot(layout.rows_of("buckets"))
    assert snap is not None
    return [a for a in snap.adds if (a.get("partitionValues") or {}).get("computation") == "buckets"]


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(900)
def test_a_writer_taking_intervals_purges_the_vectors_it_finds(spark, migrated_store, zk_config) -> None:  # type: ignore[no-untyped-def]
    """A row of an image-path store deleted by a deletion vector (as a DELETE or a MERGE marks
    rows): Python's reader sees what Spark sees; a writer taking the intervals rewrites each as one
    file without vectors, and the state is as before but for the deleted key."""
    import pyarrow.parquet as pq
    from deltawheel.statestore.clock import ManualClock
    from deltawheel.statestore.delta.txn import decode_path
    from deltawheel.statestore.writepath.image.files import is_ids_path
    from executor_util import BucketCounter, events, start_executor, stop_executor, store_sql

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
    run("w1", range(0, 3))
    for fs in state_files().values():
        for a in fs:
            keys = pq.read_table(os.path.join(migrated_store.rows_of("buckets"), decode_path(a["path"]))).column("key").to_pylist()
            if "q9" in keys:
                mark_deleted(spark, migrated_store.rows_of("buckets"), a["path"], [keys.index("q9")])
    assert any(a.get("deletionVector") for fs in state_files().values() for a in fs)
    assert _python_states(migrated_store) == _spark_states(spark, migrated_store)
    run("w2", range(3, 5))
    files = state_files()
    assert files and all(len(fs) == 1 and not fs[0].get("deletionVector") for fs in files.values())
    assert not list(_vector_files(migrated_store))  # no file of the current version names a vector
    got = {r["key"]: json.loads(r["state_json"]) for r in store_sql(spark, migrated_store, "SELECT key, state_json FROM state")}
    assert got["q0"] == {"0": 5} and got["q3"] == {"0": 2} and got["q4"] == {"0": 2} and got["q7"] == {"0": 1}
    assert "q9" not in got and len(got) == 23


def _vector_files(layout) -> set[str]:  # type: ignore[no-untyped-def]
    """The vector files the current version of buckets' rows table names."""
    import uuid

    from deltawheel.statestore.delta.log import read_snapshot

    snap = read_snapshot(layout.rows_of("buckets"))
    assert snap is not None
    return {vector_file_name(uuid.UUID(bytes=z85_decode(a["deletionVector"]["pathOrInlineDv"][-20:])))
            for a in snap.adds if (a.get("deletionVector") or {}).get("storageType") == "u"}


def _spark_states(spark, layout) -> list[tuple[int, str, bytes | None]]:  # type: ignore[no-untyped-def]
    """(interval, key, state) of the live rows (user keys, fence rows, ids rows), sorted, as Spark reads them."""
    rows = spark.read.format("delta").load(layout.rows_of("buckets")).where("computation = 'buckets'").select(
        "interval", "key", "state").collect()
    return _one_per_key([(int(r["interval"]), r["key"], None if r["state"] is None else bytes(r["state"])) for r in rows])


def _python_states(layout) -> list[tuple[int, str, bytes | None]]:  # type: ignore[no-untyped-def]
    """The same rows through the Python reader (``live_table``: each file less its vector's rows)."""
    from deltawheel.statestore.delta.deletionvectors import live_table
    from deltawheel.statestore.delta.txn import decode_path

    out = []
    for a in _rows_adds(layout):
        t = live_table(TableFiles(layout.rows_of("buckets")), decode_path(a["path"]), a.get("deletionVector"), columns=["key", "state"])
        iv = int(a["partitionValues"]["interval"])
        out += [(iv, k, v) for k, v in zip(t.column("key").to_pylist(), t.column("state").to_pylist(), strict=True)]
    return _one_per_key(out)


def _one_per_key(rows: list[tuple[int, str, bytes | None]]) -> list[tuple[int, str, bytes | None]]:
    """``rows`` sorted, after checking there is one row per interval and state key (ids rows may repeat)."""
    state = [(iv, k) for iv, k, _v in rows if not k.startswith(IDS_KEY_PREFIX)]
    assert len(state) == len(set(state)) > 24
    return sorted(rows, key=lambda r: (r[0], r[1], r[2] or b""))
