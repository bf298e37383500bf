"""Bad input of every kind, generated: each bad record ends as one dead letter with its raw bytes and
its reason, every good record's effect is in the state exactly once, and the run goes on.

One pipeline of two computations reads a folder of JSON Lines files and a folder of Parquet files,
both cut into files (and the files into micro-batches) as hypothesis draws them; the lines and rows
mix good records with bad ones of every kind a record can be bad in (docs/reliability.md, "Bad
input"). A whole file that cannot be read (a truncated or corrupt Parquet file) is a typed refusal
naming the file: ``tests/test_bad_input_files.py``.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import copy_migrated_store
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.tables import rows_frame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark import cloudpickle

import deltawheel
from deltawheel import RECORD_KEY, Computation, JsonLinesInjector, ParquetInjector, Pipeline

pytestmark = [pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MIN_MS, MAX_MS = -62_135_596_800_000, 253_402_300_799_999  # 0001-01-01 .. 9999-12-31T23:59:59.999Z
MALFORMED = "malformed input: the source could not parse it"
NO_KEY = "key extractor returned an empty key"
NO_TS = "record without timestamp"
OUTSIDE = "ms is outside the years 1 to 9999"
LONG_KEY = "key longer than 4096 bytes"


class Ids(Computation):
    """Keeps, per key, the ids of the records it ran: a record's effect, exactly once or not."""

    name = "json_ids"
    inputs = {"lines": RECORD_KEY}

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = sorted({*(ctx.state or []), record.record_id})


class RowIds(Ids):
    name = "parquet_ids"
    inputs = {"rows": RECORD_KEY}


@dataclass(frozen=True)
class Item:
    """One generated line or row: its bytes (a line) or columns (a row), and its dead letter's reason
    (None: a good record)."""

    data: Any
    reason: str | None
    key: str | None = None


cards = st.text(alphabet="abcxyzé€", min_size=1, max_size=6)
times = st.integers(MIN_MS, MAX_MS)


def _line(card: Any, ts: Any, **extra: Any) -> bytes:
    return json.dumps({"card": card, "n": 1, "ts": ts, **extra}, ensure_ascii=False).encode()


JSON_KINDS = ("good", "good_extra", "good_huge", "wrong_type", "not_object", "truncated", "not_utf8", "null_key",
              "no_key", "null_ts", "no_ts", "ts_after_9999", "ts_before_year_1", "ts_max_long", "long_key", "deep")
ROW_KINDS = ("good", "good_nan", "null_key", "empty_key", "null_ts", "ts_after_9999", "ts_max_long", "not_utf8",
             "long_key")


@st.composite
def json_item(draw: Any, kind: str) -> Item:
    card, ts = draw(cards), draw(times)
    if kind == "good":
        return Item(_line(card, ts), None, card)
    if kind == "good_extra":  # a field the schema does not name: not read
        return Item(_line(card, ts, extra={"x": [1, 2]}), None, card)
    if kind == "good_huge":
        return Item(_line(card, ts, note="x" * draw(st.integers(10_000, 300_000))), None, card)
    if kind == "wrong_type":
        return Item(_line(card, ts).replace(b'"n": 1', b'"n": "one"'), MALFORMED)
    if kind == "not_object":
        return Item(draw(st.sampled_from([b"[1, 2]", b"null", b"5", b'"text"', b"true"])), MALFORMED)
    if kind == "truncated":
        whole = _line(card, ts)
        return Item(whole[:draw(st.integers(1, len(whole) - 1))], MALFORMED)
    if kind == "not_utf8":
        junk = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\xe2\x82"]))
        return Item(b'{"card": "' + card.encode() + junk + b'", "n": 1, "ts": ' + str(ts).encode() + b"}", MALFORMED)
    if kind == "null_key":
        return Item(_line(None, ts), NO_KEY)
    if kind == "no_key":
        return Item(json.dumps({"n": 1, "ts": ts}).encode(), NO_KEY)
    if kind == "null_ts":
        return Item(_line(card, None), NO_TS)
    if kind == "no_ts":
        return Item(json.dumps({"card": card, "n": 1}).encode(), NO_TS)
    if kind == "ts_after_9999":
        return Item(_line(card, draw(st.integers(MAX_MS + 1, 2**62))), OUTSIDE)
    if kind == "ts_before_year_1":
        return Item(_line(card, draw(st.integers(-(2**62), MIN_MS - 1))), OUTSIDE)
    if kind == "ts_max_long":
        return Item(_line(card, draw(st.sampled_from([2**63 - 1, -(2**63)]))), OUTSIDE)
    if kind == "long_key":
        return Item(_line("k" * draw(st.integers(4097, 6000)), ts), LONG_KEY)
    assert kind == "deep"  # deeper than the JSON parser's nesting limit
    depth = draw(st.integers(1_001, 3_000))
    return Item(_line(card, ts)[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}", MALFORMED)


@st.composite
def row_item(draw: Any, kind: str) -> Item:
    card, ts = draw(cards), draw(times)
    row = {"card": card.encode(), "n": 1.0, "ts": ts}
    if kind == "good":
        return Item(row, None, card)
    if kind == "good_nan":  # a DOUBLE may be NaN or infinite in Parquet; the value holds it as Spark writes it
        return Item({**row, "n": draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))}, None, card)
    if kind == "null_key":
        return Item({**row, "card": None}, NO_KEY)
    if kind == "empty_key":
        return Item({**row, "card": b""}, NO_KEY)
    if kind == "null_ts":
        return Item({**row, "ts": None}, NO_TS)
    if kind == "ts_after_9999":
        return Item({**row, "ts": draw(st.integers(MAX_MS + 1, 2**62))}, OUTSIDE)
    if kind == "ts_max_long":
        return Item({**row, "ts": draw(st.sampled_from([2**63 - 1, -(2**63)]))}, OUTSIDE)
    if kind == "long_key":
        return Item({**row, "card": b"k" * draw(st.integers(4097, 6000))}, LONG_KEY)
    assert kind == "not_utf8"
    junk = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80"]))
    return Item({**row, "card": card.encode() + junk}, MALFORMED)


