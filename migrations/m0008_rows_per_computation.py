"""Migration 8: a rows table per computation (docs/scale.md, "Raising it").

Each computation's table starts as a copy of the first rows table's log with that computation's files
(linked where local), its versions going on from the first table's (so above every delivered version);
one commit removes the other computations' files, a last one empties the first table (it keeps the id)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from deltawheel.statestore.delta.log import commit_infos, local_path, local_table_exists, user_metadata
from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.delta.txn import TableLog, decode_path
from deltawheel.statestore.exceptions import MigrationError
from deltawheel.statestore.layout import StoreLayout

from . import m0007_fold_delta_files

__all__ = ["VERSION", "NAME", "SPLIT", "describe", "apply"]

VERSION = 8
NAME = "rows_per_computation"
SPLIT = "split"  # the ``kind`` of the commits this migration makes


def describe(layout: StoreLayout) -> str:
    """One line saying what :func:`apply` does to ``layout``."""
    return (f"give each computation a rows table of its own ({layout.computations_root}/<computation>/rows), "
            f"its versions going on from {layout.rows}'s, then empty {layout.rows} (it keeps the store's id)")


def _meta(**fields: Any) -> str:
    return json.dumps({"deltawheel": 1, "kind": SPLIT, **fields}, sort_keys=True)


def _split_done(spark: Any, path: str) -> bool:
    files = table_files(spark, path)
    infos = None if files is None else commit_infos(files, after=-1)
    if infos is not None:  # a checkpoint would hide early commits: the split is the table's first commit
        return any((user_metadata(i.get("userMetadata")) or {}).get("kind") == SPLIT for _v, i in infos)
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("userMetadata").collect()
    return any(SPLIT in str(r["userMetadata"] or "") for r in hist)


def _copy_tree(spark: Any, src: str, dst: str, rel: str, *, only: set[str] | None = None) -> None:
    """Copy the files below ``rel`` of ``src`` to ``dst`` (``only``: just those); hard links where local."""
    a, b = local_path(src), local_path(dst)
    if a is not None and b is not None:
        for folder, _dirs, names in os.walk(os.path.join(a, rel)):
            for name in names:
                here = os.path.join(folder, name)
                target = os.path.join(b, os.path.relpath(here, a))
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if not os.path.exists(target):
                    try:
                        os.link(here, target)
                    except OSError:
                        shutil.copyfile(here, target)
        return
    fa, fb = table_files(spark, src), table_files(spark, dst)
    if fa is None or fb is None:
        raise MigrationError(f"{src} is on a store Python does not reach; migration 8 copies its files with "
                             "pyarrow (local folders and s3a:// stores)")
    from pyarrow import fs as pafs

    base = fa.path(rel)
    for info in fa.fs.get_file_info(pafs.FileSelector(base, allow_not_found=True, recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        sub = f"{rel}/{info.path[len(base):].lstrip('/')}" if rel else info.path[len(fa.path('')):].lstrip("/")
        if only is None or sub in only:
            fb.fs.copy_file(info.path, fb.path(sub))


def _clear(spark: Any, path: str) -> None:
    """Remove a table a split left half made (no writer uses the store before the migration ends)."""
    folder = local_path(path)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    files = table_files(spark, path)
    if files is not None:
        files.fs.delete_dir_contents(files.path(""), missing_dir_ok=True)


def apply(spark: Any, layout: StoreLayout) -> None:
    """Fold what migration 7 folds, give each computation its table, then empty the first table."""
    m0007_fold_delta_files.apply(spark, layout)  # no deletion vector left to carry over
    old = TableLog(spark, layout.rows)
    version, entries = old.files("true", where=lambda _pv: True)
    names = sorted({f.part("computation") or "" for f in entries})
    for name in names:
        path = layout.rows_of(name)
        exists = local_table_exists(table_files(spark, path) or path)
        if exists and _split_done(spark, path):
            continue
        if exists is not False:
            _clear(spark, path)
        live = {decode_path(f.path) for f in entries if f.part("computation") == name}
        _copy_tree(spark, layout.rows, path, f"computation={name}",
                   only=None if local_path(path) is not None else live)
        _copy_tree(spark, layout.rows, path, "_delta_log")
        shard = TableLog(spark, path)
        _v, theirs = shard.files("true", where=lambda pv, name=name: pv.get("computation") != name)  # type: ignore[misc]
        shard.commit(remove=theirs, user_metadata=_meta(from_version=version, computation=name))
    if entries:
        old.commit(remove=entries, user_metadata=_meta(computations=names))
