"""An interval's state as several files: where its live rows sit, and a batch's delta.

With delta files on (``ImageSpec.deltas``, ``statestore/writepath/image/files.py``), a batch
writes one new file per interval it changes holding only the rows of the keys it changed (new
keys, changed rows, rows whose checkpointed productions it clears, the fence row it rewrites),
and marks the older rows of those keys, and the rows of the keys it deleted, in the interval's
older files with deletion vectors (cumulative: a file's new vector holds its old one). The
table keeps one live row per key at every version, so every Delta reader sees the same rows as
before.

:class:`Placement` is where each live row of the interval's state sits (file, row index), kept
beside the worker's cached image; :func:`plan_delta` turns the batch's new image and its
changed keys into the delta's rows and the rows to mark in each older file, or says to rewrite the
interval whole (compaction) when, after the batch, it would have more than :data:`MAX_FILES`
state files or less than :data:`MIN_LIVE` of its stored rows live (docs/performance.md);
:meth:`DeltaPlan.write_vectors` writes the new deletion vectors (one vector file in the rows
table's root folder per interval and batch) before the driver's commit names them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from deltawheel.statestore.delta.deletionvectors import descriptor_id, write_vectors
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.writepath.image.files import live_rows

__all__ = ["changed_keys", "MAX_FILES", "MIN_LIVE", "Placement", "DeltaPlan", "plan_delta", "read_state", "token",
           "whole_placement"]

MAX_FILES = 8  # state files of an interval after a batch, at most; more: the batch rewrites it whole
MIN_LIVE = 0.5  # live rows / stored rows of an interval's state files, at least; less: rewritten whole


def token(path: str, dv: Mapping[str, Any] | None) -> str:
    """What names one state file with its deletion vector in a cache key (the file is immutable,
    its vector is not: a new vector is a new token)."""
    if not dv:
        return path
    return f"{path}#{hashlib.sha1(descriptor_id(dict(dv)).encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class Placement:
    """Where the live rows of an interval's state sit: its state files (paths), their stored rows,
    the row indexes their deletion vectors mark (sorted NumPy arrays), and per live row its key,
    file (index into ``files``) and row index in that file (``loc``, an Arrow table)."""

    files: tuple[str, ...]
    stored: tuple[int, ...]
    deleted: tuple[Any, ...]
    loc: Any

    @property
    def live(self) -> int:
        """How many rows are live."""
        return int(self.loc.num_rows)

    @property
    def nbytes(self) -> int:
        """Its memory (the row locations and deleted row indexes)."""
        return int(self.loc.nbytes) + sum(int(d.nbytes) for d in self.deleted)


def _loc(keys: Any, file: int, pos: Any) -> Any:
    import numpy as np
    import pyarrow as pa

    return pa.table({"key": keys, "file": pa.array(np.full(len(pos), file, dtype=np.int32)),
                     "pos": pa.array(np.asarray(pos, dtype=np.int64))})


def _empty_loc() -> Any:
    import pyarrow as pa

    return _loc(pa.array([], pa.string()), 0, [])


def whole_placement(path: str | None, image: Any) -> Placement:
    """The placement of ``image`` written whole as one file ``path`` (None: no file, no rows)."""
    import numpy as np

    if path is None:
        return Placement((), (), (), _empty_loc())
    n = image.num_rows
    return Placement((path,), (n,), (np.zeros(0, dtype=np.int64),),
                     _loc(image.column("key").combine_chunks(), 0, np.arange(n, dtype=np.int64)))


def read_state(root: TableFiles, paths: Sequence[str], dvs: Mapping[str, Mapping[str, Any]], *,
               read: Any, schema: Any) -> tuple[Any, Placement]:
    """The live rows of the state files ``paths`` (``read(root, path, schema)`` reads one file whole,
    ``dvs`` the deletion vectors by path) and their :class:`Placement`."""
    import numpy as np
    import pyarrow as pa

    tables, stored, deleted, locs = [], [], [], []
    for i, p in enumerate(paths):
        t = read(root, p, schema)
        live, pos = live_rows(root, t, dict(dvs[p]) if dvs.get(p) else None)
        stored.append(t.num_rows)
        keep = np.zeros(t.num_rows, dtype=bool)
        keep[pos] = True
        deleted.append(np.flatnonzero(~keep).astype(np.int64))
        tables.append(live)
        locs.append(_loc(live.column("key").combine_chunks(), i, pos))
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    loc = pa.concat_tables(locs) if locs else _empty_loc()
    return table, Placement(tuple(paths), tuple(stored), tuple(deleted), loc)


@dataclass(frozen=True)
class DeltaPlan:
    """A batch's delta of one interval: the rows to write (``rows``, possibly none), the rows each
    older file's new deletion vector marks (``marks``: path, sorted row indexes; cumulative) and
    the placement once the delta file is written."""

    rows: Any
    marks: tuple[tuple[str, Any], ...]
    place: Placement
    hit: Any  # which rows of the old ``loc`` are gone
    deleted: tuple[Any, ...]  # per file of ``place``, its rows marked deleted after the batch

    def write_vectors(self, root: TableFiles) -> tuple[tuple[str, dict[str, Any]], ...]:
        """Write the new deletion vectors into one file in the root folder of the rows table at
        ``root``; (path, its ``u`` descriptor) per marked file."""
        dvs = write_vectors(root, [rows for _p, rows in self.marks])
        return tuple((p, dv) for (p, _rows), dv in zip(self.marks, dvs, strict=True))

    def placement(self, path: str | None) -> Placement:
        """The interval's placement after the batch, its delta written to ``path`` (None: no rows)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        old = self.place
        loc = old.loc.filter(pc.invert(self.hit))
        deleted = self.deleted
        if path is None:
            return Placement(old.files, old.stored, deleted, loc)
        n = self.rows.num_rows
        loc = pa.concat_tables([loc, _loc(self.rows.column("key").combine_chunks(), len(old.files),
                                          np.arange(n, dtype=np.int64))])
        return Placement((*old.files, path), (*old.stored, n), (*deleted, np.zeros(0, dtype=np.int64)), loc)


