"""Audit rows a tool that died after its rows commit did not append, rebuilt from the commits' metadata."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..delta.log import batch_metas, commit_infos, user_metadata
from ..layout import StoreLayout

__all__ = ["RECOVERED_DETAIL", "AuditGap", "audit_gap", "AUDIT_FORMAT_VERSION"]

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


@dataclass(frozen=True)
class AuditGap:
    """The missing ``rows`` (oldest first), the newest version read (``upto``; -1: none), commits opened."""

    rows: list[dict[str, Any]]
    upto: int
    read: int


def audit_gap(spark: Any, layout: StoreLayout, *, table: str | None = None, after_version: int | None = None,
              rows_version: int | None = None, audit_version: int | None = None,
              audit_existed: bool = True) -> AuditGap:
    """The audit rows missing for tools' commits to ``table`` (None: the store's first rows table) after
    ``after_version`` (None: all), oldest first, as of ``rows_version`` / ``audit_version``."""
    have = (_audit_ids(spark, layout, audit_version) if audit_existed else None) or set()
    path = layout.rows if table is None else table
    commits, read = None, 0
    if after_version is not None:
        infos = commit_infos(path, after=after_version)
        if infos is not None:
            commits = [(v, int(i.get("timestamp") or 0), i.get("userMetadata")) for v, i in infos]
            read = len(infos)
    if commits is None:  # every commit's commitInfo opened
        hist = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "timestamp", "userMetadata").collect()
        commits = [(int(r["version"]), int(r["timestamp"].timestamp() * 1000), r["userMetadata"]) for r in hist
                   if after_version is None or int(r["version"]) > after_version]
        read = len(hist)
    commits = sorted(c for c in commits if rows_version is None or c[0] <= rows_version)
    out = []
    for version, ts_ms, meta in ((v, t, m) for v, t, text in commits for m in batch_metas(user_metadata(text))):
        if not meta.get("tool") or not meta.get("audit_id") or str(meta["audit_id"]) in have:
            continue
        raw = meta.get("sequencers")
        seqs: dict[str, Any] = raw if isinstance(raw, dict) else {}
        upserted, deleted = int(meta.get("rows_upserted", 0)), int(meta.get("rows_deleted", 0))
        out.append({
            "audit_id": str(meta["audit_id"]), "recorded_ms": ts_ms,
            "who": str(meta.get("who", "")), "tool": str(meta["tool"]), "pipeline": str(meta.get("pipeline", "")),
            "computation": str(meta.get("computation", "")), "source": str(meta.get("source", "")),
            "intervals": [int(i) for i in meta.get("intervals") or sorted(int(k) for k in seqs)],
            "rows_upserted": upserted, "rows_deleted": deleted, "rows_changed": upserted + deleted,
            "commit_version": version,
            "sequencers": json.dumps({str(k): int(v) for k, v in sorted(seqs.items(), key=lambda kv: int(kv[0]))}),
            "detail": json.dumps(RECOVERED_DETAIL, sort_keys=True), "format_version": AUDIT_FORMAT_VERSION})
        have.add(str(meta["audit_id"]))
    return AuditGap(out, max((c[0] for c in commits), default=after_version if after_version is not None else -1),
                    read)
