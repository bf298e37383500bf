"""The vectorised path (``Computation.combine`` + ``process_combined``) against the per-record one.

The same randomised batches (replays of earlier record ids, an id twice within a batch, late
records, undecodable values, event-time timers firing windows) run through the image task's
``_run`` on real Parquet images twice: with a per-record windowed count-and-sum, and with the same
computation declaring the vectorised path. After every batch both hold the same rows (state,
timers, hold, record ids), made the same productions (ids included) and counts. The testing
harness (``ComputationTester``, one combine per key) gives the same states and outputs too.
"""

from __future__ import annotations

import json
import os
import random
import zlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltawheel.executor.exceptions import UserCodeError
from deltawheel.executor.tasks.image.spec import ImageSpec
from deltawheel.executor.tasks.image.task import run_intervals
from deltawheel.executor.tasks.input import PREP_DDL
from deltawheel.executor.testkit import ComputationTester
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.rowtable.frames import arrow_schema as _arrow
from deltawheel.statestore.rowtable.rows import FENCE_KEY, rows_file_ddl
from deltawheel.statestore.writepath.image.summary import SUMMARY_DDL
from deltawheel.statestore.writepath.streams import stream_schema_ddl
from image_fences import fence_images

from deltawheel import Computation

N_IV = 2
SEQ = 5
WIN = 100

class WindowSum(Computation):
    """Per key and window of 100 ms: a count and a sum of the values' ``n`` (one per record
    without a value), emitted when the watermark passes the window; a late record is counted
    into its own key ``late:<window>`` of the state and produces a note."""

    name = "winsum"
    inputs = {"events": "k"}
    outputs = ("out",)
    codec = "msgpack"

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        start = record.timestamp_ms - record.timestamp_ms % WIN
        st = ctx.state or {}
        if record.late:
            st[f"late:{start}"] = st.get(f"late:{start}", 0) + 1
            ctx.state = st
            ctx.produce("out", {"late": record.record_id})
            return
        n = 1 if record.value is None else record.value["n"]
        cur = st.get(str(start))
        st[str(start)] = [1, n] if cur is None else [cur[0] + 1, cur[1] + n]
        ctx.state = st
        if cur is None:
            ctx.set_timer(str(start), start + WIN - 1)

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        st = dict(ctx.state or {})
        c, s = st.pop(timer.tag, [0, 0])
        ctx.produce("out", [ctx.key, int(timer.tag), c, s], timestamp_ms=timer.time_ms)
        ctx.state = st or None


class WindowSumVector(WindowSum):
    """The same computation (same name: the same production ids), declaring the vectorised
    path: a group-by per key and window."""

    calls: dict[str, int] = {"combine": 0, "combined_keys": 0}  # the test's witness that the path ran

    def combine(self, records):  # type: ignore[no-untyped-def]
        self.calls["combine"] += 1
        ts = records.column("timestamp_ms").to_numpy()
        vals = records.column("value")
        n = (np.ones(len(ts), dtype=np.int64) if pa.types.is_null(vals.type)
             else pc.struct_field(vals, "n").to_numpy(zero_copy_only=False))
        t = pa.table({"key": records.column("key"), "start": ts - ts % WIN, "n": n})
        g = t.group_by(["key", "start"], use_threads=False).aggregate([("n", "count"), ("n", "sum")])
        return g.sort_by([("key", "ascending"), ("start", "ascending")])

    def process_combined(self, ctx, rows):  # type: ignore[no-untyped-def]
        self.calls["combined_keys"] += 1
        st = ctx.state or {}
        for start, count, total in rows:
            cur = st.get(str(start))
            st[str(start)] = [count, total] if cur is None else [cur[0] + count, cur[1] + total]
            if cur is None:
                ctx.set_timer(str(start), start + WIN - 1)
        ctx.state = st


def _batches(rng: random.Random, n_batches: int) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    seq = 0
    for b in range(n_batches):
        batch = []
        for _ in range(rng.randint(0, 60)):
            seq += 1
            batch.append({"record_id": f"r{seq:05d}", "key": f"k{rng.randint(0, 14)}",
                          "ts": b * 300 + rng.randint(-250, 300) - (900 if rng.random() < 0.05 else 0),
                          "n": rng.randint(1, 9), "bad": rng.random() < 0.03})
        if out and out[-1] and rng.random() < 0.6:  # a source replaying part of the last batch
            batch += rng.sample(out[-1], min(len(out[-1]), rng.randint(1, 5)))
        if batch and b % 5 == 4:  # a record twice within the batch
            batch.append(dict(rng.choice(batch)))
        out.append(batch)
    return out


def _input_table(batch: list[dict[str, Any]], wm_late: int | None, values: bool) -> Any:
    schema = _arrow(PREP_DDL).append(pa.field("interval", pa.int32())).append(pa.field("_m", pa.bool_()))
    rows = [{"record_id": r["record_id"], "key": r["key"],
             "value": (b"{not json" if r["bad"] else json.dumps({"n": r["n"]}).encode()) if values else None,
             "codec": "json", "timestamp_ms": r["ts"], "stream": "events", "position": f"p{r['record_id']}",
             "late": wm_late is not None and r["ts"] < wm_late, "_bad": None,
             "interval": zlib.crc32(r["key"].encode()) % N_IV, "_m": False} for r in batch]
    rows += [{"interval": iv, "_m": True} for iv in range(N_IV)]
    return pa.Table.from_pylist(rows, schema=schema)


def _image_rows(root: str, images: dict[int, tuple[str, ...]]) -> dict[str, tuple[Any, ...]]:
    out = {}
    for (rel,) in images.values():
        for r in pq.read_table(os.path.join(root, rel)).to_pylist():
            if r["key"] == FENCE_KEY:
                continue
            out[r["key"]] = (r["state"], r["codec"], tuple((t["time_ms"], t["tag"], t["domain"]) for t in r["timers"]),
                             r["next_event_timer_ms"], r["watermark_hold_ms"], r["timer_seq"],
                             tuple(sorted(i["record_id"] for i in r["record_ids"])),
                             tuple(sorted(p["production_id"] for p in r["pending"] or ())))
    return out


def _run_image(comp: Computation, root: str, batches: list[list[dict[str, Any]]],
               values: bool) -> list[tuple[Any, ...]]:
    """Every batch through the image task; per batch (rows, productions, counts)."""
    rows_schema = _arrow(rows_file_ddl())
    images = fence_images(root, N_IV, SEQ, prefix=f"init-{os.path.basename(root)}")
    os.makedirs(os.path.join(root, "out"))
    acted = None
    got = []
    for b, batch in enumerate(batches):
        wm = None if b < 2 else b * 300 - 400
        now = 1_000 + b
        spec = ImageSpec(comp=comp, rows_root=TableFiles(root), images=dict(images),
                         sequencers={iv: SEQ for iv in range(N_IV)},
                         stream_roots={"out": TableFiles(os.path.join(root, "out"))}, wm=wm, now_ms=now,
                         horizon_ms=now - 3 if b >= 3 else None, commit_id=f"c{b}", rows_schema=rows_schema,
                         stream_schema=_arrow(stream_schema_ddl()), stream_format_version=1, route_late=False,
                         summary_schema=_arrow(SUMMARY_DDL), strong=True)
        summaries = [s.to_row() for s in run_intervals(spec, _input_table(batch, acted, values))]
        for s in summaries:
            if s.get("new_path"):
                images[s["interval"]] = (s["new_path"],)
        prods = sorted((r["record_id"], r["key"], r["value"], r["timestamp_ms"])
                       for s in summaries for f in s["prod_files"]
                       for r in pq.read_table(os.path.join(root, "out", f["path"])).to_pylist())
        counts = {c: sum(s[c] for s in summaries) for c in ("processed", "duplicates", "fired", "late", "n_dead",
                                                            "n_prods", "keys_written")}
        got.append((_image_rows(root, images), prods, counts))
        if wm is not None:
            acted = wm if acted is None else max(acted, wm)
    return got


