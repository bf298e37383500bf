"""``deltawheel sql`` over a store of two computations, each with its own rows table: the views read
every computation's table, and ``--as-of`` a time reads each table as of then."""

from __future__ import annotations

import datetime as dt
import json
import sys
import time
from typing import Any

import pytest
from executor_util import BucketCounter, events, start_executor, stop_executor
from pyspark import cloudpickle

from deltawheel.cli import main

pytestmark = pytest.mark.spark

# Spark's Python workers cannot import test modules: ship this module's classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class OtherCounter(BucketCounter):
    """The same counter under another name: a second computation with a rows table of its own."""

    name = "other"


def _commit(spark: Any, layout: Any, zk_config: Any, comp: BucketCounter, keys: list[str]) -> None:
    ex, client = start_executor(spark, layout, zk_config, comp, writer=f"w-{comp.name}")
    try:
        ex.run_batch(events(spark, [(f"{comp.name}-{k}", k, 1_000) for k in keys]), 0, input_watermark_ms=None)
    finally:
        stop_executor(ex, client)


def _keys(capsys: Any, *argv: str) -> list[tuple[str, str]]:
    capsys.readouterr()  # the executors' progress lines
    rc = main(["sql", *argv, "--format", "json", "SELECT computation, key FROM state ORDER BY computation, key"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return [(r["computation"], r["key"]) for r in map(json.loads, out.splitlines())]


@pytest.mark.timeout(600)
def test_sql_reads_every_computations_table_and_as_of_a_time_each_as_then(
        spark, migrated_store, zk_config, capsys) -> None:  # type: ignore[no-untyped-def]
    layout = migrated_store
    _commit(spark, layout, zk_config, BucketCounter(), ["a", "b"])
    time.sleep(1.5)  # commit times are in ms: the instant between the two computations' commits
    between = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
    time.sleep(1.5)
    _commit(spark, layout, zk_config, OtherCounter(), ["x", "y"])

    assert _keys(capsys, "--store", layout.root) == [("buckets", "a"), ("buckets", "b"), ("other", "x"), ("other", "y")]
    assert _keys(capsys, "--store", layout.root, "--as-of", between) == [("buckets", "a"), ("buckets", "b")]
    # a version names one computation's table; a bare one is ambiguous with two computations
    assert _keys(capsys, "--store", layout.root, "--as-of", "buckets@0") == []  # its table's creation
    assert main(["sql", "--store", layout.root, "--as-of", "1", "SELECT 1"]) == 3
    err = capsys.readouterr().err
    assert "COMPUTATION@1" in err and "buckets, other" in err, err
