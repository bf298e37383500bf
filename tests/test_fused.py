"""Fused stages (``executor/drivers/fused.py``): a computation run in its upstream's micro-batch, on
what that batch delivered, with no query of its own; exactly-once across a process ending anywhere
in it, and the same rows as the unfused pipeline for any cut of the input.

Real Spark, ZooKeeper and Delta, the two-stage pipeline of ``continuous_pipeline.py``."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from continuous_pipeline import MinuteTotals, click_rows, closing_row, expected, make, outputs, write_file
from deltawheel.executor.drivers.fused import FusedBatch, FusedFeed, fused_position
from deltawheel.executor.drivers.inputs import query_of
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
from test_continuous import Child, held_leases, wait_for

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def drained(rows: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """What a run to the end of input gives for ``rows`` and their closing row: the closing row's
    minute is closed too (its user is left out of the per-user rows, as ``outputs`` reads them)."""
    return expected(rows)[0], expected([*rows, closing_row(rows)])[1]


class OtherTotals(MinuteTotals):
    name = "other_totals"


def test_pairs_that_cannot_fuse_are_refused_when_the_pipeline_is_made(tmp_path: Path) -> None:
    """A pair naming no computation, a computation fed by an injector, one fused to two upstreams and
    an entry that is not a pair are each refused with what to change."""
    base = make(str(tmp_path))
    inj, comps = base.injectors, base.computations

    def fused(*pairs: Any, extra: tuple[Any, ...] = ()) -> Any:
        return deltawheel.Pipeline("clicks", injectors=inj, computations=comps + extra, fused=pairs)

    with pytest.raises(ConfigError, match=r"fused pair \('user_minutes', 'nope'\) names no computation 'nope' "
                                          r"\(it has user_minutes, minute_totals\)"):
        fused(("user_minutes", "nope"))
    with pytest.raises(ConfigError, match=r"user_minutes cannot run fused to minute_totals: a fused computation "
                                          r"reads one stream, which only its upstream produces \(user_minutes reads "
                                          r"clicks, from injector:clicks\)"):
        fused(("minute_totals", "user_minutes"))
    with pytest.raises(ConfigError, match=r"minute_totals is fused twice \(to user_minutes and other_totals\)"):
        fused(("user_minutes", "minute_totals"), ("other_totals", "minute_totals"), extra=(OtherTotals(),))
    with pytest.raises(ConfigError, match=r"each entry is a pair of computation names"):
        fused(("user_minutes",))
    ok = fused(["user_minutes", "minute_totals"])  # a list is a pair too
    assert ok.fused == (("user_minutes", "minute_totals"),) and ok.fused_into() == {"minute_totals": "user_minutes"}


def test_a_position_of_an_earlier_release_is_read_until_one_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``fused.json`` (an earlier release's one file) is the position while ``fused/`` holds none; the
    file that sorts last in ``fused/`` is the position once there is one (a temporary file is not)."""
    chk = TableFiles(str(tmp_path))
    assert fused_position(chk) is None
    (tmp_path / "fused.json").write_text('{"format_version": 1, "batch_id": 4, "first": 7, "stop": 9, "done": false}')
    assert fused_position(chk) == (FusedBatch(4, 7, 9, False), -1)
    (tmp_path / "fused").mkdir()
    for epoch, batch in ((3, FusedBatch(5, 9, 11, True)), (2, FusedBatch(6, 11, 12, True))):
        (tmp_path / "fused" / f"{epoch:012d}-{batch.batch_id:012d}-{int(batch.done)}.json").write_text(batch.text(epoch))
    (tmp_path / "fused" / "000000000009-000000000009-1.json.0a1b2c.tmp").write_text("{")
    assert fused_position(chk) == (FusedBatch(5, 9, 11, True), 3)  # epoch first: a later owner's


