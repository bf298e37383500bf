"""Window-aware eviction of single rows: the row cache ``deltawheel bench cache`` replays.

:meth:`RowCache.end_batch` trims the cache to ``capacity`` rows, dropping first those with no
expected access, then those whose next (a timer, or the last access plus the mean gap) is furthest."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

from deltawheel.statestore.exceptions import ConfigError

__all__ = ["RowCache", "CacheStats", "MISS", "POLICIES"]

POLICIES = ("window", "lru")
#: What :meth:`RowCache.lookup` returns when the cache cannot answer (a cached absent row is ``None``).
MISS: Any = type("Miss", (), {"__repr__": lambda self: "MISS"})()
_NEVER = math.inf
DEFAULT_ADVANCE_MS = 1_000  # event time per batch, until two batches have shown it
_ALPHA = 0.5  # weight of the newest observation in the moving averages


@dataclass
class CacheStats:
    """Counters: ``hits + misses == lookups``."""

    lookups: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0


@dataclass(slots=True)
class _Entry:
    row: Any
    next_ev: int | None
    next_proc: int | None
    last: int  # batch of the last access
    seq: int  # global access order (LRU, ties)
    gap: float | None = None  # mean batches between accesses (None: accessed once)


class RowCache:
    """Rows of one computation's keys (``None`` = known to have no row), at most ``capacity`` (> 0)
    between batches, evicted by ``policy``: ``"window"`` (next expected access) or ``"lru"``."""

    def __init__(self, capacity: int, *, policy: str = "window") -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ConfigError(f"cache capacity must be a positive number of rows, got {capacity!r}")
        if policy not in POLICIES:
            raise ConfigError(f"unknown cache policy {policy!r}; choose one of {list(POLICIES)}")
        self.capacity = capacity
        self.policy = policy
        self.stats = CacheStats()
        self._entries: dict[str, _Entry] = {}
        self._batch = 0
        self._seq = 0
        self._wm: int | None = None
        self._now: int | None = None
        self._advance: float | None = None  # watermark advance per batch (ms, moving average)
        self._interval: float | None = None  # processing time per batch (ms, moving average)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def begin_batch(self, *, watermark_ms: int | None, now_ms: int) -> None:
        """A new batch runs under ``watermark_ms`` (None: not known yet) at processing time ``now_ms``."""
        self._batch += 1
        if watermark_ms is not None and self._wm is not None and watermark_ms > self._wm:
            self._advance = _avg(self._advance, watermark_ms - self._wm)
        if self._now is not None and now_ms > self._now:
            self._interval = _avg(self._interval, now_ms - self._now)
        if watermark_ms is not None:
            self._wm = watermark_ms if self._wm is None else max(self._wm, watermark_ms)
        self._now = now_ms

    def lookup(self, key: str) -> Any:
        """The cached row of ``key`` (``None``: it has none) or :data:`MISS`; counts the access."""
        st = self.stats
        st.lookups += 1
        if (e := self._entries.get(key)) is None:
            st.misses += 1
            return MISS
        st.hits += 1
        if self._batch > e.last:
            gap = self._batch - e.last
            e.gap = gap if e.gap is None else _ALPHA * gap + (1 - _ALPHA) * e.gap
            e.last = self._batch
        self._seq += 1
        e.seq = self._seq
        return e.row

    def put(self, key: str, row: Any, *, next_event_ms: int | None, next_processing_ms: int | None) -> None:
        """Cache ``row`` (``None``: the key has no row) with the key's next timers."""
        if (e := self._entries.get(key)) is None:
            self._seq += 1
            self._entries[key] = _Entry(row, next_event_ms, next_processing_ms, self._batch, self._seq)
            return
        e.row, e.next_ev, e.next_proc = row, next_event_ms, next_processing_ms

    def end_batch(self) -> int:
        """Trim to ``capacity`` rows by the policy; returns how many were evicted."""
        over = len(self._entries) - self.capacity
        if over <= 0:
            return 0
        items = self._entries.items()
        if self.policy == "lru":
            victims = heapq.nsmallest(over, items, key=lambda kv: kv[1].seq)
        else:
            rank = self._rank
            victims = heapq.nlargest(over, items, key=lambda kv: rank(kv[1]))
        for k, _e in victims:
            del self._entries[k]
        self.stats.evictions += over
        return over

    def _rank(self, e: _Entry) -> tuple[float, int]:
        b = self._batch
        best = _NEVER
        if e.next_ev is not None and self._wm is not None:
            adv = self._advance or DEFAULT_ADVANCE_MS
            best = b + max(1.0, math.ceil((e.next_ev - self._wm) / adv))
        if e.next_proc is not None and self._now is not None:
            per = self._interval or DEFAULT_ADVANCE_MS
            best = min(best, b + max(1.0, math.ceil((e.next_proc - self._now) / per)))
        if e.gap is not None:
            nxt = e.last + e.gap
            best = min(best, nxt if nxt > b else b + e.gap)  # overdue: as likely as ever from now on
        return (best, -e.seq)  # nlargest: furthest first, then least recently used


def _avg(old: float | None, new: float) -> float:
    return float(new) if old is None else _ALPHA * new + (1 - _ALPHA) * old

