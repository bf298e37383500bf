"""Key extractors through real Spark batches: every form docs/embedding.md lists (a field name,
``RECORD_KEY``, a lambda, a module-level function, a bound method) keys its records the same on
both write paths, and a callable that raises or returns a non-string makes dead letters there.

One store for the module (each write path its own computation in it), small inputs.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import copy_migrated_store
from deltawheel.executor.computation import RECORD_KEY, Computation
from deltawheel.executor.tasks.input import interval_of_key, key_expression
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.writepath.streams import stream_schema_ddl
from pyspark import cloudpickle

from tests.executor_util import start_executor, state_of, stop_executor

pytestmark = [pytest.mark.spark, pytest.mark.zk]
# Spark's Python workers cannot import test modules: ship this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

J = get_codec("json")


def country_of(value: Any) -> Any:
    """A module-level key extractor."""
    return value["country"]


class Keys:
    """Its bound method is a key extractor."""

    def __init__(self, field: str) -> None:
        self.field = field

    def of(self, value: Any) -> Any:
        return value[self.field]


class KeyedCounter(Computation):
    """Counts its records per key and input stream; each input keyed by another form."""

    name = "keyed"
    num_intervals = 2
    inputs = {
        "by_field": "country",
        "by_record_key": RECORD_KEY,
        "by_lambda": lambda v: v["country"],
        "by_function": country_of,
        "by_method": Keys("country").of,
        "raising": lambda v: v["region"],  # no such field: KeyError
        "not_a_string": lambda v: len(v["country"]),  # an int
    }

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        st = dict(ctx.state or {})
        st[record.stream] = st.get(record.stream, 0) + 1
        ctx.state = st


class KeyedImage(KeyedCounter):
    name = "keyed_image"


class KeyedMerge(KeyedCounter):
    name = "keyed_merge"


COUNTRIES = ("de", "fr", "de")
KEYED = ("by_field", "by_record_key", "by_lambda", "by_function", "by_method")


def frame(spark: Any) -> Any:
    """Three records per input stream (a ``stream`` column names it); the key column holds the
    country too (``RECORD_KEY``)."""
    rows = [{"record_id": f"{s}-{i}", "key": c, "value": J.encode({"country": c, "n": i}), "codec": "json",
             "timestamp_ms": 1_000 + i, "event_time": None, "producer": "test", "commit_id": f"pos-{s}-{i}",
             "format_version": 1, "stream": s}
            for s in KeyedCounter.inputs for i, c in enumerate(COUNTRIES)]
    return spark.createDataFrame(rows, schema=stream_schema_ddl().replace(" NOT NULL", "") + ", stream STRING")


@pytest.fixture(scope="module")
def store(spark: Any, tmp_path_factory: pytest.TempPathFactory, migrated_template: Path) -> StoreLayout:
    layout = StoreLayout(str(tmp_path_factory.mktemp("keys") / "store"))
    copy_migrated_store(migrated_template, Path(layout.root))
    return layout


@pytest.mark.parametrize(("comp", "path"), [pytest.param(KeyedImage(), "image", id="image"),
                                            pytest.param(KeyedMerge(), "merge", id="merge", marks=pytest.mark.slow)])
def test_every_key_extractor_form_keys_a_spark_batch(spark: Any, store: StoreLayout, zk_config: Any,
                                                     comp: KeyedCounter, path: str) -> None:
    ex, client = start_executor(spark, store, zk_config, comp, write_path=path)
    try:
        ex(frame(spark), 0)
    finally:
        stop_executor(ex, client)
    assert type(ex.job).__name__ == {"image": "ImageTasks", "merge": "MergeTasks"}[path]
    want = {"de": ({s: 2 for s in KEYED}, []), "fr": ({s: 1 for s in KEYED}, [])}
    assert state_of(spark, store, comp.name) == want
    dead = sorted((r["record_id"], r["key"], r["error"], J.decode(r["raw_value"])["n"]) for r in spark.read.format(
        "delta").load(store.dead_letters).where(f"computation = '{comp.name}'").collect())
    assert dead == [(f"not_a_string-{i}", None, "key extractor returned int 2", i) for i in range(3)] + [
        (f"raising-{i}", None, "key extractor failed: KeyError: 'region'", i) for i in range(3)]


def test_the_testing_harness_keys_and_dead_letters_records_as_a_spark_batch_does(spark: Any,
                                                                              store: StoreLayout) -> None:
    """``ComputationTester`` applies the same rules as the batch above (run first in this module): the
    same state per key and, for an extractor that raises or returns a non-string, a dead letter with
    the same reason, where it used to raise or turn the int into a key. Also a numeric field, a
    missing field and an empty key, each as the JVM's preparation decides."""
    from deltawheel.testing import ComputationTester

    comp = KeyedImage()
    t = ComputationTester(comp)
    for s in KeyedCounter.inputs:
        for i, c in enumerate(COUNTRIES):
            if s == "by_record_key":
                t.add({"country": c, "n": i}, event_time_ms=1_000 + i, stream=s, key=c, record_id=f"{s}-{i}")
            else:
                t.add({"country": c, "n": i}, event_time_ms=1_000 + i, stream=s, record_id=f"{s}-{i}")
    assert {k: t.state(k) for k in t.keys()} == {k: v for k, (v, _) in state_of(spark, store, comp.name).items()}
    spark_dead = sorted((r["record_id"], r["error"]) for r in spark.read.format("delta").load(
        store.dead_letters).where(f"computation = '{comp.name}'").collect())
    assert sorted((rec.record_id, why) for rec, why in t.dead_letters) == spark_dead

    fields = type("Fields", (KeyedCounter,), {"name": "fields", "inputs": {"s": "n"}})()
    u = ComputationTester(fields)
    for i, v in enumerate(({"n": 5}, {"m": 1}, {"n": ""}, {"n": None})):
        u.add(v, event_time_ms=1, record_id=f"f{i}")
    assert u.keys() == ["5"]
    assert [why for _, why in u.dead_letters] == ["no field 'n' in the value", "key extractor returned an empty key",
                                                  "no field 'n' in the value"]


