"""A pipeline of several computations through the engine: ``engine.run_pipeline(pipeline)``.

docs/embedding.md's two-stage example ("Pipelines of several computations") runs as written (only
its store, ZooKeeper and input folder are pointed at the test's), and both of its streams hold
exactly the rows a count made here without deltawheel gives.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.zk.client import connect as connect_zk
from deltawheel.statestore.zk.lease_tools import list_leases
from deltawheel.statestore.zk.watermarks import END_OF_TIME, WatermarkAuthority

import deltawheel
from deltawheel import ZkConfig

pytestmark = [pytest.mark.spark, pytest.mark.zk]

REPO = Path(__file__).resolve().parents[1]
EMBEDDING = REPO / "docs" / "embedding.md"
MINUTE = 60_000


def doc_block(after: str, first_line: str) -> str:
    """The first ```python block after the heading ``after`` that starts with ``first_line``."""
    text = EMBEDDING.read_text(encoding="utf-8")
    rest = text[text.index(after):]
    for block in re.findall(r"```python\n(.*?)```", rest, flags=re.S):
        if block.lstrip().startswith(first_line):
            return str(block)
    raise AssertionError(f"no python block starting with {first_line!r} after {after!r} in docs/embedding.md")


def clicks(folder: Path) -> list[dict[str, Any]]:
    """6 users, 150 clicks over 5 minutes, in two Parquet files (two micro-batches), shuffled
    within each file (less disorder than the injector's delay: no click is late)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(39)
    folder.mkdir(parents=True)
    rows = [{"user": f"u{rng.randrange(6)}", "ts": i * 2_000 + rng.randrange(1_000)} for i in range(150)]
    for part in range(2):
        chunk = rows[part * 75:(part + 1) * 75]
        rng.shuffle(chunk)
        pq.write_table(pa.Table.from_pylist(chunk), folder / f"part-{part}.parquet")
    return rows


def stream_values(spark: Any, layout: Any, stream: str) -> list[tuple[str, dict[str, Any]]]:
    """(key, decoded value) of every row of ``stream``."""
    from deltawheel.statestore.codecs import get_codec

    codec = get_codec("json")
    return [(r["key"], codec.decode(r["value"])) for r in spark.read.format("delta").load(layout.stream(stream)).collect()]


@pytest.mark.timeout(900)
def test_the_two_stage_example_in_embedding_md_runs_as_written(spark, zk_server, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The doc's example gives the rows counted without deltawheel, wired with nothing given; it
    prints its batch lines, whose last one per computation shows the watermark the run ended with,
    and its summary prints as one short line."""
    block = doc_block("## Pipelines of several computations", "import deltawheel")
    store = tmp_path / "store"
    block, n = re.subn(r"^STORE, ZK = .*$", f"STORE, ZK = {str(store)!r}, {zk_server.hosts!r}", block, flags=re.M)
    assert n == 1, "the example sets STORE and ZK once"
    block, n = re.subn(r'"data/clicks-input"', repr(str(tmp_path / "input")), block)
    assert n == 1, "the example names its input folder once"
    rows = clicks(tmp_path / "input")
    ns: dict[str, Any] = {"__name__": "embedding_two_stages"}  # not importable: classes go to the tasks by value
    exec(compile(block, "docs/embedding.md:two-stages", "exec"), ns)
    engine, summary = ns["engine"], ns["summary"]

    # the count without deltawheel: per (user, minute), then per minute
    per_user = Counter((r["user"], r["ts"] - r["ts"] % MINUTE) for r in rows)
    per_minute: dict[int, dict[str, int]] = {}
    for (_user, start), n_clicks in per_user.items():
        tot = per_minute.setdefault(start, {"users": 0, "clicks": 0})
        tot["users"] += 1
        tot["clicks"] += n_clicks
    got_users = stream_values(spark, engine.layout, "user_counts")
    assert sorted((k, v["user"], v["start"], v["clicks"]) for k, v in got_users) == sorted(
        (str(start), user, start, c) for (user, start), c in per_user.items())
    got_totals = stream_values(spark, engine.layout, "totals")
    assert sorted((k, json.dumps(v, sort_keys=True)) for k, v in got_totals) == sorted(
        (str(start), json.dumps({"start": start, **tot}, sort_keys=True)) for start, tot in per_minute.items())
    assert len(per_minute) == 5
    assert sum(r.records_in for r in summary.reports["user_minutes"]) == len(rows)
    assert sum(r.records_in for r in summary.reports["minute_totals"]) == len(per_user)
    assert sum(r.late for reps in summary.reports.values() for r in reps) == 0

    # the lines printed: a line per batch, and each computation's last line shows the low
    # watermark the run ended with (the end of time: its input finished, everything delivered)
    out = capsys.readouterr().out
    for name in ("user_minutes", "minute_totals"):
        assert re.search(rf"^{name} batch 0: ", out, flags=re.M), out[-3000:]
        lows = re.findall(rf"^{name}\b.*\blow (?:watermark )?([^;\s]+(?: [^;\s]+)?)", out, flags=re.M)
        assert lows and lows[-1] == "end", (name, lows, out[-3000:])
        assert summary.low_watermarks[name] == END_OF_TIME
    # the summary: one short line, the reports behind its attributes
    text = repr(summary)
    assert "\n" not in text and len(text) < 400, text[:1000]
    assert text == str(summary)
    n_user = len(summary.reports["user_minutes"])
    assert f"user_minutes: {n_user} batches, {len(rows)} records in, {len(per_user)} produced, low watermark end" \
        in text, text

    # wired with nothing given: stage 2's watermark is stage 1's; the leases are given back
    client = connect_zk(ZkConfig(hosts=zk_server.hosts))
    try:
        authority = WatermarkAuthority(client, pipeline="clicks")
        try:
            topo = authority.snapshot()["computations"]
        finally:
            authority.close()
        held = [r for r in list_leases(client, pipeline="clicks") if r["owner"] is not None]
    finally:
        client.stop()
        client.close()
    assert topo["minute_totals"]["upstream"] == ["computation:user_minutes"]
    assert topo["user_minutes"]["upstream"] == ["injector:clicks"]
    assert held == []
    assert not engine.client.connected  # the with block closed the engine

    # what run_pipeline refuses, before anything starts
    pipeline = ns["pipeline"]
    with deltawheel.connect(spark, store=str(store), zk=zk_server.hosts, pipeline="other") as other:
        with pytest.raises(ConfigError, match=r"pipeline 'clicks' given to an engine connected for pipeline 'other'.*"
                                              r"deltawheel.connect\(\.\.\., pipeline='clicks'\)"):
            other.run_pipeline(pipeline)
        renamed = deltawheel.Pipeline("other", pipeline.injectors, pipeline.computations)
        with pytest.raises(ConfigError, match=r"run_pipeline: owner, zk are the engine's \(give them to "
                                              r"deltawheel.connect\)"):
            other.run_pipeline(renamed, zk=None, owner="x")
        with pytest.raises(ConfigError, match=r"minute_totals reads stream 'user_counts', which no injector or "
                                              r"computation produces"):
            other.run_pipeline(deltawheel.Pipeline("other", (), (ns["MinuteTotals"](),)))
