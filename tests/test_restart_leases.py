"""A restarted job instance takes its own dead predecessor's leases at once (real ZooKeeper):
the same instance name takes over, another name waits for the session, the older of two live
processes with one name loses its leases."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import LeaseHeldError, LeaseLostError
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.grants import LeaseGrant, interval_path
from deltawheel.statestore.zk.leases import LeaseManager
from kazoo.client import KazooClient

pytestmark = [pytest.mark.zk, pytest.mark.timeout(90)]

HOLDER = """
import sys, time
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.leases import LeaseManager
hosts, chroot, instance = sys.argv[1:4]
client = connect(ZkConfig(hosts=hosts, chroot=chroot, session_timeout_s=6.0))
m = LeaseManager(client, pipeline="p", owner="child", instance=None if instance == "-" else instance)
grants = m.acquire("c", [0, 1])
print("HELD", " ".join(str(grants[i].sequencer) for i in (0, 1)), flush=True)
time.sleep(600)
"""


@pytest.fixture
def clients(zk_config: ZkConfig) -> Iterator[Callable[[], KazooClient]]:
    made: list[KazooClient] = []

    def make() -> KazooClient:
        made.append(connect(zk_config))
        return made[-1]

    yield make
    for c in made:
        c.stop()
        c.close()


def killed_holder(zk_config: ZkConfig, instance: str | None) -> list[int]:
    """A child process that takes intervals 0 and 1 of p/c as ``instance``, SIGKILLed while it
    holds them (its session lives on in ZooKeeper until it times out); returns its sequencers."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, zk_config.hosts, zk_config.chroot, instance or "-"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("HELD"), line
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    return [int(s) for s in line.split()[1:]]


def owner_payload(client: KazooClient, interval: int) -> dict[str, object]:
    data, _ = client.get(f"{interval_path('p', 'c', interval)}/owner")
    return dict(json.loads(data))


def test_a_restart_with_its_instance_name_takes_the_dead_predecessors_leases_at_once(clients, zk_config) -> None:  # type: ignore[no-untyped-def]
    old = killed_holder(zk_config, "a")
    zk = clients()
    assert owner_payload(zk, 0)["instance"] == "a" and owner_payload(zk, 0)["owner"] == "child"
    again = LeaseManager(clients(), pipeline="p", owner="restarted", instance="a")
    got = again.acquire("c", [0, 1], wait_s=0)  # no waiting for the dead session to time out
    assert [got[i].sequencer > old[i] for i in (0, 1)] == [True, True]
    assert {g.instance for g in got.values()} == {"a"}
    for i in (0, 1):
        assert LeaseGrant.from_payload(zk.get(f"{interval_path('p', 'c', i)}/owner")[0]) == got[i]
    again.renew()  # ZooKeeper agrees: the owner znodes are the new session's
    again.release()
    assert zk.exists(f"{interval_path('p', 'c', 0)}/owner") is None


def test_another_instance_name_still_waits_for_the_dead_session(clients, zk_config) -> None:  # type: ignore[no-untyped-def]
    old = killed_holder(zk_config, "a")
    for name in ("b", None):
        other = LeaseManager(clients(), pipeline="p", owner=f"other-{name}", instance=name)
        with pytest.raises(LeaseHeldError, match=r"interval 0 of p/c is held by 'child'"):
            other.acquire("c", [0, 1], wait_s=0.5)
        assert other.held("c") == {}
    # the dead session times out (6 s here): then the leases are free for anybody
    got = LeaseManager(clients(), pipeline="p", owner="b", instance="b").acquire("c", [0, 1], wait_s=30)
    assert got[0].sequencer > old[0] and got[1].sequencer > old[1]


def test_the_older_of_two_live_processes_with_one_instance_name_loses_its_leases(clients) -> None:  # type: ignore[no-untyped-def]
    lost: list[tuple[list[LeaseGrant], str]] = []
    older = LeaseManager(clients(), pipeline="p", owner="older", instance="a",
                         on_lost=lambda grants, reason: lost.append((grants, reason)))
    first = older.acquire("c", [0, 1])
    newer = LeaseManager(clients(), pipeline="p", owner="newer", instance="a")
    second = newer.acquire("c", [0, 1], wait_s=0)
    assert second[0].sequencer > first[0].sequencer and second[1].sequencer > first[1].sequencer
    # the owner znodes' watch drops the older's leases: its next commit's lease check fails
    deadline = time.monotonic() + 15
    while older.held("c") and time.monotonic() < deadline:
        time.sleep(0.05)
    # on_lost runs on its own thread after a lease is dropped: wait for both calls
    while sum(len(grants) for grants, _ in lost) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(LeaseLostError, match=r"interval 0 of p/c was lost \(taken over by 'newer' of instance 'a' "
                                             r"\((owner sequencer \d+, ours \d+|its grant in progress, ours sequencer \d+)\); a newer process with this "
                                             r"instance's name took it"):
        older.check_valid("c", 0)
    assert sorted(g.interval for grants, _ in lost for g in grants) == [0, 1]
    older.release("c")  # forgetting the lost leases must not touch the newer's owner znodes
    newer.renew()
    # and the older cannot take them back by waiting: the newer is alive, and holds them
    assert newer.held("c") == second


def test_a_grant_in_progress_is_not_taken_over(clients) -> None:  # type: ignore[no-untyped-def]
    """A pending owner znode (phase 1 done, no sequencer yet) is only ever removed by its creator
    or its session's end, even for a process with the same instance name."""
    zk = clients()
    base = interval_path("p", "c", 0)
    zk.ensure_path(f"{base}/grants")
    pending = {"format_version": 1, "pipeline": "p", "computation": "c", "interval": 0, "owner": "half",
               "instance": "a", "sequencer": None, "granted_ms": None, "token": "t"}
    zk.create(f"{base}/owner", json.dumps(pending).encode(), ephemeral=True)
    same = LeaseManager(clients(), pipeline="p", owner="same", instance="a")
    with pytest.raises(LeaseHeldError, match=r"interval 0 of p/c is held by 'half'"):
        same.acquire("c", [0], wait_s=0.3)
    assert owner_payload(zk, 0)["owner"] == "half"
