"""Decoding stored values for display (``dw_decode``, ``inspect``); a bad value shows as ``<...>``."""

from __future__ import annotations

import base64
import json
from typing import Any

from ..codecs import base_name, get_codec
from ..exceptions import CodecError

__all__ = ["decode_value", "decode_json_text"]


def _jsonable(value: Any) -> Any:
    """``value`` with bytes, tuples, sets and odd keys made JSON-friendly."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes_b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _decode(codec: str, data: bytes, *, allow_pickle: bool) -> tuple[bool, Any]:
    """(True, JSON-friendly value) or (False, a ``<...>`` placeholder string)."""
    if base_name(codec) == "pickle" and not allow_pickle:
        return False, f"<pickle: {len(data)} bytes>"
    try:
        return True, _jsonable(get_codec(codec, allow_pickle=allow_pickle).decode(data))
    except CodecError:
        return False, f"<undecodable {codec}: {len(data)} bytes>"


def decode_value(codec: str, data: bytes | None, *, allow_pickle: bool = False) -> Any:
    """Decode ``data`` for display: a JSON-friendly value, or a ``<...>`` placeholder; never raises.

    >>> decode_value("json", b'{"n": 1}')
    {'n': 1}
    >>> decode_value("pickle", b"12345")
    '<pickle: 5 bytes>'
    """
    if data is None:
        return None
    return _decode(codec, bytes(data), allow_pickle=allow_pickle)[1]


def decode_json_text(codec: str, data: bytes | None, *, allow_pickle: bool = False) -> str | None:
    """Like :func:`decode_value` but as JSON text (placeholders stay plain, non-JSON text).

    >>> decode_json_text("json", b'{"b":2,"a":1}')
    '{"a": 1, "b": 2}'
    """
    if data is None:
        return None
    ok, value = _decode(codec, bytes(data), allow_pickle=allow_pickle)
    return json.dumps(value, sort_keys=True, ensure_ascii=False) if ok else str(value)
