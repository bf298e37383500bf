"""The write-path contract: how one computation's batches reach the rows table and the streams.

Every write of the rows and stream tables is made in this package, at the steps of the per-batch
protocol (DESIGN, "The per-batch protocol") that touch storage. Implementations:
:class:`~.image.path.ImagePath` (local and ``s3a://``) and :class:`~.merge.path.MergePath` (any store).
A new path passes ``tests/test_writepath_contract.py``: a write never lands for a writer taken over
(it fails typed, never skips); a repeated delivery adds no stream record twice; a crash followed by
:meth:`WritePath.acquire` on a new writer yields what a run without the crash would."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Generic, Mapping, Sequence, TypeVar

from ..exceptions import StaleViewError

__all__ = ["WritePath", "Recovered", "StaleViewError"]

BatchT = TypeVar("BatchT")


@dataclass(frozen=True)
class Recovered:
    """Checkpoints :meth:`WritePath.acquire` delivered as their commit's own, or by insert-if-absent."""

    appended: int
    merged: int


class WritePath(ABC, Generic[BatchT]):
    """One way to write a computation's rows and productions (``BatchT``: opaque to the executor)."""

    #: deliveries may run in the background while the next batch runs (settled before its commit)
    deliver_in_background: bool = False

    #: the batch's input files (set before step 3 when instances share intervals): the commit adds
    #: them to each written interval's fence-row set (``rowtable/inputfiles.py``); empty: unchanged
    input_files: Sequence[str] = ()

    @abstractmethod
    def acquire(self, intervals: Sequence[int] | None, *, wait_s: float = 0.0) -> Recovered:
        """Take the intervals' leases, fence them and recover (MillWheel's recovery scan).

        Must guarantee: afterwards no earlier owner can commit rows or strong deliveries; every
        checkpointed production not yet in its stream is in it (exactly once); :meth:`load`'s view is current.

        Raises:
            StaleSequencerError: an even newer owner fenced an interval (nothing is held).
            LeaseHeldError: another live instance holds an interval (after ``wait_s``).
        """

    @abstractmethod
    def load(self) -> None:
        """Refresh the tasks' view of the owned rows (after :class:`StaleViewError`).

        Must guarantee: raises :class:`StaleSequencerError` over a takeover; afterwards a batch
        reads the rows of the newest commit."""

    @abstractmethod
    def commit(self, batch: BatchT, *, commit_id: str, meta: Mapping[str, Any]) -> bool:
        """Step 5: the batch's new rows in one Delta transaction, fenced; returns whether anything landed.

        Must guarantee: all or nothing; a writer taken over or whose lease is lost fails with
        :class:`StaleSequencerError` / :class:`LeaseLostError`; a concurrent change that is no
        takeover raises :class:`StaleViewError`; ``commit_id`` and ``meta`` go into the metadata."""

    @abstractmethod
    def deliver(self, batch: BatchT, *, strong: bool) -> int:
        """Step 6: give the batch's productions to their stream tables; returns how many.

        ``strong``: idempotent (a repeat or a recovery's redelivery adds nothing) and never lands
        for a writer taken over since its commit (:class:`StaleSequencerError`). Else a plain
        append; consumers deduplicate by record id."""

    @abstractmethod
    def oldest_work(self) -> Mapping[int, int | None]:
        """Per owned interval, its oldest pending work in the committed rows (None: none)."""

    def next_processing(self) -> Mapping[int, int | None] | None:
        """Per owned interval, its earliest processing-time timer; None: not tracked by this path."""
        return None

    def streams_ready(self) -> None:
        """Wait until every output stream's table exists; :class:`ConfigError` if one cannot be made."""
