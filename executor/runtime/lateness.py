"""Which watermark a batch judges lateness against: durable, so a restart changes no decision.

A record is *late* when its event time is behind the watermark this computation
already acted on: the input low watermark under which its last committed batch
fired timers (closed windows). That watermark is recorded with the commit, in
the rows commit's metadata (``"late"``: an :class:`ActedMark`), atomically with
the state it produced, and read back when an executor starts. So:

- a batch judges lateness against the newest committed mark's
  :attr:`ActedMark.acted_ms` — a batch that committed nothing (no record run,
  no timer fired) moves nothing, in a run that never crashed as in one that did;
- a *replayed* batch (Spark re-runs the batch whose ``foreachBatch`` never
  returned; its first attempt may have committed before the crash) whose
  commit is the newest mark decides as that first attempt did: the same
  lateness watermark and the same input watermark (so the same timers are due).

A Spark batch is recognised by its id: a new checkpoint location (which numbers
batches from 0 again) should start on a new store, or its first batch may be
taken for a replay of the old query's last committed batch of the same id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

from deltawheel.statestore.delta.log import newest_commit_info
from deltawheel.statestore.delta.storefs import table_files

__all__ = ["ActedMark", "MARK_FORMAT_VERSION", "read_mark"]

MARK_FORMAT_VERSION = 1
_KEY = "late"


@dataclass(frozen=True)
class ActedMark:
    """What a committed batch judged lateness with (one per rows commit of a batch)."""

    batch_id: int | None  # the Spark batch id; None: a batch without input (a flush)
    late_ms: int | None  # its records with an earlier event time were late
    input_ms: int | None  # the input low watermark its timers fired under
    intervals: tuple[int, ...]  # the intervals the committing instance held

    @property
    def acted_ms(self) -> int | None:
        """The watermark the next batch judges lateness against."""
        marks = [m for m in (self.late_ms, self.input_ms) if m is not None]
        return max(marks) if marks else None

    def next_batch(self, batch_id: int | None, input_ms: int | None, intervals: Sequence[int]) -> ActedMark:
        """The mark of the batch after this one (which judges lateness against ``acted_ms``)."""
        return ActedMark(batch_id, self.acted_ms, input_ms, tuple(sorted(intervals)))

    def to_meta(self) -> dict[str, Any]:
        """The commit metadata entry (``{"late": ...}``)."""
        return {_KEY: {"v": MARK_FORMAT_VERSION, "batch_id": self.batch_id, "late_ms": self.late_ms,
                       "input_ms": self.input_ms, "intervals": list(self.intervals)}}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ActedMark:
        """The mark of a commit's metadata entry (:meth:`to_meta`'s inverse)."""
        m = meta[_KEY]
        opt = lambda v: None if v is None else int(v)  # noqa: E731
        return cls(opt(m.get("batch_id")), opt(m.get("late_ms")), opt(m.get("input_ms")),
                   tuple(int(i) for i in m.get("intervals") or ()))


def _mark_of(user_metadata: str | None, computation: str, intervals: set[int]) -> ActedMark | None:
    try:
        meta = json.loads(user_metadata or "{}")
    except ValueError:
        return None
    if not isinstance(meta, dict) or meta.get("computation") != computation or not isinstance(meta.get(_KEY), dict):
        return None
    mark = ActedMark.from_meta(meta)
    return mark if intervals & set(mark.intervals) else None


def read_mark(spark: Any, rows_path: str, computation: str, intervals: Sequence[int]) -> ActedMark | None:
    """The newest mark committed by ``computation`` on any of ``intervals`` (None: none yet).

    The log is read newest first, without Spark, where Python reaches it (local, ``s3a://``);
    elsewhere through Delta's history. Call it while holding the intervals' leases (nobody else
    commits them then)."""
    owned = set(intervals)
    files = table_files(spark, rows_path)
    if files is not None:
        found: list[ActedMark] = []

        def match(info: dict[str, Any]) -> bool:
            mark = _mark_of(info.get("userMetadata"), computation, owned)
            if mark is not None:
                found.append(mark)
            return mark is not None

        newest_commit_info(files, match)
        return found[0] if found else None
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{rows_path}`").select("version", "userMetadata")
    for row in hist.where(hist.userMetadata.contains(f'"{_KEY}"')).orderBy(hist.version.desc()).toLocalIterator():
        mark = _mark_of(row["userMetadata"], computation, owned)
        if mark is not None:
            return mark
    return None
