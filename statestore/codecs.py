"""Codecs for user state and production values. State is stored beside the name of the codec that
wrote it (``json@2``: state version 2), so a row decodes without the computation's code.

>>> get_codec("json").decode(get_codec("json").encode({"n": 1}))
{'n': 1}
"""

from __future__ import annotations

import json
import pickle
import threading
from typing import Any, Protocol

import msgpack

from .exceptions import CodecError

__all__ = ["Codec", "JsonCodec", "MsgpackCodec", "PickleCodec", "Int64MapCodec", "INT64MAP_HEADER",
           "int64map_columns", "int64map_blobs", "msgpack_rows", "get_codec", "CODEC_NAMES", "base_name",
           "codec_version", "versioned_name", "codec_of_row"]


_DECODE_HINT = ("The value was written with another codec or is damaged: the computation's codec must be the one "
                "its state and streams were written with; look at the raw value with deltawheel inspect or sql")


class Codec(Protocol):
    """How state and production values become bytes and back; ``name`` is stored beside them."""

    name: str

    def encode(self, value: Any) -> bytes:
        """``value`` as bytes that :meth:`decode` turns back into an equal value.
        Raises CodecError: the codec cannot represent ``value``."""
        ...

    def decode(self, data: bytes) -> Any:
        """The value :meth:`encode` made ``data`` from.
        Raises CodecError: ``data`` is not a value of this codec."""
        ...


