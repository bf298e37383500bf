"""The write-path contract: how one computation's batches reach the rows table and the streams."""

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
    steps_s: tuple[tuple[str, float], ...] = ()  # seconds per step of the acquisition, in order


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

        Raises:
            StaleSequencerError: an even newer owner fenced an interval (nothing is held).
            LeaseHeldError: another live instance holds an interval (after ``wait_s``).
        """

    @abstractmethod
    def load(self) -> None:
        """Read the owned rows again after :class:`StaleViewError`; StaleSequencerError over a takeover."""

    @abstractmethod
    def commit(self, batch: BatchT, *, commit_id: str, meta: Mapping[str, Any]) -> bool:
        """Step 5: the batch's new rows in one fenced Delta transaction; returns whether anything landed."""

    @abstractmethod
    def deliver(self, batch: BatchT, *, strong: bool) -> int:
        """Step 6: give the batch's productions to their stream tables; returns how many.
        ``strong``: idempotent and never for a writer taken over since its commit; else a plain append."""

    @abstractmethod
    def oldest_work(self) -> Mapping[int, int | None]:
        """Per owned interval, its oldest pending work in the committed rows (None: none)."""

    def next_processing(self) -> Mapping[int, int | None] | None:
        """Per owned interval, its earliest processing-time timer; None: not tracked by this path."""
        return None

    def streams_ready(self) -> None:
        """Wait until every output stream's table exists; :class:`ConfigError` if one cannot be made."""
