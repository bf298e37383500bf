"""Low watermarks on the real ZooKeeper server: min semantics, monotonicity, fencing, CAS races."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from deltawheel.statestore.clock import ManualClock
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import (
    CodecError,
    ConfigError,
    LeaseLostError,
    LeaseSuspendedError,
    StaleSequencerError,
)
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.lease_tools import break_lease
from deltawheel.statestore.zk.leases import LeaseManager
from deltawheel.statestore.zk.watermarks import END_OF_TIME, Topology, WatermarkAuthority, parse_upstream
from kazoo.client import KazooClient

pytestmark = [pytest.mark.zk, pytest.mark.timeout(60)]

P = "p"
NOT_MS: Any = 1.5  # not epoch milliseconds (typed Any to get past the annotations)


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


@pytest.fixture
def wm(clients: Callable[..., KazooClient]) -> WatermarkAuthority:
    """injector 'src' -> A -> B, two key intervals each."""
    auth = WatermarkAuthority(clients(), pipeline=P, clock=ManualClock(10_000))
    auth.declare("A", upstream=["injector:src"], num_intervals=2)
    auth.declare("B", upstream=["computation:A"], num_intervals=2)
    return auth


def wait_until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_low_watermark_is_min_over_intervals_and_upstream(wm: WatermarkAuthority) -> None:
    assert wm.low_watermark("A") is None and wm.low_watermark("B") is None  # nothing known yet
    wm.publish_injector("src", 1_000)
    wm.publish_oldest_work("A", 0, 500, sequencer=1)
    assert wm.low_watermark("A") is None  # interval 1 never published: unknown, fire nothing
    wm.publish_oldest_work("A", 1, None, sequencer=1)  # nothing pending there
    assert wm.low_watermark("A") == 500  # oldest work holds A back below the injector
    wm.publish_oldest_work("B", 0, 800, sequencer=1)
    assert wm.low_watermark("B") is None
    wm.publish_oldest_work("B", 1, 300, sequencer=1)
    assert wm.low_watermark("B") == 300
    wm.publish_oldest_work("B", 1, None, sequencer=1)
    assert wm.low_watermark("B") == 500  # now held back by upstream A
    wm.publish_oldest_work("A", 0, 5_000, sequencer=1)
    assert (wm.low_watermark("A"), wm.low_watermark("B")) == (1_000, 800)  # injector, B's own work
    wm.publish_injector("src", 9_000)
    low = [wm.low_watermark(c) for c in ("B", "A")] + [wm.injector_watermark("src")]
    assert low == [800, 5_000, 9_000] and low == sorted(low)  # B <= A <= injector


def test_published_low_watermark_never_moves_back(wm: WatermarkAuthority) -> None:
    wm.publish_injector("src", 1_000)
    for i in (0, 1):
        wm.publish_oldest_work("A", i, 2_000, sequencer=1)
        wm.publish_oldest_work("B", i, None, sequencer=1)
    assert wm.published_low_watermark("A") is None
    assert wm.advance_low_watermark("A") == 1_000 and wm.advance_low_watermark("B") == 1_000
    wm.publish_oldest_work("A", 0, 200, sequencer=1)  # late data arrived behind the watermark
    assert wm.low_watermark("A") == 200  # computed value drops ...
    assert wm.advance_low_watermark("A") == 1_000  # ... the published one does not
    assert wm.published_low_watermark("A") == 1_000
    assert wm.low_watermark("B") == 1_000  # downstream counts A's published value
    wm.publish_oldest_work("A", 0, None, sequencer=1)
    wm.publish_injector("src", 3_000)
    assert wm.advance_low_watermark("A") == 2_000 and wm.advance_low_watermark("B") == 2_000


def test_injector_watermark_never_moves_back(wm: WatermarkAuthority) -> None:
    assert wm.injector_watermark("src") is None
    assert wm.publish_injector("src", 1_000) == 1_000
    assert wm.publish_injector("src", 400) == 1_000
    assert wm.injector_watermark("src") == 1_000
    assert wm.publish_injector("src", 1_500, sequencer=2) == 1_500
    with pytest.raises(StaleSequencerError, match=r"stored sequencer 2 is newer than ours \(1\).*stop this one"):
        wm.publish_injector("src", 9_000, sequencer=1)
    assert wm.injector_watermark("src") == 1_500
    with pytest.raises(CodecError, match="watermark_ms must be epoch milliseconds"):
        wm.publish_injector("src", NOT_MS)


def test_instances_publish_their_own_estimates_and_the_injector_takes_the_live_minimum(
        wm: WatermarkAuthority, clients: Callable[..., KazooClient], zk_config: ZkConfig) -> None:
    from deltawheel.statestore.zk.members import Membership

    a, b = Membership(clients(), pipeline=P, instance="a"), Membership(clients(), pipeline=P, instance="b")
    a.join()
    b.join()
    assert wm.publish_instance_injector("src", "a", 5_000) is None  # b is live and has no estimate: hold
    assert wm.injector_watermark("src") is None
    assert wm.publish_instance_injector("src", "b", 2_000) == 2_000
    assert wm.publish_instance_injector("src", "a", 9_000) == 2_000  # a reading ahead does not move it for b
    dying = connect(zk_config)
    c = Membership(dying, pipeline=P, instance="c")
    c.join()
    assert wm.publish_instance_injector("src", "c", 1_000) == 2_000  # a joiner behind stalls it, never moves it back
    assert wm.publish_instance_injector("src", "b", 3_000) == 2_000
    assert wm.publish_instance_injector("src", "c", 4_000) == 3_000
    assert wm.publish_instance_injector("src", "c", 100) == 3_000  # an instance's own estimate never moves back
    b.leave()  # a graceful leave: b no longer counts
    assert wm.publish_instance_injector("src", "a", 9_000) == 4_000
    dying.stop()  # c's session ends (its member znode is ephemeral): c no longer counts
    dying.close()
    assert wm.publish_instance_injector("src", "a", END_OF_TIME) == END_OF_TIME  # a drained its input
    assert wm.publish_instance_injector("src", "h", 1_000) == END_OF_TIME  # never back
    with pytest.raises(CodecError, match="watermark_ms must be epoch milliseconds"):
        wm.publish_instance_injector("src", "a", NOT_MS)
    with pytest.raises(ConfigError):
        wm.publish_instance_injector("src", "no/such", 1_000)


def test_an_instance_given_its_intervals_by_hand_counts_itself(wm: WatermarkAuthority) -> None:
    """No member at all: the publisher's own estimate is the injector's (and the other runs'
    estimates, of no live member, no longer count)."""
    assert wm.publish_instance_injector("src", "x", 1_000) == 1_000
    assert wm.publish_instance_injector("src", "y", 7_000) == 7_000
    assert wm.publish_instance_injector("src", "x", 2_000) == 7_000


def test_an_instance_that_left_counts_until_its_intervals_are_caught_up(
        wm: WatermarkAuthority, clients: Callable[..., KazooClient]) -> None:
    """A leaver's unread records of its intervals are read by the taker's catch-up: the injector's
    watermark must not pass the leaver's reading position before that catch-up is done."""
    from deltawheel.statestore.zk.members import Membership

    a, b = Membership(clients(), pipeline=P, instance="a"), Membership(clients(), pipeline=P, instance="b")
    a.join()
    b.join()
    wm.publish_instance_injector("src", "b", 2_000, held={"C": {2: 7, 3: 7}})
    assert wm.publish_instance_injector("src", "a", 9_000, held={"C": {0: 5, 1: 5}}) == 2_000
    b.leave()  # b read up to 2,000 and is gone: a takes intervals 2 and 3
    assert wm.publish_instance_injector("src", "a", 9_500) == 2_000  # not caught up: b still counts
    wm.record_caught_up("C", {2: 8})
    assert wm.publish_instance_injector("src", "a", 9_500) == 2_000  # interval 3 is still b's position
    wm.record_caught_up("C", {3: 7})  # no later owner (the same sequencer): still b's
    assert wm.publish_instance_injector("src", "a", 9_500) == 2_000
    wm.record_caught_up("C", {3: 8, 2: 3})  # a later owner of 3 caught up; 2 never moves back
    assert wm.publish_instance_injector("src", "a", 9_500) == 9_500
    # an instance lost after taking intervals but before its first estimate holds the watermark
    c = Membership(clients(), pipeline=P, instance="c")
    c.join()
    wm.record_held("src", "c", {"C": {0: 9}})
    assert wm.publish_instance_injector("src", "a", 9_900) == 9_500  # live, no estimate: hold
    c.leave()
    assert wm.publish_instance_injector("src", "a", 9_900) == 9_500  # gone, interval 0 not caught up: hold
    wm.record_caught_up("C", {0: 10})
    assert wm.publish_instance_injector("src", "a", 9_900) == 9_900


