"""The ``input_sets`` pass's evidence read is bounded (``gc/ranlog.py``): a gc opens the JSON commits
of a computation's rows table made since the last gc kept its read, not the table's whole history,
and decides exactly as a read of every commit does.

Real Spark, ZooKeeper and Delta: the pipeline of test_rescale_filesets.py run by an instance
(its commits name the intervals their batch held), and a few hundred commits made directly on its
computation's rows table (the history of a long-lived store).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from deltawheel.gc.inputsets import prune_input_sets
from deltawheel.gc.ranlog import RAN_LOG_FORMAT_VERSION, ran_in_log, read_ran, save_ran, saved_path
from deltawheel.statestore.delta.log import json_commit_versions
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.delta.txn import TableLog
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.inputfiles import commit_entry
from deltawheel.statestore.rowtable.rows import interval_of
from deltawheel.statestore.zk.client import connect
from rescale_instance import KEYS
from test_rescale_filesets import Moves, name

pytestmark = [pytest.mark.spark, pytest.mark.zk]

HISTORY = 300  # commits made directly: a long-lived store's log


def history(spark: Any, rows: str, n: int) -> None:
    """``n`` commits on the rows table, as another computation's shared batches make them (every
    other one naming a file its intervals ran) and commits without input."""
    log = TableLog(spark, rows)
    for i in range(n):
        files = [f"elsewhere-{i:04d}.parquet"] if i % 2 == 0 else []
        log.commit(user_metadata=json.dumps({"computation": "elsewhere",
                                             **commit_entry(i, files, intervals=range(4))}))


def newest_version(rows: str) -> int:
    versions = json_commit_versions(rows)
    assert versions
    return versions[-1]


class Reads:
    """Counts the JSON commits of the rows table's log read through the store's file seam."""

    def __init__(self, monkeypatch: Any, rows: str) -> None:
        self.names: list[str] = []
        real = TableFiles.read_text
        log = os.path.join(rows, "_delta_log")

        def counting(files: TableFiles, rel: str) -> str | None:
            if files.path() == log and re.fullmatch(r"\d{20}\.json", rel):
                self.names.append(rel)
            return real(files, rel)

        monkeypatch.setattr(TableFiles, "read_text", counting)

    def __call__(self) -> int:
        n, self.names = len(self.names), []
        return n


def plans(spark: Any, m: Moves, client: Any) -> tuple[list[tuple[str, int | None]], list[tuple[str, int | None]]]:
    """The pass's plan read on from the kept evidence, and its plan from every commit (the kept
    files, of the first rows table and of key_count's, moved aside meanwhile)."""
    bounded = [(a.detail, a.count) for a in prune_input_sets(spark, m.layout, client, pipelines=["moves"],
                                                              apply=False)]
    kept = [saved_path(m.layout), saved_path(m.layout, "key_count")]
    assert all(k is not None and os.path.exists(k) for k in kept), kept
    for k in kept:
        shutil.move(str(k), f"{k}.aside")
    try:
        full = [(a.detail, a.count) for a in prune_input_sets(spark, m.layout, client, pipelines=["moves"],
                                                               apply=False)]
    finally:
        for k in kept:
            shutil.move(f"{k}.aside", str(k))
    return bounded, full


@pytest.mark.timeout(900)
@pytest.mark.slow  # a benchmark's evidence run; gc's decisions: test_gc.py
def test_gc_reads_the_commits_since_the_last_gc_and_decides_as_a_read_of_every_commit(
        spark: Any, zk_config: Any, tmp_path: Path, monkeypatch: Any, migrated_at: Any) -> None:
    m = Moves(spark, zk_config, tmp_path, migrated_at)
    m.per_trigger = 1  # one file per batch
    only0 = [k for k in KEYS if interval_of(k, 4) == 0]
    m.add(0)
    m.add(1, keys=only0)  # recorded in interval 0's set only; the commit names every interval held
    m.run("a", None)
    rows = m.layout.rows_of("key_count")  # the computation's rows table: the log gc reads
    history(spark, rows, HISTORY)
    reads = Reads(monkeypatch, rows)
    client = connect(zk_config)
    try:
        # gc 1: nothing gone yet; no evidence kept before it: every commit is read, then kept
        first = prune_input_sets(spark, m.layout, client, pipelines=["moves"], apply=True)
        assert [a.count for a in first] == [0], first
        upto = json.loads(Path(str(saved_path(m.layout, "key_count"))).read_text())["upto"]
        assert reads() >= HISTORY + 2
        full_first = ran_in_log(rows)
        assert reads() == upto + 1  # the full read: every version's JSON (no log clean-up ran)

        m.add(2, keys=only0)
        m.run("a", None)
        m.delete(1, 2)
        newest = newest_version(rows)
        # the same evidence as a read of every commit, from the commits after the kept read (and
        # the kept one, opened to check it is this log's)
        reads()
        bounded = read_ran(m.layout, computation="key_count")
        assert reads() == newest - upto + 1 == bounded.read
        full = ran_in_log(rows)
        assert reads() == newest + 1
        print(f"evidence read: {newest + 1} JSON commits read in full, {newest - upto + 1} bounded")
        assert bounded.ran == full and full != full_first
        assert all(name(1) in full["key_count"][iv] and name(2) in full["key_count"][iv] for iv in range(4))

        # the same decisions: both gone files were run by every interval (evidence), so both go
        bounded_plan, full_plan = plans(spark, m, client)
        assert bounded_plan == full_plan, (bounded_plan, full_plan)
        assert [c for _, c in bounded_plan] == [2], bounded_plan
        done = prune_input_sets(spark, m.layout, client, pipelines=["moves"], apply=True)
        assert [a.count for a in done] == [2], done
        assert m.sets() == {iv: frozenset({name(0)}) for iv in range(4)}
        # what was pruned is not kept; the next gc's plan is still the full read's
        kept = json.loads(Path(str(saved_path(m.layout, "key_count"))).read_text())
        assert kept["format_version"] == RAN_LOG_FORMAT_VERSION
        assert not any(name(1) in fs or name(2) in fs for fs in kept["ran"]["key_count"].values())
        assert len(kept["ran"]["elsewhere"]["0"]) == HISTORY // 2
        again, again_full = plans(spark, m, client)
        assert again == again_full and [c for _, c in again] == [0], (again, again_full)

        # kept evidence that is not this log's is not used: every commit is read
        Path(str(saved_path(m.layout, "key_count"))).write_text(json.dumps({**kept, "fingerprint": "0" * 64}))
        newest = newest_version(rows)
        reads()
        got = read_ran(m.layout, computation="key_count")
        assert reads() == got.read == newest + 2  # the check, then every commit
        assert got.ran == ran_in_log(rows)
    finally:
        client.stop()
        client.close()
    # a move after the bounded gc stays exact
    m.add(3)
    m.run("a", None)
    assert m.counts() == m.expected


