"""The rescaling input-file sets stay bounded: ``deltawheel gc``'s ``input_sets`` pass drops the
names of input files that every interval has run and that are gone from their source, and moves
stay exact afterwards (docs/rescaling.md, "Bounded sets").

Instances are pipeline runners with their own instance name, run one after the other in this
process on the shared Spark session (as in test_rescale.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.drivers.pipeline import Pipeline
from deltawheel.executor.drivers.runner import PipelineRunner
from deltawheel.executor.protocol.rescale import CATCH_UP_BATCH
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.gc.inputsets import prune_input_sets
from deltawheel.statestore.exceptions import InputGoneError
from deltawheel.statestore.rowtable.rows import interval_of
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.zk.client import connect
from executor_util import state_of
from pyspark import cloudpickle
from rescale_instance import KEYS, KeyCount, write_file

from deltawheel.cli import main

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def name(n: int) -> str:
    return f"part-{n:05d}.parquet"


class Moves:
    """The input folder, the store and its instances (one runner per call)."""

    def __init__(self, spark: Any, zk_config: Any, tmp_path: Path, migrated_at: Any, write_path: str = "image") -> None:
        self.spark, self.zk_config, self.write_path = spark, zk_config, write_path
        # a migrated copy (conftest's migrated_at): connect migrating a new store runs in test_connect.py
        self.folder, self.layout = tmp_path / "in", migrated_at(tmp_path / "store")
        self.expected: dict[str, int] = {}
        self.files: dict[int, dict[str, int]] = {}  # per input file, its records per key
        self.per_trigger = 4  # files per micro-batch

    def add(self, n: int, *, keys: list[str] | None = None) -> None:
        """Input file ``n`` (every key, or only ``keys``), counted in the expected rows."""
        self.files[n] = {k: c for k, c in write_file(self.folder, n).items() if keys is None or k in keys}
        for k, c in self.files[n].items():
            self.expected[k] = self.expected.get(k, 0) + c
        if keys is not None:  # rewrite it with those keys only
            import pyarrow as pa
            import pyarrow.parquet as pq

            path = self.folder / name(n)
            t = pq.read_table(path)
            stamp = path.stat().st_mtime  # write_file's: the file source takes files in that order
            pq.write_table(t.filter(pa.compute.is_in(t["key"], pa.array(keys))), path)
            os.utime(path, (stamp, stamp))

    def delete(self, *ns: int) -> None:
        for n in ns:
            (self.folder / name(n)).unlink()

    def run(self, instance: str, intervals: list[int] | None) -> list[Any]:
        inj = ParquetInjector("events", str(self.folder), key_column="key", event_time_column="t",
                              watermark_delay_ms=1_000, max_files_per_trigger=self.per_trigger, max_event_ahead_ms=None)
        r = PipelineRunner(self.spark, self.layout, Pipeline("moves", (inj,), (KeyCount(),)), zk=self.zk_config,
                           wait_s=20, instance=instance, intervals=intervals, write_path=self.write_path,
                           warm_workers=False)
        return list(r.run().reports["key_count"])

    def sets(self) -> dict[int, frozenset[str]]:
        return RowStore(self.spark, self.layout, writer="check").input_files("key_count")

    def counts(self) -> dict[str, int]:
        return {k: s for k, (s, _) in state_of(self.spark, self.layout, "key_count").items()}


@pytest.mark.timeout(600)
def test_gc_drops_the_names_of_deleted_files_and_a_restart_does_not_catch_up_on_them(
        spark: Any, zk_config: Any, tmp_path: Path, migrated_at: Any) -> None:
    m = Moves(spark, zk_config, tmp_path, migrated_at)
    for n in range(2):
        m.add(n)
    m.run("a", None)
    m.delete(0)
    client = connect(zk_config)
    try:
        assert [a.count for a in prune_input_sets(spark, m.layout, client, pipelines=["moves"], apply=True)] == [1]
    finally:
        client.stop()
        client.close()
    assert m.sets() == {iv: frozenset({name(1)}) for iv in range(4)}
    m.add(2)
    # a takes its intervals again: its query consumed part 0, which no set holds now and which is
    # gone: nothing to catch up on (it was run by every interval); part 2 is processed
    reports = m.run("a", None)
    assert [r for r in reports if r.batch_id == CATCH_UP_BATCH] == []
    assert m.counts() == m.expected


@pytest.mark.timeout(600)
def test_gc_drops_a_deleted_file_that_held_records_of_one_interval_only(
        spark: Any, zk_config: Any, tmp_path: Path, migrated_at: Any) -> None:
    """The image path rewrites, and so records a batch's files in, only the intervals with records;
    the batch's commit names every interval it held, and gc counts those as having run the file."""
    m = Moves(spark, zk_config, tmp_path, migrated_at)
    m.per_trigger = 1  # one file per batch
    only0 = [k for k in KEYS if interval_of(k, 4) == 0]
    m.add(0)
    m.add(1, keys=only0)
    m.run("a", None)
    sets = m.sets()
    assert [name(1) in sets[iv] for iv in range(4)] == [True, False, False, False]
    m.delete(1)
    client = connect(zk_config)
    try:
        done = prune_input_sets(spark, m.layout, client, pipelines=["moves"], apply=True)
    finally:
        client.stop()
        client.close()
    assert [a.count for a in done] == [1], done[0].detail
    assert m.sets() == {iv: frozenset({name(0)}) for iv in range(4)}
    m.add(2)
    # b takes 2 and 3: its new query reads parts 0 and 2 (1 is gone): 0 is skipped for every interval
    reports = m.run("b", [2, 3])
    assert sum(r.skipped_moved for r in reports) == sum(m.files[0][k] for k in KEYS if interval_of(k, 4) in (2, 3))
    # a takes them back: its query consumed parts 0 to 2, part 1 in no set and gone (run by every
    # interval): nothing to catch up on
    reports = m.run("a", None)
    assert [r for r in reports if r.batch_id == CATCH_UP_BATCH] == []
    assert m.counts() == m.expected


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("write_path", ["image", "merge"])
def test_gc_drops_the_names_every_interval_ran_and_a_later_move_stays_exact(
        spark: Any, zk_config: Any, tmp_path: Path, write_path: str, migrated_at: Any) -> None:
    m = Moves(spark, zk_config, tmp_path, migrated_at, write_path)
    for n in range(3):
        m.add(n)
    m.run("a", [0, 1])
    m.run("b", [2, 3])
    assert m.sets() == {iv: frozenset(name(n) for n in range(3)) for iv in range(4)}
    m.delete(0, 1)  # the user's retention of the input folder
    client = connect(zk_config)
    try:
        planned = prune_input_sets(spark, m.layout, client, pipelines=["moves"], apply=False)
        assert [(a.pass_name, a.table, a.count) for a in planned] == [("input_sets", "moves/key_count", 2)]
        assert "2 of 3 input-file names are gone" in planned[0].detail, planned[0].detail
        assert len(m.sets()[0]) == 3  # a plan changes nothing
        done = prune_input_sets(spark, m.layout, client, pipelines=["moves"], apply=True)
        assert [a.count for a in done] == [2]
        assert "dropped from every set at rows version" in done[0].detail, done[0].detail
    finally:
        client.stop()
        client.close()
    # bounded: each set holds only the names still present
    assert m.sets() == {iv: frozenset({name(2)}) for iv in range(4)}
    m.add(3)
    # b takes 0 and 1: its query consumed parts 0-2; the pruned 0 and 1 are not caught up on (gone,
    # in no set, run by every interval), part 3 is processed for every interval
    reports = m.run("b", None)
    assert [r for r in reports if r.batch_id == CATCH_UP_BATCH] == []
    assert m.sets() == {iv: frozenset({name(2), name(3)}) for iv in range(4)}
    # a takes everything back: its query is one file behind; part 3 is skipped (b ran it)
    reports = m.run("a", None)
    assert sum(r.skipped_moved for r in reports) == len(KEYS) * 4  # part 3: each key 3 % 5 + 1 times
    assert m.counts() == m.expected  # the rows of one uninterrupted run


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_file_deleted_before_every_interval_ran_it(spark: Any, zk_config: Any, tmp_path: Path,
                                                     migrated_at: Any) -> None:
    m = Moves(spark, zk_config, tmp_path, migrated_at)
    m.per_trigger = 1  # one file per batch
    m.add(0)
    m.run("a", [0, 1])
    m.run("b", [2, 3])
    # b, holding 2 and 3, runs part 1 (every key) for them, then part 2, which holds keys of
    # interval 0 only: b commits nothing for it, so it is in no interval's set
    only0 = [k for k in KEYS if interval_of(k, 4) == 0]
    m.add(1)
    m.add(2, keys=only0)
    m.run("b", [2, 3])
    sets = m.sets()
    assert [name(1) in sets[iv] for iv in range(4)] == [False, False, True, True]
    assert all(name(2) not in fs for fs in sets.values())
    m.delete(1, 2)
    client = connect(zk_config)
    try:  # neither is in every set: gc keeps them
        assert [a.count for a in prune_input_sets(spark, m.layout, client, pipelines=["moves"], apply=True)] == [0]
    finally:
        client.stop()
        client.close()
    # b takes 0 and 1: part 1 is in the sets of 2 and 3, not of 0 and 1, and gone: the move cannot be exact
    with pytest.raises(InputGoneError, match=r"gone from the injector's folder \(e.g. part-00001.parquet\)"):
        m.run("b", None)
    # once part 1 is back (restored from a backup), the move goes through; part 2 is gone and in no
    # set: it is left out silently (documented: its records of interval 0 are never processed)
    write_file(m.folder, 1)
    reports = m.run("b", None)
    catch = [r for r in reports if r.batch_id == CATCH_UP_BATCH]
    assert [r.processed for r in catch] == [m.files[1][KEYS[0]] * sum(1 for k in KEYS if interval_of(k, 4) in (0, 1))]
    assert m.counts() == {k: m.files[0][k] + m.files[1][k] for k in KEYS}  # the files processed: not part 2
    assert m.counts() != m.expected  # part 2's records of interval 0 were lost with the file


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_deltawheel_gc_reports_the_input_sets_pass(spark: Any, zk_config: Any, tmp_path: Path, capsys: Any,
                                                   migrated_at: Any) -> None:
    m = Moves(spark, zk_config, tmp_path, migrated_at)
    for n in range(2):
        m.add(n)
    m.run("a", [0, 1])
    m.run("b", [2, 3])
    m.delete(0)
    args = ["gc", "--store", m.layout.root, "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert ("[plan] input_sets       moves/key_count: 1 of 2 input-file names are gone from their source and run "
            "by each of the 4 intervals: would be dropped from every set") in out, out
    assert m.sets() == {iv: frozenset({name(0), name(1)}) for iv in range(4)}
    assert main([*args, "--apply"]) == 0
    out = capsys.readouterr().out
    assert "[done] input_sets       moves/key_count: 1 of 2 input-file names are gone" in out, out
    assert m.sets() == {iv: frozenset({name(1)}) for iv in range(4)}
    m.add(2)
    m.run("b", None)
    m.run("a", None)
    assert m.counts() == m.expected
