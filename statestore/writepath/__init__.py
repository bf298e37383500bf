"""The write-path contract: how one computation's batches reach the rows table and the streams.

Every write of the rows table and of the stream tables (productions, dead letters, late data)
is made by code in this package. A *write path* is one way of making those writes; the
executor runs the per-batch protocol (DESIGN, "The per-batch protocol") once and calls a write
path at the steps that touch storage:

- on lease acquisition, :meth:`WritePath.acquire` (take, fence, recover, redeliver);
- step 3, the tasks load the owned intervals' rows through the path's view of them
  (:meth:`WritePath.load` refreshes that view after :class:`StaleViewError`);
- step 5, :meth:`WritePath.commit` lands the batch's new rows in one fenced transaction;
- step 6, :meth:`WritePath.deliver` gives the batch's productions to their streams.

Dead letters and late records go to their tables through :mod:`.delivery` on every path
(insert if absent: idempotent, whatever the path).

Two implementations, a folder each: :class:`~.image.path.ImagePath` (``image/``: each task turns
an interval's current file into a new one, with the writers of ``image/files.py``; the driver
commits all of them in one Delta transaction; local and ``s3a://`` stores) and
:class:`~.merge.path.MergePath` (``merge/``: a fenced MERGE per batch; any store). A new path
implements the five methods below and passes ``tests/test_writepath_contract.py``.

What every method guarantees is written on it. In short: a write never lands for a writer
that has been taken over (it fails with :class:`StaleSequencerError` or
:class:`LeaseLostError`, it never skips silently); delivering the same batch twice, or
redelivering after a crash, adds no stream record twice; a crash at any point followed by
:meth:`WritePath.acquire` on a new writer yields the rows and stream records of a run
without the crash.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Generic, Mapping, Sequence, TypeVar

from ..exceptions import StaleViewError

__all__ = ["WritePath", "Recovered", "StaleViewError"]

BatchT = TypeVar("BatchT")


@dataclass(frozen=True)
class Recovered:
    """What :meth:`WritePath.acquire` found and did.

    ``appended``: checkpointed productions delivered as their commit's own delivery;
    ``merged``: checkpointed productions given to insert-if-absent (those already in their
    stream added nothing)."""

    appended: int
    merged: int


class WritePath(ABC, Generic[BatchT]):
    """One way to write a computation's rows and productions. ``BatchT``: the batch's new rows
    and productions as this path's tasks return them (opaque to the executor)."""

    #: deliveries of committed productions may run in the background while the next batch
    #: runs (the executor settles them before the next commit); False: step 6 returns once
    #: the productions are in their streams
    deliver_in_background: bool = False

    #: the input files of the batch being run (set by the executor before step 3 when instances
    #: share the computation's intervals): the commit adds them, in the same transaction, to the
    #: set of committed input files in the fence row of each interval it writes
    #: (``rowtable/inputfiles.py``); empty: the sets are left as they are
    input_files: Sequence[str] = ()

    @abstractmethod
    def acquire(self, intervals: Sequence[int] | None, *, wait_s: float = 0.0) -> Recovered:
        """Take the intervals' leases, fence them and recover (MillWheel's recovery scan).

        Must guarantee: once this returns, no earlier owner of the intervals can commit rows
        or strong deliveries (its sequencers are stale); every production checkpointed in the
        rows and not yet in its stream is in it now (delivered exactly once: a repeated
        recovery adds nothing); the path's view of the rows (:meth:`load`) is current.

        Raises:
            StaleSequencerError: an even newer owner fenced an interval (nothing is held).
            LeaseHeldError: another live instance holds an interval (after ``wait_s``).
        """

    @abstractmethod
    def load(self) -> None:
        """Refresh the view of the owned intervals' rows the tasks load (after
        :class:`StaleViewError`).

        Must guarantee: raises :class:`StaleSequencerError` if a newer owner fenced an owned
        interval (never refreshes over a takeover); afterwards a batch reads the rows of
        the newest commit."""

    @abstractmethod
    def commit(self, batch: BatchT, *, commit_id: str, meta: Mapping[str, Any]) -> bool:
        """Step 5: the batch's new rows (their productions checkpointed in them when strong)
        in one Delta transaction, fenced by this writer's sequencers. Returns whether
        anything was committed (False: the batch changed no row).

        Must guarantee: all or nothing; a writer taken over (a newer fence) or whose lease is
        lost fails with :class:`StaleSequencerError` / :class:`LeaseLostError` and commits
        nothing, never skips silently; a concurrent change of the partitions that is no
        takeover raises :class:`StaleViewError`; ``commit_id`` and ``meta`` are recorded in
        the commit's metadata."""

    @abstractmethod
    def deliver(self, batch: BatchT, *, strong: bool) -> int:
        """Step 6: give the batch's productions to their stream tables; returns how many were
        given.

        ``strong``: the batch was committed with its productions checkpointed; the delivery
        must be idempotent (delivering the batch again, or a recovery redelivering its
        checkpoint, adds nothing) and must not land for a writer taken over since its commit
        (:class:`StaleSequencerError`). Not ``strong`` (weak productions, before the commit):
        a plain append; consumers deduplicate by record id."""

    @abstractmethod
    def oldest_work(self) -> Mapping[int, int | None]:
        """Per owned interval, its oldest pending work in the committed rows (event-time
        timers, watermark holds; None: none). Undelivered productions are held by the
        executor."""

    def next_processing(self) -> Mapping[int, int | None] | None:
        """Per owned interval, its earliest processing-time timer in the committed rows; None:
        this path does not track them (a timers-only batch then always runs)."""
        return None

    def streams_ready(self) -> None:
        """Wait until the tables of the computation's output streams exist (a path may have
        :meth:`acquire` return while they are still being made, and wait for them where one is
        first needed).

        Must guarantee: once this returns, every output stream's table exists; a table that
        cannot be made raises :class:`ConfigError` (nothing was delivered to it)."""
