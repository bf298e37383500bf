"""Codecs: Hypothesis round-trips and every CodecError case (pure Python, no Spark)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from deltawheel.statestore.codecs import CODEC_NAMES, get_codec
from deltawheel.statestore.exceptions import CodecError
from deltawheel.statestore.inspection.sqlviews import decode_json_text, decode_value
from hypothesis import given, settings
from hypothesis import strategies as st

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
_float = st.floats(allow_nan=False, allow_infinity=False)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _float | _text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=4),
    max_leaves=20,
)
msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | _float | _text | st.binary(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=4),
    max_leaves=20,
)
pickle_values = st.recursive(
    st.none() | st.integers() | _float | _text | st.binary(max_size=20) | st.complex_numbers(allow_nan=False),
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children)
    | st.frozensets(st.integers(), max_size=4) | st.dictionaries(_text, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_json_round_trip(value: Any) -> None:
    codec = get_codec("json")
    data = codec.encode(value)
    assert codec.decode(data) == value
    assert codec.encode(codec.decode(data)) == data  # canonical: equal values, equal bytes


@settings(max_examples=200, deadline=None)
@given(msgpack_values)
def test_msgpack_round_trip(value: Any) -> None:
    codec = get_codec("msgpack")
    assert codec.decode(codec.encode(value)) == value


@settings(max_examples=200, deadline=None)
@given(pickle_values)
def test_pickle_round_trip_with_opt_in(value: Any) -> None:
    codec = get_codec("pickle", allow_pickle=True)
    assert codec.decode(codec.encode(value)) == value


@settings(max_examples=100, deadline=None)
@given(msgpack_values)
def test_decode_for_display_never_raises_and_is_json(value: Any) -> None:
    import json

    text = decode_json_text("msgpack", get_codec("msgpack").encode(value))
    assert text is not None
    shown = json.loads(text)
    if isinstance(value, float):
        assert math.isclose(shown, value) or shown == value


def test_unknown_codec() -> None:
    with pytest.raises(CodecError, match="unknown codec 'avro'; choose one of json, msgpack, pickle, int64map"):
        get_codec("avro")
    assert CODEC_NAMES == ("json", "msgpack", "pickle", "int64map")


def test_pickle_needs_opt_in() -> None:
    with pytest.raises(CodecError, match="pass allow_pickle=True"):
        get_codec("pickle")


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("json", object(), "json codec cannot encode a object"),
        ("json", {"x": float("nan")}, "json codec cannot encode a dict"),
        ("json", b"raw", "json codec cannot encode a bytes.*declare codec='msgpack'"),
        ("msgpack", object(), "msgpack codec cannot encode a object"),
        ("msgpack", 2**64, "msgpack codec cannot encode a int"),
        ("pickle", lambda: 1, "pickle codec cannot encode a function"),
    ],
)
def test_non_serializable_values(name: str, value: Any, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        get_codec(name, allow_pickle=True).encode(value)


@pytest.mark.parametrize(
    ("name", "data", "match"),
    [
        ("json", b"\xff\xfe", "json codec cannot decode 2 bytes"),
        ("json", b'{"a": ', "json codec cannot decode 6 bytes"),
        ("msgpack", b"\xc1", "msgpack codec cannot decode 1 bytes"),
        ("msgpack", b"\x01\x02", "msgpack codec cannot decode 2 bytes"),
        ("pickle", b"not a pickle", "pickle codec cannot decode 12 bytes"),
    ],
)
def test_garbage_bytes(name: str, data: bytes, match: str) -> None:
    with pytest.raises(CodecError, match=match):
        get_codec(name, allow_pickle=True).decode(data)


def test_display_decoding_shows_placeholders_instead_of_raising() -> None:
    assert decode_value("json", b"\xff") == "<undecodable json: 1 bytes>"
    assert decode_value("avro", b"abc") == "<undecodable avro: 3 bytes>"
    pickled = get_codec("pickle", allow_pickle=True).encode({1, 2})
    assert decode_json_text("pickle", pickled) == f"<pickle: {len(pickled)} bytes>"
    assert decode_json_text("pickle", pickled, allow_pickle=True) == "[1, 2]"
    assert decode_json_text("msgpack", get_codec("msgpack").encode({"b": b"\x01"})) == \
        '{"b": {"$bytes_b64": "AQ=="}}'
    assert decode_json_text("json", None) is None


def test_msgpack_encoder_is_reusable_after_an_error_and_across_threads() -> None:
    import threading

    import msgpack

    codec = get_codec("msgpack")
    with pytest.raises(CodecError, match="msgpack codec cannot encode a dict"):
        codec.encode({"a": [1, 2, object()]})  # fails half-way through the value
    assert codec.encode({"b": [1, 2]}) == msgpack.packb({"b": [1, 2]}, use_bin_type=True)
    bad: list[int] = []

    def work(i: int) -> None:
        for j in range(2_000):
            v = {"t": i, "j": j, "s": "x" * (j % 50)}
            if msgpack.unpackb(codec.encode(v), raw=False) != v:
                bad.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []
