"""The output must not depend on where a batch boundary or a stop falls.

A record delivered downstream but not yet consumed is the downstream's pending work: it holds the
downstream's watermark, and a record is late only against the watermark that held before the batch
that carries it. The tests run the bank pipeline (``bank_pipeline.py``) as a user would and compare
its panes with a reference computed in plain Python.
"""

from __future__ import annotations

import uuid
from itertools import pairwise
from pathlib import Path

import bank_pipeline
import pytest
from bank_pipeline import (
    DELAY_MS,
    LATENESS_MS,
    closing,
    expected_panes,
    make,
    pane_table,
    panes,
    read_stream,
    transactions,
    write_files,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_continuous import wait_for

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)  # an example runs for minutes: report it as found


def on_time(rows: list[dict]) -> dict[tuple[str, int], list[tuple[str, int, int]]]:  # type: ignore[type-arg]
    """What an uncut run gives: one ON_TIME pane per account and window, its value the window's sum."""
    return {k: [("ON_TIME", 0, v)] for k, v in expected_panes(rows).items()}


@pytest.mark.timeout(600)
def test_a_windowed_stage_started_after_its_upstream_read_a_backlog_drops_no_on_time_record(
        spark, zk_config, tmp_path: Path, migrated_at) -> None:  # type: ignore[no-untyped-def]
    """Stage 1 runs alone over 30 s of input; then both stages start, and stage 2's first batch
    holds the whole backlog stage 1 delivered meanwhile (its upstream's watermark long past it).
    No on-time record is dropped, and every window has the ON_TIME pane of the uncut run."""
    rows = transactions(30)
    last = closing(rows)
    write_files(tmp_path / "input", [rows[i:i + 60] for i in range(0, len(rows), 60)] + [[last]])
    pipeline = make(str(tmp_path / "input"))
    store = migrated_at(tmp_path / "store").root  # connect on a new store (migrated then): test_connect.py
    with deltawheel.connect(spark, store=store, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="bank") as engine:
        first = engine.start_pipeline(pipeline, computations=["balance"])
        wait_for("stage 1 read every file", lambda: first.executors["balance"].records_in_total == len(rows) + 1,
                 runs=(first,))
        first.stop()
        both = engine.start_pipeline(pipeline)
        sums = both.executors["window_sums"]
        closed = last["ts"] - DELAY_MS  # the watermark the closing record brings: every window expired
        wait_for("stage 2 acted on the closing watermark",
                 lambda: any((r.input_watermark_ms or 0) >= closed for r in sums.reports), runs=(both,))
        both.stop()
        dropped = read_stream(spark, engine.layout, "sums_dropped")
        got = pane_table(panes(spark, engine.layout))
    assert closed > max(r["ts"] for r in rows) + LATENESS_MS
    assert [d for d in dropped if d["key"] != "zclose"] == []
    assert got == on_time(rows)


# ---------------------------------------------------------------------------------------------------
# The property: the same input cut into micro-batches any way gives the same output.


def cuts_of(n: int, bounds: list[int]) -> list[list[int]]:
    """The file indexes 0..n-1 cut before each of ``bounds`` into consecutive groups."""
    edges = [0, *sorted(set(b for b in bounds if 0 < b < n)), n]
    return [list(range(a, b)) for a, b in pairwise(edges)]


def run_cut(spark, zk_config, migrated_at, root: Path, chunks: list[list[dict]],  # type: ignore[no-untyped-def,type-arg]
            cut: list[list[int]] | None, restarts: set[int], source: str = "parquet") -> dict:  # type: ignore[type-arg]
    """The bank pipeline, bounded, over ``chunks`` (one file each): ``cut`` None reads all files
    at once, one file per batch; else each group of ``cut`` is written and read as one batch (a run
    that keeps the watermark), a new engine after the groups in ``restarts``; the closing file last.
    Returns what a user compares: the panes, the dropped records, the moves and the balances."""
    from executor_util import state_of

    folder, store = root / "input", migrated_at(root / "store").root
    mtime = 1_000_000.0  # the file source reads by modification time: the files' order, whatever the cut

    def write(indexes: list[int]) -> None:
        for i in indexes:
            bank_pipeline.write_file(folder, f"part-{i:04d}.parquet", chunks[i], mtime_s=mtime + i, source=source)

    def engine():  # type: ignore[no-untyped-def]
        return deltawheel.connect(spark, store=str(store), zk=zk_config.hosts,
                                  zk_chroot=f"{zk_config.chroot}-{root.parent.name}-{root.name}", pipeline="bank")

    eng = engine()
    try:
        if cut is None:
            write(list(range(len(chunks))))
            eng.run_pipeline(make(str(folder), files_per_batch=1, source=source), progress=False)
        else:
            for g, group in enumerate(cut):
                write(group)
                eng.run_pipeline(make(str(folder), files_per_batch=None, source=source), end_of_input=g == len(cut) - 1, progress=False)
                if g in restarts:
                    eng.close()
                    eng = engine()
        layout = eng.layout
        moves = sorted((m["account"], m["amount"], m["ts"]) for m in read_stream(spark, layout, "moves"))
        return {"panes": pane_table(panes(spark, layout)),
                "dropped": sorted((d["key"], d["event_time"]) for d in read_stream(spark, layout, "sums_dropped")),
                "moves": moves,
                "balances": {k: v[0] for k, v in state_of(spark, layout, "balance").items()}}
    finally:
        eng.close()


