"""The image path's column-wise key loop against ``run_key``, the reference semantics.

Randomised batches (replays of earlier record ids, ids repeated within a batch,
late records, records whose user code raises, event- and processing-time
timers, watermark holds, keys that end empty) run through the image task's
``_run`` on real Parquet images, and through ``run_key`` per key on KeyRows.
After every batch both must hold the same rows (state, timers, hold, record ids
within the dedup horizon), the same productions and the same counts.
"""

from __future__ import annotations

import os
import random
import zlib
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltawheel.executor.computation import Computation, ErrorPolicy, make_record
from deltawheel.executor.tasks.image.spec import ImageSpec
from deltawheel.executor.tasks.image.task import run_intervals
from deltawheel.executor.tasks.input import PREP_DDL
from deltawheel.executor.tasks.usercode.keyrun import run_key
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.rowtable.frames import arrow_schema as _arrow
from deltawheel.statestore.rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX, KeyRow, TimeDomain, rows_file_ddl
from deltawheel.statestore.writepath.image.files import is_ids_path
from deltawheel.statestore.writepath.image.summary import SUMMARY_DDL
from deltawheel.statestore.writepath.streams import stream_schema_ddl

N_IV = 2
SEQ = 5


class Mixed(Computation):
    """Every feature a key's run can touch, chosen by the record's value."""

    name = "mixed"
    inputs = {"events": "k"}
    outputs = ("out",)
    codec = "json"

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        op = record.value["op"]
        st = ctx.state or {}
        if op == "boom":
            ctx.produce("out", {"doomed": record.record_id})  # dropped with the record (dead letter)
            raise ValueError(f"boom {record.record_id}")
        if op == "clear":
            ctx.state = None
            for t in ctx.timers:
                ctx.delete_timer(t.tag, domain=t.domain)
            ctx.hold_watermark(None)
            return
        bucket = record.timestamp_ms // 100 * 100
        st[str(bucket)] = st.get(str(bucket), 0) + 1
        ctx.state = st
        ctx.set_timer(f"b{bucket}", bucket + 99)
        if op == "tick":
            ctx.set_timer("tick", ctx.now_ms + 2, domain=TimeDomain.PROCESSING_TIME)
        if op == "hold":
            ctx.hold_watermark(bucket)
        if op == "emit":
            ctx.produce("out", {"late": record.late, "n": st[str(bucket)]})

    def process_timer(self, ctx, timer):  # type: ignore[no-untyped-def]
        st = dict(ctx.state or {})
        if timer.domain is TimeDomain.PROCESSING_TIME:
            ctx.produce("out", {"tick": timer.time_ms}, key="ticks")
            return
        n = st.pop(timer.tag[1:], 0)
        ctx.produce("out", {"bucket": timer.tag, "n": n}, timestamp_ms=timer.time_ms)
        if n > 2:
            ctx.set_timer(timer.tag + "x", timer.time_ms + 50)  # a timer set while firing
        ctx.state = st or None
        if not st:
            ctx.hold_watermark(None)


class MixedDeadLetter(Mixed):
    name = "mixed_dl"
    error_policy = ErrorPolicy.DEAD_LETTER


class MixedAtLeastOnce(Mixed):
    name = "mixed_alo"
    exactly_once = False


class MixedBatch(Mixed):
    """The same user code through the per-key batch hook (one call per key and batch)."""

    name = "mixed_batch"

    def process_records(self, ctx, records):  # type: ignore[no-untyped-def]
        for r in records:
            Mixed.process_record(self, ctx, r)


class MixedBatchDeadLetter(MixedBatch):
    name = "mixed_batch_dl"
    error_policy = ErrorPolicy.DEAD_LETTER


class MixedNoValue(Mixed):
    """Records without a value (an injector without value columns): what to do follows from the
    record id."""

    name = "mixed_nv"
    no_values = True
    OPS = ("add", "add", "emit", "tick", "hold", "clear")

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        assert record.value is None
        op = self.OPS[zlib.crc32(record.record_id.encode()) % len(self.OPS)]
        Mixed.process_record(self, ctx, record._replace(value={"op": op}))


