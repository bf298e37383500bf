"""Continuous pipelines: every stage's query live at once, until stopped (``continuous.py``).

Real Spark, ZooKeeper and Delta: files are added to the input folder while the pipeline runs, and
both streams end up with exactly the rows a count made here gives, each once.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest
from continuous_pipeline import FailsOn, click_rows, closing_row, expected, make, outputs, write_file
from deltawheel.executor.drivers.triggers import Trigger
from deltawheel.executor.exceptions import BatchFailedError, UserCodeError
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout
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


def test_what_a_run_and_deltawheel_run_refuse_before_anything_starts(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.drivers.continuous import ContinuousRun
    from deltawheel.executor.drivers.pipeline import load_pipeline

    (tmp_path / "input").mkdir()
    pipeline = make(str(tmp_path / "input"))
    with pytest.raises(ConfigError, match=r"pipeline clicks: no computation to run \(computations=\[\]\)"):
        ContinuousRun(None, StoreLayout(str(tmp_path)), pipeline, wiring=None, computations=[])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"pipeline clicks has no computation 'other'"):
        ContinuousRun(None, StoreLayout(str(tmp_path)), pipeline, wiring=None,  # type: ignore[arg-type]
                      triggers={"other": "1s"})
    for bad in (-1, 2.5, True):
        with pytest.raises(ConfigError, match=r"restarts=.*: a stage's restarts in its driver are a whole number >= 0"):
            ContinuousRun(None, StoreLayout(str(tmp_path)), pipeline, wiring=None, restarts=bad)  # type: ignore[arg-type]
    (tmp_path / "myjob.py").write_text("from continuous_pipeline import make\nnot_a_pipeline = 3\n"
                                       "pipeline = make('input')\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert load_pipeline("myjob:pipeline").name == "clicks"
    assert load_pipeline(str(tmp_path / "myjob.py") + ":pipeline").name == "clicks"
    with pytest.raises(ConfigError, match=r"run 'myjob': expected MODULE:PIPELINE, e.g. myjob:pipeline"):
        load_pipeline("myjob")
    with pytest.raises(ConfigError, match=r"run 'nosuchjob:p': cannot import 'nosuchjob'"):
        load_pipeline("nosuchjob:p")
    with pytest.raises(ConfigError, match=r"run 'myjob:nothing': module 'myjob' has no 'nothing'"):
        load_pipeline("myjob:nothing")
    with pytest.raises(ConfigError, match=r"run 'myjob:not_a_pipeline': 'not_a_pipeline' is a int, not a deltawheel "
                                          r"Pipeline"):
        load_pipeline("myjob:not_a_pipeline")


@pytest.mark.timeout(600)
def test_two_live_stages_the_second_started_first_give_every_row_once(spark, zk_config, tmp_path,
                                                                      migrated_at) -> None:  # type: ignore[no-untyped-def]
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
    migrated_at(store)  # a new store, migrated as the template is (the README test's run migrates its own)
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
        wait_for("stage 1 read the first file", lambda: first.executors["user_minutes"].records_in_total > 0,
                 runs=(first, second))
        write_file(folder, "part-1.parquet", rows[40:] + [closing])  # arrives while both stages run
        want_users, want_totals = expected(rows)
        totals = second.executors["minute_totals"]
        wait_for("stage 2 produced every minute's total", lambda: sum(r.productions for r in totals.reports)
                 >= len(want_totals), runs=(first, second))
        stop_first = first.stop()
        second.queries["minute_totals"].stop()  # ended from outside the run
        with pytest.raises(BatchFailedError, match=r"clicks: the query of minute_totals ended by itself; the same "
                                                   r"command again resumes it from its checkpoint"):
            second.check()
        stop_second = second.stop()
        assert [r.records_in for r in (stop_first, stop_second)] == [len(rows) + 1, len(want_users)]
        read = [r for r in first.executors["user_minutes"].reports if r.records_in]
        assert read and all(r.direct for r in read), read  # the tasks read the files from the first start on
        got_users, got_totals = outputs(spark, engine.layout)
        assert got_users == want_users
        assert got_totals == want_totals
        reports = second.executors["minute_totals"].reports
        assert any(r.timers_fired for r in reports)  # stage 1's watermark reached stage 2 through the authority
        assert held_leases(zk_config, "clicks") == []
    stopped = [line for line in lines if "stopped 1 queries after their batch in flight" in line]
    assert len(stopped) == 2 and all("deliveries landed, leases given back" in line for line in stopped), lines[-20:]


@pytest.mark.timeout(300)
def test_user_code_failing_in_a_live_stage_stops_the_run_naming_the_key(
        spark, zk_config, tmp_path, migrated_at) -> None:  # type: ignore[no-untyped-def]
    """As a user meets it: ``process_record`` raises on one user's record while the pipeline runs.
    The run raises UserCodeError naming the key and the error, the failed batch counts nothing, no
    lease stays held, and Spark's query ended on one short line (the driver holds the error:
    Py4J's nested tracebacks once overflowed a regex's stack in Spark's query thread)."""
    from deltawheel import ParquetInjector, Pipeline

    folder, store = tmp_path / "input", tmp_path / "store"
    migrated_at(store)
    clicks = ParquetInjector("clicks", str(folder), key_column="user", event_time_column="ts",
                             record_id_column="id", watermark_delay_ms=0, max_files_per_trigger=1,
                             schema="user STRING, ts BIGINT, id STRING")
    p = Pipeline("fails", injectors=(clicks,), computations=(FailsOn(),))
    write_file(folder, "part-0.parquet", [{"user": "u1", "ts": 1, "id": "a"}, {"user": "u2", "ts": 2, "id": "b"}])
    with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="fails") as engine:
        run = engine.start_pipeline(p, trigger="300 milliseconds")
        try:
            ex = run.executors["fails_on"]
            wait_for("the first file's batch", lambda: ex.records_in_total >= 2, runs=(run,))
            write_file(folder, "part-1.parquet", [{"user": "u1", "ts": 3, "id": "c"}, {"user": "bad", "ts": 4, "id": "d"}])
            with pytest.raises(UserCodeError, match=r"fails_on: user code failed for key 'bad'.*no clicks from bad"):
                wait_for("the failing batch", lambda: False, timeout_s=120, runs=(run,))
            err = run.queries["fails_on"].exception()
            assert err is not None and "UserCodeError: fails_on: user code failed for key 'bad'" in str(err), str(err)[:500]
            assert "x" * 1000 not in str(err) and len(str(err)) < 10_000, str(err)[:500]  # ~20,000 with every trace
        finally:
            run.stop()
        assert ex.records_in_total == 2  # the failed batch counted nothing
    assert held_leases(zk_config, "fails") == []


