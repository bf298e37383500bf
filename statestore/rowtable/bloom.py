"""Bloom filters over the record ids a key interval has seen: the dedup fast path.

A filter answers "never seen" with certainty and "maybe seen" with a small
false-positive rate; only a "maybe" costs a lookup of the key's stored record ids.
Filters live in memory only: they are rebuilt from the rows, never persisted, so
they can never disagree with the table for long. :class:`IdBloom` (vectorized) is
the executor's image path's (``executor/tasks/image/``); :class:`IntervalBloom`
is the one the recovery scan rebuilds on lease acquisition (``recovery.py``,
``RecoveredIntervals.blooms``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterable, Sequence

from pybloom_live import ScalableBloomFilter

__all__ = ["IntervalBloom", "IdBloom"]


@functools.cache
def _bit_values() -> Any:
    """Per bit position within a byte (0-7), the byte with that bit set."""
    import numpy as np

    return np.array([1 << j for j in range(8)], dtype=np.uint8)


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
        """Add ``record_id`` (counted unless the filter already seemed to hold it)."""
        if not self._bf.add(record_id):
            self._n += 1

    def might_contain(self, record_id: str) -> bool:
        """False: ``record_id`` was never added (certain); True: it may have been."""
        return record_id in self._bf

    def __len__(self) -> int:
        return self._n


class IdBloom:
    """A fixed-size Bloom filter of record ids, added and checked many at a time (numpy).

    The executor's image path keeps one per interval image in each Python worker, next to the
    cached image (``executor/tasks/image/dedup.py``): a batch's records are checked against it first,
    and only when one of them *might* have been seen does the task look the ids up in the
    image's stored ids. Bit positions come from the hashes the caller passes (the image path's
    own hash of the id column's buffers, the same in every process:
    ``statestore/writepath/image/idhash.py``), or by default from Python's ``hash`` of each id (SipHash,
    salted per process); either way a filter is never persisted or shipped, and a worker without
    one (a new process, a lease just acquired) builds it from the ids it loads.

    Args:
        capacity: the number of ids it is sized for (at ``error_rate``); more can be added, at a
            growing false-positive rate (see :meth:`full`).
        error_rate: the false-positive rate at ``capacity`` ids.

    >>> b = IdBloom(100); b.add_many(["r1", "r2"])
    >>> b.might_contain_many(["r1", "r3"]).tolist()
    [True, False]
    """

    def __init__(self, capacity: int, *, error_rate: float = 0.01) -> None:
        import numpy as np

        n = max(int(capacity), 1)
        m = max(64, int(math.ceil(-n * math.log(error_rate) / (math.log(2) ** 2))))
        self.capacity = n
        self.error_rate = error_rate
        self.m = m
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
        """The ids' hashes (a numpy uint64 array): computed once, given to :meth:`add_many` and
        :meth:`might_contain_many` when both see the same ids."""
        import numpy as np

        return np.fromiter(map(hash, ids), dtype=np.int64, count=len(ids)).view(np.uint64)

    def _positions(self, ids: Sequence[str], hashes: Any = None) -> Any:
        """The ``k`` bit positions of each id (shape ``(len(ids), k)``, a view of :meth:`_probes`)."""
        return self._probes(ids, hashes).T

    def _probes(self, ids: Sequence[str], hashes: Any = None) -> Any:
        """The ``k`` bit positions of each id, probe by probe (shape ``(k, len(ids))``): probe ``i``
        is ``(h1 + i * h2) % m`` (``h1``, ``h2``: the hash's halves, ``h2`` odd), each probe from the
        one before by one addition and one conditional subtraction (no 64-bit modulo per probe;
        int32 when ``2 * m`` fits, halving the memory the adds walk)."""
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
        """Add ``ids`` (each counts towards ``capacity``, repeats included); ``hashes``: their
        :meth:`hashes`, when already computed."""
        import numpy as np

        if not len(ids):
            return
        pos = self._probes(ids, hashes).ravel()
        np.bitwise_or.at(self._bits, pos >> 3, _bit_values()[pos & 7])
        self.count += len(ids)

    def might_contain_many(self, ids: Sequence[str], *, hashes: Any = None) -> Any:
        """Per id: False = never added (certain); True = maybe added. ``hashes``: their
        :meth:`hashes`, when already computed."""
        import numpy as np

        if not len(ids):
            return np.zeros(0, dtype=bool)
        # probe by probe, each over the ids whose earlier probes all hit: a new id (the usual
        # case) is nearly always rejected by its first probe, so most of the k probes are never
        # computed (the positions are :meth:`_positions`', column by column)
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
