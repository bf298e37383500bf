"""Repair: a statement on a decoded view applied to the live rows in one fenced commit under the leases
it touches; evaluated once to find the leases (every refusal first), then under them."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..codecs import base_name, get_codec
from ..exceptions import CodecError, ConfigError, RepairStatementError
from ..inspection.views import StoreViews, named_views
from ..layout import StoreLayout
from ..rowtable.rows import KeyRow
from ..sqltext import sql_str
from ..zk.lease_tools import list_leases
from .edits import Edits, check_computation, pending_edits, run_sql, set_state, timer_edits
from .merge import MergeStatement, merge_edits, parse_merge
from .replace import Held, Surgery, SurgeryResult, plan_replacement, replace_intervals

__all__ = ["RepairStatement", "parse_repair", "plan_repair", "repair", "pipeline_intervals"]

_FLAGS = re.IGNORECASE | re.DOTALL
_UPDATE = re.compile(r"^\s*UPDATE\s+(?P<view>[`\w.]+)\s+SET\s+(?P<set>.+?)(?:\s+WHERE\s+(?P<where>.+?))?\s*;?\s*$", _FLAGS)
_DELETE = re.compile(r"^\s*DELETE\s+FROM\s+(?P<view>[`\w.]+)(?:\s+WHERE\s+(?P<where>.+?))?\s*;?\s*$", _FLAGS)
_ASSIGN = re.compile(r"^\s*`?(?P<col>\w+)`?\s*=\s*(?P<expr>.+?)\s*$", _FLAGS)
_NOT_REPAIRABLE = {"rows": "the raw rows (repair the decoded state, timers or pending_productions views)",
                   "fences": "the fence rows (the framework's: they hold the owners' sequencers)"}
_ACCEPTED = ("UPDATE state SET state_json = <expr> [WHERE ...], DELETE FROM state [WHERE ...], MERGE INTO state "
             "USING <source> ..., DELETE FROM timers [WHERE ...], UPDATE timers SET time_ms = <expr> [WHERE ...] "
             "or DELETE FROM pending_productions [WHERE ...]")


@dataclass(frozen=True, kw_only=True)
class RepairStatement:
    """A parsed repair: ``kind`` update, delete or merge; ``expr``: the SET; ``where`` None: every row."""

    text: str
    view: str
    kind: str
    expr: str | None
    where: str | None
    merge: MergeStatement | None = None


def parse_repair(text: str) -> RepairStatement:
    """Parse a repair statement; RepairStatementError on anything else, naming what is accepted."""
    if (text.strip().split() or [""])[0].upper() == "MERGE":
        return RepairStatement(text=text, view="state", kind="merge", expr=None, where=None,
                               merge=parse_merge(text))
    upd, dele = _UPDATE.match(text), _DELETE.match(text)
    m = upd or dele
    if m is None:
        raise RepairStatementError(f"not a repair statement: {text.strip()[:80]!r}. Give {_ACCEPTED}")
    view = m.group("view").strip("`").lower()
    if view not in ("state", "timers", "pending_productions"):
        raise RepairStatementError(f"a repair changes the state, timers or pending_productions view, not {view!r}"
                                   + (f": {_NOT_REPAIRABLE[view]}" if view in _NOT_REPAIRABLE else ""))
    where = m.group("where")
    if dele is not None:
        return RepairStatement(text=text, view=view, kind="delete", expr=None, where=where)
    if view == "pending_productions":
        raise RepairStatementError("a checkpointed production cannot be changed, only dropped: DELETE FROM "
                                   "pending_productions WHERE ...")
    col = "state_json" if view == "state" else "time_ms"
    a = _ASSIGN.match(m.group("set"))
    if a is None or a.group("col").lower() != col:
        raise RepairStatementError(f"UPDATE {view} SET {m.group('set')[:60]!r}: only {col} can be set"
                                   + (" (the new state as JSON text, e.g. SET state_json = '{\"n\": 0}'); the other "
                                      "columns are the framework's" if view == "state" else
                                      " (the timer's new time, epoch milliseconds); to drop it, DELETE FROM timers"))
    return RepairStatement(text=text, view=view, kind="update", expr=a.group("expr"), where=where)


def _state_edits(spark: Any, stmt: RepairStatement, computation: str) -> Edits:
    """UPDATE / DELETE of the state view: the keys it selects, with their new state text."""
    cond = stmt.where or "true"
    named = {r[0] for r in run_sql(spark, f"SELECT DISTINCT computation FROM state WHERE ({cond})",
                                   what="the state view")}
    if "computation" in cond.lower() and named - {computation}:
        raise RepairStatementError(
            f"the statement selects rows of computation {', '.join(sorted(map(repr, named - {computation})))}, "
            f"and this repair is of {computation!r} (--computation): a repair changes one computation's rows")
    expr = stmt.expr if stmt.kind == "update" else "CAST(NULL AS STRING)"
    rows = run_sql(spark, f"SELECT key, `interval`, CAST(({expr}) AS STRING) AS new_state FROM state "
                          f"WHERE computation = {sql_str(computation)} AND ({cond})", what="the state view")
    return Edits({str(r["key"]): (int(r["interval"]), set_state(str(r["key"]), r["new_state"],
                                                                 delete=stmt.kind == "delete")) for r in rows})


_ROW_LOCAL = re.compile(r"\b(select|computation)\b", re.IGNORECASE)
#: above this many rows the computation's rows are not copied into the session: Spark reads the table
_LOCAL_ROWS_MAX = 50_000


def _held_views(spark: Any, layout: StoreLayout, stmt: RepairStatement, *, computation: str,
                num_intervals: int) -> StoreViews:
    """The views under the leases: the rows read in Python if the statement reads only those, else Spark's."""
    from ..delta.storefs import table_files
    from ..rowtable.filescan import interval_rows
    from ..rowtable.frames import local_frame
    from ..rowtable.rows import rows_schema_ddl

    files = None if _ROW_LOCAL.search(stmt.text) else table_files(spark, layout.rows_of(computation))
    rows = None if files is None else interval_rows(files, computation, range(num_intervals))
    if rows is None or len(rows) > _LOCAL_ROWS_MAX:
        return StoreViews(spark, layout)
    local_frame(spark, [r.to_row() for r in rows], rows_schema_ddl()).createOrReplaceTempView("_dw_repair_rows")
    return StoreViews(spark, layout, rows_source="`_dw_repair_rows`")