def test_stale_sequencer_cannot_move_oldest_work(wm: WatermarkAuthority) -> None:
    wm.publish_injector("src", 10_000)
    wm.publish_oldest_work("A", 0, 100, sequencer=5)
    wm.publish_oldest_work("A", 1, None, sequencer=3)
    with pytest.raises(StaleSequencerError,
                       match=r"interval 0 of p/A: the published oldest work has sequencer 5, newer than ours \(4\)"):
        wm.publish_oldest_work("A", 0, 9_000, sequencer=4)
    assert wm.low_watermark("A") == 100  # the zombie's value did not land
    wm.publish_oldest_work("A", 0, 150, sequencer=6)  # a newer owner may publish a lower value
    assert wm.low_watermark("A") == 150


def test_zombie_is_fenced_by_the_current_lease(clients: Callable[..., KazooClient],
                                               wm: WatermarkAuthority) -> None:
    old = LeaseManager(clients(), pipeline=P, owner="old").acquire("A", [0])[0]
    wm.publish_oldest_work("A", 0, 100, sequencer=old.sequencer)
    break_lease(clients(), pipeline=P, computation="A", interval=0, apply=True)
    new = LeaseManager(clients(), pipeline=P, owner="new").acquire("A", [0])[0]
    assert new.sequencer > old.sequencer
    # the new owner has not published yet: the stored sequencer alone would let the zombie through
    with pytest.raises(StaleSequencerError, match=r"the current lease has sequencer \d+, newer than ours"):
        wm.publish_oldest_work("A", 0, 9_000, sequencer=old.sequencer)
    wm.publish_oldest_work("A", 0, 120, sequencer=new.sequencer)
    stored = wm.oldest_work("A", 2)[0]
    assert stored is not None and (stored["sequencer"], stored["oldest_work_ms"]) == (new.sequencer, 120)


