"""The audit table ``<store>/_audit``: one row per change a tool made to a live computation's rows; the
tool's rows commit carries the same record, so :func:`recover_audit` can append a dead tool's row."""

from __future__ import annotations

import getpass
import json
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..inspection.auditgap import AUDIT_FORMAT_VERSION, AuditGap, audit_gap
from ..layout import StoreLayout
from ..tabledefs import AUDIT_COLUMNS

__all__ = ["AUDIT_FORMAT_VERSION", "AuditRecord", "append_audit", "read_audit", "who", "commit_meta",
           "recover_audit", "audit_gap_of", "store_rows_tables"]


def who() -> str:
    """``user@host`` of this process (recorded as who made a change)."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (a container without a passwd entry)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True, kw_only=True)
class AuditRecord:
    """One change; ``source``: the replay folder or statement; ``commit_version`` None: no commit."""

    audit_id: str
    recorded_ms: int
    who: str
    tool: str
    pipeline: str
    computation: str
    source: str
    intervals: tuple[int, ...]
    rows_upserted: int
    rows_deleted: int
    commit_version: int | None
    sequencers: Mapping[int, int]
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def rows_changed(self) -> int:
        """Rows written or deleted."""
        return self.rows_upserted + self.rows_deleted

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> AuditRecord:
        """The record of an audit table row (:meth:`to_row`'s inverse)."""
        return cls(audit_id=str(row["audit_id"]), recorded_ms=int(row["recorded_ms"]), who=str(row["who"]),
                   tool=str(row["tool"]), pipeline=str(row["pipeline"]), computation=str(row["computation"]),
                   source=str(row["source"]), intervals=tuple(int(i) for i in row["intervals"] or ()),
                   rows_upserted=int(row["rows_upserted"]), rows_deleted=int(row["rows_deleted"]),
                   commit_version=None if row["commit_version"] is None else int(row["commit_version"]),
                   sequencers={int(k): int(v) for k, v in json.loads(row["sequencers"] or "{}").items()},
                   detail=json.loads(row["detail"] or "{}"))

    def to_row(self) -> dict[str, Any]:
        """The table row."""
        return {"audit_id": self.audit_id, "recorded_ms": self.recorded_ms, "who": self.who, "tool": self.tool,
                "pipeline": self.pipeline, "computation": self.computation, "source": self.source,
                "intervals": list(self.intervals), "rows_upserted": self.rows_upserted,
                "rows_deleted": self.rows_deleted, "rows_changed": self.rows_changed,
                "commit_version": self.commit_version,
                "sequencers": json.dumps({str(k): v for k, v in sorted(self.sequencers.items())}),
                "detail": json.dumps(dict(self.detail), sort_keys=True, default=str),
                "format_version": AUDIT_FORMAT_VERSION}


def append_audit(spark: Any, layout: StoreLayout, record: AuditRecord) -> None:
    """Append ``record`` to the store's audit table (created by the first append)."""
    df = spark.createDataFrame([record.to_row()], AUDIT_COLUMNS)
    df.write.format("delta").mode("append").save(layout.audit)


def commit_meta(record: AuditRecord) -> dict[str, Any]:
    """What a tool's rows commit records of its audit row (for :func:`recover_audit`)."""
    return {"tool": record.tool, "audit_id": record.audit_id, "who": record.who, "source": record.source[:2000],
            "pipeline": record.pipeline, "intervals": list(record.intervals),
            "rows_upserted": record.rows_upserted, "rows_deleted": record.rows_deleted}


def store_rows_tables(spark: Any, layout: StoreLayout) -> list[str]:
    """Every rows table a tool may have committed to: the store's first, then each computation's."""
    from ..rowtable.tables import rows_tables

    return [layout.rows, *rows_tables(spark, layout).values()]


def audit_gap_of(spark: Any, layout: StoreLayout, table: str, **options: Any) -> AuditGap:
    """:func:`audit_gap` (``options``: its settings) over the rows table ``table``."""
    return audit_gap(spark, layout, table=table, **options)


def recover_audit(spark: Any, layout: StoreLayout, rows: Sequence[Mapping[str, Any]] | None = None) -> list[AuditRecord]:
    """Append (idempotent by ``audit_id``) and return the missing audit rows ``rows`` (None: all)."""
    from delta.tables import DeltaTable

    rows = [r for table in store_rows_tables(spark, layout) for r in audit_gap_of(spark, layout, table).rows
            ] if rows is None else list(rows)
    if not rows:
        return []
    df = spark.createDataFrame(rows, AUDIT_COLUMNS)
    if not DeltaTable.isDeltaTable(spark, layout.audit):
        df.write.format("delta").mode("append").save(layout.audit)
    else:
        (DeltaTable.forPath(spark, layout.audit).alias("t").merge(df.alias("s"), "t.audit_id = s.audit_id")
         .whenNotMatchedInsertAll().execute())
    return [AuditRecord.from_row(r) for r in rows]


def read_audit(spark: Any, layout: StoreLayout) -> list[dict[str, Any]]:
    """The audit table's rows, oldest first (none: no table yet)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, layout.audit):
        return []
    rows = spark.read.format("delta").load(layout.audit).orderBy("recorded_ms").collect()
    return [r.asDict(recursive=True) for r in rows]
