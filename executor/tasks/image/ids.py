"""The record ids of an interval image, column-wise: they stay in Arrow while the keys run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deltawheel.statestore.rowtable.rows import FENCE_KEY
from deltawheel.statestore.writepath.image.idsfiles import flatten_ids, within

from ...computation import Computation
from ..usercode.columns import Input, py_list

__all__ = ["HeldIds", "flat_ids", "already_seen", "pair_hits", "with_ids", "trim_ids", "expired_ids", "drop_empty"]


@dataclass
class HeldIds:
    """Flattened record ids of the touched rows (``table``: those within the dedup horizon)."""

    held: Any
    table: Any


def flat_ids(sub: Any, horizon_ms: int | None) -> HeldIds:
    """The record ids the rows ``sub`` hold, flattened (``.table``: those seen at ``horizon_ms`` or later)."""
    held = flatten_ids(sub)
    return HeldIds(held, within(held, horizon_ms))


def already_seen(comp: Computation, inp: Input, ids: HeldIds, *, maybe: Any = None) -> list[bool] | None:
    """Per input record: does the key's row already hold its id (``maybe``: the filter's candidates)?"""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    held = ids.table  # within the dedup horizon
    if not comp.exactly_once or held.num_rows == 0 or not inp.n:
        return None
    if maybe is not None and int(maybe.sum()) * 8 < held.num_rows:
        # the candidates' ids and keys taken from the columns: no Python list of the batch's ids
        at = pa.array(np.flatnonzero(maybe))
        cand_ids = inp.table.column("record_id").take(at).combine_chunks()
        hit = pc.is_in(held.column("record_id"), value_set=cand_ids)
        if not pc.any(hit).as_py():
            return None
        hits = held.filter(hit)
        pairs = set(zip(py_list(hits.column("key")), py_list(hits.column("record_id")), strict=True))
        seen = [False] * inp.n
        for i, k, r in zip(at.to_pylist(), py_list(inp.table.column("key").take(at)), py_list(cand_ids), strict=True):
            if (k, r) in pairs:
                seen[i] = True
        return seen if any(seen) else None
    # ids alone first (no replays: the usual case), then (key, id) pairs
    if not pc.any(pc.is_in(inp.table.column("record_id"), value_set=held.column("record_id"))).as_py():
        return None
    hit = pair_hits(inp.table, held)
    return py_list(hit) if pc.any(hit).as_py() else None


def pair_hits(recs: Any, held: Any) -> Any:
    """Per row of ``recs``: whether ``held`` holds its (key, record id) pair."""
    import pyarrow.compute as pc

    pairs = pc.binary_join_element_wise(recs.column("key"), recs.column("record_id"), "\x00")
    return pc.is_in(pairs, value_set=pc.binary_join_element_wise(held.column("key"), held.column("record_id"), "\x00"))


def with_ids(rows: Any, old: HeldIds, schema: Any) -> Any:
    """``rows`` plus the record_ids column: the old ids they held, within the dedup horizon."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    field = schema.field("record_ids")
    ids = old.table
    pos = pc.index_in(ids.column("key"), value_set=rows.column("key"))
    ids = ids.append_column("pos", pos).append_column("seq", pa.array(np.arange(ids.num_rows), pa.int64()))
    ids = ids.filter(pc.is_valid(pos))
    ids = ids.take(pc.sort_indices(ids, sort_keys=[("pos", "ascending"), ("seq", "ascending")]))
    offsets = _offsets(ids.column("pos").to_numpy(), rows.num_rows)
    values = pa.StructArray.from_arrays([ids.column("record_id").combine_chunks(),
                                         ids.column("seen_ms").combine_chunks()], fields=list(field.type.value_type))
    col = pa.ListArray.from_arrays(offsets, values, type=field.type)
    out = rows.add_column(schema.get_field_index("record_ids"), field, col)
    return out.select(schema.names).cast(schema)


def trim_ids(t: Any, horizon_ms: int | None) -> Any:
    """``t`` with the record ids seen before ``horizon_ms`` dropped (``t`` itself if none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if horizon_ms is None or t.num_rows == 0:
        return t
    idx = t.schema.get_field_index("record_ids")
    field = t.schema.field(idx)
    lst = t.column(idx).combine_chunks()
    flat = pc.list_flatten(lst)
    if len(flat) == 0:
        return t
    keep = pc.greater_equal(flat.field("seen_ms"), horizon_ms)
    if pc.all(keep).as_py():
        return t
    parents = pc.list_parent_indices(lst).filter(keep).to_numpy()
    col = pa.ListArray.from_arrays(_offsets(parents, t.num_rows), flat.filter(keep), type=field.type,
                                   mask=lst.is_null() if lst.null_count else None)
    return t.set_column(idx, field, col)


def _offsets(parents: Any, n: int) -> Any:
    """List offsets for ``n`` lists from the (ascending) list index of each value (numpy ints)."""
    import numpy as np
    import pyarrow as pa

    counts = np.bincount(parents, minlength=n) if len(parents) else np.zeros(n, dtype=np.int64)
    return pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32), pa.int32())


def expired_ids(image: Any, horizon_ms: int | None) -> int:
    """How many record ids of ``image`` were seen before ``horizon_ms`` (they leave it)."""
    import pyarrow.compute as pc

    if horizon_ms is None or image.num_rows == 0:
        return 0
    seen = pc.struct_field(pc.list_flatten(image.column("record_ids")), "seen_ms")
    return int(pc.sum(pc.less(seen, horizon_ms)).as_py() or 0)


def drop_empty(t: Any) -> Any:
    """``t`` without the rows that hold nothing any more."""
    import pyarrow.compute as pc

    if t.num_rows == 0:
        return t
    empty = pc.and_kleene(pc.is_null(t.column("state")), pc.is_null(t.column("watermark_hold_ms")))
    for col in ("timers", "pending", "record_ids"):
        empty = pc.and_kleene(empty, pc.equal(pc.fill_null(pc.list_value_length(t.column(col)), 0), 0))
    empty = pc.and_kleene(empty, pc.not_equal(t.column("key"), FENCE_KEY))
    empty = pc.fill_null(empty, False)
    return t.filter(pc.invert(empty)) if pc.any(empty).as_py() else t
