"""Key-interval leases on the real ZooKeeper server: sequencers, exclusion, session loss, ACLs."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from conftest import free_port
from deltawheel.statestore.clock import ManualClock
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import (
    CodecError,
    ConfigError,
    LeaseHeldError,
    LeaseLostError,
    LeaseSuspendedError,
    MigrationError,
    ZooKeeperServerError,
)
from deltawheel.statestore.zk.client import connect, digest_acls
from deltawheel.statestore.zk.grants import LeaseGrant, interval_path
from deltawheel.statestore.zk.layout import ZK_LAYOUT_VERSION, ensure_zk_layout
from deltawheel.statestore.zk.lease_tools import break_lease, list_leases
from deltawheel.statestore.zk.leases import LeaseManager
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from deltawheel.cli import main as cli_main

pytestmark = [pytest.mark.zk, pytest.mark.timeout(60)]

OWNER = "/pipelines/p/computations/c/intervals/00000/owner"


@pytest.fixture
def clients(zk_config: ZkConfig) -> Iterator[Callable[..., KazooClient]]:
    """Factory of connected clients on this test's chroot; all closed at the end."""
    made: list[KazooClient] = []

    def make(cfg: ZkConfig = zk_config) -> KazooClient:
        made.append(connect(cfg))
        return made[-1]

    yield make
    for c in made:
        c.stop()
        c.close()


