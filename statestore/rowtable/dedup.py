"""Exactly-once input: drop records whose id a key has already processed.

The Bloom filter of the key's interval answers first. "Never seen" is
certain and costs nothing; "maybe seen" is confirmed against the record ids
stored in the key's row (from ``known_rows`` when the caller already has
them, else one batched storage lookup for all such keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

from .bloom import IntervalBloom
from .rows import KeyRow, interval_of
from .store import RowStore

__all__ = ["Deduplicator", "DedupResult"]


@dataclass(frozen=True)
class DedupResult:
    """Which (key, record_id) pairs are new, which are duplicates, and what it cost."""

    new: tuple[tuple[str, str], ...]
    duplicates: tuple[tuple[str, str], ...]
    bloom_negatives: int
    bloom_false_positives: int
    keys_looked_up: int


class Deduplicator:
    """Dedup for the owned intervals of one computation.

    Args:
        store: where confirmations are looked up.
        blooms: interval -> filter (built by the recovery scan on acquisition).
        read: how rows are read for a confirmation (default: the store; ``IntervalOwner.read``
            answers from its cache first).
    """

    def __init__(self, store: RowStore, computation: str, *, num_intervals: int,
                 blooms: Mapping[int, IntervalBloom],
                 read: Callable[[Iterable[str]], Mapping[str, KeyRow]] | None = None) -> None:
        self.store = store
        self.computation = computation
        self.num_intervals = num_intervals
        self.blooms = dict(blooms)
        self._read = read or (lambda keys: store.read_keys(computation, keys, num_intervals=num_intervals))

    def split(self, items: Sequence[tuple[str, str]], *, known_rows: Mapping[str, KeyRow] | None = None) -> DedupResult:
        """Split ``(key, record_id)`` pairs into new ones and duplicates (also within ``items``)."""
        known = dict(known_rows or {})
        maybe: list[tuple[str, str]] = []
        verdict: dict[tuple[str, str], bool] = {}
        negatives = 0
        for key, rid in items:
            bloom = self._bloom(key)
            if bloom.might_contain(rid):
                maybe.append((key, rid))
            else:
                negatives += 1
                verdict[(key, rid)] = True
        lookup = sorted({k for k, _ in maybe if k not in known})
        if lookup:
            known.update(self._read(lookup))
        false_pos = 0
        for key, rid in maybe:
            row = known.get(key)
            seen = row is not None and any(s.record_id == rid for s in row.record_ids)
            verdict[(key, rid)] = not seen
            false_pos += int(not seen)
        new: list[tuple[str, str]] = []
        dups: list[tuple[str, str]] = []
        taken: set[tuple[str, str]] = set()
        for item in items:
            if verdict[item] and item not in taken:
                new.append(item)
                taken.add(item)
            else:
                dups.append(item)
        return DedupResult(tuple(new), tuple(dups), negatives, false_pos, len(lookup))

    def remember(self, items: Sequence[tuple[str, str]]) -> None:
        """Add committed ids to the filters (call after the commit succeeded)."""
        for key, rid in items:
            self._bloom(key).add(rid)

    def _bloom(self, key: str) -> IntervalBloom:
        iv = interval_of(key, self.num_intervals)
        if iv not in self.blooms:
            self.blooms[iv] = IntervalBloom()
        return self.blooms[iv]
