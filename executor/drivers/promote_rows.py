"""The rows a promotion commits: the shadow store's, skipping keys equal to the live row. Record ids
are not content: the live row's are kept; a key only the replay has gets its own."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from deltawheel.statestore.delta.log import local_table_exists
from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX, KeyRow, is_user_key

__all__ = ["shadow_rows", "promoted_rows"]

#: the fields a promotion compares (record ids and pending productions apart: see the module docstring)
_COMPARED = ("state", "codec", "timers", "watermark_hold_ms", "timer_seq")


def shadow_rows(spark: Any, into: StoreLayout, computation: str, *,
                intervals: Sequence[int] | None = None) -> list[KeyRow]:
    """The shadow store's rows of ``intervals`` (None: all), with only its undelivered productions."""
    from pyspark.sql import functions as F

    cond = (F.col("computation") == computation) & (F.col("key") != FENCE_KEY)
    if intervals is not None:
        cond = cond & F.col("interval").isin(sorted(set(intervals)))
    rows = [KeyRow.from_row(r) for r in spark.read.format("delta").load(into.rows_of(computation)).where(cond).toArrow().to_pylist()]
    held: dict[str, set[str]] = {}
    for r in rows:
        for p in r.pending:
            held.setdefault(p.stream, set()).add(p.production_id)
    delivered: set[tuple[str, str]] = set()
    for stream, ids in held.items():
        if local_table_exists(table_files(spark, into.stream(stream)) or into.stream(stream)):
            got = spark.read.format("delta").load(into.stream(stream)).where(F.col("record_id").isin(sorted(ids)))
            delivered |= {(stream, str(r[0])) for r in got.select("record_id").collect()}
    return [r.with_(pending=tuple(p for p in r.pending if (p.stream, p.production_id) not in delivered))
            if r.pending else r for r in rows]


def promoted_rows(shadow: Sequence[KeyRow], live: Mapping[str, KeyRow]) -> list[KeyRow]:
    """The rows a promotion leaves: the live row where equal, else the replayed row with live ids."""
    ids: dict[str, list[Any]] = {}
    for r in shadow:
        if r.key.startswith(IDS_KEY_PREFIX) and r.record_ids:
            ids.setdefault(r.key[len(IDS_KEY_PREFIX):], []).extend(r.record_ids)
    out = []
    for r in shadow:
        if not is_user_key(r.key):
            continue
        now = live.get(r.key)
        if now is None:
            out.append(r.with_(record_ids=(*r.record_ids, *ids.get(r.key, ()))))
        elif (all(getattr(r, f) == getattr(now, f) for f in _COMPARED)
              and (not r.pending or r.pending == now.pending)):  # it changes nothing of the live row
            out.append(now)
        else:
            out.append(r.with_(record_ids=now.record_ids))
    return out
