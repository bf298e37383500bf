"""Draining a continuous pipeline at the end of its input (``executor/drivers/drain.py``), and an
input folder that does not exist yet when the job module is imported.

A continuous run fires an event-time window only once the watermark passes it, so the last
minutes of an input stay open while the run waits for more. ``run.drain()`` (``deltawheel run
--drain`` at SIGTERM) says the input has ended: every source is read to its end, every watermark
goes to the end of time, every window fires and every stage reads what the one before it
delivered; then it returns with nothing pending and no lease held.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from continuous_pipeline import SCHEMA, click_rows, expected, make, outputs, write_file
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.zk.watermarks import END_OF_TIME
from test_continuous import Child, held_leases, run_cmd, wait_for

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


@pytest.mark.timeout(900)
def test_a_drained_run_fires_every_window_and_returns_with_nothing_pending(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, migrated_at) -> None:
    """The input folder does not exist when the pipeline is made (the injector is built as a job
    module builds it at import); the run creates it, reads a file written while it runs, and
    ``drain`` then gives every minute of both stages, the last ones included, each once."""
    rows = click_rows(120)
    folder = tmp_path / "input"
    pipeline = make(str(folder), schema=SCHEMA)  # no folder yet: nothing raised
    assert not folder.exists()
    want_users, want_totals = expected(rows)
    lines: list[str] = []
    store = migrated_at(tmp_path / "store").root  # a migrated copy: connect migrating a new store runs in test_connect.py
    with deltawheel.connect(spark, store=store, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks") as engine:
        engine.progress = lines.append
        run = engine.start_pipeline(pipeline)
        assert folder.is_dir()  # made at the start, empty
        write_file(folder, "part-0.parquet", rows[:60])
        first = run.executors["user_minutes"]
        wait_for("stage 1 read the first file", lambda: first.records_in_total == 60, runs=(run,))
        write_file(folder, "part-1.parquet", rows[60:])
        # live, the last minutes stay open: no record closes them
        assert len(outputs(spark, engine.layout)[1]) < len(want_totals)
        summary = run.drain()
        assert outputs(spark, engine.layout) == (want_users, want_totals)
        assert summary.low_watermarks == {"user_minutes": END_OF_TIME, "minute_totals": END_OF_TIME}
        assert held_leases(zk_config, "clicks") == []
        assert run.stop() is run.stop()  # stopped already: nothing more to do
    drained = [ln for ln in lines if re.fullmatch(r"clicks: drained in [\d.]+s: every source read, every timer "
                                                  r"fired, every production delivered; leases given back", ln)]
    assert len(drained) == 1, lines[-20:]
    print(drained[0])


@pytest.mark.timeout(900)
def test_a_drain_needs_the_whole_pipeline_in_one_process(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, migrated_at) -> None:
    """A run of some of the computations, or an instance sharing the intervals, cannot read every
    source to its end alone: refused before anything stops."""
    folder = tmp_path / "input"
    write_file(folder, "part-0.parquet", click_rows(20))
    store = migrated_at(tmp_path / "store").root  # a migrated copy: connect migrating a new store runs in test_connect.py
    with deltawheel.connect(spark, store=store, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks") as engine:
        part = engine.start_pipeline(make(str(folder)), computations=["user_minutes"])
        with pytest.raises(ConfigError, match=r"drain: clicks runs only user_minutes here, not minute_totals; a drain "
                                              r"runs every stage to the end"):
            part.drain()
        assert part.queries["user_minutes"].isActive  # refused before anything stopped
        part.stop()
        shared = engine.start_pipeline(make(str(folder)), instance="a")
        with pytest.raises(ConfigError, match=r"drain: clicks runs as instance 'a', sharing its intervals with other "
                                              r"instances"):
            shared.drain()
        shared.stop()


def test_a_run_made_by_hand_cannot_drain(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A ContinuousRun not made by ``engine.start_pipeline`` lacks what the drain's bounded run needs."""
    from deltawheel.executor.drivers.continuous import ContinuousRun

    run = ContinuousRun(None, StoreLayout(str(tmp_path)), make(str(tmp_path / "input"), schema=SCHEMA),
                        wiring=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"drain: the run of clicks was not started by engine.start_pipeline"):
        run.drain()


@pytest.mark.timeout(900)
@pytest.mark.slow  # deltawheel run in a subprocess; the drain itself: test_a_drained_run_fires_every_window_and_returns_with_nothing_pending
def test_deltawheel_run_drain_ends_the_input_at_sigterm(spark, zk_config, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``deltawheel run MODULE:PIPELINE --drain`` on a job module whose input folder does not exist
    yet: the run makes it; files written while it runs are read; SIGTERM then drains (every minute
    of both stages, the last ones included) and the command exits 0."""
    rows = click_rows(100, seed=5)
    folder, store = tmp_path / "input", tmp_path / "store"
    env = {**os.environ, "CLICKS_INPUT": str(folder),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    cmd = run_cmd(store, zk_config, "--drain")
    cmd[cmd.index("continuous_pipeline:pipeline")] = "continuous_pipeline:pipeline_with_schema"
    child = Child(cmd, env)
    wait_for("the run started", lambda: child.saw(r"clicks: running "), timeout_s=600)
    assert folder.is_dir()
    write_file(folder, "part-0.parquet", rows)
    wait_for("stage 1 read the file", lambda: child.saw(r"user_minutes batch \d+: 100 in, "), timeout_s=600)
    os.kill(child.proc.pid, signal.SIGTERM)  # the process, not its group: Spark's JVM must live to drain
    assert child.proc.wait(timeout=600) == 0, "\n".join(child.lines[-40:])
    child._reader.join(10)
    assert any(re.search(r"clicks: drained in [\d.]+s", ln) for ln in child.lines), "\n".join(child.lines[-40:])
    assert outputs(spark, StoreLayout(str(store))) == expected(rows)
    assert held_leases(zk_config, "clicks") == []
