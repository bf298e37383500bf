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

The mark also records the injectors' watermarks as the batch's step 7 publishes them
(:attr:`ActedMark.injectors`), which ``deltawheel reseed`` restores
(:func:`recorded_injector_watermarks`). docs/late-data.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from deltawheel.statestore.delta.log import newest_commit_info
from deltawheel.statestore.delta.storefs import table_files

__all__ = ["ActedMark", "MARK_FORMAT_VERSION", "read_mark", "newest_marks", "recorded_injector_watermarks"]

MARK_FORMAT_VERSION = 1
_KEY = "late"


@dataclass(frozen=True)
class ActedMark:
    """What a committed batch judged lateness with (one per rows commit of a batch)."""

    batch_id: int | None  # the Spark batch id; None: a batch without input (a flush)
    late_ms: int | None  # its records with an earlier event time were late
    input_ms: int | None  # the input low watermark its timers fired under
    intervals: tuple[int, ...]  # the intervals the committing instance held
    # the watermarks of the injectors feeding the batch, as its step 7 publishes them
    injectors: Mapping[str, int] = field(default_factory=dict)
    # the upstream computations' part of ``input_ms`` (their minimum; None: none, or not recorded)
    computations_ms: int | None = None

    @property
    def acted_ms(self) -> int | None:
        """The watermark the next batch judges lateness against."""
        marks = [m for m in (self.late_ms, self.input_ms) if m is not None]
        return max(marks) if marks else None

    def next_batch(self, batch_id: int | None, input_ms: int | None, intervals: Sequence[int]) -> ActedMark:
        """The mark of the batch after this one (which judges lateness against ``acted_ms``)."""
        return ActedMark(batch_id, self.acted_ms, input_ms, tuple(sorted(intervals)),
                         computations_ms=self.computations_ms)

    def to_meta(self) -> dict[str, Any]:
        """The commit metadata entry (``{"late": ...}``)."""
        return {_KEY: {"v": MARK_FORMAT_VERSION, "batch_id": self.batch_id, "late_ms": self.late_ms,
                       "input_ms": self.input_ms, "intervals": list(self.intervals),
                       "injectors": dict(sorted(self.injectors.items())),
                       "computations_ms": self.computations_ms}}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ActedMark:
        """The mark of a commit's metadata entry (:meth:`to_meta`'s inverse)."""
        m = meta[_KEY]

        def opt(v: Any) -> int | None:
            return None if v is None else int(v)

        return cls(opt(m.get("batch_id")), opt(m.get("late_ms")), opt(m.get("input_ms")),
                   tuple(int(i) for i in m.get("intervals") or ()),
                   {str(k): int(v) for k, v in (m.get("injectors") or {}).items()},
                   opt(m.get("computations_ms")))


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
    found = newest_marks(spark, rows_path, computation, intervals, first_only=True)
    return found[0] if found else None


def newest_marks(spark: Any, rows_path: str, computation: str, intervals: Iterable[int], *,
                 first_only: bool = False) -> list[ActedMark]:
    """Newest first, the marks of ``computation`` that are the newest of one of ``intervals`` (one
    mark covers every interval its instance held; ``first_only``: the newest one alone)."""
    left = set(intervals)
    found: list[ActedMark] = []

    def take(mark: ActedMark) -> bool:
        """Keep ``mark`` when it is the newest of an interval still left; True once done."""
        if left & set(mark.intervals):
            found.append(mark)
            left.difference_update(mark.intervals)
        return first_only or not left

    _scan(spark, rows_path, computation, set(intervals), take)
    return found


def _scan(spark: Any, rows_path: str, computation: str, owned: set[int],
          take: Callable[[ActedMark], bool]) -> None:
    """Hand ``take`` the marks of ``computation`` on ``owned``, newest first, until it returns True."""
    files = table_files(spark, rows_path)
    if files is not None:
        def match(info: dict[str, Any]) -> bool:
            mark = _mark_of(info.get("userMetadata"), computation, owned)
            return mark is not None and take(mark)

        newest_commit_info(files, match)
        return
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{rows_path}`").select("version", "userMetadata")
    for row in hist.where(hist.userMetadata.contains(f'"{_KEY}"')).orderBy(hist.version.desc()).toLocalIterator():
        mark = _mark_of(row["userMetadata"], computation, owned)
        if mark is not None and take(mark):
            return


def recorded_injector_watermarks(spark: Any, rows_path: str,
                                 computations: Mapping[str, Iterable[int]]) -> dict[str, int]:
    """Per injector, its watermark as the newest commits of ``computations`` (name -> their
    intervals) record it: the largest over the newest mark of every interval. The watermark a
    ZooKeeper that lost its data held for it, once the last batch's step 7 ran (that batch's
    replay publishes the same); injectors no mark records are left out."""
    out: dict[str, int] = {}
    for comp, ivs in sorted(computations.items()):
        for mark in newest_marks(spark, rows_path, comp, ivs):
            for name, wm in mark.injectors.items():
                out[name] = max(wm, out.get(name, wm))
    return out
