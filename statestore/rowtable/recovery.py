"""The recovery scan after fencing (MillWheel 5.1): Bloom filters, timer heap, pending productions."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Iterable

from .bloom import IntervalBloom
from .rows import KeyRow, Production, TimeDomain, is_user_key
from .store import RowStore

__all__ = ["RecoveredIntervals", "TimerEntry", "recover", "rebuild"]


@dataclass(frozen=True, order=True)
class TimerEntry:
    """One pending timer in the heap: ordered by time, then domain, key, tag."""

    time_ms: int
    domain: TimeDomain
    key: str
    tag: str


@dataclass(frozen=True, kw_only=True)
class RecoveredIntervals:
    """A computation's intervals rebuilt from their rows: rows by key, Bloom filters, timers, pending."""

    computation: str
    intervals: tuple[int, ...]
    rows: dict[str, KeyRow]
    blooms: dict[int, IntervalBloom]
    timers: list[TimerEntry]  # a heap (heapq order)
    pending: tuple[tuple[str, Production], ...]

    def due_timers(self, *, domain: TimeDomain, up_to_ms: int) -> list[TimerEntry]:
        """Timers of ``domain`` at or before ``up_to_ms``, in firing order (does not pop)."""
        return sorted(t for t in self.timers if t.domain is domain and t.time_ms <= up_to_ms)


def rebuild(computation: str, intervals: Iterable[int], rows: Iterable[KeyRow]) -> RecoveredIntervals:
    """Build the in-memory structures from ``rows`` (pure; used by :func:`recover` and tests)."""
    ivs = tuple(sorted(set(intervals)))
    by_key: dict[str, KeyRow] = {}
    blooms = {iv: IntervalBloom() for iv in ivs}
    heap: list[TimerEntry] = []
    pending: list[tuple[str, Production]] = []
    for r in rows:
        if not is_user_key(r.key):
            continue
        by_key[r.key] = r
        bloom = blooms.setdefault(r.interval, IntervalBloom())
        for s in r.record_ids:
            bloom.add(s.record_id)
        for t in r.timers:
            heap.append(TimerEntry(t.time_ms, t.domain, r.key, t.tag))
        pending.extend((r.key, p) for p in r.pending)
    heapq.heapify(heap)
    pending.sort(key=lambda kp: (kp[1].timestamp_ms, kp[1].production_id))
    return RecoveredIntervals(computation=computation, intervals=ivs, rows=by_key, blooms=blooms, timers=heap,
                              pending=tuple(pending))


def recover(store: RowStore, computation: str, intervals: Iterable[int]) -> RecoveredIntervals:
    """One scan of the intervals' rows, then :func:`rebuild`."""
    ivs = tuple(sorted(set(intervals)))
    return rebuild(computation, ivs, store.scan_intervals(computation, ivs))