def wait_until(cond: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def raises(fn: Callable[[], object], err: type[Exception]) -> bool:
    try:
        fn()
    except err:
        return True
    return False


def test_grant_payload_is_versioned() -> None:
    g = LeaseGrant(pipeline="p", computation="c", interval=1, owner="me", sequencer=5, granted_ms=1000)
    assert json.loads(g.to_payload())["format_version"] == 1
    with pytest.raises(CodecError, match="not JSON"):
        LeaseGrant.from_payload(b"\xff")
    with pytest.raises(CodecError, match="format_version 2.*upgrade deltawheel"):
        LeaseGrant.from_payload(json.dumps({**json.loads(g.to_payload()), "format_version": 2}).encode())
    with pytest.raises(CodecError, match="not a complete grant"):
        LeaseGrant.from_payload(json.dumps({**json.loads(g.to_payload()), "sequencer": None}).encode())
    with pytest.raises(ConfigError, match="out of range"):
        interval_path("p", "c", 100_000)


def test_sequencers_strictly_increase_and_old_grants_are_pruned(clients) -> None:  # type: ignore[no-untyped-def]
    clock = ManualClock(5_000)
    a = LeaseManager(clients(), pipeline="p", owner="a", clock=clock)
    b = LeaseManager(clients(), pipeline="p", owner="b")
    seqs = []
    for i in range(8):
        mgr = a if i % 2 == 0 else b
        seqs.append(mgr.acquire("c", [0])[0].sequencer)
        mgr.release("c")
    assert seqs == sorted(set(seqs)) and len(seqs) == 8
    grant = a.acquire("c", [0])[0]
    assert grant.granted_ms == 5_000 and grant.owner == "a" and grant.sequencer > seqs[-1]
    zk = clients()
    assert LeaseGrant.from_payload(zk.get(OWNER)[0]) == grant
    grants_dir = "/pipelines/p/computations/c/intervals/00000/grants"
    assert len(zk.get_children(grants_dir)) == 5  # pruned ...
    assert zk.exists(grants_dir).cversion >= 9  # ... while the counter keeps going up
    a.close()


def test_second_owner_waits_for_release(clients) -> None:  # type: ignore[no-untyped-def]
    a = LeaseManager(clients(), pipeline="p", owner="owner-a")
    b = LeaseManager(clients(), pipeline="p", owner="owner-b")
    first = a.acquire("c", [0])[0]
    with pytest.raises(LeaseHeldError, match=r"interval 0 of p/c is held by 'owner-a'"):
        b.acquire("c", [0])
    a.check_valid("c", 0)
    timer = threading.Timer(0.5, a.release, args=("c",))
    timer.start()
    second = b.acquire("c", [0], wait_s=10)[0]
    timer.join()
    assert second.owner == "owner-b" and second.sequencer > first.sequencer
    with pytest.raises(LeaseLostError, match="not held by this instance"):
        a.check_valid("c", 0)
    b.renew()


def test_a_released_lease_taken_by_the_next_owner_at_once_is_not_reported_lost(clients) -> None:  # type: ignore[no-untyped-def]
    """The next owner takes the interval between our release's delete and the release's own
    bookkeeping, and our watch reads the owner znode only then (both held back here, as a busy
    machine schedules them): the watch sees the new owner, but we gave the lease up ourselves: no
    on_lost, and check_valid says not held."""
    lost: list[str] = []
    a = LeaseManager(clients(), pipeline="p", owner="owner-a", on_lost=lambda _g, reason: lost.append(reason))
    b = LeaseManager(clients(), pipeline="p", owner="owner-b")
    a.acquire("c", [0])
    taken = threading.Event()
    real = a.zk_client.transaction

    def transaction() -> object:
        tx = real()
        commit = tx.commit

        def held_back() -> object:
            out = commit()
            assert taken.wait(30)  # the next owner holds the interval now
            time.sleep(1.0)  # our watch has seen its node by now
            return out

        tx.commit = held_back
        return tx

    real_get = a.zk_client.get

    def get(*args: object, **kw: object) -> object:  # only the watch reads after the acquire
        assert taken.wait(30)
        return real_get(*args, **kw)

    a.zk_client.transaction = transaction  # type: ignore[method-assign]
    a.zk_client.get = get  # type: ignore[method-assign]
    releasing = threading.Thread(target=a.release, args=("c",))
    releasing.start()
    second = b.acquire("c", [0], wait_s=20)[0]
    taken.set()
    releasing.join(60)
    assert second.owner == "owner-b" and lost == []
    with pytest.raises(LeaseLostError, match="not held by this instance"):
        a.check_valid("c", 0)


def test_acquire_is_all_or_nothing(clients) -> None:  # type: ignore[no-untyped-def]
    a = LeaseManager(clients(), pipeline="p", owner="a")
    b = LeaseManager(clients(), pipeline="p", owner="b")
    a.acquire("c", [2])
    with pytest.raises(LeaseHeldError, match="interval 2 of p/c is held by 'a'"):
        b.acquire("c", [3, 1, 2], wait_s=0.3)
    assert b.held("c") == {}
    owners = {r["interval"]: r["owner"] for r in list_leases(clients(), pipeline="p")}
    assert owners == {1: None, 2: "a"}  # 1 was taken and given back; 3 (after 2) never tried
    assert set(a.acquire("c", [1, 2, 3])) == {1, 2, 3}


def test_only_one_of_racing_owners_wins(clients) -> None:  # type: ignore[no-untyped-def]
    managers = [LeaseManager(clients(), pipeline="p", owner=f"m{i}") for i in range(4)]
    last = -1  # the first grant of an interval has sequencer 0
    for _ in range(3):
        won: list[LeaseGrant] = []
        barrier = threading.Barrier(len(managers))

        def race(m: LeaseManager, barrier: threading.Barrier, won: list[LeaseGrant]) -> None:
            barrier.wait()
            try:
                won.append(m.acquire("c", [0])[0])
            except LeaseHeldError:
                pass

        threads = [threading.Thread(target=race, args=(m, barrier, won)) for m in managers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and won[0].sequencer > last
        last = won[0].sequencer
        for m in managers:
            m.release()


def expire_session(client: KazooClient, hosts: str) -> None:
    """Expire ``client``'s session: open it from a second client, then close it."""
    session_id, password = client.client_id
    other = KazooClient(hosts=hosts, client_id=(session_id, password))
    other.start(timeout=10)
    other.stop()
    other.close()


def test_session_expiry_loses_every_lease(clients, zk_server) -> None:  # type: ignore[no-untyped-def]
    lost: list[tuple[list[LeaseGrant], str, str]] = []
    called = threading.Event()

    def on_lost(grants: list[LeaseGrant], reason: str) -> None:
        lost.append((grants, reason, threading.current_thread().name))
        called.set()

    client_a = clients()
    a = LeaseManager(client_a, pipeline="p", owner="a", on_lost=on_lost)
    held = a.acquire("c", [0, 1])
    expire_session(client_a, zk_server.hosts)
    assert called.wait(15)
    grants, reason, thread = lost[0]
    assert sorted(g.interval for g in grants) == [0, 1] and "expired" in reason
    assert "kazoo" not in thread.lower() and thread.startswith("deltawheel-")
    with pytest.raises(LeaseLostError, match="interval 0 of p/c was lost .*session expired"):
        a.check_valid("c", 0)
    assert a.held("c") == {}
    b = LeaseManager(clients(), pipeline="p", owner="b")
    taken = b.acquire("c", [0], wait_s=10)[0]
    assert taken.sequencer > held[0].sequencer
    wait_until(lambda: client_a.connected)  # kazoo opened a new session
    with pytest.raises(LeaseLostError, match="lost: c/0: ZooKeeper session expired"):
        a.renew()
    a.release("c", [0])  # forget the lost lease: must not touch b's owner znode
    b.renew()
    again = a.acquire("c", [1])[1]  # the new session can acquire again
    assert again.sequencer > held[1].sequencer
    a.check_valid("c", 1)


class CutProxy:
    """A TCP proxy to ZooKeeper that a test can cut (a real network failure) and restore."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.port = free_port()
        self._socks: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen()
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self._socks += [conn, upstream]
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        assert self._listener is not None
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() and frees the port
        self._listener.close()
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._socks.clear()


def test_suspended_connection_puts_leases_in_doubt(clients, zk_server, zk_config) -> None:  # type: ignore[no-untyped-def]
    proxy = CutProxy(zk_server.port)
    client = clients(replace(zk_config, hosts=f"127.0.0.1:{proxy.port}"))
    a = LeaseManager(client, pipeline="p", owner="a")
    a.acquire("c", [0])
    a.check_valid("c", 0)
    proxy.cut()
    wait_until(lambda: raises(lambda: a.check_valid("c", 0), LeaseSuspendedError), timeout_s=5)
    with pytest.raises(LeaseSuspendedError, match="in doubt"):
        a.check_valid("c", 0)
    with pytest.raises(LeaseSuspendedError, match="suspended"):
        a.renew()
    with pytest.raises(LeaseSuspendedError, match="suspended"):
        a.acquire("c", [1])
    with pytest.raises(LeaseSuspendedError, match="cannot release while .* suspended"):
        a.release()
    assert set(a.held("c")) == {0}
    proxy.restore()  # back within the 6 s session timeout: same session, leases re-verified
    wait_until(lambda: not raises(lambda: a.check_valid("c", 0), LeaseSuspendedError), timeout_s=10)
    a.check_valid("c", 0)
    a.renew()
    proxy.cut()


def test_lease_broken_while_disconnected_is_found_on_reconnect(clients, zk_server, zk_config) -> None:  # type: ignore[no-untyped-def]
    proxy = CutProxy(zk_server.port)
    notified: list[tuple[list[LeaseGrant], str]] = []
    a = LeaseManager(clients(replace(zk_config, hosts=f"127.0.0.1:{proxy.port}")), pipeline="p", owner="a",
                     on_lost=lambda grants, reason: notified.append((grants, reason)))
    a.acquire("c", [0, 1])
    proxy.cut()
    wait_until(lambda: raises(lambda: a.check_valid("c", 0), LeaseSuspendedError), timeout_s=5)
    assert break_lease(clients(), pipeline="p", computation="c", interval=1, apply=True)["applied"]
    proxy.restore()
    wait_until(lambda: bool(notified), timeout_s=10)
    assert [g.interval for g in notified[0][0]] == [1] and "re-verified after a reconnect" in notified[0][1]
    a.check_valid("c", 0)
    with pytest.raises(LeaseLostError, match="interval 1 of p/c was lost .*owner znode is gone"):
        a.check_valid("c", 1)
    proxy.cut()


def test_break_lease_dry_run_then_apply(clients) -> None:  # type: ignore[no-untyped-def]
    a = LeaseManager(clients(), pipeline="p", owner="a")
    before = a.acquire("c", [0])[0]
    admin = clients()
    plan = break_lease(admin, pipeline="p", computation="c", interval=0)
    assert plan["held"] and not plan["applied"] and plan["owner"] == "a" and plan["sequencer"] == before.sequencer
    a.renew()  # the dry run changed nothing
    assert break_lease(admin, pipeline="p", computation="c", interval=0, apply=True)["applied"]
    with pytest.raises(LeaseLostError, match="c/0: owner znode is gone"):
        a.renew()
    with pytest.raises(LeaseLostError, match="was lost"):
        a.check_valid("c", 0)
    b = LeaseManager(clients(), pipeline="p", owner="b")
    assert b.acquire("c", [0])[0].sequencer > before.sequencer
    a.release()  # a late release of the broken lease leaves b's znode alone
    b.renew()
    a.acquire("c", [3])
    break_lease(admin, pipeline="p", computation="c", interval=3, apply=True)
    b.acquire("c", [3])
    a.release("c", [3])  # a has not noticed the break: its guarded delete must still miss b's znode
    b.renew()
    assert a.held("c") == {} and set(b.held("c")) == {0, 3}
    assert break_lease(admin, pipeline="p", computation="c", interval=5) == {
        "path": interval_path("p", "c", 5) + "/owner", "pipeline": "p", "computation": "c", "interval": 5,
        "held": False, "applied": False, "action": "nothing to break: the interval has no owner"}


def test_break_lease_refuses_a_grant_in_progress(clients) -> None:  # type: ignore[no-untyped-def]
    zk = clients()
    LeaseManager(zk, pipeline="p", owner="a")
    zk.create(OWNER, json.dumps({"format_version": 1, "owner": "x", "sequencer": None}).encode(), makepath=True)
    with pytest.raises(LeaseHeldError, match="being granted right now"):
        break_lease(zk, pipeline="p", computation="c", interval=0, apply=True)


def test_digest_acl_protects_leases(clients, zk_config) -> None:  # type: ignore[no-untyped-def]
    cfg = replace(zk_config, digest="dw:s3cret")
    a = LeaseManager(clients(cfg), pipeline="p", owner="a", acls=digest_acls(cfg))
    a.acquire("c", [0])
    intruder = clients()  # same chroot, no digest
    with pytest.raises(NoAuthError):
        intruder.delete(OWNER)
    with pytest.raises(NoAuthError):
        intruder.set(OWNER, b"{}")
    with pytest.raises(LeaseHeldError, match="protected by a digest ACL"):
        break_lease(intruder, pipeline="p", computation="c", interval=0, apply=True)
    a.renew()
    a.release()
    with pytest.raises(LeaseHeldError, match="digest ACL this client lacks"):
        LeaseManager(intruder, pipeline="p", owner="x").acquire("c", [0])
    assert break_lease(clients(cfg), pipeline="p", computation="c", interval=0)["held"] is False


def test_zk_layout_is_created_once_and_guards_newer_versions(clients) -> None:  # type: ignore[no-untyped-def]
    zk = clients()
    assert sorted(ensure_zk_layout(zk)) == ["/layout", "/pipelines"]
    assert json.loads(zk.get("/layout")[0]) == {"format_version": ZK_LAYOUT_VERSION}
    assert ensure_zk_layout(zk) == []
    zk.set("/layout", json.dumps({"format_version": ZK_LAYOUT_VERSION + 1}).encode())
    with pytest.raises(MigrationError, match="newer than this deltawheel.*upgrade deltawheel"):
        LeaseManager(zk, pipeline="p", owner="a")
    zk.set("/layout", b"something else")
    with pytest.raises(MigrationError, match="does not hold a deltawheel layout version"):
        ensure_zk_layout(zk)


def test_connect_reports_an_unreachable_server() -> None:
    with pytest.raises(ZooKeeperServerError, match="could not connect to ZooKeeper"):
        connect(ZkConfig(hosts=f"127.0.0.1:{free_port()}"), timeout_s=1.0)


def test_closed_manager_refuses(clients) -> None:  # type: ignore[no-untyped-def]
    a = LeaseManager(clients(), pipeline="p", owner="a")
    a.acquire("c", [0])
    a.close()
    assert list_leases(clients(), pipeline="p")[0]["owner"] is None
    with pytest.raises(LeaseLostError, match="closed"):
        a.check_valid("c", 0)
    with pytest.raises(LeaseLostError, match="closed"):
        a.acquire("c", [0])


def test_cli_show_and_break(clients, zk_config, capsys) -> None:  # type: ignore[no-untyped-def]
    a = LeaseManager(clients(), pipeline="p", owner="worker-1")
    seq = a.acquire("c", [7])[7].sequencer
    zk = ["--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
    assert cli_main(["leases", "show", *zk]) == 0
    out = capsys.readouterr().out
    assert "worker-1" in out and f"{seq:>10}" in out
    assert cli_main(["leases", "break", "--pipeline", "p", "--computation", "c", "--interval", "7", *zk]) == 0
    assert "dry run" in capsys.readouterr().out
    a.renew()
    assert cli_main(["leases", "break", "--pipeline", "p", "--computation", "c", "--interval", "7",
                     "--apply", *zk]) == 0
    assert "broke the lease of 'worker-1'" in capsys.readouterr().out
    with pytest.raises(LeaseLostError):
        a.renew()
    assert cli_main(["leases", "show", "--json", *zk]) == 0
    assert json.loads(capsys.readouterr().out)[0]["owner"] is None