def test_concurrent_publishers_keep_the_newest_sequencer(clients: Callable[..., KazooClient],
                                                         wm: WatermarkAuthority) -> None:
    writers = [WatermarkAuthority(clients(), pipeline=P) for _ in range(6)]
    barrier = threading.Barrier(len(writers))
    rejected: dict[int, int] = {}
    errors: list[BaseException] = []

    def run(seq: int, auth: WatermarkAuthority) -> None:
        barrier.wait()
        for k in range(12):
            try:
                auth.publish_injector("src", k * 10 + seq)  # values interleave across threads
                auth.publish_oldest_work("A", 0, seq * 1_000 + k, sequencer=seq)
            except StaleSequencerError:
                rejected[seq] = rejected.get(seq, 0) + 1
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(s + 1, a)) for s, a in reversed(list(enumerate(writers)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stored = wm.oldest_work("A", 2)[0]
    assert stored is not None and (stored["sequencer"], stored["oldest_work_ms"]) == (6, 6_011)
    assert 6 not in rejected  # the newest owner is never rejected
    assert wm.injector_watermark("src") == 116  # no lost update of the monotonic max


def test_several_intervals_publish_in_one_transaction_all_or_none(clients: Callable[..., KazooClient],
                                                                   wm: WatermarkAuthority) -> None:
    seqs = {iv: g.sequencer for iv, g in LeaseManager(clients(), pipeline=P, owner="old").acquire("A", [0, 1]).items()}
    wm.publish_injector("src", 10_000)
    wm.publish_oldest_works("A", {0: (100, seqs[0]), 1: (None, seqs[1])})
    stored = wm.oldest_work("A", 2)
    assert [(s or {}).get("oldest_work_ms") for s in (stored[0], stored[1])] == [100, None]
    assert wm.low_watermark("A") == 100
    # interval 1 is taken over: a publish of both must fail naming it, and write neither
    break_lease(clients(), pipeline=P, computation="A", interval=1, apply=True)
    new = LeaseManager(clients(), pipeline=P, owner="new").acquire("A", [1])[1]
    with pytest.raises(StaleSequencerError, match=r"interval 1 of p/A: the current lease has sequencer \d+"):
        wm.publish_oldest_works("A", {0: (7_000, seqs[0]), 1: (7_000, seqs[1])})
    after = wm.oldest_work("A", 2)
    assert after[0] is not None and after[0]["oldest_work_ms"] == 100  # interval 0 not written either
    wm.publish_oldest_works("A", {1: (50, new.sequencer)})
    assert wm.low_watermark("A") == 50
    with pytest.raises(ConfigError, match="declared with 2 intervals; interval 2 does not exist"):
        wm.publish_oldest_works("A", {0: (1, seqs[0]), 2: (1, seqs[0])})
    with pytest.raises(CodecError):
        wm.publish_oldest_works("A", {0: (NOT_MS, seqs[0])})


class MeddlingClock:
    """A fixed clock that, the next time it is read, runs ``meddle``: a write by another client
    between a publisher's read and its conditional write (the clock stamps ``published_ms`` there)."""

    def __init__(self, now_ms: int) -> None:
        self._now = now_ms
        self.meddle: Callable[[], object] | None = None

    def now_ms(self) -> int:
        meddle, self.meddle = self.meddle, None
        if meddle is not None:
            meddle()
        return self._now


def test_a_write_between_read_and_write_forces_a_retry(clients: Callable[..., KazooClient],
                                                       wm: WatermarkAuthority) -> None:
    clock = MeddlingClock(10_000)
    slow = WatermarkAuthority(clients(), pipeline=P, clock=clock)
    wm.publish_injector("src", 100)
    clock.meddle = lambda: wm.publish_injector("src", 900)
    assert slow.publish_injector("src", 500) == 900  # re-read after the conflict: max kept
    assert wm.injector_watermark("src") == 900
    wm.publish_oldest_work("A", 0, 100, sequencer=1)
    clock.meddle = lambda: wm.publish_oldest_work("A", 0, 300, sequencer=2)
    with pytest.raises(StaleSequencerError, match=r"has sequencer 2, newer than ours \(1\)"):
        slow.publish_oldest_work("A", 0, 5_000, sequencer=1)
    stored = wm.oldest_work("A", 2)[0]
    assert stored is not None and (stored["sequencer"], stored["oldest_work_ms"]) == (2, 300)


def test_end_of_time_propagates_when_inputs_finish(wm: WatermarkAuthority) -> None:
    for c in ("A", "B"):
        for i in (0, 1):
            wm.publish_oldest_work(c, i, None, sequencer=1)
    wm.publish_injector("src", 4_000)
    assert wm.low_watermark("B") == 4_000
    assert wm.watermark_lag_ms("B") == 6_000  # ManualClock at 10 000
    wm.publish_injector("src", END_OF_TIME)
    assert wm.advance_low_watermark("A") == END_OF_TIME and wm.low_watermark("B") == END_OF_TIME
    assert wm.watermark_lag_ms("B") == 0
    wm.publish_oldest_work("B", 1, 7_000, sequencer=1)  # pending work still holds B back
    assert wm.low_watermark("B") == 7_000


def test_snapshot_shape_and_a_second_client_sees_the_same(clients: Callable[..., KazooClient],
                                                          wm: WatermarkAuthority) -> None:
    wm.publish_injector("src", 1_000, sequencer=3)
    wm.publish_oldest_work("A", 0, 700, sequencer=2)
    wm.publish_oldest_work("A", 1, None, sequencer=2)
    wm.publish_oldest_work("C", 4, 50, sequencer=1)  # never declared
    wm.advance_low_watermark("A")
    snap = wm.snapshot()
    assert snap["pipeline"] == P
    assert snap["injectors"] == {"src": {"watermark_ms": 1_000, "sequencer": 3, "published_ms": 10_000}}
    a = snap["computations"]["A"]
    assert a == {"declared": True, "upstream": ["injector:src"], "num_intervals": 2,
                 "intervals": {0: {"oldest_work_ms": 700, "sequencer": 2, "published_ms": 10_000},
                               1: {"oldest_work_ms": None, "sequencer": 2, "published_ms": 10_000}},
                 "low_watermark_ms": 700, "published_low_watermark_ms": 700}
    b = snap["computations"]["B"]
    assert b["intervals"] == {0: None, 1: None} and b["low_watermark_ms"] is None
    c = snap["computations"]["C"]
    assert c["declared"] is False and c["intervals"][4]["oldest_work_ms"] == 50 and len(c["intervals"]) == 5
    other = WatermarkAuthority(clients(), pipeline=P)
    assert other.snapshot() == snap
    assert other.low_watermark("A") == 700 and other.published_low_watermark("A") == 700
    assert other.topology("B") == Topology(("computation:A",), 2)


def test_declare_is_idempotent_and_validated(wm: WatermarkAuthority) -> None:
    assert wm.declare("A", upstream=["injector:src"], num_intervals=2) == Topology(("injector:src",), 2)
    with pytest.raises(ConfigError, match=r"A is already declared with upstream \['injector:src'\] and 2 "
                                          "intervals; pass replace=True"):
        wm.declare("A", upstream=["injector:src"], num_intervals=4)
    assert wm.declare("A", upstream=["injector:src"], num_intervals=4, replace=True).num_intervals == 4
    with pytest.raises(ConfigError, match="must be 'computation:NAME' or 'injector:NAME'"):
        wm.declare("D", upstream=["src"], num_intervals=1)
    with pytest.raises(ConfigError, match="injector name 'bad-name' is not valid"):
        parse_upstream("injector:bad-name")
    with pytest.raises(ConfigError, match="D cannot be its own upstream"):
        wm.declare("D", upstream=["computation:D"], num_intervals=1)
    with pytest.raises(ConfigError, match=r"num_intervals of D must be 1\.\.100000, got 0"):
        wm.declare("D", upstream=[], num_intervals=0)
    with pytest.raises(ConfigError, match="p/Z is not declared; declare"):
        wm.low_watermark("Z")
    with pytest.raises(ConfigError, match="B is declared with 2 intervals; interval 2 does not exist"):
        wm.publish_oldest_work("B", 2, 0, sequencer=1)
    with pytest.raises(ConfigError, match="out of range"):
        wm.publish_oldest_work("Z", 100_000, 0, sequencer=1)
    with pytest.raises(CodecError, match="oldest_work_ms must be epoch milliseconds.*got 1.5"):
        wm.publish_oldest_work("A", 0, NOT_MS, sequencer=1)
    wm.declare("A", upstream=["computation:B"], num_intervals=2, replace=True)
    with pytest.raises(ConfigError, match=r"has a cycle \(A -> B -> A\)"):
        wm.low_watermark("A")


def test_damaged_or_newer_payloads_are_refused(clients: Callable[..., KazooClient],
                                               wm: WatermarkAuthority) -> None:
    raw = clients()
    raw.create("/pipelines/p/watermarks/injectors/src",
               json.dumps({"format_version": 2, "watermark_ms": 1, "sequencer": 0}).encode(), makepath=True)
    with pytest.raises(CodecError, match="format_version 2, this deltawheel reads 1; upgrade deltawheel"):
        wm.injector_watermark("src")
    raw.set("/pipelines/p/topology/A", b"\xff")
    with pytest.raises(CodecError, match=r"topology payload is not JSON.*damaged: see docs/coordinator-recovery.md"):
        wm.topology("A")


def test_watchers_learn_of_advances(wm: WatermarkAuthority) -> None:
    seen: list[int | None] = []
    wm.watch_low_watermark("A", seen.append)
    wait_until(lambda: seen == [None])
    wm.publish_injector("src", 1_000)
    for i in (0, 1):
        wm.publish_oldest_work("A", i, None, sequencer=1)
    wm.advance_low_watermark("A")
    wait_until(lambda: seen == [None, 1_000])
    # two advances in quick succession: ZooKeeper's one-shot watches may fold them into one call,
    # with the latest value; nothing is delivered out of order
    for ms in (2_000, 3_000):
        wm.publish_injector("src", ms)
        wm.advance_low_watermark("A")
    wait_until(lambda: seen[-1:] == [3_000])
    assert seen[:2] == [None, 1_000] and seen[2:] in ([2_000, 3_000], [3_000]), seen
    assert wm.last_known("A").low_watermark_ms == 3_000


def test_suspended_connection_pauses_calls_until_it_serves_again_and_serves_stale_reads(
        clients: Callable[..., KazooClient], zk_server: Any, zk_config: ZkConfig,
        caplog: pytest.LogCaptureFixture) -> None:
    """While ZooKeeper does not answer, calls pause (logged once) instead of failing, and go on when it
    serves again -- even past the session timeout; a write under a lease sequencer whose session
    expired meanwhile raises LeaseLostError instead (nothing of it written)."""
    from test_leases import CutProxy

    proxy = CutProxy(zk_server.port)
    client = clients(replace(zk_config, hosts=f"127.0.0.1:{proxy.port}"))
    wm = WatermarkAuthority(client, pipeline=P, clock=ManualClock(10_000))
    bounded = WatermarkAuthority(client, pipeline=P, clock=ManualClock(10_000), max_pause_s=0.5)
    wm.declare("A", upstream=["injector:src"], num_intervals=1)
    wm.publish_injector("src", 1_000)
    wm.publish_oldest_work("A", 0, None, sequencer=1)
    assert wm.advance_low_watermark("A") == 1_000
    client.create("/mine", ephemeral=True)  # to see the session expire from another client
    watcher = clients()
    proxy.cut()
    wait_until(lambda: not client.connected, timeout_s=8)
    with pytest.raises(LeaseSuspendedError, match="paused for .* s and ZooKeeper still does not serve"):
        bounded.publish_injector("src", 2_000)
    last = wm.last_known("A")
    assert (last.low_watermark_ms, last.seen_ms, last.stale) == (1_000, 10_000, True)
    caplog.set_level(logging.WARNING, logger="deltawheel.statestore.zk.watermarks")
    results: dict[str, object] = {}

    def call(name: str, fn: Callable[[], object]) -> None:
        try:
            results[name] = fn()
        except BaseException as exc:
            results[name] = exc

    caplog.clear()
    threads = [threading.Thread(target=call, args=("injector", lambda: wm.publish_injector("src", 2_000)),
                                daemon=True),
               threading.Thread(target=call, args=("oldest", lambda: wm.publish_oldest_work("A", 0, 5_000,
                                                                                            sequencer=1)),
                                daemon=True)]
    for t in threads:
        t.start()
    try:
        # the server expires the cut-off session (6 s): the calls still wait, they do not fail
        wait_until(lambda: watcher.exists("/mine") is None, timeout_s=20)
        assert all(t.is_alive() for t in threads) and results == {}
        assert caplog.text.count("publishing the watermark of injector p/src paused") == 1
    finally:
        proxy.restore()
    for t in threads:
        t.join(timeout=30)
    assert results["injector"] == 2_000
    assert isinstance(results["oldest"], LeaseLostError), results
    assert "session expired while it was paused" in str(results["oldest"])
    assert "publishing the watermark of injector p/src resumes" in caplog.text
    assert wm.oldest_work("A", 1)[0]["oldest_work_ms"] is None  # type: ignore[index]
    assert wm.advance_low_watermark("A") == 2_000
    assert wm.last_known("A").stale is False


def test_closed_authorities_leave_no_listener_on_a_long_lived_client(clients, wm: WatermarkAuthority,  # type: ignore[no-untyped-def]
                                                                     migrated_store) -> None:
    """A job or a dashboard that polls the watermarks through one client, making an authority
    (or calling ``status``'s gather) each time, does not make the client keep them all."""
    from deltawheel.executor.drivers.status import gather

    client = clients()
    before = len(client.state_listeners)
    for _ in range(3):
        auth = WatermarkAuthority(client, pipeline=P)
        assert auth.snapshot() == wm.snapshot()  # it reads the pipeline as any other
        auth.close()
    for _ in range(3):
        assert P in gather(migrated_store, client, pipeline=P).watermarks
    assert len(client.state_listeners) == before


def test_publish_and_advance_gives_what_the_two_calls_give_and_fails_whole(
        clients: Callable[..., KazooClient], wm: WatermarkAuthority) -> None:
    """The batch's watermark step in one round: the oldest work of the intervals written, the low
    watermark computed from it (and from the injector and the other intervals), both or neither."""
    seqs = {iv: g.sequencer for iv, g in LeaseManager(clients(), pipeline=P, owner="me").acquire("A", [0, 1]).items()}
    assert wm.publish_and_advance("A", {0: (500, seqs[0]), 1: (None, seqs[1])}) is None  # no injector yet
    wm.publish_injector("src", 2_000)
    assert wm.publish_and_advance("A", {0: (500, seqs[0]), 1: (None, seqs[1])}) == 500
    assert wm.published_low_watermark("A") == 500 == wm.low_watermark("A")
    assert wm.publish_and_advance("A", {0: (None, seqs[0]), 1: (None, seqs[1])}) == 2_000  # only the injector
    # late work below it: the oldest work goes down, the published low watermark does not
    assert wm.publish_and_advance("A", {0: (1_200, seqs[0])}) == 2_000
    assert wm.low_watermark("A") == 1_200 and wm.published_low_watermark("A") == 2_000
    assert (wm.oldest_work("A", 2)[0] or {}).get("oldest_work_ms") == 1_200
    # B reads A's published value (downstream may have acted on it)
    assert wm.publish_and_advance("B", {0: (None, 1), 1: (None, 1)}) == 2_000
    # a takeover of interval 1: the step fails naming it, and writes neither node
    break_lease(clients(), pipeline=P, computation="A", interval=1, apply=True)
    LeaseManager(clients(), pipeline=P, owner="new").acquire("A", [1])
    wm.publish_injector("src", 9_000)
    with pytest.raises(StaleSequencerError, match=r"interval 1 of p/A: the current lease has sequencer \d+"):
        wm.publish_and_advance("A", {0: (8_000, seqs[0]), 1: (8_000, seqs[1])})
    assert (wm.oldest_work("A", 2)[0] or {}).get("oldest_work_ms") == 1_200
    assert wm.published_low_watermark("A") == 2_000
    with pytest.raises(ConfigError, match="declared with 2 intervals; interval 2 does not exist"):
        wm.publish_and_advance("A", {0: (1, seqs[0]), 2: (1, seqs[0])})
    with pytest.raises(CodecError):
        wm.publish_and_advance("A", {0: (NOT_MS, seqs[0])})
    # an undeclared computation: its oldest work is published, then the low watermark cannot be
    with pytest.raises(ConfigError, match="not declared"):
        wm.publish_and_advance("C", {0: (5, 1)})
    assert (wm.oldest_work("C", 1)[0] or {}).get("oldest_work_ms") == 5


def test_publish_and_advance_reads_again_after_a_concurrent_write(clients: Callable[..., KazooClient],
                                                                  wm: WatermarkAuthority) -> None:
    """Another writer between the step's reads and its transaction: the step reads again, so
    the low watermark counts what that writer wrote (and a redeclared topology is followed)."""
    clock = MeddlingClock(10_000)
    slow = WatermarkAuthority(clients(), pipeline=P, clock=clock)
    wm.publish_injector("src", 5_000)
    wm.publish_oldest_work("A", 1, None, sequencer=1)
    assert slow.publish_and_advance("A", {0: (4_000, 1)}) == 4_000
    # another instance's interval 1 gets work at 3 000 between the step's reads and its write: a
    # low watermark of 4 500 from the stale reads must not land; read again, the step keeps 4 000
    clock.meddle = lambda: (wm.publish_oldest_work("A", 1, 3_000, sequencer=1), wm.publish_injector("src", 6_000))
    assert slow.publish_and_advance("A", {0: (4_500, 1)}) == 4_000
    assert wm.published_low_watermark("A") == 4_000 and wm.low_watermark("A") == 3_000
    assert (wm.oldest_work("A", 2)[0] or {}).get("oldest_work_ms") == 4_500
    # the oldest work of interval 0 is rewritten by someone else between the reads and the write
    clock.meddle = lambda: wm.publish_oldest_work("A", 0, 4_700, sequencer=1)
    wm.publish_oldest_work("A", 1, None, sequencer=1)
    assert slow.publish_and_advance("A", {0: (5_500, 1)}) == 5_500
    assert (wm.oldest_work("A", 2)[0] or {}).get("oldest_work_ms") == 5_500
    # A is redeclared with three intervals after the step last read its topology: interval 2 counts
    wm.declare("A", upstream=["injector:src"], num_intervals=3, replace=True)
    wm.publish_oldest_work("A", 2, 5_200, sequencer=1)
    assert slow.publish_and_advance("A", {0: (5_900, 1)}) == 5_500  # max(published 5 500, computed 5 200)
    wm.publish_oldest_work("A", 2, None, sequencer=1)
    assert slow.publish_and_advance("A", {0: (5_900, 1), 2: (None, 1)}) == 5_900


def test_publish_and_advance_publishes_injector_estimates_in_the_same_transaction(
        clients: Callable[..., KazooClient], wm: WatermarkAuthority) -> None:
    """The step with ``injectors``: the estimate lands as publish_injector would land it (never
    backwards, refused under a newer sequencer), and the low watermark counts the stored value."""
    seqs = {iv: g.sequencer for iv, g in LeaseManager(clients(), pipeline=P, owner="me").acquire("A", [0, 1]).items()}
    none = {0: (None, seqs[0]), 1: (None, seqs[1])}
    # no injector node yet: the step creates it and the low watermark is computed from it
    assert wm.publish_and_advance("A", none, injectors={"src": (3_000, 0)}) == 3_000
    assert wm.injector_watermark("src") == 3_000 == wm.published_low_watermark("A")
    # an older estimate does not move it back, and the low watermark uses what is stored
    assert wm.publish_and_advance("A", {0: (9_000, seqs[0]), 1: (None, seqs[1])},
                                  injectors={"src": (2_000, 0)}) == 3_000
    assert wm.injector_watermark("src") == 3_000
    assert wm.publish_and_advance("A", none, injectors={"src": (4_000, 0)}) == 4_000
    # an injector no topology names is published too (and does not count for A)
    assert wm.publish_and_advance("A", none, injectors={"src": (4_500, 0), "other": (7, 0)}) == 4_500
    assert wm.injector_watermark("other") == 7
    # a newer publisher of the source: nothing of the step is written
    wm.publish_injector("src", 5_000, sequencer=3)
    with pytest.raises(StaleSequencerError, match=r"injector p/src: stored sequencer 3 is newer than ours \(0\)"):
        wm.publish_and_advance("A", {0: (100, seqs[0]), 1: (None, seqs[1])}, injectors={"src": (6_000, 0)})
    assert (wm.oldest_work("A", 2)[0] or {}).get("oldest_work_ms") is None
    assert wm.injector_watermark("src") == 5_000 and wm.published_low_watermark("A") == 4_500
    with pytest.raises(CodecError):
        wm.publish_and_advance("A", none, injectors={"src": (NOT_MS, 3)})
    # another writer moves the injector between the step's reads and its write: the step reads again
    clock = MeddlingClock(10_000)
    slow = WatermarkAuthority(clients(), pipeline=P, clock=clock)
    clock.meddle = lambda: wm.publish_injector("src", 8_000, sequencer=3)
    assert slow.publish_and_advance("A", none, injectors={"src": (6_000, 3)}) == 8_000
    assert wm.injector_watermark("src") == 8_000 == wm.published_low_watermark("A")
