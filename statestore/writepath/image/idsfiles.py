"""An interval's record ids apart from its state: one small ids file per batch (image path)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

from ...delta.storefs import TableFiles
from ...delta.txn import partition_file_name, write_file
from ...rowtable.rows import IDS_KEY_PREFIX
from .files import IDS_FILE_TAG, ids_level
from .idhash import id_hashes
from .summary import ImageFile

__all__ = ["IdsFile", "adopt", "apart_held", "emptied", "flatten_ids", "forget_below", "hash_index", "keep_index",
           "within", "load_ids_file", "pick_ids", "split_legacy", "empty_flat", "plan_compaction", "write_ids_file",
           "FAN_IN", "BUCKETS_PER_HORIZON"]

FAN_IN = 8  # files of one level and bucket merged into one of the next level
BUCKETS_PER_HORIZON = 4  # time buckets per dedup retention (files of different buckets never merge)
_FILES: "OrderedDict[str, IdsFile]" = OrderedDict()
_FILES_MAX = 4_096
#: per ids file (by path): its rows in the order of their ids' hash buckets, and each bucket's start
_INDEX: "OrderedDict[str, tuple[Any, Any, int]]" = OrderedDict()
_ROWS_PER_BUCKET = 4  # a file of n ids gets about n / 4 buckets (at most 2**16)


@dataclass(frozen=True)
class IdsFile:
    """One ids file (path relative to the rows table; all its ids seen by ``written_ms``)."""

    path: str
    level: int
    written_ms: int
    flat: Any

    def bucket(self, bucket_ms: int) -> int:
        """The file's time bucket (buckets of ``bucket_ms``)."""
        return self.written_ms // bucket_ms


def empty_flat() -> Any:
    """An empty key / record_id / seen_ms table."""
    import pyarrow as pa

    return pa.table({"key": pa.array([], pa.string()), "record_id": pa.array([], pa.string()),
                     "seen_ms": pa.array([], pa.int64())})


def flatten_ids(t: Any, *, strip: int = 0) -> Any:
    """The key / record_id / seen_ms table of rows ``t`` (``strip``: characters cut off each key)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lst = t.column("record_ids").combine_chunks()
    if len(lst) == 0:
        return empty_flat()
    parents = pc.list_parent_indices(lst)
    flat = pc.list_flatten(lst)
    keys = t.column("key").combine_chunks()
    if strip:
        keys = pc.utf8_slice_codeunits(keys, strip)
    return pa.table({"key": keys.take(parents), "record_id": flat.field("record_id"),
                     "seen_ms": flat.field("seen_ms")})


def load_ids_file(root: TableFiles, rel: str) -> IdsFile:
    """The ids file ``rel`` (cached per Python worker: files are immutable)."""
    import pyarrow.compute as pc

    hit = _FILES.get(rel)
    if hit is not None:
        _FILES.move_to_end(rel)
        return hit
    cols = ["key", "record_ids", "updated_ms"]
    t = root.read_parquet(rel, columns=cols) if root.is_local else root.parquet_file(rel).read(columns=cols)
    written = pc.max(t.column("updated_ms")).as_py()
    got = IdsFile(rel, ids_level(rel), int(written or 0), flatten_ids(t, strip=len(IDS_KEY_PREFIX)))
    remember_ids_file(got)
    return got


def remember_ids_file(f: IdsFile) -> None:
    """Keep ``f`` in this worker's cache of ids files (by path)."""
    _FILES[f.path] = f
    _FILES.move_to_end(f.path)
    while len(_FILES) > _FILES_MAX:
        gone, _ = _FILES.popitem(last=False)
        _INDEX.pop(gone, None)


def hash_index(n: int, hashes: Any) -> tuple[Any, Any, int]:
    """(row numbers in bucket order, each bucket's first position, bucket bits) of ``n`` ids' ``hashes``."""
    import numpy as np

    bits = int(min(16, max(1, np.ceil(np.log2(max(n, 1) / _ROWS_PER_BUCKET + 1)))))
    top = (np.asarray(hashes, dtype=np.uint64) >> np.uint64(64 - bits)).astype(np.uint16)
    order = np.argsort(top, kind="stable").astype(np.uint32)  # NumPy sorts 16-bit keys by radix
    starts = np.zeros((1 << bits) + 1, dtype=np.int64)
    np.cumsum(np.bincount(top, minlength=1 << bits), out=starts[1:])
    return order, starts, bits


