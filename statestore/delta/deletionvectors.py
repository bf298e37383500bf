"""Delta deletion vectors without Spark, as Delta's protocol describes ("Deletion Vector Format")."""

from __future__ import annotations

import struct
import uuid
import zlib
from typing import Any

from ..delta.storefs import TableFiles
from ..exceptions import StoreDamagedError

__all__ = ["deleted_rows", "z85_decode", "live_table", "vector_file_name"]

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {c: i for i, c in enumerate(_Z85)}
_MAGIC = 1681511377
_SERIAL_COOKIE_NO_RUN = 12346
_SERIAL_COOKIE = 12347


def z85_decode(text: str) -> bytes:
    """Z85 (ZeroMQ's base 85) text as bytes.

    >>> z85_decode("HelloWorld").hex()
    '864fd26fb559f75b'
    """
    if len(text) % 5:
        raise ValueError(f"Z85 text must be a multiple of 5 characters long, got {len(text)}")
    out = bytearray()
    for i in range(0, len(text), 5):
        n = 0
        for c in text[i:i + 5]:
            n = n * 85 + _Z85_VALUE[c]
        out += n.to_bytes(4, "big")
    return bytes(out)


def vector_file_name(uid: uuid.UUID) -> str:
    """The name of the deletion vector file of UUID ``uid`` (in the table's root folder).

    >>> vector_file_name(uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61"))
    'deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin'
    """
    return f"deletion_vector_{uid}.bin"


def _roaring32(data: memoryview, pos: int) -> tuple[list[int], int]:
    """The values of a portable 32-bit Roaring bitmap starting at ``pos``, and the position after it."""
    (cookie,) = struct.unpack_from("<I", data, pos)
    pos += 4
    if cookie & 0xFFFF == _SERIAL_COOKIE:
        size = (cookie >> 16) + 1
        nbytes = (size + 7) // 8
        runs = bytes(data[pos:pos + nbytes])
        pos += nbytes
        has_offsets = size >= 4
    elif cookie == _SERIAL_COOKIE_NO_RUN:
        (size,) = struct.unpack_from("<I", data, pos)
        pos += 4
        runs, has_offsets = b"", True
    else:
        raise ValueError(f"not a portable Roaring bitmap (cookie {cookie})")
    heads = [struct.unpack_from("<HH", data, pos + 4 * i) for i in range(size)]
    pos += 4 * size
    if has_offsets:
        pos += 4 * size
    values: list[int] = []
    for i, (key, card_minus_one) in enumerate(heads):
        high = key << 16
        if runs and runs[i // 8] >> (i % 8) & 1:
            (n,) = struct.unpack_from("<H", data, pos)
            pos += 2
            for j in range(n):
                start, length = struct.unpack_from("<HH", data, pos + 4 * j)
                values.extend(range(high | start, (high | start) + length + 1))
            pos += 4 * n
        elif card_minus_one + 1 <= 4096:
            n = card_minus_one + 1
            values.extend(high | v for v in struct.unpack_from(f"<{n}H", data, pos))
            pos += 2 * n
        else:
            words = struct.unpack_from("<1024Q", data, pos)
            pos += 8192
            for w, word in enumerate(words):
                while word:
                    low = word & -word
                    values.append(high | (w * 64 + low.bit_length() - 1))
                    word ^= low
    return values, pos


def _bitmap_array(data: bytes) -> frozenset[int]:
    """The row indexes of a serialized ``RoaringBitmapArray`` (portable format)."""
    view = memoryview(data)
    magic, count = struct.unpack_from("<iq", view, 0)
    if magic != _MAGIC:
        raise ValueError(f"not a deletion vector bitmap (magic {magic})")
    pos = 12
    rows: set[int] = set()
    for _ in range(count):
        (high,) = struct.unpack_from("<I", view, pos)
        low, pos = _roaring32(view, pos + 4)
        rows.update((high << 32) | v for v in low)
    return frozenset(rows)


def _file_bytes(table: TableFiles, dv: dict[str, Any]) -> bytes:
    kind, where = dv["storageType"], str(dv["pathOrInlineDv"])
    if kind == "u":
        prefix, encoded = where[:-20], where[-20:]
        name = vector_file_name(uuid.UUID(bytes=z85_decode(encoded)))
        path = table.path(f"{prefix}/{name}" if prefix else name)
    elif kind == "p":
        path = where.split("://", 1)[-1] if where.startswith("file:") else where
        path = path if table.is_local else table.path(where.split("/", 3)[-1])
    else:
        raise ValueError(f"unknown deletion vector storage type {kind!r}")
    offset = int(dv.get("offset") or 1)
    with table.fs.open_input_file(path) as fh:
        fh.seek(offset)
        (size,) = struct.unpack(">i", fh.read(4))
        data = bytes(fh.read(size))
        (crc,) = struct.unpack(">I", fh.read(4))
    if "sizeInBytes" in dv and size != int(dv["sizeInBytes"]):
        raise ValueError(f"the vector at offset {offset} of {path} is {size} bytes, its descriptor says {dv['sizeInBytes']}")
    if zlib.crc32(data) != crc:
        raise ValueError(f"the vector at offset {offset} of {path} fails its CRC-32 check")
    return data


def deleted_rows(table: TableFiles, dv: dict[str, Any] | None) -> frozenset[int]:
    """The indexes of the rows that deletion vector ``dv`` (an ``add``'s, or None) marks deleted.
    Raises StoreDamagedError: the deletion vector cannot be read or is not one; nothing was changed."""
    if not dv:
        return frozenset()
    try:
        data = z85_decode(str(dv["pathOrInlineDv"])) if dv["storageType"] == "i" else _file_bytes(table, dv)
        rows = _bitmap_array(data)
    except (OSError, ValueError, KeyError, struct.error) as exc:
        raise StoreDamagedError(f"deletion vector {dv.get('pathOrInlineDv')!r} of the table {table.root} "
                                f"cannot be read ({type(exc).__name__}: {exc}); restore it from a backup of "
                                "the store (docs/store-damage.md)") from exc
    if "cardinality" in dv and len(rows) != int(dv["cardinality"]):
        raise StoreDamagedError(
            f"deletion vector {dv.get('pathOrInlineDv')!r} of the table {table.root} holds {len(rows)} rows, "
            f"its log entry says {dv['cardinality']}; restore it from a backup of the store (docs/store-damage.md)")
    return rows


def live_table(table: TableFiles, rel: str, dv: dict[str, Any] | None, *, columns: list[str] | None = None) -> Any:
    """The rows of the data file ``rel`` that its deletion vector ``dv`` leaves live, as a pyarrow table."""
    import numpy as np

    t = table.read_parquet(rel, columns=columns)
    if not dv:
        return t
    gone = np.fromiter(deleted_rows(table, dv), dtype=np.int64)
    keep = np.ones(t.num_rows, dtype=bool)
    keep[gone[gone < t.num_rows]] = False
    return t.filter(keep)
