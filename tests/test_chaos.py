"""``deltawheel chaos``: the bank pipeline as two ``deltawheel run`` instances on a three-server
ZooKeeper ensemble under seeded, overlapping faults, then the independent checker.

The checker's own tests build stream tables with delta-rs (no Spark): the streams a correct run
gives pass, and each kind of damage (a record twice, a leg lost, a window's sum changed) is named.
The run tests go through the command line; the default one keeps the chaos phase short because
starting the ensemble and two drivers already takes minutes on a busy machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from deltawheel.chaos.bank import WINDOW_MS, closing_moves, moves, write_moves
from deltawheel.chaos.checker import check_run, reference_legs
from deltawheel.chaos.faults import INSTANCES, KINDS, TOOLS, plan

SEED = 11
#: The default run's seed and kinds: every kind that starts no Spark application of its own (the
#: operator tools that do, gc, repair, upgrade-state and promote, have their own tests beside a
#: live pipeline, test_handover_shared and test_promote_live, and run in the slow ten-minute run).
RUN_SEED = 51
RUN_KINDS = ("driver-kill", "driver-pause", "session-expiry", "worker-kill", "zk-kill", "zk-leader-kill",
             "disk-full", "rebalance", "status")


# --- the schedule ----------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), seconds=st.floats(10, 3_600))
@example(seed=306, seconds=3500.0)  # its last fault's start, rounded up after the check, healed at the end
def test_a_seed_replays_its_schedule_and_one_target_has_one_fault_at_a_time(seed: int, seconds: float) -> None:
    faults = plan(seed, seconds)
    assert faults == plan(seed, seconds)
    assert all(f.kind in KINDS and 0 < f.at and f.at + f.duration_s < seconds for f in faults)
    for slot in {f.slot for f in faults}:
        mine = [f for f in faults if f.slot == slot]
        assert all(a.at + a.duration_s <= b.at for a, b in zip(mine, mine[1:], strict=False)), mine
    assert all(f.target in INSTANCES for f in faults if f.kind.startswith("driver") or f.kind == "session-expiry")


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(1, 10**6), seconds=st.sampled_from(["60", "90.5", "3600"]),
       gap=st.sampled_from([None, "5", "20", "2.5"]), tmpfs=st.sampled_from([None, "0", "64"]),
       kinds=st.lists(st.sampled_from(sorted(KINDS)), unique=True, max_size=3), s3=st.booleans())
def test_the_printed_replay_command_draws_the_same_schedule(seed: int, seconds: str, gap: str | None,
                                                           tmpfs: str | None, kinds: list[str], s3: bool) -> None:
    """What a user copies from a run's first line gives the options that shape the schedule again."""
    from deltawheel.cli import build_parser
    from deltawheel.cli.chaos import replay_command

    argv = ["chaos", "--data", "somewhere", "--seed", str(seed), "--seconds", seconds]
    argv += ["--mean-gap", gap] * (gap is not None) + ["--store-tmpfs-mb", tmpfs] * (tmpfs is not None)
    argv += ["--kinds", ",".join(kinds)] * bool(kinds) + ["--object-store"] * s3
    first = build_parser().parse_args(argv)
    line = replay_command(first, seed)
    assert line.startswith("deltawheel chaos ")
    again = build_parser().parse_args(line.split()[1:])
    shaping = ("seed", "seconds", "mean_gap", "store_tmpfs_mb", "kinds", "object_store")
    assert [getattr(again, k) for k in shaping] == [getattr(first, k) for k in shaping], line
    assert plan(seed, again.seconds, mean_gap_s=again.mean_gap, kinds=tuple(kinds) or tuple(KINDS)) == \
        plan(seed, first.seconds, mean_gap_s=first.mean_gap, kinds=tuple(kinds) or tuple(KINDS))


def test_long_schedules_draw_every_kind_and_seeds_differ() -> None:
    assert {f.kind for f in plan(SEED, 600)} == set(KINDS)
    assert plan(SEED, 600) != plan(SEED + 1, 600)


def test_a_schedule_without_a_tmpfs_draws_no_disk_full_and_the_tools_but_promote_share_one_slot() -> None:
    kinds = set(KINDS) - {"disk-full"}
    faults = plan(SEED, 600, kinds=kinds)
    assert "disk-full" not in {f.kind for f in faults} and len({f.kind for f in faults}) >= len(kinds) - 2
    assert {f.slot for f in plan(SEED, 600) if f.kind in TOOLS and f.kind != "promote"} == {"tools"}
    promotes = [f for f in plan(SEED, 600) if f.kind == "promote"]  # minutes long: the others run beside it
    assert promotes and {f.slot for f in promotes} == {"promote"}
    assert {f.slot for f in plan(SEED, 600) if f.kind == "disk-full"} == {"disk"}
    assert all(f.target in INSTANCES for f in faults if f.kind == "worker-kill")


