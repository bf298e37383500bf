"""A store's own embedded ZooKeeper, used as a user would: the CLI in subprocesses.

With no --zk, each local store runs its own server on a port recorded beside its data; the
processes using the store share it, the last one stops it, another store never connects to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.zk, pytest.mark.timeout(300)]

EVENTS, PER_BATCH = 1_000, 250


def dw(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deltawheel.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(env))


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTAWHEEL_ZK")}  # no --zk: the default
    return {**env, **(extra or {})}


def record(store: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((store / "_zk" / "server.json").read_text())  # type: ignore[no-any-return]


def zk_processes(store: Path) -> list[int]:
    """Live ZooKeeper processes serving ``store``'s folder."""
    cfg = str((store / "_zk" / "zoo.cfg").resolve())
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and cfg in (p.info["cmdline"] or []):
            out.append(int(p.info["pid"]))
    return out


@pytest.fixture
def stores(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Store folders of this test; any server left in them is stopped at the end."""
    made: list[Path] = []

    def make(name: str) -> Path:
        made.append(tmp_path / name)
        return tmp_path / name

    yield make
    for store in made:
        for pid in zk_processes(store):
            os.killpg(pid, signal.SIGKILL)


def test_each_store_has_its_own_server_and_status_says_whose(stores) -> None:  # type: ignore[no-untyped-def]
    a, b = stores("a"), stores("b")
    for store in (a, b):
        started = dw("zk", "start", "--store", str(store))
        assert started.returncode == 0, started.stderr
        assert f"connect with --zk 127.0.0.1:{record(store)['port']}" in started.stdout
    port_a, port_b = record(a)["port"], record(b)["port"]
    assert port_a != port_b and 2181 not in (port_a, port_b)  # never the shared default port
    status = dw("zk", "status", "--store", str(a))
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"running: pid {record(a)['pid']}, port {port_a}, data {a / '_zk'}" in status.stdout
    assert f"store: {a}\n" in status.stdout and "started by: deltawheel zk start --store" in status.stdout
    assert "stays running: yes" in status.stdout and "users: 0" in status.stdout
    # a command on store b with no --zk finds b's server, not a's
    shown = dw("leases", "show", "--store", str(b))
    assert shown.returncode == 0, shown.stderr
    assert f"at 127.0.0.1:{port_b}" in shown.stdout and "started" not in shown.stderr
    for store in (a, b):
        stopped = dw("zk", "stop", "--store", str(store))
        assert stopped.returncode == 0 and "stopped ZooKeeper" in stopped.stdout, stopped.stdout + stopped.stderr
        assert zk_processes(store) == []
    after = dw("zk", "status", "--store", str(a))
    assert after.returncode == 1 and f"not running (port {port_a}" in after.stdout


def test_a_stale_record_after_sigkill_is_replaced(stores) -> None:  # type: ignore[no-untyped-def]
    store = stores("s")
    assert dw("zk", "start", "--store", str(store)).returncode == 0
    old = record(store)
    os.killpg(old["pid"], signal.SIGKILL)  # the server dies, its record stays
    with contextlib.suppress(psutil.NoSuchProcess):
        psutil.Process(old["pid"]).wait(timeout=10)
    status = dw("zk", "status", "--store", str(store))
    assert status.returncode == 1 and f"stale record: its server (pid {old['pid']}) is gone" in status.stdout
    again = dw("zk", "start", "--store", str(store))
    assert again.returncode == 0, again.stderr
    new = record(store)
    assert new["pid"] != old["pid"] and zk_processes(store) == [new["pid"]]
    assert new["port"] == old["port"]  # the recorded port, free again, is reused
    assert dw("zk", "stop", "--store", str(store)).returncode == 0


_HOLDER = textwrap.dedent("""
    import os, sys, time
    from deltawheel.servers.embedded import ensure_zookeeper
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    use = ensure_zookeeper(ZkConfig(), StoreLayout(sys.argv[1]), own=True)
    print(use.hosts, flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:  # held until the test says
        time.sleep(0.05)
    print("stopped" if use.release() else "left", flush=True)
""")


def test_processes_starting_at_once_share_one_server_the_last_stops_it(stores, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = stores("c")
    release = [tmp_path / f"release-{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", _HOLDER, str(store), str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env()) for r in release]
    try:
        lines = [[p.stdout.readline().strip()] for p in procs if p.stdout is not None]  # each one's address
        for r, p, got in zip(release, procs, lines, strict=True):  # all three use the server: they leave in turn
            r.touch()
            assert p.stdout is not None
            got.append(p.stdout.readline().strip())
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0], (lines, errs)
    assert len({got[0] for got in lines}) == 1  # one address for all three
    assert sum(err.count("started the store's embedded ZooKeeper") for err in errs) == 1  # one server
    # the first two left it running for the third, which stopped it
    assert [got[1] for got in lines] == ["left", "left", "stopped"]
    assert zk_processes(store) == [] and record(store)["pid"] is None


def test_a_command_joins_a_running_server_and_does_not_stop_it(stores) -> None:  # type: ignore[no-untyped-def]
    store = stores("j")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(store), str(store / "never")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env())
    assert holder.stdout is not None
    hosts = holder.stdout.readline().strip()
    try:
        status = dw("zk", "status", "--store", str(store))
        assert f"users: 1\n  pid {holder.pid} since" in status.stdout, status.stdout
        assert "stays running: no (its last user stops it)" in status.stdout
        shown = dw("leases", "show", "--store", str(store))
        assert shown.returncode == 0 and f"at {hosts}" in shown.stdout, shown.stdout + shown.stderr
        assert zk_processes(store) == [record(store)["pid"]]  # the holder's server still runs
        refused = dw("zk", "stop", "--store", str(store))
        assert refused.returncode == 4 and "process(es) still use the store's ZooKeeper" in refused.stderr
    finally:
        holder.kill()  # SIGKILL: it never releases
        holder.communicate(timeout=30)
    # its user entry is pruned by pid liveness: the next user to leave stops the server
    shown = dw("leases", "show", "--store", str(store))
    assert shown.returncode == 0 and "started" not in shown.stderr
    assert zk_processes(store) == []


def test_explicit_zk_is_used_as_given(zk_server, stores) -> None:  # type: ignore[no-untyped-def]
    store = stores("e")
    shown = dw("leases", "show", "--store", str(store), "--zk", zk_server.hosts, "--zk-chroot", "/explicit-e")
    assert shown.returncode == 0 and f"at {zk_server.hosts}" in shown.stdout, shown.stdout + shown.stderr
    assert not (store / "_zk" / "server.json").exists()


def test_leases_show_names_the_chroots_that_hold_pipelines(zk_server) -> None:  # type: ignore[no-untyped-def]
    from kazoo.client import KazooClient

    client = KazooClient(hosts=zk_server.hosts)
    client.start(timeout=15)
    try:
        client.ensure_path("/team-x/pipelines/fraud/computations")
        shown = dw("leases", "show", "--zk", zk_server.hosts, "--zk-chroot", "/nothing-here")
    finally:
        client.delete("/team-x", recursive=True)
        client.stop()
        client.close()
    assert shown.returncode == 0, shown.stderr
    assert "no leases (no pipelines under ZooKeeper chroot /nothing-here" in shown.stdout
    assert re.search(r"pipelines found under other chroots: .*/team-x \(fraud\)", shown.stdout), shown.stdout
    assert "pass --zk-chroot" in shown.stdout


def test_rebalance_with_store_reaches_the_stores_own_server(stores) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.members import Membership

    store = stores("r")
    assert dw("zk", "start", "--store", str(store)).returncode == 0
    hosts = f"127.0.0.1:{record(store)['port']}"
    client = connect(ZkConfig(hosts=hosts))  # the default chroot, as the store's commands use
    try:
        Membership(client, pipeline="fraud", instance="a").join()  # a live instance of "fraud"
        shown = dw("rebalance", "--pipeline", "fraud", "--store", str(store))
        planned = dw("rebalance", "--pipeline", "fraud", "--computation", "c", "--assign", "a=0-1", "--plan",
                     "--store", str(store))
    finally:
        client.stop()
        client.close()
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "live instances of fraud: a\n" in shown.stdout
    assert planned.returncode == 0 and "plan: would request {'a': (0, 1)}" in planned.stdout, planned.stdout
    assert zk_processes(store) == [record(store)["pid"]]  # a server started by zk start stays
    assert dw("zk", "stop", "--store", str(store)).returncode == 0


def test_zk_start_without_port_skips_a_taken_default(zk_server, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.servers import zookeeper as zkmod

    monkeypatch.setattr(zkmod, "DEFAULT_ZK_PORT", zk_server.port)  # "2181" is another program's ZooKeeper
    port = zkmod.default_port(str(tmp_path / "fresh"), "127.0.0.1")
    assert port != zk_server.port and port > 0


# --- the demo, as in the issue: a SIGKILLed run, then another store; two copies at once ----------

def demo(store: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "deltawheel.cli", "demo", "--store", str(store), "--events", str(EVENTS),
            "--events-per-batch", str(PER_BATCH), "--wait", "600", *extra]


def outputs(spark, store: Path) -> dict[str, list[tuple[str, str]]]:  # type: ignore[no-untyped-def]
    out = {}
    for stream in ("window_counts", "predictions", "anomalies"):
        df = spark.read.format("delta").load(f"{store}/streams/{stream}")
        out[stream] = sorted((r["record_id"], r["key"] + "|" + r["value"].decode()) for r in df.collect())
    return out


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):  # type: ignore[no-untyped-def]
    """The rows of one clean demo run (its own store, its own server)."""
    store = tmp_path_factory.mktemp("clean") / "store"
    proc = subprocess.run(demo(store), capture_output=True, text=True, timeout=900, env=_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"records read by window_counter : {EVENTS}\n" in proc.stdout
    return store


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_sigkilled_demo_then_a_demo_on_another_store(spark, clean_run, stores) -> None:  # type: ignore[no-untyped-def]
    a, b = stores("killed"), stores("other")
    proc = subprocess.Popen(demo(a), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=_env())
    assert proc.stdout is not None
    for line in proc.stdout:  # kill it in the middle of the first stage's batches
        if "window_counter batch 1" in line:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert zk_processes(a) == [record(a)["pid"]]  # its ZooKeeper outlived it
    other = subprocess.run(demo(b), capture_output=True, text=True, timeout=900, env=_env())
    assert other.returncode == 0, other.stdout[-3000:] + other.stderr[-3000:]
    assert f"records read by window_counter : {EVENTS}\n" in other.stdout
    assert record(b)["port"] != record(a)["port"]
    assert outputs(spark, b) == outputs(spark, clean_run)
    # the killed store resumes on its own server (its SIGKILLed user is pruned) and ends with the same rows
    again = subprocess.run(demo(a), capture_output=True, text=True, timeout=900, env=_env())
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert outputs(spark, a) == outputs(spark, clean_run)
    assert zk_processes(a) == [] and zk_processes(b) == []


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_demos_at_once_on_one_store(spark, clean_run, stores) -> None:  # type: ignore[no-untyped-def]
    store = stores("twice")
    procs = [subprocess.Popen(demo(store), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for _ in range(2)]
    outs = [p.communicate(timeout=1400) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[0][-2000:] + o[1][-2000:] for o in outs]
    assert sum(err.count("started the store's embedded ZooKeeper") for _, err in outs) == 1
    assert outputs(spark, store) == outputs(spark, clean_run)  # exactly the rows of one clean run
    assert zk_processes(store) == []  # the last one to finish stopped the server
