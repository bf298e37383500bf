"""Repair: an ``UPDATE`` or ``DELETE`` of the decoded ``state`` view, applied to the live rows in one
fenced commit under the leases of the intervals it touches (``deltawheel repair``).

- ``UPDATE state SET state_json = <expr> [WHERE <cond>]``: ``<expr>`` is Spark SQL over the view's
  columns giving the new state as JSON text (NULL: no state); it is re-encoded with each key's own
  codec (``json``, ``msgpack``; a pickled state, or a value the codec would not give back as it
  is, is refused);
- ``DELETE FROM state [WHERE <cond>]``: the keys are removed with their timers, ids and pending
  productions.

The statement is evaluated twice: once to find the intervals it touches (whose leases are taken),
and again under those leases, over the rows as they are then (``replace.py``). Timers and pending
productions are not edited by themselves yet: a ``DELETE`` removes a key with all of them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..codecs import get_codec
from ..exceptions import CodecError, ConfigError, RepairStatementError
from ..inspection.sqlviews import register_views
from ..layout import StoreLayout
from ..rowtable.rows import KeyRow
from ..sqltext import sql_str
from ..zk.lease_tools import list_leases
from .replace import Held, Surgery, SurgeryResult, plan_replacement, replace_intervals

__all__ = ["RepairStatement", "parse_repair", "plan_repair", "repair"]

_FLAGS = re.IGNORECASE | re.DOTALL
_UPDATE = re.compile(r"^\s*UPDATE\s+(?P<view>[`\w.]+)\s+SET\s+(?P<set>.+?)(?:\s+WHERE\s+(?P<where>.+?))?\s*;?\s*$", _FLAGS)
_DELETE = re.compile(r"^\s*DELETE\s+FROM\s+(?P<view>[`\w.]+)(?:\s+WHERE\s+(?P<where>.+?))?\s*;?\s*$", _FLAGS)
_ASSIGN = re.compile(r"^\s*`?(?P<col>\w+)`?\s*=\s*(?P<expr>.+?)\s*$", _FLAGS)
_NAMED = re.compile(r"computation\s*(?:=|==)\s*'([^']*)'", re.IGNORECASE)
_OTHER_VIEWS = {"timers": "timers", "pending_productions": "pending productions", "rows": "raw rows",
                "fences": "fence rows"}


@dataclass(frozen=True)
class RepairStatement:
    """A parsed repair: ``kind`` ``update`` (with ``state_expr``) or ``delete``; ``where`` None: every key."""

    text: str
    kind: str
    state_expr: str | None
    where: str | None


def parse_repair(text: str) -> RepairStatement:
    """Parse an ``UPDATE`` or ``DELETE`` of the ``state`` view (see the module docstring).

    Raises:
        RepairStatementError: anything else, with what is accepted.
    """
    upd, dele = _UPDATE.match(text), _DELETE.match(text)
    m = upd or dele
    if m is None:
        first = (text.strip().split() or [""])[0].upper()
        if first == "MERGE":
            raise RepairStatementError("MERGE into the state view is not supported yet: bootstrap keys with "
                                       "UPDATE ... WHERE key = ... once they exist, or run the pipeline over them")
        raise RepairStatementError(f"not a repair statement: {text.strip()[:80]!r}. Give UPDATE state SET state_json "
                                   "= <expr> [WHERE <cond>] or DELETE FROM state [WHERE <cond>]")
    view = m.group("view").strip("`").lower()
    if view != "state":
        what = _OTHER_VIEWS.get(view)
        raise RepairStatementError(
            f"a repair changes the state view, not {view!r}" + (
                f": {what} cannot be repaired by themselves yet (DELETE FROM state WHERE key = ... removes a key "
                "with its timers and pending productions)" if what else ": write UPDATE state ... or DELETE FROM "
                "state ..."))
    where = m.group("where")
    if dele is not None:
        return RepairStatement(text, "delete", None, where)
    a = _ASSIGN.match(m.group("set"))
    if a is None or a.group("col").lower() != "state_json":
        raise RepairStatementError(f"UPDATE state SET {m.group('set')[:60]!r}: only state_json can be set (the new "
                                   "state as JSON text, e.g. SET state_json = '{\"n\": 0}'); the other columns are "
                                   "the framework's")
    return RepairStatement(text, "update", a.group("expr"), where)


def _matches(spark: Any, layout: StoreLayout, stmt: RepairStatement, computation: str) -> dict[str, tuple[int, str | None]]:
    """key -> (interval, its new state as JSON text; None for a delete or a NULL state), read now.

    Raises:
        RepairStatementError: the statement names another computation's rows, or is not valid SQL
            on the view.
    """
    register_views(spark, layout)
    cond = stmt.where or "true"
    others = sorted({c for c in _NAMED.findall(cond) if c != computation})
    if others:
        raise RepairStatementError(f"the statement names rows of computation {', '.join(map(repr, others))}, and "
                                   f"this repair is of {computation!r} (--computation): a repair changes one "
                                   "computation's rows")
    try:
        named = {r[0] for r in spark.sql(f"SELECT DISTINCT computation FROM state WHERE ({cond})").collect()}
        if "computation" in cond.lower() and named - {computation}:
            raise RepairStatementError(
                f"the statement selects rows of computation {', '.join(sorted(map(repr, named - {computation})))}, "
                f"and this repair is of {computation!r} (--computation): a repair changes one computation's rows")
        expr = stmt.state_expr if stmt.kind == "update" else "CAST(NULL AS STRING)"
        rows = spark.sql(f"SELECT key, `interval`, CAST(({expr}) AS STRING) AS new_state FROM state "
                         f"WHERE computation = {sql_str(computation)} AND ({cond})").collect()
    except RepairStatementError:
        raise
    except Exception as exc:  # Spark's AnalysisException / ParseException: the user's SQL
        if type(exc).__name__ not in ("AnalysisException", "ParseException", "IllegalArgumentException"):
            raise
        raise RepairStatementError(f"the statement is not valid on the state view: "
                                   f"{str(exc).strip().splitlines()[0][:300]}") from exc
    return {str(r["key"]): (int(r["interval"]), r["new_state"]) for r in rows}


def _apply(rows: Sequence[KeyRow], stmt: RepairStatement, edits: Mapping[str, tuple[int, str | None]]) -> list[KeyRow]:
    """``rows`` with the statement applied to the keys of ``edits``.

    Raises:
        RepairStatementError: a new state that is not JSON, or that the key's codec cannot encode
            and give back as it is.
    """
    out = []
    for r in rows:
        if r.key not in edits:
            out.append(r)
            continue
        if stmt.kind == "delete":
            continue
        text = edits[r.key][1]
        if text is None:
            out.append(r.with_(state=None))
            continue
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise RepairStatementError(f"the new state of key {r.key!r} is not JSON ({text[:80]!r}): the SET "
                                       "expression must give JSON text") from exc
        if r.codec == "pickle":
            raise RepairStatementError(f"key {r.key!r} holds pickled state: a repair cannot re-encode it from JSON "
                                       "(pickle is Python's own); change it with the computation's code")
        try:
            codec = get_codec(r.codec)
            data = codec.encode(value)
            back = codec.decode(data)
        except CodecError as exc:
            raise RepairStatementError(f"the new state of key {r.key!r} cannot be encoded with its codec "
                                       f"{r.codec!r}: {exc}") from exc
        if back != value:
            raise RepairStatementError(f"the new state of key {r.key!r} would not decode as given with codec "
                                       f"{r.codec!r} ({json.dumps(value)[:80]} -> {back!r:.80}); refused")
        out.append(r.with_(state=data))
    return out


def _num_intervals(client: Any, *, pipeline: str, computation: str) -> int:
    ivs = [int(r["interval"]) for r in list_leases(client, pipeline=pipeline) if r["computation"] == computation]
    if not ivs:
        raise ConfigError(f"pipeline {pipeline!r} has no computation {computation!r} in ZooKeeper (no lease znodes): "
                          "check --pipeline, --computation and the ZooKeeper address / chroot the pipeline ran with")
    return max(ivs) + 1


def plan_repair(spark: Any, layout: StoreLayout, *, computation: str, statement: str) -> SurgeryResult:
    """What :func:`repair` would change (before and after of each key), against the rows now; no
    lease taken, nothing written.

    Raises:
        RepairStatementError: as :func:`repair`.
    """
    stmt = parse_repair(statement)
    edits = _matches(spark, layout, stmt, computation)
    ivs = sorted({iv for iv, _ in edits.values()})
    return plan_replacement(spark, layout, computation=computation, num_intervals=max(ivs, default=0) + 1,
                            intervals=ivs, build=lambda held: _apply(held.rows, stmt, edits))


def repair(spark: Any, layout: StoreLayout, client: Any, *, pipeline: str, computation: str, statement: str,
           wait_s: float = 0.0, no_wait: bool = False, progress: Callable[[str], None] | None = None,
           before_commit: Callable[[Mapping[int, int]], None] | None = None) -> SurgeryResult:
    """Apply ``statement`` to ``computation``'s live rows under the leases of the intervals it
    touches, in one fenced commit, audited (``replace.py``). A statement that matches no key
    changes nothing and takes no lease (``rows_changed`` 0, no audit record).

    Raises:
        RepairStatementError: not an UPDATE/DELETE of the state view, another computation's rows,
            invalid SQL, a state the codec cannot encode; or, under the leases, keys in intervals
            it did not take (the state changed meanwhile: run it again). Nothing changed.
        LeaseHeldError, StaleSequencerError, LeaseLostError: as ``replace_intervals``.
    """
    stmt = parse_repair(statement)
    edits = _matches(spark, layout, stmt, computation)
    if not edits:
        return SurgeryResult(computation, (), {}, (), (), {}, None, None, False)
    n = _num_intervals(client, pipeline=pipeline, computation=computation)
    ivs = sorted({iv for iv, _ in edits.values()})

    def build(held: Held) -> list[KeyRow]:
        now = _matches(spark, layout, stmt, computation)  # the leases are held: the rows cannot move
        outside = sorted(k for k, (iv, _) in now.items() if iv not in held.intervals)
        if outside:
            raise RepairStatementError(f"the statement now also matches keys {outside[:5]} in intervals not taken "
                                       "(the state changed meanwhile); nothing was changed: run it again")
        return _apply(held.rows, stmt, now)

    return replace_intervals(spark, layout, client, pipeline=pipeline, computation=computation, num_intervals=n,
                             intervals=ivs, build=build, wait_s=wait_s, no_wait=no_wait, progress=progress,
                             before_commit=before_commit, surgery=Surgery("repair", statement))
