"""The Delta log store for local tables: put-if-absent of commit files without a JVM lock."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark


def _store(spark):  # type: ignore[no-untyped-def]
    from deltawheel.statestore.session.sparkenv import LOG_STORE_CLASS

    cls = spark._jvm
    for part in LOG_STORE_CLASS.split("."):
        cls = getattr(cls, part)
    return cls(spark._jsc.hadoopConfiguration())


def _write(spark, store, path: Path, lines: list[str], overwrite: bool) -> None:  # type: ignore[no-untyped-def]
    jvm = spark._jvm
    store.write(jvm.org.apache.hadoop.fs.Path(path.as_uri()), jvm.java.util.ArrayList(lines).iterator(),
                overwrite, spark._jsc.hadoopConfiguration())


def test_the_session_commits_local_tables_through_the_store(spark, tmp_path: Path) -> None:
    from deltawheel.statestore.session.sparkenv import LOG_STORE_CLASS

    assert spark.conf.get("spark.delta.logStore.file.impl") == LOG_STORE_CLASS
    path = str(tmp_path / "t")
    spark.range(3).write.format("delta").save(path)
    spark.range(3, 5).write.format("delta").mode("append").save(path)
    assert sorted(r.id for r in spark.read.format("delta").load(path).collect()) == [0, 1, 2, 3, 4]
    log = sorted(p.name for p in (tmp_path / "t" / "_delta_log").iterdir()
                 if p.is_file() and not p.name.endswith(".crc"))  # Delta's checksums (and Hadoop's of them)
    assert log == ["00000000000000000000.json", "00000000000000000001.json"]  # no temporary file left


def _race(spark, store, target: Path, n: int) -> tuple[list[int], list[str]]:  # type: ignore[no-untyped-def]
    """``n`` threads (separate py4j connections, so truly concurrent JVM calls) write ``target``."""
    from py4j.protocol import Py4JJavaError

    barrier = threading.Barrier(n)
    won: list[int] = []
    lost: list[str] = []

    def writer(i: int) -> None:
        barrier.wait()
        try:
            _write(spark, store, target, [f'{{"writer": {i}}}'] * 50, False)
            won.append(i)
        except Py4JJavaError as exc:
            lost.append(str(exc.java_exception.getClass().getName()))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost


def test_racing_writers_of_one_version_exactly_one_wins(spark, tmp_path: Path) -> None:
    """Eight writers of one file at once (the store holds no lock): only one may succeed, and
    the file is whole and its."""
    store = _store(spark)
    for round_ in range(15):
        target = tmp_path / f"{round_:020d}.json"
        won, lost = _race(spark, store, target, 8)
        assert len(won) == 1, (won, lost)
        assert lost == ["java.nio.file.FileAlreadyExistsException"] * 7
        assert target.read_text() == f'{{"writer": {won[0]}}}\n' * 50
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_overwrite_replaces_and_a_missing_folder_is_an_error(spark, tmp_path: Path) -> None:
    from py4j.protocol import Py4JJavaError

    store = _store(spark)
    target = tmp_path / "_last_checkpoint"
    _write(spark, store, target, ["a"], True)
    _write(spark, store, target, ["b", "c"], True)
    assert target.read_text() == "b\nc\n"
    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        _write(spark, store, tmp_path / "missing" / "0.json", ["x"], False)