def _batches(rng: random.Random, n_batches: int, with_boom: bool) -> list[list[dict[str, Any]]]:
    ops = ["add", "add", "add", "emit", "tick", "hold", "clear"] + (["boom"] if with_boom else [])
    out: list[list[dict[str, Any]]] = []
    seq = 0
    for b in range(n_batches):
        batch = []
        for _ in range(rng.randint(0, 40)):
            seq += 1
            batch.append({"record_id": f"r{seq:05d}", "key": f"k{rng.randint(0, 11)}",
                          "ts": b * 300 + rng.randint(-250, 300) - (900 if rng.random() < 0.1 else 0), "op": rng.choice(ops)})
        if out and out[-1] and rng.random() < 0.6:  # a source replaying part of the last batch
            batch += rng.sample(out[-1], min(len(out[-1]), rng.randint(1, 5)))
        if batch and rng.random() < 0.4:  # a record twice within the batch
            batch.append(dict(rng.choice(batch)))
        out.append(batch)
    return out


def _input_table(batch: list[dict[str, Any]], wm_late: int | None, values: bool = True) -> Any:
    import json

    schema = _arrow(PREP_DDL).append(pa.field("interval", pa.int32())).append(pa.field("_m", pa.bool_()))
    rows = [{"record_id": r["record_id"], "key": r["key"], "value": json.dumps({"op": r["op"]}).encode() if values else None,
             "codec": "json", "timestamp_ms": r["ts"], "stream": "events", "position": f"p{r['record_id']}",
             "late": wm_late is not None and r["ts"] < wm_late, "_bad": None,
             "interval": zlib.crc32(r["key"].encode()) % N_IV, "_m": False} for r in batch]
    rows += [{"interval": iv, "_m": True} for iv in range(N_IV)]
    return pa.Table.from_pylist(rows, schema=schema)


def _image_rows(root: str, images: dict[int, tuple[str, ...]], horizon: int | None) -> dict[str, tuple]:
    """Per key: state, timers, hold, record ids within the horizon (its row's and those the
    interval's ids files hold for it), pending productions."""
    out: dict[str, tuple] = {}
    apart: dict[str, list[str]] = {}
    for rels in images.values():
        for r in (r for rel in rels for r in pq.read_table(os.path.join(root, rel)).to_pylist()):
            if r["key"] == FENCE_KEY:
                assert r["sequencer"] == SEQ
                continue
            ids = sorted(i["record_id"] for i in r["record_ids"] if horizon is None or i["seen_ms"] >= horizon)
            if r["key"].startswith(IDS_KEY_PREFIX):
                apart.setdefault(r["key"][len(IDS_KEY_PREFIX):], []).extend(ids)
                continue
            timers = sorted((t["time_ms"], t["tag"], t["domain"]) for t in r["timers"])
            for col, dom in (("next_event_timer_ms", "event_time"), ("next_processing_timer_ms", "processing_time")):
                assert r[col] == min((t[0] for t in timers if t[2] == dom), default=None), (r["key"], col)
            pending = tuple(sorted(p["production_id"] for p in r["pending"] or ()))
            out[r["key"]] = (r["state"], tuple(timers), r["watermark_hold_ms"], tuple(ids), pending)
    for key, ids in apart.items():
        if ids:
            state, timers, hold, inline, pending = out.get(key, (None, (), None, (), ()))
            out[key] = (state, timers, hold, tuple(sorted([*inline, *ids])), pending)
    return out


def _ref_rows(rows: dict[str, KeyRow], horizon: int | None, ran: set[str]) -> dict[str, tuple]:
    """The reference rows as ``_image_rows`` gives them; pending: the productions of this batch's
    run (those of earlier batches were delivered, so the image path clears them)."""
    return {k: (r.state, tuple(sorted((t.time_ms, t.tag, t.domain.value) for t in r.timers)), r.watermark_hold_ms,
                tuple(sorted(s.record_id for s in r.record_ids if horizon is None or s.seen_ms >= horizon)),
                tuple(sorted(p.production_id for p in r.pending)) if k in ran else ())
            for k, r in rows.items()}


@pytest.mark.parametrize("comp_cls,seed", [(Mixed, 1), (Mixed, 2), (MixedDeadLetter, 3), (MixedAtLeastOnce, 4),
                                           (MixedBatch, 5), (MixedBatchDeadLetter, 6), (MixedNoValue, 7)])
