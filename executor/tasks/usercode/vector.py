"""The vectorised path in the image task: one ``combine`` call over an interval's eligible keys.

A key is eligible with new on-time records; its late ones (leading) run per record first."""

from __future__ import annotations

from typing import Any

from deltawheel.statestore.writepath.image.summary import SideRecord

from ...computation import Computation, ErrorPolicy, Record
from .combine import COLUMNS, combined_rows, late_prefix, records_table

__all__ = ["takes_vectorised", "interval_combined", "KeyRecords"]

#: A key's records as the key loop runs them: (new records in order, undecodable ones, seen count).
KeyRecords = tuple[list[Record], list[SideRecord], int]


def takes_vectorised(comp: Computation, *, repeats: bool) -> bool:
    """Does this batch of ``comp`` run the vectorised path?"""
    return comp.vectorised() and comp.error_policy is not ErrorPolicy.DEAD_LETTER and not repeats


def interval_combined(comp: Computation, inp: Any, touched: list[str], seen: list[bool] | None,
                      every: list[Record] | None,
                      records_of: Any) -> tuple[dict[str, list[tuple[Any, ...]]] | None, dict[str, KeyRecords] | None]:
    """(eligible key -> its combined rows, or None; key -> its records when read here)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    with_records = [k for k in touched if k in inp.runs]
    if not with_records:
        return None, None
    if every is not None:  # no values and nothing seen before: straight from the Arrow columns
        t = inp.table
        late = pc.fill_null(t.column("late"), False)
        if pc.any(late).as_py():
            # late records (leading) run per record, the others are combined
            gone = set()
            for k in set(pc.unique(t.filter(late).column("key")).to_pylist()):
                lo, hi = inp.runs[k]
                n = late_prefix(inp.late[lo:hi])
                if n < 0 or n == hi - lo:
                    gone.add(k)
            keep = pc.invert(late)
            if gone:
                keep = pc.and_(keep, pc.invert(pc.is_in(t.column("key"), value_set=pa.array(sorted(gone), pa.string()))))
            t = t.filter(keep)
            keys = [k for k in with_records if k not in gone]
        else:
            keys = with_records
        if not keys:
            return None, None
        table = pa.table([t.column("key"), pa.nulls(t.num_rows), t.column("timestamp_ms"), t.column("record_id"),
                          pc.fill_null(t.column("stream"), "")], names=list(COLUMNS))
        return combined_rows(comp, table, keys), None
    read: dict[str, KeyRecords] = {}
    picked: list[Record] = []
    keys = []
    for key in with_records:
        lo, hi = inp.runs[key]
        got = read[key] = records_of(inp, key, lo, hi, seen)
        recs = got[0]
        n = late_prefix([r.late for r in recs])
        if 0 <= n < len(recs):  # the late ones (leading) run per record, the others are combined
            keys.append(key)
            picked += recs[n:]
    table = records_table(picked) if keys else None
    return (None if table is None else combined_rows(comp, table, keys)), read
