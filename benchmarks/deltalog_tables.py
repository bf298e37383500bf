"""Delta tables for ``deltalog_readers.py``, written by Delta (delta-spark) as deltawheel and Delta write them.

:func:`build_checkpoint_kinds` takes one table through every checkpoint kind Delta writes;
:func:`build_rows_table` and :func:`build_stream_table` make tables shaped like a store's rows and
stream tables, to time the readers on.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from typing import Any

__all__ = ["APPS", "build_checkpoint_kinds", "upload", "build_rows_table", "build_stream_table"]

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


def build_checkpoint_kinds(spark: Any, root: str, *, vacuum: bool = True) -> dict[str, str]:
    """One local table written by Delta through every checkpoint kind it writes, copied after each
    stage: kind -> the copy's folder, in which that kind is the newest checkpoint.

    Kinds: ``no_checkpoint``, ``classic``, ``multi_part``, ``v2_json``, ``v2_parquet_sidecars``,
    ``v2_classic_named`` (a V2 checkpoint under the classic name) and ``log_cleaned`` (after VACUUM
    and a log cleanup). Every copy has application versions, removes and deletion vectors in its history.
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
    if vacuum:
        conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        try:
            spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS")  # v10, v11: deletes the files OPTIMIZE replaced
        finally:
            conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    old = time.time() - 5 * 86400
    for folder, _dirs, names in os.walk(path):
        for n in names:
            os.utime(os.path.join(folder, n), (old, old))
    # v12 (v10 without VACUUM's two commits), a checkpoint: the cleanup after it deletes the
    # backdated history, and writes a V2 checkpoint under the classic name for the oldest version it keeps
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


def build_rows_table(spark: Any, uri: str, *, commits: int, intervals: int, checkpoint_interval: int) -> str:
    """A rows table at ``uri`` after ``commits`` image-path commits, each replacing two intervals' files."""
    import pyarrow as pa
    from deltawheel.statestore.delta.storefs import table_files
    from deltawheel.statestore.delta.txn import FileEntry, TableLog, new_add, partition_file_name, write_file
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.rowtable.frames import arrow_schema
    from deltawheel.statestore.rowtable.rows import FENCE_KEY, rows_file_ddl

    from deltawheel import migrations

    layout = StoreLayout(uri)
    migrations.apply(spark, layout, dry_run=False)
    spark.sql(f"ALTER TABLE delta.`{layout.rows}` SET TBLPROPERTIES "
              f"('delta.checkpointInterval' = '{checkpoint_interval}')")
    files = table_files(spark, layout.rows)
    assert files is not None, "a store whose files Python reaches (local, file:, s3a://)"
    log = TableLog(spark, layout.rows)
    schema = arrow_schema(rows_file_ddl())
    live: dict[int, FileEntry] = {}
    for c in range(commits):
        ivs = sorted({(2 * c) % intervals, (2 * c + 1) % intervals})
        adds, new = [], {}
        for iv in ivs:
            keys = [FENCE_KEY] + [f"k{iv}-{i}" for i in range(20)]
            table = pa.Table.from_pylist([{"key": k, "sequencer": c, "commit_id": f"c{c}"} for k in keys],
                                         schema=schema)
            rel = partition_file_name("c", iv, "bench")
            size = write_file(table, files, rel)
            add = new_add(rel, {"computation": "c", "interval": str(iv)}, size, table.num_rows)
            adds.append(add)
            new[iv] = FileEntry(path=json.loads(add)["add"]["path"],
                                partition_values=(("computation", "c"), ("interval", str(iv))), size=size,
                                has_deletion_vector=False, action_json=add)
        meta = json.dumps({"deltawheel": 1, "kind": "commit", "computation": "c", "commit_id": f"c{c}",
                           "write_path": "image", "sequencers": {str(iv): c for iv in ivs}})
        log.commit(remove=[live[iv] for iv in ivs if iv in live], add=adds, user_metadata=meta)
        live.update(new)
    return layout.rows


def build_stream_table(spark: Any, uri: str, *, commits: int, intervals: int) -> str:
    """A stream table at ``uri`` after ``commits`` strong deliveries, each adding one file and its
    interval's application version."""
    import pyarrow as pa
    from deltawheel.statestore.delta.storefs import table_files
    from deltawheel.statestore.delta.txn import TableLog, new_add, write_file
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.rowtable.frames import arrow_schema
    from deltawheel.statestore.writepath.streams import ensure_stream_table, stream_schema_ddl

    path = ensure_stream_table(spark, StoreLayout(uri), "out")
    files = table_files(spark, path)
    assert files is not None, f"{path}: a table whose files Python reaches"
    log = TableLog(spark, path)
    schema = arrow_schema(stream_schema_ddl())
    names = schema.names
    for c in range(commits):
        iv = c % intervals
        table = pa.Table.from_pylist([{n: None for n in names} | {"record_id": f"r{c}-{i}", "key": f"k{i}"}
                                      for i in range(10)], schema=schema)
        rel = f"part-{uuid.uuid4().hex}-bench.snappy.parquet"
        size = write_file(table, files, rel)
        log.commit(add=[new_add(rel, {}, size, table.num_rows)], app_versions={f"deltawheel.c.{iv}": c})
    return path
