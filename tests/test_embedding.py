"""Embedding an executor in your own Spark job: without a watermark source, event-time timers are
refused at start (a computation declaring them) or warned about once (one that sets them). The
README's embedding snippet runs as written in tests/test_connect.py."""

from __future__ import annotations

import logging

import pytest
from deltawheel.executor.protocol.executor import ComputationExecutor
from deltawheel.executor.windowing.windowed import windowed
from deltawheel.executor.windowing.windows import FixedWindows
from deltawheel.statestore.exceptions import ConfigError
from executor_util import BucketCounter, events, start_executor, stop_executor, stream_rows

pytestmark = [pytest.mark.spark, pytest.mark.zk]

@pytest.mark.timeout(120)
def test_a_computation_declaring_event_time_timers_refuses_to_start_without_a_watermark_source(spark, migrated_store):  # type: ignore[no-untyped-def]
    comp = windowed(name="win", inputs={"events": "q"}, output="panes", windowing=FixedWindows(10_000))
    ex = ComputationExecutor(spark, migrated_store, comp, owner=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"win uses event-time timers, but its executor has no watermark source "
                                          r"\(authority=None\).*WatermarkAuthority.*manual_watermarks=True"):
        ex.start()  # refused before any lease is taken (owner None would fail there)


@pytest.mark.timeout(600)
def test_event_time_timers_set_without_a_watermark_source_are_warned_about_once(
        spark, migrated_store, zk_config, caplog) -> None:  # type: ignore[no-untyped-def]
    """A plain computation setting event-time timers with no authority: one loud warning (log and
    progress line) that they will not fire unless the caller moves the watermark."""
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    lines: list[str] = []
    ex.progress = lines.append
    try:
        with caplog.at_level(logging.WARNING, logger="deltawheel.executor.protocol.watermarks"):
            ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 0)
            ex.run_batch(events(spark, [("r2", "dogs", 2_000)]), 1)
    finally:
        stop_executor(ex, client)
    warned = [r.getMessage() for r in caplog.records if "no watermark source" in r.getMessage()]
    assert len(warned) == 1 and "buckets: event-time timers are set" in warned[0], caplog.records
    assert "manual_watermarks=True" in warned[0]
    assert sum("no watermark source" in line for line in lines) == 1
    assert stream_rows(spark, migrated_store, "counts") == []  # indeed nothing fired