class JsonCodec:
    """UTF-8 JSON, compact, keys sorted (so equal values give equal bytes)."""

    name = "json"

    def encode(self, value: Any) -> bytes:
        """``value`` as compact UTF-8 JSON; CodecError if it is not JSON (NaN and infinities are not)."""
        try:
            return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise CodecError(
                f"json codec cannot encode a {type(value).__name__}: {exc}. "
                "Use plain dicts/lists/str/int/float/bool/None, or declare codec='msgpack'."
            ) from exc

    def decode(self, data: bytes) -> Any:
        """The value of UTF-8 JSON ``data``; CodecError if it is not."""
        try:
            # decoding first skips json's encoding detection
            return _JSON_DECODE(data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise CodecError(f"json codec cannot decode {len(data)} bytes: {exc}. {_DECODE_HINT}") from exc


_JSON_DECODE = json.JSONDecoder().decode


# one msgpack Packer per thread (``packb`` builds one per call); a Packer is not thread-safe
_PACKERS = threading.local()


class MsgpackCodec:
    """msgpack (binary, compact; bytes and str kept apart)."""

    name = "msgpack"

    def encode(self, value: Any) -> bytes:
        """``value`` as msgpack (str as str, bytes as bin); CodecError if msgpack cannot represent it."""
        packer = getattr(_PACKERS, "packer", None)
        if packer is None:
            packer = _PACKERS.packer = msgpack.Packer(use_bin_type=True)
        try:
            return packer.pack(value)  # type: ignore[no-any-return]
        except (TypeError, ValueError, OverflowError) as exc:
            raise CodecError(
                f"msgpack codec cannot encode a {type(value).__name__}: {exc}. "
                "Convert it to dicts/lists/str/bytes/int/float/bool/None first."
            ) from exc

    def decode(self, data: bytes) -> Any:
        """The value of msgpack ``data``; CodecError if it is not one msgpack value."""
        try:
            return msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (ValueError, msgpack.exceptions.ExtraData, msgpack.exceptions.FormatError,
                msgpack.exceptions.StackError) as exc:
            raise CodecError(f"msgpack codec cannot decode {len(data)} bytes: {exc}. {_DECODE_HINT}") from exc


class PickleCodec:
    """Python pickle. Loading runs code: only for stores whose writers you trust."""

    name = "pickle"

    def encode(self, value: Any) -> bytes:
        """``value`` pickled (protocol 5); CodecError if it cannot be."""
        try:
            return pickle.dumps(value, protocol=5)
        except Exception as exc:
            raise CodecError(f"pickle codec cannot encode a {type(value).__name__}: {exc}. Keep only picklable "
                             "values in state (no open files, locks or clients)") from exc

    def decode(self, data: bytes) -> Any:
        """The value of pickle ``data`` (runs the code it names); CodecError if it cannot be unpickled."""
        try:
            return pickle.loads(data)
        except Exception as exc:
            raise CodecError(f"pickle codec cannot decode {len(data)} bytes: {exc}. {_DECODE_HINT}") from exc


class Int64MapCodec:
    """msgpack, except that a non-empty dict of int64 -> int64 is stored as packed pairs: an 8-byte
    header (:data:`INT64MAP_HEADER`), then (key, value) little-endian int64 pairs sorted by key, so
    many keys' states decode and encode at once with NumPy (docs/embedding.md).

    >>> c = Int64MapCodec()
    >>> c.decode(c.encode({20: 1, 10: 2})), len(c.encode({20: 1, 10: 2})), c.decode(c.encode(["k", 1]))
    ({10: 2, 20: 1}, 40, ['k', 1])
    """

    name = "int64map"

    def encode(self, value: Any) -> bytes:
        """``value`` as packed pairs (a non-empty dict of int64 -> int64), else as msgpack."""
        if value.__class__ is dict and value and all(
                k.__class__ is int and v.__class__ is int and _I64_MIN <= k <= _I64_MAX and _I64_MIN <= v <= _I64_MAX
                for k, v in value.items()):
            import numpy as np

            pairs = np.array(sorted(value.items()), dtype="<i8")
            return INT64MAP_HEADER + pairs.tobytes()
        return _SAFE["msgpack"].encode(value)

    def decode(self, data: bytes) -> Any:
        """The value :meth:`encode` made ``data`` from; CodecError if it is neither form."""
        if data[:8] == INT64MAP_HEADER:
            if (len(data) - 8) % 16:
                raise CodecError(f"int64map codec cannot decode {len(data)} bytes: packed pairs need 8 + 16n bytes. "
                                 f"{_DECODE_HINT}")
            import numpy as np

            flat = np.frombuffer(data, dtype="<i8", offset=8).tolist()
            return dict(zip(flat[::2], flat[1::2], strict=True))
        return _SAFE["msgpack"].decode(data)


#: The first 8 bytes of an int64map blob of packed pairs (0xc1: a byte msgpack never writes).
INT64MAP_HEADER = b"\xc1dwi64mp"
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def int64map_columns(blobs: Any) -> tuple[Any, Any, Any] | None:
    """An Arrow binary array of int64map states as int64 columns (row index, key, value), in row and key
    order (a null row has none); None when a non-null row is msgpack."""
    import numpy as np
    import pyarrow as pa

    arr = blobs.combine_chunks() if isinstance(blobs, pa.ChunkedArray) else blobs
    n = len(arr)
    if arr.type != pa.binary():
        return None
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=n + 1, offset=arr.offset * 4).astype(np.int64)
    lens = np.diff(offs)
    valid = lens > 0
    if arr.null_count:
        valid &= np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    data = arr.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    starts, lv = offs[:-1][valid], lens[valid]
    empty = np.zeros(0, np.int64)
    if not len(starts):
        return empty, empty, empty
    if ((lv - 8) % 16).any() or (lv < 24).any() or (starts % 8).any():
        return None
    words = raw[: (len(raw) // 8) * 8].view("<i8")
    if (words[starts // 8] != _HEADER_WORD).any():
        return None
    npairs = (lv - 8) // 16
    rows = np.repeat(np.flatnonzero(valid), npairs)
    # each pair's first word: its row's first pair word + 2 * its place in the row
    within = np.arange(len(rows)) - np.repeat(np.cumsum(npairs) - npairs, npairs)
    at = np.repeat(starts // 8 + 1, npairs) + 2 * within
    return rows.astype(np.int64), words[at].astype(np.int64), words[at + 1].astype(np.int64)


def int64map_blobs(rows: Any, keys: Any, values: Any, n: int) -> Any:
    """The inverse of :func:`int64map_columns`: ``n`` rows' states (a row without pairs is null)."""
    import numpy as np
    import pyarrow as pa

    rows = np.asarray(rows, dtype=np.int64)
    npairs = np.bincount(rows, minlength=n).astype(np.int64) if len(rows) else np.zeros(n, np.int64)
    words_per = np.where(npairs > 0, 1 + 2 * npairs, 0)
    ends = np.cumsum(words_per)
    out = np.empty(int(ends[-1]) if n else 0, dtype="<i8")
    starts = ends - words_per
    has = npairs > 0
    out[starts[has]] = _HEADER_WORD
    within = np.arange(len(rows)) - np.repeat(np.cumsum(npairs) - npairs, npairs)
    at = np.repeat(starts + 1, npairs) + 2 * within
    out[at] = keys
    out[at + 1] = values
    offsets = np.concatenate([[0], ends * 8]).astype(np.int32)
    validity = pa.array(has).buffers()[1] if not has.all() else None
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets.tobytes()), pa.py_buffer(out.tobytes())],
                                 null_count=int(n - has.sum()))


def msgpack_rows(*columns: Any) -> Any:
    """Row i of ``columns`` as one msgpack array, byte for byte what the msgpack codec gives that list:
    a ``pyarrow.BinaryArray`` without nulls, floats as float64, nulls as nil (docs/embedding.md).

    >>> import pyarrow as pa
    >>> rows = msgpack_rows(pa.array(["k", None]), pa.array([1, -300]))
    >>> [get_codec("msgpack").decode(b) for b in rows.to_pylist()]
    [['k', 1], [None, -300]]
    >>> rows[1].as_py() == get_codec("msgpack").encode([None, -300])
    True

    Raises:
        TypeError: a column of a type it does not encode (named); cast it to one it does.
        ValueError: no columns, columns of different lengths, or 2 GiB of rows or more.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not columns:
        raise ValueError("msgpack_rows needs at least one column (a row is the array of the columns' values)")
    arrs = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    for c in arrs:
        if not isinstance(c, pa.Array):
            raise TypeError(f"msgpack_rows takes pyarrow arrays, got a {type(c).__name__}: pass pa.array(values)")
    n = len(arrs[0])
    if any(len(c) != n for c in arrs):
        raise ValueError(f"msgpack_rows: columns of different lengths {[len(c) for c in arrs]}; a row takes one value "
                         "of each")
    k = len(arrs)
    head = bytes([0x90 | k]) if k < 16 else (b"\xdc" + k.to_bytes(2, "big") if k < 2**16 else b"\xdd" + k.to_bytes(4, "big"))
    parts = [p for c in arrs for p in _msgpack_parts(c)]
    size = n * len(head) + sum(p.nbytes - (n + 1) * 4 for p in parts)  # data bytes (no validity: none null)
    if size >= 2**31:
        raise ValueError(f"msgpack_rows: about {size} bytes of rows, over a binary array's 2 GiB; encode fewer rows "
                         "at once")
    return pc.binary_join_element_wise(pa.scalar(head, pa.binary()), *parts, pa.scalar(b"", pa.binary()))


def _msgpack_parts(arr: Any) -> list[Any]:
    """One column's values as binary arrays whose values, joined per row, are each row's msgpack."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    t = arr.type
    n = len(arr)
    valid = (np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool) if arr.null_count
             else np.ones(n, dtype=bool))
    tag = np.full(n, 0xC0, dtype=np.uint8)  # nil where null
    width = np.zeros(n, dtype=np.int64)  # bytes after the tag: the last ones of ``tail``'s row
    tail: Any = None  # per row 8 big-endian bytes (n x 8)
    if pa.types.is_null(t):
        pass
    elif pa.types.is_integer(t):
        unsigned = pa.types.is_unsigned_integer(t)
        v = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False).astype(np.uint64 if unsigned else np.int64)
        tail = v.astype(">u8" if unsigned else ">i8").view(np.uint8).reshape(n, 8)
        # msgpack's smallest form: the value's place among the bounds of its forms
        bounds = np.array(_INT_BOUNDS_U, np.uint64) if unsigned else np.array(_INT_BOUNDS, np.int64)
        cat = np.searchsorted(bounds, v, side="right") + (4 if unsigned else 0)
        # fixint: the value is its own tag (its low byte: a uint8 cast wraps)
        tags = np.where(cat == 4, v.astype(np.uint8), np.frombuffer(_INT_TAGS, np.uint8)[cat])
        tag[valid] = tags[valid]
        width[valid] = np.array(_INT_WIDTHS, np.int64)[cat][valid]
    elif pa.types.is_floating(t):
        v = pc.fill_null(arr.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
        tail = v.astype(">f8").view(np.uint8).reshape(n, 8)
        tag[valid], width[valid] = 0xCB, 8
    elif pa.types.is_boolean(t):
        v = np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)
        tag[valid] = np.where(v, 0xC3, 0xC2)[valid]
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        text = pa.types.is_string(t) or pa.types.is_large_string(t)
        data = pc.fill_null(arr.cast(pa.binary()), b"")
        size = pc.binary_length(data).to_numpy(zero_copy_only=False).astype(np.int64)
        if text:  # fixstr, str8, str16, str32 by UTF-8 length
            tags = np.select([size < 32, size < 2**8, size < 2**16], [0xA0 | np.minimum(size, 31), 0xD9, 0xDA], 0xDB)
            widths = np.select([size < 32, size < 2**8, size < 2**16], [0, 1, 2], 4)
        else:  # bin8, bin16, bin32
            tags = np.select([size < 2**8, size < 2**16], [0xC4, 0xC5], 0xC6)
            widths = np.select([size < 2**8, size < 2**16], [1, 2], 4)
        tail = size.astype(">u8").view(np.uint8).reshape(n, 8)
        tag[valid], width[valid] = tags[valid].astype(np.uint8), widths[valid]
        return [_tagged(tag, width, tail), data]
    else:
        raise TypeError(f"msgpack_rows cannot encode a column of type {t}: it takes integers, floats, bool, string, "
                        "binary and null columns; cast the column to one of them (or encode its values with the "
                        "msgpack codec)")
    return [_tagged(tag, width, tail)]


