"""Background gc from a continuous run (``ContinuousRun(background_gc=...)``,
``engine.start_pipeline(..., gc_every=...)``, ``deltawheel run --gc-every``): gc's safe Delta
passes run in a driver thread beside the live stages, a line says when a run started and what it
did, and the streams hold exactly the rows a count made here gives (a run without gc gives them).

Real Spark, ZooKeeper and Delta; files arrive while the pipeline runs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from continuous_pipeline import click_rows, closing_row, expected, make, outputs, write_file
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
from test_continuous import Child, run_cmd, wait_for

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def test_gc_every_parses_batches_and_durations_and_refuses_the_rest() -> None:
    from deltawheel.gc.background import parse_every

    assert parse_every("50") == (50, None)
    assert parse_every(7) == (7, None)
    assert parse_every("10m") == (None, 600.0)
    assert parse_every("2h") == (None, 7200.0)
    for bad in ("0", "-3", "10 parsecs", "", "0s", "m"):
        with pytest.raises(ConfigError, match=r"--gc-every / gc_every takes a number of batches > 0 \(e.g. 50\) or a "
                                              r"duration > 0 with its unit \(30s, 10m, 1h\), got .*nothing was started"):
            parse_every(bad)


def test_deltawheel_run_refuses_a_bad_gc_every_before_anything_starts(tmp_path: Path) -> None:
    """The CLI's usage error names the flag and what it takes; no store is created."""
    store = tmp_path / "store"
    out = subprocess.run([sys.executable, "-m", "deltawheel.cli", "run", "continuous_pipeline:pipeline",
                          "--store", str(store), "--gc-every", "ten"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out
    assert re.search(r"argument --gc-every: --gc-every / gc_every takes a number of batches > 0", out.stderr), out.stderr
    assert not store.exists()


def _gc_done(lines: list[str]) -> list[str]:
    return [ln for ln in lines if re.search(r"background gc #\d+ done in [\d.]+s: compacted \d+ tables", ln)]


def _optimized_tables(spark: Any, layout: StoreLayout) -> list[str]:
    """The store's tables whose history holds an OPTIMIZE that rewrote files."""
    out = []
    for name, path in [*((f"rows of {c}", layout.rows_of(c)) for c in ("user_minutes", "minute_totals")),
                       ("user_counts", layout.stream("user_counts")), ("totals", layout.stream("totals"))]:
        hist = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("operation").collect()
        if any(r["operation"] == "OPTIMIZE" for r in hist):
            out.append(name)
    return out


def _checkpointed(layout: StoreLayout) -> bool:
    """Whether both computations' rows tables have a checkpoint in their logs."""
    return all(any(".checkpoint." in n for n in os.listdir(os.path.join(layout.rows_of(c), "_delta_log")))
               for c in ("user_minutes", "minute_totals"))


@pytest.mark.slow  # about 5 min on a loaded 2-core machine: gc's passes share it with the stages
@pytest.mark.timeout(900)
def test_a_continuous_run_with_gc_every_compacts_and_checkpoints_and_gives_every_row_once(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path) -> None:
    """``engine.start_pipeline(pipeline, gc_every=2)`` as a user writes it: files arrive while both
    stages run; background gc runs every 2 batches beside them (its lines say so and what it did),
    compacting tables and checkpointing the rows table's log; after a graceful stop both streams
    hold exactly the rows counted here, each once."""
    rows = click_rows(160)
    folder, store = tmp_path / "input", tmp_path / "store"
    write_file(folder, "part-0.parquet", rows[:40])
    pipeline = make(str(folder))
    lines: list[str] = []
    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks") as engine:
        engine.progress = lines.append
        with pytest.raises(ConfigError, match=r"gc_every and background_gc both given: give one"):
            engine.start_pipeline(pipeline, gc_every=2, background_gc=object())
        run = engine.start_pipeline(pipeline, gc_every=2, trigger="200 milliseconds")
        assert run.background_gc is not None and run.background_gc.every_batches == 2
        wait_for("stage 1 read the first file", lambda: run.executors["user_minutes"].records_in_total > 0,
                 runs=(run,))
        for i, part in enumerate((rows[40:80], rows[80:120], rows[120:] + [closing_row(rows)]), start=1):
            write_file(folder, f"part-{i}.parquet", part)  # arrive while both stages run
            wait_for(f"stage 1 read file {i}", lambda n=i: run.stages["user_minutes"].batches > n, runs=(run,))
        want_users, want_totals = expected(rows)
        wait_for("both streams hold every row", lambda: len(outputs(spark, engine.layout)[1]) >= len(want_totals),
                 runs=(run,), timeout_s=300)
        wait_for("a background gc ran to its end", lambda: bool(_gc_done(lines)), runs=(run,), timeout_s=300)
        run.stop()
        gc = run.background_gc
        assert not gc.running and not gc.failures, gc.failures
        assert outputs(spark, engine.layout) == (want_users, want_totals)
        assert _optimized_tables(spark, engine.layout), "no table was compacted"
        assert _checkpointed(engine.layout), "a rows table's log was not checkpointed"
    assert any(re.search(r"background gc #1 started$", ln) for ln in lines), lines[-30:]
    assert any("checkpointed" in ln and "rows at " in ln for ln in _gc_done(lines)), _gc_done(lines)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_deltawheel_run_gc_every_runs_gc_beside_the_stages(spark, zk_config, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``deltawheel run ... --gc-every 3`` in a child process, as docs/operations.md shows it: its
    output says when gc ran and what it did; SIGTERM stops it (exit 0) and both streams hold every
    row once."""
    rows = click_rows(160)
    folder, store = tmp_path / "input", tmp_path / "store"
    write_file(folder, "part-0.parquet", rows[:80])
    env = {**os.environ, "CLICKS_INPUT": str(folder),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    child = Child(run_cmd(store, zk_config, "--gc-every", "3"), env)
    try:
        wait_for("the first batch of stage 1", lambda: child.saw(r"user_minutes batch 0: "), timeout_s=600)
        write_file(folder, "part-1.parquet", rows[80:] + [closing_row(rows)])
        layout = StoreLayout(str(store))
        want_users, want_totals = expected(rows)
        wait_for("both streams hold every row and a gc ended",
                 lambda: bool(_gc_done(child.lines)) and len(outputs(spark, layout)[1]) >= len(want_totals),
                 timeout_s=600)
        # to the command's process only: a SIGTERM to its group would also stop Spark's JVM under a gc run
        os.kill(child.proc.pid, signal.SIGTERM)
        assert child.proc.wait(timeout=300) == 0, "\n".join(child.lines[-40:])
    finally:
        if child.proc.poll() is None:
            os.killpg(child.proc.pid, signal.SIGKILL)
    child._reader.join(10)
    assert outputs(spark, layout) == (want_users, want_totals)
    assert _checkpointed(layout)
    failed = [ln for ln in child.lines if "background gc #" in ln and "failed" in ln]
    assert not failed, failed
    print("\n".join(ln for ln in child.lines if "background gc #" in ln))
