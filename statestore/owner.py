"""Ownership of a computation's key intervals: lease → fence → recovery scan → fenced commits.

:class:`IntervalOwner` is what a job instance holds per computation. Taking
intervals follows MillWheel's order strictly:

1. acquire the ZooKeeper leases (each grant carries a new sequencer);
2. *fence*: commit the new sequencers into the intervals' fence rows, which
   invalidates any older owner's commits from now on (``fencing.py``);
3. only then read: the recovery scan rebuilds the Bloom filters, the timer
   heap and the pending productions (``recovery.py``).

Every commit afterwards checks the leases locally first (a suspended or lost
ZooKeeper session stops it before any I/O) and is fenced in Delta anyway, so
a lease lost between the check and the commit still cannot let a stale
write land.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .exceptions import LeaseLostError, StaleSequencerError
from .leases import LeaseGrant, LeaseManager
from .recovery import RecoveredIntervals, rebuild, recover
from .rows import KeyRow
from .store import CommitResult, RowStore

__all__ = ["IntervalOwner"]


class IntervalOwner:
    """Holds some key intervals of one computation and writes their rows.

    Args:
        store: the rows table.
        leases: this job instance's lease manager.
        computation: the computation's name.
        num_intervals: how many intervals its key space is divided into.
    """

    def __init__(self, store: RowStore, leases: LeaseManager, computation: str, *, num_intervals: int) -> None:
        self.store = store
        self.leases = leases
        self.computation = computation
        self.num_intervals = num_intervals
        self._grants: dict[int, LeaseGrant] = {}

    @property
    def sequencers(self) -> dict[int, int]:
        return {iv: g.sequencer for iv, g in self._grants.items()}

    @property
    def intervals(self) -> tuple[int, ...]:
        return tuple(sorted(self._grants))

    def acquire(self, intervals: Iterable[int] | None = None, *, wait_s: float = 0.0, claim_only: bool = False,
                scan: bool = True, check_fences: bool = True) -> RecoveredIntervals:
        """Take ``intervals`` (default: all), fence them, and return the recovery scan.

        ``claim_only``, ``check_fences``: see :meth:`RowStore.fence` (``check``). ``scan=False`` skips the recovery scan (an
        empty result): for writers that recover from what they load anyway (the image path).

        Raises:
            LeaseHeldError: another live instance holds one of them (after ``wait_s``).
            StaleSequencerError: an even newer owner fenced an interval meanwhile.
        """
        ivs = sorted(set(range(self.num_intervals) if intervals is None else intervals))
        grants = self.leases.acquire(self.computation, ivs, wait_s=wait_s)
        try:
            self.store.fence(self.computation, {iv: g.sequencer for iv, g in grants.items()}, claim_only=claim_only,
                             check=check_fences)
        except BaseException:
            self.leases.release(self.computation, ivs)
            raise
        self._grants.update(grants)
        return recover(self.store, self.computation, ivs) if scan else rebuild(self.computation, ivs, ())

    def check(self) -> None:
        """Raise if any held lease is lost or in doubt (LeaseLostError / LeaseSuspendedError)."""
        if not self._grants:
            raise LeaseLostError(f"no intervals of {self.computation!r} are held; acquire them first")
        for iv in self._grants:
            self.leases.check_valid(self.computation, iv)

    def commit(self, rows: Sequence[KeyRow], *, deletes: Sequence[tuple[int, str]] = (),
               commit_id: str | None = None, dry_run: bool = False) -> CommitResult:
        """One fenced, atomic commit of ``rows`` under the held sequencers.

        On :class:`StaleSequencerError` the grants are dropped (they are worthless
        now) and the error propagates: the caller must not deliver anything.
        """
        try:
            return self.store.commit(self.computation, rows, sequencers=self.sequencers, deletes=deletes,
                                     num_intervals=self.num_intervals, commit_id=commit_id,
                                     lease_check=self.check, dry_run=dry_run)
        except StaleSequencerError:
            self._grants.clear()
            raise

    def release(self) -> None:
        """Give the intervals back (a clean shutdown); a later owner gets higher sequencers."""
        if self._grants:
            self.leases.release(self.computation, list(self._grants))
        self._grants.clear()
