"""The tables of the columnar call (``columnar.py``): what ``process_columns`` reads and returns."""

from __future__ import annotations

from typing import Any, NamedTuple

from deltawheel.statestore.codecs import get_codec, int64map_columns
from deltawheel.statestore.rowtable.rows import DOMAIN_VALUES, TimeDomain

from ...computation import ColumnResult, Computation
from ...exceptions import UserCodeError
from .columns import value_ranks

__all__ = ["LateFirst", "with_late_first", "packed_pairs", "old_columns", "per_key", "sorted_timers", "same_rows",
           "check_result"]

_EVENT = DOMAIN_VALUES[TimeDomain.EVENT_TIME]


class LateFirst(NamedTuple):
    """A key's late records, run per record before the columnar call."""

    fresh: list[str]  # their ids run
    late: int
    state: bytes | None
    timers: tuple[Any, ...]
    seq: int
    prods: list[Any]


def with_late_first(state: Any, timers: Any, pre: dict[str, LateFirst]) -> tuple[Any, Any]:
    """The call's state and timers tables with ``pre``'s keys' outcomes in place."""
    import pyarrow as pa
    import pyarrow.compute as pc

    gone = pa.array(sorted(pre), pa.string())
    codec = get_codec("int64map")
    s_new = pa.Table.from_pylist([{"key": k, "map_key": mk, "map_value": mv} for k, p in pre.items()
                                  if p.state is not None for mk, mv in codec.decode(p.state).items()],
                                 schema=state.schema)
    t_new = pa.Table.from_pylist([{"key": k, "tag": tm.tag, "time_ms": tm.time_ms} for k, p in pre.items()
                                  for tm in p.timers], schema=timers.schema)
    state = pa.concat_tables([state.filter(pc.invert(pc.is_in(state.column("key"), value_set=gone))),
                              s_new]).sort_by([("key", "ascending"), ("map_key", "ascending")])
    timers = pa.concat_tables([timers.filter(pc.invert(pc.is_in(timers.column("key"), value_set=gone))),
                               t_new]).sort_by([("key", "ascending"), ("time_ms", "ascending"),
                                                ("tag", "ascending")])
    return state, timers


def packed_pairs(sub: Any, slow: set[str]) -> Any:
    """The pairs of the rows of keys not in ``slow``; None when one is not packed pairs."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = sub if not slow else sub.filter(pc.invert(pc.is_in(sub.column("key"), value_set=pa.array(sorted(slow), pa.string()))))
    return int64map_columns(rows.column("state"))


def old_columns(mine: Any, got: Any) -> tuple[Any, Any]:
    """The rows' state (key, map_key, map_value) and event-time timers (key, tag, time_ms)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    assert got is not None  # checked by ``packed_pairs``, which decoded the same rows
    rows, k, v = got
    state = pa.table({"key": mine.column("key").take(pa.array(rows, pa.int64())), "map_key": pa.array(k, pa.int64()),
                      "map_value": pa.array(v, pa.int64())})
    lists = mine.column("timers").combine_chunks()
    flat = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists)
    timers = pa.table({"key": mine.column("key").take(parents), "tag": flat.field("tag"),
                       "time_ms": flat.field("time_ms")})
    return state, timers


def per_key(col: Any, karr: Any, n: int) -> Any:
    """How many of ``col``'s sorted values belong to each of the ``n`` keys of ``karr``."""
    import numpy as np
    import pyarrow.compute as pc

    if not len(col):
        return np.zeros(n, dtype=np.int64)
    runs = pc.run_end_encode(col.combine_chunks() if hasattr(col, "combine_chunks") else col)
    lengths = np.diff(runs.run_ends.to_numpy(), prepend=0)
    at = pc.index_in(runs.values, value_set=karr).to_numpy(zero_copy_only=False)
    return np.bincount(at, weights=lengths, minlength=n).astype(np.int64)


def sorted_timers(timers: Any, karr: Any) -> tuple[Any, Any]:
    """``timers`` sorted as a row stores them, and each one's key's place in ``karr``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    order = [("key", "ascending"), ("time_ms", "ascending"), ("tag", "ascending")]
    if not timers.num_rows or timers.column("tag").null_count or timers.column("time_ms").null_count:
        tm = timers.sort_by(order)
        return tm, pc.index_in(tm.column("key"), value_set=karr).to_numpy(zero_copy_only=False)
    rows = pc.index_in(timers.column("key"), value_set=karr).to_numpy(zero_copy_only=False)
    by = np.lexsort((value_ranks(timers.column("tag"))[0], timers.column("time_ms").to_numpy(), rows))
    return timers.take(pa.array(by)), rows[by]


def same_rows(mine: Any, old_at: Any, blobs: Any, tm: Any, offsets: Any, which: Any) -> Any:
    """Per key (``which`` marks the ones asked): state and timers equal to its old row's."""
    import numpy as np

    out = np.zeros(len(which), dtype=bool)
    states = mine.column("state")
    timers = mine.column("timers")
    tags, times = tm.column("tag"), tm.column("time_ms")
    for i in np.flatnonzero(which).tolist():
        j = int(old_at[i])
        a, b = int(offsets[i]), int(offsets[i + 1])
        new_t = [{"tag": tags[x].as_py(), "domain": _EVENT, "time_ms": times[x].as_py()} for x in range(a, b)]
        out[i] = states[j].as_py() == blobs[i].as_py() and timers[j].as_py() == new_t
    return out


def check_result(comp: Computation, key: str, what: str, out: Any) -> None:
    """The result's shape; raises UserCodeError naming what is missing."""
    import pyarrow as pa

    need = {"state": ("key", "map_key", "map_value"), "timers": ("key", "tag", "time_ms"),
            "fired": ("key", "tag", "time_ms"), "productions": ("fired", "stream", "value")}
    if not isinstance(out, ColumnResult):
        raise UserCodeError(comp.name, key, what, TypeError(
            f"process_columns must return a ColumnResult, got {type(out).__name__}"))
    for name, cols in need.items():
        t = getattr(out, name)
        if not isinstance(t, pa.Table) or any(c not in t.column_names for c in cols):
            got = type(t).__name__ if not isinstance(t, pa.Table) else f"a table with columns {t.column_names}"
            raise UserCodeError(comp.name, key, what, TypeError(
                f"ColumnResult.{name} must be a pyarrow.Table with the columns {list(cols)}, got {got}"))