def test_a_fused_stage_has_no_query_and_gives_every_row_once(spark, zk_config, tmp_path,
                                                              migrated_at) -> None:  # type: ignore[no-untyped-def]
    """Live, with files arriving: stage 2 runs in stage 1's batches (one query in the run), its tasks
    read what stage 1 delivered; after the stop both streams hold exactly the rows counted here. The
    same store started unfused is refused (its own query would read the input again), and a bounded
    run of the fused pipeline then takes up where the live one stopped."""
    rows = click_rows(160)
    folder, store = tmp_path / "input", tmp_path / "store"
    write_file(folder, "part-0.parquet", rows[:40])
    migrated_at(store)
    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks") as engine:
        with pytest.raises(ConfigError, match=r"fused stages run in one process: user_minutes -> minute_totals is "
                                              r"split by computations="):
            engine.start_pipeline(make(str(folder), fused=True), computations=["minute_totals"])
        with pytest.raises(ConfigError, match=r"instances sharing the intervals \(instance='a'\) run the pipeline "
                                              r"unfused"):
            engine.start_pipeline(make(str(folder), fused=True), instance="a")
        run = engine.start_pipeline(make(str(folder), fused=True), trigger="200 milliseconds")
        assert set(run.queries) == {"user_minutes"} and set(run.executors) == {"user_minutes", "minute_totals"}
        stage1 = run.executors["user_minutes"]
        wait_for("stage 1 read the first file", lambda: stage1.records_in_total > 0, runs=(run,))
        write_file(folder, "part-1.parquet", rows[40:100])
        totals = run.executors["minute_totals"]
        wait_for("stage 2 read what stage 1 delivered", lambda: totals.records_in_total > 0, runs=(run,))
        stale = run.stages["minute_totals"].fused  # its feed, to write late as a zombie would
        report = run.stop()
        assert report.queries == 1
        read = [r for r in totals.reports if r.records_in]
        assert read and all(r.direct for r in read), read  # the tasks read the delivered files themselves
        chk = query_of(engine.layout, "clicks", "minute_totals")[0]
        found = fused_position(TableFiles(chk))
        assert found is not None and found[0].done and found[0].batch_id == max(r.batch_id for r in totals.reports)
        assert not Path(chk, "offsets").exists()  # no query of its own
        with pytest.raises(ConfigError, match=r"minute_totals ran fused to its upstream .* run the pipeline with "
                                              r"the same fused="):
            engine.start_pipeline(make(str(folder)))
        with pytest.raises(ConfigError, match=r"minute_totals ran fused to its upstream"):
            engine.run_pipeline(make(str(folder)))
        write_file(folder, "part-2.parquet", rows[100:] + [closing_row(rows)])
        engine.run_pipeline(make(str(folder), fused=True))  # bounded: to the end of the input
        assert outputs(spark, engine.layout) == drained(rows)
        after = fused_position(TableFiles(chk))
        assert after is not None and after[0].batch_id > found[0].batch_id
        # the first run's feed writes on, as a driver continued after another took the stage over would
        assert isinstance(stale, FusedFeed)
        stale.finished(stale.last)
        stale.finished(replace(stale.last, batch_id=stale.last.batch_id + 1))
        assert fused_position(TableFiles(chk)) == after  # its writes sort below the new owner's
    assert held_leases(zk_config, "clicks") == []


@pytest.mark.parametrize("seed", [3, pytest.param(8, marks=pytest.mark.slow)])
def test_fused_or_not_any_cut_of_the_input_gives_the_same_rows(spark, zk_config, tmp_path, migrated_at,
                                                               seed: int) -> None:  # type: ignore[no-untyped-def]
    """The same clicks cut into files at random places, run bounded once unfused and once fused
    (each run's own cut): both give exactly the rows counted here."""
    rng = random.Random(seed)
    rows = click_rows(150, seed=seed)
    rows.append(closing_row(rows))
    got = {}
    for fused in (False, True):
        folder, store = tmp_path / f"input-{fused}", tmp_path / f"store-{fused}"
        cuts = sorted(rng.sample(range(1, len(rows)), rng.randrange(1, 5)))
        for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(rows)], strict=True)):
            write_file(folder, f"part-{i}.parquet", rows[a:b])
            os.utime(folder / f"part-{i}.parquet", (1_700_000_000 + i, 1_700_000_000 + i))  # read in this order
        migrated_at(store)
        with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                                pipeline=f"cut{seed}{int(fused)}") as engine:
            engine.run_pipeline(make(str(folder), name=f"cut{seed}{int(fused)}", fused=fused))
            got[fused] = outputs(spark, engine.layout)
    assert got[False] == got[True] == drained(rows[:-1])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("point", ["planned", pytest.param("committed", marks=pytest.mark.slow)])