def _cut(draw: Any, n: int, files: int) -> list[int]:
    """Where ``n`` items are cut into at most ``files`` files: sorted cut points (each file one item or more)."""
    if n <= 1:
        return []
    return sorted(draw(st.sets(st.integers(1, n - 1), max_size=min(files - 1, n - 1))))


def _mix(draw: Any, item: Any, kinds: tuple[str, ...]) -> list[Item]:
    """One to three items of every kind (so every example holds each kind), in a drawn order."""
    items = [draw(item(k)) for k in kinds for _ in range(draw(st.integers(1, 3)))]
    return list(draw(st.permutations(items)))


@st.composite
def inputs(draw: Any, files: int) -> dict[str, Any]:
    lines, rows = _mix(draw, json_item, JSON_KINDS), _mix(draw, row_item, ROW_KINDS)
    return {"lines": lines, "line_cuts": _cut(draw, len(lines), files), "rows": rows,
            "row_cuts": _cut(draw, len(rows), files), "files_per_batch": draw(st.integers(1, 3)),
            "write_path": draw(st.sampled_from(["image", "merge"])), "crlf": draw(st.booleans())}


def _pieces(items: list[Item], cuts: list[int]) -> list[list[Item]]:
    bounds = [0, *cuts, len(items)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _binary_table(items: list[Item]) -> Any:
    """The rows as a Parquet table: ``card`` a STRING column written from bytes (not UTF-8 where drawn so)."""
    import pyarrow as pa

    cards = pa.array([it.data["card"] for it in items], pa.binary())
    card = pa.Array.from_buffers(pa.string(), len(cards), cards.buffers())  # the bytes as they are
    return pa.table({"card": card, "n": pa.array([it.data["n"] for it in items], pa.float64()),
                     "ts": pa.array([it.data["ts"] for it in items], pa.int64())})


def write_inputs(root: Path, case: dict[str, Any]) -> dict[str, dict[str, Item]]:
    """The files of ``case`` under ``root``; source position -> item, per input."""
    import pyarrow.parquet as pq

    where: dict[str, dict[str, Item]] = {"lines": {}, "rows": {}}
    (root / "lines").mkdir(parents=True)
    (root / "rows").mkdir(parents=True)
    end = b"\r\n" if case["crlf"] else b"\n"
    for i, part in enumerate(_pieces(case["lines"], case["line_cuts"])):
        name = f"part-{i:03d}.jsonl"
        (root / "lines" / name).write_bytes(end.join(it.data for it in part) + end)
        os.utime(root / "lines" / name, (1_700_000_000 + i, 1_700_000_000 + i))  # read in this order
        where["lines"].update({f"file={name}#line={j + 1}": it for j, it in enumerate(part)})
    for i, part in enumerate(_pieces(case["rows"], case["row_cuts"])):
        name = f"part-{i:03d}.parquet"
        pq.write_table(_binary_table(part), root / "rows" / name)
        os.utime(root / "rows" / name, (1_700_000_000 + i, 1_700_000_000 + i))
        where["rows"].update({f"file={name}#row={j}": it for j, it in enumerate(part)})
    return where


def pipeline(root: Path, files_per_batch: int) -> Pipeline:
    lines = JsonLinesInjector("lines", str(root / "lines"), schema="card STRING, n BIGINT, ts BIGINT",
                              key_column="card", event_time_column="ts", watermark_delay_ms=0,
                              max_event_ahead_ms=None, max_files_per_trigger=files_per_batch)
    rows = ParquetInjector("rows", str(root / "rows"), schema="card STRING, n DOUBLE, ts BIGINT",
                           key_column="card", event_time_column="ts", watermark_delay_ms=0,
                           max_event_ahead_ms=None, max_files_per_trigger=files_per_batch)
    return Pipeline("bad", (lines, rows), (Ids(), RowIds()))


def check_outcome(spark: Any, store: StoreLayout, where: dict[str, dict[str, Item]]) -> None:
    """Every good record's id once in its key's state; every bad one once in dead_letters, with its bytes."""
    from pyspark.sql import functions as F

    codec = get_codec("json")
    rows = rows_frame(spark, store).where(~F.col("key").startswith("\x00")).collect()
    dead = spark.read.format("delta").load(store.dead_letters).collect()
    for stream, comp in (("lines", "json_ids"), ("rows", "parquet_ids")):
        items = where[stream]
        want: dict[str, list[str]] = {}
        for pos, it in items.items():
            if it.reason is None:
                assert it.key is not None
                name, at = pos.removeprefix("file=").split("#line=" if stream == "lines" else "#row=")
                want.setdefault(it.key, []).append(f"{stream}/{name}#{at}")
        got = {r["key"]: codec.decode(r["state"]) for r in rows if r["computation"] == comp}
        assert got == {k: sorted(v) for k, v in want.items()}
        letters = [r for r in dead if r["computation"] == comp]
        by_pos = {r["source_position"]: r for r in letters}
        assert len(by_pos) == len(letters)  # one dead letter per record
        assert set(by_pos) == {p for p, it in items.items() if it.reason is not None}
        for pos, r in by_pos.items():
            it = items[pos]
            assert it.reason is not None and it.reason in r["error"], (pos, it, r["error"])
            if stream == "lines":
                assert bytes(r["raw_value"]) == it.data  # the line as written, byte for byte
            else:  # a row: its columns as JSON (text that is not UTF-8 as U+FFFD)
                shown = json.loads(bytes(r["raw_value"]))
                assert shown.get("card", "") == (it.data["card"] or b"").decode("utf-8", "replace"), (pos, shown)


def run_case(spark: Any, template: Path, zk_server: Any, root: Path, case: dict[str, Any]) -> None:
    where = write_inputs(root, case)
    store = StoreLayout(str(root / "store"))
    copy_migrated_store(template, Path(store.root))
    with deltawheel.connect(spark, store=store.root, zk=zk_server.hosts, zk_chroot=f"/bad-{uuid.uuid4().hex[:12]}",
                            pipeline="bad") as engine:
        engine.run_pipeline(pipeline(root, case["files_per_batch"]), progress=False, write_path=case["write_path"])
    check_outcome(spark, store, where)


_SETTINGS = {"deadline": None, "derandomize": False, "database": None,
             "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture]}


@pytest.mark.timeout(900)
@settings(max_examples=1, **_SETTINGS)  # a Spark run per example; more: the slow test below
@given(case=inputs(files=3))
def test_bad_records_are_dead_letters_and_good_ones_run_once(spark, migrated_template, zk_server, tmp_path,  # type: ignore[no-untyped-def]
                                                             case) -> None:
    run_case(spark, migrated_template, zk_server, tmp_path / uuid.uuid4().hex[:8], case)


@pytest.mark.slow  # 25 generated inputs; the default run's test_bad_records_are_dead_letters_and_good_ones_run_once
@pytest.mark.timeout(7200)
@settings(max_examples=25, **_SETTINGS)
@given(case=inputs(files=6))
def test_bad_records_are_dead_letters_and_good_ones_run_once_many(spark, migrated_template, zk_server,  # type: ignore[no-untyped-def]
                                                                  tmp_path, case) -> None:
    run_case(spark, migrated_template, zk_server, tmp_path / uuid.uuid4().hex[:8], case)
