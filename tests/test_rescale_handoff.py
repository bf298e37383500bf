"""Intervals an instance stops holding keep its reading position in the injector's watermark.

An instance that restarts or rebalances with a smaller share stops processing the intervals it
gives up; its estimate goes on with its reading. Until a later owner has caught up on those
intervals, their unprocessed records must hold the injector's watermark at the position where
it let go (docs/rescaling.md), or a windowed stage downstream closes their windows first.
Instances here are pipeline runners run one after the other in this process (as in
``test_rescale.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.computation import RECORD_KEY, Computation
from deltawheel.executor.drivers.pipeline import Pipeline
from deltawheel.executor.drivers.runner import PipelineRunner
from deltawheel.executor.sources.parquet import ParquetInjector
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import interval_of
from deltawheel.statestore.zk.client import connect
from deltawheel.statestore.zk.members import Membership, assign
from deltawheel.statestore.zk.watermarks import WatermarkAuthority
from deltawheel.statestore.zk.watermarks.codec import Znodes, decode
from executor_util import stream_rows
from pyspark import cloudpickle
from rescale_instance import write_file

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.spark, pytest.mark.zk]

B_SHARE = assign(["a", "b"], 4)["b"]
#: The one key the relay produces to: its window sums are in an interval of b's share.
SINK = next(k for k in (f"sink{i}" for i in range(100)) if interval_of(k, 4) in B_SHARE)


class Relay(Computation):
    """Stage 1 (no timers): counts each key's records and relays every record to :data:`SINK`."""

    name = "relay"
    inputs = {"events": RECORD_KEY}
    outputs = ("passed",)
    num_intervals = 4

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = (ctx.state or 0) + 1
        ctx.produce("passed", {"from": ctx.key}, key=SINK, timestamp_ms=record.timestamp_ms)


def run(spark: Any, layout: StoreLayout, folder: Path, zk_config: Any, *, name: str, instance: str | None,
        end: bool, windowed_stage: bool = True) -> list[tuple[Any, ...]]:
    """One run of the relay (and the window sums after it); the panes (key, value, time) stored after it."""
    from deltawheel import FixedWindows, windowed

    inj = ParquetInjector("events", str(folder), key_column="key", event_time_column="t",
                          watermark_delay_ms=1_000, max_files_per_trigger=1, max_event_ahead_ms=None)
    sums = windowed(name="sums", inputs={"passed": RECORD_KEY}, output="sums", windowing=FixedWindows(10_000),
                    combine="count", num_intervals=4)
    stages = (Relay(), sums) if windowed_stage else (Relay(),)
    PipelineRunner(spark, layout, Pipeline(name, (inj,), stages), zk=zk_config, wait_s=20,
                   instance=instance, warm_workers=False, end_of_input=end).run()
    return sorted(row[1:] for row in stream_rows(spark, layout, "sums")) if windowed_stage else []


def restart_with_half(spark: Any, layout: StoreLayout, folder: Path, zk_config: Any, *,
                      windowed_stage: bool) -> tuple[int | None, int]:
    """b reads files 0 and 1 for every interval, then restarts beside a (a live member whose own
    reading is past every file, as its batches would publish) with half of them and reads files
    2-4 for that half: (the injector's watermark, b's own estimate) after that."""
    for n in range(2):
        write_file(folder, n)
    run(spark, layout, folder, zk_config, name="shared", instance="b", end=False, windowed_stage=windowed_stage)
    for n in range(2, 5):
        write_file(folder, n)
    client = connect(zk_config)
    try:
        a = Membership(client, pipeline="shared", instance="a")
        a.join()
        authority = WatermarkAuthority(client, pipeline="shared")
        authority.publish_instance_injector("events", "a", 2_000_000, held={})
        run(spark, layout, folder, zk_config, name="shared", instance="b", end=False, windowed_stage=windowed_stage)
        a.leave()
        b_estimate = decode(client.get(f"{Znodes('shared').instances('events')}/b")[0], "b")["watermark_ms"]
        return authority.injector_watermark("events"), int(b_estimate)
    finally:
        client.stop()
        client.close()


@pytest.mark.timeout(600)
def test_a_restart_with_a_smaller_share_holds_the_injector_where_it_let_go(
        spark: Any, zk_config: Any, tmp_path: Path, migrated_at: Any) -> None:
    """After b's restart with half the intervals, its estimate is past file 4, but the other half's
    records of files 2-4 are processed by nobody: the injector's watermark stays behind them."""
    wm, b_estimate = restart_with_half(spark, migrated_at(tmp_path / "shared"), tmp_path / "in", zk_config,
                                       windowed_stage=False)
    assert b_estimate >= 1_030_000  # b read on (file n's event times start at 1,000,000 + n * 10,000)
    assert wm is not None and wm < 1_020_000  # behind every record of file 2


# slow (4 runs of two stages); test_a_restart_with_a_smaller_share_holds_the_injector_where_it_let_go
# covers the same rule in 2 runs of the relay, tests/test_watermarks_handoff.py the rule itself
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_intervals_given_up_hold_the_watermark_until_a_later_owner_caught_up(
        spark: Any, zk_config: Any, tmp_path: Path, migrated_at: Any) -> None:
    """As the test above, then b alone takes every interval again and catches up on files 2-4 for
    the half it gave up: those records reach the window sums on time, and the panes are those of
    one instance reading everything (none dropped as too late)."""
    folder = tmp_path / "in"
    for n in range(5):  # file n: window n
        write_file(folder, n)
    single = run(spark, migrated_at(tmp_path / "single"), folder, zk_config, name="single", instance=None, end=True)
    counts = [json.loads(value)["value"] for _, value, _ in single]
    assert counts == [12 * (n % 5 + 1) for n in range(5)]  # every window, whole
    for n in range(5):
        (folder / f"part-{n:05d}.parquet").unlink()
    layout = migrated_at(tmp_path / "shared")
    restart_with_half(spark, layout, folder, zk_config, windowed_stage=True)
    assert run(spark, layout, folder, zk_config, name="shared", instance="b", end=True) == single
    assert stream_rows(spark, layout, "sums_dropped") == []
