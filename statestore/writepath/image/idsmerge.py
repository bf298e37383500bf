"""A batch's ids files (:func:`write_batch_ids`) and their compaction prepared in the background
(``idsfiles.py``, "Compaction").

A compaction merges the :data:`~.idsfiles.FAN_IN` files of a level into one file of the next,
~60 CPU-ms a task for eight ``big`` batches' ids: the batch that did it took ~0.3 s instead of
~0.2. The files it will take are known a batch ahead: when a task leaves an interval one file
short of a compaction (``plan_compaction`` with the next batch's file counted), its worker merges them in a thread after the task
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
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...delta.storefs import TableFiles
from ...rowtable.rows import ROW_FORMAT_VERSION
from .idhash import id_hashes
from .idsfiles import IdsFile, adopt, hash_index, plan_compaction, within, write_ids_file
from .summary import ImageFile

__all__ = ["IdsBatch", "pending", "prepare", "prepare_next", "take", "write_batch_ids"]


@dataclass(frozen=True, kw_only=True)
class IdsBatch:
    """One interval's ids files as a batch writes them: the rows table's files and its rows file
    ``schema`` (pyarrow), the writer (``computation``, ``interval``, ``sequencer``, ``commit_id``),
    the batch's processing time and its dedup horizon (None: no dedup)."""

    rows_root: TableFiles
    schema: Any
    computation: str
    interval: int
    sequencer: int
    commit_id: str
    now_ms: int
    horizon_ms: int | None

    def write(self, flat: Any, *, level: int, remember: bool = True, hashes: Any = None) -> tuple[ImageFile, IdsFile]:
        """:func:`~.idsfiles.write_ids_file` of the ids ``flat`` as this batch's file of ``level``."""
        return write_ids_file(flat, self.rows_root, computation=self.computation, interval=self.interval,
                              level=level, schema=self.schema, sequencer=self.sequencer, commit_id=self.commit_id,
                              now_ms=self.now_ms, format_version=ROW_FORMAT_VERSION, remember=remember,
                              hashes=hashes)


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


def write_batch_ids(batch: IdsBatch, fresh: Any | None, legacy: Any, live: list[IdsFile], retention_ms: int | None,
                    fresh_hashes: Any = None) -> tuple[list[tuple[ImageFile, IdsFile]], list[IdsFile]]:
    """Write the batch's ids file: its new ids (``fresh``: key / record_id), those taken out of an
    older image, and — when compaction says so — those of the live files it takes in (or, when
    this worker prepared that merge, the batch's ids alone beside the prepared file). Returns (the
    files written, the live files it leaves)."""
    import numpy as np
    import pyarrow as pa

    parts = []
    if fresh is not None:
        parts.append(pa.table({"key": fresh.column("key"), "record_id": fresh.column("record_id"),
                               "seen_ms": pa.array(np.full(fresh.num_rows, batch.now_ms, dtype=np.int64))}))
    if legacy.num_rows:
        parts.append(within(legacy, batch.horizon_ms))
    level, taken = plan_compaction(live, now_ms=batch.now_ms, retention_ms=retention_ms or 1)
    merged = take(batch.computation, batch.interval, taken, level=level, sequencer=batch.sequencer) if taken else None
    own_level = 0 if merged is not None else level
    if merged is None:
        parts += [within(f.flat, batch.horizon_ms) for f in taken]
    only_fresh = fresh is not None and len(parts) == 1  # the batch's own ids alone: their hashes are known
    got = batch.write(pa.concat_tables(parts), level=own_level, hashes=fresh_hashes if only_fresh else None)
    return [got, *([merged] if merged is not None else [])], [f for f in live if f not in taken]


def prepare_next(batch: IdsBatch, live: list[IdsFile], retention_ms: int | None) -> None:
    """When the interval's next batch would compact its ids files, merge them now in a thread
    -- unless that merge is already prepared or under way."""
    if retention_ms is None:
        return
    # what the next batch would take in if it ran now (its new file counted): none, no merge
    level, files = plan_compaction(live, now_ms=batch.now_ms, retention_ms=retention_ms or 1)
    if not files or pending(batch.computation, batch.interval) == frozenset(f.path for f in files):
        return

    def merge(files: Sequence[IdsFile]) -> tuple[ImageFile, IdsFile]:
        import pyarrow as pa

        ordered = sorted(files, key=lambda f: (f.written_ms, -f.level))
        return batch.write(pa.concat_tables([within(f.flat, batch.horizon_ms) for f in ordered]), level=level,
                           remember=False)

    prepare(batch.computation, batch.interval, files, level=level, sequencer=batch.sequencer, merge=merge)
