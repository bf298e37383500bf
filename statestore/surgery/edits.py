"""What a repair statement does to each key (:class:`Edits`), the pieces the repair modules share, and
the repairs of timers and checkpointed productions (docs/operations.md, "Repair")."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..codecs import get_codec
from ..exceptions import BadRecordError, CodecError, RepairStatementError
from ..rowtable.rows import DOMAINS, KeyRow, Timer, interval_of, validate_key
from ..sqltext import sql_str

__all__ = ["Edit", "Edits", "encode_state", "set_state", "new_key_row", "check_new_key", "run_sql",
           "check_computation", "RESERVED_TAG_PREFIX", "timer_edits", "pending_edits"]

#: a key's row now (None: no row) -> its row after (None: no row)
Edit = Callable[[KeyRow | None], KeyRow | None]
#: timers whose tag starts with NUL are the framework's (the state TTL's ``\x00ttl``)
RESERVED_TAG_PREFIX = "\x00"


@dataclass(frozen=True)
class Edits:
    """``by_key``: key -> (its interval, its edit); ``skip_delivery``: checkpointed productions dropped."""

    by_key: Mapping[str, tuple[int, Edit]]
    skip_delivery: frozenset[str] = field(default_factory=frozenset)

    @property
    def intervals(self) -> list[int]:
        """The intervals touched, sorted."""
        return sorted({iv for iv, _ in self.by_key.values()})

    def apply(self, rows: tuple[KeyRow, ...]) -> list[KeyRow]:
        """``rows`` (one interval set's rows now) with the edits applied, new keys added."""
        out: list[KeyRow] = []
        seen = set()
        for r in rows:
            seen.add(r.key)
            e = self.by_key.get(r.key)
            after = r if e is None else e[1](r)
            if after is not None:
                out.append(after)
        for k, (_, edit) in sorted(self.by_key.items()):
            if k not in seen and (after := edit(None)) is not None:
                out.append(after)
        return out


def set_state(key: str, text: str | None, *, delete: bool) -> Edit:
    """The edit that sets ``key``'s state to ``text`` (JSON) in its row's codec, or deletes the row."""
    def edit(row: KeyRow | None) -> KeyRow | None:
        return None if row is None or delete else row.with_(state=encode_state(key, text, row.codec))
    return edit


def encode_state(key: str, text: str | None, codec: str) -> bytes | None:
    """The bytes of the new state ``text`` (JSON; None: no state) of ``key`` in ``codec``.
    RepairStatementError: not JSON; a pickled codec; a value the codec cannot encode or round-trip."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise RepairStatementError(f"the new state of key {key!r} is not JSON ({text[:80]!r}): the expression "
                                   "must give JSON text") from exc
    if codec.split("@")[0] == "pickle":
        raise RepairStatementError(f"key {key!r} holds pickled state: a repair cannot re-encode it from JSON "
                                   "(pickle is Python's own); change it with the computation's code")
    try:
        c = get_codec(codec)
        data = c.encode(value)
        back = c.decode(data)
    except CodecError as exc:
        raise RepairStatementError(f"the new state of key {key!r} cannot be encoded with its codec "
                                   f"{codec!r}: {exc}") from exc
    if back != value:
        raise RepairStatementError(f"the new state of key {key!r} would not decode as given with codec "
                                   f"{codec!r} ({json.dumps(value)[:80]} -> {back!r:.80}); refused")
    return data


def new_key_row(computation: str, key: str, *, num_intervals: int, state: bytes | None, codec: str) -> KeyRow:
    """A key a repair inserts; timer numbers start at a fresh 40-bit range (no production id repeats)."""
    seq = int.from_bytes(uuid.uuid4().bytes[:5], "big") << 23
    return KeyRow(computation=computation, key=key, interval=interval_of(key, num_intervals), state=state,
                  codec=codec, timer_seq=seq)


def check_new_key(key: Any) -> str:
    """``key`` if a repair may insert it; RepairStatementError: NULL, empty, starting with NUL, too long."""
    if key is None:
        raise RepairStatementError("the statement inserts a NULL key: every inserted row needs a key")
    try:
        return validate_key(key)
    except BadRecordError as exc:
        raise RepairStatementError(f"the statement inserts key {key!r}, which is not a usable key: {exc}") from exc


def check_computation(text: str, computation: str) -> None:
    """Refuse (RepairStatementError) a statement whose text names another computation's rows."""
    others = sorted({c for c in re.findall(r"computation\s*(?:=|==)\s*'([^']*)'", text, re.IGNORECASE)
                     if c != computation})
    if others:
        raise RepairStatementError(f"the statement names rows of computation {', '.join(map(repr, others))}, and "
                                   f"this repair is of {computation!r} (--computation): a repair changes one "
                                   "computation's rows")


def run_sql(spark: Any, query: str, *, what: str) -> list[Any]:
    """``spark.sql(query).collect()``, the user's SQL errors as :class:`RepairStatementError`."""
    try:
        return list(spark.sql(query).collect())
    except Exception as exc:
        if type(exc).__name__ not in ("AnalysisException", "ParseException", "IllegalArgumentException",
                                      "PythonException", "SparkRuntimeException", "NumberFormatException"):
            raise
        raise RepairStatementError(f"the statement is not valid on {what}: "
                                   f"{str(exc).strip().splitlines()[0][:300]}") from exc


def timer_edits(spark: Any, *, computation: str, where: str | None, time_expr: str | None) -> Edits:
    """Delete (``time_expr`` None) or move the timers of ``computation`` the condition selects.
    RepairStatementError: invalid SQL; a reserved (TTL) timer selected; a NULL or fractional new time."""
    view = ("(SELECT computation, `interval`, key, t.tag, t.domain, timestamp_millis(t.time_ms) AS "
            "fire_time, t.time_ms FROM rows LATERAL VIEW explode(timers) tt AS t WHERE computation = "
            f"{sql_str(computation)}) AS timers")
    new = "CAST(NULL AS BIGINT)" if time_expr is None else f"CAST(({time_expr}) AS BIGINT)"
    rows = run_sql(spark, f"SELECT key, `interval` AS iv, tag, domain, time_ms, {new} AS new_ms "
                          f"FROM {view} WHERE ({where or 'true'})", what="the timers view")
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
    """Drop the checkpointed productions of ``computation`` the condition selects."""
    view = ("(SELECT computation, `interval`, key, p.production_id, p.stream, p.key AS out_key, "
            "dw_decode(p.codec, p.value) AS value_json, timestamp_millis(p.timestamp_ms) AS `timestamp` "
            f"FROM rows LATERAL VIEW explode(pending) pp AS p WHERE computation = {sql_str(computation)}) "
            "AS pending_productions")
    rows = run_sql(spark, f"SELECT key, `interval` AS iv, production_id FROM {view} "
                          f"WHERE ({where or 'true'})", what="the pending_productions view")
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
