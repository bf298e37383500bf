"""Intervals an instance lets go of hold its injector's watermark until a later owner caught up.

On the real ZooKeeper server through :class:`WatermarkAuthority`, and as a property of the
payload update and the watermark rule (``codec.instance_update``, ``low.instances_low``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from deltawheel.statestore.clock import ManualClock
from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.members import Membership
from deltawheel.statestore.zk.watermarks import WatermarkAuthority
from deltawheel.statestore.zk.watermarks.codec import Znodes, decode, instance_update
from deltawheel.statestore.zk.watermarks.low import instances_low
from hypothesis import given
from hypothesis import strategies as st
from kazoo.client import KazooClient

P = "p"


@pytest.fixture
def client(zk_config: ZkConfig) -> Iterator[KazooClient]:
    """One session for the authority and the member znodes (a member leaves by deleting its own)."""
    c = connect(zk_config)
    yield c
    c.stop()
    c.close()


@pytest.mark.zk
@pytest.mark.timeout(60)
def test_intervals_let_go_hold_the_injector_through_a_takers_death_until_one_caught_up(client: KazooClient) -> None:
    """b holds intervals 0 and 1 of C and restarts with interval 1 only; its estimate goes on with
    its reading, but interval 0's records past where b let go are processed by nobody: a takes it
    and dies in its catch-up (no catch-up recorded), then b takes it back and catches up."""
    wm = WatermarkAuthority(client, pipeline=P, clock=ManualClock(10_000))
    a, b = Membership(client, pipeline=P, instance="a"), Membership(client, pipeline=P, instance="b")
    a.join()
    b.join()
    wm.publish_instance_injector("src", "a", 9_000, held={"C": {}})  # a's own reading is far ahead
    assert wm.publish_instance_injector("src", "b", 2_000, held={"C": {0: 5, 1: 5}}) == 2_000
    # b's restart: it lets go of what it held, takes interval 1 again, catches up, reads on
    wm.record_held("src", "b", {"C": {}})
    wm.record_caught_up("C", {1: 6})
    wm.record_held("src", "b", {"C": {1: 6}})
    assert wm.publish_instance_injector("src", "b", 5_000, held={"C": {1: 6}}) == 2_000  # interval 0: at 2,000
    wm.record_held("src", "a", {"C": {}})  # a took interval 0 (sequencer 7) and dies in its catch-up
    a.leave()
    assert wm.publish_instance_injector("src", "b", 6_000, held={"C": {1: 6}}) == 2_000
    wm.record_caught_up("C", {0: 5})  # the sequencer b let go of: no later owner
    assert wm.publish_instance_injector("src", "b", 6_000) == 2_000
    wm.record_held("src", "b", {"C": {}})  # b takes both again (sequencer 8) and catches up
    wm.record_caught_up("C", {0: 8, 1: 8})
    wm.record_held("src", "b", {"C": {0: 8, 1: 8}})
    assert wm.publish_instance_injector("src", "b", 6_500, held={"C": {0: 8, 1: 8}}) == 6_500
    stored = decode(client.get(f"{Znodes(P).instances('src')}/b")[0], "b")
    assert "released" not in stored  # caught up and held again: nothing kept


@pytest.mark.zk
@pytest.mark.timeout(60)
def test_the_catch_up_that_clears_a_release_moves_the_injector_on_without_more_input(client: KazooClient) -> None:
    """Once the input has ended no batch publishes an estimate again: recording the new owner's
    caught-up intervals must itself let the injector's watermark pass where b let go."""
    wm = WatermarkAuthority(client, pipeline=P, clock=ManualClock(10_000))
    a, b = Membership(client, pipeline=P, instance="a"), Membership(client, pipeline=P, instance="b")
    a.join()
    b.join()
    wm.publish_instance_injector("src", "a", 9_000, held={"C": {}})
    wm.publish_instance_injector("src", "b", 3_000, held={"C": {0: 5}})
    wm.record_held("src", "b", {"C": {}})  # b lets interval 0 go at 3,000 and reads to the end
    assert wm.publish_instance_injector("src", "b", 9_000, held={"C": {}}) == 3_000
    wm.record_caught_up("C", {0: 6})  # a took interval 0 and caught up on it
    wm.record_held("src", "a", {"C": {0: 6}})
    assert wm.injector_watermark("src") == 9_000


@pytest.mark.zk
@pytest.mark.timeout(60)
def test_a_record_without_releases_reads_and_updates_as_before(client: KazooClient) -> None:
    """A gone instance's estimate stored without a ``released`` field counts while its intervals are
    not caught up; updating it writes no ``released`` until an interval is let go of."""
    wm = WatermarkAuthority(client, pipeline=P, clock=ManualClock(10_000))
    base = Znodes(P).instances("src")
    client.create(f"{base}/old", json.dumps({"format_version": 1, "sequencer": 0, "watermark_ms": 1_500,
                                             "published_ms": 1, "held": {"C": {"0": 3}}}).encode(), makepath=True)
    assert wm.publish_instance_injector("src", "x", 4_000, held={"C": {1: 4}}) == 1_500  # old is handing off
    wm.record_held("src", "old", {"C": {"0": 3}})
    assert "released" not in decode(client.get(f"{base}/old")[0], "old")
    wm.record_caught_up("C", {0: 4})
    assert wm.publish_instance_injector("src", "x", 4_000, held={"C": {0: 4, 1: 4}}) == 4_000


# one instance's steps: ("hold", intervals) takes them under new sequencers (letting go of the rest),
# ("read", ms) publishes a later estimate, ("catch", interval) a later owner's catch-up
STEPS = st.lists(st.one_of(st.tuples(st.just("hold"), st.frozensets(st.integers(0, 3))),
                           st.tuples(st.just("read"), st.integers(1, 1_000)),
                           st.tuples(st.just("catch"), st.integers(0, 3))), max_size=25)


@given(STEPS)
def test_the_watermark_never_passes_where_an_interval_was_let_go_until_it_is_caught_up(
        steps: list[tuple[str, Any]]) -> None:
    clock = ManualClock(0)
    raw: dict[str, Any] | None = None
    estimate: int | None = None
    held: dict[int, int] = {}
    let_go: dict[int, tuple[int, int | None]] = {}  # interval -> (sequencer, estimate when let go)
    caught: dict[int, int] = {}
    seq = 0

    def apply(watermark: int | None, now: dict[int, int]) -> None:
        nonlocal raw
        out = instance_update("t", "x", watermark, sequencer=0, held={"C": now}, clock=clock)(raw)
        raw = raw if out is None else decode(out, "t")

    for kind, arg in steps:
        if kind == "hold":
            seq += 1
            now = {i: seq for i in arg}
            let_go.update({i: (s, estimate) for i, s in held.items()})
            held = now
            apply(None, held)
        elif kind == "read":
            estimate = (estimate or 0) + arg
            apply(estimate, held)
        else:
            seq += 1
            caught[arg] = seq  # a later owner caught up (this instance lets go of it first, as takers do)
            if arg in held:
                let_go[arg] = (held.pop(arg), estimate)
                apply(None, held)
        pending = [pos for i, (s, pos) in let_go.items() if caught.get(i, -1) <= s and held.get(i, -1) <= s]
        low = instances_low({"x": raw}, live=["x"], caught={"C": caught})
        if None in pending or estimate is None:
            assert low is None
        else:
            assert low == min([estimate, *pending])  # every interval let go and not caught up holds it
