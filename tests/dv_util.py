"""Deletion vectors written in Python, as Delta's DELETE and MERGE write them (``u``: one vector
file in the table's root folder for all the vectors of one write; ``i``: inline): the tests'
way to make a table whose files carry vectors, for the reader
(``statestore/delta/deletionvectors.py``) and the tools that read the rows table."""

from __future__ import annotations

import struct
import uuid
import zlib
from typing import Any, Sequence

from deltawheel.statestore.delta.deletionvectors import vector_file_name
from deltawheel.statestore.delta.storefs import TableFiles

__all__ = ["z85_encode", "serialize_rows", "inline_descriptor", "write_vectors", "DV_FILE_VERSION"]

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_MAGIC = 1681511377
_SERIAL_COOKIE_NO_RUN = 12346
#: the version byte that starts a deletion vector file
DV_FILE_VERSION = 1


def z85_encode(data: bytes) -> str:
    """``data`` as Z85 text, zero-padded to a multiple of 4 bytes first (as Delta's ``Base85Codec``
    does; the descriptor's ``sizeInBytes`` says how many bytes are data).

    >>> z85_encode(bytes.fromhex("864fd26fb559f75b"))
    'HelloWorld'
    """
    padded = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(padded), 4):
        n = int.from_bytes(padded[i:i + 4], "big")
        chunk = []
        for _ in range(5):
            n, r = divmod(n, 85)
            chunk.append(_Z85[r])
        out.append("".join(reversed(chunk)))
    return "".join(out)


def _roaring32_bytes(low: Any) -> bytes:
    """A portable 32-bit Roaring bitmap (no run containers) of the sorted unique uint32 ``low``."""
    import numpy as np

    highs = (low >> 16).astype(np.uint16)
    keys, starts = np.unique(highs, return_index=True)
    ends = [*starts[1:].tolist(), len(low)]
    head = struct.pack("<II", _SERIAL_COOKIE_NO_RUN, len(keys))
    descr = b"".join(struct.pack("<HH", int(k), int(e - s) - 1) for k, s, e in zip(keys, starts, ends, strict=True))
    bodies = []
    for s, e in zip(starts, ends, strict=True):
        part = (low[s:e] & 0xFFFF).astype(np.uint16)
        if len(part) <= 4096:
            bodies.append(part.astype("<u2").tobytes())
        else:
            words = np.zeros(1024, dtype=np.uint64)
            np.bitwise_or.at(words, part >> 6, np.left_shift(np.uint64(1), (part & 63).astype(np.uint64)))
            bodies.append(words.astype("<u8").tobytes())
    offset = len(head) + len(descr) + 4 * len(keys)
    offsets = []
    for b in bodies:
        offsets.append(struct.pack("<I", offset))
        offset += len(b)
    return head + descr + b"".join(offsets) + b"".join(bodies)


def serialize_rows(rows: Any) -> bytes:
    """The portable ``RoaringBitmapArray`` of the row indexes ``rows`` (any iterable of ints >= 0)."""
    import numpy as np

    arr = np.unique(np.asarray(list(rows) if not hasattr(rows, "dtype") else rows, dtype=np.int64))
    if not len(arr):
        return struct.pack("<iq", _MAGIC, 0)
    his = (arr >> 32).astype(np.int64)
    keys, starts = np.unique(his, return_index=True)
    ends = [*starts[1:].tolist(), len(arr)]
    out = [struct.pack("<iq", _MAGIC, len(keys))]
    for k, s, e in zip(keys, starts, ends, strict=True):
        out.append(struct.pack("<I", int(k)))
        out.append(_roaring32_bytes((arr[s:e] & 0xFFFFFFFF).astype(np.uint32)))
    return b"".join(out)


def inline_descriptor(rows: Any) -> dict[str, Any]:
    """An inline ``deletionVector`` descriptor marking ``rows`` deleted (an ``add`` action's field)."""
    import numpy as np

    arr = np.unique(np.asarray(list(rows) if not hasattr(rows, "dtype") else rows, dtype=np.int64))
    data = serialize_rows(arr)
    return {"storageType": "i", "pathOrInlineDv": z85_encode(data), "sizeInBytes": len(data),
            "cardinality": int(len(arr))}


def write_vectors(table: TableFiles, vectors: Sequence[Any]) -> list[dict[str, Any]]:
    """Write the deletion vectors ``vectors`` (each the row indexes it marks: an iterable of ints
    >= 0, or a NumPy array) into one new file in the root folder of the table at ``table``; their
    ``u`` descriptors, in order (none and no file for no vectors). The file is complete (on S3:
    its PUT acknowledged) when this returns; a log names it only once a commit adds a descriptor."""
    import numpy as np

    if not vectors:
        return []
    uid = uuid.uuid4()
    out = bytearray(struct.pack(">b", DV_FILE_VERSION))
    found = []
    for rows in vectors:
        arr = np.unique(np.asarray(list(rows) if not hasattr(rows, "dtype") else rows, dtype=np.int64))
        data = serialize_rows(arr)
        found.append({"storageType": "u", "pathOrInlineDv": z85_encode(uid.bytes), "offset": len(out),
                      "sizeInBytes": len(data), "cardinality": int(len(arr))})
        out += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    with table.fs.open_output_stream(table.path(vector_file_name(uid))) as fh:  # closing waits for the upload
        fh.write(bytes(out))
    return found


def mark_deleted(spark: Any, path: str, rel: str, rows: Sequence[int]) -> None:
    """Re-add the live data file ``rel`` (as the log names it) of the local Delta table at ``path``
    with a new deletion vector marking ``rows`` deleted, in one commit (as the image path's delta
    files marked an interval's older rows, and as Delta's own MERGE does)."""
    import json

    from deltawheel.statestore.delta.txn import TableLog

    log = TableLog(spark, path)
    _version, files = log.files("true", where=lambda _pv: True)
    (entry,) = [f for f in files if f.path == rel]
    (dv,) = write_vectors(TableFiles(path), [rows])
    add = dict(json.loads(entry.action_json)["add"])
    stats = json.loads(add.get("stats") or "{}")
    stats["tightBounds"] = False  # as Delta requires of a file with a vector
    add.update(deletionVector=dv, dataChange=True, stats=json.dumps(stats))
    log.commit(remove=[entry], add=[json.dumps({"add": add})])
