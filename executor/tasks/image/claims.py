"""Tasks that take the intervals their Python worker holds (local mode): fewer image reads.

An image task keeps the interval images it read or wrote in its Python worker
(``image.py``'s cache, by immutable file path), but Spark hands a task to
whichever worker is free, so with a fixed interval-to-task placement about
half of a batch's intervals meet a worker that does not hold their image: it
reads the image from the store again and rebuilds its Bloom filter.

When every task of a job runs on this machine (Spark's ``local`` master) and
reads its input itself (the direct read, or a batch of due timers only), the
tasks instead *claim* their intervals one at a time in a folder they share,
each preferring

1. the intervals an earlier attempt of its own partition claimed (a retried
   task runs them again: the failed attempt returned no summary for them);
2. intervals whose current image its worker holds;
3. the intervals the placement gave it;
4. any other unclaimed one (a task that is done takes work from a slower one).

A claim is a file named after the interval, made complete and then linked
into place (``os.link`` fails if the name exists): at most one partition
holds an interval, and a task stops only when every interval is claimed, so
every interval is run by some task. The driver still checks that each of its
intervals has exactly one summary (``imagejob.ImageTasks.collect``): two
attempts of one partition at once (speculation) could otherwise both claim.
The folder is per job and removed by the driver when the job ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

__all__ = ["ClaimBoard", "ClaimError", "claim_board", "claimed_intervals", "drop_board"]


class ClaimError(RuntimeError):
    """A job's tasks returned no summary, or more than one, for one of its intervals."""


@dataclass(frozen=True)
class ClaimBoard:
    """One job's claim folder (a local path every task of the job reaches) and its intervals."""

    folder: str
    intervals: tuple[int, ...]


def claim_board(master: str, intervals: Sequence[int], *, root: str | None = None) -> ClaimBoard | None:
    """A new board for one job, or None when the tasks may run on other machines (a master that
    is not ``local``) or there is nothing to choose (fewer than two intervals)."""
    if not master.startswith("local") or master.startswith("local-cluster") or len(intervals) < 2:
        return None
    folder = tempfile.mkdtemp(prefix="deltawheel-claims-", dir=root)
    return ClaimBoard(folder, tuple(sorted(intervals)))


def drop_board(board: ClaimBoard | None) -> None:
    """Remove a board's folder (after its job ended, also when it failed)."""
    if board is not None:
        shutil.rmtree(board.folder, ignore_errors=True)


def _holder(board: ClaimBoard, iv: int) -> int | None:
    try:
        with open(os.path.join(board.folder, str(iv)), encoding="ascii") as f:
            return int(f.read())
    except FileNotFoundError:
        return None


def _claim(board: ClaimBoard, iv: int, task: int) -> bool:
    """Claim ``iv`` for partition ``task``; False when another partition holds it."""
    tmp = os.path.join(board.folder, f".{task}-{uuid.uuid4().hex}")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(str(task))
    try:
        os.link(tmp, os.path.join(board.folder, str(iv)))
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def claimed_intervals(board: ClaimBoard, task: int, planned: Sequence[int],
                      held: Callable[[int], bool]) -> Iterator[int]:
    """The intervals partition ``task`` runs, one at a time (claimed just before each is yielded),
    in the order of the module's preferences; ``planned``: the placement's intervals of this
    task; ``held``: whether this worker holds an interval's current image (asked again before
    each claim, so that it sees what the task itself has run)."""
    for iv in board.intervals:  # a retry: its partition's earlier claims
        if _holder(board, iv) == task:
            yield iv
    order = {iv: rank for rank, iv in enumerate(planned)}
    while True:
        free = [iv for iv in board.intervals if not os.path.exists(os.path.join(board.folder, str(iv)))]
        if not free:
            return
        free.sort(key=lambda iv: (not held(iv), iv not in order, order.get(iv, 0), iv))
        for iv in free:
            if _claim(board, iv, task):
                yield iv
                break