@pytest.mark.parametrize("values,seed", [(True, 1), (False, 2), (True, 3)])
def test_the_vectorised_path_gives_the_per_record_results(spark, tmp_path, values, seed) -> None:  # type: ignore[no-untyped-def]
    batches = _batches(random.Random(seed), 16)
    os.makedirs(tmp_path / "a")
    os.makedirs(tmp_path / "b")
    per_record = _run_image(WindowSum(), str(tmp_path / "a"), batches, values)
    WindowSumVector.calls.update(combine=0, combined_keys=0)
    vector = _run_image(WindowSumVector(), str(tmp_path / "b"), batches, values)
    # one combine per interval and batch (not per key), most keys through it
    assert 0 < WindowSumVector.calls["combine"] <= N_IV * len(batches)
    assert WindowSumVector.calls["combined_keys"] > 2 * WindowSumVector.calls["combine"]
    for b, (x, y) in enumerate(zip(per_record, vector, strict=True)):
        assert x[0] == y[0], f"batch {b}: rows"
        assert x[1] == y[1], f"batch {b}: productions"
        assert x[2] == y[2], f"batch {b}: counts"
    totals = {c: sum(r[2][c] for r in per_record) for c in ("processed", "duplicates", "fired", "late", "n_dead")}
    # the run exercised what it claims to: windows fired, replays and late records, bad values
    assert totals["fired"] > 10 and totals["duplicates"] > 0 and totals["late"] > 0
    assert (totals["n_dead"] > 0) == values


def test_the_harness_runs_the_vectorised_path_as_the_per_record_one() -> None:
    rng = random.Random(7)
    testers = [ComputationTester(WindowSum()), ComputationTester(WindowSumVector())]
    WindowSumVector.calls.update(combine=0, combined_keys=0)
    for step in range(30):
        for _ in range(rng.randint(1, 6)):
            n, ts, key, rid = rng.randint(1, 9), step * 50 + rng.randint(0, 120), f"k{rng.randint(0, 3)}", f"r{rng.random()}"
            for t in testers:
                t.add({"k": key, "n": n}, event_time_ms=ts, record_id=rid)
        if step % 4 == 3:
            for t in testers:
                t.advance_watermark(step * 50 - 100)
    for t in testers:
        t.finish()
    a, b = testers
    assert WindowSumVector.calls["combine"] > 10  # one per key and record added (the harness runs each at once)
    assert [(o.key, o.value) for o in a.output("out")] == [(o.key, o.value) for o in b.output("out")]
    assert len(a.output("out")) > 10
    assert {k: a.state(k) for k in a.keys()} == {k: b.state(k) for k in b.keys()}


class NoKeyColumn(WindowSumVector):
    name = "nokey"

    def combine(self, records):  # type: ignore[no-untyped-def]
        return records.drop_columns(["key"])


def test_a_combine_without_a_key_column_fails_naming_what_to_return() -> None:
    t = ComputationTester(NoKeyColumn())
    with pytest.raises(UserCodeError, match="combine must return a pyarrow.Table with a string 'key' column"):
        t.add({"k": "a", "n": 1}, event_time_ms=5)


def test_combine_without_process_combined_is_refused() -> None:
    class Half(WindowSum):
        name = "half"

        def combine(self, records):  # type: ignore[no-untyped-def]
            return records

    with pytest.raises(ConfigError, match="needs both combine and process_combined"):
        Half.validate()