def test_a_process_ending_in_a_fused_batch_resumes_it_exactly_once(spark, zk_config, tmp_path,
                                                                   point: str) -> None:  # type: ignore[no-untyped-def]
    """``deltawheel run`` of the fused pipeline ends (``os._exit``) inside stage 2's first batch that
    reads rows: before it ran, or after its commit landed and before its position said so. The same
    command again resumes while more files arrive; both streams hold every row once."""
    rows = click_rows(160)
    folder, store = tmp_path / "input", tmp_path / "store"
    write_file(folder, "part-0.parquet", rows[:80])
    env = {**os.environ, "CLICKS_INPUT": str(folder), "CRASH_FUSED": f"{point}:1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "deltawheel.cli", "run", "continuous_pipeline:fused_pipeline", "--store",
           str(store), "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot, "--zk-session-timeout", "6",
           "--trigger", "200 milliseconds"]
    first = Child(cmd, env)
    assert first.proc.wait(timeout=600) == 137, "\n".join(first.lines[-40:])
    first._reader.join(10)
    assert any(f"crashing in fused batch 1 ({point})" in ln for ln in first.lines), "\n".join(first.lines[-40:])
    write_file(folder, "part-1.parquet", rows[80:] + [closing_row(rows)])
    env.pop("CRASH_FUSED")
    again = Child(cmd, env)
    layout = StoreLayout(str(store))
    want = expected(rows)
    try:
        wait_for("both streams hold every row", lambda: again.saw("running") and
                 len(outputs(spark, layout)[1]) >= len(want[1]), timeout_s=240)
    finally:
        os.killpg(again.proc.pid, signal.SIGTERM)
    assert again.proc.wait(timeout=180) == 0, "\n".join(again.lines[-40:])
    assert outputs(spark, layout) == want