def keep_index(path: str, index: tuple[Any, Any, int]) -> None:
    """Keep ``index`` (:func:`hash_index`) as the ids file ``path``'s (the task's thread only)."""
    _INDEX[path] = index
    _INDEX.move_to_end(path)
    while len(_INDEX) > _FILES_MAX:
        _INDEX.popitem(last=False)


def _hash_index(f: IdsFile) -> tuple[Any, Any, int]:
    """``f``'s :func:`hash_index`: kept from when this worker wrote it, else made now and kept."""
    hit = _INDEX.get(f.path)
    if hit is not None:
        _INDEX.move_to_end(f.path)
        return hit
    got = hash_index(f.flat.num_rows, id_hashes(f.flat.column("record_id")))
    keep_index(f.path, got)
    return got


def pick_ids(files: Sequence[IdsFile], ids: Any, hashes: Any, legacy: Any = None) -> Any:
    """The rows of ``files`` (and of the ids table ``legacy``) whose record id is in ``ids`` (by hash)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if not len(ids):
        return empty_flat()
    parts = []
    for f in files:
        if not f.flat.num_rows:
            continue
        order, starts, bits = _hash_index(f)
        b = (np.asarray(hashes, dtype=np.uint64) >> np.uint64(64 - bits)).astype(np.int64)
        lo, hi = starts[b], starts[b + 1]
        lens = hi - lo
        total = int(lens.sum())
        if not total:
            continue
        pos = np.repeat(lo - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens) + np.arange(total)
        rows = f.flat.take(pa.array(np.unique(order[pos])))
        parts.append(rows.filter(pc.is_in(rows.column("record_id"), value_set=ids)))
    if legacy is not None and legacy.num_rows:
        parts.append(legacy.filter(pc.is_in(legacy.column("record_id"), value_set=ids)))
    return pa.concat_tables(parts) if parts else empty_flat()


def split_legacy(image: Any, *, inline: bool) -> tuple[Any, Any]:
    """(``image`` without ids rows, and with empty ``record_ids`` when ``inline``; the ids taken out)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if image.num_rows == 0:
        return image, empty_flat()
    is_ids = pc.starts_with(image.column("key"), IDS_KEY_PREFIX)
    has_rows = bool(pc.any(is_ids).as_py())
    n_inline = int(pc.sum(pc.list_value_length(image.column("record_ids"))).as_py() or 0) if inline else 0
    if not has_rows and not n_inline:
        return image, empty_flat()
    parts = []
    if has_rows:
        parts.append(flatten_ids(image.filter(is_ids), strip=len(IDS_KEY_PREFIX)))
        image = image.filter(pc.invert(is_ids))
    if n_inline:
        parts.append(flatten_ids(image))
        image = emptied(image, "record_ids")
    return image.combine_chunks(), pa.concat_tables(parts)


def emptied(t: Any, column: str) -> Any:
    """``t`` with each list of its list column ``column`` empty."""
    import numpy as np
    import pyarrow as pa

    idx = t.schema.get_field_index(column)
    field = t.schema.field(idx)
    return t.set_column(idx, field, pa.ListArray.from_arrays(pa.array(np.zeros(t.num_rows + 1, dtype=np.int32)),
                                                             pa.array([], field.type.value_type), type=field.type))


