"""What the progress lines say, exactly: a batch names its id once (a flush of due timers names
none: its id is the query's next batch's), and a watermark that is not known reads ``unknown``
(not 1970-01-01, the epoch a computation's low watermark is held at while an upstream watermark is
not known)."""

from __future__ import annotations

import re
import time

import pytest
from executor_util import BucketCounter, events, start_executor, stop_executor

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def test_batch_lines_name_each_batch_once_and_an_unknown_watermark_as_unknown(spark, migrated_store,  # type: ignore[no-untyped-def]
                                                                               zk_config, capsys) -> None:
    from deltawheel.executor.protocol.host import BatchInputs

    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter(), watermarks=True)
    try:
        ex.authority.declare("buckets", upstream=["injector:events"], num_intervals=4, replace=True)
        ex.upstream = ("injector:events",)
        # as a continuous run holds a stage whose upstream watermark is not known yet
        ex.next_batch_inputs(BatchInputs(upstream_caps={"up": None}, hold="now"))
        t0 = int(time.time() * 1000) - 60_000
        capsys.readouterr()
        ex.run_batch(events(spark, [("r1", "cats", t0 + 1_000), ("r2", "dogs", t0 + 2_000)]), 0)
        ex.authority.publish_injector("events", t0 + 20_000)
        ex.next_batch_inputs(BatchInputs(hold="now"))
        ex.flush()  # fires the 10 s buckets the injector's watermark passed
        ex.flush()  # nothing left: the line says so
        ex.run_batch(events(spark, [("r3", "emus", t0 + 21_000)]), 1)
    finally:
        stop_executor(ex, client)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("buckets ")]
    print("\n".join(lines))
    batch_lines = [ln for ln in lines if re.match(r"buckets batch \d+:", ln)]
    assert [re.match(r"buckets batch (\d+):", ln).group(1) for ln in batch_lines] == ["0", "1"]  # type: ignore[union-attr]
    assert all(len(re.findall(r"\bbatch \d+\b", ln)) == 1 for ln in batch_lines)
    flushes = [ln for ln in lines if ln.startswith("buckets timers (no input): ")]
    assert len(flushes) == 2 and all(not re.search(r"\bbatch \d+\b", ln) for ln in flushes)
    assert "2 timers" in flushes[0] and "skipped: nothing due" in flushes[1]
    assert "wm in unknown low unknown;" in batch_lines[0]
    assert not any("1970" in ln for ln in lines)
    assert "wm in unknown" not in flushes[0] and "low unknown" not in batch_lines[1]


def test_watermarks_read_unknown_in_plans_and_lines() -> None:
    from deltawheel.executor.protocol.reports import describe_watermark, format_watermark
    from deltawheel.statestore.zk.watermarks import END_OF_TIME

    assert [format_watermark(v) for v in (None, 0, -4_000)] == ["unknown"] * 3
    assert format_watermark(3) == "1970-01-01 00:00:00" and format_watermark(END_OF_TIME) == "end"
    assert describe_watermark(None) == "unknown" and describe_watermark(0) == "unknown (0 ms)"
