"""Every checkpoint kind Delta writes is replayed by deltawheel's log reader exactly as Delta's own
snapshot reads it: the version, the live files (path, size, deletion vector or not) and the
application versions, locally and on the object store.

One table goes through the kinds (``build_checkpoint_kinds``: no checkpoint, classic, multi-part,
V2 with a JSON and a Parquet top-level file and sidecars, a V2 checkpoint under the classic name,
after a log cleanup), written as deltawheel writes (Parquet files committed through Delta with
application versions) and by Delta's own DELETE (a deletion vector) and OPTIMIZE (removes); a copy
is kept after each stage. VACUUM is left out (its commits carry no file action; 20 s of Spark
jobs).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pytest

pytestmark = pytest.mark.spark

APPS = tuple(f"deltawheel.c.{i}" for i in range(2))  # the application ids the kinds table records


def _append(spark: Any, path: str, ids: range, *, part: int | None = None, app: str | None = None,
            version: int = 0, replace: int | None = None) -> None:
    """Commit new files of ``ids`` (partition ``p`` = id % 2, or ``part``) as deltawheel writes them,
    with application version ``app`` = ``version``; ``replace``: first remove that partition's live files."""
    import pyarrow as pa
    from deltawheel.statestore.delta.storefs import files_for
    from deltawheel.statestore.delta.txn import TableLog, new_add, write_file

    log = TableLog(spark, path)
    root = files_for(path)
    assert root is not None
    by_part: dict[int, list[int]] = {}
    for i in ids:
        by_part.setdefault(i % 2 if part is None else part, []).append(i)
    adds = []
    for p, values in sorted(by_part.items()):
        rel = f"p={p}/part-{uuid.uuid4().hex}.snappy.parquet"
        size = write_file(pa.table({"id": pa.array(values, pa.int64())}), root, rel)
        adds.append(new_add(rel, {"p": str(p)}, size, len(values)))
    remove = log.files(f"p = {replace}")[1] if replace is not None else []  # Delta's own read of them
    log.commit(remove=remove, add=adds, app_versions={app: version} if app else None)


def build_checkpoint_kinds(spark: Any, root: str) -> dict[str, str]:
    """One local table written by Delta through every checkpoint kind it writes, copied after each
    stage: kind -> the copy's folder, in which that kind is the newest checkpoint.

    Kinds: ``no_checkpoint``, ``classic``, ``multi_part``, ``v2_json``, ``v2_parquet_sidecars``,
    ``v2_classic_named`` (a V2 checkpoint under the classic name) and ``log_cleaned`` (after a log
    cleanup). Every copy has application versions, removes and deletion vectors in its history.
    """
    path = f"{root}/table"
    out: dict[str, str] = {}
    log = f"{path}/_delta_log"

    def copy(kind: str) -> None:
        out[kind] = f"{root}/{kind}"
        shutil.copytree(path, out[kind])

    conf = spark.conf
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT, p INT) USING DELTA PARTITIONED BY (p) TBLPROPERTIES "
              "('delta.checkpointInterval' = '2', 'delta.enableDeletionVectors' = 'true')")  # v0
    _append(spark, path, range(0, 6), app=APPS[0], version=1)  # v1
    copy("no_checkpoint")
    _append(spark, path, range(6, 12), app=APPS[1], version=2)  # v2: classic checkpoint
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3")  # v3: a deletion vector
    copy("classic")
    conf.set("spark.databricks.delta.checkpoint.partSize", "3")
    try:
        _append(spark, path, range(100, 103), part=1, replace=1, app=APPS[0], version=4)  # v4: multi-part
    finally:
        conf.unset("spark.databricks.delta.checkpoint.partSize")
    _append(spark, path, range(20, 22))  # v5
    copy("multi_part")
    conf.set("spark.databricks.delta.checkpointV2.topLevelFileFormat", "json")
    try:
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointPolicy' = 'v2')")  # v6: V2 JSON
    finally:
        conf.unset("spark.databricks.delta.checkpointV2.topLevelFileFormat")
    _append(spark, path, range(30, 32), app=APPS[1], version=7)  # v7
    copy("v2_json")
    conf.set("spark.databricks.delta.checkpointV2.topLevelFileFormat", "parquet")
    conf.set("spark.databricks.delta.checkpoint.partSize", "3")
    try:
        _append(spark, path, range(40, 42), app=APPS[0], version=8)  # v8: V2 Parquet, several sidecars
    finally:
        conf.unset("spark.databricks.delta.checkpointV2.topLevelFileFormat")
        conf.unset("spark.databricks.delta.checkpoint.partSize")
    top = next(n for n in os.listdir(log) if n.startswith(f"{8:020d}.checkpoint.") and n.endswith(".parquet"))
    copy("v2_classic_named")  # the newest checkpoint, no JSON commit after it: its sidecars hold every file
    os.rename(f"{out['v2_classic_named']}/_delta_log/{top}",
              f"{out['v2_classic_named']}/_delta_log/{8:020d}.checkpoint.parquet")
    os.remove(f"{out['v2_classic_named']}/_delta_log/_last_checkpoint")  # it names the UUID file; optional
    spark.sql(f"OPTIMIZE delta.`{path}`")  # v9: removes (and the deletion vector's file rewritten)
    copy("v2_parquet_sidecars")
    old = time.time() - 5 * 86400
    for folder, _dirs, names in os.walk(path):
        for n in names:
            os.utime(os.path.join(folder, n), (old, old))
    # v10, a checkpoint: the cleanup after it deletes the backdated history, and writes a V2 checkpoint
    # under the classic name for the oldest version it keeps
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 2 days', "
              "'delta.deletedFileRetentionDuration' = 'interval 1 days')")
    _append(spark, path, range(50, 52), app=APPS[1], version=13)
    copy("log_cleaned")
    if os.path.exists(f"{log}/{0:020d}.json"):
        raise RuntimeError(f"the log cleanup of {path} deleted nothing: the log_cleaned kind is not what it says")
    return out


