"""A live pipeline whose store's disk fills up, or one started on a full disk, starts its failed
stages again inside its driver once space is freed, and counts every record once. A real tmpfs over the store (root only), ZooKeeper and
Spark; the disk is filled with a file as a neighbour's log would fill it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from continuous_pipeline import RunLines, make, outage_input, outputs, write_file

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk,
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")]


@pytest.mark.timeout(900)
def test_a_live_pipeline_whose_disk_filled_up_goes_on_in_its_driver_once_freed(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path: Path) -> None:
    from deltawheel.chaos.disk import StoreDisk

    disk = StoreDisk(tmp_path / "store", 64)
    reason = disk.mount()
    if reason is not None:
        pytest.skip(reason)
    rows, closing, want_users, want_totals = outage_input(tmp_path / "input")
    folder = tmp_path / "input"
    run_lines = RunLines()
    lines, wait, said = run_lines.lines, run_lines.wait, run_lines.said
    try:
        with deltawheel.connect(spark, store=str(tmp_path / "store"), zk=zk_config.hosts,
                                zk_chroot=zk_config.chroot, pipeline="clicks") as engine:
            run = engine.start_pipeline(make(str(folder)), progress=lines.append)
            wait("stage 1 read the first file", lambda: run.executors["user_minutes"].records_in_total >= 20, run)
            disk.fill()
            write_file(folder, "part-1.parquet", rows[20:])  # its batch writes to a full disk
            wait("a stage failed on the full disk", lambda: said("starting the stage again in this driver") >= 1, run)
            assert said("started again in this driver") == 0, lines[-15:]
            disk.free()
            wait("a stage started again in its driver", lambda: said("started again in this driver") >= 1, run)
            wait("stage 1 read the second file", lambda: run.executors["user_minutes"].records_in_total >= 1, run)
            run.stop()
            # started on a full disk: its stages start again in the driver once space is freed
            disk.fill()
            restarted = [ln for ln in lines if "starting the stage again in this driver" in ln]
            lines.clear()
            write_file(folder, "part-2.parquet", [closing])
            run = engine.start_pipeline(make(str(folder)), progress=lines.append)
            # a stage that writes at its start (its fence, a delivery to settle) fails again until freed
            wait("a stage failed twice on the full disk", lambda: said("(restart 2 of at most 5") >= 1, run)
            disk.free()
            # the stages started again live produce every user's minutes once, before any drain
            wait("stage 1's productions after the full disk", lambda: outputs(spark, engine.layout)[0] == want_users,
                 run)
            run.drain()
            run.stop()
            got_users, got_totals = outputs(spark, engine.layout)
    finally:
        gone = disk.unmount()  # the shared Spark application may still hold a file of it open
        assert gone is None or "detached lazily" in gone, gone
    restarted += [ln for ln in lines if "starting the stage again in this driver" in ln]
    assert restarted and all("DiskFullError" in ln or "No space left on device" in ln for ln in restarted), restarted
    assert got_users == want_users
    assert got_totals == want_totals
