"""Garbage collection of a store's Delta tables (``deltawheel gc``).

Passes, each reporting what it would remove (dry run, the default) or removed:

* ``stream_retention``: delete stream records older than a retention (by event
  timestamp). Only run it for streams whose consumers are past that point.
* ``compact``: ``OPTIMIZE`` every table (the rows table gets many small files
  and deletion vectors from per-batch MERGEs). Data is unchanged; a concurrent
  fenced commit that conflicts is retried by the store.
* ``vacuum``: ``VACUUM`` files no longer referenced, older than the retention.

What GC never touches: rows of keys (dedup ids, checkpointed productions,
window state) — those are only written under the owner's lease and fence: the
executor trims dedup ids past ``Computation.dedup_retention`` (a processing
time: on the image path in every row of an interval it rewrites, and it
rewrites an interval holding expired ids even without records or due timers;
on the MERGE path by running the rows that hold expired ids; reported as
``BatchReport.ids_expired``), clears delivered
checkpoints in the next commit, and windowed computations drop window state
and timers at end + allowed lateness.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.streams import list_streams

__all__ = ["GcAction", "GcReport", "run_gc"]


@dataclass(frozen=True)
class GcAction:
    pass_name: str
    table: str
    detail: str
    count: int | None = None


@dataclass(frozen=True)
class GcReport:
    applied: bool
    actions: tuple[GcAction, ...] = field(default_factory=tuple)

    def lines(self) -> list[str]:
        verb = "done" if self.applied else "plan"
        return [f"[{verb}] {a.pass_name:16s} {a.table}: {a.detail}" for a in self.actions]


def _tables(spark: Any, layout: StoreLayout) -> list[tuple[str, str]]:
    out = [("rows", layout.rows), ("dead_letters", layout.dead_letters), ("late_data", layout.late_data)]
    out += [(s, layout.stream(s)) for s in list_streams(spark, layout)]
    return [(n, p) for n, p in out if not layout.is_local or os.path.isdir(os.path.join(p, "_delta_log"))]


def run_gc(spark: Any, layout: StoreLayout, *, now_ms: int, apply: bool = False,
           stream_retention_ms: int | None = None, vacuum_retain_hours: float = 168.0) -> GcReport:
    """Plan (default) or run the GC passes over ``layout``'s tables."""
    from pyspark.sql import functions as F

    actions: list[GcAction] = []
    tables = _tables(spark, layout)
    if stream_retention_ms is not None:
        cutoff = now_ms - stream_retention_ms
        for name, path in tables:
            if path.startswith(layout.streams_root):
                df = spark.read.format("delta").load(path)
                n = df.where(F.col("timestamp_ms") < cutoff).count()
                if apply and n:
                    spark.sql(f"DELETE FROM delta.`{path}` WHERE timestamp_ms < {int(cutoff)}")
                actions.append(GcAction("stream_retention", name, f"{n} records with timestamp < {cutoff}", n))
    for name, path in tables:
        files = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"]
        if apply:
            spark.sql(f"OPTIMIZE delta.`{path}`")
        actions.append(GcAction("compact", name, f"{files} files before OPTIMIZE", int(files)))
    for name, path in tables:
        if apply:
            removed = spark.sql(f"VACUUM delta.`{path}` RETAIN {vacuum_retain_hours} HOURS").count()
            actions.append(GcAction("vacuum", name, f"vacuumed files older than {vacuum_retain_hours} h", removed))
        else:
            n = spark.sql(f"VACUUM delta.`{path}` RETAIN {vacuum_retain_hours} HOURS DRY RUN").count()
            actions.append(GcAction("vacuum", name, f"{n} unreferenced files older than {vacuum_retain_hours} h", n))
    return GcReport(apply, tuple(actions))