def _codec_of(spark: Any, computation: str, given: str | None) -> Callable[[], str]:
    """The codec of a key a MERGE inserts: ``given``, else the newest state version's most common."""
    def codec() -> str:
        if given is not None:
            if base_name(given) == "pickle":
                raise RepairStatementError("--codec pickle: a repair cannot encode pickled state from JSON; "
                                           "give json or msgpack (with @<state_version> for a version above 1)")
            try:
                get_codec(given)
            except CodecError as exc:
                raise RepairStatementError(f"--codec {given!r}: {exc}") from exc
            return given
        seen = Counter(str(r[0]) for r in run_sql(
            spark, f"SELECT codec FROM state WHERE computation = {sql_str(computation)}", what="the state view"))
        if not seen:
            raise RepairStatementError(
                f"computation {computation!r} has no rows yet, so the codec (and state version) of the keys the "
                "MERGE inserts is not known: give --codec NAME[@VERSION] (the computation's codec, e.g. json, "
                "msgpack@2 for state_version 2)")
        from ..codecs import codec_version

        return max(seen, key=lambda c: (codec_version(c), seen[c], c))
    return codec


def _edits(spark: Any, views: StoreViews, stmt: RepairStatement, *, computation: str, num_intervals: int,
           codec: str | None) -> Edits:
    """What ``stmt`` does to each key, evaluated over ``views`` (the rows now)."""
    views.ensure(["rows", "state", "timers", "pending_productions", *named_views(stmt.text, views.candidates())])
    check_computation(stmt.text, computation)
    if stmt.merge is not None:
        return merge_edits(spark, stmt.merge, computation=computation, num_intervals=num_intervals,
                           codec=_codec_of(spark, computation, codec))
    if stmt.view == "timers":
        return timer_edits(spark, computation=computation, where=stmt.where, time_expr=stmt.expr)
    if stmt.view == "pending_productions":
        return pending_edits(spark, computation=computation, where=stmt.where)
    return _state_edits(spark, stmt, computation)