def plan_compaction(live: Sequence[IdsFile], *, now_ms: int, retention_ms: int) -> tuple[int, list[IdsFile]]:
    """(the level of the batch's new ids file, the live files it takes in), by :data:`FAN_IN` per bucket."""
    bucket_ms = max(retention_ms // BUCKETS_PER_HORIZON, 1)
    cur = now_ms // bucket_ms
    level = 0
    taken: list[IdsFile] = []
    while True:
        group = [f for f in live if f.level == level and f.bucket(bucket_ms) == cur]
        if len(group) + 1 < FAN_IN:
            return level, taken
        taken += group
        level += 1


def _ordered(flat: Any) -> bool:
    """Whether ``flat``'s rows are ordered by (key, seen_ms) already."""
    import pyarrow.compute as pc

    n = flat.num_rows
    if n < 2:
        return True
    k, s = flat.column("key"), flat.column("seen_ms")
    if k.null_count or s.null_count:
        return False
    k0, k1, s0, s1 = k.slice(0, n - 1), k.slice(1), s.slice(0, n - 1), s.slice(1)
    ok = pc.or_(pc.less(k0, k1), pc.and_(pc.equal(k0, k1), pc.less_equal(s0, s1)))
    return bool(pc.all(ok).as_py())


def write_ids_file(flat: Any, rows_root: TableFiles, *, computation: str, interval: int, level: int,
                   schema: Any, sequencer: int, commit_id: str, now_ms: int, format_version: int,
                   remember: bool = True, hashes: Any = None) -> tuple[ImageFile, IdsFile]:
    """Write the ids ``flat`` as an ids file of ``level``, one row per key; invisible until committed.
    ``remember``: cache it (:func:`adopt`; task's thread only); ``hashes``: the ids' ``id_hashes``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    flat = flat.combine_chunks()
    if hashes is not None and len(hashes) != flat.num_rows:
        raise ValueError(f"{len(hashes)} hashes for {flat.num_rows} ids")
    if not _ordered(flat):  # a batch's own ids come in key order already (the input's sort)
        order = pc.sort_indices(flat, sort_keys=[("key", "ascending"), ("seen_ms", "ascending")])
        flat = flat.take(order)
        hashes = None if hashes is None else np.asarray(hashes)[order.to_numpy()]
    ree = pc.run_end_encode(flat.column("key").combine_chunks())
    keys = ree.values
    ends = ree.run_ends.to_numpy().astype(np.int32)
    n = len(keys)
    field = schema.field("record_ids")
    values = pa.StructArray.from_arrays([flat.column("record_id").combine_chunks(),
                                         flat.column("seen_ms").combine_chunks()], fields=list(field.type.value_type))
    ids = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], ends]).astype(np.int32)), values, type=field.type)
    made = {"key": pc.binary_join_element_wise(pa.scalar(IDS_KEY_PREFIX), keys, ""), "record_ids": ids,
            "sequencer": pa.array(np.full(n, sequencer, dtype=np.int64)),
            "commit_id": pa.repeat(pa.scalar(commit_id, pa.string()), n),
            "updated_ms": pa.array(np.full(n, now_ms, dtype=np.int64)),
            "format_version": pa.array(np.full(n, format_version, dtype=np.int32))}
    table = pa.table({f.name: made[f.name] if f.name in made else pa.nulls(n, f.type)
                      for f in schema}).cast(schema)
    rel = partition_file_name(computation, interval, f"{IDS_FILE_TAG}{level}")
    written = ImageFile(rel, write_file(table, rows_root, rel), table.num_rows)
    got = IdsFile(rel, level, now_ms, flat)
    if remember:
        adopt(got, None if hashes is None else hash_index(flat.num_rows, hashes))
    return written, got


def adopt(f: IdsFile, index: tuple[Any, Any, int] | None = None) -> None:
    """Cache the new ids file ``f`` (and ``index``); a compaction's makes the lower levels forgotten."""
    if f.level:
        forget_below(f.path, f.level)
    remember_ids_file(f)
    if index is not None:
        keep_index(f.path, index)


def forget_below(rel: str, level: int) -> int:
    """Forget this worker's cached ids files of ``rel``'s interval below ``level``; returns how many."""
    folder = rel.rsplit("/", 1)[0]
    gone = [p for p, f in _FILES.items() if f.level < level and p.rsplit("/", 1)[0] == folder]
    for p in gone:
        del _FILES[p]
        _INDEX.pop(p, None)
    return len(gone)


def apart_held(live: list[IdsFile], legacy: Any) -> Any:
    """The ids of the live ids files and those taken out of an older image (key / record_id / seen_ms)."""
    import pyarrow as pa

    parts = [f.flat for f in live] + ([legacy] if legacy.num_rows else [])
    return pa.concat_tables(parts) if parts else empty_flat()


def within(flat: Any, horizon_ms: int | None) -> Any:
    """``flat``'s ids seen at or after ``horizon_ms`` (``flat`` itself when all are: no copy)."""
    import pyarrow.compute as pc

    if horizon_ms is None or not flat.num_rows:
        return flat
    seen = flat.column("seen_ms")
    if not seen.null_count and pc.min(seen).as_py() >= horizon_ms:
        return flat
    return flat.filter(pc.greater_equal(seen, horizon_ms))
