"""gc skips OPTIMIZE and VACUUM where they would change nothing (gc/unchanged.py); each skip is checked
against Delta's own commands on one table taken through appends, compactions, deletion vectors, stray
and hidden files: a skipped OPTIMIZE would have committed nothing, a skipped VACUUM would have
deleted nothing, and both skips do fire where Delta has nothing to do (a file with a deletion vector
is never skipped: whether OPTIMIZE purges it is Delta's call)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltawheel.gc.unchanged import live_files, nothing_to_compact, nothing_to_vacuum

pytestmark = pytest.mark.spark


def _version(spark: Any, path: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["version"])


def test_a_skipped_pass_is_one_delta_would_have_done_nothing_in(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "t")
    check = "spark.databricks.delta.retentionDurationCheck.enabled"
    spark.conf.set(check, "false")
    seen: list[tuple[str, bool, bool, bool]] = []

    def compare(step: str) -> None:
        snap = live_files(spark, path)
        assert snap is not None
        dry = spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS DRY RUN").collect()
        skip_vacuum = nothing_to_vacuum(spark, path, snap)
        assert not (skip_vacuum and dry), (step, dry)  # a skip never leaves a file VACUUM would delete
        skip_compact, before = nothing_to_compact(snap), _version(spark, path)
        spark.sql(f"OPTIMIZE delta.`{path}`").collect()
        idle = _version(spark, path) == before
        assert idle or not skip_compact, step  # a skip never leaves work OPTIMIZE would have done
        seen.append((step, skip_vacuum, skip_compact, idle))

    def append(rows: list[tuple[int, int]]) -> None:
        spark.createDataFrame(rows, "p INT, id INT").write.format("delta").mode("append").partitionBy("p").save(path)

    try:
        append([(0, 1), (0, 2), (1, 3), (1, 4)])
        compare("one file per partition")
        append([(0, 5)])
        compare("two files in a partition")  # OPTIMIZE merges them: the old ones are tombstones on disk
        compare("compacted, tombstones on disk")
        spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS").collect()
        compare("vacuumed")
        (tmp_path / "t" / "p=0" / ".hidden.crc").write_bytes(b"x")
        (tmp_path / "t" / "_scratch").mkdir()
        (tmp_path / "t" / "_scratch" / "part-0.parquet").write_bytes(b"x")
        compare("hidden files only")
        (tmp_path / "t" / "p=1" / "stray.parquet").write_bytes(b"x")
        compare("a stray file")
        spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS").collect()
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
        spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3")
        compare("a deletion vector")  # not skipped: OPTIMIZE may purge it
    finally:
        spark.conf.unset(check)
    by_step = {step: (v, c, idle) for step, v, c, idle in seen}
    assert by_step["one file per partition"] == (True, True, True)
    assert by_step["two files in a partition"][1:] == (False, False)  # OPTIMIZE had work, and was run
    assert by_step["compacted, tombstones on disk"][0] is False
    assert by_step["vacuumed"] == (True, True, True) and by_step["hidden files only"] == (True, True, True)
    assert by_step["a stray file"][0] is False and by_step["a deletion vector"][1] is False
    assert sorted(r["id"] for r in spark.read.format("delta").load(path).collect()) == [1, 2, 4, 5]


def test_a_retention_skipped_by_the_files_statistics_had_no_row_to_remove(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The retention passes skip their Spark count where every file's minimum of the column is at or
    past the cutoff: for each cutoff, a skip means Spark counts no row before it, and it fires at
    the oldest row's time; a file without statistics is never skipped."""
    from deltawheel.gc.unchanged import nothing_before

    path = str(tmp_path / "m")
    for rows in ([(1, 100), (2, 250)], [(3, 175)]):
        spark.createDataFrame(rows, "id INT, recorded_ms BIGINT").write.format("delta").mode("append").save(path)
    snap = live_files(spark, path)
    assert snap is not None
    table = spark.read.format("delta").load(path)
    skipped = {c: nothing_before(snap, "recorded_ms", c) for c in (99, 100, 101, 175, 176, 251)}
    for cutoff, skip in skipped.items():
        assert not skip or table.where(f"recorded_ms < {cutoff}").count() == 0, cutoff
    assert skipped == {99: True, 100: True, 101: False, 175: False, 176: False, 251: False}
    bare = type(snap)(version=snap.version, adds=tuple({**a, "stats": None} for a in snap.adds), configuration={}, txns={})
    assert not nothing_before(bare, "recorded_ms", 0)
