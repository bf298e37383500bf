"""Codecs for user state and production values.

State is stored as opaque bytes next to the name of the codec that wrote it,
so a row can always be decoded (by the SQL views, by ``inspect``) without
knowing the computation's code. JSON and msgpack are always available;
pickle executes code on load and is only returned when the caller opts in
with ``allow_pickle=True``.

A computation's state has a version (``Computation.state_version``); a row written under version
2 or later names its codec with the version, ``json@2`` (:func:`versioned_name`); version 1 is
the plain name, as rows written before versions existed. :func:`get_codec` takes either form
and :func:`codec_version` reads the version back.

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
           "int64map_columns", "int64map_blobs", "get_codec", "CODEC_NAMES", "base_name",
           "codec_version", "versioned_name"]


# what to do about bytes that do not decode (a value written by another codec, or damaged)
_DECODE_HINT = ("The value was written with another codec or is damaged: the computation's codec must be the one "
                "its state and streams were written with; look at the raw value with deltawheel inspect or sql")


class Codec(Protocol):
    """How state and production values become bytes and back; ``name`` is stored beside them."""

    name: str

    def encode(self, value: Any) -> bytes:
        """``value`` as bytes that :meth:`decode` turns back into an equal value.

        Raises:
            CodecError: the codec cannot represent ``value``.
        """
        ...

    def decode(self, data: bytes) -> Any:
        """The value :meth:`encode` made ``data`` from.

        Raises:
            CodecError: ``data`` is not a value of this codec.
        """
        ...


class JsonCodec:
    """UTF-8 JSON, compact, keys sorted (so equal values give equal bytes)."""

    name = "json"

    def encode(self, value: Any) -> bytes:
        """``value`` as compact UTF-8 JSON, keys sorted.

        Raises:
            CodecError: ``value`` is not JSON (or is a NaN / infinite float).
        """
        try:
            return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise CodecError(
                f"json codec cannot encode a {type(value).__name__}: {exc}. "
                "Use plain dicts/lists/str/int/float/bool/None, or declare codec='msgpack'."
            ) from exc

    def decode(self, data: bytes) -> Any:
        """The value of UTF-8 JSON ``data``.

        Raises:
            CodecError: ``data`` is not UTF-8 JSON.
        """
        try:
            # decoding first skips json's encoding detection (measurable at 10^5 records per batch)
            return _JSON_DECODE(data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise CodecError(f"json codec cannot decode {len(data)} bytes: {exc}. {_DECODE_HINT}") from exc


_JSON_DECODE = json.JSONDecoder().decode


# one msgpack Packer per thread: ``packb`` builds one per call, half of its cost on small values
# (a Packer is not thread-safe; it drops half-written data when it raises)
_PACKERS = threading.local()


class MsgpackCodec:
    """msgpack (binary, compact; bytes and str kept apart)."""

    name = "msgpack"

    def encode(self, value: Any) -> bytes:
        """``value`` as msgpack (str as str, bytes as bin).

        Raises:
            CodecError: msgpack cannot represent ``value``.
        """
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
        """The value of msgpack ``data``.

        Raises:
            CodecError: ``data`` is not one msgpack value.
        """
        try:
            return msgpack.unpackb(data, raw=False, strict_map_key=False)
        except (ValueError, msgpack.exceptions.ExtraData, msgpack.exceptions.FormatError,
                msgpack.exceptions.StackError) as exc:
            raise CodecError(f"msgpack codec cannot decode {len(data)} bytes: {exc}. {_DECODE_HINT}") from exc


class PickleCodec:
    """Python pickle. Loading runs code: only for stores whose writers you trust."""

    name = "pickle"

    def encode(self, value: Any) -> bytes:
        """``value`` pickled (protocol 5).

        Raises:
            CodecError: ``value`` cannot be pickled.
        """
        try:
            return pickle.dumps(value, protocol=5)
        except Exception as exc:
            raise CodecError(f"pickle codec cannot encode a {type(value).__name__}: {exc}. Keep only picklable "
                             "values in state (no open files, locks or clients)") from exc

    def decode(self, data: bytes) -> Any:
        """The value of pickle ``data``: runs the code the pickle names.

        Raises:
            CodecError: ``data`` cannot be unpickled.
        """
        try:
            return pickle.loads(data)
        except Exception as exc:
            raise CodecError(f"pickle codec cannot decode {len(data)} bytes: {exc}. {_DECODE_HINT}") from exc


class Int64MapCodec:
    """msgpack, except that a dict of int64 -> int64 (e.g. ``{window_start: count}``) is stored as
    fixed-width packed columns: an 8-byte header (:data:`INT64MAP_HEADER`, whose first byte msgpack
    never writes) and then the pairs (key, value), little-endian int64, sorted by key. So the states
    of many keys decode at once with one ``numpy.frombuffer`` over an Arrow binary column's buffer,
    and encode with one ``tobytes`` (:func:`int64map_columns`, :func:`int64map_blobs`: the image
    path's columnar path, docs/embedding.md). Any other value (an empty dict included) is msgpack;
    a production's value too. Equal values give equal bytes (pairs sorted).

    >>> c = Int64MapCodec()
    >>> c.decode(c.encode({20: 1, 10: 2})), len(c.encode({20: 1, 10: 2})), c.decode(c.encode(["k", 1]))
    ({10: 2, 20: 1}, 40, ['k', 1])
    """

    name = "int64map"

    def encode(self, value: Any) -> bytes:
        """``value`` as packed pairs (a non-empty dict of int64 -> int64), else as msgpack.

        Raises:
            CodecError: msgpack cannot represent ``value``.
        """
        if value.__class__ is dict and value and all(
                k.__class__ is int and v.__class__ is int and _I64_MIN <= k <= _I64_MAX and _I64_MIN <= v <= _I64_MAX
                for k, v in value.items()):
            import numpy as np

            pairs = np.array(sorted(value.items()), dtype="<i8")
            return INT64MAP_HEADER + pairs.tobytes()
        return _SAFE["msgpack"].encode(value)

    def decode(self, data: bytes) -> Any:
        """The value :meth:`encode` made ``data`` from.

        Raises:
            CodecError: ``data`` is neither packed pairs nor one msgpack value.
        """
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
    """An Arrow binary array of int64map states as columns: (row index, key, value), int64 numpy
    arrays, one entry per pair, rows in order and each row's pairs sorted by key; a null row has
    none. None when some non-null row is not packed pairs (msgpack: the caller runs it otherwise)."""
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
    first = np.repeat(starts // 8 + 1, npairs)
    within = np.arange(len(rows)) - np.repeat(np.cumsum(npairs) - npairs, npairs)
    at = first + 2 * within
    return rows.astype(np.int64), words[at].astype(np.int64), words[at + 1].astype(np.int64)


def int64map_blobs(rows: Any, keys: Any, values: Any, n: int) -> Any:
    """The inverse of :func:`int64map_columns`: ``n`` rows' int64map states (Arrow binary; a row
    without pairs is null) from the pairs (row index, key, value), sorted by (row, key)."""
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
    first = np.repeat(starts + 1, npairs)
    within = np.arange(len(rows)) - np.repeat(np.cumsum(npairs) - npairs, npairs)
    at = first + 2 * within
    out[at] = keys
    out[at + 1] = values
    offsets = np.concatenate([[0], ends * 8]).astype(np.int32)
    validity = pa.array(has).buffers()[1] if not has.all() else None
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets.tobytes()), pa.py_buffer(out.tobytes())],
                                 null_count=int(n - has.sum()))


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

    >>> codec_version("json"), codec_version("json@2")
    (1, 2)

    Raises:
        CodecError: the version is not a whole number >= 1.
    """
    if not name or "@" not in name:
        return 1
    text = name.split("@", 1)[1]
    if not text.isdigit() or int(text) < 1:
        raise CodecError(f"codec {name!r} names state version {text!r}, not a whole number >= 1; the row was "
                         "not written by deltawheel: look at it with deltawheel inspect or sql")
    return int(text)


def get_codec(name: str, *, allow_pickle: bool = False) -> Codec:
    """Return the codec called ``name`` (a versioned codec column, ``json@2``, names its codec too).

    Raises:
        CodecError: unknown name, or ``pickle`` without ``allow_pickle=True``.
    """
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
