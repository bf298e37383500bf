"""64-bit hashes of record ids straight from an Arrow column's buffers: no Python string per id."""

from __future__ import annotations

from typing import Any

__all__ = ["id_hashes", "id_hash"]

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_BLOCK_BYTES = 1 << 24  # the padded ids of one block of rows (bounds the temporary matrix)


def id_hashes(col: Any) -> Any:
    """64-bit hashes of a string column's values (numpy uint64), stable across processes: FNV-style over
    the zero-padded little-endian words, MurmurHash3's finalizer; :func:`id_hash` is the reference."""
    import numpy as np
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        col = col.cast(pa.string())
    n = len(col)
    if not n:
        return np.zeros(0, dtype=np.uint64)
    _valid, off_buf, data_buf = col.buffers()
    odt = np.int64 if pa.types.is_large_string(col.type) else np.int32
    offs = np.frombuffer(off_buf, dtype=odt)[col.offset:col.offset + n + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    lens = np.diff(offs)
    if col.null_count:
        lens = np.where(np.asarray(col.is_valid()), lens, 0)
    words = max(1, (int(lens.max()) + 7) // 8)
    out = np.empty(n, dtype=np.uint64)
    step = max(1024, _BLOCK_BYTES // (8 * words))
    prime = np.uint64(_FNV_PRIME)
    with np.errstate(over="ignore"):
        for a in range(0, n, step):
            b = min(n, a + step)
            ln = lens[a:b]
            mat = np.zeros((b - a, 8 * words), dtype=np.uint8)
            width = int(ln.max()) if b > a else 0
            if width and (ln == width).all():  # fixed-width ids (the usual): one reshape
                start = int(offs[a])
                mat[:, :width] = data[start:start + (b - a) * width].reshape(b - a, width)
            elif width:
                total = int(ln.sum())
                row = np.repeat(np.arange(b - a), ln)
                starts = offs[a:b]
                pos = np.arange(total) - np.repeat(np.cumsum(ln) - ln, ln)
                mat[row, pos] = data[np.repeat(starts, ln) + pos]
            w = mat.view("<u8")
            h = np.uint64(_FNV_OFFSET) ^ ln.astype(np.uint64)
            own = np.maximum(1, (ln + 7) // 8)  # each value folds its own words only
            for j in range(words):
                h = np.where(own > j, (h ^ w[:, j]) * prime, h) if j else (h ^ w[:, j]) * prime
            h ^= h >> np.uint64(33)
            h *= np.uint64(0xFF51AFD7ED558CCD)
            h ^= h >> np.uint64(33)
            h *= np.uint64(0xC4CEB9FE1A85EC53)
            h ^= h >> np.uint64(33)
            out[a:b] = h
    return out


def id_hash(value: str) -> int:
    """:func:`id_hashes` of one value, in plain Python (the reference the tests hold it to).

    >>> import pyarrow as pa
    >>> int(id_hashes(pa.array(["r1"]))[0]) == id_hash("r1")
    True
    """
    raw = value.encode("utf-8", "surrogatepass")
    mask = (1 << 64) - 1
    h = _FNV_OFFSET ^ len(raw)
    padded = raw + b"\x00" * (-len(raw) % 8) if raw else b"\x00" * 8
    for i in range(0, len(padded), 8):
        h = ((h ^ int.from_bytes(padded[i:i + 8], "little")) * _FNV_PRIME) & mask
    for mult in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        h ^= h >> 33
        h = (h * mult) & mask
    return h ^ (h >> 33)
