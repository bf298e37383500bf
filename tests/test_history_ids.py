"""``n_record_ids`` of ``state_history`` and ``deltawheel history`` on the image write path (the
default one), where a key's dedup ids live in its interval's ids files, not in its row: each
change counts the ids the store held for the key at that version (what the ``state`` view counts),
across a compaction of the ids files, a redelivered record, a key whose state went while its ids
stay, and ids files dropped past the dedup horizon."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltawheel.executor.computation import Computation
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.delta.log import latest_local_version
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.inspection.history import key_history, walk_history
from deltawheel.statestore.writepath.image.files import ids_level, is_ids_path
from deltawheel.statestore.writepath.streams import stream_schema_ddl
from pyspark import cloudpickle

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk]

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers cannot import test modules

J = get_codec("json")
T0 = 1_700_000_000_000
EXPIRE = 9  # the clock moves past the dedup horizon (10 minutes) before this batch
# (record id, key, reset) per batch; b's r1-1 comes again in batch 5 (a duplicate: no new id);
# c is reset in batch 6: its row goes, its ids stay for the dedup
BATCHES: list[list[tuple[str, str, bool]]] = [
    [("r0-0", "a", False), ("r0-1", "b", False), ("r0-2", "c", False)],
    [("r1-0", "a", False), ("r1-1", "b", False)],
    [("r2-0", "a", False), ("r2-1", "c", False)],
    [("r3-0", "b", False)],
    [("r4-0", "a", False), ("r4-1", "b", False), ("r4-2", "c", False)],
    [("r5-0", "a", False), ("r1-1", "b", False)],
    [("r6-0", "c", True), ("r6-1", "a", False)],
    [("r7-0", "b", False), ("r7-1", "a", False)],
    [("r8-0", "a", False), ("r8-1", "b", False)],
    [("r9-0", "a", False), ("r9-1", "c", False)],
]


class Tally(Computation):
    """Counts each key's records, exactly once, in one interval (so that its ids files compact);
    a reset record empties the key."""

    name = "tally"
    inputs = {"events": "q"}
    outputs = ()
    num_intervals = 1

    def process_record(self, ctx, record):  # type: ignore[no-untyped-def]
        ctx.state = None if record.value["reset"] else (ctx.state or 0) + 1


def _frame(spark: Any, b: int) -> Any:
    rows = [{"record_id": rid, "key": "", "value": J.encode({"q": k, "reset": reset}), "codec": "json",
             "timestamp_ms": 1_000 * (10 * b + i), "event_time": None, "producer": "test", "commit_id": f"pos-{rid}",
             "format_version": 1} for i, (rid, k, reset) in enumerate(BATCHES[b])]
    return spark.createDataFrame(rows, schema=stream_schema_ddl().replace(" NOT NULL", ""))


def expected_ids() -> list[dict[str, int]]:
    """After each batch: key -> the distinct record ids the store holds for it, folded here."""
    held: dict[str, set[str]] = {}
    out = []
    for b, batch in enumerate(BATCHES):
        if b == EXPIRE:  # every earlier ids file left the horizon: dropped whole by this batch
            held = {}
        for rid, k, _reset in batch:
            held.setdefault(k, set()).add(rid)
        out.append({k: len(v) for k, v in held.items()})
    return out


@pytest.fixture(scope="module")
def ran(spark, zk_server, tmp_path_factory, migrated_template) -> tuple[Any, list[int]]:  # type: ignore[no-untyped-def]
    from conftest import copy_migrated_store
    from deltawheel.statestore.clock import ManualClock
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout
    from executor_util import start_executor, stop_executor

    layout = StoreLayout(str(tmp_path_factory.mktemp("hist-ids") / "store"))
    copy_migrated_store(migrated_template, Path(layout.root))
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/t-{uuid.uuid4().hex[:12]}", session_timeout_s=6.0)
    clock = ManualClock(T0)
    ex, client = start_executor(spark, layout, zk, Tally(), clock=clock)  # the default write path
    after = []
    try:
        for b in range(len(BATCHES)):
            clock.advance(11 * 60_000 if b == EXPIRE else 1_000)
            got = ex.run_batch(_frame(spark, b), b, input_watermark_ms=None)
            assert got.duplicates == (1 if b == 5 else 0)
            v = latest_local_version(layout.rows_of("tally"))
            assert v is not None
            after.append(v)
    finally:
        stop_executor(ex, client)
    return layout, after


def _batch_of(version: int, after: list[int]) -> int:
    return next(b for b, v in enumerate(after) if version <= v)


def _sql(capsys: Any, *argv: str) -> list[list[dict[str, Any]]]:
    """``deltawheel sql --format json`` as a user runs it: each query's rows."""
    rc = main(["sql", "--format", "json", *argv])
    out, err = capsys.readouterr()
    assert rc == 0, err
    # one statement: its rows; several: each line says which statement it answers
    lines = [json.loads(line) for line in out.splitlines()]
    if not lines or set(lines[0]) != {"query", "row"}:
        return [lines]
    found: dict[int, list[dict[str, Any]]] = {}
    for line in lines:
        found.setdefault(line["query"], []).append(line["row"])
    return [found[n] for n in sorted(found)]


