"""The audit table: one row per change a tool made to a live computation's rows under its leases
(``<store>/_audit``, a Delta table; the ``audit`` view of ``deltawheel sql``).

A row is appended after the tool's rows commit landed and before it gives the leases back; the
rows commit carries the same ``audit_id`` in its metadata (``DESCRIBE HISTORY``), so a tool that
died between the two leaves a commit that names itself.
"""

from __future__ import annotations

import getpass
import json
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..layout import StoreLayout
from ..tabledefs import AUDIT_COLUMNS

__all__ = ["AUDIT_DDL", "AUDIT_FORMAT_VERSION", "AuditRecord", "append_audit", "read_audit", "who"]

AUDIT_FORMAT_VERSION = 1

AUDIT_DDL = AUDIT_COLUMNS


def who() -> str:
    """``user@host`` of this process (recorded as who made a change)."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (a container without a passwd entry)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class AuditRecord:
    """One change: ``tool`` (promote, repair), ``source`` (the replay folder, the statement),
    ``commit_version`` (the rows commit; None: nothing changed, no commit), ``detail`` (the tool's
    own figures, JSON-ready)."""

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
    df = spark.createDataFrame([record.to_row()], AUDIT_DDL)
    df.write.format("delta").mode("append").save(layout.audit)


def read_audit(spark: Any, layout: StoreLayout) -> list[dict[str, Any]]:
    """The audit table's rows, oldest first (none: no table yet)."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, layout.audit):
        return []
    rows = spark.read.format("delta").load(layout.audit).orderBy("recorded_ms").collect()
    return [r.asDict(recursive=True) for r in rows]
