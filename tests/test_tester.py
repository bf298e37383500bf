"""deltawheel.testing.ComputationTester, used as a user testing an own computation would use it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from deltawheel import Computation, ErrorPolicy, LatePolicy, TimeDomain, WindowingError
from deltawheel.testing import ComputationTester

MINUTE = 60_000


class CardSpend(Computation):
    """Spend per card per minute; an alert when a minute's spend passes 100; a reminder in
    processing time when a card was quiet for 5 s after its first purchase."""

    name = "card_spend"
    inputs = {"payments": "card"}
    outputs = ("alerts", "minutes")
    late_policy = LatePolicy.ROUTE
    error_policy = ErrorPolicy.DEAD_LETTER
    dedup_retention = timedelta(seconds=30)

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        amount = float(record.value["amount"])  # a malformed payment raises: a dead letter
        minute = record.timestamp_ms // MINUTE * MINUTE
        state = ctx.state or {}
        state[str(minute)] = state.get(str(minute), 0) + amount
        ctx.state = state
        ctx.set_timer(f"m{minute}", minute + MINUTE)
        if len(state) == 1 and state[str(minute)] == amount:
            ctx.set_timer("quiet", ctx.now_ms + 5_000, domain=TimeDomain.PROCESSING_TIME)

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        if timer.tag == "quiet":
            ctx.produce("alerts", {"card": ctx.key, "quiet": True})
            return
        minute = timer.time_ms - MINUTE
        state = dict(ctx.state or {})
        spent = state.pop(str(minute), 0)
        ctx.produce("minutes", {"card": ctx.key, "minute": minute, "spent": spent})
        if spent > 100:
            ctx.produce("alerts", {"card": ctx.key, "minute": minute, "spent": spent})
        ctx.state = state or None


def _drive(t: ComputationTester) -> None:
    t.add({"card": "c1", "amount": 60}, event_time_ms=1_000, record_id="p1")
    t.add({"card": "c1", "amount": 70}, event_time_ms=20_000, record_id="p2")
    t.add({"card": "c1", "amount": 70}, event_time_ms=20_000, record_id="p2")  # a retry: dropped
    t.add({"card": "c2", "amount": 5}, event_time_ms=30_000, record_id="p3")
    t.add({"card": "c2", "amount": "lots"}, event_time_ms=31_000, record_id="p4")  # malformed


def test_a_minute_closes_when_the_watermark_passes_it() -> None:
    t = ComputationTester(CardSpend())
    _drive(t)
    assert t.state("c1") == {"0": 130.0} and t.state("c2") == {"0": 5.0}
    assert t.duplicates == 1 and t.processed == 4 and len(t.dead_letters) == 1  # as the batch line counts
    assert [(r.record_id, reason.split(":")[0]) for r, reason in t.dead_letters][0][0] == "p4"
    assert [x.time_ms for x in t.timers("c1") if x.domain is TimeDomain.EVENT_TIME] == [MINUTE]
    assert t.output() == []
    t.advance_watermark(MINUTE - 1)  # the timer at the minute's end is not due yet
    assert t.output() == []
    t.advance_watermark(MINUTE + 1)
    got = {(o.stream, o.key): o.value for o in t.output()}
    assert got == {("minutes", "c1"): {"card": "c1", "minute": 0, "spent": 130.0},
                   ("minutes", "c2"): {"card": "c2", "minute": 0, "spent": 5.0},
                   ("alerts", "c1"): {"card": "c1", "minute": 0, "spent": 130.0}}
    assert t.state("c1") is None and t.state("c2") is None
    # behind the watermark the minutes closed under: routed, not counted
    t.add({"card": "c1", "amount": 1}, event_time_ms=5_000, record_id="p5")
    assert [r.record_id for r in t.late_data] == ["p5"] and t.state("c1") is None


def test_processing_time_timers_and_dedup_retention() -> None:
    t = ComputationTester(CardSpend(), now_ms=0)
    t.add({"card": "c9", "amount": 1}, event_time_ms=0, record_id="q1")
    t.advance_processing_time(4_999)
    assert t.take_output("alerts") == []
    t.advance_processing_time(5_000)
    assert [o.value for o in t.take_output("alerts")] == [{"card": "c9", "quiet": True}]
    t.add({"card": "c9", "amount": 1}, event_time_ms=0, record_id="q1")
    assert t.duplicates == 1 and t.state("c9") == {"0": 1.0}
    t.advance_processing_time(40_000)  # past dedup_retention (30 s): the id no longer counts
    t.add({"card": "c9", "amount": 1}, event_time_ms=0, record_id="q1")
    assert t.duplicates == 1 and t.state("c9") == {"0": 2.0}


def test_bad_input_is_named() -> None:
    t = ComputationTester(CardSpend())
    with pytest.raises(WindowingError, match="does not read stream 'refunds'"):
        t.add({"card": "c1", "amount": 1}, event_time_ms=0, stream="refunds")
    t.add({"amount": 1}, event_time_ms=0)  # no key: a dead letter, as in a Spark batch
    assert [why for _, why in t.dead_letters] == ["no field 'card' in the value"] and t.processed == 0
    t.advance_watermark(10)
    with pytest.raises(WindowingError, match="only moves forward"):
        t.advance_watermark(5)


def test_the_same_run_on_a_delta_store_survives_a_restart(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = str(tmp_path / "store")
    memory, delta = ComputationTester(CardSpend()), ComputationTester(CardSpend(), spark=spark, store=store)
    for t in (memory, delta):
        _drive(t)
    assert delta.state("c1") == memory.state("c1") and delta.timers("c1") == memory.timers("c1")
    restarted = ComputationTester(CardSpend(), spark=spark, store=store)  # a new owner of the same rows
    assert restarted.keys() == memory.keys() == ["c1", "c2"]
    assert restarted.state("c1") == {"0": 130.0}
    # record ids are in the rows: the retry of p2 is still a duplicate after the restart
    restarted.add({"card": "c1", "amount": 70}, event_time_ms=20_000, record_id="p2")
    assert restarted.duplicates == 1 and restarted.state("c1") == {"0": 130.0}
    for t in (memory, restarted):
        t.finish()
    assert sorted(map(repr, restarted.output())) != [] and \
        sorted((o.stream, o.key, repr(o.value)) for o in restarted.output()) == \
        sorted((o.stream, o.key, repr(o.value)) for o in memory.output())
    rows = spark.read.format("delta").load(f"{store}/computations/card_spend/rows").where("computation = 'card_spend' AND state IS NOT NULL")
    assert rows.count() == 0  # every minute closed: no state left in the table


def test_the_readme_example_runs_as_written() -> None:
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    computation = next(b for b in blocks if "class BucketCounter(Computation)" in b)
    tester = next(b for b in blocks if "ComputationTester(BucketCounter())" in b)
    scope: dict[str, object] = {}
    exec(compile(computation + "\n" + tester, "README.md", "exec"), scope)  # its asserts are the test
    assert scope["t"].output("counts")  # type: ignore[attr-defined]
