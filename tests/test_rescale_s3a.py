"""Job instances sharing intervals on an ``s3a://`` store: their query checkpoints are on the object
store, and the skip rule's and catch-up's reads of them (the file source log, the logged positions)
go through ``storefs.TableFiles`` as the positions readers do. Real S3Proxy (tests/conftest.py)."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.protocol.rescale import CATCH_UP_BATCH, positions_log, source_log_files
from deltawheel.statestore.delta.storefs import S3Settings, files_for
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.objectstore


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _checkpoint(root: Path) -> None:
    """A query checkpoint: a file-source log of twelve batches compacted at batch 9, batches 0-10
    committed (11 logged, running), and the positions a stream-table input logged for 0-2."""
    def entry(b: int, n: int) -> str:
        return json.dumps({"path": f"file:///in/part-{b:05d}-{n}%20x.parquet", "timestamp": b, "batchId": b})

    log = root / "sources" / "0"
    for b in range(12):
        if b != 9:
            _write(log / str(b), "v1\n" + "\n".join(entry(b, n) for n in range(2)))
    _write(log / "9.compact", "v1\n" + "\n".join(entry(b, n) for b in range(10) for n in range(2)))
    for b in range(11):
        _write(root / "commits" / str(b), "v1\n{}")
    for b in range(3):
        _write(root / "dw_positions" / str(b), json.dumps({"format_version": 1, "positions": [f"t/p{b}"]}))


def test_the_checkpoint_readers_over_the_object_store_give_what_they_give_locally(object_store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pyarrow import fs as pafs

    bucket = "dw-rescale"
    object_store.create_bucket(bucket)
    ep = object_store.endpoint
    settings = S3Settings(endpoint=ep.url.split("://", 1)[1], scheme="http", access_key=ep.access_key,
                          secret_key=ep.secret_key, path_style=True)
    local = tmp_path / "chk"
    _checkpoint(local)
    prefix = f"{bucket}/{uuid.uuid4().hex}"
    remote = files_for(f"s3a://{prefix}", settings)
    assert remote is not None and not remote.is_local
    pafs.copy_files(str(local), prefix, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=remote.fs)
    for committed in (True, False):
        want = source_log_files(str(local), committed_only=committed)
        assert source_log_files(remote, committed_only=committed) == want
        assert sorted(want) == list(range(11 if committed else 12)) and want[9] == ["part-00009-0 x.parquet",
                                                                                    "part-00009-1 x.parquet"]
        assert positions_log(remote, committed_only=committed) == positions_log(str(local), committed_only=committed)
    assert positions_log(remote)[2] == ["t/p2"]
    nothing = files_for(f"s3a://{prefix}-none", settings)
    assert nothing is not None and source_log_files(nothing) == {} and positions_log(nothing) == {}
    # a remote URI string without its settings is refused, as before
    from deltawheel.statestore.exceptions import ConfigError

    with pytest.raises(ConfigError, match="must be local or on s3a:// .read with the session's S3 settings."):
        source_log_files(f"s3a://{prefix}")


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.slow  # five pipeline runs committing to the object store: minutes
@pytest.mark.timeout(2400)
def test_a_moved_interval_on_an_s3a_store_is_neither_skipped_nor_processed_twice(  # type: ignore[no-untyped-def]
        spark, zk_config, s3_store_layout, tmp_path) -> None:
    """tests/test_rescale.py's move, with the store (rows, streams, query checkpoints) on S3Proxy."""
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.delta.storefs import table_files
    from deltawheel.statestore.rowtable.rows import interval_of
    from deltawheel.statestore.rowtable.store import RowStore
    from executor_util import state_of
    from rescale_instance import KEYS, write_file
    from test_rescale import runner

    folder, layout = tmp_path / "in", s3_store_layout
    expected: dict[str, int] = {}

    def add(n: int) -> None:
        for k, c in write_file(folder, n).items():  # each key n % 5 + 1 times
            expected[k] = expected.get(k, 0) + c

    def run(instance: str, intervals: list[int] | None) -> Any:
        r: PipelineRunner = runner(spark, layout, folder, zk_config, instance=instance, intervals=intervals,
                                   write_path="image")
        return r.run().reports["key_count"]

    add(0)
    run("a", [0, 1])
    run("b", [2, 3])
    add(1)
    run("b", [2, 3])  # b's query is now one file ahead of a's
    reports = run("b", None)  # b takes 0 and 1: caught up on part-00001 from its checkpoint on S3
    catch = [r for r in reports if r.batch_id == CATCH_UP_BATCH]
    assert [r.processed for r in catch] == [sum(2 for k in KEYS if interval_of(k, 4) in (0, 1))]
    files = RowStore(spark, layout, writer="check").input_files("key_count")
    assert files == {iv: frozenset({"part-00000.parquet", "part-00001.parquet"}) for iv in range(4)}
    add(2)
    reports = run("a", None)  # a takes everything back: part-00001 skipped (b ran it), part-00002 processed
    assert sum(r.skipped_moved for r in reports) == 2 * len(KEYS)
    assert {k: s for k, (s, _) in state_of(spark, layout, "key_count").items()} == expected
    chk = table_files(spark, f"{layout.root}/_checkpoints/moves/key_count/a")
    assert chk is not None and not chk.is_local
    logged = source_log_files(chk)
    assert sorted(f for fs in logged.values() for f in fs) == [f"part-{n:05d}.parquet" for n in range(3)]