def test_image_key_loop_matches_run_key(spark, tmp_path, comp_cls, seed) -> None:  # type: ignore[no-untyped-def]
    comp, checked = _image_loop_against_run_key(tmp_path, comp_cls, seed)
    # the run exercised what it claims to (a seed that stops doing so fails here, not silently)
    assert checked["fired"] > 0 and checked["late"] > 0
    if comp.exactly_once:
        assert checked["duplicates"] > 0 and checked["empty_keys"] > 0
        assert checked["bloom_checked"] > checked["bloom_maybe"] > 0
    if comp.error_policy is ErrorPolicy.DEAD_LETTER:
        assert checked["dead"] > 0


def _image_loop_against_run_key(tmp_path: Any, comp_cls: Any, seed: int) -> tuple[Any, dict[str, int]]:
    """Batches through ``run_intervals`` and through ``run_key``: equal rows, productions and counts
    after each; (the computation, what the run exercised)."""
    comp = comp_cls()
    rng = random.Random(seed)
    root = str(tmp_path)
    rows_schema = _arrow(rows_file_ddl())
    images: dict[int, tuple[str, ...]] = {}
    for iv in range(N_IV):
        fence = pa.Table.from_pylist([{"key": FENCE_KEY, "sequencer": SEQ, "record_ids": [], "timers": [],
                                       "pending": [], "format_version": 1}], schema=rows_schema)
        pq.write_table(fence, os.path.join(root, f"init-{iv}.parquet"))
        images[iv] = (f"init-{iv}.parquet",)
    os.makedirs(os.path.join(root, "out"))
    ref: dict[str, KeyRow] = {}
    acted = None
    checked = {"fired": 0, "duplicates": 0, "dead": 0, "late": 0, "empty_keys": 0, "bloom_checked": 0,
               "bloom_maybe": 0, "bloom_false_pos": 0}
    for b, batch in enumerate(_batches(rng, 14, with_boom=comp.error_policy is ErrorPolicy.DEAD_LETTER)):
        wm = None if b < 2 else b * 300 - 400
        now = 1_000 + b
        horizon = now - 2 if b >= 2 else None  # ids seen in the last three batches are kept
        spec = ImageSpec(comp=comp, rows_root=TableFiles(root), images=dict(images), sequencers={iv: SEQ for iv in range(N_IV)},
                         stream_roots={"out": TableFiles(os.path.join(root, "out"))}, wm=wm, now_ms=now, horizon_ms=horizon,
                         commit_id=f"c{b}", rows_schema=rows_schema, stream_schema=_arrow(stream_schema_ddl()),
                         stream_format_version=1, route_late=False, summary_schema=_arrow(SUMMARY_DDL), strong=True)
        values = not getattr(comp, "no_values", False)
        summaries = [s.to_row() for s in run_intervals(spec, _input_table(batch, acted, values))]
        for s in summaries:  # the interval's files after the driver's commit
            if s.get("interval") is None:
                continue
            files = list(images[s["interval"]])
            if s.get("new_path"):  # a new state image replaces every file but the ids files
                files = [p for p in files if is_ids_path(p)] + [s["new_path"]]
            files = [p for p in files if p not in (s.get("ids_removed") or ())]
            files += [p for p in (s.get("ids_path"), s.get("merged_path")) if p]
            images[s["interval"]] = tuple(files)
        got_prods = sorted((r["record_id"], r["key"], r["value"], r["timestamp_ms"])
                           for s in summaries for f in s["prod_files"]
                           for r in pq.read_table(os.path.join(root, "out", f["path"])).to_pylist())
        # the reference: run_key per key with records or due timers, productions delivered
        by_key: dict[str, list[Any]] = {}
        for r in batch:
            by_key.setdefault(r["key"], []).append(make_record(
                r["key"], {"op": r["op"]} if values else None, r["ts"], r["record_id"], "events", acted is not None and r["ts"] < acted))
        due = {k for k, row in ref.items() if any(
            (t.time_ms < wm if wm is not None else False) if t.domain is TimeDomain.EVENT_TIME else t.time_ms <= now
            for t in row.timers)}
        # the MERGE path also runs the keys holding ids past the horizon (an empty one is deleted);
        # the image path drops those ids (and such a row) when it rewrites the interval
        # (and those with checkpointed productions: the MERGE path clears them, and deletes a row
        # left empty, as the image path drops it)
        due |= {k for k, row in ref.items()
                if row.pending or (horizon is not None and any(s.seen_ms < horizon for s in row.record_ids))}
        ref_prods, counts = [], {"processed": 0, "duplicates": 0, "fired": 0, "late": 0, "dead": 0}
        for key in sorted(set(by_key) | due):
            old = ref.get(key)
            o = run_key(comp, key=key, interval=zlib.crc32(key.encode()) % N_IV,
                        row=None if old is None else old.with_(pending=()),
                        records=by_key.get(key, []), input_watermark_ms=wm, now_ms=now, dedup_horizon_ms=horizon)
            if o.row is None:
                ref.pop(key, None)
            elif o.row.state is None and not o.row.timers and not o.row.pending \
                    and o.row.watermark_hold_ms is None:
                # record ids apart from the state: a key left with nothing but ids has no row (its
                # ids are in the interval's ids files), so its timer counter starts afresh
                ref[key] = o.row.with_(timer_seq=None)
            else:
                ref[key] = o.row
            ref_prods += [(p.production_id, p.key, p.value, p.timestamp_ms) for p in o.productions]
            for c, v in (("processed", o.processed), ("duplicates", o.duplicates), ("fired", o.timers_fired),
                         ("late", o.late), ("dead", len(o.dead_letters))):
                counts[c] += v
        got_counts = {c: sum(s[k] for s in summaries) for c, k in (
            ("processed", "processed"), ("duplicates", "duplicates"), ("fired", "fired"), ("late", "late"),
            ("dead", "n_dead"))}
        assert got_counts == counts, f"batch {b}"
        assert got_prods == sorted(ref_prods), f"batch {b}"
        got = _image_rows(root, images, horizon)
        assert got == _ref_rows(ref, horizon, set(by_key) | due), f"batch {b}"
        if wm is not None:
            acted = wm if acted is None else max(acted, wm)
        for c in ("fired", "duplicates", "dead", "late"):
            checked[c] += counts[c]
        checked["empty_keys"] += sum(1 for v in got.values() if v[0] is None and not v[1])
        for c in ("bloom_checked", "bloom_maybe", "bloom_false_pos"):
            checked[c] += sum(s[c] for s in summaries)
        # every record already seen was a "maybe" of the Bloom filter (no false negatives)
        assert sum(s["bloom_maybe"] - s["bloom_false_pos"] for s in summaries) <= counts["duplicates"]
    return comp, checked


@pytest.mark.parametrize("comp_cls,seed", [(Mixed, 11), (MixedBatch, 12), (MixedDeadLetter, 13)])
def test_a_bloom_filter_answering_maybe_gives_the_exact_results(spark, tmp_path, monkeypatch, comp_cls,
                                                                seed) -> None:  # type: ignore[no-untyped-def]
    """The dedup Bloom filter only decides when the stored ids are looked at: a filter sized so
    that it answers "maybe" for most ids gives the rows, productions and counts of the exact
    path (the run above compares both with ``run_key``, which has no filter)."""
    from deltawheel.executor.tasks.image import dedup

    monkeypatch.setattr(dedup, "BLOOM_ERROR_RATE", 0.9)
    monkeypatch.setattr(dedup, "BLOOM_MIN_CAPACITY", 1)
    dedup._BLOOMS.clear()
    test_image_key_loop_matches_run_key(spark, tmp_path, comp_cls, seed)
    dedup._BLOOMS.clear()


@pytest.mark.parametrize("comp_cls,seed", [(Mixed, 21), (MixedBatch, 22), (MixedDeadLetter, 23)])
def test_a_worker_without_filters_looking_ids_up_gives_the_exact_results(spark, tmp_path, monkeypatch, comp_cls,
                                                                          seed) -> None:  # type: ignore[no-untyped-def]
    """Every batch on a worker that keeps no filter (as a restart's first batch), small against the
    stored ids: no filter is built where ids files exist, the candidates are looked up, and the rows,
    productions and counts are those of ``run_key``."""
    from collections import OrderedDict

    from deltawheel.executor.tasks.image import dedup

    class Forgetful(OrderedDict):  # type: ignore[type-arg]
        """A new process at every batch: no filter kept."""

        def __setitem__(self, key: Any, value: Any) -> None:
            pass

        def move_to_end(self, key: Any, last: bool = True) -> None:
            pass

    built: list[int] = []
    real = dedup.bloom_for
    monkeypatch.setattr(dedup, "_BLOOMS", Forgetful())
    monkeypatch.setattr(dedup, "BLOOM_BUILD_SHARE", 0)  # any batch is small
    monkeypatch.setattr(dedup, "bloom_for", lambda paths, image, apart, batch: (
        built.append(0 if apart is None else apart.num_rows), real(paths, image, apart, batch))[1])
    comp, checked = _image_loop_against_run_key(tmp_path, comp_cls, seed)
    assert checked["duplicates"] > 0  # duplicates found by looking the candidates up
    assert built and not any(built)  # filters built only where no ids file existed yet


def test_the_candidates_lookup_matches_the_full_lookup() -> None:
    """The exact dedup lookup for the few records a Bloom filter flags gives what the lookup of
    every record gives: a record is a duplicate only when its own key's row holds its id (an id
    another key holds is not), whatever the filter's false positives."""
    import numpy as np
    from deltawheel.executor.tasks.image.ids import HeldIds, already_seen
    from deltawheel.executor.tasks.usercode.columns import Input

    rng = random.Random(5)
    held_keys = [f"k{rng.randint(0, 300)}" for _ in range(4_000)]
    held_ids = [f"old{i}" for i in range(4_000)]
    held = pa.table({"key": held_keys, "record_id": held_ids, "seen_ms": pa.array([1] * 4_000, pa.int64())})
    ids = HeldIds(held, held)
    recs = []
    for i in range(300):
        if i % 50 == 0:  # a retry: the id its key's row holds
            j = rng.randrange(4_000)
            recs.append((held_keys[j], held_ids[j]))
        elif i % 50 == 1:  # an id another key's row holds: not a duplicate of this key
            j = rng.randrange(4_000)
            recs.append((held_keys[j] + "x", held_ids[j]))
        else:
            recs.append((f"k{rng.randint(0, 300)}", f"new{i}"))
    n = len(recs)
    table = pa.table({"record_id": [r[1] for r in recs], "key": [r[0] for r in recs],
                      "value": pa.array([None] * n, pa.binary()), "codec": ["json"] * n,
                      "timestamp_ms": pa.array(range(n), pa.int64()), "stream": ["s"] * n,
                      "late": [False] * n})
    inp = Input(table)
    comp = Mixed()
    full = already_seen(comp, inp, ids)
    flags = np.array([rid.startswith("old") or rng.random() < 0.05 for rid in inp.ids])  # + false positives
    assert 8 * int(flags.sum()) < held.num_rows  # the candidates' lookup is the one taken
    fast = already_seen(comp, inp, ids, maybe=flags)
    assert full is not None and fast == full
    assert sum(full) == 6 and all(inp.ids[i].startswith("old") for i, s in enumerate(full) if s)


def test_the_bloom_filters_id_hashes_match_their_reference_on_any_column(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # the interval filters hash ids from the column's buffers; a value's hash must not depend on
    # its neighbours (lengths, chunks, slices, blocks), or a filter built from an image would miss
    # the same id checked from a batch (a duplicate run twice)
    import numpy as np
    from deltawheel.statestore.writepath.image import idhash as ids_mod
    from deltawheel.statestore.writepath.image.idhash import id_hash, id_hashes

    rng = random.Random(7)
    values = ["", "a", "abcdefgh", "abcdefgh\x00", "é∂𝄞", "x" * 40] + [
        "".join(rng.choice("ab0é") for _ in range(rng.randint(0, 30))) for _ in range(300)]
    want = [id_hash(v) for v in values]
    arr = pa.array(values)
    assert id_hashes(arr).tolist() == want
    assert id_hashes(pa.chunked_array([arr.slice(0, 100), arr.slice(100)])).tolist() == want
    assert id_hashes(arr.slice(5, 50)).tolist() == want[5:55]
    assert id_hashes(arr.cast(pa.large_string())).tolist() == want
    assert id_hashes(pa.array(["r1", None, "r2"])).tolist() == [id_hash("r1"), id_hash(""), id_hash("r2")]
    fixed = [f"e{i:010d}" for i in range(2_000)]
    monkeypatch.setattr(ids_mod, "_BLOCK_BYTES", 1)  # blocks of 1,024 rows
    assert id_hashes(pa.array(fixed)).tolist() == [id_hash(v) for v in fixed]
    assert id_hashes(pa.array([])).dtype == np.uint64 and len(id_hashes(pa.array([], pa.string()))) == 0
    distinct = set(values)
    assert len({id_hash(v) for v in distinct}) == len(distinct)  # no collision among these
