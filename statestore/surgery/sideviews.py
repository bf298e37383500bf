"""Repairs of a key's timers and checkpointed productions (docs/operations.md, "Repair").

The state TTL's timer (tag ``\\x00ttl``) is refused: change ``state_ttl`` instead."""

from __future__ import annotations

from typing import Any

from ..exceptions import RepairStatementError
from ..rowtable.rows import DOMAINS, KeyRow, Timer
from ..sqltext import sql_str
from .edits import Edit, Edits, run_sql

__all__ = ["RESERVED_TAG_PREFIX", "timer_edits", "pending_edits"]

#: timers whose tag starts with NUL are the framework's (the state TTL's ``\x00ttl``)
RESERVED_TAG_PREFIX = "\x00"


def _timers_of(computation: str) -> str:
    return ("(SELECT computation, `interval`, key, t.tag, t.domain, timestamp_millis(t.time_ms) AS fire_time, "
            f"t.time_ms FROM rows LATERAL VIEW explode(timers) tt AS t WHERE computation = {sql_str(computation)}) "
            "AS timers")


def timer_edits(spark: Any, *, computation: str, where: str | None, time_expr: str | None) -> Edits:
    """Delete (``time_expr`` None) or move the timers of ``computation`` the condition selects.

    Raises:
        RepairStatementError: invalid SQL; a reserved (TTL) timer selected; a NULL or fractional new time.
    """
    new = "CAST(NULL AS BIGINT)" if time_expr is None else f"CAST(({time_expr}) AS BIGINT)"
    rows = run_sql(spark, f"SELECT key, `interval` AS iv, tag, domain, time_ms, {new} AS new_ms "
                          f"FROM {_timers_of(computation)} WHERE ({where or 'true'})", what="the timers view")
    changes: dict[str, dict[tuple[str, str], int | None]] = {}
    ivs: dict[str, int] = {}
    for r in rows:
        if str(r["tag"]).startswith(RESERVED_TAG_PREFIX):
            raise RepairStatementError(f"the statement selects the state TTL timer of key {r['key']!r} (tag "
                                       f"{r['tag']!r}), which is the framework's: change the computation's "
                                       "state_ttl, or DELETE FROM state WHERE key = ... to drop the key")
        if time_expr is not None and r["new_ms"] is None:
            raise RepairStatementError(f"the new time of timer {r['tag']!r} of key {r['key']!r} is NULL: SET "
                                       "time_ms = <epoch milliseconds> (to drop it, DELETE FROM timers)")
        changes.setdefault(str(r["key"]), {})[(str(r["tag"]), str(r["domain"]))] = (
            None if time_expr is None else int(r["new_ms"]))
        ivs[str(r["key"])] = int(r["iv"])
    return Edits({k: (ivs[k], _retime(ch)) for k, ch in changes.items()})


def _retime(changes: dict[tuple[str, str], int | None]) -> Edit:
    def edit(row: KeyRow | None) -> KeyRow | None:
        if row is None:
            return None
        timers = []
        for t in row.timers:
            which = (t.tag, t.domain.value)
            if which not in changes:
                timers.append(t)
            elif (ms := changes[which]) is not None:
                timers.append(Timer(ms, t.tag, DOMAINS[t.domain.value]))
        return row.with_(timers=tuple(timers))
    return edit


def pending_edits(spark: Any, *, computation: str, where: str | None) -> Edits:
    """Drop the checkpointed productions of ``computation`` the condition selects.

    Raises:
        RepairStatementError: invalid SQL.
    """
    view = ("(SELECT computation, `interval`, key, p.production_id, p.stream, p.key AS out_key, "
            "dw_decode(p.codec, p.value) AS value_json, timestamp_millis(p.timestamp_ms) AS `timestamp` "
            f"FROM rows LATERAL VIEW explode(pending) pp AS p WHERE computation = {sql_str(computation)}) "
            "AS pending_productions")
    rows = run_sql(spark, f"SELECT key, `interval` AS iv, production_id FROM {view} WHERE ({where or 'true'})",
                   what="the pending_productions view")
    drop: dict[str, set[str]] = {}
    ivs: dict[str, int] = {}
    for r in rows:
        drop.setdefault(str(r["key"]), set()).add(str(r["production_id"]))
        ivs[str(r["key"])] = int(r["iv"])
    ids = frozenset(i for s in drop.values() for i in s)
    return Edits({k: (ivs[k], _drop(d)) for k, d in drop.items()}, skip_delivery=ids)


def _drop(ids: set[str]) -> Edit:
    def edit(row: KeyRow | None) -> KeyRow | None:
        if row is None:
            return None
        return row.with_(pending=tuple(p for p in row.pending if p.production_id not in ids))
    return edit