def _log_of(root: Path, versions: range, *, first_file: int = 0) -> StoreLayout:
    """A store whose computation ``c``'s rows table's log holds JSON commits ``versions``, each a
    batch's naming intervals 0-1 and one file (written as files: the reader reads files)."""
    layout = StoreLayout(str(root))
    log = Path(layout.rows_of("c")) / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    for v in versions:
        meta = {"computation": "c", **commit_entry(v, [f"f{first_file + v}"], intervals=[0, 1])}
        (log / f"{v:020d}.json").write_text(json.dumps({"commitInfo": {"userMetadata": json.dumps(meta)}}) + "\n")
    return layout


def test_kept_evidence_is_used_only_for_the_log_it_was_read_from(tmp_path: Path) -> None:
    """The kept read is used while its last commit is in the log with the same bytes; otherwise
    (that commit cleaned up, the log rewritten or shorter, another format) every commit is read.
    A read continued from an earlier one (``since``, the CLI's read before its log clean-up) reads
    the commits after it that are still there."""
    layout = _log_of(tmp_path / "s", range(5))
    first = read_ran(layout, computation="c")
    assert (first.upto, first.read) == (4, 5) and save_ran(layout, first, computation="c")
    _log_of(tmp_path / "s", range(5, 8))
    on = read_ran(layout, computation="c")
    assert (on.upto, on.read, on.ran) == (7, 4, ran_in_log(layout.rows_of("c")))  # the check, then 5-7
    assert on.ran == {"c": {0: frozenset(f"f{v}" for v in range(8)), 1: frozenset(f"f{v}" for v in range(8))}}
    log = Path(layout.rows_of("c")) / "_delta_log"
    # the same versions written again with other content (a store restored, a table made again)
    _log_of(tmp_path / "s", range(5), first_file=100)
    again = read_ran(layout, computation="c")
    assert again.read == 1 + 8 and again.ran == ran_in_log(layout.rows_of("c"))
    assert "f0" not in again.ran["c"][0] and "f100" in again.ran["c"][0]
    # commits before the kept one cleaned up: the kept read still holds their facts (true ones)
    assert save_ran(layout, again, computation="c")
    for v in range(5):
        (log / f"{v:020d}.json").unlink()
    kept_on = read_ran(layout, computation="c")
    assert (kept_on.read, kept_on.ran) == (1, again.ran) and ran_in_log(layout.rows_of("c"))["c"][0] < again.ran["c"][0]
    # the kept commit itself cleaned up: every commit left is read; a read continued from an
    # earlier one of this run (``since``: not checked) reads the commits after it still there
    other = _log_of(tmp_path / "t", range(5))
    before = read_ran(other, computation="c")
    assert save_ran(other, before, computation="c")
    _log_of(tmp_path / "t", range(5, 8))
    for v in range(6):  # a clean-up below a checkpoint at version 6
        (Path(other.rows_of("c")) / "_delta_log" / f"{v:020d}.json").unlink()
    cleaned = read_ran(other, computation="c")
    assert (cleaned.read, cleaned.ran) == (1 + 2, ran_in_log(other.rows_of("c")))
    continued = read_ran(other, computation="c", since=before)
    assert (continued.read, continued.upto) == (2, 7)
    assert continued.ran["c"][0] == frozenset({"f0", "f1", "f2", "f3", "f4", "f6", "f7"})
    # another format version: not read
    kept = Path(str(saved_path(layout, "c")))
    kept.write_text(kept.read_text().replace(f'"format_version":{RAN_LOG_FORMAT_VERSION}', '"format_version":99'))
    assert read_ran(layout, computation="c").read == 3  # versions 5-7, no check
    # each rows table's read is kept apart: the first table's (nothing read of it here) is none of c's
    assert saved_path(layout) != saved_path(layout, "c") and not os.path.exists(str(saved_path(layout)))
    assert read_ran(layout).ran == {}
    # a remote store keeps nothing (its log is not read here)
    assert saved_path(StoreLayout("s3a://bucket/store")) is None
    assert not save_ran(StoreLayout("s3a://bucket/store"), on)
