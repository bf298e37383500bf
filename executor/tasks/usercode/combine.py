"""The vectorised path's combine step: ``Computation.combine`` over many keys' records, per key."""

from __future__ import annotations

from typing import Any, Sequence

from ...computation import Computation, Record
from ...exceptions import UserCodeError
from .columns import py_list

__all__ = ["COLUMNS", "records_table", "combined_rows", "late_prefix"]

#: The columns of the table ``combine`` gets, in this order (a :class:`Record`'s fields, less ``late``).
COLUMNS = ("key", "value", "timestamp_ms", "record_id", "stream")


def late_prefix(late: Sequence[bool]) -> int:
    """How many of a key's new records lead as late ones; -1 when a late one follows an on-time one.

    >>> late_prefix([True, True, False]), late_prefix([False, False]), late_prefix([False, True])
    (2, 0, -1)
    """
    n = next((i for i, flag in enumerate(late) if not flag), len(late))
    return -1 if any(late[n:]) else n


def records_table(records: Sequence[Record]) -> Any:
    """``records`` as ``combine``'s input table; None when their values fit no Arrow column."""
    import pyarrow as pa

    n = len(records)
    keys, values, ts, ids, streams, _late = zip(*records, strict=True) if n else ((),) * 6
    try:
        vals = pa.nulls(n) if all(v is None for v in values) else pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError, OverflowError):
        return None
    return pa.table([pa.array(keys, pa.string()), vals, pa.array(ts, pa.int64()), pa.array(ids, pa.string()),
                     pa.array(streams, pa.string())], names=list(COLUMNS))


def combined_rows(comp: Computation, table: Any, keys: Sequence[str]) -> dict[str, list[tuple[Any, ...]]]:
    """``comp.combine(table)`` grouped by key into tuples; UserCodeError if it raised or misbehaved."""
    import pyarrow as pa
    import pyarrow.compute as pc

    first = keys[0] if keys else ""
    what = f"combine over {table.num_rows} records of {len(keys)} keys"
    try:
        out = comp.combine(table)
    except Exception as exc:
        raise UserCodeError(comp.name, first, what, exc) from exc
    if not isinstance(out, pa.Table) or "key" not in out.column_names or not pa.types.is_string(
            out.schema.field("key").type):
        got = type(out).__name__ if not isinstance(out, pa.Table) else f"a table with columns {out.column_names}"
        raise UserCodeError(comp.name, first, what, TypeError(
            f"combine must return a pyarrow.Table with a string 'key' column, got {got}"))
    rows: dict[str, list[tuple[Any, ...]]] = {k: [] for k in keys}
    if not out.num_rows:
        return rows
    out = out.take(pc.sort_indices(out.column("key")))  # a stable sort: each key's rows keep their order
    names = [c for c in out.column_names if c != "key"]
    cols = [py_list(out.column(c)) for c in names]
    flat = list(zip(*cols, strict=True)) if cols else [()] * out.num_rows
    ree = pc.run_end_encode(out.column("key").combine_chunks())
    start = 0
    for key, end in zip(ree.values.to_pylist(), ree.run_ends.to_pylist(), strict=True):
        rows[key] = flat[start:end]
        start = end
    return rows