@pytest.mark.timeout(900)
def test_a_fused_stages_commits_replay_to_an_empty_diff_and_promote(spark, zk_config, tmp_path, capsys,
                                                                     migrated_at) -> None:  # type: ignore[no-untyped-def]
    """Three bounded runs of the fused pipeline on a growing input: each file stage 1 delivered is
    recorded as read by exactly one commit of stage 2; ``deltawheel replay`` of stage 2 from its first
    commit gives no difference, ``deltawheel promote`` of that replay lands, and a drained run after
    it still gives every row once."""
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.inspection.positions import computation_commits

    from deltawheel.cli import main

    rows = click_rows(240)
    folder, store, into, out = tmp_path / "input", tmp_path / "store", tmp_path / "shadow", tmp_path / "diff.json"
    layout = migrated_at(store)
    for i in range(3):
        write_file(folder, f"part-{i}.parquet", rows[i * 80:(i + 1) * 80])
        os.utime(folder / f"part-{i}.parquet", (1_700_000_000 + i, 1_700_000_000 + i))
        PipelineRunner(spark, layout, make(str(folder), fused=True), zk=zk_config, end_of_input=False,
                       progress=lambda _line: None).run()
    commits = [c for c in computation_commits(spark, layout, "minute_totals") if c.files]
    read = [f for c in commits for f in c.files]
    delivered = {f"user_counts/{Path(p).name}" for p in
                 spark.read.format("delta").load(layout.stream("user_counts")).inputFiles()}
    assert len(commits) >= 2 and len(read) == len(set(read)) and set(read) == delivered, (read, delivered)
    zk = ["--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
    assert main(["replay", "--store", str(store), "--pipeline", "clicks", "--computation", "minute_totals",
                 "--from-version", str(commits[0].version), "--code", "continuous_pipeline:MinuteTotals",
                 "--into", str(into), "--diff-out", str(out), *zk]) == 0, capsys.readouterr().out[-3000:]
    assert json.loads(out.read_text())["empty"], capsys.readouterr().out[-3000:]
    assert spark.read.format("delta").load(StoreLayout(str(into)).stream("totals")).count() > 0  # it re-ran batches
    assert main(["promote", "--from", str(into), "--store", str(store), "--pipeline", "clicks", "--computation",
                 "minute_totals", "--wait", "300", *zk]) == 0, capsys.readouterr().out[-3000:]
    write_file(folder, "part-3.parquet", [closing_row(rows)])
    os.utime(folder / "part-3.parquet", (1_700_000_003, 1_700_000_003))
    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks") as engine:
        engine.run_pipeline(make(str(folder), fused=True))
        assert outputs(spark, engine.layout) == drained(rows)



@pytest.mark.timeout(900)
def test_stage_1s_delivery_failing_starts_stage_1_again_not_the_fused_stage(spark, zk_config, tmp_path,
                                                                            migrated_at) -> None:  # type: ignore[no-untyped-def]
    """Stage 1's delivery fails (its stream table unreachable, also when redelivered) right before its
    fused stage 2 would read it: stage 1 is started again in the driver, stage 2 is not blamed, and
    both streams end with every row once."""
    from deltawheel.statestore.exceptions import ObjectStoreUnreachableError

    rows = click_rows(120)
    folder, store = tmp_path / "input", tmp_path / "store"
    write_file(folder, "part-0.parquet", rows[:40])
    migrated_at(store)
    lines: list[str] = []
    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="clicks") as engine:
        engine.progress = lines.append
        run = engine.start_pipeline(make(str(folder), fused=True), trigger="200 milliseconds")
        stage1 = run.executors["user_minutes"]
        wait_for("stage 1 read the first file", lambda: stage1.records_in_total > 0, runs=(run,))
        real, failed = stage1.path.deliver, []

        def unreachable(out, *, strong):  # type: ignore[no-untyped-def]
            if len(failed) < 2:  # the delivery and its redelivery
                failed.append(out.version)
                raise ObjectStoreUnreachableError("the stream table is unreachable")
            return real(out, strong=strong)

        stage1.path.deliver = unreachable
        write_file(folder, "part-1.parquet", rows[40:] + [closing_row(rows)])
        wait_for("stage 1 started again", lambda: any(ln.startswith("user_minutes: started again") for ln in lines),
                 runs=(run,))
        want = expected(rows)
        wait_for("both streams hold every row", lambda: len(outputs(spark, engine.layout)[1]) >= len(want[1]),
                 runs=(run,))
        run.stop()
        assert outputs(spark, engine.layout) == want
    assert len(failed) == 2
    assert any(ln.startswith("user_minutes: ObjectStoreUnreachableError: the stream table is unreachable; "
                             "starting the stage again") for ln in lines), lines
    assert not any(ln.startswith("minute_totals:") and "ObjectStoreUnreachableError" in ln for ln in lines), lines

@pytest.mark.timeout(900)
@pytest.mark.parametrize("fault", ["committed:1:stop",
                                   pytest.param("planned:1:stop", marks=pytest.mark.slow),
                                   pytest.param("planned:1:stop:unaware", marks=pytest.mark.slow)])
