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

__all__ = ["Codec", "JsonCodec", "MsgpackCodec", "PickleCodec", "get_codec", "CODEC_NAMES", "base_name",
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


_SAFE: dict[str, Codec] = {"json": JsonCodec(), "msgpack": MsgpackCodec()}
CODEC_NAMES = ("json", "msgpack", "pickle")


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
