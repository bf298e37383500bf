"""Spark's checkpoint files in a local folder, written by deltawheel's checkpoint file manager with
the JDK's own file calls (Hadoop's local file system forks ``chmod`` for every file): a user's
streaming query keeps its checkpoint and resumes from it, a cancelled file never appears, an
existing one is not overwritten unless asked, and of writers racing for one file exactly one wins."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from deltawheel.statestore.delta.jvm import jsession, jvm
from deltawheel.statestore.objectstore.logstore import DIRECT_CHECKPOINT_MANAGER_CLASS
from py4j.protocol import Py4JJavaError

pytestmark = pytest.mark.spark


def _manager(spark, path: Path):  # type: ignore[no-untyped-def]
    j = jvm(spark)
    mgr = j.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager
    return mgr.create(j.org.apache.hadoop.fs.Path(str(path)), jsession(spark).sessionState().newHadoopConf())


def _write(mgr, spark, path: Path, data: bytes, *, overwrite: bool) -> None:  # type: ignore[no-untyped-def]
    out = mgr.createAtomic(jvm(spark).org.apache.hadoop.fs.Path(str(path)), overwrite)
    out.write(bytearray(data))
    out.close()


def test_a_users_streaming_query_resumes_from_its_local_checkpoint(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """JSON files in, a Delta table out, the checkpoint in a local folder: the second run reads only
    the new file; the logs are whole files with no temporary or Hadoop ``.crc`` side file left."""
    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass") == DIRECT_CHECKPOINT_MANAGER_CLASS
    src, chk, out = tmp_path / "in", tmp_path / "chk", tmp_path / "out"
    src.mkdir()

    def run(name: str, rows: list[dict[str, int]]) -> None:
        (src / f"{name}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
        q = (spark.readStream.schema("k long, v long").json(str(src)).writeStream.format("delta")
             .option("checkpointLocation", str(chk)).trigger(availableNow=True).start(str(out)))
        q.awaitTermination(300)
        assert q.exception() is None

    run("a", [{"k": 1, "v": 10}, {"k": 2, "v": 20}])
    run("b", [{"k": 3, "v": 30}])
    got = sorted((r.k, r.v) for r in spark.read.format("delta").load(str(out)).collect())
    assert got == [(1, 10), (2, 20), (3, 30)]  # the second run did not read a.json again
    for f in ("offsets/0", "offsets/1", "commits/0", "commits/1"):
        assert (chk / f).is_file(), f
    assert json.loads((chk / "commits" / "1").read_text().splitlines()[1]) is not None
    assert (out / "_delta_log" / f"{1:020d}.crc").is_file()
    leftovers = [p.name for d in (chk / "offsets", chk / "commits", out / "_delta_log") for p in d.iterdir()
                 if p.name.startswith(".")]
    assert leftovers == []


def test_local_files_appear_whole_at_close_and_never_overwrite_unless_asked(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "deep" / "offsets" / "0"  # parents made as Hadoop's create makes them
    mgr = _manager(spark, path)
    assert mgr.getClass().getName() == DIRECT_CHECKPOINT_MANAGER_CLASS
    j = jvm(spark)
    out = mgr.createAtomic(j.org.apache.hadoop.fs.Path(str(path)), False)
    out.write(bytearray(b"half a file"))
    assert not path.exists()  # nothing visible before close
    out.cancel()
    assert not path.exists() and list(path.parent.iterdir()) == []  # no temporary file left either
    _write(mgr, spark, path, b"v1", overwrite=False)
    assert path.read_bytes() == b"v1"
    with pytest.raises(Py4JJavaError) as err:
        _write(mgr, spark, path, b"v2", overwrite=False)
    assert "org.apache.hadoop.fs.FileAlreadyExistsException" in str(err.value)  # what Spark's logs catch
    assert path.read_bytes() == b"v1"
    _write(mgr, spark, path, b"v3", overwrite=True)
    assert path.read_bytes() == b"v3"
    assert sorted(p.name for p in path.parent.iterdir()) == ["0"]


@pytest.mark.parametrize("writers", [2, 6])
def test_of_writers_racing_for_one_file_exactly_one_wins(spark, tmp_path: Path, writers: int) -> None:  # type: ignore[no-untyped-def]
    """Each writer opens its file first, then all close at once: one file, one writer's whole content."""
    path = tmp_path / "commits" / "7"
    mgr = _manager(spark, path)
    j = jvm(spark)
    outs = []
    for i in range(writers):
        out = mgr.createAtomic(j.org.apache.hadoop.fs.Path(str(path)), False)
        out.write(bytearray(f"writer {i}\n".encode() * 1000))
        outs.append(out)
    won, lost = [], []
    gate = threading.Barrier(writers)

    def close(i: int) -> None:
        gate.wait()
        try:
            outs[i].close()
            won.append(i)
        except Py4JJavaError:
            lost.append(i)

    threads = [threading.Thread(target=close, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(won) == 1 and sorted(won + lost) == list(range(writers))
    assert path.read_text() == f"writer {won[0]}\n" * 1000
    assert sorted(p.name for p in path.parent.iterdir()) == ["7"]
