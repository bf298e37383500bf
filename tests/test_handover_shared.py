"""A job instance sharing the intervals, after handing them over to a tool, takes back the free
ones of its share and does not wait for one another instance took meanwhile.

Found by a chaos run (``deltawheel chaos --seed 86 --seconds 90``): instance ``b`` held the four
intervals of ``bank`` and handed them over to a ``repair`` of one key; while they were given back
instance ``a``, started again, took interval 1 (its share of the target); once the repair was done
``b`` waited for all four again, up to its ``--wait`` (600 s), leaving intervals 0, 2 and 3 with no
owner for ten minutes, then stopped with ``LeaseHeldError`` (exit 4).

Real Spark, ZooKeeper and Delta: instance ``a`` runs the two-stage pipeline; the test acts as the
tool (a hand-over request for interval 0) and as the other instance (the lease of interval 1 taken
while the request is open), then ends the request.
"""

from __future__ import annotations

import socket
import time
from typing import Any, Callable

import pytest
from continuous_pipeline import click_rows, closing_rows, expected, make, outputs, write_file
from deltawheel.executor.drivers import sharing
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.zk.client import connect as make_client
from deltawheel.statestore.zk.handover import clear_handover, request_handover
from deltawheel.statestore.zk.lease_tools import list_leases
from deltawheel.statestore.zk.leases import LeaseManager
from deltawheel.statestore.zk.members import Membership
from test_continuous import wait_for

import deltawheel

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def _held(client: object, instance: str) -> list[int]:
    return sorted(r["interval"] for r in list_leases(client, pipeline="clicks")  # type: ignore[arg-type]
                  if r["computation"] == "user_minutes" and r["owner"] is not None and r.get("instance") == instance)


def _all_held_then_every_row_once(spark: object, client: object, layout: StoreLayout, run: Any,
                                  clicks: list[dict[str, Any]], last_file: Callable[[], None]) -> None:
    """``a`` holds every interval again; after ``last_file`` each stream holds every row once."""
    wait_for("a holds every interval", lambda: _held(client, "a") == [0, 1, 2, 3], runs=(run,), timeout_s=300)
    last_file()
    want_users, want_totals = expected(clicks)
    wait_for("both streams hold every row", lambda: len(outputs(spark, layout)[1]) >= len(want_totals),
             runs=(run,), timeout_s=300)
    time.sleep(2.0)  # a duplicate would land by now
    assert outputs(spark, layout) == (want_users, want_totals)
    run.stop()


@pytest.mark.timeout(1200)
def test_after_a_tool_a_shared_instance_takes_its_free_intervals_and_not_one_taken_meanwhile(  # type: ignore[no-untyped-def]
        spark, zk_config: ZkConfig, tmp_path, migrated_at) -> None:
    clicks = click_rows(120)
    folder, store = tmp_path / "input", tmp_path / "store"
    write_file(folder, "part-0.parquet", clicks[:60])
    layout = migrated_at(store)  # a migrated copy: connect migrating a new store runs in test_connect.py
    lines: list[str] = []
    client = make_client(zk_config)
    other = LeaseManager(make_client(zk_config), pipeline="clicks", owner=f"{socket.gethostname()}:other",
                         instance="b")
    try:
        with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                                pipeline="clicks", instance="a", wait_s=60) as engine:
            engine.progress = lines.append
            run = engine.start_pipeline(make(str(folder)), trigger="200 milliseconds")
            wait_for("a holds every interval of user_minutes", lambda: _held(client, "a") == [0, 1, 2, 3],
                     runs=(run,), timeout_s=300)
            request_handover(client, pipeline="clicks", computation="user_minutes", intervals=[0], tool="test",
                             by="the test")
            wait_for("a handed the intervals over", lambda: _held(client, "a") == [], runs=(run,), timeout_s=300)
            assert any("user_minutes: handing intervals over to test" in ln for ln in lines), lines
            other.acquire("user_minutes", [1], wait_s=30)  # instance b's share, taken while they are given back
            clear_handover(client, "clicks", "user_minutes")
            t0 = time.monotonic()
            wait_for("a took its free intervals again", lambda: any(
                "user_minutes: intervals taken again after test" in ln for ln in lines), runs=(run,), timeout_s=120)
            # not after waiting wait_s (60 s) for interval 1, and without it
            assert time.monotonic() - t0 < 45, lines
            assert _held(client, "a") == [0, 2, 3]
            other.release()  # b goes: a takes interval 1 at a later look at the target
            _all_held_then_every_row_once(spark, client, layout, run, clicks,
                                          lambda: write_file(folder, "part-1.parquet", clicks[60:] + closing_rows(clicks)))
    finally:
        other.close()
        client.stop()


@pytest.mark.timeout(900)
def test_two_instances_started_together_take_their_shares_without_waiting_for_each_other(  # type: ignore[no-untyped-def]
        spark, zk_config: ZkConfig, tmp_path, monkeypatch, migrated_at) -> None:
    """Instances started at once: ``a`` finds every interval free while it is alone, then ``b`` joins
    and takes its share before ``a`` acquires. ``a`` looks at the target again and takes its own
    share at once, not after waiting its ``--wait`` for ``b``'s (found by a chaos run: instance
    ``a`` waited 900 s for intervals ``b`` held, and the run never committed).

    The test is instance ``b``: it joins the members and takes its share right after ``a``'s first
    look, then leaves; ``a`` then holds every interval and each row is in its stream once."""
    clicks = click_rows(120)
    folder, store = tmp_path / "input", tmp_path / "store"
    write_file(folder, "part-0.parquet", clicks)
    layout = migrated_at(store)  # a migrated copy: connect migrating a new store runs in test_connect.py
    client = make_client(zk_config)
    b_client = make_client(zk_config)
    b = LeaseManager(b_client, pipeline="clicks", owner=f"{socket.gethostname()}:b", instance="b")
    b_member = Membership(b_client, pipeline="clicks", instance="b")
    first_look = sharing.Sharing.wanted
    came: list[bool] = []

    def b_comes_between(self, comp):  # type: ignore[no-untyped-def]
        seen = first_look(self, comp)
        if comp.name == "user_minutes" and not came:
            came.append(True)
            b_member.join()
            b.acquire("user_minutes", [2, 3])
        return seen

    monkeypatch.setattr(sharing.Sharing, "wanted", b_comes_between)
    # a's acquisition of b's share waits LOOK_AGAIN_S before a looks again: 1 s here instead of 10 s
    # (the same refusal and second look; the assertion below is about its 120 s wait)
    monkeypatch.setattr(sharing, "LOOK_AGAIN_S", 1.0)
    try:
        with deltawheel.connect(spark, store=str(store), zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                                pipeline="clicks", instance="a", wait_s=120) as engine:
            t0 = time.monotonic()
            run = engine.start_pipeline(make(str(folder)), trigger="200 milliseconds")
            assert time.monotonic() - t0 < 60  # not the 120 s of its wait
            assert _held(client, "a") == [0, 1] and _held(client, "b") == [2, 3]
            b_member.leave()
            b.release()
            _all_held_then_every_row_once(spark, client, layout, run, clicks,
                                          lambda: write_file(folder, "part-1.parquet", closing_rows(clicks)))
    finally:
        b.close()
        b_client.stop()
        client.stop()
