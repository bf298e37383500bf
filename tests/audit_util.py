"""A tool's rows commit whose audit row was never appended (a tool that died after its commit),
for the audit-recovery tests of ``deltawheel gc``, the background gc and the ``sql`` audit view.

The commit carries its metadata as a tool writes it (``surgery/replace.py``: the audit record,
``audit.commit_meta``), here on a commit changing no row."""

from __future__ import annotations

import json
from typing import Any, Mapping


def tool_commit(spark: Any, layout: Any, audit_id: str, *, sequencers: Mapping[int, int]) -> int:
    """A repair's commit to the rows table of computation ``buckets`` under the leases ``sequencers``
    (interval -> sequencer) whose audit row was never appended; its version of that table."""
    from deltawheel.statestore.rowtable.inputfiles import no_input_entry
    from deltawheel.statestore.rowtable.tables import ensure_rows_table
    from deltawheel.statestore.surgery.audit import AuditRecord, commit_meta

    record = AuditRecord(audit_id=audit_id, recorded_ms=0, who="tester@here", tool="repair", pipeline="p",
                         computation="buckets", source="set cats", intervals=tuple(sorted(sequencers)),
                         rows_upserted=1, rows_deleted=0, commit_version=None, sequencers=dict(sequencers))
    meta = {"deltawheel": 1, "kind": "repair", "computation": "buckets",
            "sequencers": {str(k): v for k, v in sequencers.items()}, **commit_meta(record), **no_input_entry()}
    # a commit carrying that metadata (an empty append makes no commit): a table property set
    rows = ensure_rows_table(spark, layout, "buckets")
    key = "spark.databricks.delta.commitInfo.userMetadata"
    spark.conf.set(key, json.dumps(meta))
    try:
        spark.sql(f"ALTER TABLE delta.`{rows}` SET TBLPROPERTIES ('deltawheel.test.tool' = '{audit_id}')")
    finally:
        spark.conf.unset(key)
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{rows}` LIMIT 1").collect()[0]["version"])
