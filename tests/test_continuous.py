"""Continuous pipelines: every stage's query live at once, until stopped (``continuous.py``).

Real Spark, ZooKeeper and Delta: files are added to the input folder while the pipeline runs, and
both streams end up with exactly the rows a count made here gives, each once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from continuous_pipeline import click_rows, closing_row, expected, make, outputs, write_file
from deltawheel.executor.runtime.continuous import Trigger
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.zk.client import connect as connect_zk
from deltawheel.statestore.zk.lease_tools import list_leases

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def wait_for(what: str, check: Callable[[], bool], *, timeout_s: float = 240.0, poll_s: float = 1.0,
             runs: tuple[Any, ...] = ()) -> None:
    """Wait until ``check()``; a failed batch of one of ``runs`` is raised at once."""
    deadline = time.monotonic() + timeout_s
    while not check():
        for run in runs:
            run.check()
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(poll_s)


def write_events(folder: Path, name: str, rows: list[dict[str, Any]]) -> None:
    """A Parquet file of ``q``, ``ts``, written aside and renamed in."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / f".{name}")
    os.replace(folder / f".{name}", folder / name)


def held_leases(zk_config: Any, pipeline: str) -> list[dict[str, Any]]:
    client = connect_zk(zk_config)
    try:
        return [r for r in list_leases(client, pipeline=pipeline) if r["owner"] is not None]
    finally:
        client.stop()
        client.close()


def test_triggers_parse_and_bad_ones_are_refused() -> None:
    assert Trigger.parse("500 milliseconds") == Trigger(500)
    assert Trigger.parse("2 seconds") == Trigger.parse("2s") == Trigger.parse(2) == Trigger(2_000)
    assert Trigger.parse("1 minute") == Trigger(60_000)
    assert Trigger.parse(None) == Trigger.parse("") == Trigger.parse("0 seconds") == Trigger(None)
    with pytest.raises(ConfigError, match=r"trigger 'soon': expected a processing-time interval such as "
                                          r"'500 milliseconds'"):
        Trigger.parse("soon")
    with pytest.raises(ConfigError, match=r"trigger '5 fortnights'"):
        Trigger.parse("5 fortnights")


@pytest.mark.timeout(600)
def test_two_live_stages_the_second_started_first_give_every_row_once(spark, zk_config, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Stage 2 starts alone on a processing-time trigger, before stage 1 has delivered anything
    (its input table is created up front); stage 1 starts after it; files arrive while both run.
    After a graceful stop both streams hold exactly the rows counted here, each once, and no
    lease is held."""
    rows = click_rows(160)
    closing = closing_row(rows)
    folder = tmp_path / "input"
    write_file(folder, "part-0.parquet", rows[:40])
    pipeline = make(str(folder))
    store = tmp_path / "store"
    lines: list[str] = []
    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks") as engine:
        engine.progress = lines.append
        with pytest.raises(ConfigError, match=r"pipeline clicks has no computation 'nope' \(it has user_minutes, "
                                              r"minute_totals\)"):
            engine.start_pipeline(pipeline, computations=["nope"])
        with pytest.raises(ConfigError, match=r"run_pipeline: trigger, triggers and seconds are for continuous=True"):
            engine.run_pipeline(pipeline, trigger="1 second")
        second = engine.start_pipeline(pipeline, computations=["minute_totals"], trigger="300 milliseconds")
        q2 = second.queries["minute_totals"]
        wait_for("stage 2's query ran a trigger on its empty input", lambda: q2.lastProgress is not None, runs=(second,))
        assert q2.isActive and spark.read.format("delta").load(engine.layout.stream("user_counts")).count() == 0
        first = engine.start_pipeline(pipeline, computations=["user_minutes"])
        for part in range(1, 4):  # files arriving while both stages run
            time.sleep(1.0)
            write_file(folder, f"part-{part}.parquet", rows[part * 40:(part + 1) * 40])
        write_file(folder, "part-9.parquet", [closing])
        want_users, want_totals = expected(rows)
        wait_for("both streams hold every row", lambda: len(outputs(spark, engine.layout)[1]) >= len(want_totals),
                 runs=(first, second))
        stop_first, stop_second = first.stop(), second.stop()
        assert [r.records_in for r in (stop_first, stop_second)] == [len(rows) + 1, len(want_users)]
        got_users, got_totals = outputs(spark, engine.layout)
        assert got_users == want_users
        assert got_totals == want_totals
        reports = second.executors["minute_totals"].reports
        assert any(r.timers_fired for r in reports)  # stage 1's watermark reached stage 2 through the authority
        assert held_leases(zk_config, "clicks") == []
    stopped = [line for line in lines if "stopped 1 queries after their batch in flight" in line]
    assert len(stopped) == 2 and all("deliveries landed, leases given back" in line for line in stopped), lines[-20:]