def test_the_rescale_filter_keys_records_as_the_batch_does(spark: Any) -> None:
    """A new owner of a moved interval drops records by the interval of ``key_expression``
    (``rescale.py``): the same keys, callables included, as the batch gives them."""
    comp = KeyedImage()
    got = {(r["record_id"], r["iv"]) for r in frame(spark).select(
        "record_id", "stream", interval_of_key(2, key_expression(comp)).alias("iv")).collect()
        if r["stream"] in KEYED}
    assert got == {(f"{s}-{i}", zlib.crc32(c.encode()) % 2) for s in KEYED for i, c in enumerate(COUNTRIES)}


def test_only_a_key_column_extractor_lets_the_tasks_read_parquet_files_themselves(
        spark: Any, store: StoreLayout, zk_config: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The direct read computes keys from the key column only: a computation keyed by any other
    form reads the same injector through the JVM's input preparation (above)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltawheel.executor.drivers.inputs import direct_source
    from deltawheel.executor.sources.parquet import ParquetInjector

    folder = tmp_path_factory.mktemp("parquet")
    pq.write_table(pa.table({"country": ["de", "fr"], "t": pa.array([1, 2], pa.int64())}), folder / "part-0.parquet")
    inj = ParquetInjector("clicks", str(folder), key_column="country", event_time_column="t", watermark_delay_ms=0, max_files_per_trigger=1)
    inj.stream_df(spark)
    assert inj.direct_source() is not None
    for extractor, direct in ((RECORD_KEY, True), ("country", False), (lambda v: v["country"], False),
                              (country_of, False), (Keys("country").of, False)):
        comp = type("Clicks", (KeyedCounter,), {"name": "clicks_keyed", "inputs": {"clicks": extractor}})()
        # as the bounded runner asks (``checkpoint=None``: no stream table read directly)
        assert (direct_source(comp, {inj.name: inj}, layout=store, checkpoint=None) is not None) is direct, extractor
