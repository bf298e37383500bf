"""The MERGE path's task function: user code for one key per input row, in ``mapInArrow`` tasks; it
captures only plain values, never the session, the store or ZooKeeper clients."""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import CodecError
from deltawheel.statestore.rowtable.rows import KeyRow, rows_schema_ddl

from ...computation import Computation, LatePolicy, Record
from ..usercode.keyrun import run_key

__all__ = ["task_fn", "OUT_DDL"]

_PROD = "STRUCT<production_id: STRING, stream: STRING, key: STRING, value: BINARY, timestamp_ms: BIGINT, codec: STRING>"
_DEAD = ("STRUCT<record_id: STRING, key: STRING, raw_value: BINARY, error: STRING, position: STRING, "
         "event_time_ms: BIGINT, stream: STRING>")
_ROUTED = "STRUCT<record_id: STRING, key: STRING, value: BINARY, codec: STRING, timestamp_ms: BIGINT, stream: STRING>"
OUT_DDL = (rows_schema_ddl().replace(" NOT NULL", "") + f", _op STRING, new_prods ARRAY<{_PROD}>, dead ARRAY<{_DEAD}>, "
           f"routed ARRAY<{_ROUTED}>, processed INT, duplicates INT, fired INT, late INT, n_prods INT, n_dead INT, "
           "n_routed INT, ids_expired INT, keys_expired INT")


def task_fn(comp: Computation, wm: int | None, now: int, horizon: int | None, arrow_schema: Any,
            sequencers: dict[int, int], commit_id: str, *, wm_late: int | None,
            late_raised: Mapping[int, int] | None = None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function: each key's records and row to its output row (:data:`OUT_DDL`);
    ``late_raised``: intervals whose records are judged against a line above ``wm_late``."""
    raised = dict(late_raised or {})
    name = comp.name

    def fn(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from ..worker import freeze_spark_zips

        freeze_spark_zips()
        for b in batches:
            out = [_one_key(comp, name, r, (wm, raised.get(int(r["interval"]), wm_late)), now, horizon, sequencers,
                            commit_id, raised=int(r["interval"]) in raised)
                   for r in b.to_pylist()]
            yield pa.RecordBatch.from_pylist(out, schema=arrow_schema)

    return fn


def _one_key(comp: Computation, name: str, r: dict[str, Any], wms: tuple[int | None, int | None], now: int,
             horizon: int | None, sequencers: dict[int, int], commit_id: str, *, raised: bool = False) -> dict[str, Any]:
    key, iv = r["key"], int(r["interval"])
    row = None
    cleared = False
    if r.get("sequencer") is not None:
        row = KeyRow.from_row({**r, "computation": name})
        cleared = bool(row.pending)
        row = row.with_(pending=())  # delivered by the previous batch or by recovery
    records: list[Record] = []
    dead: list[dict[str, Any]] = []
    recs = r.get("recs") or ()
    if raised and wms[1] is not None:  # the interval is ahead of the batch's line: judged by its own
        line = wms[1]
        recs = [{**x, "late": bool(x["late"]) or (x["timestamp_ms"] is not None and x["timestamp_ms"] < line)}
                for x in recs]
    routed: list[dict[str, Any]] = []
    if comp.late_policy is LatePolicy.ROUTE and any(x["late"] for x in recs):
        # dedup first: a late retry of a record run on time is a duplicate, not late data
        held = ({s.record_id for s in row.record_ids if horizon is None or s.seen_ms >= horizon}
                if (row is not None and comp.exactly_once) else set())  # as run_key's dedup decides
        kept, ids = [], set()
        for x in recs:
            if x["late"] and x["record_id"] not in held:
                if x["record_id"] not in ids:  # a record twice in the batch: routed once
                    ids.add(x["record_id"])
                    routed.append({c: x[c] for c in ("record_id", "value", "codec", "timestamp_ms", "stream")}
                                  | {"key": key})
            else:
                kept.append(x)
        recs = kept
    for x in recs:
        try:
            value = None if x["value"] is None else get_codec(x["codec"]).decode(x["value"])
        except CodecError as exc:
            dead.append(_dead(x, key, f"CodecError: {exc}"))
            continue
        records.append(Record(key=key, value=value, timestamp_ms=int(x["timestamp_ms"]), record_id=x["record_id"],
                              stream=x["stream"] or "", late=bool(x["late"])))
    o = run_key(comp, key=key, interval=iv, row=row, records=records, input_watermark_ms=wms[0],
                record_watermark_ms=wms[1], now_ms=now, dedup_horizon_ms=horizon)
    by_id = {x["record_id"]: x for x in recs}
    dead += [_dead(by_id[rec.record_id], key, err) for rec, err in o.dead_letters]
    if o.row is None:
        op = "delete" if row is not None else "none"
        img = KeyRow(computation=name, key=key, interval=iv).to_row()
    else:
        op = "upsert" if (o.changed or cleared or row is None) else "none"
        img = o.row.with_(computation=name, interval=iv).to_row()
    img.update(sequencer=sequencers[iv], commit_id=commit_id, updated_ms=now, _op=op,
               new_prods=[p.to_row() for p in o.productions], dead=dead, routed=routed, processed=o.processed,
               duplicates=o.duplicates, fired=o.timers_fired, late=o.late, n_prods=len(o.productions),
               n_dead=len(dead), n_routed=len(routed), ids_expired=o.ids_expired,
               keys_expired=o.keys_expired)
    return img


def _dead(x: dict[str, Any], key: str, error: str) -> dict[str, Any]:
    return {"record_id": x["record_id"], "key": key, "raw_value": x["value"], "error": error,
            "position": x.get("position"), "event_time_ms": x.get("timestamp_ms"), "stream": x.get("stream")}
