"""Input positions of a pipeline whose store is on ``s3a://``: the readers of a query
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
    # a query reading that folder alone: its offsets name the file source's entries (``logOffset``)
    files = root / "filechk"
    for b in range(10):
        _write(files / "offsets" / str(b), f'v1\n{{}}\n{{"logOffset":{b}}}')
        _write(files / "sources" / "0" / str(b), f"v1\n{entry(b)}")


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
    from deltawheel.executor.protocol.rescale import query_batch_files, source_batch_files, source_log_files

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
    files = files_for(f"{uri}/filechk", settings)
    assert files is not None
    for b in range(10):  # a micro-batch's files: the entries its offsets span
        assert query_batch_files(files, b) == query_batch_files(str(local / "filechk"), b) == [f"part-{b:05d} x.parquet"]
    assert query_batch_files(files, 10) is None


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
    got = shared_input(Counter(), {"queries": inj}, table_of=lambda s: f"{uri}/{s}", checkpoint=f"{uri}/filechk")
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
    assert "the offsets or file source log of micro-batch 12 are not in" in caplog.text
    assert rec.record(None, 4) == ("part-00004 x.parquet",) and rec.unknown == {12}
    # a server that refuses the reads (a wrong secret key): the batch's positions are unknown, logged
    bad = dataclasses.replace(settings, secret_key="not-the-key")
    rec = _recorder(uri, lambda u: files_for(u, bad))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="deltawheel.executor.protocol.rescale"):
        assert rec.record(None, 3) == ()
    assert rec.unknown == {3}
    assert "reading the query checkpoint" in caplog.text and "failed" in caplog.text, caplog.text


def _run_live(spark: Any, store: Any, zk: Any, folder: Path, files: int) -> None:
    """The demo's first two stages (tests/replay_source.py) on ``store`` over ``files`` input files."""
    from deltawheel.executor.drivers.runner import PipelineRunner
    from replay_source import pipeline_for

    from deltawheel.demo.zeitgeist import ZeitgeistParams, write_event_files

    params = ZeitgeistParams(n_events=1_500, seed=11, rate_per_s=20, n_queries=8)
    write_event_files(params.generate().slice(0, files * 500), str(folder), events_per_batch=500,
                      first_mtime_s=params.start_ms // 1000)
    PipelineRunner(spark, store, pipeline_for(str(folder), disorder_ms=params.max_disorder_ms), zk=zk,
                   end_of_input=False, progress=lambda line: None).run()


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.slow  # two runs of the pipeline on the object store and two replays: minutes
@pytest.mark.timeout(2400)
def test_a_pipeline_on_an_s3a_store_records_positions_and_replays_from_the_middle_to_an_empty_diff(  # type: ignore[no-untyped-def]
        spark, s3_store_layout, zk_server, tmp_path, capsys, monkeypatch) -> None:
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.inspection.positions import computation_commits, replay_horizon
    from deltawheel.statestore.layout import StoreLayout
    from replay_source import INPUT_ENV

    from deltawheel.cli import main

    store = s3_store_layout
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/s3live-{uuid.uuid4().hex[:8]}")
    folder = tmp_path / "input"  # the injector's files are local; the stream table model reads is on S3
    ends = []
    for files in (2, 3):
        _run_live(spark, store, zk, folder, files)
        ends.append(computation_commits(spark, store, "model")[-1].version)
    # every batch commit records its positions: the model's the data files of window_counts (on S3),
    # the counter's the injector's files, one per micro-batch
    model = [c for c in computation_commits(spark, store, "model") if c.kind != "claim"]
    assert replay_horizon(model) is None, [(c.version, c.kind, c.files) for c in model]
    read = [f for c in model for f in c.files or ()]
    assert read and all(f.startswith("window_counts/") for f in read) and len(read) == len(set(read))
    counter = [c for c in computation_commits(spark, store, "window_counter") if c.kind != "claim"]
    assert replay_horizon(counter) is None
    assert sorted(f for c in counter for f in c.files or ()) == [f"part-{i:05d}.parquet" for i in range(3)]

    def replay(computation: str, start: int, into: Path, *more: str) -> dict[str, Any]:
        out = tmp_path / f"{computation}.json"
        rc = main(["replay", "--store", store.root, "--pipeline", "zeitgeist", "--computation", computation,
                   "--from-version", str(start), "--into", str(into), "--zk", zk.hosts, "--zk-chroot", zk.chroot,
                   "--diff-out", str(out), *more])
        got = capsys.readouterr()
        assert rc == 0, got.out + got.err
        return dict(json.loads(out.read_text()))

    # the model from the middle (its input on S3): an empty diff, and it did re-run batches
    d = replay("model", ends[0], tmp_path / "shadow")
    assert d["empty"] and d["version_a"] == ends[1], d
    assert spark.read.format("delta").load(StoreLayout(str(tmp_path / "shadow")).stream("predictions")).count() > 0
    # the counter from the start (its input local, the live pipeline as --source): empty too
    monkeypatch.setenv(INPUT_ENV, str(folder))
    monkeypatch.setenv("PYTHONPATH", "")  # --source puts its module's folder there; undone after the test
    out = tmp_path / "window_counter.json"
    rc = main(["replay", "--store", store.root, "--pipeline", "zeitgeist", "--computation", "window_counter",
               "--from-start", "--into", str(tmp_path / "shadow2"), "--zk", zk.hosts, "--zk-chroot", zk.chroot,
               "--diff-out", str(out), "--source", "replay_source:pipeline"])
    got = capsys.readouterr()
    assert rc == 0, got.out + got.err
    d = json.loads(out.read_text())
    assert d["empty"], got.out
    assert spark.read.format("delta").load(StoreLayout(str(tmp_path / "shadow2")).stream("window_counts")).count() > 0
