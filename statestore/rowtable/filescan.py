"""Reading some intervals' rows in Python (no Spark job), for :meth:`~.store.RowStore.scan_intervals`."""

from __future__ import annotations

from typing import Iterable

from ..delta.deletionvectors import live_table
from ..delta.log import read_snapshot
from ..delta.storefs import TableFiles
from ..delta.txn import decode_path
from .rows import KeyRow

__all__ = ["interval_rows"]


def interval_rows(files: TableFiles, computation: str, intervals: Iterable[int]) -> list[KeyRow] | None:
    """Every row (fence and record-ids rows included) of ``intervals``; None where only Delta can answer."""
    snap = read_snapshot(files)
    if snap is None:
        return None
    wanted = {str(iv) for iv in intervals}
    out: list[KeyRow] = []
    for add in snap.adds:
        pv = add.get("partitionValues") or {}
        if pv.get("computation") != computation or pv.get("interval") not in wanted:
            continue
        dv = add.get("deletionVector")
        table = live_table(files, decode_path(str(add["path"])), dict(dv) if dv else None)
        part = {"computation": computation, "interval": int(pv["interval"])}
        out += [KeyRow.from_row({**r, **part}) for r in table.to_pylist()]
    return out
