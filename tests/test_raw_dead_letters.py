"""Every dead letter of a text source keeps the original text: a JSON line that is malformed, has
no usable key (missing, null, empty, reserved), no timestamp (missing, unparseable), an event time
too far ahead, or that user code refused, is written to ``dead_letters`` with ``raw_value`` the
line byte for byte, on both write paths, keyed by ``RECORD_KEY`` and by a lambda.

One store for the module (each write path its own computation in it), one small input.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import copy_migrated_store
from deltawheel.executor.computation import RECORD_KEY, Computation, ErrorPolicy
from deltawheel.executor.sources.jsonl import JsonLinesInjector
from deltawheel.statestore.layout import StoreLayout
from pyspark import cloudpickle

from tests.executor_util import start_executor, state_of, stop_executor

pytestmark = [pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MALFORMED = "malformed input: the source could not parse it; raw_value holds the original text"
# (line, what makes it a dead letter keyed by RECORD_KEY, ... keyed by the lambda; None: none)
LINES = [
    (r'{"user": "ann", "n": 1, "ts": "1970-01-01T00:00:01Z"}', None, None),
    (r'{ "user" : "bob",   "n": 2, "ts": "1970-01-01T00:00:02Z" }  ', None, None),
    (r'{"user": "ann", "n": oops', MALFORMED, MALFORMED),
    (r'{"n": 3, "ts": "1970-01-01T00:00:03Z", "note": "no user field"}', "key extractor returned an empty key",
     "key extractor failed: KeyError: 'user'"),
    (r'{"user": null, "n": 4, "ts": "1970-01-01T00:00:04Z"}', "key extractor returned an empty key",
     "key extractor failed: KeyError: 'user'"),  # the value leaves null fields out
    (r'{"user": "",   "n": 5, "ts": "1970-01-01T00:00:05Z"}', "key extractor returned an empty key",
     "key extractor returned an empty key"),
    (r'{"user": "\u0000x", "n": 6, "ts": "1970-01-01T00:00:06Z"}', "keys starting with NUL are reserved",
     "keys starting with NUL are reserved"),
    (r'{"user": "c\u00e9dric", "n": 7, "ts": "yesterday"}', "record without timestamp", "record without timestamp"),
    ('{"user": "dan",\t"n": 8}', "record without timestamp", "record without timestamp"),
    (r'{"user": "eve", "n": 9, "ts": "2100-01-01T00:00:00Z"}', "event time 4102444800000 ms is more than",
     "event time 4102444800000 ms is more than"),
    (r'{"user": "fay", "n": 13, "ts": "1970-01-01T00:00:07Z"}', "unlucky 13", "unlucky 13"),
]


class Counter(Computation):
    """Counts records per key, from two streams of the same lines: keyed by the key column and by
    a lambda; refuses n == 13 into the dead letters."""

    name = "counter"
    inputs = {"by_key": RECORD_KEY, "by_lambda": lambda v: v["user"]}
    error_policy = ErrorPolicy.DEAD_LETTER

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        if record.value["n"] == 13:
            raise ValueError("unlucky 13")
        ctx.state = (ctx.state or 0) + 1


class CounterImage(Counter):
    name = "counter_image"


class CounterMerge(Counter):
    name = "counter_merge"


@pytest.fixture(scope="module")
def store(spark: Any, tmp_path_factory: pytest.TempPathFactory, migrated_template: Path) -> StoreLayout:
    layout = StoreLayout(str(tmp_path_factory.mktemp("raw") / "store"))
    copy_migrated_store(migrated_template, Path(layout.root))
    return layout


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lines in two files: a.jsonl with LF line ends, b.jsonl with CRLF (the line is without it)."""
    out = tmp_path_factory.mktemp("lines")
    half = len(LINES) // 2
    for i, (name, part, end) in enumerate((("a.jsonl", LINES[:half], "\n"), ("b.jsonl", LINES[half:], "\r\n"))):
        (out / name).write_bytes(end.join(line for line, _, _ in part).encode() + end.encode())
        os.utime(out / name, (1_700_000_000 + i, 1_700_000_000 + i))
    return out


