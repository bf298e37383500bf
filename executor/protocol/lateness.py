"""Which watermark a batch judges lateness against: the mark (:class:`ActedMark`) its interval's last
commit recorded, read back at start, so a restart changes no decision. docs/late-data.md."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from deltawheel.statestore.delta.log import batch_metas, newest_commit_info
from deltawheel.statestore.delta.storefs import table_files
from deltawheel.statestore.layout import StoreLayout

__all__ = ["ActedMark", "MARK_FORMAT_VERSION", "newest_marks", "interval_lines", "judged",
           "recorded_injector_watermarks"]

MARK_FORMAT_VERSION = 1
_KEY = "late"


@dataclass(frozen=True, kw_only=True)
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
    # intervals whose own line is above ``acted_ms`` (taken over from a holder further ahead)
    raised: Mapping[int, int] = field(default_factory=dict)
    query: str | None = None  # the checkpoint of the query whose batch it was (instances sharing intervals)

    @property
    def acted_ms(self) -> int | None:
        """The watermark the next batch judges lateness against."""
        marks = [m for m in (self.late_ms, self.input_ms) if m is not None]
        return max(marks) if marks else None

    def line_of(self, interval: int) -> int | None:
        """The watermark the next batch judges ``interval``'s records against."""
        raised = self.raised.get(interval)
        acted = self.acted_ms
        return acted if raised is None else raised if acted is None else max(acted, raised)

    def to_meta(self) -> dict[str, Any]:
        """The commit metadata entry (``{"late": ...}``)."""
        return {_KEY: {"v": MARK_FORMAT_VERSION, "batch_id": self.batch_id, "late_ms": self.late_ms,
                       "input_ms": self.input_ms, "intervals": list(self.intervals),
                       "injectors": dict(sorted(self.injectors.items())),
                       "computations_ms": self.computations_ms,
                       **({"raised": {str(i): ms for i, ms in sorted(self.raised.items())}} if self.raised else {}),
                       **({"query": self.query} if self.query is not None else {})}}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ActedMark:
        """The mark of a commit's metadata entry (:meth:`to_meta`'s inverse)."""
        m = meta[_KEY]

        def opt(v: Any) -> int | None:
            return None if v is None else int(v)

        return cls(batch_id=opt(m.get("batch_id")), late_ms=opt(m.get("late_ms")), input_ms=opt(m.get("input_ms")),
                   intervals=tuple(int(i) for i in m.get("intervals") or ()),
                   injectors={str(k): int(v) for k, v in (m.get("injectors") or {}).items()},
                   computations_ms=opt(m.get("computations_ms")),
                   raised={int(i): int(ms) for i, ms in (m.get("raised") or {}).items()},
                   query=None if m.get("query") is None else str(m["query"]))

    def replayed_by(self, batch_id: int, held: Iterable[int], query: str | None) -> bool:
        """Whether batch ``batch_id`` of ``query`` on intervals ``held`` is Spark's replay of this mark's
        batch: the same query's batch id, and the mark the newest of every held interval. Instances
        sharing intervals number their batches apart, so another query's batch of the same id is not.

        >>> m = ActedMark(batch_id=44, late_ms=5, input_ms=9, intervals=(0, 1), query="chk/a")
        >>> m.replayed_by(44, [0, 1], "chk/a"), m.replayed_by(44, [0, 1], "chk/b"), m.replayed_by(44, [0, 2], "chk/a")
        (True, False, False)
        """
        return self.batch_id == batch_id and self.query == query and set(held) <= set(self.intervals)


def _marks_of(user_metadata: str | None, computation: str, intervals: set[int]) -> list[ActedMark]:
    """The marks of ``computation`` on ``intervals`` a commit records (a group commit's batches each, one)."""
    try:
        meta = json.loads(user_metadata or "{}")
    except ValueError:
        return []
    out = []
    for m in batch_metas(meta if isinstance(meta, dict) else None):
        if m.get("computation") == computation and isinstance(m.get(_KEY), dict):
            mark = ActedMark.from_meta(m)
            if intervals & set(mark.intervals):
                out.append(mark)
    return out


def interval_lines(marks: Iterable[ActedMark], intervals: Iterable[int]) -> dict[int, int | None]:
    """Each of ``intervals``' line from ``marks`` (newest first, :func:`newest_marks`); None: never acted.

    >>> m = ActedMark(batch_id=3, late_ms=5, input_ms=9, intervals=(0, 1), raised={1: 20})
    >>> interval_lines([m, ActedMark(batch_id=1, late_ms=2, input_ms=30, intervals=(0, 2))], [0, 1, 2, 3])
    {0: 9, 1: 20, 2: 30, 3: None}
    """
    lines: dict[int, int | None] = dict.fromkeys(intervals)
    left = set(lines)
    for m in marks:
        for iv in left.intersection(m.intervals):
            lines[iv] = m.line_of(iv)
        left.difference_update(m.intervals)
    return lines


def judged(lines: Mapping[int, int | None]) -> tuple[int | None, dict[int, int]]:
    """(the batch's line: the lowest interval's, None when one never acted; the intervals above it).

    >>> judged({0: 9, 1: 20}), judged({0: 9, 1: None}), judged({0: 9, 1: 9})
    ((9, {1: 20}), (None, {0: 9}), (9, {}))
    """
    known = [v for v in lines.values() if v is not None]
    base = None if len(known) < len(lines) else min(known, default=None)
    return base, {iv: v for iv, v in sorted(lines.items()) if v is not None and (base is None or v > base)}


def newest_marks(spark: Any, rows_path: str, computation: str, intervals: Iterable[int]) -> list[ActedMark]:
    """Newest first, the marks that are the newest of one of ``intervals``."""
    owned = set(intervals)
    left = set(owned)
    found: list[ActedMark] = []

    def take(user_metadata: str | None) -> bool:
        """Take a commit's mark of ``computation`` on ``owned``; True: the scan can stop."""
        marks = _marks_of(user_metadata, computation, owned)
        for mark in marks:
            if left & set(mark.intervals):
                found.append(mark)
                left.difference_update(mark.intervals)
        return bool(marks) and not left

    files = table_files(spark, rows_path)
    if files is not None:
        newest_commit_info(files, lambda info: take(info.get("userMetadata")))
        return found
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{rows_path}`").select("version", "userMetadata")
    for row in hist.where(hist.userMetadata.contains(f'"{_KEY}"')).orderBy(hist.version.desc()).toLocalIterator():
        if take(row["userMetadata"]):
            break
    return found


def recorded_injector_watermarks(spark: Any, layout: StoreLayout,
                                 computations: Mapping[str, Iterable[int]]) -> dict[str, int]:
    """Per injector, the largest watermark the newest marks of ``computations``' intervals record."""
    out: dict[str, int] = {}
    for comp, ivs in sorted(computations.items()):
        for mark in newest_marks(spark, layout.rows_of(comp), comp, ivs):
            for name, wm in mark.injectors.items():
                out[name] = max(wm, out.get(name, wm))
    return out