def pipeline_intervals(client: Any, *, pipeline: str, computation: str) -> int:
    """The number of intervals of ``computation`` in ``pipeline``'s ZooKeeper (ConfigError: none there)."""
    ivs = [int(r["interval"]) for r in list_leases(client, pipeline=pipeline) if r["computation"] == computation]
    if not ivs:
        raise ConfigError(f"pipeline {pipeline!r} has no computation {computation!r} in ZooKeeper (no lease znodes): "
                          "check --pipeline, --computation and the ZooKeeper address / chroot the pipeline ran with")
    return max(ivs) + 1


def plan_repair(spark: Any, layout: StoreLayout, client: Any, *, pipeline: str, computation: str, statement: str,
                codec: str | None = None) -> SurgeryResult:
    """What :func:`repair` would change against the rows now (raising as it does); nothing written."""
    stmt = parse_repair(statement)
    n = pipeline_intervals(client, pipeline=pipeline, computation=computation)
    edits = _edits(spark, StoreViews(spark, layout), stmt, computation=computation, num_intervals=n, codec=codec)
    return plan_replacement(spark, layout, computation=computation, num_intervals=n, intervals=edits.intervals,
                            build=lambda held: edits.apply(held.rows))


def repair(spark: Any, layout: StoreLayout, client: Any, *, pipeline: str, computation: str, statement: str,
           wait_s: float = 0.0, no_wait: bool = False, codec: str | None = None,
           progress: Callable[[str], None] | None = None,
           before_commit: Callable[[Mapping[int, int]], None] | None = None) -> SurgeryResult:
    """Apply ``statement`` to ``computation``'s live rows in one fenced, audited commit (``replace.py``);
    matching no key, it takes no lease. ``codec``: of keys a MERGE inserts (default: the rows').

    Raises:
        RepairStatementError: as :func:`parse_repair` and the edits; or, under the leases, keys in
            intervals not taken (run it again). Nothing changed.
        ConfigError: the pipeline has no such computation in ZooKeeper.
        LeaseHeldError, StaleSequencerError, LeaseLostError: as ``replace_intervals``.
    """
    stmt = parse_repair(statement)
    n = pipeline_intervals(client, pipeline=pipeline, computation=computation)
    first = _edits(spark, StoreViews(spark, layout), stmt, computation=computation, num_intervals=n, codec=codec)
    if not first.by_key:
        return SurgeryResult(computation=computation, intervals=(), sequencers={}, upserted=(), deleted=(),
                             before={}, version=None, audit_id=None, planned=False)

    def build(held: Held) -> list[KeyRow]:
        # the leases are held: the rows of those intervals cannot move
        views = _held_views(spark, layout, stmt, computation=computation, num_intervals=n)
        now = _edits(spark, views, stmt, computation=computation, num_intervals=n, codec=codec)
        outside = sorted(k for k, (iv, _) in now.by_key.items() if iv not in held.intervals)
        if outside:
            raise RepairStatementError(f"the statement now also matches keys {outside[:5]} in intervals not taken "
                                       "(the state changed meanwhile); nothing was changed: run it again")
        return now.apply(held.rows)

    return replace_intervals(spark, layout, client, pipeline=pipeline, computation=computation, num_intervals=n,
                             intervals=first.intervals, build=build, wait_s=wait_s, no_wait=no_wait,
                             progress=progress, before_commit=before_commit, surgery=Surgery("repair", statement),
                             skip_delivery=first.skip_delivery)
