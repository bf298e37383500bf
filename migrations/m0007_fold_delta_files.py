"""Migration 7: an interval with a deletion vector or several state files rewritten as one plain Parquet
file with the same rows (the image path reads it as such); stores Python cannot reach are left alone."""

from __future__ import annotations

from typing import Any

from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.delta.txn import FileEntry, TableLog, decode_path
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.writepath.image.files import is_ids_path
from deltawheel.statestore.writepath.image.fold import fold_intervals

__all__ = ["VERSION", "NAME", "describe", "apply", "to_fold"]

VERSION = 7
NAME = "fold_delta_files"


def describe(layout: StoreLayout) -> str:
    """One line saying what :func:`apply` does to ``layout``."""
    return (f"rewrite each interval of {layout.rows} whose files carry deletion vectors, or that has more than one "
            "state file (the image path's delta files), as one file with the same rows")


def to_fold(spark: Any, layout: StoreLayout) -> tuple[int, dict[str, dict[int, list[FileEntry]]]]:
    """(the rows table's version, computation -> interval -> live files) of the intervals to fold."""
    if table_files(spark, layout.rows) is None:
        return -1, {}
    version, entries = TableLog(spark, layout.rows).files("true", where=lambda _pv: True)
    parts: dict[str, dict[int, list[FileEntry]]] = {}
    for f in entries:
        parts.setdefault(f.part("computation") or "", {}).setdefault(int(f.part("interval") or -1), []).append(f)
    out: dict[str, dict[int, list[FileEntry]]] = {}
    for name, ivs in sorted(parts.items()):
        for iv, files in sorted(ivs.items()):
            state = [f for f in files if not is_ids_path(decode_path(f.path))]
            if len(state) > 1 or any(f.has_deletion_vector for f in files):
                out.setdefault(name, {})[iv] = files
    return version, out


def apply(spark: Any, layout: StoreLayout) -> None:
    """Fold the intervals :func:`to_fold` finds, one computation per commit."""
    version, found = to_fold(spark, layout)
    rows = table_files(spark, layout.rows)
    if not found or rows is None:
        return
    log = TableLog(spark, layout.rows)
    for name, files in found.items():
        version, _new = fold_intervals(spark, log, rows, name=name, files=files, version=version)
