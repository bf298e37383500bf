"""Input positions of a pipeline whose store is on ``s3a://`` (issue 42): the readers of a query
checkpoint's offset log, its file-source log and a stream table's Delta log reach the object store
through ``storefs.TableFiles`` and give what they give on a local folder; a remote file that cannot
be read leaves the batch's positions unknown (the batch runs); ``deltawheel replay`` of an
``s3a://`` store's computation gives an empty diff. Real S3Proxy (tests/conftest.py)."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltawheel.statestore.delta.sourceoffsets import END_INDEX, batch_adds, kafka_ranges, offset_lines
from deltawheel.statestore.delta.storefs import S3Settings, files_for

pytestmark = pytest.mark.objectstore

TABLE_ID = "table-s3"
META = {"metaData": {"id": TABLE_ID, "format": {"provider": "parquet", "options": {}}, "schemaString": "{}",
                     "partitionColumns": [], "configuration": {}}}


def _add(path: str) -> dict[str, Any]:
    return {"add": {"path": path, "partitionValues": {}, "size": 1, "modificationTime": 0, "dataChange": True}}


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _tree(root: Path) -> None:
    """A stream table's log and a query checkpoint as Spark and Delta write them: offsets with a
    Delta source line and a Kafka line, the Kafka source's initial offsets, and a file-source log
    of ten batches whose tenth compacted the log (``9.compact``, Spark's default interval)."""
    table = root / "table" / "_delta_log"
    commits = [[{"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}, META], [_add("a.parquet")],
               [_add("b%20c.parquet"), _add("d.parquet")], [_add("e.parquet")]]
    for v, actions in enumerate(commits):
        _write(table / f"{v:020d}.json", "\n".join(json.dumps(a) for a in actions) + "\n")
    chk = root / "chk"
    delta = [(1, -1), (2, -1), (3, END_INDEX), (3, END_INDEX)]  # batch 3 reads nothing new
    kafka = [{"0": 4, "1": 2}, {"0": 9, "1": 2}, {"0": 12, "1": 7}, {"0": 12, "1": 8}]
    for b, ((version, index), parts) in enumerate(zip(delta, kafka, strict=True)):
        line = {"sourceVersion": 1, "reservoirId": TABLE_ID, "reservoirVersion": version, "index": index,
                "isStartingVersion": False}
        _write(chk / "offsets" / str(b), f"v1\n{{}}\n{json.dumps(line)}\n{json.dumps({'clicks': parts})}")
    _write(chk / "sources" / "1" / "0", 'v1\n{"clicks":{"0":0,"1":0}}')
    log = chk / "sources" / "0"

    def entry(b: int) -> str:
        return json.dumps({"path": f"s3a://in/folder/part-{b:05d}%20x.parquet", "timestamp": b, "batchId": b})

    for b in range(9):
        _write(log / str(b), f"v1\n{entry(b)}")
    _write(log / "9.compact", "v1\n" + "\n".join(entry(b) for b in range(10)))


@pytest.fixture
def stores(object_store, tmp_path: Path) -> tuple[Path, str, S3Settings]:  # type: ignore[no-untyped-def]
    """(the local tree, the same tree's ``s3a://`` URI on S3Proxy, its S3 settings)."""
    from pyarrow import fs as pafs

    bucket = "dw-positions"
    object_store.create_bucket(bucket)
    ep = object_store.endpoint
    settings = S3Settings(endpoint=ep.url.split("://", 1)[1], scheme="http", access_key=ep.access_key,
                          secret_key=ep.secret_key, path_style=True)
    local = tmp_path / "tree"
    _tree(local)
    prefix = f"{bucket}/{uuid.uuid4().hex}"
    remote = files_for(f"s3a://{prefix}", settings)
    assert remote is not None and not remote.is_local
    pafs.copy_files(str(local), prefix, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=remote.fs)
    return local, f"s3a://{prefix}", settings


def test_the_readers_over_the_object_store_give_what_they_give_locally(stores) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.protocol.rescale import source_batch_files, source_log_files

    local, uri, settings = stores
    chk, table = files_for(f"{uri}/chk", settings), files_for(f"{uri}/table", settings)
    assert chk is not None and table is not None
    # a remote URI string is not read (it needs the session's S3 settings)
    assert offset_lines(f"{uri}/chk", 1) is None and batch_adds(f"{uri}/chk", 1, f"{uri}/table") is None
    for b in range(4):
        assert offset_lines(chk, b) == offset_lines(str(local / "chk"), b) is not None
        assert batch_adds(chk, b, table) == batch_adds(str(local / "chk"), b, str(local / "table"))
        assert kafka_ranges(chk, b, "clicks") == kafka_ranges(str(local / "chk"), b, "clicks") is not None
    assert [a["path"] for a in batch_adds(chk, 2, table) or ()] == ["b%20c.parquet", "d.parquet", "e.parquet"]
    assert batch_adds(chk, 3, table) == ()
    assert kafka_ranges(chk, 0, "clicks") == {"clicks": {"0": [0, 4], "1": [0, 2]}}
    assert offset_lines(chk, 4) is None  # not written yet
    logged = source_log_files(str(local / "chk"), committed_only=False)
    assert sorted(logged) == list(range(10))
    for b in range(10):  # batch 9 from the compacted file, its own entries only
        assert source_batch_files(chk, b) == logged[b] == [f"part-{b:05d} x.parquet"]
    assert source_batch_files(chk, 10) is None


def _recorder(uri: str, resolve: Any) -> Any:
    from deltawheel.executor.computation import Computation
    from deltawheel.executor.protocol.rescale import shared_input
    from deltawheel.executor.sources.parquet import ParquetInjector

    class Counter(Computation):
        name = "counter"
        inputs = {"queries": "query"}

        def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
            pass

    inj = ParquetInjector("queries", "s3a://in/folder", key_column="query", event_time_column="t",
                          watermark_delay_ms=0)
    got = shared_input(Counter(), {"queries": inj}, table_of=lambda s: f"{uri}/{s}", checkpoint=f"{uri}/chk")
    got.files_of = resolve
    return got


def test_a_batch_whose_remote_positions_cannot_be_read_runs_with_them_unknown(stores, caplog) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    _local, uri, settings = stores
    rec = _recorder(uri, lambda u: files_for(u, settings))
    assert rec.record(None, 3) == ("part-00003 x.parquet",) and not rec.unknown
    with caplog.at_level(logging.WARNING, logger="deltawheel.executor.protocol.rescale"):
        assert rec.record(None, 12) == ()
    assert rec.unknown == {12}
    assert "input positions of micro-batch 12 are not recorded" in caplog.text
    assert "micro-batch 12 is not in the file source log" in caplog.text
    assert rec.record(None, 4) == ("part-00004 x.parquet",) and rec.unknown == {12}
    # a server that refuses the reads (a wrong secret key): the batch's positions are unknown, logged
    bad = dataclasses.replace(settings, secret_key="not-the-key")
    rec = _recorder(uri, lambda u: files_for(u, bad))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deltawheel.executor.protocol.rescale"):
        assert rec.record(None, 3) == ()
    assert rec.unknown == {3}
    assert "reading the query checkpoint" in caplog.text and "failed" in caplog.text, caplog.text