def scenario(seed: int, files: int, disorder_ms: int = 1_500) -> list[list[dict]]:  # type: ignore[type-arg]
    """``files`` chunks of transactions (about 4 s of event time each), the closing record last;
    with ``disorder_ms`` under the watermark delay every record is on time at the source."""
    rows = transactions(4 * files, seed=seed, disorder_ms=disorder_ms)
    size = len(rows) // files
    chunks = [rows[i * size:(i + 1) * size] for i in range(files - 1)] + [rows[(files - 1) * size:]]
    return [*chunks, [closing(rows)]]


def check_invariant(spark, zk_config, migrated_at, root: Path, chunks: list[list[dict]],  # type: ignore[no-untyped-def,type-arg]
                    cuts: list[tuple[list[list[int]], set[int]]], source: str = "parquet") -> None:
    rows = [r for c in chunks[:-1] for r in c]
    reference = run_cut(spark, zk_config, migrated_at, root / "per-file", chunks, None, set(), source)
    assert reference["panes"] == on_time(rows)  # the run reading one file per batch: nothing late
    assert reference["dropped"] == []
    assert len(reference["moves"]) == len(rows) + 1
    for n, (cut, restarts) in enumerate(cuts):
        got = run_cut(spark, zk_config, migrated_at, root / f"cut-{n}", chunks, cut, restarts, source)
        for what in ("panes", "dropped", "moves", "balances"):
            assert got[what] == reference[what], f"{what} differ for the cut {cut} (restarts after {restarts})"


@pytest.mark.timeout(900)
def test_the_output_does_not_depend_on_how_the_input_is_cut_into_batches(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, migrated_at) -> None:
    """A fixed sample: everything in one batch, and a random cut with a restart between two batches,
    each equal to the run that reads one file per batch, pane by pane."""
    chunks = scenario(seed=11, files=5)
    n = len(chunks)
    check_invariant(spark, zk_config, migrated_at, tmp_path, chunks,
                    [([list(range(n))], set()), (cuts_of(n, [2, 3]), {0})])


@pytest.mark.slow
@pytest.mark.timeout(7200)
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), phases=NO_SHRINK, print_blob=True)
@given(seed=st.integers(0, 10_000), files=st.integers(3, 7), source=st.sampled_from(bank_pipeline.SOURCES),
       data=st.data())
def test_random_cuts_and_restarts_give_the_output_of_one_file_per_batch(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, migrated_at, seed, files, source, data) -> None:
    """Random scenarios, sources (Parquet, JSON Lines, a Delta table) and cuts, with restarts
    between random batches: each cut equals the one-file-per-batch run, pane by pane."""
    chunks = scenario(seed=seed, files=files)
    n = len(chunks)
    cuts = [(cuts_of(n, data.draw(st.lists(st.integers(1, n - 1), max_size=n - 1), label="cut")),
             data.draw(st.sets(st.integers(0, n - 1)), label="restarts")) for _ in range(2)]
    check_invariant(spark, zk_config, migrated_at, tmp_path / uuid.uuid4().hex[:8], chunks, cuts, source)


# ---------------------------------------------------------------------------------------------------
# Continuous runs: a stage stopped and restarted mid-flow, the whole process killed.


def feed(folder: Path, chunks: list[list[dict]], upto: int, start: int, *, t0: float) -> int:  # type: ignore[type-arg]
    """Write the files ``start`` .. ``upto - 1`` (modification times in file order); returns ``upto``."""
    import time

    for i in range(start, upto):
        bank_pipeline.write_file(folder, f"part-{i:04d}.parquet", chunks[i], mtime_s=t0 + i)
        time.sleep(0.3)
    return upto


