"""The Python reader of a local table's live files agrees with Delta's own snapshot."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark


def _jvm_files(spark, path: str) -> tuple[int, set[tuple[str, int, bool]]]:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.delta.txn import TableLog

    version, files = TableLog(spark, path).files("true")  # no `where`: Delta's snapshot
    return version, {(f.path, f.size, f.has_deletion_vector) for f in files}


def _py_files(spark, path: str) -> tuple[int, set[tuple[str, int, bool]]]:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.delta.txn import TableLog

    version, files = TableLog(spark, path).files("true", where=lambda pv: True)
    return version, {(f.path, f.size, f.has_deletion_vector) for f in files}


@pytest.mark.parametrize("appends_after", [0, 1])
def test_the_python_log_replay_matches_delta_across_checkpoints_removes_and_deletion_vectors(
        spark, tmp_path: Path, appends_after: int) -> None:
    """Versions: 0 create, 1-3 appends (checkpoint at 3), 4 DELETE (deletion vectors), 5 a
    partition replaced (removes); with ``appends_after`` = 1 a sixth commit makes a checkpoint
    that holds the deletion vectors, else the removes and vectors are replayed from JSON."""
    from deltawheel.statestore.delta.log import read_snapshot

    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, p INT) USING DELTA PARTITIONED BY (p) "
              "TBLPROPERTIES ('delta.checkpointInterval' = '3', 'delta.enableDeletionVectors' = 'true')")
    for i in range(3):  # appends to two partitions
        spark.range(i * 10, i * 10 + 10).selectExpr("id", "cast(id % 2 as int) as p") \
            .write.format("delta").mode("append").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3 OR id = 14")  # deletion vectors on two files
    spark.range(100, 105).selectExpr("id", "1 as p").write.format("delta").mode("overwrite") \
        .option("replaceWhere", "p = 1").save(path)  # removes every file of partition 1
    for _ in range(appends_after):
        spark.range(200, 203).selectExpr("id", "0 as p").write.format("delta").mode("append").save(path)
    log = tmp_path / "t" / "_delta_log"
    cps = sorted(p.name for p in log.glob("*.checkpoint.parquet"))
    assert cps[-1].startswith(f"{3 * (1 + appends_after):020d}")  # the checkpoint path is exercised
    jv, jfiles = _jvm_files(spark, path)
    pv, pfiles = _py_files(spark, path)
    assert (pv, pfiles) == (jv, jfiles)
    assert pv == 5 + appends_after
    assert any(dv for _, _, dv in pfiles)  # the deletion vectors survived the replay
    live = sum(1 for _ in spark.read.format("delta").load(path).collect())
    assert live == (15 - 1) + 5 + 3 * appends_after  # p=0 less id 14; p=1 replaced by 5 rows
    # the add JSON kept for a later remove is one Delta parses
    snap = read_snapshot(path)
    assert snap is not None and snap.configuration.get("delta.checkpointInterval") == "3"
    from deltawheel.statestore.delta.txn import TableLog

    t = TableLog(spark, path)
    _, entries = t.files("true", where=lambda pv: pv.get("p") == "0")
    assert entries and all(e.part("p") == "0" for e in entries)
    parsed = t._from_json(entries[0].action_json)
    assert str(parsed.path()) == entries[0].path


def test_the_reader_declines_what_it_does_not_read(spark, tmp_path: Path) -> None:
    from deltawheel.statestore.delta.log import local_table_exists, read_snapshot

    assert read_snapshot("s3a://bucket/table") is None and local_table_exists("s3a://bucket/t") is None
    assert read_snapshot(str(tmp_path / "none")) is None and local_table_exists(str(tmp_path / "none")) is False
    path = tmp_path / "t"
    for i in range(3):
        spark.range(i, i + 1).write.format("delta").mode("append").save(str(path))
    assert local_table_exists(str(path)) is True
    assert read_snapshot(path.as_uri()) is not None and read_snapshot(path.as_uri()).version == 2  # type: ignore[union-attr]
    gap = tmp_path / "gap"
    shutil.copytree(path, gap)
    (gap / "_delta_log" / "00000000000000000001.json").unlink()
    assert read_snapshot(str(gap)) is None
    multi = tmp_path / "multi"
    shutil.copytree(path, multi)
    (multi / "_delta_log" / "00000000000000000002.checkpoint.0000000001.0000000002.parquet").write_bytes(b"")
    assert read_snapshot(str(multi)) is None
    managed = tmp_path / "managed"  # a catalog-managed table: its commits are the catalog's
    shutil.copytree(path, managed)
    protocol = {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                             "readerFeatures": ["catalogManaged"], "writerFeatures": ["catalogManaged"]}}
    (managed / "_delta_log" / "00000000000000000003.json").write_text(json.dumps(protocol) + "\n")
    assert read_snapshot(str(managed)) is None
    assert read_snapshot(str(path)) is not None  # the same log without that protocol commit is read


def test_file_level_commits_carry_the_checksum_forward_without_a_spark_job(spark, tmp_path: Path) -> None:
    """TableLog commits as a Delta WRITE: the new snapshot gets its protocol and metadata from the
    checksum Delta derives in memory, so a commit runs no Spark job — also with a session time zone
    other than UTC, where Delta would verify a file list kept in that checksum by rebuilding the
    table state at every commit (``build_spark`` turns that list off)."""
    import json
    import os

    from deltawheel.statestore.delta.txn import TableLog, decode_path

    path = str(tmp_path / "t")
    spark.range(6).selectExpr("id", "cast(id % 2 as int) as p").write.format("delta").partitionBy("p").save(path)
    log = TableLog(spark, path)
    sc = spark.sparkContext
    tz = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "Europe/Berlin")
    try:
        jobs = []
        for i in range(4):
            _, files = log.files("true", where=lambda pv: True)
            old = next(f for f in files if f.part("p") == "0")
            add = json.loads(old.action_json)["add"]
            add["path"] = add["path"].rsplit("/", 1)[0] + f"/copy-{i}.parquet"
            shutil.copy(os.path.join(path, decode_path(old.path)), os.path.join(path, decode_path(add["path"])))
            sc.setJobGroup(f"dw-commit-{i}", "commit")
            if i < 3:
                log.commit(remove=[old], add=[json.dumps({"add": add})], read_partitions=["p = 0"])
            else:  # a delivery: blind append with an application version, read back in Python
                assert log.txn_version("app") == -1
                log.commit(add=[json.dumps({"add": add})], app_versions={"app": 5})
                assert log.txn_version("app") == 5
            jobs.append(len(sc.statusTracker().getJobIdsForGroup(f"dw-commit-{i}")))
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # the session is shared by the test run: leave no job group
        sc.setLocalProperty("spark.job.description", None)
        spark.conf.set("spark.sql.session.timeZone", tz)
    assert jobs == [0, 0, 0, 0]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    ops = [(h["operation"], h["operationParameters"]["mode"]) for h in history[1:]]
    assert ops == [("WRITE", "Overwrite")] * 3 + [("WRITE", "Append")]
    assert history[1]["operationParameters"]["predicate"] == "(p = 0)"
    assert spark.read.format("delta").load(path).count() == 7  # 3 rows replaced thrice, then 1 more
    assert int(log._log.startTransaction().txnVersion("app")) == 5  # Delta agrees


@pytest.mark.parametrize("same_partition", [True, False])
def test_a_commit_racing_an_append_to_a_partition_it_read_is_a_conflict(
        spark, tmp_path: Path, same_partition: bool) -> None:
    """A file-level commit records its partitions as read; a commit that lands between its snapshot
    and its commit and adds a file there must make it fail as a *conflict* (retryable; Delta's
    ConcurrentAppendException), and one that adds elsewhere must not. Delta evaluates the recorded
    predicates against the winner's files only in that race: recorded unrewritten, they failed
    there with an AnalysisException (unresolved partition column), which no caller retries (a
    takeover's claim racing a zombie's commit stopped the new owner)."""
    import os

    from deltawheel.statestore.delta.txn import TableLog, new_add
    from deltawheel.statestore.exceptions import CommitConflictError
    from deltawheel.statestore.rowtable.fencing import translate_commit_error

    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, c STRING, iv INT) USING DELTA PARTITIONED BY (c, iv)")

    def add(iv: int, tag: str) -> str:
        rel = f"c=a/iv={iv}/part-{tag}.parquet"
        os.makedirs(os.path.join(path, f"c=a/iv={iv}"), exist_ok=True)
        spark.range(1).toPandas().to_parquet(os.path.join(path, rel), index=False)
        return new_add(rel, {"c": "a", "iv": str(iv)}, os.path.getsize(os.path.join(path, rel)), 1)

    def racer() -> None:  # runs once the commit below has taken its snapshot
        TableLog(spark, path).commit(add=[add(0 if same_partition else 1, "racer")])

    log = TableLog(spark, path)
    if same_partition:
        with pytest.raises(Exception) as info:
            log.commit(add=[add(0, "mine")], read_partitions=["c = 'a' AND iv = 0"], check=racer)
        # Delta's class name, or (when pyspark turns the JVM error into a Python one) its error class
        assert re.search(r"ConcurrentAppendException|DELTA_CONCURRENT_APPEND", str(info.value)), str(info.value)[:500]
        err = translate_commit_error(info.value, sequencers={0: 1})
        assert isinstance(err, CommitConflictError)
        with pytest.raises(CommitConflictError, match="concurrent Delta commit touched the same interval"):
            raise err
    else:
        version = log.commit(add=[add(0, "mine")], read_partitions=["c = 'a' AND iv = 0"], check=racer)
        assert version == 2
    rows = spark.read.format("delta").load(path).count()
    assert rows == (1 if same_partition else 2)