def test_the_vectorised_example_in_embedding_md_runs_as_written() -> None:
    """docs/embedding.md's example, through the testing harness: with its vectorised path and with
    ``process_record`` alone, the same windows come out and the same state stays."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "embedding.md").read_text(encoding="utf-8")
    block = re.findall(r"```python\n(.*?)```", text[text.index("### The vectorised path"):], flags=re.S)[0]
    ns: dict[str, Any] = {}
    exec(compile(block, "docs/embedding.md:vectorised", "exec"), ns)
    doc_cls = ns["WindowCount"]
    assert doc_cls.vectorised()

    class PerRecord(doc_cls):  # type: ignore[misc, valid-type]
        combine = Computation.combine
        process_combined = Computation.process_combined

    assert not PerRecord.vectorised()
    rng = random.Random(5)
    testers = [ComputationTester(doc_cls()), ComputationTester(PerRecord())]
    for step in range(40):
        for _ in range(rng.randint(1, 4)):
            value, ts, rid = {"user": f"u{rng.randint(0, 3)}"}, step * 1_000 + rng.randint(0, 3_000), f"r{step}-{_}"
            for t in testers:
                t.add(value, event_time_ms=ts, record_id=rid)
        if step % 5 == 4:
            for t in testers:
                t.advance_watermark(step * 1_000 - 2_000)
    for t in testers:
        t.finish()
    a, b = ([(o.key, o.value) for o in t.output("windows")] for t in testers)
    assert a == b and len(a) >= 8
    assert {k: testers[0].state(k) for k in testers[0].keys()} == {k: testers[1].state(k) for k in testers[1].keys()}


class WindowSumSeen(WindowSumVector):
    """:class:`WindowSumVector` noting each ``process_combined`` call's key and rows."""

    seen: list[tuple[str, list[tuple[Any, ...]]]] = []

    def process_combined(self, ctx, rows):  # type: ignore[no-untyped-def]
        self.seen.append((ctx.key, list(rows)))
        super().process_combined(ctx, rows)


@pytest.mark.parametrize("values", [False, True])
def test_a_keys_late_records_run_per_record_and_its_others_through_combine(spark, tmp_path, values) -> None:  # type: ignore[no-untyped-def]
    """A key whose batch holds a late record (behind the last batch's watermark) and on-time ones:
    the late one runs per record first, the on-time ones through ``combine``; same results as the
    per-record path."""
    rec = lambda rid, key, ts: {"record_id": rid, "key": key, "ts": ts, "n": 2, "bad": False}  # noqa: E731
    batches = [[rec("a1", "hot", 10), rec("a2", "cold", 20)], [rec("b1", "hot", 320)], [rec("c1", "hot", 610)],
               [rec("d1", "hot", 50), rec("d2", "hot", 905), rec("d3", "hot", 910), rec("d4", "cold", 920),
                rec("d5", "gone", 60)]]
    os.makedirs(tmp_path / "a")
    os.makedirs(tmp_path / "b")
    per_record = _run_image(WindowSum(), str(tmp_path / "a"), batches, values)
    WindowSumSeen.seen = []
    vector = _run_image(WindowSumSeen(), str(tmp_path / "b"), batches, values)
    assert [x[:2] for x in per_record] == [y[:2] for y in vector]
    assert [x[2] for x in per_record] == [y[2] for y in vector]
    assert per_record[-1][2]["late"] == 2  # d1 and d5 (behind the watermark 200 of batch 2)
    last = [(k, rows) for k, rows in WindowSumSeen.seen[-2:]]
    # batch 3: "hot" combines its two on-time records (window 900: count 2, sum of n 2 each, 1
    # without values); d1 ran per record (its note among the productions); "gone" has the late
    # record alone: per record
    n = 2 if values else 1
    assert sorted(last) == [("cold", [(900, 1, n)]), ("hot", [(900, 2, 2 * n)])]
    assert {"winsum:d1#1", "winsum:d5#1"} <= {p[0] for p in vector[-1][1]}
