"""A standby instance (``--standby``): it shares a continuous pipeline's intervals, holds none while
an instance that is not a standby lives, and takes them all when the last such instance goes. Real
Spark, ZooKeeper and Delta; both instances in this process (two engines, one Spark application).
``deltawheel bench restart`` measures the same after a SIGKILL (docs/latency.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from continuous_pipeline import click_rows, closing_rows, expected, make, outputs, write_file
from deltawheel.statestore.delta import warm
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
from test_continuous import wait_for
from test_continuous_instances import COMPUTATIONS, holders, members

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


@pytest.mark.timeout(900)
def test_a_standby_holds_nothing_until_the_active_instance_goes_then_takes_every_interval(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path: Path, migrated_at) -> None:
    rows = click_rows(120)
    folder, store = tmp_path / "input", tmp_path / "store"
    migrated_at(store)
    write_file(folder, "part-0.parquet", rows[:40])
    pipelines = {name: make(str(folder)) for name in ("a", "s")}
    lines: dict[str, list[str]] = {"a": [], "s": []}

    def engine(instance: str) -> Any:
        e = deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                               pipeline="clicks", instance=instance, wait_s=30)
        e.progress = lines[instance].append
        return e

    with engine("a") as ea, engine("s") as es:
        with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                                pipeline="clicks") as unnamed:
            with pytest.raises(ConfigError, match=r"standby=True needs an instance name"):
                unnamed.start_pipeline(make(str(folder)), standby=True)
        run_a = ea.start_pipeline(pipelines["a"], trigger="200 milliseconds")
        run_s = es.start_pipeline(pipelines["s"], trigger="200 milliseconds", standby=True)
        assert members(zk_config, "clicks") == ["a", "s"]
        wait_for("a read the first file", lambda: run_a.executors["user_minutes"].records_in_total > 0,
                 runs=(run_a, run_s))
        write_file(folder, "part-1.parquet", rows[40:80])  # read by a alone
        wait_for("a read the second file", lambda: run_a.executors["user_minutes"].records_in_total >= 80,
                 runs=(run_a, run_s))
        assert holders(zk_config, "clicks") == {c: ["a"] * 4 for c in COMPUTATIONS}
        assert run_s.executors == {}, "the standby took intervals while a lived"
        # standing by, it warmed Delta's commit path for its takeover's claim (once per process)
        wait_for("the standby's warm-up", lambda: warm._warmed, runs=(run_a, run_s))
        run_a.stop()  # the last instance that is not a standby goes
        wait_for("the standby took every interval", lambda: holders(zk_config, "clicks")
                 == {c: ["s"] * 4 for c in COMPUTATIONS}, runs=(run_s,), timeout_s=180)
        write_file(folder, "part-2.parquet", rows[80:] + closing_rows(rows))
        layout = StoreLayout(str(store))
        want_users, want_totals = expected(rows)
        wait_for("both streams hold every row", lambda: len(outputs(spark, layout)[1]) >= len(want_totals),
                 runs=(run_s,), timeout_s=300)
        time.sleep(2.0)  # a duplicate would land by now
        assert outputs(spark, layout) == (want_users, want_totals)
        run_s.stop()
    assert any("instance s moved from intervals [] to [0, 1, 2, 3]" in ln for ln in lines["s"]), lines["s"][-20:]
