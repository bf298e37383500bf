"""Ownership of a computation's key intervals in MillWheel's order: acquire the ZooKeeper leases
(each grant a new sequencer), *fence* (commit the sequencers into the intervals' fence rows,
``rowtable/fencing.py``), only then read (the recovery scan, ``rowtable/recovery.py``), then commit."""

from __future__ import annotations

import time
from contextlib import suppress
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
    """Holds some key intervals of one computation: the leases, their sequencers, the fence."""

    def __init__(self, store: RowStore, leases: LeaseManager, computation: str, *, num_intervals: int) -> None:
        self.store = store
        self.leases = leases
        self.computation = computation
        self.num_intervals = num_intervals
        self._grants: dict[int, LeaseGrant] = {}
        self._bound = False
        self.acquire_s: dict[str, float] = {}  # the last acquire's seconds: leases, coordinator check, fence
        # called once ZooKeeper granted the leases of an acquire, before the fence
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

        ``claim_only``, ``check_fences``: see :meth:`RowStore.fence`. ``scan=False``: an empty result.

        Raises:
            LeaseHeldError: another live instance holds one of them (after ``wait_s``).
            StaleSequencerError: an even newer owner fenced an interval meanwhile.
            StoreMismatchError: the pipeline's ZooKeeper state belongs to another store.
            CoordinatorStateLostError: ZooKeeper lost the pipeline's state; nothing was fenced.
        """
        ivs = sorted(set(range(self.num_intervals) if intervals is None else intervals))
        t0 = time.monotonic()
        unbound_fences = None if self._bound else self._bind()
        before = self.leases.held(self.computation)
        grants = self.leases.acquire(self.computation, ivs, wait_s=wait_s)
        if self.on_granted is not None:
            self.on_granted()
        t1 = time.monotonic()
        try:
            self._check_coordinator(grants, before=before, unbound_fences=unbound_fences)
            t2 = time.monotonic()
            self.acquire_s = {"leases": round(t1 - t0, 3), "coordinator_check": round(t2 - t1, 3)}
            self.store.fence(self.computation, {iv: g.sequencer for iv, g in grants.items()}, claim_only=claim_only,
                             check=check_fences)
        except BaseException:
            self.leases.release(self.computation, ivs)
            raise
        self._grants.update(grants)
        self.acquire_s["fence"] = round(time.monotonic() - t2, 3)
        return recover(self.store, self.computation, ivs) if scan else rebuild(self.computation, ivs, ())

    def _bind(self) -> dict[int, int] | None:
        """Bind this store to the pipeline; the fence rows from before the binding if this call made it."""
        client, pipeline = self.leases.zk_client, self.leases.pipeline
        before = None if client.exists(store_path(pipeline)) else self.store.fences(self.computation)
        fresh = bind_store(client, pipeline, table_id=self.store.table_id(), root=self.store.layout.root)
        self._bound = True
        if not fresh:
            return None
        # deleted between the check and the create: read now (can only over-report)
        return before if before is not None else self.store.fences(self.computation)

    def _check_coordinator(self, grants: Mapping[int, LeaseGrant], *, before: Mapping[int, LeaseGrant],
                           unbound_fences: dict[int, int] | None) -> None:
        """Raise :class:`CoordinatorStateLostError` when ZooKeeper forgot grants: fence rows at or above a
        new grant's sequencer that it does not know of, or from before this owner bound the store."""
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
            if unbound_fences is not None:  # the binding this owner created is not ours to keep
                with suppress(NoNodeError):
                    self.leases.zk_client.delete(store_path(pipeline))
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
        """Raise LeaseLostError if a held lease is lost; *pause* while in doubt (``await_valid``)."""
        if not self._grants:
            raise LeaseLostError(f"no intervals of {self.computation!r} are held; acquire them first")
        self.leases.await_valid(self.computation, self._grants)

    def release(self) -> None:
        """Give the intervals back (a clean shutdown); a later owner gets higher sequencers."""
        if self._grants:
            self.leases.release(self.computation, list(self._grants))
        self._grants.clear()
