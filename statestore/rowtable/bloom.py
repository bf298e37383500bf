"""Bloom filters over the record ids a key interval has seen, in memory only: the dedup fast path."""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

from pybloom_live import ScalableBloomFilter

__all__ = ["IntervalBloom", "IdBloom"]


@functools.cache
def _bit_values() -> Any:
    import numpy as np

    return np.array([1 << j for j in range(8)], dtype=np.uint8)


class IntervalBloom:
    """A scalable Bloom filter of record ids (grows as ids are added).

    >>> b = IntervalBloom(); b.add("r1"); b.might_contain("r1"), b.might_contain("r2")
    (True, False)
    """

    def __init__(self, *, initial_capacity: int = 10_000, error_rate: float = 0.001) -> None:
        self._bf = ScalableBloomFilter(initial_capacity=initial_capacity, error_rate=error_rate,
                                       mode=ScalableBloomFilter.LARGE_SET_GROWTH)

    def add(self, record_id: str) -> None:
        """Add ``record_id``."""
        self._bf.add(record_id)

    def might_contain(self, record_id: str) -> bool:
        """False: ``record_id`` was never added (certain); True: it may have been."""
        return record_id in self._bf


class IdBloom:
    """A fixed-size Bloom filter of record ids, added and checked many at a time (numpy).

    Bits come from the caller's hashes or Python's ``hash`` (salted per process: never persist or ship
    a filter); ``error_rate``: the false-positive rate at ``capacity`` ids.

    >>> b = IdBloom(100); b.add_many(["r1", "r2"])
    >>> b.might_contain_many(["r1", "r3"]).tolist()
    [True, False]
    """

    def __init__(self, capacity: int, *, error_rate: float = 0.01) -> None:
        import numpy as np

        self.capacity = n = max(int(capacity), 1)
        self.m = m = max(64, int(math.ceil(-n * math.log(error_rate) / (math.log(2) ** 2))))
        self.error_rate = error_rate
        self.k = max(1, round(m / n * math.log(2)))
        self.count = 0
        self._bits = np.zeros((m + 7) // 8, dtype=np.uint8)

    @property
    def nbytes(self) -> int:
        """Memory of the bit array."""
        return int(self._bits.nbytes)

    def full(self) -> bool:
        """More ids than it was sized for (its false-positive rate is above ``error_rate``)."""
        return self.count > self.capacity

    def copy(self) -> "IdBloom":
        """An independent copy (its own bit array)."""
        new = object.__new__(IdBloom)
        new.__dict__.update(self.__dict__)
        new._bits = self._bits.copy()
        return new

    @staticmethod
    def hashes(ids: Sequence[str]) -> Any:
        """The ids' hashes (a numpy uint64 array), for ``hashes=`` when several calls see the same ids."""
        import numpy as np

        return np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids)).view(np.uint64)

    def _positions(self, ids: Sequence[str], hashes: Any = None) -> Any:
        """The ``k`` bit positions of each id, shape ``(len(ids), k)``."""
        return self._probes(ids, hashes).T

    def _probes(self, ids: Sequence[str], hashes: Any = None) -> Any:
        """The ``k`` bit positions of each id, shape ``(k, len(ids))``: ``(h1 + i * h2) % m``."""
        import numpy as np

        h = self.hashes(ids) if hashes is None else hashes
        m = self.m
        dt = np.int32 if 2 * m < 2**31 else np.int64
        pos = np.empty((self.k, len(h)), dtype=dt)
        pos[0] = (h & np.uint64(0xFFFFFFFF)) % np.uint64(m)
        step = (((h >> np.uint64(32)) | np.uint64(1)) % np.uint64(m)).astype(dt)
        for i in range(1, self.k):
            p = pos[i]
            np.add(pos[i - 1], step, out=p)
            p -= m * (p >= m)
        return pos

    def add_many(self, ids: Sequence[str], *, hashes: Any = None) -> None:
        """Add ``ids`` (each counts towards ``capacity``); ``hashes``: their :meth:`hashes`, if known."""
        import numpy as np

        if not len(ids):
            return
        pos = self._probes(ids, hashes).ravel()
        if len(pos) * 32 > self.m:  # many ids (a filter built from an image): a byte per bit, then packed
            flags = np.zeros(8 * len(self._bits), dtype=bool)
            flags[pos] = True
            self._bits |= np.packbits(flags, bitorder="little")
        else:  # a batch's ids: ``ufunc.at`` costs per id, not per bit of the filter
            np.bitwise_or.at(self._bits, pos >> 3, _bit_values()[pos & 7])
        self.count += len(ids)

    def might_contain_many(self, ids: Sequence[str], *, hashes: Any = None) -> Any:
        """Per id: False = never added (certain); True = maybe added."""
        import numpy as np

        if not len(ids):
            return np.zeros(0, dtype=bool)
        # probe by probe, each over the ids whose earlier probes all hit
        h = self.hashes(ids) if hashes is None else hashes
        h1 = h & np.uint64(0xFFFFFFFF)
        h2 = (h >> np.uint64(32)) | np.uint64(1)
        m = np.uint64(self.m)
        live = np.arange(len(ids))
        for i in range(self.k):
            pos = (h1 + np.uint64(i) * h2) % m
            hit = ((self._bits[(pos >> np.uint64(3)).astype(np.int64)] >> (pos & np.uint64(7)).astype(np.uint8))
                   & 1).astype(bool)
            if not hit.all():
                live, h1, h2 = live[hit], h1[hit], h2[hit]
                if not len(live):
                    break
        out = np.zeros(len(ids), dtype=bool)
        out[live] = True
        return out
