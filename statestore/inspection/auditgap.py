"""Audit rows missing for tools' rows commits, computed from the commits (read only).

A tool (promote, repair: ``statestore/surgery``) commits the rows table with its audit record in
the commit's metadata (``audit.commit_meta``: tool, audit id, who, source, pipeline, intervals,
rows written and deleted), then appends the row to the audit table. A tool that died between the
two leaves a commit whose row is missing: :func:`missing_audit_rows` rebuilds those rows from the
commits (marked ``"recovered": true`` in ``detail``). ``surgery.audit.recover_audit`` appends them
(every tool run and ``deltawheel gc --apply`` call it); the ``sql`` tool, which writes nothing,
shows them in its ``audit`` view beside the table's rows (``sqlviews.register_views``).
"""

from __future__ import annotations

import json
from typing import Any

from ..layout import StoreLayout

__all__ = ["RECOVERED_DETAIL", "missing_audit_rows", "AUDIT_FORMAT_VERSION"]

AUDIT_FORMAT_VERSION = 1

RECOVERED_DETAIL = {"recovered": True, "why": "the tool stopped between its rows commit and its audit row; "
                                              "rebuilt from the commit's metadata"}


def _audit_ids(spark: Any, layout: StoreLayout, version: int | None) -> set[str] | None:
    """The audit ids in the audit table (at ``version``); None: no table (or not at that version)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, layout.audit):
        return None
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return {str(r[0]) for r in reader.load(layout.audit).select("audit_id").collect()}


def missing_audit_rows(spark: Any, layout: StoreLayout, *, rows_version: int | None = None,
                       audit_version: int | None = None, audit_existed: bool = True) -> list[dict[str, Any]]:
    """The audit table's rows (its columns, ``tabledefs.AUDIT_COLUMNS``) missing for the tools'
    commits of the rows table, oldest commit first: a commit whose metadata names a tool and an
    audit id that the audit table does not hold. ``rows_version`` / ``audit_version``: the tables
    as of those versions (``sql --as-of``); default their newest; ``audit_existed`` False: the
    audit table did not exist then (every tool commit's row is missing). Commits whose JSON entries
    are past the log's retention are not seen (``DESCRIBE HISTORY`` does not list them)."""
    have = (_audit_ids(spark, layout, audit_version) if audit_existed else None) or set()
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{layout.rows}`").select("version", "timestamp", "userMetadata").collect()
    out = []
    for r in sorted(hist, key=lambda r: int(r["version"])):
        version = int(r["version"])
        if rows_version is not None and version > rows_version:
            continue
        try:
            meta = json.loads(r["userMetadata"]) if r["userMetadata"] else None
        except ValueError:
            continue  # another writer's free text
        if not isinstance(meta, dict) or not meta.get("tool") or not meta.get("audit_id") \
                or str(meta["audit_id"]) in have:
            continue
        raw = meta.get("sequencers")
        seqs: dict[str, Any] = raw if isinstance(raw, dict) else {}
        upserted, deleted = int(meta.get("rows_upserted", 0)), int(meta.get("rows_deleted", 0))
        out.append({
            "audit_id": str(meta["audit_id"]), "recorded_ms": int(r["timestamp"].timestamp() * 1000),
            "who": str(meta.get("who", "")), "tool": str(meta["tool"]), "pipeline": str(meta.get("pipeline", "")),
            "computation": str(meta.get("computation", "")), "source": str(meta.get("source", "")),
            "intervals": [int(i) for i in meta.get("intervals") or sorted(int(k) for k in seqs)],
            "rows_upserted": upserted, "rows_deleted": deleted, "rows_changed": upserted + deleted,
            "commit_version": version,
            "sequencers": json.dumps({str(k): int(v) for k, v in sorted(seqs.items(), key=lambda kv: int(kv[0]))}),
            "detail": json.dumps(RECOVERED_DETAIL, sort_keys=True), "format_version": AUDIT_FORMAT_VERSION})
        have.add(str(meta["audit_id"]))
    return out