def plan_delta(place: Placement, new_image: Any, changed: Any) -> DeltaPlan | None:
    """The delta of a batch whose new state image is ``new_image`` and which changed the rows of
    the keys ``changed`` (an Arrow string array; every other key's row in ``new_image`` is as
    ``place`` holds it). None: rewrite the interval whole (no state file yet, or the compaction
    rule: more than :data:`MAX_FILES` files, or less than :data:`MIN_LIVE` of the rows live)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not place.files:
        return None
    new_keys = new_image.column("key")
    old_keys = place.loc.column("key")
    gone = pc.invert(pc.is_in(old_keys, value_set=new_keys.combine_chunks()))
    hit = pc.or_(gone, pc.is_in(old_keys, value_set=changed))
    rows = new_image.filter(pc.is_in(new_keys, value_set=changed))
    n_hit = int(pc.sum(hit).as_py() or 0)
    files = len(place.files) + (1 if rows.num_rows else 0)
    stored = sum(place.stored) + rows.num_rows
    live = place.live - n_hit + rows.num_rows
    if files > MAX_FILES or live < MIN_LIVE * stored:
        return None
    marked = place.loc.filter(hit)
    fidx = marked.column("file").to_numpy()
    pos = marked.column("pos").to_numpy()
    marks = []
    deleted = list(place.deleted)
    for f in np.unique(fidx):
        deleted[int(f)] = np.union1d(place.deleted[int(f)], pos[fidx == f]).astype(np.int64)
        marks.append((place.files[int(f)], deleted[int(f)]))
    return DeltaPlan(rows.combine_chunks() if rows.num_rows else pa.concat_tables([rows]), tuple(marks), place, hit,
                     tuple(deleted))


def changed_keys(fresh: Any, image: Any, has_pending: bool, fence: bool) -> Any:
    """The keys whose rows a batch changed: those the key loop wrote (``fresh``), those whose
    checkpointed productions it clears (``has_pending``) and the fence row (``fence``)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltawheel.statestore.rowtable.rows import FENCE_KEY

    parts = [fresh.column("key").combine_chunks()]
    if has_pending:
        held = pc.fill_null(pc.greater(pc.list_value_length(image.column("pending")), 0), False)
        parts.append(image.filter(held).column("key").combine_chunks())
    if fence:
        parts.append(pa.array([FENCE_KEY], pa.string()))
    return pc.unique(pa.concat_arrays([p.cast(pa.string()) for p in parts]))
