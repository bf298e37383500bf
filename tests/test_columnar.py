"""The columnar path (``Computation.process_columns``, state in the ``int64map`` codec) against the
per-record one.

The same randomised batches (replays of earlier record ids, late records, event-time timers
firing windows, keys with due timers only) run through the image task's ``_run`` on real Parquet
images twice: with a per-record windowed count, and with the same computation declaring the
columnar path. After every batch both hold the same rows (state blobs, timers, timer counters,
pending productions) and record ids, made the same productions (ids included) and counts. A store
written by one path continues under the other; the docs' example runs as written.
"""

from __future__ import annotations

import os
import random
import re
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltawheel.executor.computation import ColumnBatch, ColumnResult
from deltawheel.executor.exceptions import UserCodeError
from deltawheel.executor.tasks.image.spec import ImageSpec
from deltawheel.executor.tasks.image.task import run_task
from deltawheel.executor.tasks.input import PREP_DDL
from deltawheel.executor.testkit import ComputationTester
from deltawheel.statestore.codecs import INT64MAP_HEADER, get_codec, int64map_blobs, int64map_columns
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import CodecError, ConfigError
from deltawheel.statestore.rowtable.frames import arrow_schema as _arrow
from deltawheel.statestore.rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX, make_production, rows_file_ddl
from deltawheel.statestore.writepath.image.files import (
    is_ids_path,
    production_table,
    write_production_files,
    write_production_table,
)
from deltawheel.statestore.writepath.image.summary import SUMMARY_DDL
from deltawheel.statestore.writepath.streams import stream_schema_ddl
from image_fences import fence_images

from deltawheel import Computation

N_IV = 2
SEQ = 5
WIN = 100
LATE = 10**12  # a late record of window w is counted under w + LATE


class WindowCount(Computation):
    """Per key and window of 100 ms a count, emitted when the watermark passes the window; a late
    record is counted under ``window + LATE`` (no timer) and produces a note."""

    name = "wincount"
    inputs = {"events": "k"}
    outputs = ("out",)
    codec = "int64map"

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        start = record.timestamp_ms - record.timestamp_ms % WIN
        st = ctx.state or {}
        if record.late:
            st[start + LATE] = st.get(start + LATE, 0) + 1
            ctx.state = st
            ctx.produce("out", ["late", record.record_id])
            return
        cur = st.get(start)
        st[start] = 1 if cur is None else cur + 1
        ctx.state = st
        if cur is None:
            ctx.set_timer(str(start), start + WIN - 1)

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        st = dict(ctx.state or {})
        start = int(timer.tag)
        ctx.produce("out", [ctx.key, start, st.pop(start, 0)], timestamp_ms=start)
        ctx.state = st or None


