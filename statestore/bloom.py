"""Bloom filters over the record ids a key interval has seen: the dedup fast path.

A filter answers "never seen" with certainty and "maybe seen" with a small
false-positive rate; only a "maybe" costs a storage lookup (see ``dedup.py``).
Filters live in memory only: they are rebuilt from the rows on lease
acquisition (``recovery.py``), never persisted, so they can never disagree
with the table for long.
"""

from __future__ import annotations

from typing import Iterable

from pybloom_live import ScalableBloomFilter

__all__ = ["IntervalBloom"]


class IntervalBloom:
    """A scalable Bloom filter of record ids (grows as ids are added).

    >>> b = IntervalBloom(); b.add("r1"); b.might_contain("r1"), b.might_contain("r2")
    (True, False)
    """

    def __init__(self, ids: Iterable[str] = (), *, initial_capacity: int = 10_000, error_rate: float = 0.001) -> None:
        self._bf = ScalableBloomFilter(initial_capacity=initial_capacity, error_rate=error_rate,
                                       mode=ScalableBloomFilter.LARGE_SET_GROWTH)
        self._n = 0
        for rid in ids:
            self.add(rid)

    def add(self, record_id: str) -> None:
        if not self._bf.add(record_id):
            self._n += 1

    def might_contain(self, record_id: str) -> bool:
        return record_id in self._bf

    def __len__(self) -> int:
        return self._n
