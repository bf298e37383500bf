"""A three-server ZooKeeper ensemble (from pyspark's jars): leases and sequencers survive losing
its leader; without a quorum commits pause (no commit without a valid lease) and resume."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import LeaseHeldError, LeaseSuspendedError, ZooKeeperServerError
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.lease_tools import list_leases, next_sequencers
from deltawheel.statestore.zk.leases import LeaseManager

from deltawheel.servers.ensemble import ZooKeeperEnsemble

pytestmark = [pytest.mark.zk, pytest.mark.timeout(120)]


def wait_until(cond: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def suspended(m: LeaseManager) -> bool:
    try:
        m.check_valid("c", 0)
    except LeaseSuspendedError:
        return True
    return False


@pytest.fixture
def clients(ensemble: ZooKeeperEnsemble) -> Iterator[Callable[[], Any]]:
    made: list[Any] = []
    cfg = ZkConfig(hosts=ensemble.hosts, chroot="/ens", session_timeout_s=6.0)

    def make() -> Any:
        c = connect(cfg)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()
        c.close()


def test_ensemble_status_names_one_leader_and_refuses_an_even_size(ensemble: ZooKeeperEnsemble,
                                                                   tmp_path: Path) -> None:
    st = ensemble.status()
    assert st.quorum and st.leader is not None
    assert sorted(s.mode or "" for s in st.servers) == ["follower", "follower", "leader"]
    assert st.hosts == ensemble.hosts and len(ensemble.hosts.split(",")) == 3
    pids = [s.pid for s in st.servers]
    assert all(p is not None and psutil.pid_exists(p) for p in pids)
    # a second handle on the same folder finds the same servers (the ports are recorded)
    assert [s.pid for s in ZooKeeperEnsemble(ensemble.data_dir).status().servers] == pids
    with pytest.raises(ZooKeeperServerError, match="odd number of servers"):
        ZooKeeperEnsemble(tmp_path / "even", size=2)


def test_leases_survive_losing_the_leader_and_pause_without_quorum(ensemble: ZooKeeperEnsemble, clients,
                                                                   caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    a = LeaseManager(clients(), pipeline="p", owner="a")
    b = LeaseManager(clients(), pipeline="p", owner="b")
    first = a.acquire("c", [0, 1, 2, 3])
    a.release("c", [3])
    seen = {3: [first[3].sequencer, a.acquire("c", [3])[3].sequencer]}
    assert seen[3][1] > seen[3][0]

    # lose the leader: a quorum of two remains, a new leader is elected, the sessions live on
    leader = ensemble.leader()
    assert leader is not None
    ensemble.kill(leader)
    wait_until(lambda: ensemble.leader() not in (None, leader), timeout_s=30)
    assert a.await_valid("c", [0, 1, 2, 3]) >= 0.0
    a.renew()  # ZooKeeper confirms every lease is still a's, under the same sequencers
    assert {i: g.sequencer for i, g in a.held("c").items()} == {0: first[0].sequencer, 1: first[1].sequencer,
                                                                2: first[2].sequencer, 3: seen[3][1]}
    a.release("c", [3])
    seen[3].append(a.acquire("c", [3])[3].sequencer)
    assert seen[3] == sorted(set(seen[3]))  # new sequencers keep rising: none reused
    # a second client sees the fencing state: a owns every interval, at those sequencers
    rows = {r["interval"]: r for r in list_leases(b.zk_client, pipeline="p")}
    assert {i: (r["owner"], r["sequencer"]) for i, r in rows.items()} == {
        i: ("a", g.sequencer) for i, g in a.held("c").items()}
    with pytest.raises(LeaseHeldError, match="interval 0 of p/c is held by 'a'"):
        b.acquire("c", [0])
    assert next_sequencers(b.zk_client, pipeline="p", computation="c", intervals=[3])[3] > seen[3][-1]

    # lose the quorum: nobody serves, the leases are in doubt, nothing may be committed
    follower = next(p.myid for p in ensemble.peers if p.myid != leader)
    ensemble.kill(follower)
    assert not ensemble.status().quorum
    # the survivor serves on until it notices the lost quorum (a few ticks); a client may reconnect
    # to it meanwhile, so wait until it no longer serves before looking at the client
    survivor = next(s for p, s in zip(ensemble.peers, ensemble.servers, strict=True) if p.myid not in (leader, follower))
    wait_until(lambda: survivor.mode() is None, timeout_s=30)
    wait_until(lambda: suspended(a), timeout_s=15)
    with pytest.raises(LeaseSuspendedError, match="paused for .* ZooKeeper still does not serve"):
        a.await_valid("c", [0], max_pause_s=0.5)
    caplog.set_level(logging.WARNING, logger="deltawheel.statestore.zk.leases")
    result: list[float | BaseException] = []

    def committer() -> None:
        try:
            result.append(a.await_valid("c", [0, 1, 2, 3]))
        except BaseException as exc:
            result.append(exc)

    t = threading.Thread(target=committer, daemon=True)
    t.start()
    time.sleep(8.0)  # longer than the 6 s session timeout: still paused, not failed
    assert t.is_alive() and result == []
    assert "commits of p/c paused" in caplog.text
    ensemble.restart(leader)  # a majority again: the sessions are restored, the leases re-verified
    t.join(timeout=30)
    assert len(result) == 1 and isinstance(result[0], float) and result[0] > 8.0, result
    assert "commits of p/c resume" in caplog.text
    a.renew()
    assert set(a.held("c")) == {0, 1, 2, 3}
    a.release("c", [3])
    seen[3].append(a.acquire("c", [3])[3].sequencer)
    assert seen[3] == sorted(set(seen[3]))


def test_cli_lists_leases_through_the_ensemble(ensemble: ZooKeeperEnsemble, clients) -> None:  # type: ignore[no-untyped-def]
    a = LeaseManager(clients(), pipeline="p", owner="cli-owner")
    seq = a.acquire("c", [5])[5].sequencer
    ensemble.kill(1)  # one server down: still a quorum
    out = subprocess.run([sys.executable, "-m", "deltawheel.cli", "leases", "show", "--zk", ensemble.hosts,
                          "--zk-chroot", "/ens", "--pipeline", "p"], capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("p "))
    assert line.split()[:4] == ["p", "c", "5", str(seq)] and "cli-owner" in line


def test_member_errors_say_what_to_do(tmp_path: Path) -> None:
    from deltawheel.servers.zookeeper import EmbeddedZooKeeper, QuorumPeer

    peers = [QuorumPeer(1, "127.0.0.1", 1, 2, 3)]
    with pytest.raises(ZooKeeperServerError, match=r"myid 2 is not one of the ensemble's ids \[1\]"):
        EmbeddedZooKeeper(tmp_path / "m", quorum=peers, myid=2)
    with pytest.raises(ZooKeeperServerError, match="ZooKeeper from .* is not running; start it first"):
        EmbeddedZooKeeper(tmp_path / "m", quorum=peers, myid=1).wait_ready(timeout_s=0.1)
