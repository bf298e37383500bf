"""``deltawheel gc`` on a store of two computations, each with its own rows table: the command
compacts and vacuums both tables, and both computations' state reads back unchanged."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

import pytest
from deltawheel.executor.computation import Computation
from executor_util import BucketCounter, events, start_executor, state_of, stop_executor
from pyspark import cloudpickle

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules


class Tally(Computation):
    """Counts the records per query: the store's second computation."""

    name = "tally"
    inputs = {"events": "q"}
    outputs = ()
    num_intervals = 2

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1


def _batches(spark: Any, layout: Any, zk_config: Any, comp: Computation, batches: range) -> None:
    """``batches`` of ``comp`` through the engine (the MERGE path: files add up in its rows table)."""
    ex, client = start_executor(spark, layout, zk_config, comp, write_path="merge", writer=comp.name)
    try:
        for b in batches:
            ex(events(spark, [(f"{comp.name}-r{b}-{i}", f"q{i % 3}", 1_000 * (10 * b + i)) for i in range(6)]), b)
    finally:
        stop_executor(ex, client)


def _files(spark: Any, path: str) -> tuple[int, int]:
    """(live files, data files in the folder) of the Delta table at ``path``."""
    live = int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"])
    on_disk = sum(1 for _d, _s, names in os.walk(path) if "_delta_log" not in _d
                  for n in names if n.endswith(".parquet"))
    return live, on_disk


@pytest.mark.timeout(900)
def test_gc_compacts_and_vacuums_every_computations_rows_table(  # type: ignore[no-untyped-def]
        spark, migrated_store, zk_config, capsys) -> None:
    _batches(spark, migrated_store, zk_config, BucketCounter(), range(2))
    _batches(spark, migrated_store, zk_config, Tally(), range(2))
    tables = {c: migrated_store.rows_of(c) for c in ("buckets", "tally")}
    state = {c: state_of(spark, migrated_store, c) for c in tables}
    assert all(state.values()), state
    before = {c: _files(spark, p) for c, p in tables.items()}
    print(f"files (live, in the folder) before gc: {before}")
    assert all(on_disk > live > 0 for live, on_disk in before.values()), before  # unreferenced files to vacuum
    # as a user runs it on the stopped store: every pass, VACUUM down to the files referenced now
    capsys.readouterr()
    assert main(["gc", "--store", migrated_store.root, "--apply", "--skip-zk", "--vacuum-retain-hours", "0",
                 "--force"]) == 0
    out = capsys.readouterr().out
    after = {c: _files(spark, p) for c, p in tables.items()}
    print(f"files (live, in the folder) after gc: {after}")
    for c in tables:  # each table compacted (OPTIMIZE: one file per partition already here) and vacuumed
        assert re.search(rf"\[done\] compact +computations/{c}/rows: {before[c][0]} files before OPTIMIZE", out), out
        assert re.search(rf"\[done\] vacuum +computations/{c}/rows: vacuumed files older than 0 h", out), out
        assert re.search(rf"\[done\] log +computations/{c}/rows: ", out), out
        assert after[c] == (before[c][0], before[c][0]), (c, before[c], after[c])  # nothing unreferenced left
    # the store's first rows table (empty since migration 8) is vacuumed too
    assert re.search(r"\[done\] vacuum +rows: (vacuumed files older than 0 h|no unreferenced files)", out), out
    assert {c: state_of(spark, migrated_store, c) for c in tables} == state
    # and the engine goes on from there, on both tables
    _batches(spark, migrated_store, zk_config, Tally(), range(2, 3))
    assert sum(v for v, _ in state_of(spark, migrated_store, "tally").values()) == \
        sum(v for v, _ in state["tally"].values()) + 6
