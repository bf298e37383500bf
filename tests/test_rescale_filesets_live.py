"""``deltawheel gc`` prunes the rescaling input-file sets while a continuous pipeline runs: the
``input_sets`` pass asks the running instance for its intervals, the instance hands them over at a
batch boundary and takes them again after the pass's fenced commit, and the pipeline goes on with
the smaller sets (docs/rescaling.md, "Bounded sets"; docs/operations.md, the gc section).

Real Spark, ZooKeeper and Delta; files arrive and are deleted while the pipeline runs. The first
file holds clicks of users of one key interval only: on the image path only that interval's set
records it, the commit of its batch names the other intervals the batch held.
"""

from __future__ import annotations

import os
import time

import pytest
from continuous_pipeline import click_rows, closing_rows, expected, make, outputs, write_file
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import interval_of
from deltawheel.statestore.rowtable.store import RowStore
from test_continuous import wait_for

import deltawheel
from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk]


@pytest.mark.slow  # about 9 min on a loaded 2-core machine (the gc CLI runs every pass beside the stages)
@pytest.mark.timeout(1500)
def test_deltawheel_gc_prunes_the_input_sets_of_a_running_continuous_pipeline(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, capsys) -> None:
    """Instance ``a`` runs the two-stage pipeline; parts 0 and 1 are read, the user deletes part 0
    and runs ``deltawheel gc --apply --lease-wait 120``: the pass takes ``user_minutes``' intervals
    at a batch boundary, drops part 0 from every set in one commit and gives them back; the run
    takes them again, part 2 arrives, and both streams end with exactly the rows counted here
    (what an uninterrupted run gives), each once."""
    clicks = click_rows(160)
    # part 0: the first clicks of users in interval 0 only (the other intervals have no record in it)
    rows = [r for i, r in enumerate(clicks) if i >= 50 or interval_of(r["user"], 4) == 0]
    n0 = sum(1 for r in clicks[:50] if interval_of(r["user"], 4) == 0)
    folder, store = tmp_path / "input", tmp_path / "store"
    write_file(folder, "part-0.parquet", rows[:n0])
    write_file(folder, "part-1.parquet", rows[n0:n0 + 50])
    # the file source takes files by modification time (one per batch): part 0 first, whatever the
    # listing order of two files written in the same millisecond
    stamp = (folder / "part-1.parquet").stat().st_mtime - 10
    os.utime(folder / "part-0.parquet", (stamp, stamp))
    layout = StoreLayout(str(store))
    lines: list[str] = []

    def sets() -> dict[int, frozenset[str]]:
        try:
            return RowStore(spark, layout, writer="check").input_files("user_minutes")
        except Exception:  # the rows table is not there yet
            return {}

    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks", instance="a", wait_s=30) as engine:
        engine.progress = lines.append
        run = engine.start_pipeline(make(str(folder)), trigger="200 milliseconds")
        wait_for("a committed both files", lambda: any("part-1.parquet" in fs for fs in sets().values()),
                 runs=(run,), timeout_s=300)
        before = sets()
        assert [iv for iv in range(4) if "part-0.parquet" in before.get(iv, frozenset())] == [0]
        (folder / "part-0.parquet").unlink()  # the user's retention of the input folder
        args = ["gc", "--store", str(store), "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot,
                "--apply", "--lease-wait", "120"]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert ("[done] input_sets       clicks/user_minutes: 1 of 2 input-file names are gone from their source "
                "and run by each of the 4 intervals: dropped from every set at rows version") in out, out
        after = sets()
        assert all("part-0.parquet" not in fs for fs in after.values()), after
        assert all("part-1.parquet" in after[iv] for iv in range(4)), after
        assert any("user_minutes: handing intervals over to gc" in ln for ln in lines), lines
        wait_for("the run took its intervals again", lambda: any(
            "user_minutes: intervals taken again after gc" in ln for ln in lines), runs=(run,), timeout_s=120)
        write_file(folder, "part-2.parquet", rows[n0 + 50:] + closing_rows(rows))  # arrives after the pass
        want_users, want_totals = expected(rows)
        wait_for("both streams hold every row", lambda: len(outputs(spark, layout)[1]) >= len(want_totals),
                 runs=(run,), timeout_s=300)
        time.sleep(2.0)  # a duplicate would land by now
        assert outputs(spark, layout) == (want_users, want_totals)
        assert "part-0.parquet" not in frozenset().union(*sets().values())
        run.stop()