def test_a_fused_stage_stopped_past_its_session_is_a_zombie_that_lands_nothing(spark, zk_config, tmp_path,
                                                                               fault: str) -> None:  # type: ignore[no-untyped-def]
    """``deltawheel run`` of the fused pipeline stops (SIGSTOP) in stage 2's first batch that reads rows:
    its position written, before it ran (``planned``) or after its commit landed (``committed``). It
    stays stopped past its ZooKeeper session. The same command started again takes the intervals over
    and runs every row, then stops; the first one, continued (seeing its session end or not:
    ``unaware``), lands nothing and does not move the second's position back: fenced, it stops; having
    seen its session end, it starts its stages again as a new owner. Both streams hold every row
    once; a run after that goes on from where the second left off."""
    rows = click_rows(160)
    folder, store = tmp_path / "input", tmp_path / "store"
    write_file(folder, "part-0.parquet", rows[:80])
    env = {**os.environ, "CLICKS_INPUT": str(folder), "CRASH_FUSED": fault,
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "deltawheel.cli", "run", "continuous_pipeline:fused_pipeline", "--store",
           str(store), "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot, "--zk-session-timeout", "6",
           "--trigger", "200 milliseconds"]
    zombie = Child(cmd, env, session=False)
    layout = StoreLayout(str(store))
    chk = TableFiles(query_of(layout, "clicks", "minute_totals")[0])

    def position() -> FusedBatch:
        found = fused_position(chk)
        assert found is not None
        return found[0]

    env.pop("CRASH_FUSED")
    children = [zombie]
    try:
        wait_for("the first run stopped in fused batch 1", lambda: zombie.saw("stopping in fused batch 1"),
                 timeout_s=600)
        time.sleep(10)  # past its 6 s session: ZooKeeper ends it, its leases go
        children.append(second := Child(cmd, env))
        write_file(folder, "part-1.parquet", rows[80:] + [closing_row(rows)])
        want = expected(rows)
        wait_for("the second run read both files", lambda: second.saw("running") and
                 len(outputs(spark, layout)[1]) >= len(want[1]), timeout_s=300)
        os.killpg(second.proc.pid, signal.SIGTERM)
        assert second.proc.wait(timeout=180) == 0, "\n".join(second.lines[-40:])
        moved = position()
        assert moved.batch_id > 1, moved  # the second run went past batch 1
        assert psutil.Process(zombie.proc.pid).status() == psutil.STATUS_STOPPED  # stopped all along
        os.killpg(zombie.proc.pid, signal.SIGCONT)
        fenced = fault != "planned:1:stop"  # else it sees its session ended and starts again as a new owner
        wait_for("the first run stopped, or started its stages again", lambda: zombie.proc.poll() is not None or
                 sum("started again in this driver" in ln for ln in zombie.lines) >= 2, timeout_s=180)
        log = "\n".join(zombie.lines[-40:])
        assert any("continued in fused batch 1" in ln for ln in zombie.lines), log
        if fenced:
            assert zombie.proc.wait(timeout=60) == 4 and "StaleSequencerError" in zombie.lines[-1], log
        now = position()
        assert now == moved or now.batch_id > moved.batch_id, \
            f"{now}\nwas {moved}\nthe first run:\n" + "\n".join(zombie.lines[-80:])
        assert outputs(spark, layout) == want, log
        closing = closing_row(rows)
        write_file(folder, "part-2.parquet", [{**closing, "ts": closing["ts"] + 10 * 60_000, "id": "closing-2"}])
        if fenced:
            children.append(third := Child(cmd, env))
            wait_for("the third run started", lambda: third.saw("running"), timeout_s=300)
        want = drained(rows)  # the closing row's minute is closed too
        wait_for("a run read the last file", lambda: len(outputs(spark, layout)[1]) >= len(want[1]), timeout_s=300)
        time.sleep(2.0)  # a duplicate would land by now
        assert outputs(spark, layout) == want, "\n".join(children[-1].lines[-40:])
    finally:
        for child in children:
            if child.proc.poll() is None:
                os.killpg(child.proc.pid, signal.SIGCONT)
                os.killpg(child.proc.pid, signal.SIGTERM)
                child.proc.wait(timeout=180)  # its Spark is gone before the next test starts


@pytest.mark.objectstore
@pytest.mark.timeout(900)
def test_a_fused_pipeline_on_an_s3a_store_keeps_one_position_file(spark, zk_config, migrated_s3_store,
                                                                  tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two bounded runs of the fused pipeline on a store on S3Proxy: every row once, and the fused
    stage's position on the object store moved on by the second run, one file left of its writes."""
    from deltawheel.executor.drivers.runner import PipelineRunner
    from deltawheel.statestore.delta.storefs import table_files

    rows, folder, layout = click_rows(120), tmp_path / "input", migrated_s3_store
    chk = table_files(spark, query_of(layout, "clicks", "minute_totals")[0])
    assert chk is not None and not chk.is_local
    seen = []
    for i, part in enumerate((rows[:60], rows[60:] + [closing_row(rows)])):
        write_file(folder, f"part-{i}.parquet", part)
        PipelineRunner(spark, layout, make(str(folder), fused=True), zk=zk_config, end_of_input=i == 1,
                       progress=lambda _line: None).run()
        seen.append(fused_position(chk))
        assert len(chk.listdir("fused") or ()) == 1, chk.listdir("fused")
    first, second = seen
    assert first is not None and second is not None and first[0].done and second[0].done
    assert second[0].batch_id > first[0].batch_id and second[0].first == first[0].stop
    assert second[1] > first[1]  # the second run's leases: a later epoch
    assert outputs(spark, layout) == drained(rows)