def upload(local: str, files: Any) -> None:
    """Copy a local table folder to the :class:`TableFiles` ``files`` (an S3 prefix), file by file."""
    for folder, _dirs, names in os.walk(local):
        for n in names:
            rel = os.path.relpath(os.path.join(folder, n), local)
            with open(os.path.join(folder, n), "rb") as src, files.fs.open_output_stream(files.path(rel)) as dst:
                dst.write(src.read())


@dataclass(frozen=True)
class TableView:
    """What a reader says a table is: its version, live files (decoded path, size, has a deletion
    vector) and each application id's version (None: none recorded)."""

    version: int
    files: frozenset[tuple[str, int, bool]]
    txns: tuple[tuple[str, int | None], ...]


def read_with_delta(spark: Any, uri: str, apps: Sequence[str]) -> TableView:
    """Delta's own snapshot, read in the session's JVM (the reference)."""
    from urllib.parse import unquote

    from deltawheel.statestore.delta.txn import TableLog

    log = TableLog(spark, uri)
    version, files = log.files("true")  # no ``where``: Delta's snapshot, never the Python replay
    txn = log._log.startTransaction()  # Delta's own state
    txns = tuple((a, None if int(txn.txnVersion(a)) < 0 else int(txn.txnVersion(a))) for a in apps)
    return TableView(version, frozenset((unquote(f.path), f.size, f.has_deletion_vector) for f in files), txns)


def read_with_log(files: Any, apps: Sequence[str]) -> TableView | None:
    """deltawheel's replay (``log.read_snapshot``) of a :class:`TableFiles`; None: it declines."""
    from urllib.parse import unquote

    from deltawheel.statestore.delta.log import read_snapshot

    snap = read_snapshot(files)
    if snap is None:
        return None
    return TableView(snap.version,
                     frozenset((unquote(a["path"]), int(a["size"]), bool(a.get("deletionVector"))) for a in snap.adds),
                     tuple((a, snap.txns.get(a)) for a in apps))


def compare(reference: TableView, got: TableView | None) -> str:
    """``exact``, ``declined`` (the reader returned None) or what differs."""
    if got is None:
        return "declined"
    diffs = []
    if got.version != reference.version:
        diffs.append(f"version {got.version} != {reference.version}")
    if got.files != reference.files:
        diffs.append(f"files: {len(got.files - reference.files)} extra, {len(reference.files - got.files)} missing")
    if got.txns != reference.txns:
        diffs.append(f"txns {dict(got.txns)} != {dict(reference.txns)}")
    return "; ".join(diffs) or "exact"


@pytest.fixture(scope="module")
def kinds(spark, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return build_checkpoint_kinds(spark, str(tmp_path_factory.mktemp("kinds")))


@pytest.fixture(scope="module")
def reference(spark, kinds: dict[str, str]) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """Delta's own snapshot of each kind (the session's DeltaLog)."""
    return {kind: read_with_delta(spark, path, APPS) for kind, path in kinds.items()}


def _replayed(reference: dict[str, object], files: dict[str, object]) -> dict[str, str]:
    return {kind: compare(reference[kind], read_with_log(f, APPS)) for kind, f in files.items()}  # type: ignore[arg-type]


def test_every_checkpoint_kind_is_replayed_as_delta_reads_it(kinds: dict[str, str],
                                                             reference: dict[str, object]) -> None:
    from deltawheel.statestore.delta.storefs import files_for

    assert sorted(kinds) == sorted(["no_checkpoint", "classic", "multi_part", "v2_json", "v2_parquet_sidecars",
                                    "v2_classic_named", "log_cleaned"])
    names = {kind: sorted(p.name for p in Path(path, "_delta_log").iterdir()) for kind, path in kinds.items()}
    assert any(".checkpoint.0000000001." in n for n in names["multi_part"])  # the kinds are what they say
    assert any(n.endswith(".json") and ".checkpoint." in n for n in names["v2_json"])
    assert f"{8:020d}.checkpoint.parquet" in names["v2_classic_named"]
    assert f"{0:020d}.json" not in names["log_cleaned"]
    assert _replayed(reference, {kind: files_for(path) for kind, path in kinds.items()}) == \
        {kind: "exact" for kind in kinds}


@pytest.mark.objectstore
def test_every_checkpoint_kind_is_replayed_from_the_object_store(spark, s3_bucket: str, kinds: dict[str, str],  # type: ignore[no-untyped-def]
                                                                 reference: dict[str, object]) -> None:
    from deltawheel.statestore.delta.storefs import table_files

    root = f"s3a://{s3_bucket}/kinds-{uuid.uuid4().hex[:8]}"
    files = {}
    for kind, path in kinds.items():
        files[kind] = table_files(spark, f"{root}/{kind}")
        upload(path, files[kind])
    assert _replayed(reference, files) == {kind: "exact" for kind in kinds}
