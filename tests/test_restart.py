"""A job instance restarted under its instance name after SIGKILL takes its dead predecessor's
intervals at once (no waiting out the ZooKeeper session) and the output stays exactly-once; an
older process with the same name still alive is fenced out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.zk.client import connect as connect_zk
from deltawheel.statestore.zk.grants import interval_path
from restart_job import KEYS, PIPELINE, Seen, injector, write_files

pytestmark = [pytest.mark.spark, pytest.mark.zk]

J = get_codec("json")
JOB = Path(__file__).with_name("restart_job.py")


def start_job(store: Path | str, folder: Path, hosts: str, chroot: str, instance: str | None, *,
              columnar: bool = False, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """``columnar``: the job runs ``restart_job.WinCount`` (the columnar path), else ``Seen``;
    ``env``: the job's environment (e.g. an object store's endpoint), else this process's."""
    return subprocess.Popen([sys.executable, str(JOB), str(store), str(folder), hosts, chroot, instance or "-"]
                            + (["--columnar"] if columnar else []), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def lines_until(proc: subprocess.Popen[str], marker: str, seen: list[str], timeout_s: float = 400) -> float:
    """Read ``proc``'s lines until one contains ``marker``; returns the monotonic time it came."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            return time.monotonic()
        assert time.monotonic() < deadline, "".join(seen[-40:])
    raise AssertionError(f"{marker!r} never came: " + "".join(seen[-40:]))


def kill(proc: subprocess.Popen[str]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def owners(zk: ZkConfig, computation: str, n: int) -> list[dict[str, Any] | None]:
    """The owner payloads of ``computation``'s intervals, as ZooKeeper holds them now."""
    client = connect_zk(zk)
    try:
        out: list[dict[str, Any] | None] = []
        for iv in range(n):
            stat = client.exists(f"{interval_path(PIPELINE, computation, iv)}/owner")
            out.append(None if stat is None else
                       json.loads(client.get(f"{interval_path(PIPELINE, computation, iv)}/owner")[0]))
        return out
    finally:
        client.stop()
        client.close()


def check_exactly_once(spark: Any, store: Path, records: int) -> None:
    """Every input record produced once, and each key's running counts are 1..n without a gap."""
    rows = spark.read.format("delta").load(f"{store}/streams/seen").collect()
    ids = [r["record_id"] for r in rows]
    assert len(ids) == len(set(ids)) == records
    per_key: dict[str, list[int]] = {}
    for r in rows:
        per_key.setdefault(r["key"], []).append(J.decode(r["value"])["n"])
    assert {k: sorted(v) for k, v in per_key.items()} == \
        {k: list(range(1, records // len(KEYS) + 1)) for k in KEYS}


@pytest.fixture
def chroot() -> str:
    return f"/restart-{uuid.uuid4().hex[:10]}"


@pytest.mark.timeout(900)
@pytest.mark.slow  # a job instance SIGKILLed and restarted in subprocesses; the takeover by name: test_restart_leases.py
def test_a_killed_instance_restarted_under_its_name_takes_over_at_once_and_counts_every_record_once(  # type: ignore[no-untyped-def]
        spark, zk_server, tmp_path, chroot) -> None:
    import deltawheel

    store, folder = tmp_path / "store", tmp_path / "input"
    records = write_files(folder, 4)
    proc = start_job(store, folder, zk_server.hosts, chroot, "a")
    seen: list[str] = []
    try:
        lines_until(proc, "seen batch 0:", seen)  # a batch committed, the next under way
    finally:
        kill(proc)
    # the dead process's session still holds its intervals, under its instance name
    held = owners(ZkConfig(hosts=zk_server.hosts, chroot=chroot), "seen", Seen.num_intervals)
    assert [o and o["instance"] for o in held] == ["a"] * Seen.num_intervals, held
    # restarted under the same name: no waiting for the dead session (wait_s=0)
    with deltawheel.connect(spark, store=str(store), zk=zk_server.hosts, zk_chroot=chroot, pipeline=PIPELINE,
                            instance="a", owner="restarted", wait_s=0) as engine:
        engine.progress = False
        reports = engine.run(injector(str(folder)), Seen())
        assert sum(r.processed for r in reports) < records  # the killed one's commits were kept
    check_exactly_once(spark, store, records)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("columnar", [False, True], ids=["per-record", "columnar"])
def test_an_older_process_with_the_same_instance_name_commits_nothing_after_the_takeover(  # type: ignore[no-untyped-def]
        spark, zk_server, tmp_path, chroot, columnar, migrated_at) -> None:
    """Two live processes started with one instance name by mistake: the newer takes the
    intervals, the older's next batch fails with LeaseLostError (its lease check, before any
    I/O) and, past that check, its commit is fenced (StaleSequencerError): nothing of it lands.
    ``columnar``: ``WinCount`` on the columnar path (records without values), its counts in the rows."""
    from deltawheel.statestore.exceptions import LeaseLostError, StaleSequencerError
    from executor_util import stream_rows
    from pyspark.sql import functions as F
    from restart_job import WinCount

    import deltawheel

    store = tmp_path / "store"
    migrated_at(store)  # a migrated copy: connect migrating a new store runs in test_connect.py

    def frame(keys: list[str], base: int) -> Any:
        from deltawheel.statestore.writepath.streams import stream_schema_ddl

        rows = [{"record_id": f"r{base + i}", "key": k, "value": None if columnar else J.encode({}), "codec": "json",
                 "timestamp_ms": base + i, "event_time": None, "producer": "test", "commit_id": f"pos-{base + i}",
                 "format_version": 1} for i, k in enumerate(keys)]
        return spark.createDataFrame(rows, schema=stream_schema_ddl().replace(" NOT NULL", ""))

    def connect(owner: str) -> Any:
        engine = deltawheel.connect(spark, store=str(store), zk=zk_server.hosts, zk_chroot=chroot, pipeline=PIPELINE,
                                    instance="a", owner=owner, wait_s=0)
        engine.progress = False
        return engine

    def comp() -> Any:
        if not columnar:
            return Seen()
        c = WinCount()
        c.witness = str(tmp_path / "calls")
        return c

    def landed(engine: Any) -> Any:
        """Seen's stream rows, or WinCount's counts per key in the rows (it produces nothing here)."""
        if not columnar:
            return stream_rows(spark, engine.layout, "seen")
        rows = spark.read.format("delta").load(engine.layout.rows_of(WinCount.name)).where(
            (F.col("computation") == WinCount.name) & ~F.col("key").startswith("\x00")).collect()
        return sorted((r["key"], sorted(get_codec("int64map").decode(r["state"]).items())) for r in rows)

    older = connect("older")
    newer = None
    try:
        old = older.executor(comp())
        old.run_batch(frame(KEYS, 1_000), 0)
        old.settle()
        newer = connect("newer")
        new = newer.executor(comp())  # takes the intervals at once: the older is alive, same name
        assert min(new.owner.sequencers.values()) > max(old.owner.sequencers.values())
        before = landed(older)
        deadline = time.monotonic() + 30  # the older's owner-znode watch drops its leases
        while older.leases.held("seen") and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(LeaseLostError, match=r"taken over by 'newer' of instance 'a'.*a newer process with "
                                                 r"this instance's name took it"):
            old.run_batch(frame(KEYS, 2_000), 1)
        # past its lease check (as a process that missed the news would be), the fence stops it
        old.owner.check = lambda: None  # type: ignore[method-assign]
        with pytest.raises(StaleSequencerError):
            old.run_batch(frame(KEYS, 2_000), 1)
        assert landed(older) == before
        new.run_batch(frame(KEYS, 2_000), 1)
        new.settle()
        if columnar:  # one record per key from each process's landed batch, in window 0
            assert landed(older) == [(k, [(0, 2)]) for k in KEYS]
            assert os.listdir(tmp_path / "calls")
        else:
            counts = [J.decode(r[2].encode())["n"] for r in stream_rows(spark, older.layout, "seen")]
            assert sorted(counts) == [1] * len(KEYS) + [2] * len(KEYS)
    finally:
        if newer is not None:
            newer.close()
        try:
            older.close()
        except Exception:
            pass


def restart_figure(zk_server: Any, root: Path, instance: str | None) -> tuple[float, float, list[str]]:
    """Kill a job holding its leases after its first batches and start it again (``instance``:
    both runs' name); returns the seconds from the restart to its ``connect`` returning and to its
    first committed batch, and the restarted job's lines up to that batch."""
    store, folder = root / "store", root / "input"
    write_files(folder, 60)
    chroot = f"/figure-{uuid.uuid4().hex[:10]}"
    first = start_job(store, folder, zk_server.hosts, chroot, instance)
    seen: list[str] = []
    try:
        lines_until(first, "seen batch 1:", seen)
    finally:
        kill(first)
    t0 = time.monotonic()
    again = start_job(store, folder, zk_server.hosts, chroot, instance)
    lines: list[str] = []
    try:
        connected = lines_until(again, "CONNECTED", lines)
        batch = lines_until(again, "seen batch", lines)
    finally:
        kill(again)
    return connected - t0, batch - t0, [line for line in lines if " seen" in line or line.split()[-1] in
                                        ("CONNECTED", "GRANTED")]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_restart_to_first_committed_batch_after_sigkill(zk_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The figure, printed (never asserted): a job SIGKILLed while holding its leases, started
    again as a new process without an instance name (its leases are free once the dead ZooKeeper
    session timed out, 20 s after the kill by default) and with its instance name (it takes them
    at once). The restarted jobs' lines say when the leases were granted. Run with ``-s``."""
    before = restart_figure(zk_server, tmp_path / "before", None)
    after = restart_figure(zk_server, tmp_path / "after", "a")
    print("\nrestart to first committed batch after SIGKILL (connect returned / first batch committed):\n"
          f"  without an instance name: {before[0]:5.1f} s / {before[1]:5.1f} s\n"
          f"  with its instance name:   {after[0]:5.1f} s / {after[1]:5.1f} s", flush=True)
    for name, fig in (("without", before), ("with", after)):
        print(f"the restarted job's lines ({name} an instance name; seconds since its start):\n  "
              + "  ".join(fig[2]), flush=True)
    assert before[1] > 0 and after[1] > 0
