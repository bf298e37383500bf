"""Embedding an executor in your own Spark job: the README's snippet runs as written and fires its
event-time timers; without a watermark source, event-time timers are refused at start (a
computation declaring them) or warned about once (one that sets them)."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.runtime.batch import ComputationExecutor
from deltawheel.executor.windowing.windowed import windowed
from deltawheel.executor.windowing.windows import FixedWindows
from deltawheel.statestore.exceptions import ConfigError
from executor_util import BucketCounter, events, start_executor, stop_executor, stream_rows

pytestmark = [pytest.mark.spark, pytest.mark.zk]

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_block(after: str, first_line: str, *, holding: str | None = None) -> str:
    """The README's first ```python block after the heading / text ``after`` that starts with
    ``first_line`` (or, with ``holding``, that contains that text: a block's imports may change)."""
    text = README.read_text(encoding="utf-8")
    rest = text[text.index(after):]
    for block in re.findall(r"```python\n(.*?)```", rest, flags=re.S):
        if (holding in block) if holding is not None else block.lstrip().startswith(first_line):
            return str(block)
    raise AssertionError(f"no python block starting with {first_line!r} after {after!r} in the README")


@pytest.mark.timeout(600)
def test_the_readme_embedding_snippet_fires_event_time_timers(spark, zk_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The README's BucketCounter and its *Embedding it in your Spark job* snippet, run as written:
    only the four settings at its top are replaced by local paths and the test's ZooKeeper. Every
    bucket's event-time timer fires (once the bounded input is consumed, at the latest), so the
    counts stream holds each bucket's count and no state is left."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    counter = _python_block("", "", holding="from deltawheel import Computation\n\nclass BucketCounter")
    snippet = _python_block("### Embedding it in your Spark job", "from deltawheel")
    settings = {"STORE": str(tmp_path / "store"), "ZK_HOSTS": zk_server.hosts, "EVENTS": str(tmp_path / "events"),
                "CHECKPOINT": str(tmp_path / "chk")}
    for name, value in settings.items():
        snippet, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", snippet, flags=re.M)
        assert n == 1, f"the snippet sets {name} once at its top"
    # the input: 3 keys, 40 records over 0..39 s, in two files (two micro-batches)
    (tmp_path / "events").mkdir()
    rows = [{"q": f"k{i % 3}", "ts": i * 1_000} for i in range(40)]
    for part, chunk in enumerate((rows[:20], rows[20:])):
        pq.write_table(pa.Table.from_pylist(chunk), tmp_path / "events" / f"part-{part}.parquet")
    ns: dict[str, Any] = {"__name__": "readme_embedding", "spark": spark}
    assert "readme_embedding" not in sys.modules  # so Spark's workers get its classes by value
    exec(compile(counter, "README.md:BucketCounter", "exec"), ns)  # noqa: S102 - the README's own code
    exec(compile(snippet, "README.md:embedding", "exec"), ns)  # noqa: S102
    want: dict[tuple[str, int], int] = {}
    for r in rows:
        k = (str(r["q"]), int(r["ts"]) - int(r["ts"]) % 10_000)
        want[k] = want.get(k, 0) + 1
    got = {}
    import json
    for _rid, key, value, _ts in stream_rows(spark, ns["layout"], "counts"):
        v = json.loads(value)
        assert (key, v["start"]) not in got
        got[(key, v["start"])] = v["n"]
    assert got == want
    assert sum(r.timers_fired for r in ns["executor"].reports) == len(want)


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
        with caplog.at_level(logging.WARNING, logger="deltawheel.executor.runtime.batch"):
            ex.run_batch(events(spark, [("r1", "cats", 1_000)]), 0)
            ex.run_batch(events(spark, [("r2", "dogs", 2_000)]), 1)
    finally:
        stop_executor(ex, client)
    warned = [r.getMessage() for r in caplog.records if "no watermark source" in r.getMessage()]
    assert len(warned) == 1 and "buckets: event-time timers are set" in warned[0], caplog.records
    assert "manual_watermarks=True" in warned[0]
    assert sum("no watermark source" in line for line in lines) == 1
    assert stream_rows(spark, migrated_store, "counts") == []  # indeed nothing fired