def positions() -> dict[str, tuple[str, str | None, str | None]]:
    """source position -> (line, reason keyed by RECORD_KEY, by the lambda)."""
    half = len(LINES) // 2
    return {f"file={'a' if i < half else 'b'}.jsonl#line={i + 1 if i < half else i - half + 1}": x
            for i, x in enumerate(LINES)}


@pytest.mark.parametrize(("comp", "path"), [pytest.param(CounterImage(), "image", id="image"),
                                            pytest.param(CounterMerge(), "merge", id="merge", marks=pytest.mark.slow)])
def test_every_dead_letter_of_a_json_line_keeps_the_line(spark: Any, store: StoreLayout, zk_config: Any,
                                                         folder: Path, tmp_path: Path, comp: Counter,
                                                         path: str) -> None:
    from pyspark.sql import functions as F

    schema = "user STRING, n BIGINT, ts STRING"
    by_key = JsonLinesInjector("by_key", str(folder), schema=schema, key_column="user", event_time_column="ts",
                               watermark_delay_ms=0, max_files_per_trigger=2)
    by_lambda = JsonLinesInjector("by_lambda", str(folder), schema=schema, key_column=None, event_time_column="ts",
                                  watermark_delay_ms=0, max_files_per_trigger=2)
    df = by_key.stream_df(spark).withColumn("stream", F.lit("by_key")).unionByName(
        by_lambda.stream_df(spark).withColumn("stream", F.lit("by_lambda")))
    ex, client = start_executor(spark, store, zk_config, comp, write_path=path)
    try:
        query = (df.writeStream.foreachBatch(ex).trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "ck")).start())
        assert query.awaitTermination(300)
    finally:
        stop_executor(ex, client)
    assert type(ex.job).__name__ == {"image": "ImageTasks", "merge": "MergeTasks"}[path]
    assert {k: v for k, v in state_of(spark, store, comp.name).items() if v[0] is not None} == {
        "ann": (2, []), "bob": (2, [])}
    got = {(r["stream"], r["source_position"]): (bytes(r["raw_value"]), r["error"]) for r in spark.read.format(
        "delta").load(store.dead_letters).where(F.col("computation") == comp.name).collect()}
    want = {(stream, pos): line.encode() for pos, (line, *why) in positions().items()
            for stream, reason in zip(("by_key", "by_lambda"), why, strict=True) if reason is not None}
    assert {k: raw for k, (raw, _) in got.items()} == want
    for (stream, pos), (_, error) in got.items():
        line, for_key, for_lambda = positions()[pos]
        assert (for_key if stream == "by_key" else for_lambda) in error, (stream, line, error)


def test_a_text_injector_and_a_stream_table_make_one_input(spark: Any, store: StoreLayout, folder: Path) -> None:
    """The pipeline runner's union of a computation's inputs: a JSON injector's frame has the lines'
    text (``raw_value``), a stream table's has not (null there)."""
    from deltawheel.executor.sources.schema import union_inputs
    from deltawheel.statestore.writepath.streams import ensure_stream_table, stream_schema_ddl
    from pyspark.sql import functions as F

    ensure_stream_table(spark, store, "echo")
    lines = JsonLinesInjector("lines", str(folder), schema="user STRING, n BIGINT, ts STRING", key_column="user",
                              event_time_column="ts", watermark_delay_ms=0, max_files_per_trigger=1).stream_df(spark)
    echo = spark.readStream.format("delta").load(store.stream("echo"))
    stream_columns = [c.split()[0] for c in stream_schema_ddl().split(", ")]
    for frames in ([lines, echo], [echo, lines]):
        both = union_inputs([f.withColumn("stream", F.lit(n)) for f, n in zip(frames, ("a", "b"), strict=True)])
        assert sorted(both.columns) == sorted([*stream_columns, "raw_value", "stream"])
