"""Migration 8: a rows table per computation (docs/scale.md, "Raising it").

Each computation's live files of the store's first rows table are linked or copied, unchanged, into
``computations/<name>/rows`` and added there in one commit; then one commit empties the first table,
which keeps the store's identity. Its history stays readable there until gc's vacuum. A writer of
schema 7 meets version 8 and refuses the store (``SchemaTooNewError``)."""

from __future__ import annotations

import json
import os
from typing import Any

from deltawheel.statestore.delta.log import commit_infos, local_path, user_metadata
from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.delta.txn import FileEntry, TableLog, decode_path
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.tables import ensure_rows_table

from . import m0007_fold_delta_files

__all__ = ["VERSION", "NAME", "SPLIT", "describe", "apply"]

VERSION = 8
NAME = "rows_per_computation"
SPLIT = "split"  # the ``kind`` of the commits this migration makes
_DROPPED = ("deletionVector", "baseRowId", "defaultRowCommitVersion")


def describe(layout: StoreLayout) -> str:
    """One line saying what :func:`apply` does to ``layout``."""
    return (f"move each computation's rows from {layout.rows} into a table of its own "
            f"({layout.computations_root}/<computation>/rows), then empty {layout.rows} (it keeps the store's id)")


def _meta(**fields: Any) -> str:
    return json.dumps({"deltawheel": 1, "kind": SPLIT, **fields}, sort_keys=True)


def _split_done(spark: Any, path: str) -> bool:
    files = table_files(spark, path)
    infos = None if files is None else commit_infos(files, after=-1)
    if infos is not None:  # a checkpoint would hide early commits: the split is the table's first commit
        return any((user_metadata(i.get("userMetadata")) or {}).get("kind") == SPLIT for _v, i in infos)
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("userMetadata").collect()
    return any(SPLIT in str(r["userMetadata"] or "") for r in hist)


def _place(spark: Any, layout: StoreLayout, src: str, dst: str, rel: str) -> None:
    """The file ``rel`` of table ``src`` at the same place below table ``dst`` (a link where it can)."""
    a, b = local_path(src), local_path(dst)
    if a is not None and b is not None:
        target = os.path.join(b, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            try:
                os.link(os.path.join(a, rel), target)
            except OSError:
                import shutil

                shutil.copyfile(os.path.join(a, rel), target)
        return
    fa, fb = table_files(spark, src), table_files(spark, dst)
    assert fa is not None and fb is not None  # the caller checked
    fa.fs.copy_file(fa.path(rel), fb.path(rel))


def _add(entry: FileEntry) -> str:
    action = json.loads(entry.action_json)["add"]
    for key in _DROPPED:
        action.pop(key, None)
    return json.dumps({"add": {**action, "dataChange": True}})


def apply(spark: Any, layout: StoreLayout) -> None:
    """Fold what migration 7 folds, move each computation's files, then empty the first table."""
    m0007_fold_delta_files.apply(spark, layout)  # no deletion vector left to carry over
    old = TableLog(spark, layout.rows)
    version, entries = old.files("true", where=lambda _pv: True)
    by_comp: dict[str, list[FileEntry]] = {}
    for f in entries:
        by_comp.setdefault(f.part("computation") or "", []).append(f)
    python = table_files(spark, layout.rows) is not None
    for name, files in sorted(by_comp.items()):
        path = ensure_rows_table(spark, layout, name)
        if _split_done(spark, path):
            continue
        if python and not any(f.has_deletion_vector for f in files):
            for f in files:
                _place(spark, layout, layout.rows, path, decode_path(f.path))
            TableLog(spark, path).commit(add=[_add(f) for f in files],
                                         user_metadata=_meta(from_version=version, computation=name))
        else:  # a store only Spark reaches: the rows rewritten (the MERGE path keeps no ids files)
            spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", _meta(from_version=version,
                                                                                   computation=name))
            try:
                (spark.read.format("delta").option("versionAsOf", version).load(layout.rows)
                 .where(f"computation = '{name}'").write.format("delta").mode("append").save(path))
            finally:
                spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")
    if entries:
        old.commit(remove=entries, user_metadata=_meta(computations=sorted(by_comp)))