README = Path(__file__).resolve().parents[1] / "README.md"


def readme_block(after: str, first_line: str) -> str:
    """The first ```python block after the heading ``after`` that starts with ``first_line``."""
    text = README.read_text(encoding="utf-8")
    rest = text[text.index(after):]
    for block in re.findall(r"```python\n(.*?)```", rest, flags=re.S):
        if block.lstrip().startswith(first_line):
            return str(block)
    raise AssertionError(f"no python block starting with {first_line!r} after {after!r} in the README")


@pytest.mark.timeout(600)
def test_the_readme_continuous_example_runs_until_ctrl_c(spark, zk_server, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The README's example (after its BucketCounter) runs as written (its store, ZooKeeper, input
    folder and pipeline name pointed at the test's): both stages live in one call, a file added
    while it runs is read, and Ctrl-C (SIGINT to this process) stops it gracefully once every
    closed bucket reached the second stage; every pane reached it once, the leases are back."""
    counter = readme_block("## A first computation", "from datetime import timedelta")
    block = readme_block("## Continuous pipelines", "import deltawheel")
    store, name = tmp_path / "store", f"buckets_{uuid.uuid4().hex[:8]}"
    block, n = re.subn(r"^STORE, ZK = .*$", f"STORE, ZK = {str(store)!r}, {zk_server.hosts!r}", block, flags=re.M)
    assert n == 1, "the example sets STORE and ZK once"
    block, n = re.subn(r'"data/events"', repr(str(tmp_path / "events")), block)
    assert n == 1, "the example names its input folder once"
    block, n = re.subn(r'"buckets"', repr(name), block)
    assert n == 2, "the example names its pipeline twice"
    rng = random.Random(5)
    rows = [{"q": rng.choice(["shoes", "hats", "socks"]), "ts": i * 500} for i in range(120)]
    write_events(tmp_path / "events", "part-0.parquet", rows[:60])
    want: dict[str, int] = {}
    panes = set()
    for r in rows:
        want[r["q"]] = want.get(r["q"], 0) + 1
        panes.add((r["q"], r["ts"] - r["ts"] % 10_000))
    layout = StoreLayout(str(store))

    def totals() -> list[tuple[str, int]]:
        try:
            return [(v["q"], v["total"]) for v in map(json.loads, (r["value"].decode() for r in
                    spark.read.format("delta").load(layout.stream("totals")).collect()))]
        except Exception:
            return []

    def feed_then_interrupt() -> None:
        while signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            time.sleep(0.2)  # the run's handler is not installed yet
        time.sleep(2.0)
        # arrives while it runs, with a record that closes every bucket (in the same file: files
        # written within one second may be read in any order)
        write_events(tmp_path / "events", "part-1.parquet", rows[60:] + [{"q": "zz", "ts": 600_000}])
        deadline = time.monotonic() + 300
        while len(totals()) < len(panes) and time.monotonic() < deadline:
            time.sleep(3.0)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C

    feeder = threading.Thread(target=feed_then_interrupt, daemon=True)
    feeder.start()
    ns: dict[str, Any] = {"__name__": "readme_continuous"}  # not importable: its classes go to the tasks by value
    exec(compile(counter, "README.md:BucketCounter", "exec"), ns)
    exec(compile(block, "README.md:continuous", "exec"), ns)
    feeder.join()
    got = totals()
    assert len(got) == len(panes)  # one running total per pane, each once
    assert {q: max(t for k, t in got if k == q) for q, _ in got} == want
    out = capsys.readouterr().out
    assert re.search(rf"^{name}: stopped 2 queries after their batch in flight \(\d+ batches, \d+ records in this "
                     r"run\), deliveries landed, leases given back in [\d.]+s$", out, flags=re.M), out[-3000:]
    assert not ns["engine"].client.connected
    assert held_leases(ZkConfig(hosts=zk_server.hosts), name) == []


def run_cmd(store: Path, zk_config: Any, *extra: str) -> list[str]:
    return [sys.executable, "-m", "deltawheel.cli", "run", "continuous_pipeline:pipeline", "--store",
            str(store), "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot, "--zk-session-timeout", "6",
            "--trigger", "200 milliseconds", *extra]


class Child:
    """A ``deltawheel run`` child process whose output lines are collected as they come."""

    def __init__(self, cmd: list[str], env: dict[str, str], *, session: bool = True) -> None:
        # a session of its own, or (session=False) a process group of its own in this session: a stopped
        # process's group must not be orphaned, as Linux continues an orphaned group when a member exits
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=session, process_group=None if session else 0)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def saw(self, pattern: str) -> bool:
        if self.proc.poll() is not None and not any(re.search(pattern, ln) for ln in self.lines):
            self._reader.join(5)
            raise AssertionError(f"exited with {self.proc.returncode}: " + "\n".join(self.lines[-40:]))
        return any(re.search(pattern, ln) for ln in self.lines)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_deltawheel_run_killed_resumes_exactly_once_and_sigterm_stops_it_with_nothing_pending(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path) -> None:
    """``deltawheel run`` in a child process: SIGKILLed after its first batches, the same command
    again resumes while files arrive; SIGTERM then stops it within a bounded time with one line,
    exit status 0; both streams hold every row once and ``recover`` finds nothing to deliver."""
    from deltawheel.executor.drivers.recover import scan

    rows = click_rows(160)
    folder, store = tmp_path / "input", tmp_path / "store"
    write_file(folder, "part-0.parquet", rows[:40])
    env = {**os.environ, "CLICKS_INPUT": str(folder),
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    cmd = run_cmd(store, zk_config)
    first = Child(cmd, env)
    wait_for("the first run's first batch of stage 1", lambda: first.saw(r"^\[.*\] user_minutes batch 0: "),
             timeout_s=600)
    os.killpg(first.proc.pid, signal.SIGKILL)
    first.proc.wait(timeout=60)
    # one file: files written within the same second can be read in any order (their modification
    # times tie), and a later file read first moves the watermark past the earlier one's records
    write_file(folder, "part-1.parquet", rows[40:] + [closing_row(rows)])
    again = Child(cmd, env)
    layout = StoreLayout(str(store))
    want_users, want_totals = expected(rows)
    wait_for("both streams hold every row", lambda: again.saw("running") and
             len(outputs(spark, layout)[1]) >= len(want_totals), timeout_s=600)
    t0 = time.monotonic()
    os.killpg(again.proc.pid, signal.SIGTERM)
    assert again.proc.wait(timeout=180) == 0, "\n".join(again.lines[-40:])
    stopping_s = time.monotonic() - t0
    again._reader.join(10)
    assert any(re.search(r"clicks: stopped 2 queries after their batch in flight .* deliveries landed, leases given "
                         r"back in [\d.]+s$", ln) for ln in again.lines), "\n".join(again.lines[-40:])
    assert outputs(spark, layout) == (want_users, want_totals)
    client = connect_zk(zk_config)
    try:
        pending = scan(spark, layout, client, pipeline="clicks")
    finally:
        client.stop()
        client.close()
    assert pending and all(sum(r.undelivered.values()) == 0 and r.owner is None for r in pending), pending
    print(f"SIGTERM to exit: {stopping_s:.1f}s")


@pytest.mark.timeout(600)
def test_engine_start_on_a_processing_time_trigger_keeps_the_direct_read(spark, zk_config, tmp_path,
                                                                          migrated_at) -> None:  # type: ignore[no-untyped-def]
    """``engine.start(injector, comp, trigger=...)``: a Parquet injector's files are read by the
    tasks themselves on a processing-time trigger too, a file added later is read, and closing the
    engine stops the query; a trigger it cannot parse, or one with ``available_now``, is refused."""
    from continuous_pipeline import UserMinutes

    rows = click_rows(60)
    folder = tmp_path / "input"
    write_file(folder, "part-0.parquet", rows[:30])
    migrated_at(tmp_path / "store")
    clicks = deltawheel.ParquetInjector("clicks", str(folder), key_column="user", event_time_column="ts",
                                        record_id_column="id", watermark_delay_ms=5_000, max_files_per_trigger=1)
    with deltawheel.connect(spark, store=str(tmp_path / "store"), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline="single") as engine:
        engine.progress = False
        with pytest.raises(ConfigError, match=r"start: trigger='1 second' and available_now=True: an availableNow "
                                              r"query reads what is there now and stops"):
            engine.start(clicks, UserMinutes(), trigger="1 second", available_now=True)
        with pytest.raises(ConfigError, match=r"trigger 'soon': expected a processing-time interval"):
            engine.start(clicks, UserMinutes(), trigger="soon")
        query = engine.start(clicks, UserMinutes(), trigger="300 milliseconds")
        ex = engine.executors[-1]
        write_file(folder, "part-1.parquet", rows[30:])
        wait_for("both files read", lambda: ex.records_in_total == len(rows))
        assert query.isActive
        read = [r for r in ex.reports if r.records_in]
        assert read and all(r.direct for r in read), read
    assert not query.isActive
