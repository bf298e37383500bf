"""Ownership of a computation's key intervals: lease → fence → recovery scan → fenced commits.

:class:`IntervalOwner` is what a job instance holds per computation. Taking
intervals follows MillWheel's order strictly:

1. acquire the ZooKeeper leases (each grant carries a new sequencer);
2. *fence*: commit the new sequencers into the intervals' fence rows, which
   invalidates any older owner's commits from now on (``rowtable/fencing.py``);
3. only then read: the recovery scan rebuilds the Bloom filters, the timer
   heap and the pending productions (``rowtable/recovery.py``).

Every commit afterwards -- a write path's (``writepath/``), with :meth:`IntervalOwner.check`
as its lease check -- checks the leases locally first (a suspended or lost ZooKeeper session
stops it before any I/O) and is fenced in Delta anyway, so a lease lost between the check and
the commit still cannot let a stale write land.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from kazoo.exceptions import NoNodeError

from ..exceptions import CoordinatorStateLostError, LeaseLostError
from ..rowtable.recovery import RecoveredIntervals, rebuild, recover
from ..rowtable.store import RowStore
from ..zk.binding import bind_store, store_path
from ..zk.grants import LeaseGrant
from ..zk.lease_tools import next_sequencers
from ..zk.leases import LeaseManager

__all__ = ["IntervalOwner"]


class IntervalOwner:
    """Holds some key intervals of one computation: the leases, their sequencers, the fence.

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
        self._bound = False
        # called once ZooKeeper granted the leases of an acquire, before the fence (a caller that
        # starts in the background waits for it before anything the leases guard, e.g. a query)
        self.on_granted: Callable[[], None] | None = None

    @property
    def sequencers(self) -> dict[int, int]:
        """The sequencer of each interval held: ``{interval: sequencer}``."""
        return {iv: g.sequencer for iv, g in self._grants.items()}

    @property
    def intervals(self) -> tuple[int, ...]:
        """The intervals held, in order."""
        return tuple(sorted(self._grants))

    def acquire(self, intervals: Iterable[int] | None = None, *, wait_s: float = 0.0, claim_only: bool = False,
                scan: bool = True, check_fences: bool = True) -> RecoveredIntervals:
        """Take ``intervals`` (default: all), fence them, and return the recovery scan.

        ``claim_only``, ``check_fences``: see :meth:`RowStore.fence` (``check``). ``scan=False`` skips the recovery scan (an
        empty result): for writers that recover from what they load anyway (the image path).

        Raises:
            LeaseHeldError: another live instance holds one of them (after ``wait_s``).
            StaleSequencerError: an even newer owner fenced an interval meanwhile.
            StoreMismatchError: the pipeline's ZooKeeper state belongs to another store.
            CoordinatorStateLostError: ZooKeeper lost the pipeline's state (the store holds sequencers
                it does not know); nothing was fenced, the leases are given back.
        """
        ivs = sorted(set(range(self.num_intervals) if intervals is None else intervals))
        unbound_fences: dict[int, int] | None = None
        if not self._bound:  # the pipeline's ZooKeeper state must be this store's (binding.py)
            unbound_fences = self._bind()
        before = self.leases.held(self.computation)
        grants = self.leases.acquire(self.computation, ivs, wait_s=wait_s)
        if self.on_granted is not None:
            self.on_granted()
        try:
            self._check_coordinator(grants, before=before, unbound_fences=unbound_fences)
            self.store.fence(self.computation, {iv: g.sequencer for iv, g in grants.items()}, claim_only=claim_only,
                             check=check_fences)
        except BaseException:
            self.leases.release(self.computation, ivs)
            raise
        self._grants.update(grants)
        return recover(self.store, self.computation, ivs) if scan else rebuild(self.computation, ivs, ())

    def _bind(self) -> dict[int, int] | None:
        """Record this store as the pipeline's in ZooKeeper (or check it is the one recorded).

        Returns, when this call had to create the binding, the computation's fence rows as they
        were before it existed (read before creating it: rows another copy fences later, under
        this binding, are not evidence of lost state); None when the binding was there."""
        client, pipeline = self.leases.zk_client, self.leases.pipeline
        before = None if client.exists(store_path(pipeline)) else self.store.fences(self.computation)
        fresh = bind_store(client, pipeline, table_id=self.store.table_id(), root=self.store.layout.root)
        self._bound = True
        if not fresh:
            return None
        # the binding was there when checked but gone when created (a refused start deleted it):
        # read now, which can only over-report (a refusal, never a missed loss)
        return before if before is not None else self.store.fences(self.computation)

    def _check_coordinator(self, grants: Mapping[int, LeaseGrant], *, before: Mapping[int, LeaseGrant],
                           unbound_fences: dict[int, int] | None) -> None:
        """Refuse to fence when ZooKeeper has forgotten grants the store was written under.

        A grant made by this call carries a sequencer ZooKeeper never issued before; a fence row
        holding the same or a greater one that ZooKeeper does not account for (at or above its
        next sequencer) was written under a grant it lost. So is a store that held fence rows
        before this owner had to create the pipeline's binding (``unbound_fences``; rows another
        copy fenced since, under that binding, do not count). Either way ZooKeeper's data was lost
        (wiped, or restored from an older copy).

        Raises:
            CoordinatorStateLostError: with what was found and the recovery command.
        """
        new = {iv: g for iv, g in grants.items() if before.get(iv) != g}
        if not new and not unbound_fences:
            return
        fences = self.store.fences(self.computation)
        if not fences and not unbound_fences:
            return
        pipeline = self.leases.pipeline
        found: list[str] = []
        if unbound_fences:
            found.append(f"ZooKeeper had no record of the pipeline's store (/pipelines/{pipeline}/store) although "
                         f"the store holds fence rows of {self.computation!r} up to sequencer "
                         f"{max(unbound_fences.values())}")
        ahead = {iv: g for iv, g in new.items() if fences.get(iv, -1) >= g.sequencer}
        if ahead:
            nxt = next_sequencers(self.leases.zk_client, pipeline=pipeline, computation=self.computation,
                                  intervals=ahead)
            for iv, g in sorted(ahead.items()):
                if fences[iv] == g.sequencer or fences[iv] >= nxt[iv]:
                    found.append(f"interval {iv}: the store's fence carries sequencer {fences[iv]}, ZooKeeper "
                                 f"just granted {g.sequencer} and knows no grant above {nxt[iv] - 1}")
        if found:
            if unbound_fences is not None:  # this owner created the binding: not ours to keep: the next start must see the missing binding again
                try:
                    self.leases.zk_client.delete(store_path(pipeline))
                except NoNodeError:
                    pass  # another refused start deleted it already
                self._bound = False
            raise CoordinatorStateLostError(
                f"ZooKeeper lost the coordination state of pipeline {pipeline!r} (wiped, or restored from an "
                f"older copy): {'; '.join(found[:4])}{' ...' if len(found) > 4 else ''}. Nothing was written: "
                "writing on would reuse sequencers the store already holds, so a stale writer could not be "
                "fenced out. Stop every running copy of the pipeline, then run `deltawheel reseed --store "
                f"{self.store.layout.root} --pipeline {pipeline} --apply` (it re-seeds ZooKeeper's sequencers "
                "above the store's and records the binding; see docs/coordinator-recovery.md) and start the "
                "pipeline again.")

    def check(self) -> None:
        """Raise if any held lease is lost (LeaseLostError); *pause* while they are in doubt.

        While the ZooKeeper connection is SUSPENDED no lease can be trusted, so nothing may be
        committed; a blip, or an ensemble that lost its quorum and regained it, ends with the same
        session and the leases re-verified, and the caller goes on. This waits for that with log
        lines (:meth:`LeaseManager.await_valid`) and raises LeaseSuspendedError only after the
        manager's ``max_pause_s``, LeaseLostError when the session expired meanwhile (the leases
        are gone: the cause is named in the message).
        """
        if not self._grants:
            raise LeaseLostError(f"no intervals of {self.computation!r} are held; acquire them first")
        self.leases.await_valid(self.computation, self._grants)

    def release(self) -> None:
        """Give the intervals back (a clean shutdown); a later owner gets higher sequencers."""
        if self._grants:
            self.leases.release(self.computation, list(self._grants))
        self._grants.clear()