class WindowCountColumns(WindowCount):
    """The same computation (same name: the same production ids), declaring the columnar path."""

    calls: dict[str, int] = {"calls": 0, "keys": 0}  # the test's witness that the path ran

    def process_columns(self, batch: ColumnBatch) -> ColumnResult:
        self.calls["calls"] += 1
        self.calls["keys"] += len(batch.keys)
        ts = batch.records.column("timestamp_ms").to_numpy()
        new = pa.table({"key": batch.records.column("key"), "map_key": ts - ts % WIN})
        new = new.group_by(["key", "map_key"], use_threads=False).aggregate([([], "count_all")])
        new = pa.table({"key": new.column("key"), "map_key": new.column("map_key"),
                        "map_value": new.column("count_all").cast(pa.int64())})
        st = pa.concat_tables([batch.state, new]).group_by(["key", "map_key"], use_threads=False) \
            .aggregate([("map_value", "sum")])
        st = pa.table({"key": st.column("key"), "map_key": st.column("map_key"), "map_value": st.column("map_value_sum")})
        window = pc.less(st.column("map_key"), LATE // 2)  # late counts (+LATE) have no timer
        ends = pc.add(st.column("map_key"), WIN - 1)
        wm = batch.watermark_ms
        due = pc.and_(window, pc.less(ends, wm)) if wm is not None else pa.repeat(pa.scalar(False), st.num_rows)
        timers = pa.table({"key": st.column("key"), "tag": pc.cast(st.column("map_key"), pa.string()), "time_ms": ends})
        fired = timers.filter(due).sort_by([("key", "ascending"), ("time_ms", "ascending")])
        gone = st.filter(due).sort_by([("key", "ascending"), ("map_key", "ascending")])
        prods = pa.table({"fired": pa.array(range(fired.num_rows), pa.int64()),
                          "stream": pa.repeat(pa.scalar("out"), fired.num_rows),
                          "value": pa.array([get_codec("int64map").encode([k, s, c]) for k, s, c in zip(
                              gone.column("key").to_pylist(), gone.column("map_key").to_pylist(),
                              gone.column("map_value").to_pylist(), strict=True)], pa.binary()),
                          "timestamp_ms": gone.column("map_key")})
        keep = pc.invert(due)
        return ColumnResult(state=st.filter(keep), timers=timers.filter(pc.and_(keep, window)), fired=fired,
                            productions=prods)


def _batches(rng: random.Random, n_batches: int) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    seq = 0
    for b in range(n_batches):
        batch = []
        for _ in range(rng.randint(0, 60)):
            seq += 1
            batch.append({"record_id": f"r{seq:05d}", "key": f"k{rng.randint(0, 14)}",
                          "ts": b * 300 + rng.randint(-250, 300) - (900 if rng.random() < 0.05 else 0)})
        if out and out[-1] and rng.random() < 0.6:  # a source replaying part of the last batch
            batch += rng.sample(out[-1], min(len(out[-1]), rng.randint(1, 5)))
        out.append(batch)
    return out


def _input_table(batch: list[dict[str, Any]], wm_late: int | None) -> Any:
    schema = _arrow(PREP_DDL).append(pa.field("interval", pa.int32())).append(pa.field("_m", pa.bool_()))
    rows = [{"record_id": r["record_id"], "key": r["key"], "value": None, "codec": "json", "timestamp_ms": r["ts"],
             "stream": "events", "position": f"p{r['record_id']}", "late": wm_late is not None and r["ts"] < wm_late,
             "_bad": None, "interval": zlib.crc32(r["key"].encode()) % N_IV, "_m": False} for r in batch]
    rows += [{"interval": iv, "_m": True} for iv in range(N_IV)]
    return pa.Table.from_pylist(rows, schema=schema)


def _image_rows(root: str, images: dict[int, tuple[str, ...]]) -> dict[str, tuple[Any, ...]]:
    out = {}
    for paths in images.values():
        for rel in paths:
            for r in pq.read_table(os.path.join(root, rel)).to_pylist():
                if r["key"] == FENCE_KEY or r["key"].startswith(IDS_KEY_PREFIX) or "record_ids" not in r:
                    continue
                out[r["key"]] = (r["state"], r["codec"],
                                 tuple((t["time_ms"], t["tag"], t["domain"]) for t in r["timers"]),
                                 r["next_event_timer_ms"], r["next_processing_timer_ms"], r["watermark_hold_ms"],
                                 r["timer_seq"], tuple(sorted(i["record_id"] for i in r["record_ids"] or ())),
                                 tuple(sorted(p["production_id"] for p in r["pending"] or ())))
    return out


def _ids(root: str, images: dict[int, tuple[str, ...]]) -> list[tuple[str, str]]:
    """The (key, record id) pairs the interval images' ids files hold, sorted."""
    return sorted((r["key"][len(IDS_KEY_PREFIX):], i["record_id"]) for paths in images.values() for rel in paths
                  if is_ids_path(rel) for r in pq.read_table(os.path.join(root, rel)).to_pylist()
                  for i in r["record_ids"])


def _committed(images: dict[int, tuple[str, ...]], s: dict[str, Any]) -> tuple[str, ...]:
    """Interval ``s["interval"]``'s files after the driver commits its summary ``s``: a new image
    replaces every file but the ids files; the ids files it drops go, its new ones come."""
    files = [p for p in images[s["interval"]] if not s.get("new_path") or is_ids_path(p)]
    files = [p for p in files if p not in (s["ids_removed"] or ())]
    return (*files, *(p for p in (s.get("new_path"), s.get("ids_path"), s.get("merged_path")) if p))


def _run_image(comps: list[Computation], root: str, batches: list[list[dict[str, Any]]],
               scale: int = 1, strong: bool = True) -> list[tuple[Any, ...]]:
    """Batch ``b`` through the image task with ``comps[b]``; per batch (rows, productions, counts,
    the ids files' ids). ``scale``: event times are so many times longer than the 100 ms windows'
    (the watermarks too)."""
    rows_schema = _arrow(rows_file_ddl())
    images = fence_images(root, N_IV, SEQ)
    os.makedirs(os.path.join(root, "out"))
    acted = None
    got = []
    for b, batch in enumerate(batches):
        wm = None if b < 2 else (b * 300 - 400) * scale
        now = 1_000 + b
        spec = ImageSpec(comp=comps[b], rows_root=TableFiles(root), images=dict(images),
                         sequencers={iv: SEQ for iv in range(N_IV)},
                         stream_roots={s: TableFiles(os.path.join(root, "out")) for s in comps[b].outputs},
                         wm=wm, now_ms=now,
                         horizon_ms=now - 3 if b >= 3 else None, commit_id=f"c{b}", rows_schema=rows_schema,
                         stream_schema=_arrow(stream_schema_ddl()), stream_format_version=1, route_late=False,
                         summary_schema=_arrow(SUMMARY_DDL), strong=strong)
        summaries = [s.to_row() for s in run_task(spec, _input_table(batch, acted))]
        for s in summaries:
            if s.get("interval") is not None:
                images[s["interval"]] = _committed(images, s)
        prods = sorted((r["record_id"], r["key"], r["value"], r["timestamp_ms"], r["codec"])
                       for s in summaries for f in s["prod_files"]
                       for r in pq.read_table(os.path.join(root, "out", f["path"])).to_pylist())
        counts = {c: sum(s[c] for s in summaries) for c in ("processed", "duplicates", "fired", "late", "n_dead",
                                                            "n_prods", "keys_written")}
        got.append((_image_rows(root, images), prods, counts, _ids(root, images)))
        if wm is not None:
            acted = wm if acted is None else max(acted, wm)
    return got


def _same(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> None:
    for n, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x[0] == y[0], f"batch {n}: rows"
        assert x[1] == y[1], f"batch {n}: productions"
        assert x[2] == y[2], f"batch {n}: counts"
        assert x[3] == y[3], f"batch {n}: record ids"


@pytest.mark.parametrize("seed,strong", [(1, True), (2, True), (3, False)])
def test_the_columnar_path_gives_the_per_record_results(spark, tmp_path, seed, strong) -> None:  # type: ignore[no-untyped-def]
    """``strong``: productions checkpointed in the rows (else only written to the stream's files)."""
    batches = _batches(random.Random(seed), 16)
    per_record = _run_image([WindowCount()] * len(batches), str(_mk(tmp_path / "a")), batches, strong=strong)
    WindowCountColumns.calls.update(calls=0, keys=0)
    columnar = _run_image([WindowCountColumns()] * len(batches), str(_mk(tmp_path / "b")), batches, strong=strong)
    # one call per interval and batch (not per key), most keys through it
    assert 0 < WindowCountColumns.calls["calls"] <= N_IV * len(batches)
    assert WindowCountColumns.calls["keys"] > 3 * WindowCountColumns.calls["calls"]
    _same(per_record, columnar)
    totals = {c: sum(r[2][c] for r in per_record) for c in ("processed", "duplicates", "fired", "late")}
    # the run exercised what it claims to: windows fired, replays and late records
    assert totals["fired"] > 10 and totals["duplicates"] > 0 and totals["late"] > 0
    assert any(r[6] for r in per_record[-1][0].values())  # timer counters stored
    assert {r[1] for r in columnar[-1][0].values()} == {"int64map"}


def test_a_store_written_by_one_path_continues_under_the_other(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    batches = _batches(random.Random(11), 14)
    n = len(batches)
    per_record = _run_image([WindowCount()] * n, str(_mk(tmp_path / "a")), batches)
    mixed = [WindowCount() if b % 4 < 2 else WindowCountColumns() for b in range(n)]  # switch back and forth
    _same(per_record, _run_image(mixed, str(_mk(tmp_path / "b")), batches))


def test_a_keys_late_records_run_per_record_before_the_call(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Keys whose batch holds late records (behind the last batch's watermark) before on-time ones,
    among them a new key whose first record is late (its timer counter is seeded from that one):
    the same rows, productions and counts as the per-record path, and the keys still go through
    the call."""
    rec = lambda rid, key, ts: {"record_id": rid, "key": key, "ts": ts}  # noqa: E731
    batches = [[rec("a1", "hot", 10), rec("a2", "cold", 20)], [rec("b1", "hot", 320)], [rec("c1", "hot", 610)],
               [rec("d1", "hot", 50), rec("d2", "hot", 905), rec("d3", "hot", 910), rec("d4", "cold", 920),
                rec("d5", "new", 60), rec("d6", "new", 930)], [rec("e1", "hot", 1210)], [rec("f1", "cold", 1500)]]
    per_record = _run_image([WindowCount()] * len(batches), str(_mk(tmp_path / "a")), batches)
    WindowCountColumns.calls.update(calls=0, keys=0)
    columnar = _run_image([WindowCountColumns()] * len(batches), str(_mk(tmp_path / "b")), batches)
    _same(per_record, columnar)
    assert per_record[3][2]["late"] == 2  # d1 and d5 (behind the watermark 200 of batch 2)
    fired_new = [p for p in columnar[-1][1] if p[1] == "new"]
    assert len(fired_new) == 1 and fired_new[0][0].startswith("timer:wincount:new:event_time:900:999:")
    assert {"wincount:d1#1", "wincount:d5#1"} <= {p[0] for p in columnar[3][1]}
    assert WindowCountColumns.calls["keys"] >= 9  # hot, cold and new went through the call


def test_state_in_another_codec_runs_per_record(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Rows an older msgpack computation wrote (not packed pairs) go through the per-record path."""

    class Msgpack(WindowCount):
        codec = "msgpack"

    batches = _batches(random.Random(4), 8)
    n = len(batches)
    WindowCountColumns.calls.update(calls=0, keys=0)
    a = _run_image([Msgpack()] * 4 + [WindowCount()] * (n - 4), str(_mk(tmp_path / "a")), batches)
    b = _run_image([Msgpack()] * 4 + [WindowCountColumns()] * (n - 4), str(_mk(tmp_path / "b")), batches)
    _same(a, b)


def test_the_int64map_codec_packs_int_dicts_and_reads_them_as_columns() -> None:
    c = get_codec("int64map")
    blob = c.encode({30: 1, -10: 2})
    assert blob[:8] == INT64MAP_HEADER and len(blob) == 8 + 2 * 16
    assert c.decode(blob) == {-10: 2, 30: 1}
    assert c.decode(c.encode(["k", 1, {"a": 1}])) == ["k", 1, {"a": 1}]  # anything else: msgpack
    assert c.decode(c.encode({})) == {} and c.decode(c.encode({1: 2.5})) == {1: 2.5}
    arr = pa.array([c.encode({5: 6, 1: 2}), None, c.encode({7: 8})], pa.binary())
    rows, keys, values = int64map_columns(arr)  # type: ignore[misc]
    assert (rows.tolist(), keys.tolist(), values.tolist()) == ([0, 0, 2], [1, 5, 7], [2, 6, 8])
    assert int64map_blobs(rows, keys, values, 3).to_pylist() == arr.to_pylist()
    assert int64map_columns(pa.array([get_codec("msgpack").encode({1: 2})], pa.binary())) is None
    with pytest.raises(CodecError, match="packed pairs need 8 \\+ 16n bytes"):
        c.decode(INT64MAP_HEADER + b"\x00" * 8)


def test_the_production_table_writes_the_files_the_per_record_writer_writes(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # the columnar path's productions never become tuples: its writer must give the same files,
    # row for row and column for column, as the per-record path's for the same productions
    prods = [make_production(f"timer:c:k{i % 3}:e:{i}:1#1", "b" if i % 4 else "a", f"k{i % 3}", bytes([i]), 1000 - i,
                             "msgpack") for i in range(9)]
    schema = _arrow(stream_schema_ddl())
    roots = {s: TableFiles(str(tmp_path / s)) for s in ("a", "b")}
    common = {"producer": "c", "commit_id": "c7", "iv": 1, "roots": roots, "schema": schema, "format_version": 2}
    want = write_production_files(prods, **common)
    got = write_production_table(production_table(prods), **common)
    assert [(f.stream, f.num_rows, f.min_ts) for f in got] == [(f.stream, f.num_rows, f.min_ts) for f in want] \
        == [("a", 3, 992), ("b", 6, 993)]
    for g, w in zip(got, want, strict=True):
        assert g.path != w.path and g.path.endswith("-dw-c-1.snappy.parquet")
        assert pq.read_table(tmp_path / g.stream / g.path).equals(pq.read_table(tmp_path / w.stream / w.path))
    assert write_production_table(production_table([]), **common) == []


def test_a_columnar_computation_needs_the_int64map_codec() -> None:
    class Json(WindowCountColumns):
        name = "jsoncols"
        codec = "json"

    with pytest.raises(ConfigError, match="reads and writes state with the int64map codec.*codec='json'"):
        Json.validate()
    WindowCountColumns.validate()


class BadResult(WindowCountColumns):
    def process_columns(self, batch):  # type: ignore[no-untyped-def]
        return ColumnResult(state=batch.state, timers=batch.timers.drop_columns(["tag"]), fired=batch.timers,
                            productions=pa.table({}))


def test_a_result_without_a_column_fails_naming_it(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    batches = [[{"record_id": "r1", "key": "k1", "ts": 10}]]
    with pytest.raises(UserCodeError, match="ColumnResult.timers must be a pyarrow.Table with the columns"):
        _run_image([BadResult()], str(_mk(tmp_path / "a")), batches)


class BadProductions(WindowCountColumns):
    """Productions naming a fired row that is not there, or a stream that is not an output."""

    fired_row = 0
    stream = "out"

    def process_columns(self, batch):  # type: ignore[no-untyped-def]
        key = batch.keys[0].as_py()
        fired = pa.table({"key": [key], "tag": ["x"], "time_ms": pa.array([0], pa.int64())})
        prods = pa.table({"fired": pa.array([self.fired_row], pa.int64()), "stream": [self.stream],
                          "value": pa.array([b"\x01"], pa.binary())})
        return ColumnResult(state=batch.state, timers=batch.timers, fired=fired, productions=prods)


@pytest.mark.parametrize("fired_row,stream,match", [
    (3, "out", "ColumnResult.productions.fired must name rows of ColumnResult.fired \\(0..0\\)"),
    (0, "nope", "a production to 'nope', which is not among the outputs \\['out'\\]")])
def test_a_production_naming_no_fired_row_or_an_unknown_stream_fails(spark, tmp_path, fired_row, stream,  # type: ignore[no-untyped-def]
                                                                     match) -> None:
    comp = BadProductions()
    comp.fired_row, comp.stream = fired_row, stream
    with pytest.raises(UserCodeError, match=match):
        _run_image([comp], str(_mk(tmp_path / "a")), [[{"record_id": "r1", "key": "k1", "ts": 10}]])


def test_the_columnar_example_in_embedding_md_runs_as_written(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """docs/embedding.md's example: with its columnar path and with ``process_record`` alone, the
    image task gives the same rows and productions; the testing harness runs it per record."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "embedding.md").read_text(encoding="utf-8")
    block = re.findall(r"```python\n(.*?)```", text[text.index("### The columnar path"):], flags=re.S)[0]
    ns: dict[str, Any] = {}
    exec(compile(block, "docs/embedding.md:columnar", "exec"), ns)
    doc_cls = ns["ClickCount"]
    assert doc_cls.columnar()
    doc_cls.validate()

    class PerRecord(doc_cls):  # type: ignore[misc, valid-type]
        process_columns = Computation.process_columns

    assert not PerRecord.columnar()
    scale = ns["WIN"] // WIN
    batches = [[{"record_id": f"r{b}-{i}", "key": f"u{(b * 7 + i) % 5}", "ts": (b * 300 + i * 23) * scale}
                for i in range(12)] for b in range(10)]
    doc_cls.inputs = PerRecord.inputs = {"events": "k"}
    a = _run_image([PerRecord()] * len(batches), str(_mk(tmp_path / "a")), batches, scale)
    b = _run_image([doc_cls()] * len(batches), str(_mk(tmp_path / "b")), batches, scale)
    _same(a, b)
    assert sum(r[2]["n_prods"] for r in a) > 5
    t = ComputationTester(doc_cls())
    t.add({"k": "u1"}, event_time_ms=5)
    t.advance_watermark(100_000)
    t.finish()
    assert [o.value for o in t.output(doc_cls.outputs[0])] == [["u1", 0, 1]]


def test_the_msgpack_rows_example_in_embedding_md_holds() -> None:
    """docs/embedding.md's ``msgpack_rows`` example (a doctest block in the columnar section)."""
    import doctest

    text = (Path(__file__).resolve().parents[1] / "docs" / "embedding.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text[text.index("### The columnar path"):], flags=re.S)
              if b.startswith(">>>") and "msgpack_rows" in b]
    assert len(blocks) == 1
    test = doctest.DocTestParser().get_doctest(blocks[0], {}, "embedding.md:msgpack_rows", None, 0)
    result = doctest.DocTestRunner().run(test)
    assert result.attempted >= 3 and result.failed == 0


def test_captured_tasks_run_again_with_the_bench_tasks_command(spark, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """``DELTAWHEEL_TASK_CAPTURE=DIR`` leaves each image task in DIR; ``deltawheel bench tasks
    --captured DIR`` runs them again in one process: the same counts per task, CPU seconds."""
    import json

    from deltawheel.cli import main

    batches = _batches(random.Random(6), 6)
    monkeypatch.setenv("DELTAWHEEL_TASK_CAPTURE", str(tmp_path / "cap"))
    got = _run_image([WindowCountColumns()] * len(batches), str(_mk(tmp_path / "a")), batches)
    monkeypatch.delenv("DELTAWHEEL_TASK_CAPTURE")
    assert len(os.listdir(tmp_path / "cap")) == len(batches)
    assert main(["bench", "tasks", "--captured", str(tmp_path / "cap"), "--json", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert [t["processed"] for t in report["tasks"]] == [c["processed"] for _, _, c, _ids in got]
    assert [t["fired"] for t in report["tasks"]] == [c["fired"] for _, _, c, _ids in got]
    assert sum(c["fired"] for _, _, c, _ids in got) > 0 and report["total_cpu_s"] > 0
    assert f"{len(batches)} tasks (captured): " in capsys.readouterr().out
    # run again: each task finds its Bloom filters as the run did (a task adds its batch's ids to
    # the filter it found: without them put back, a second round would find every id "maybe seen")
    assert main(["bench", "tasks", "--captured", str(tmp_path / "cap"), "--repeat", "2",
                 "--json", str(tmp_path / "r2.json")]) == 0
    again = json.loads((tmp_path / "r2.json").read_text())
    assert [t["bloom_maybe"] for t in again["tasks"]] == [t["bloom_maybe"] for t in report["tasks"]]
    assert [t["processed"] for t in again["tasks"]] == [t["processed"] for t in report["tasks"]]
    assert sum(t["records"] for t in report["tasks"]) > 2 * sum(t["bloom_maybe"] for t in report["tasks"])


def _mk(p: Path) -> Path:
    os.makedirs(p)
    return p


def test_the_benchmarks_columnar_values_are_the_per_record_engines_bytes(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The benchmark's columnar window count produces its values with ``msgpack_rows`` (no Python
    per window): the stream's rows hold the bytes the per-record window count's msgpack codec gives."""
    from deltawheel.benchmarks.engine_deltawheel import WIN as BENCH_WIN
    from deltawheel.benchmarks.engine_deltawheel import window_count

    scale = BENCH_WIN // WIN
    batches = [[{**r, "ts": r["ts"] * scale} for r in b] for b in _batches(random.Random(21), 12)]
    a = _run_image([window_count(N_IV)] * len(batches), str(_mk(tmp_path / "a")), batches, scale)
    b = _run_image([window_count(N_IV, columnar=True)] * len(batches), str(_mk(tmp_path / "b")), batches, scale)
    per_record = [p[:4] for r in a for p in r[1]]  # (record id, key, value, timestamp): not the codec's name
    columnar = [p[:4] for r in b for p in r[1]]
    assert {p[4] for r in a for p in r[1]} == {"msgpack"} and {p[4] for r in b for p in r[1]} == {"int64map"}
    assert len(per_record) > 10 and columnar == per_record
    values = [get_codec("msgpack").decode(p[2]) for p in columnar]
    assert all(v[0] == p[1] and v[1] == p[3] and v[1] % BENCH_WIN == 0 and v[2] > 0
               for v, p in zip(values, columnar, strict=True))


def _rows_computation() -> Any:
    """:class:`WinCountRows`, a class of a function's: Spark's Python workers take it by value (a
    module-level class of this file would be imported there, with this file's imports)."""
    from executor_util import columnar_window_count  # by value too (executor_util registers itself so)

    class WinCountRows(Computation):
        """A user's columnar computation producing its values with ``msgpack_rows``: per key and 10-s
        window ``[key, start, count, end]`` (end as a float: a float column too), leaving a file per
        ``process_columns`` call in ``witness`` (the tasks run in Spark's Python workers)."""

        name = "wincount_rows"
        inputs = {"events": "@key"}
        outputs = ("counts",)
        num_intervals = 2
        codec = "int64map"
        witness = ""

        def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
            start = record.timestamp_ms - record.timestamp_ms % 10_000
            st = ctx.state or {}
            if start not in st:
                ctx.set_timer(str(start), start + 9_999)
            st[start] = st.get(start, 0) + 1
            ctx.state = st

        def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
            st = dict(ctx.state)
            start = int(timer.tag)
            ctx.produce("counts", [ctx.key, start, st.pop(start), float(timer.time_ms)], timestamp_ms=start)
            ctx.state = st or None

        def process_columns(self, batch: ColumnBatch) -> ColumnResult:
            import uuid

            from deltawheel.statestore.codecs import msgpack_rows

            Path(self.witness, uuid.uuid4().hex).touch()
            st, timers, due, fired, done = columnar_window_count(batch, 10_000)
            values = msgpack_rows(done.column("key"), done.column("map_key"), done.column("map_value"),
                                  pc.cast(fired.column("time_ms"), pa.float64()))
            prods = pa.table({"fired": pa.array(range(fired.num_rows), pa.int64()),
                              "stream": pa.repeat(pa.scalar("counts"), fired.num_rows),
                              "value": values, "timestamp_ms": done.column("map_key")})
            keep = pc.invert(due)
            return ColumnResult(state=st.filter(keep), timers=timers.filter(keep), fired=fired, productions=prods)

    return WinCountRows


@pytest.mark.zk
@pytest.mark.timeout(600)
def test_a_columnar_job_producing_with_msgpack_rows_writes_values_that_decode(  # type: ignore[no-untyped-def]
        spark, zk_config, tmp_path, migrated_at) -> None:
    """A job on the columnar path whose values come from ``msgpack_rows``: the stream's rows decode
    (with the computation's codec, as any reader does) to each window's key, start, count and end."""
    import uuid

    from restart_job import injector, write_files
    from test_columnar_restart import reference

    import deltawheel

    folder = tmp_path / "input"
    write_files(folder, 6)
    comp = _rows_computation()()
    comp.witness = str(_mk(tmp_path / "calls"))
    store = migrated_at(tmp_path / "store").root  # a migrated copy: connect migrating a new store runs in test_connect.py
    with deltawheel.connect(spark, store=store, zk=zk_config.hosts, zk_chroot=zk_config.chroot,
                            pipeline=f"rows_{uuid.uuid4().hex[:6]}") as engine:
        engine.progress = False
        reports = engine.run(injector(str(folder), columnar=True), comp)
        assert sum(r.processed for r in reports) > 0
        rows = spark.read.format("delta").load(engine.layout.stream("counts")).collect()
    assert os.listdir(tmp_path / "calls")  # the columnar path ran
    ref = reference(folder)
    got = [(r["key"], r["timestamp_ms"], r["codec"], get_codec(r["codec"]).decode(r["value"])) for r in rows]
    assert len(got) >= 3 * 8  # windows of several files fired, every key's
    for key, ts, codec, value in got:
        assert codec == "int64map"
        assert value == [key, ts, ref[(key, ts)], float(ts + 9_999)]
        assert isinstance(value[3], float) and isinstance(value[2], int)
    assert len({(k, ts) for k, ts, _, _ in got}) == len(got)  # each window once
