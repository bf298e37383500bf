"""Turns at a shared table's commits (``statestore/zk/turns.py``) on a real ZooKeeper server: one
holder at a time, every writer served, and a holder that keeps the turn too long is passed by."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.turns import CommitTurns, turns_path

pytestmark = pytest.mark.zk


def _clients(zk_config, n):  # type: ignore[no-untyped-def]
    return [connect(zk_config) for _ in range(n)]


def test_writers_hold_the_turn_one_at_a_time_and_each_gets_its_share(zk_config) -> None:  # type: ignore[no-untyped-def]
    clients = _clients(zk_config, 4)
    turns = [CommitTurns(c, pipeline="p", writer=f"w{i}") for i, c in enumerate(clients)]
    spans: list[tuple[float, float, str]] = []
    lock = threading.Lock()

    def writer(t: CommitTurns, rounds: int) -> None:
        for _ in range(rounds):
            with t.turn("shared") as held:
                assert held
                start = time.monotonic()
                time.sleep(0.01)  # the commit
                end = time.monotonic()
            with lock:
                spans.append((start, end, t.writer))

    # two threads of one writer besides: they take its turns one at a time too
    threads = [threading.Thread(target=writer, args=(t, 6)) for t in turns] + [
        threading.Thread(target=writer, args=(turns[0], 6))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    try:
        assert len(spans) == 30
        spans.sort()
        overlaps = [(a, b) for a, b in itertools.pairwise(spans) if b[0] < a[1]]
        assert overlaps == []
        assert [t.taken for t in turns] == [12, 6, 6, 6] and sum(t.skipped for t in turns) == 0
        # nothing left queued: every turn's znode went at its end
        assert clients[0].get_children(turns_path("p", "shared")) == []
    finally:
        for c in clients:
            c.stop()
            c.close()


def test_a_holder_past_hold_s_is_passed_by_until_its_znode_goes(zk_config) -> None:  # type: ignore[no-untyped-def]
    holder_client, waiter_client = _clients(zk_config, 2)
    holder = CommitTurns(holder_client, pipeline="p", writer="hung")
    waiter = CommitTurns(waiter_client, pipeline="p", writer="live", hold_s=0.5)
    entered, leave = threading.Event(), threading.Event()

    def hang() -> None:
        with holder.turn("c") as held:
            assert held
            entered.set()
            leave.wait(30)

    th = threading.Thread(target=hang)
    th.start()
    try:
        assert entered.wait(10)
        t0 = time.monotonic()
        with waiter.turn("c") as held:
            assert not held  # passed by after hold_s, not after the holder's leave
        assert 0.5 <= time.monotonic() - t0 < 5
        t1 = time.monotonic()
        with waiter.turn("c") as held:
            assert not held
        assert time.monotonic() - t1 < 0.4  # taken as stuck: no second wait
        leave.set()
        th.join(10)
        with waiter.turn("c") as held:
            assert held  # the holder's znode is gone: turns again
        assert (waiter.taken, waiter.skipped) == (1, 2)
    finally:
        leave.set()
        th.join(10)
        for c in (holder_client, waiter_client):
            c.stop()
            c.close()


def test_no_zookeeper_no_wait_and_the_commit_goes_on(zk_config) -> None:  # type: ignore[no-untyped-def]
    client = connect(zk_config)
    turns = CommitTurns(client, pipeline="p", writer="w")
    client.stop()  # ZooKeeper out of reach: the commit is not held up
    ran = False
    with turns.turn("c") as held:
        ran = True
    client.close()
    assert ran and not held and turns.skipped == 1
