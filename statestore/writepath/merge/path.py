"""The MERGE write path: one fenced Delta MERGE per batch, any store (docs/write-paths.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ...exceptions import WritePathSwitchError
from ...layout import StoreLayout
from ...ownership.owner import IntervalOwner
from ...rowtable.rows import IDS_KEY_PREFIX, Production, rows_schema_ddl
from ...rowtable.tables import ensure_rows_table
from .. import Recovered, WritePath
from ..delivery import deliver_frame, deliver_productions
from ..streams import ensure_stream_table

__all__ = ["MergePath", "MergeBatch", "ROW_COLUMNS"]

#: the columns of a batch's changed rows: the rows table's plus ``_op`` ('upsert' / 'delete' / 'none')
ROW_COLUMNS = [c.split()[0] for c in re.split(r",\s*(?![^<]*>)", rows_schema_ddl())] + ["_op"]


@dataclass
class MergeBatch:
    """A batch's new rows (``_op`` not 'none') and productions on the MERGE path (materialized DataFrames);
    ``checkpointed``: the productions go into the rows' ``pending`` column (a weak batch's straggler)."""

    changed: Any
    prods: Any
    written: int
    n_prods: int
    checkpointed: bool = False


class MergePath(WritePath[MergeBatch]):
    """The fenced MERGE write path of computation ``name``'s owned intervals; ``track_oldest``: keep each
    interval's oldest work (for watermarks); ``dedup``: refuse intervals holding ids files."""

    def __init__(self, spark: Any, layout: StoreLayout, owner: IntervalOwner, *, name: str,
                 outputs: Sequence[str], track_oldest: bool, dedup: bool = True) -> None:
        self.spark, self.layout, self.owner, self.name = spark, layout, owner, name
        self.outputs, self.track_oldest, self.dedup = tuple(outputs), track_oldest, dedup
        self._oldest: dict[int, dict[str, int]] = {}  # per interval: key -> its oldest work

    def acquire(self, intervals: Sequence[int] | None, *, wait_s: float = 0.0) -> Recovered:
        """:meth:`WritePath.acquire`: fence with a MERGE, recover and redeliver by insert-if-absent;
        WritePathSwitchError: the computation deduplicates and an owned interval holds ids files."""
        rec = self.owner.acquire(intervals, wait_s=wait_s)
        if self.dedup:
            self._refuse_ids_files()
        for s in self.outputs:  # created by the owner, after the leases are held
            ensure_stream_table(self.spark, self.layout, s)
        # oldest work per interval, kept from the rows we write (authoritative while we hold the lease)
        self._oldest = {iv: {} for iv in self.owner.intervals}
        for r in rec.rows.values():
            self._note(r.interval, r.key, r.next_event_timer_ms, r.watermark_hold_ms, deleted=False)
        pending: list[Production] = [p for _, p in rec.pending]
        # the commit that checkpointed each (the row's commit id: kept by any rewrite of the table)
        commit_ids = {p.production_id: rec.rows[k].commit_id if k in rec.rows else None for k, p in rec.pending}
        if pending:
            deliver_productions(self.spark, self.layout, pending, producer=self.name, commit_ids=commit_ids)
        return Recovered(appended=0, merged=len(pending))

    def _refuse_ids_files(self) -> None:
        """Raise :class:`WritePathSwitchError` (leases given back) if an owned interval holds ids files."""
        from pyspark.sql import functions as F

        ivs = sorted(self.owner.intervals)
        found = sorted(int(r["interval"]) for r in (
            self.spark.read.format("delta").load(ensure_rows_table(self.spark, self.layout, self.name))
            .where((F.col("computation") == self.name) & F.col("interval").isin(ivs)
                   & F.col("key").startswith(IDS_KEY_PREFIX))
            .select("interval").distinct().collect()))
        if found:
            self.owner.release()
            raise WritePathSwitchError(
                f"computation {self.name!r} of the store at {self.layout.root} keeps record ids for exactly-once "
                f"dedup in the image write path's ids files (intervals {found}), which the MERGE path does not "
                "read: run it with write_path='image' (or 'auto'; the command line: --write-path image). To move "
                "it to the MERGE path, run it on the image path with no new input for its dedup_retention (ids "
                "files past it are dropped), then switch. No state or stream record was written")

    def load(self) -> None:
        """The tasks join the rows table itself each batch: only the fence check is left."""
        self.owner.store.check_fences(self.name, self.owner.sequencers)

    def commit(self, batch: MergeBatch, *, commit_id: str, meta: Mapping[str, Any]) -> bool:
        """The fenced MERGE of the changed rows. See :meth:`WritePath.commit`."""
        from pyspark.sql import functions as F

        if not batch.written:
            return False
        rows = batch.changed
        if batch.checkpointed:  # each row's new productions become its pending ones
            rows = rows.withColumn("pending", F.col("new_prods"))
        self.owner.store.commit_frame(self.name, rows.select(*ROW_COLUMNS), sequencers=self.owner.sequencers,
                                      intervals=self.owner.intervals, commit_id=commit_id,
                                      lease_check=self.owner.check, meta=meta, input_files=self.input_files)
        if self.track_oldest:
            for r in (batch.changed.select("interval", "key", "next_event_timer_ms", "watermark_hold_ms", "_op")
                      .toArrow().to_pylist()):
                self._note(r["interval"], r["key"], r["next_event_timer_ms"], r["watermark_hold_ms"],
                           deleted=r["_op"] == "delete")
        return True

    def deliver(self, batch: MergeBatch, *, strong: bool) -> int:
        """Insert the productions whose record id is absent from their stream (:meth:`WritePath.deliver`)."""
        deliver_frame(self.spark, self.layout, batch.prods, streams=self.outputs, producer=self.name)
        return batch.n_prods

    def oldest_work(self) -> Mapping[int, int | None]:
        """Per owned interval, the oldest work of its keys as tracked from the committed rows."""
        return {iv: min(per.values()) if per else None for iv, per in self._oldest.items()}

    def _note(self, interval: int, key: str, timer: int | None, hold: int | None, *, deleted: bool) -> None:
        per = self._oldest.setdefault(interval, {})
        marks = [t for t in (timer, hold) if t is not None]
        if deleted or not marks:
            per.pop(key, None)
        else:
            per[key] = min(marks)
