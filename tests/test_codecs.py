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


# msgpack_rows: every row byte for byte the codec's encode of the row's list
_INT_EDGES = [0, 1, 31, 32, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, -1, -31, -32, -33, -127,
              -128, -129, -32767, -32768, -32769, -(2**31) + 1, -(2**31), -(2**31) - 1, -(2**63) + 1, -(2**63)]
_STR_EDGES = ["", "a" * 31, "a" * 32, "b" * 255, "c" * 256, "d" * 65535, "e" * 65536, "é", "日本語" * 11, "\U0001f600" * 8,
              "é" * 16]  # non-ASCII: the UTF-8 length decides (é * 16: 32 bytes, str8)


def _codec_rows(*columns: list[Any]) -> list[bytes]:
    enc = get_codec("msgpack").encode
    return [enc(list(row)) for row in zip(*columns, strict=True)]


def test_msgpack_rows_gives_the_codecs_bytes_at_every_boundary() -> None:
    import random

    import pyarrow as pa
    from deltawheel.statestore.codecs import msgpack_rows

    rng = random.Random(7)
    n = 600
    cols: dict[str, tuple[list[Any], Any]] = {
        "int64": ([rng.choice([*_INT_EDGES, None]) for _ in range(n)], pa.int64()),
        "int8": ([rng.choice([0, 127, -128, -32, -33, 5, None]) for _ in range(n)], pa.int8()),
        "int32": ([rng.choice([2**31 - 1, -(2**31), 65536, -32769, None]) for _ in range(n)], pa.int32()),
        "uint64": ([rng.choice([0, 127, 128, 2**32, 2**63, 2**64 - 1, None]) for _ in range(n)], pa.uint64()),
        "uint8": ([rng.choice([0, 127, 128, 255]) for _ in range(n)], pa.uint8()),
        "string": ([rng.choice([*_STR_EDGES, None]) for _ in range(n)], pa.string()),
        "large_string": ([rng.choice(["", "x" * 40, None]) for _ in range(n)], pa.large_string()),
        "binary": ([rng.choice([b"", b"\x00" * 255, b"\xff" * 256, b"z" * 65536, None]) for _ in range(n)], pa.binary()),
        "float64": ([rng.choice([0.0, -0.0, 1.5, -1e300, float("inf"), 5e-324, None]) for _ in range(n)], pa.float64()),
        "bool": ([rng.choice([True, False, None]) for _ in range(n)], pa.bool_()),
        "null": ([None] * n, pa.null()),
    }
    arrays = {name: pa.array(values, t) for name, (values, t) in cols.items()}
    got = msgpack_rows(*arrays.values())
    assert got.type == pa.binary() and got.null_count == 0
    assert got.to_pylist() == _codec_rows(*(v for v, _ in cols.values()))
    # each column alone, every value (all the boundaries, no random gaps); a column twice
    for name, (values, _t) in cols.items():
        assert msgpack_rows(arrays[name]).to_pylist() == _codec_rows(values), name
    edges = pa.array(_INT_EDGES, pa.int64())
    assert msgpack_rows(edges, edges).to_pylist() == _codec_rows(_INT_EDGES, _INT_EDGES)
    strs = pa.array(_STR_EDGES)
    assert msgpack_rows(strs).to_pylist() == _codec_rows(_STR_EDGES)
    # float32: the Python float it holds, as float64; slices and chunked arrays
    f32 = pa.array([1.1, None, -2.5], pa.float32())
    assert msgpack_rows(f32).to_pylist() == _codec_rows(f32.to_pylist())
    sl = arrays["string"].slice(7, 100)
    assert msgpack_rows(sl, arrays["int64"].slice(3, 100)).to_pylist() == _codec_rows(
        cols["string"][0][7:107], cols["int64"][0][3:103])
    chunked = pa.chunked_array([pa.array(["a", None]), pa.array(["bc"])])
    assert msgpack_rows(chunked).to_pylist() == _codec_rows(["a", None, "bc"])


def test_msgpack_rows_array_headers_and_empty_input() -> None:
    import pyarrow as pa
    from deltawheel.statestore.codecs import msgpack_rows

    for k in (1, 15, 16, 17):  # fixarray up to 15, then array16
        cols = [pa.array([i, -i], pa.int64()) for i in range(k)]
        assert msgpack_rows(*cols).to_pylist() == _codec_rows(*([i, -i] for i in range(k)))
    empty = msgpack_rows(pa.array([], pa.string()), pa.array([], pa.int64()))
    assert empty.type == pa.binary() and len(empty) == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.none() | st.integers(-(2**63), 2**63 - 1), st.none() | _text,
                          st.none() | st.binary(max_size=300), st.none() | st.booleans(), st.none() | _float),
                max_size=40))
def test_msgpack_rows_equals_the_codec_on_random_rows(rows: list[tuple[Any, ...]]) -> None:
    import pyarrow as pa
    from deltawheel.statestore.codecs import msgpack_rows

    types = [pa.int64(), pa.string(), pa.binary(), pa.bool_(), pa.float64()]
    columns = [[r[i] for r in rows] for i in range(len(types))]
    got = msgpack_rows(*(pa.array(c, t) for c, t in zip(columns, types, strict=True)))
    assert got.to_pylist() == _codec_rows(*columns)


def test_msgpack_rows_refuses_what_it_cannot_encode() -> None:
    import pyarrow as pa
    from deltawheel.statestore.codecs import msgpack_rows

    with pytest.raises(TypeError, match=r"msgpack_rows cannot encode a column of type timestamp\[ms\].*cast the column"):
        msgpack_rows(pa.array([1], pa.int64()), pa.array([1], pa.timestamp("ms")))
    with pytest.raises(TypeError, match=r"cannot encode a column of type list<item: int64>"):
        msgpack_rows(pa.array([[1]]))
    with pytest.raises(TypeError, match="msgpack_rows takes pyarrow arrays, got a list"):
        msgpack_rows([1, 2])
    with pytest.raises(ValueError, match=r"columns of different lengths \[2, 1\]"):
        msgpack_rows(pa.array([1, 2]), pa.array([1]))
    with pytest.raises(ValueError, match="needs at least one column"):
        msgpack_rows()