# msgpack's integer forms by the value's place among these bounds (``searchsorted``, right)
_INT_BOUNDS = [-(2**31), -(2**15), -(2**7), -(2**5), 2**7, 2**8, 2**16, 2**32]
_INT_BOUNDS_U = [2**7, 2**8, 2**16, 2**32]
_INT_TAGS = bytes([0xD3, 0xD2, 0xD1, 0xD0, 0x00, 0xCC, 0xCD, 0xCE, 0xCF])
_INT_WIDTHS = [8, 4, 2, 1, 0, 1, 2, 4, 8]


def _tagged(tag: Any, width: Any, tail: Any) -> Any:
    """Per row ``tag`` and the last ``width`` bytes of ``tail``'s row, as a binary array."""
    import numpy as np
    import pyarrow as pa

    n = len(tag)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(1 + width, out=offsets[1:])
    if tail is None or not n or not width.any():
        data = tag
    elif (width == width[0]).all():  # one width (a column of timestamps, of floats): no mask
        mat = np.empty((n, 1 + int(width[0])), dtype=np.uint8)
        mat[:, 0] = tag
        mat[:, 1:] = tail[:, 8 - int(width[0]):]
        data = mat.reshape(-1)
    else:
        mat = np.empty((n, 9), dtype=np.uint8)
        mat[:, 1:] = tail
        first = 8 - width
        mat[np.arange(n), first] = tag
        data = mat[np.arange(9) >= first[:, None]]
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


_HEADER_WORD = int.from_bytes(INT64MAP_HEADER, "little", signed=True)
_SAFE: dict[str, Codec] = {"json": JsonCodec(), "msgpack": MsgpackCodec(), "int64map": Int64MapCodec()}
CODEC_NAMES = ("json", "msgpack", "pickle", "int64map")


def versioned_name(name: str, version: int) -> str:
    """The codec column of state written by ``name`` under state version ``version``.

    >>> versioned_name("json", 1), versioned_name("msgpack", 3)
    ('json', 'msgpack@3')
    """
    return name if version == 1 else f"{name}@{version}"


def base_name(name: str) -> str:
    """The codec of a codec column (``json@2`` -> ``json``)."""
    return name.split("@", 1)[0]


def codec_version(name: str | None) -> int:
    """The state version a codec column names (a plain name: 1).
    Raises CodecError: the version is not a whole number >= 1.

    >>> codec_version("json"), codec_version("json@2")
    (1, 2)
    """
    if not name or "@" not in name:
        return 1
    text = name.split("@", 1)[1]
    if not text.isdigit() or int(text) < 1:
        raise CodecError(f"codec {name!r} names state version {text!r}, not a whole number >= 1; the row was "
                         "not written by deltawheel: look at it with deltawheel inspect or sql")
    return int(text)


def get_codec(name: str, *, allow_pickle: bool = False) -> Codec:
    """The codec called ``name`` (a versioned codec column, ``json@2``, names its codec too).
    Raises CodecError: unknown name, or ``pickle`` without ``allow_pickle=True``."""
    if "@" in name:
        codec_version(name)
        name = base_name(name)
    if name in _SAFE:
        return _SAFE[name]
    if name == "pickle":
        if not allow_pickle:
            raise CodecError(
                "the pickle codec runs code when it decodes; pass allow_pickle=True "
                "(Computation.allow_pickle = True) to opt in, or use 'json' or 'msgpack'"
            )
        return PickleCodec()
    raise CodecError(f"unknown codec {name!r}; choose one of {', '.join(CODEC_NAMES)}")


def codec_of_row(row_codec: str | None, codec: Codec) -> Codec:
    """The codec that reads a row's stored state: the one its codec column names (so a changed ``codec``
    reads old rows as written), else ``codec``. Pickle only where ``codec`` is pickle (opted in).
    Raises CodecError: the row names an unknown codec, or pickle that ``codec`` does not allow.

    >>> codec_of_row("json", get_codec("msgpack")).decode(b"1"), get_codec("msgpack").decode(b"1")
    (1, 49)
    """
    if row_codec is None or base_name(row_codec) == codec.name:
        return codec
    return get_codec(row_codec, allow_pickle=codec.name == "pickle")
