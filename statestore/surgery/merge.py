"""``MERGE INTO state`` of ``deltawheel repair`` (syntax: docs/operations.md, "Repair"). ``<source>``:
``FORMAT.`path``` (:data:`FORMATS`; csv with a header) or a session table or view (alias ``source``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from ..exceptions import RepairStatementError
from ..rowtable.rows import KeyRow
from ..sqltext import sql_str
from .edits import Edit, Edits, check_new_key, encode_state, new_key_row, run_sql, set_state

__all__ = ["MergeStatement", "parse_merge", "merge_edits"]

_FLAGS = re.IGNORECASE | re.DOTALL
_MERGE = re.compile(
    r"^\s*MERGE\s+INTO\s+(?P<view>[`\w.]+)(?:\s+(?:AS\s+)?(?!USING\b)(?P<talias>\w+))?\s+USING\s+"
    r"(?:(?P<fmt>\w+)\.`(?P<path>[^`]+)`|(?P<name>[\w.]+))(?:\s+(?:AS\s+)?(?!ON\b)(?P<alias>\w+))?\s+"
    r"ON\s+(?P<on>.+?)\s+(?P<whens>WHEN\s+(?:NOT\s+)?MATCHED\b.*?)\s*;?\s*$", _FLAGS)
_WHEN = re.compile(r"\bWHEN\s+(?=(?:NOT\s+)?MATCHED\b)", re.IGNORECASE)
_CLAUSE = re.compile(r"^(?P<which>NOT\s+MATCHED(?:\s+BY\s+(?P<by>TARGET|SOURCE))?|MATCHED)"
                     r"(?:\s+AND\s+(?P<cond>.+?))?\s+THEN\s+(?P<action>.+?)\s*$", _FLAGS)
_SET = re.compile(r"^UPDATE\s+SET\s+`?(?P<col>\w+)`?\s*=\s*(?P<expr>.+)$", _FLAGS)
_INSERT = re.compile(r"^INSERT\s*\((?P<cols>[^)]*)\)\s*VALUES\s*\((?P<vals>.+)\)$", _FLAGS)
FORMATS = ("delta", "parquet", "json", "csv", "orc")
_SOURCE_VIEW = "_dw_merge_source"
_SYNTAX = ("MERGE INTO state USING parquet.`path` AS s ON state.key = s.col WHEN MATCHED THEN UPDATE SET "
           "state_json = <expr> WHEN NOT MATCHED THEN INSERT (key, state_json) VALUES (s.col, <expr>)")


@dataclass(frozen=True, kw_only=True)
class MergeStatement:
    """A parsed MERGE (a clause None: absent; ``matched_expr`` None with ``matched`` set: DELETE)."""

    target: str
    fmt: str | None
    path: str | None
    name: str | None
    alias: str
    on: str
    matched: bool
    matched_cond: str | None
    matched_expr: str | None
    insert_cond: str | None
    insert_key: str | None
    insert_state: str | None


def _split_values(text: str) -> list[str]:
    """``a, f(b, c), 'x,y'`` -> its top-level items."""
    out: list[str] = []
    cur: list[str] = []
    depth, quote = 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return out


def parse_merge(text: str) -> MergeStatement:
    """Parse a MERGE into the state view (see the module docstring).

    Raises:
        RepairStatementError: another target, an unknown source format, no WHEN clause, a clause
            other than UPDATE SET state_json / DELETE / INSERT (key, state_json).
    """
    m = _MERGE.match(text)
    if m is None:
        raise RepairStatementError(f"not a MERGE this tool reads: {text.strip()[:80]!r}. Write {_SYNTAX}")
    view = m.group("view").strip("`").lower()
    if view != "state":
        raise RepairStatementError(f"a MERGE changes the state view, not {view!r}: write MERGE INTO state ...")
    fmt = (m.group("fmt") or "").lower() or None
    if fmt is not None and fmt not in FORMATS:
        raise RepairStatementError(f"MERGE source format {fmt!r} is not one of {', '.join(FORMATS)} "
                                   "(e.g. USING parquet.`/data/seed` AS s)")
    target = m.group("talias") or "state"
    alias = m.group("alias") or "source"
    if not re.search(rf"\b{re.escape(target)}\s*\.\s*`?key`?\s*=|=\s*{re.escape(target)}\s*\.\s*`?key`?\b",
                     m.group("on"), re.IGNORECASE):
        raise RepairStatementError(f"MERGE ON {m.group('on')[:60]!r}: the condition must be the key's equality, "
                                   f"{target}.key = {alias}.<column> (a key matched or inserted, never both)")
    matched = False
    mcond = mexpr = icond = ikey = istate = None
    inserted = False
    for part in [p for p in _WHEN.split(m.group("whens")) if p.strip()]:
        c = _CLAUSE.match(part.strip())
        if c is None:
            raise RepairStatementError(f"MERGE clause WHEN {part.strip()[:60]!r} is not read: write {_SYNTAX}")
        action = c.group("action")
        if c.group("which").upper().startswith("NOT"):
            if (c.group("by") or "TARGET").upper() == "SOURCE":
                raise RepairStatementError("WHEN NOT MATCHED BY SOURCE is not supported: delete keys with "
                                           "DELETE FROM state WHERE key NOT IN (SELECT ...) instead")
            if inserted:
                raise RepairStatementError("a MERGE takes one WHEN NOT MATCHED clause")
            ins = _INSERT.match(action)
            cols = [x.strip().strip("`").lower() for x in ins.group("cols").split(",")] if ins else []
            vals = _split_values(ins.group("vals")) if ins else []
            if ins is None or cols != ["key", "state_json"] or len(vals) != 2:
                raise RepairStatementError(f"WHEN NOT MATCHED THEN {action[:60]!r}: write INSERT (key, state_json) "
                                           "VALUES (<key expr>, <state JSON expr>) (the other columns are the "
                                           "framework's)")
            inserted, icond, (ikey, istate) = True, c.group("cond"), vals
        else:
            if matched:
                raise RepairStatementError("a MERGE takes one WHEN MATCHED clause")
            matched, mcond = True, c.group("cond")
            if action.strip().upper() == "DELETE":
                continue
            s = _SET.match(action)
            if s is None or s.group("col").lower() != "state_json":
                raise RepairStatementError(f"WHEN MATCHED THEN {action[:60]!r}: write UPDATE SET state_json = <expr> "
                                           "or DELETE (only state_json can be set)")
            mexpr = s.group("expr")
    return MergeStatement(target=target, fmt=fmt, path=m.group("path"), name=m.group("name"), alias=alias,
                          on=m.group("on"), matched=matched, matched_cond=mcond, matched_expr=mexpr, insert_cond=icond,
                          insert_key=ikey, insert_state=istate)


def _register_source(spark: Any, stmt: MergeStatement) -> str:
    """The source as a view name the SQL can use; RepairStatementError if it cannot be read."""
    if stmt.fmt is None:
        assert stmt.name is not None
        return stmt.name
    try:
        reader = spark.read
        if stmt.fmt == "csv":
            reader = reader.option("header", "true").option("inferSchema", "true")
        reader.format(stmt.fmt).load(stmt.path).createOrReplaceTempView(_SOURCE_VIEW)
    except Exception as exc:
        if type(exc).__name__ not in ("AnalysisException", "IllegalArgumentException"):
            raise
        raise RepairStatementError(f"the MERGE source {stmt.fmt}.`{stmt.path}` cannot be read: "
                                   f"{str(exc).strip().splitlines()[0][:300]}") from exc
    return _SOURCE_VIEW


def merge_edits(spark: Any, stmt: MergeStatement, *, computation: str, num_intervals: int,
                codec: Callable[[], str]) -> Edits:
    """The keys the MERGE changes, evaluated now; ``codec()``: an inserted key's codec column.

    Raises:
        RepairStatementError: invalid SQL; a key matched or inserted twice; an inserted key that exists
            or is not usable; a state the codec cannot encode.
    """
    src = _register_source(spark, stmt)
    mine = f"(SELECT * FROM state WHERE computation = {sql_str(computation)}) AS {stmt.target}"
    what = "the state view and the MERGE source"
    by_key: dict[str, tuple[int, Edit]] = {}
    if stmt.matched:
        expr = "CAST(NULL AS STRING)" if stmt.matched_expr is None else stmt.matched_expr
        rows = run_sql(spark, f"SELECT {stmt.target}.key AS key, {stmt.target}.`interval` AS iv, "
                              f"CAST(({expr}) AS STRING) AS new_state FROM {mine} JOIN {src} AS {stmt.alias} "
                              f"ON ({stmt.on}) WHERE ({stmt.matched_cond or 'true'})", what=what)
        for r in rows:
            k = str(r["key"])
            if k in by_key:
                raise RepairStatementError(f"the MERGE source has more than one row matching key {k!r}: each key "
                                           "takes one source row (deduplicate the source)")
            by_key[k] = (int(r["iv"]), set_state(k, r["new_state"], delete=stmt.matched_expr is None))
    if stmt.insert_key is not None:
        rows = run_sql(spark, f"SELECT CAST(({stmt.insert_key}) AS STRING) AS key, "
                              f"CAST(({stmt.insert_state}) AS STRING) AS new_state FROM {src} AS {stmt.alias} "
                              f"LEFT ANTI JOIN {mine} ON ({stmt.on}) WHERE ({stmt.insert_cond or 'true'})", what=what)
        if rows:
            have = {str(r[0]) for r in run_sql(spark, f"SELECT key FROM state WHERE computation = "
                                                      f"{sql_str(computation)}", what="the state view")}
            column = codec()
        for r in rows:
            k = check_new_key(r["key"])
            if k in by_key:
                raise RepairStatementError(f"the MERGE inserts key {k!r} twice: each key takes one source row "
                                           "(deduplicate the source)")
            if k in have:
                raise RepairStatementError(f"the MERGE inserts key {k!r}, which the computation has: the ON "
                                           "condition must match every existing key (state.key = source.<column>)")
            row = new_key_row(computation, k, num_intervals=num_intervals,
                              state=encode_state(k, r["new_state"], column), codec=column)
            by_key[k] = (row.interval, _insert(row))
    return Edits(by_key)


def _insert(new: KeyRow) -> Edit:
    def edit(row: KeyRow | None) -> KeyRow | None:
        if row is not None:
            raise RepairStatementError(f"key {new.key!r} exists now (the state changed meanwhile); nothing was "
                                       "changed: run the repair again")
        return new
    return edit
