"""The ids files' compaction prepared in the background (``idsfiles.py``, "Compaction").

A compaction merges the :data:`~.idsfiles.FAN_IN` files of a level into one file of the next,
~60 CPU-ms a task for eight ``big`` batches' ids: the batch that did it took ~0.3 s instead of
~0.2. The files it will take are known a batch ahead: when a task leaves an interval one file
short of a compaction (:func:`plan_next`), its worker merges them in a thread after the task
(:func:`prepare`), while the driver commits and Spark plans the next batch, and makes its
hash-bucket index for the dedup's lookups (``idsfiles.hash_index``) there too. The next task of the
interval in that worker takes the prepared file (:func:`take`) if it is still what the compaction
would write — the same files taken in, the same level, the same sequencer — and writes only the
batch's own ids as a level-0 file beside it: that batch commits both files and removes the ones
merged. Anything else (the task runs in another worker, a takeover, a later bucket, the merge
failed) and the task merges itself, as before; a prepared file never committed is an unreferenced
file of the rows table, removed by gc's vacuum like a failed task's.

The merged file's ``updated_ms`` is the preparing batch's time (its ids were all seen by then:
it is dropped past the horizon a batch sooner than the task's own merge would have, never
before its last id expires); its rows' ``commit_id`` is the preparing batch's.

``DELTAWHEEL_IDS_BACKGROUND_MERGE=0`` turns it off (each compaction in its batch's task).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from deltawheel.statestore.writepath.image.summary import ImageFile

from .idhash import id_hashes
from .idsfiles import IdsFile, adopt, hash_index, plan_compaction

__all__ = ["BACKGROUND_ENV", "background", "plan_next", "prepare", "take", "pending"]

BACKGROUND_ENV = "DELTAWHEEL_IDS_BACKGROUND_MERGE"


@dataclass
class _Prepared:
    inputs: frozenset[str]
    level: int
    sequencer: int
    thread: threading.Thread | None = None
    result: tuple[ImageFile, IdsFile] | None = None
    index: tuple[Any, Any, int] | None = None  # the merged file's hash_index, made in the thread too
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


_PREPARED: dict[tuple[str, int], _Prepared] = {}  # (computation, interval) -> its prepared merge
_LOCK = threading.Lock()


def background() -> bool:
    """Whether compactions are prepared in the background (default) or done in their batch's task."""
    return os.environ.get(BACKGROUND_ENV, "1") != "0"


def plan_next(live: Sequence[IdsFile], *, now_ms: int, retention_ms: int) -> tuple[int, list[IdsFile]]:
    """(level, files) of the compaction the interval's next batch would make if it ran now
    (its new file counted): no files, none."""
    return plan_compaction(live, now_ms=now_ms, retention_ms=retention_ms)


def pending(computation: str, interval: int) -> frozenset[str] | None:
    """The files the merge prepared (or being prepared) for this interval takes in, if any."""
    with _LOCK:
        got = _PREPARED.get((computation, interval))
    return None if got is None else got.inputs


def prepare(computation: str, interval: int, files: Sequence[IdsFile], *, level: int, sequencer: int,
            merge: Callable[[Sequence[IdsFile]], tuple[ImageFile, IdsFile]]) -> None:
    """Start ``merge(files)`` (writing one ids file of ``level``, not remembered by the worker's
    cache) in a daemon thread, for the interval's next task (:func:`take`). One per interval: a
    newer one replaces an older one (whose file, if written, stays uncommitted)."""
    prep = _Prepared(frozenset(f.path for f in files), level, sequencer)

    def run() -> None:
        try:
            prep.result = merge(files)
            flat = prep.result[1].flat
            prep.index = hash_index(flat.num_rows, id_hashes(flat.column("record_id")))
        except BaseException as exc:  # the next task merges itself
            prep.error = exc
        finally:
            prep.done.set()

    with _LOCK:
        _PREPARED[(computation, interval)] = prep
    prep.thread = threading.Thread(target=run, name=f"deltawheel-ids-merge-{interval}", daemon=True)
    prep.thread.start()


def take(computation: str, interval: int, taken: Sequence[IdsFile], *, level: int,
         sequencer: int) -> tuple[ImageFile, IdsFile] | None:
    """The prepared merge of exactly ``taken`` into a file of ``level`` under ``sequencer``
    (waiting for its thread), adopted into the worker's cache; None if there is none that fits
    or it failed (then the caller merges)."""
    with _LOCK:
        prep = _PREPARED.pop((computation, interval), None)
    if prep is None or prep.inputs != frozenset(f.path for f in taken) or prep.level != level \
            or prep.sequencer != sequencer:
        return None
    prep.done.wait()
    if prep.error is not None or prep.result is None:
        return None
    adopt(prep.result[1], prep.index)
    return prep.result
