"""A batch's ids files (:func:`write_batch_ids`) and their compaction prepared in the background."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ...delta.storefs import TableFiles
from ...rowtable.rows import ROW_FORMAT_VERSION
from .idhash import id_hashes
from .idsfiles import IdsFile, adopt, hash_index, plan_compaction, within, write_ids_file
from .summary import ImageFile

__all__ = ["IdsBatch", "prepare", "prepare_next", "take", "write_batch_ids"]


@dataclass(frozen=True, kw_only=True)
class IdsBatch:
    """What a batch writes one interval's ids files with (horizon None: no dedup)."""

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


@dataclass(kw_only=True)
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


def prepare(computation: str, interval: int, files: Sequence[IdsFile], *, level: int, sequencer: int,
            merge: Callable[[Sequence[IdsFile]], tuple[ImageFile, IdsFile]]) -> None:
    """Start ``merge(files)`` in a daemon thread for :func:`take`; one per interval, the newest kept."""
    prep = _Prepared(inputs=frozenset(f.path for f in files), level=level, sequencer=sequencer)

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
    """The prepared merge of exactly ``taken`` into ``level`` under ``sequencer``, adopted (None: none)."""
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
    """Write the batch's ids file (with those handed over); (the files written, the live files left)."""
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
    """Merge the interval's ids files now in a thread when its next batch would compact them."""
    if retention_ms is None:
        return
    # what the next batch would take in if it ran now (its new file counted): none, no merge
    level, files = plan_compaction(live, now_ms=batch.now_ms, retention_ms=retention_ms or 1)
    with _LOCK:  # the merge prepared (or being prepared) for the interval
        got = _PREPARED.get((batch.computation, batch.interval))
    if not files or (got is not None and got.inputs == frozenset(f.path for f in files)):
        return

    def merge(files: Sequence[IdsFile]) -> tuple[ImageFile, IdsFile]:
        import pyarrow as pa

        ordered = sorted(files, key=lambda f: (f.written_ms, -f.level))
        return batch.write(pa.concat_tables([within(f.flat, batch.horizon_ms) for f in ordered]), level=level,
                           remember=False)

    prepare(batch.computation, batch.interval, files, level=level, sequencer=batch.sequencer, merge=merge)