@pytest.mark.slow
@pytest.mark.timeout(3600)
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), phases=NO_SHRINK, print_blob=True)
@given(seed=st.integers(0, 10_000), disorder_ms=st.sampled_from([1_500, 6_000]), data=st.data())
def test_a_windowed_stage_stopped_and_restarted_mid_flow_gives_the_uncut_panes(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, seed, disorder_ms, data) -> None:
    """Files arrive while both stages run live; stage 2 is stopped after a random file and started
    again after a later one (stage 1 goes on meanwhile): the panes are those of the uncut run. With
    a disorder beyond the watermark delay some records are late at the source (``record.late`` at
    stage 1): a window without one has exactly the uncut run's ON_TIME pane, and every window's
    last pane holds every record (nothing dropped)."""
    import time

    chunks = scenario(seed=seed, files=8, disorder_ms=disorder_ms)
    rows = [r for c in chunks[:-1] for r in c]
    n = len(chunks)
    stop_at = data.draw(st.integers(1, n - 2), label="stop after file")
    resume_at = data.draw(st.integers(stop_at + 1, n - 1), label="resume after file")
    root = tmp_path / uuid.uuid4().hex[:8]
    folder, t0 = root / "input", time.time() - 10_000
    written = feed(folder, chunks, 1, 0, t0=t0)
    pipeline = make(str(folder))
    with deltawheel.connect(spark, store=str(root / "store"), zk=zk_config.hosts,
                            zk_chroot=f"{zk_config.chroot}-{root.parent.name}-{root.name}", pipeline="bank") as engine:
        engine.progress = None
        first = engine.start_pipeline(pipeline, computations=["balance"], trigger="200 milliseconds")
        second = engine.start_pipeline(pipeline, computations=["window_sums"], trigger="200 milliseconds")
        written = feed(folder, chunks, stop_at, written, t0=t0)
        second.stop()
        written = feed(folder, chunks, resume_at, written, t0=t0)
        wait_for("stage 1 read what was written", lambda: first.executors["balance"].records_in_total
                 >= sum(len(c) for c in chunks[:written]), runs=(first,))
        second = engine.start_pipeline(pipeline, computations=["window_sums"], trigger="200 milliseconds")
        feed(folder, chunks, n, written, t0=t0)
        closed = chunks[-1][0]["ts"] - DELAY_MS
        sums = second.executors["window_sums"]
        wait_for("stage 2 acted on the closing watermark",
                 lambda: any((r.input_watermark_ms or 0) >= closed for r in sums.reports), runs=(first, second))
        second.stop()
        first.stop()
        dropped = [d for d in read_stream(spark, engine.layout, "sums_dropped") if d["key"] != "zclose"]
        got = pane_table(panes(spark, engine.layout))
        late_at_source = {(m["account"], m["ts"] - m["ts"] % bank_pipeline.WINDOW_MS)
                          for m in read_stream(spark, engine.layout, "moves") if m["late"]}
    assert dropped == []
    want = on_time(rows)
    assert set(got) == set(want)
    assert {k: v for k, v in got.items() if k not in late_at_source} == \
        {k: v for k, v in want.items() if k not in late_at_source}
    assert {k: v[-1][2] for k, v in got.items()} == {k: v[0][2] for k, v in want.items()}
    if disorder_ms < DELAY_MS:
        assert late_at_source == set() and got == want


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_deltawheel_run_killed_twice_while_files_arrive_gives_the_uncut_panes(spark, zk_config, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``deltawheel run bank_pipeline:pipeline`` as a user runs it: its whole process tree
    SIGKILLed twice while files arrive and the same command started again each time; every
    record moves once and the panes are those of the uncut run."""
    import os
    import signal
    import sys
    import time

    from deltawheel.statestore.layout import StoreLayout
    from test_continuous import Child

    chunks = scenario(seed=3, files=10)
    rows = [r for c in chunks[:-1] for r in c]
    folder, store, t0 = tmp_path / "input", tmp_path / "store", time.time() - 10_000
    written = feed(folder, chunks, 2, 0, t0=t0)
    env = {**os.environ, "BANK_INPUT": str(folder),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "deltawheel.cli", "run", "bank_pipeline:pipeline", "--store", str(store),
           "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot, "--zk-session-timeout", "6",
           "--trigger", "200 milliseconds"]
    layout = StoreLayout(str(store))
    for upto in (5, 8):
        child = Child(cmd, env)
        wait_for("a batch of stage 2", lambda c=child: c.saw(r"window_sums batch \d+: [1-9]"), timeout_s=600)
        written = feed(folder, chunks, upto, written, t0=t0)
        os.killpg(child.proc.pid, signal.SIGKILL)
        child.proc.wait(timeout=60)
    feed(folder, chunks, len(chunks), written, t0=t0)
    last = Child(cmd, env)
    want = on_time(rows)
    wait_for("every pane", lambda: last.saw("running") and len(pane_table(panes(spark, layout))) >= len(want),
             timeout_s=900)
    os.killpg(last.proc.pid, signal.SIGTERM)
    assert last.proc.wait(timeout=180) == 0, "\n".join(last.lines[-40:])
    moves = read_stream(spark, layout, "moves")
    assert sorted(m["ts"] for m in moves if m["key"] != "zclose") == sorted(r["ts"] for r in rows)
    assert [d for d in read_stream(spark, layout, "sums_dropped") if d["key"] != "zclose"] == []
    assert pane_table(panes(spark, layout)) == want
