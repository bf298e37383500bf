"""Reading some intervals' rows in Python, from the files the rows table's Delta log names.

:meth:`~.store.RowStore.scan_intervals` (the recovery scan of every owner that takes intervals,
and of the tools that do: repair, promote, upgrade-state) reads here where the store's files are
reachable from Python (a local folder, ``s3a://``): the log replayed in Python
(``delta/log.py``), each of the computation's files in those intervals' partitions read with
pyarrow, the rows its deletion vector deletes left out. No Spark job: on a session that has not
read the table yet, Spark's first read of it loads its Delta snapshot first (seconds, tens of
seconds on a loaded machine), which a tool otherwise does while the pipeline waits for it.
"""

from __future__ import annotations

from typing import Iterable

from ..delta.deletionvectors import live_table
from ..delta.log import read_snapshot
from ..delta.storefs import TableFiles
from ..delta.txn import decode_path
from .rows import KeyRow

__all__ = ["interval_rows"]


def interval_rows(files: TableFiles, computation: str, intervals: Iterable[int]) -> list[KeyRow] | None:
    """Every row (fence and record-ids rows included) of ``computation``'s ``intervals``, as the
    table's current snapshot holds them; None where only Delta can answer (a log this reader does
    not take, e.g. a newer checkpoint kind)."""
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