# --- the Python workers and the store's disk, on real processes and a real tmpfs ------------------

def test_a_wait_says_what_it_waits_for_and_when_it_gives_up(tmp_path: Path) -> None:
    """The drain can take many minutes: the run says what it is waiting for meanwhile."""
    import time

    from deltawheel.chaos.harness import ChaosSettings, _Harness

    lines: list[str] = []
    h = _Harness(ChaosSettings(seed=1, data=tmp_path / "chaos"), lines.append)
    until = time.monotonic() + 1.2
    assert h.wait("the drain", lambda: time.monotonic() > until, 10, every_s=0.5)
    assert len([ln for ln in lines if ln.startswith("chaos: waiting for the drain: ")]) >= 1, lines
    assert not h.wait("the drain", lambda: False, 0.3, every_s=0.5)
    assert lines[-1] == "chaos: the drain: not within 0s", lines


def test_a_tool_ending_with_a_traceback_is_a_violation_and_a_typed_exit_is_not(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every failure a tool meets under the faults must be typed: a traceback in the tool's own
    output (the log before it stays out of it) is a ``tool-traceback`` violation, kept by --recheck."""
    from deltawheel.chaos import harness
    from deltawheel.chaos.checker import traceback_violations
    from deltawheel.chaos.harness import ChaosSettings, _Harness

    h = _Harness(ChaosSettings(seed=1, data=tmp_path / "chaos"), lambda line: None)
    h.logs.mkdir(parents=True)
    typed = "import sys; print('deltawheel repair: ConfigError: no such computation'); sys.exit(3)"
    untyped = "raise OSError('AWS Error NETWORK_CONNECTION during GetObject operation')"
    monkeypatch.setattr(harness, "CLI", (sys.executable, "-c"))  # each "tool" a Python program of its own
    assert h.tool("repair", untyped) == 1 and h.tool("repair", typed) == 3 and h.tool("repair", typed) == 3
    assert h.run.tools == {"repair": [1, 3, 3]}
    assert h.run.tracebacks == ["repair rc 1: OSError: AWS Error NETWORK_CONNECTION during GetObject operation"]
    found = traceback_violations(h.run.tracebacks)
    assert [(v.check, v.detail) for v in found] == [("tool-traceback", h.run.tracebacks[0])]


def test_python_workers_are_found_under_a_driver_by_their_command_line(tmp_path: Path) -> None:
    """A driver-like process whose child (own process group, as pyspark's daemon) forks two
    workers: the three are found, the daemon and its workers told apart, an unrelated child not."""
    import os
    import signal
    import time

    from deltawheel.chaos.driver import python_workers

    daemon = tmp_path / "daemon.py"
    daemon.write_text("import os, time\nos.setpgid(0, 0)\n[os.fork() or time.sleep(600) for _ in range(2)]\n"
                      "time.sleep(600)\n")
    driver = tmp_path / "driver.py"  # its command line names no pyspark module, as a JVM's does not
    driver.write_text(f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, {str(daemon)!r}, "
                      "'pyspark.worker'])\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                      "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, str(driver)], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(found := python_workers(proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(w.role for w in found) == ["daemon", "worker", "worker"], found
        assert python_workers(os.getpid()) == [] or all(w.pid != proc.pid for w in python_workers(os.getpid()))
    finally:
        for w in python_workers(proc.pid):
            os.killpg(w.pid if w.role == "daemon" else os.getpgid(w.pid), signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _mounted(folder: Path, size_mb: int) -> Any:
    """A mounted :class:`StoreDisk` of ``size_mb`` over ``folder``; the test skips where it cannot mount."""
    from deltawheel.chaos.disk import StoreDisk

    disk = StoreDisk(folder, size_mb)
    reason = disk.mount()
    if reason is not None:
        pytest.skip(reason)
    return disk


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_the_store_disk_fills_up_to_enospc_frees_and_keeps_its_content_after_unmount(tmp_path: Path) -> None:
    from deltawheel.chaos.disk import FILLER, StoreDisk

    disk = _mounted(tmp_path / "store", 4)
    try:
        (tmp_path / "store" / "rows").mkdir()
        (tmp_path / "store" / "rows" / "00.json").write_text("{}")
        filled = disk.fill()
        assert 3 * 2**20 < filled <= 4 * 2**20 and disk.free_bytes() == 0
        with pytest.raises(OSError, match="No space left on device"):
            (tmp_path / "store" / "more").write_bytes(b"x" * 65536)
        disk.free()
        assert disk.free_bytes() > 3 * 2**20
    finally:
        assert disk.unmount() is None
    assert not os.path.ismount(tmp_path / "store")
    assert (tmp_path / "store" / "rows" / "00.json").read_text() == "{}"
    assert not (tmp_path / "store" / FILLER).exists()
    assert StoreDisk(tmp_path / "other", 0).mount() is not None  # no size: not mounted, says why



@pytest.mark.zk
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_command_that_finds_the_disk_full_exits_9_with_one_typed_line(tmp_path: Path) -> None:
    """Found by disk-full: a ``deltawheel run`` started while the store's disk was full stopped
    with a Python traceback and exit 1 (an OSError from the fence's claim file), which the harness
    counts as a violation. A full disk is now a :class:`DiskFullError` (exit 9, the command may be
    run again once space is freed), from any command: here ``zk start``, which writes its
    configuration into the store's folder first (no Spark)."""

    disk = _mounted(tmp_path / "disk", 1)
    try:
        (tmp_path / "disk" / "store").mkdir()
        disk.fill()
        proc = subprocess.run([sys.executable, "-m", "deltawheel.cli", "zk", "start", "--store",
                               str(tmp_path / "disk" / "store")], capture_output=True, text=True, timeout=120)
    finally:
        disk.unmount()
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("deltawheel zk: DiskFullError: a write failed, the disk "
                                                             "is full (OSError: [Errno 28] No space left on device)")

# --- the checker on stream tables written here -----------------------------------------------

def _stream(path: Path, rows: list[dict[str, Any]], *, per_commit: int) -> None:
    """A stream table of ``rows`` (values as JSON), ``per_commit`` records per Delta commit."""
    import pyarrow as pa
    from deltalake import write_deltalake

    schema = pa.schema([("record_id", pa.string()), ("key", pa.string()), ("value", pa.binary()),
                        ("codec", pa.string()), ("timestamp_ms", pa.int64())])
    for i in range(0, len(rows), per_commit):
        part = rows[i:i + per_commit]
        write_deltalake(str(path), pa.Table.from_pylist([
            {"record_id": r["rid"], "key": r["key"], "value": json.dumps(r["value"]).encode(), "codec": "json",
             "timestamp_ms": r["ts"]} for r in part], schema=schema), mode="append")


def _correct_streams(tmp_path: Path, files: int = 25) -> tuple[Path, Path, dict[str, list[dict[str, Any]]]]:
    """Input files and the three streams a correct run gives for them (computed here)."""
    folder, store = tmp_path / "input", tmp_path / "store"
    for i in range(files):
        write_moves(folder, i, moves(i, 10, seed=3))
    write_moves(folder, files, closing_moves(files))
    all_moves = [m for i in range(files) for m in moves(i, 10, seed=3)] + closing_moves(files)
    changes, balances = [], []
    state: dict[str, tuple[int, int]] = {}
    for m in all_moves:
        for account, leg, delta in ((m["src"], "debit", -m["amount"]), (m["dst"], "credit", m["amount"])):
            v = {"move": m["id"], "account": account, "leg": leg, "delta": delta}
            changes.append({"rid": f"c-{m['id']}-{leg}", "key": account, "value": v, "ts": m["ts"]})
            seq, bal = state.get(account, (0, 0))
            state[account] = (seq + 1, bal + delta)
            balances.append({"rid": f"b-{m['id']}-{leg}", "key": account, "ts": m["ts"],
                             "value": {**v, "seq": seq + 1, "balance": bal + delta}})
    legs = reference_legs(__import__("pandas").DataFrame(all_moves))
    sums: dict[tuple[str, int], int] = {}
    for a, ts, d in zip(legs["account"], legs["ts"], legs["delta"], strict=True):
        if not a.startswith("close"):
            sums[(a, ts - ts % WINDOW_MS)] = sums.get((a, ts - ts % WINDOW_MS), 0) + int(d)
    panes = [{"rid": f"w-{a}-{w}", "key": a, "ts": w + WINDOW_MS - 1,
              "value": {"window_start": w, "pane_index": 0, "timing": "ON_TIME", "value": v}}
             for (a, w), v in sorted(sums.items())]
    return folder, store, {"changes": changes, "balances": balances, "window_sums": panes}


def _write(store: Path, streams: dict[str, list[dict[str, Any]]]) -> None:
    for name, rows in streams.items():
        _stream(store / "streams" / name, rows, per_commit=40)


def test_the_checker_passes_the_streams_of_a_correct_run(tmp_path: Path) -> None:
    folder, store, streams = _correct_streams(tmp_path)
    _write(store, streams)
    res = check_run(store, folder)
    assert res.violations == []
    assert res.records_in == 254 and res.records_out["changes"] == res.records_out["balances"] == 508


def test_the_checker_names_a_duplicate_a_lost_leg_and_a_wrong_window(tmp_path: Path) -> None:
    folder, store, streams = _correct_streams(tmp_path)
    dup = dict(streams["balances"][7], rid="b-again")  # one leg applied twice
    streams["balances"].insert(60, dup)
    lost = streams["changes"].pop(101)  # a credit leg gone: its move is half in every version after
    streams["window_sums"][3]["value"]["value"] += 1
    bent = streams["balances"][200]["value"]  # a balance that is not the one before plus the delta
    bent["balance"] += 5
    _write(store, streams)
    res = check_run(store, folder)
    lines = [v.line() for v in res.violations]
    move = dup["value"]["move"]
    assert any(v.check == "exactly-once" and "balances: 1 legs more than once" in v.detail
               and f"{move}/{dup['value']['leg']}" in v.keys for v in res.violations), lines
    assert any(v.check == "ledger" and dup["key"] in v.keys for v in res.violations), lines
    assert any(v.check == "bank" and lost["value"]["move"] in v.keys for v in res.violations), lines
    assert any(v.check == "exactly-once" and "changes: 1 legs missing" in v.detail for v in res.violations), lines
    assert any(v.check == "ledger" and "the deltas before give" in v.detail
               and (bent["account"], bent["move"]) == v.keys for v in res.violations), lines
    w = streams["window_sums"][3]
    assert any(v.check == "windows" and f"{w['key']}@{w['value']['window_start']}" in v.keys
               for v in res.violations), lines


# --- runs -------------------------------------------------------------------------------------

def _chaos(data: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """The run's output; one that outlasts ``timeout_s`` fails with what it printed and its logs."""
    cmd = [sys.executable, "-m", "deltawheel.cli", "chaos", "--data", str(data), *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        raise AssertionError(f"chaos did not end within {timeout_s:.0f}s:\n"
                             + _explain(subprocess.CompletedProcess(cmd, -9, out, ""), data)) from None


def _explain(proc: subprocess.CompletedProcess[str], data: Path) -> str:
    """The run's output and each driver log's last lines other than batch lines (pytest's temporary
    folders do not outlive many later runs)."""
    parts = [proc.stdout[-5000:], proc.stderr[-3000:]]
    for log in sorted((data / "logs").glob("driver-*.log")):
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if " batch " not in ln]
        parts.append(f"--- {log.name}\n" + "\n".join(lines[-40:]))
    return "\n".join(parts)


def _plant_duplicate(store: Path) -> dict[str, Any]:
    """Append a copy of one ``balances`` record under a new record id (a leg applied twice)."""
    from deltalake import DeltaTable, write_deltalake

    path = str(store / "streams" / "balances")
    one = DeltaTable(path).to_pyarrow_dataset().head(1)
    write_deltalake(path, one.set_column(0, "record_id", [["planted-duplicate"]]), mode="append")
    return dict(json.loads(one.column("value")[0].as_py()))


@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(1500)
def test_a_chaos_run_finds_no_violation_and_a_planted_duplicate_is_caught(tmp_path: Path) -> None:
    """``deltawheel chaos --seed 51 --seconds 60 --kinds ...``: the seed printed first, the faults
    of the seed's schedule happen (driver kills, a zombie, an expired session, a Python worker
    killed, a ZooKeeper follower and the leader killed, the store's disk full, a rebalance), the
    table ends with zero violations and the exit code is 0. Then a record planted twice into the
    run's ``balances`` makes ``--recheck`` name it and exit 1."""
    data = tmp_path / "chaos"
    proc = _chaos(data, "--seed", str(RUN_SEED), "--seconds", "60", "--kinds", ",".join(RUN_KINDS), timeout_s=1400)
    out = proc.stdout.splitlines()
    assert out and out[0].startswith(f"chaos seed {RUN_SEED} "), _explain(proc, data)
    assert proc.returncode == 0 and out[-1] == "violations: 0", _explain(proc, data)
    saved = json.loads((data / "faults.json").read_text())
    # the seed's schedule: each planned fault happened, or was skipped when its target's previous
    # fault (a tool) outlasted the phase
    # (with the kinds the run drew from: disk-full only where it could mount the store's tmpfs)
    assert sorted(f["kind"] for f in saved["faults"] + saved["skipped"]) == \
        sorted(f.kind for f in plan(RUN_SEED, 60, kinds=saved["kinds"]))
    assert set(saved["kinds"]) <= set(RUN_KINDS)
    assert saved["faults"] and saved["drained"]
    planted = tmp_path / "planted"
    shutil.copytree(data, planted)
    leg = _plant_duplicate(planted / "store")
    again = _chaos(planted, "--recheck", timeout_s=300)
    assert again.returncode == 1, again.stdout + again.stderr
    named = [ln for ln in again.stdout.splitlines() if "balances: 1 legs more than once" in ln]
    assert len(named) == 1 and "'planted-duplicate'" in named[0] and f"{leg['move']}/{leg['leg']}" in named[0], \
        again.stdout


@pytest.mark.slow  # the default test_a_chaos_run_finds_no_violation_and_a_planted_duplicate_is_caught runs 60 s
@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(3600)
def test_ten_minutes_of_chaos_find_no_violation(tmp_path: Path) -> None:
    data = tmp_path / "chaos"
    proc = _chaos(data, "--seed", "20261127", "--seconds", "600", timeout_s=3500)
    print(proc.stdout)
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "violations: 0", _explain(proc, data)


def test_an_unknown_fault_kind_is_refused_naming_the_kinds_and_starts_nothing(tmp_path: Path) -> None:
    proc = _chaos(tmp_path / "chaos", "--seconds", "5", "--kinds", "driver-kill,meteor", timeout_s=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "no fault kind meteor; the kinds: " in proc.stderr and "zk-leader-kill" in proc.stderr, proc.stderr
    assert not (tmp_path / "chaos").exists()


@pytest.mark.slow  # a whole harness started to be killed; test_process_watchdog covers the watchdog by default
@pytest.mark.zk
def test_a_chaos_run_killed_by_sigkill_leaves_no_process_behind(tmp_path: Path) -> None:
    """A test's timeout SIGKILLs ``deltawheel chaos``: its drivers (each in a session of its own),
    the ensemble's servers, Toxiproxy (``net-cut``) and their children stop with it instead of
    loading the machine."""
    import signal
    import time

    import psutil

    data = tmp_path / "chaos"

    def left() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:  # Toxiproxy's command line names no folder: it runs in its own
                if any(str(data) in a for a in p.info["cmdline"] or ()) or p.cwd().startswith(str(data)):
                    found.append(p)
            except psutil.Error:
                continue
        return found

    proc = subprocess.Popen([sys.executable, "-m", "deltawheel.cli", "chaos", "--data", str(data),
                             "--seconds", "600", "--kinds", "status,net-cut", "--store-tmpfs-mb", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while sum("run" in (p.info["cmdline"] or ()) for p in left()) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the drivers did not start"
            time.sleep(0.5)
        assert any("org.apache.zookeeper.server.quorum.QuorumPeerMain" in " ".join(p.info["cmdline"] or ())
                   or "zookeeper" in " ".join(p.info["cmdline"] or ()).lower() for p in left())
        assert any("toxiproxy-server" in " ".join(p.info["cmdline"] or ()) for p in left())
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 45  # a watchdog's SIGTERM, 10 s, then SIGKILL; without, the drivers ran on
    while (alive := [p for p in left() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]) \
            and time.monotonic() < deadline:
        time.sleep(1.0)
    assert alive == [], [" ".join(p.info["cmdline"])[:200] for p in alive]


# --- on an object store: the store on s3a:// through the run's own S3Proxy, s3proxy-kill ----------

#: The object-store run's seed and kinds: seed 5's 30-s schedule kills S3Proxy twice (3.5 s in for
#: 8.6 s, 17.8 s in for 9.5 s) and pauses a driver once.
S3_SEED = 5
S3_KINDS = ("s3proxy-kill", "driver-pause", "zk-leader-kill", "disk-full")


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), seconds=st.floats(10, 3_600))
def test_the_schedule_draws_s3proxy_kill_only_when_asked_one_at_a_time(seed: int, seconds: float) -> None:
    local = set(KINDS) - {"s3proxy-kill"}  # what a run on a local store draws from
    assert "s3proxy-kill" not in {f.kind for f in plan(seed, seconds, kinds=local)}
    kills = [f for f in plan(seed, seconds, kinds=set(KINDS)) if f.kind == "s3proxy-kill"]
    assert all(f.slot == "s3" and f.target == "s3proxy" and 3.0 <= f.duration_s <= 10.0 for f in kills)
    assert all(a.at + a.duration_s <= b.at for a, b in zip(kills, kills[1:], strict=False)), kills


def test_long_schedules_of_an_object_store_run_draw_s3proxy_kill() -> None:
    assert "s3proxy-kill" in {f.kind for f in plan(SEED, 600, kinds=set(KINDS))}
    assert [f.kind for f in plan(S3_SEED, 30, kinds=S3_KINDS)].count("s3proxy-kill") == 2


def test_s3proxy_kill_on_a_local_store_is_refused_and_starts_nothing(tmp_path: Path) -> None:
    proc = _chaos(tmp_path / "chaos", "--seconds", "5", "--kinds", "s3proxy-kill", timeout_s=120)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "s3proxy-kill needs the store on the object store: add --object-store" in proc.stderr, proc.stderr
    assert not (tmp_path / "chaos").exists()


@pytest.mark.objectstore
def test_the_run_s_s3proxy_killed_and_restarted_serves_the_same_bucket_on_the_same_port(tmp_path: Path) -> None:
    """What ``s3proxy-kill`` does, on a real S3Proxy: unreachable while killed, then the restarted
    server answers on the same port with the same keys and data (the bucket, a folder of the
    backend, whose ``store/`` the checker reads)."""
    from deltawheel.statestore.objectstore import s3a
    from deltawheel.statestore.objectstore.client import S3Client

    from deltawheel.chaos.objectstore import BUCKET, ChaosObjectStore

    s3 = ChaosObjectStore(tmp_path / "s3")
    s3.start()
    try:
        assert s3.server is not None and s3.local == tmp_path / "s3" / "blobs" / BUCKET / "store"
        endpoint = s3a.endpoint_from_env(s3.env)
        assert endpoint is not None and S3Client(endpoint).bucket_exists(BUCKET)
        port, pid = s3.server.port, s3.kill()
        assert pid is not None and not s3.server.ready()
        s3.restart()
        assert s3.server.port == port and s3.server.process.pid() not in (None, pid)
        assert s3a.endpoint_from_env(s3.env) == s3.server.endpoint and S3Client(endpoint).bucket_exists(BUCKET)
    finally:
        s3.stop()
    assert not s3.server.ready()


# slow: on a 2-core machine shared with other jobs a run's start-up and drain take 10-20 minutes; the
# default tests above cover its parts (the schedule, the refusal, S3Proxy killed and restarted)
@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.objectstore
@pytest.mark.timeout(2400)
def test_an_object_store_run_survives_s3proxy_killed_twice_and_recheck_reads_its_store(tmp_path: Path) -> None:
    """``deltawheel chaos --object-store --seed 5 --seconds 30 --kinds ...``: the drivers on
    ``s3a://`` through the run's S3Proxy, killed twice and restarted; zero violations. Then
    ``--recheck`` with the server stopped reads the store from S3Proxy's folder: 0 as it is, 1 with
    a record planted twice there."""
    data = tmp_path / "chaos"
    proc = _chaos(data, "--object-store", "--seed", str(S3_SEED), "--seconds", "30", "--kinds", ",".join(S3_KINDS),
                  timeout_s=2300)
    out = proc.stdout.splitlines()
    assert proc.returncode == 0 and out[-1] == "violations: 0", _explain(proc, data)
    assert any("the store on s3a://chaos/store through S3Proxy at http://127.0.0.1:" in ln for ln in out), proc.stdout
    saved = json.loads((data / "faults.json").read_text())
    assert saved["object_store"] and saved["store"] == "s3/blobs/chaos/store" and saved["drained"]
    kills = [f for f in saved["faults"] if f["kind"] == "s3proxy-kill"]
    assert len(kills) == 2 and all(f["target"] == "s3proxy" and f["heal"] > f["start"] for f in kills), saved
    assert not (data / "store").exists() and (data / "s3" / "blobs" / "chaos" / "store" / "streams").is_dir()
    again = _chaos(data, "--recheck", timeout_s=300)
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == "violations: 0", again.stdout + again.stderr
    leg = _plant_duplicate(data / "s3" / "blobs" / "chaos" / "store")
    planted = _chaos(data, "--recheck", timeout_s=300)
    named = [ln for ln in planted.stdout.splitlines() if "balances: 1 legs more than once" in ln]
    assert planted.returncode == 1 and len(named) == 1 and f"{leg['move']}/{leg['leg']}" in named[0], planted.stdout


# --- net-cut: a driver's network to ZooKeeper (and S3Proxy) cut through its Toxiproxy proxies ----

#: The net-cut run's seed and kinds: seed 51's 60-s schedule cuts `a` 2.0 s in for 4.9 s (under the
#: session timeout of 6 s) and `b` 18.5 s in for 13.3 s (its session expires), then `b` again.
CUT_SEED = 51
CUT_KINDS = ("net-cut", "driver-pause", "zk-kill")


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), seconds=st.floats(10, 3_600),
       others=st.lists(st.sampled_from(sorted(set(KINDS) - {"net-cut"})), unique=True, min_size=1))
def test_the_schedule_draws_net_cut_only_when_asked_one_per_driver_and_others_unchanged(
        seed: int, seconds: float, others: list[str]) -> None:
    """A schedule drawn without ``net-cut`` is the one drawn before the kind existed (the same
    seed replays the same faults); with it, each cut is one driver's fault, 2-20 s, in the
    driver's slot: never beside another fault of the same driver."""
    import deltawheel.chaos.faults as faults

    without = plan(seed, seconds, kinds=others)
    assert "net-cut" not in {f.kind for f in without}
    kinds = dict(faults.KINDS)
    del faults.KINDS["net-cut"]  # the table as it was
    try:
        assert plan(seed, seconds, kinds=others) == without
    finally:
        faults.KINDS.clear()
        faults.KINDS.update(kinds)
    drawn = plan(seed, seconds, kinds={"net-cut", *others})
    cuts = [f for f in drawn if f.kind == "net-cut"]
    assert all(f.target in INSTANCES and f.slot == f.target and 2.0 <= f.duration_s <= 20.0 for f in cuts), cuts
    for driver in INSTANCES:
        mine = [f for f in drawn if f.target == driver]
        assert all(a.at + a.duration_s <= b.at for a, b in zip(mine, mine[1:], strict=False)), mine


def test_the_net_cut_seed_cuts_both_drivers_once_past_the_session_timeout() -> None:
    cuts = [f for f in plan(CUT_SEED, 60, kinds=CUT_KINDS) if f.kind == "net-cut"]
    assert len(cuts) >= 2 and {f.target for f in cuts} == set(INSTANCES), cuts
    assert any(f.duration_s > 6.0 for f in cuts) and any(f.duration_s < 6.0 for f in cuts), cuts


def _no_toxiproxy(env: dict[str, str], home: Path) -> dict[str, str]:
    """``env`` where Toxiproxy is not built yet and cannot be: an empty home (no binary in its
    cache, no Go module cache) and Go told to download nothing, so its build fails."""
    return {**env, "HOME": str(home), "GOMODCACHE": str(home / "go" / "pkg" / "mod"), "GOPROXY": "off",
            "GOPATH": str(home / "go")}


def test_net_cut_named_without_toxiproxy_is_refused_saying_why_and_starts_nothing(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "deltawheel.cli", "chaos", "--data", str(tmp_path / "chaos"),
           "--seconds", "5", "--kinds", "net-cut,driver-pause"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=_no_toxiproxy(dict(os.environ), tmp_path / "home"))
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "the fault kind net-cut needs Toxiproxy, which is unavailable: building Toxiproxy failed" in proc.stderr, \
        proc.stderr
    assert "or leave net-cut out of --kinds" in proc.stderr and "GOPROXY=off" in proc.stderr  # Go's own reason
    assert not (tmp_path / "chaos").exists()


def test_without_toxiproxy_every_kind_leaves_net_cut_out_saying_why(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of every kind where Toxiproxy cannot be built: ``net-cut`` leaves the schedule with the
    reason printed and in the table, as ``disk-full`` does without a tmpfs."""
    from deltawheel.chaos.checker import CheckResult
    from deltawheel.chaos.harness import ChaosSettings, _Harness
    from deltawheel.chaos.report import table

    for name, value in _no_toxiproxy({}, tmp_path / "home").items():
        monkeypatch.setenv(name, value)
    said: list[str] = []
    h = _Harness(ChaosSettings(seed=1, data=tmp_path / "chaos", store_tmpfs_mb=0), said.append)
    try:
        h.prepare()
    finally:
        h.stop()
    assert h.netcut is None and "net-cut" not in h.run.kinds and "driver-kill" in h.run.kinds
    assert h.run.left_out["net-cut"].startswith("building Toxiproxy failed") and \
        "GOPROXY=off" in h.run.left_out["net-cut"], h.run.left_out
    assert f"chaos: net-cut left out of the schedule: {h.run.left_out['net-cut']}" in said, said
    lines = table(1, CheckResult(), left_out=h.run.left_out).splitlines()
    assert f"net-cut left out: {h.run.left_out['net-cut']}" in lines and any(
        ln.startswith("disk-full left out: no tmpfs asked for") for ln in lines), lines


@pytest.mark.zk
@pytest.mark.timeout(300)
def test_a_cut_driver_loses_zookeeper_its_session_expires_and_it_reconnects_after(tmp_path: Path) -> None:
    """The harness's own Toxiproxy and proxies (``--kinds net-cut``) before a real ensemble of
    three: a kazoo client on driver ``a``'s ``--zk``, a member of the chaos pipeline as a driver is,
    loses its connection when ``a`` is cut and its session expires past the timeout (the harness,
    on the direct addresses, sees its membership gone), while ``b``'s client and the tools'
    addresses go on; after the restore ``a``'s client connects again with a new session."""
    import time

    from kazoo.client import KazooClient, KazooState

    from deltawheel.chaos.bank import PIPELINE
    from deltawheel.chaos.harness import CHROOT, ChaosSettings, _Harness
    from deltawheel.chaos.netcut import member_session, session_after

    def until(what: str, check: Any, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f}s"
            time.sleep(0.2)

    h = _Harness(ChaosSettings(seed=1, data=tmp_path / "chaos", store_tmpfs_mb=0, kinds=("net-cut",)), print)
    clients: list[KazooClient] = []
    member = f"/pipelines/{PIPELINE}/members/a"
    try:
        h.prepare()
        h.ensemble.start()
        assert h.netcut is not None
        zk = {name: h.zk_args(name)[1] for name in INSTANCES}
        assert h.zk_args()[1] == h.ensemble.hosts and len(set(zk.values()) | {h.ensemble.hosts}) == 3
        assert all(len(hosts.split(",")) == 3 for hosts in zk.values())
        assert member_session(h.ensemble.hosts, CHROOT, "a") is None  # not a member yet (the chroot made)
        tool = KazooClient(hosts=h.ensemble.hosts + CHROOT)
        a, b = (KazooClient(hosts=zk[name] + CHROOT, timeout=4.0) for name in ("a", "b"))
        clients += [tool, a, b]
        states: list[str] = []
        a.add_listener(states.append)
        for c in clients:
            c.start(timeout=30)
        a.create(member, ephemeral=True, makepath=True)
        session = a.client_id[0]
        assert member_session(h.ensemble.hosts, CHROOT, "a") == session
        assert session_after(h.ensemble.hosts, CHROOT, "a", session) == "held"
        assert session_after(h.ensemble.hosts, CHROOT, "a", None).startswith("unknown")
        assert h.netcut.cut("a") == ["a-zk1", "a-zk2", "a-zk3"]
        until("connection loss of a", lambda: KazooState.SUSPENDED in states, 30)
        until("expiry of a's session", lambda: member_session(h.ensemble.hosts, CHROOT, "a") is None)
        assert b.exists("/") is not None and tool.exists("/") is not None and not a.connected  # only a is cut
        assert session_after(h.ensemble.hosts, CHROOT, "a", session) == "expired"
        h.netcut.restore("a")
        until("a's new session", lambda: a.connected and a.client_id is not None and a.client_id[0] != session)
        assert KazooState.LOST in states
        a.create(member, ephemeral=True)
        assert member_session(h.ensemble.hosts, CHROOT, "a") == a.client_id[0] != session
    finally:
        for c in clients:
            c.stop()
            c.close()
        h.stop()
    assert h.netcut.server is not None and not h.netcut.server.ready()


# slow: a run's start-up, restarts after the expired sessions and drain take 10-20 minutes on a
# shared 2-core machine; the default tests above cover its parts (the schedule, the refusal, the
# proxies cutting a real client's session and giving it back, Toxiproxy dying with the run)
@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.zk
@pytest.mark.timeout(2400)
def test_a_run_whose_drivers_networks_are_cut_finds_no_violation(tmp_path: Path) -> None:
    """``deltawheel chaos --seed 51 --seconds 60 --kinds net-cut,driver-pause,zk-kill``: both drivers
    cut from ZooKeeper, one of them past its session timeout (the other instance takes its
    intervals while it can still write the local store: fencing stops it), zero violations."""
    data = tmp_path / "chaos"
    proc = _chaos(data, "--seed", str(CUT_SEED), "--seconds", "60", "--kinds", ",".join(CUT_KINDS), timeout_s=2300)
    print(proc.stdout)
    out = proc.stdout.splitlines()
    assert proc.returncode == 0 and out[-1] == "violations: 0", _explain(proc, data)
    saved = json.loads((data / "faults.json").read_text())
    cuts = [f for f in saved["faults"] if f["kind"] == "net-cut"]
    assert len(cuts) >= 2 and {f["target"] for f in cuts} == set(INSTANCES), saved["faults"]
    assert any(f["heal"] - f["start"] > 6.0 for f in cuts) and all("proxies cut" in f["note"] for f in cuts), cuts
    assert saved["drained"] and "net-cut" in saved["kinds"]


@pytest.mark.objectstore
@pytest.mark.timeout(300)
def test_on_an_object_store_a_cut_driver_cannot_reach_s3proxy_until_restored(tmp_path: Path) -> None:
    """``--object-store --kinds net-cut``: each driver's S3 endpoint is its own proxy to the run's
    S3Proxy (the tools' is the server's); ``a`` cut, its requests are refused while ``b``'s and the
    tools' are answered; restored, ``a``'s are answered again."""
    from deltawheel.statestore.exceptions import ObjectStoreUnreachableError
    from deltawheel.statestore.objectstore import s3a
    from deltawheel.statestore.objectstore.client import S3Client

    from deltawheel.chaos.harness import ChaosSettings, _Harness
    from deltawheel.chaos.objectstore import BUCKET

    h = _Harness(ChaosSettings(seed=1, data=tmp_path / "chaos", store_tmpfs_mb=0, kinds=("net-cut",),
                               object_store=True), print)
    try:
        h.prepare()
        assert h.netcut is not None and h.s3 is not None
        urls = {name: h.env(name)[s3a.ENV_ENDPOINT] for name in INSTANCES}
        assert h.env()[s3a.ENV_ENDPOINT] == h.s3.env[s3a.ENV_ENDPOINT] and len({*urls.values(), h.env()[
            s3a.ENV_ENDPOINT]}) == 3
        endpoints = [s3a.endpoint_from_env(h.env(name)) for name in ("a", "b", None)]
        a, b, tool = (S3Client(ep) for ep in endpoints if ep is not None)
        assert a.bucket_exists(BUCKET) and b.bucket_exists(BUCKET)
        assert sorted(h.netcut.cut("a")) == ["a-s3", "a-zk1", "a-zk2", "a-zk3"]
        with pytest.raises(ObjectStoreUnreachableError):
            a.bucket_exists(BUCKET)
        assert b.bucket_exists(BUCKET) and tool.bucket_exists(BUCKET)
        h.netcut.restore("a")
        assert a.bucket_exists(BUCKET)
    finally:
        h.stop()