@pytest.mark.timeout(900)
def test_state_history_counts_the_ids_each_key_held_at_each_version(ran, capsys) -> None:  # type: ignore[no-untyped-def]
    layout, after = ran
    want = expected_ids()
    [got] = _sql(capsys, "--store", layout.root, "SELECT key, version, change, n_record_ids FROM state_history "
                 "WHERE computation = 'tally' ORDER BY key, version")
    assert {g["key"] for g in got} == {"a", "b", "c"}
    for g in got:
        b = _batch_of(g["version"], after)
        assert g["n_record_ids"] == want[b][g["key"]], (g, b)
    # c's reset: its row went while the dedup still holds its 4 ids (the reset record's among them)
    assert [(g["change"], g["n_record_ids"]) for g in got if g["key"] == "c"] == [
        ("insert", 1), ("update", 2), ("update", 3), ("delete", 4), ("insert", 1)]
    # the counts held across the compaction of batches 0-6's ids files into one of level 1
    adds = [json.loads(line)["add"]["path"] for v in range(after[8] + 1)
            for line in Path(layout.rows_of("tally"), "_delta_log", f"{v:020d}.json").read_text().splitlines() if '"add"' in line]
    assert any(is_ids_path(p) and ids_level(p) >= 1 for p in adds)
    assert [g["n_record_ids"] for g in got if g["key"] == "a"] == [1, 2, 3, 4, 5, 6, 7, 8, 1]
    # the Python reader says the same, for every key and for one
    files = TableFiles(layout.rows_of("tally"))
    every = sorted((c.key, c.commit.version, c.n_record_ids) for c in walk_history(files, computation="tally"))
    assert every == [(g["key"], g["version"], g["n_record_ids"]) for g in got]
    assert [(c.commit.version, c.n_record_ids) for c in key_history(files, computation="tally", key="b").changes] == \
        [(g["version"], g["n_record_ids"]) for g in reversed(got) if g["key"] == "b"]


@pytest.mark.timeout(900)
def test_the_newest_change_counts_what_the_state_view_counts(ran, capsys) -> None:  # type: ignore[no-untyped-def]
    layout, after = ran
    newest = ("SELECT key, h FROM (SELECT key, n_record_ids AS h, row_number() OVER (PARTITION BY key ORDER BY "
              "version DESC) AS n FROM state_history WHERE computation = 'tally') WHERE n = 1 ORDER BY key")
    state = "SELECT key, n_record_ids AS s FROM state WHERE computation = 'tally' ORDER BY key"
    # before the ids left the horizon: every key's newest change holds what the store holds
    hist, now = _sql(capsys, "--store", layout.root, "--as-of", str(after[8]), newest, state)
    assert {h["key"]: h["h"] for h in hist} == {"a": 8, "b": 6, "c": 4}
    assert {s["key"]: s["s"] for s in now} == {"a": 8, "b": 6}  # c has no row: no state
    # at the end: b did not change since its ids files were dropped past the horizon, so its newest
    # change (batch 8) still says what it held then while the state view counts what is held now
    hist, now = _sql(capsys, "--store", layout.root, newest, state)
    assert {h["key"]: h["h"] for h in hist} == {"a": 1, "b": 6, "c": 1}
    assert {s["key"]: s["s"] for s in now} == {"a": 1, "b": 0, "c": 1}


@pytest.mark.timeout(600)
def test_history_command_shows_the_ids_held(ran, capsys) -> None:  # type: ignore[no-untyped-def]
    layout, after = ran
    want = expected_ids()
    rc = main(["history", "--store", layout.root, "--computation", "tally", "--key", "b", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    got = [json.loads(line) for line in out.splitlines()]
    assert [g["n_record_ids"] for g in got] == [want[_batch_of(g["version"], after)]["b"] for g in got]
    assert [g["n_record_ids"] for g in got][:1] == [6] and all(g["row"]["record_ids"] == [] for g in got)
    rc = main(["history", "--store", layout.root, "--computation", "tally", "--key", "c"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = out.splitlines()
    head = [c.strip() for c in lines[0].split("|")]
    assert "ids" in head
    ids = [int(line.split("|")[head.index("ids")]) for line in lines[2:-1]]
    assert ids == [1, 4, 3, 2, 1]  # newest first: the new c, the delete, then its updates


@pytest.mark.objectstore
@pytest.mark.timeout(600)
def test_an_s3a_copy_of_the_store_counts_the_same(ran, object_store, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``history`` reads the ids files of an ``s3a://`` store as it reads a local one's."""
    from deltawheel.statestore.objectstore import s3a
    from pyarrow import fs as pafs

    layout, _after = ran
    env = {s3a.ENV_ENDPOINT: object_store.endpoint.url, s3a.ENV_ACCESS_KEY: object_store.endpoint.access_key,
           s3a.ENV_SECRET_KEY: object_store.endpoint.secret_key}
    bucket = "dw-history-ids"
    object_store.create_bucket(bucket)
    prefix = f"{bucket}/{uuid.uuid4().hex}"
    files = s3a.files_from_env(f"s3a://{prefix}", env)
    assert files is not None and not files.is_local
    pafs.copy_files(layout.root, prefix, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=files.fs)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for key in "abc":
        counts = []
        for store in (layout.root, f"s3a://{prefix}"):
            rc = main(["history", "--store", store, "--computation", "tally", "--key", key, "--json"])
            out, err = capsys.readouterr()
            assert rc == 0, err
            counts.append([(g["version"], g["change"], g["n_record_ids"]) for g in map(json.loads, out.splitlines())])
        assert counts[0] == counts[1] and max(n for _v, _c, n in counts[0]) >= 4, key
