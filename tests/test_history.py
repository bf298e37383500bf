"""``deltawheel history``: a key's versions across a run, on both write paths, against the state
each batch should leave (folded in the test) and against Delta's time travel; its errors."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from typing import Any

import pytest
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import KeyNeverSeenError, NotAStoreError, UnknownComputationError
from deltawheel.statestore.inspection.history import key_history, walk_history
from history_util import BATCHES, expected_states, run_batches

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def _held(c: Any) -> tuple[Any, ...]:
    """A listed version's state and timers (a version may also differ only in its checkpointed productions:
    the merge path clears them from the rows of the batch before)."""
    return (c.row.state, c.row.timers)


def _batch_of(version: int, after: list[int]) -> int:
    """The batch whose commits took the rows table to ``version`` (-1: before the first batch)."""
    return next((b for b, v in enumerate(after) if version <= v), len(after))


# the merge path (its deletion vectors) takes several minutes on a loaded machine: in the slow run
@pytest.fixture(scope="module", params=["image", pytest.param("merge", marks=pytest.mark.slow)])
def ran(request, spark, zk_server, tmp_path_factory,
        migrated_template) -> tuple[Any, list[int], str]:  # type: ignore[no-untyped-def]
    import uuid
    from pathlib import Path

    from conftest import copy_migrated_store
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout

    layout = StoreLayout(str(tmp_path_factory.mktemp(f"hist-{request.param}") / "store"))
    copy_migrated_store(migrated_template, Path(layout.root))
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/t-{uuid.uuid4().hex[:12]}", session_timeout_s=6.0)
    return layout, run_batches(spark, layout, zk, write_path=request.param), request.param


@pytest.mark.timeout(900)
def test_each_version_holds_what_its_batch_left(spark, ran) -> None:  # type: ignore[no-untyped-def]
    layout, after, _path = ran
    expected = expected_states()
    files = TableFiles(layout.rows_of("summer"))
    read: dict[int, dict[str, Any]] = {}

    def travel(version: int) -> dict[str, Any]:
        if version not in read:
            df = spark.read.format("delta").option("versionAsOf", version).load(layout.rows_of("summer"))
            read[version] = {r["key"]: r for r in df.where("computation = 'summer'").collect()}
        return read[version]

    for key in "abcdef":
        hist = key_history(files, computation="summer", key=key)
        changes = list(reversed(hist.changes))  # oldest first
        # the batches after which the key's state (or timer) differs from before it, and its deletions
        want = [b for b in range(len(BATCHES)) if expected[b].get(key) != (expected[b - 1].get(key) if b else None)]
        seen = [(c, p) for c, p in zip(changes, [None, *changes], strict=False)
                if p is None or c.row is None or p.row is None or _held(c) != _held(p)]
        assert [_batch_of(c.commit.version, after) for c, _p in seen] == want, (key, [c.commit.version for c in changes])
        for c, p in zip(changes, [None, *changes], strict=False):  # the others: only checkpointed productions went
            if (c, p) not in seen:
                assert p is not None and p.row is not None and c.row is not None and p.row.pending != c.row.pending
        for c in changes:
            b = _batch_of(c.commit.version, after)
            if key not in expected[b]:
                assert c.change == "delete" and c.row is None
                continue
            state, timer = expected[b][key]
            assert c.row is not None and json.loads(c.row.state or b"null") == state
            assert [(t.tag, t.time_ms) for t in c.row.timers] == [("last", timer)]
            assert c.change == ("insert" if b == 0 or key not in expected[b - 1] else "update")
            assert c.commit.writer == "w" and c.row.sequencer == c.commit.meta["sequencers"][str(c.row.interval)]
            # Delta's own time travel holds the same row at that version
            got = travel(c.commit.version)[key]
            assert json.loads(got["state"]) == state and got["commit_id"] == c.row.commit_id
        assert hist.latest_version == after[-1] and hist.first_version == 0


def test_every_key_history_equals_the_per_key_one(ran) -> None:  # type: ignore[no-untyped-def]
    layout, _after, _path = ran
    files = TableFiles(layout.rows_of("summer"))
    every = [(c.key, c.commit.version, c.change) for c in walk_history(files, computation="summer")]
    one = sorted((c.key, c.commit.version, c.change)
                 for k in "abcdef" for c in key_history(files, computation="summer", key=k).changes)
    assert sorted(every) == one


def test_cli_lists_newest_first_and_says_what_is_wrong(ran, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    layout, after, _path = ran
    expected = expected_states()
    rc = main(["history", "--store", layout.root, "--computation", "summer", "--key", "b", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    got = [json.loads(line) for line in out.splitlines()]
    states = [None if g["row"] is None else g["row"]["state"] for g in got]
    assert [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]] == [
        {"sum": 9, "n": 1}, None, {"sum": 7, "n": 2}, {"sum": 2, "n": 1}]
    assert states[0] == expected[4]["b"][0] and got[-1]["change"] == "insert"
    assert [g["change"] for g in got if g["row"] is None] == ["delete"]
    assert got[0]["row"]["timers"][0]["tag"] == "last" and got[0]["writer"] == "w"
    assert [g["version"] for g in got] == sorted((g["version"] for g in got), reverse=True)
    rc = main(["history", "--store", layout.root, "--computation", "summer", "--key", "b", "--limit", "2"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.splitlines()[-1] == "(2 rows)"
    assert '{"n": 1, "sum": 9}' in out and "2 version(s) shown" in err
    rc = main(["history", "--store", layout.root, "--computation", "summer", "--key", "zzz"])
    err = capsys.readouterr().err
    assert rc == 1 and "KeyNeverSeenError: computation 'summer' never held key 'zzz'" in err
    rc = main(["history", "--store", layout.root, "--computation", "nope", "--key", "a"])
    err = capsys.readouterr().err
    assert rc == 3 and "UnknownComputationError" in err and "it holds: summer" in err
    rc = main(["history", "--store", str(tmp_path / "none"), "--computation", "summer", "--key", "a"])
    err = capsys.readouterr().err
    assert rc == 3 and "NotAStoreError" in err and "holds no rows table" in err
    rc = main(["history", "--store", layout.root, "--computation", "summer", "--key", "a", "--limit", "0"])
    assert rc == 3 and "--limit must be at least 1" in capsys.readouterr().err


def test_typed_errors(ran, tmp_path) -> None:  # type: ignore[no-untyped-def]
    layout, _after, _path = ran
    files = TableFiles(layout.rows_of("summer"))
    with pytest.raises(KeyNeverSeenError, match=r"never held key 'zzz' in versions 0-\d+ of the rows table; check --key"):
        key_history(files, computation="summer", key="zzz")
    with pytest.raises(UnknownComputationError, match="holds no computation 'nope'.*it holds: summer"):
        key_history(files, computation="nope", key="a")
    with pytest.raises(NotAStoreError, match="has no Delta log"):
        key_history(TableFiles(str(tmp_path / "missing")), computation="summer", key="a")
    # an old version's data file vacuumed: said, not a bare FileNotFoundError
    import shutil

    from deltawheel.statestore.delta.log import read_snapshot
    from deltawheel.statestore.exceptions import VersionNotFoundError

    copy = tmp_path / "rows"
    shutil.copytree(layout.rows_of("summer"), copy)
    live = {a["path"] for a in read_snapshot(str(copy)).adds}  # type: ignore[union-attr]
    gone = next(p for p in copy.glob("computation=summer/*/*.parquet")
                if str(p.relative_to(copy)) not in live)
    gone.unlink()
    with pytest.raises(VersionNotFoundError, match=r"of an old version of .* is gone \(vacuumed"):
        for k in "abcdef":
            key_history(TableFiles(str(copy)), computation="summer", key=k)


def test_state_history_view_lists_every_change_decoded(spark, ran) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.inspection.sqlviews import register_views

    layout, after, _path = ran
    expected = expected_states()
    assert "state_history" in register_views(spark, layout)
    got = spark.sql("SELECT key, version, commit_time, change, writer, kind, state_json, n_timers, timers, sequencer "
                    "FROM state_history WHERE computation = 'summer' ORDER BY key, version").collect()
    files = TableFiles(layout.rows_of("summer"))
    assert [(r["key"], r["version"], r["change"]) for r in got] == sorted(
        (c.key, c.commit.version, c.change) for k in "abcdef" for c in key_history(files, computation="summer", key=k).changes)
    for r in got:
        b = _batch_of(r["version"], after)
        if r["change"] == "delete":
            assert r["state_json"] is None and r["key"] not in expected[b]
        else:
            assert json.loads(r["state_json"]) == expected[b][r["key"]][0]
            assert r["n_timers"] == 1 and r["timers"][0]["time_ms"] == expected[b][r["key"]][1]
        assert r["writer"] == "w" and r["kind"] == "commit" and r["commit_time"] is not None


def _rows_at(spark, layout, **option) -> list[tuple[str, Any, int]]:  # type: ignore[no-untyped-def]
    """(key, decoded state, number of timers) of the rows table read by Delta's own time travel."""
    df = spark.read.format("delta").options(**option).load(layout.rows_of("summer"))
    return sorted((r["key"], json.loads(r["state"]), len(r["timers"])) for r in df.collect()
                  if not r["key"].startswith("\x00"))


def _cli_json(capsys, *argv: str) -> tuple[list[dict[str, Any]], str]:  # type: ignore[no-untyped-def]
    """The rows ``deltawheel sql --format json`` printed, in order; with several statements each
    line is ``{"query": N, "row": {...}}``, numbered in the order the statements were given."""
    rc = main(["sql", *argv])
    out, err = capsys.readouterr()
    assert rc == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    if sum(1 for a in argv if a.lstrip().upper().startswith("SELECT")) < 2:
        return lines, err
    numbers = [line["query"] for line in lines]
    assert numbers == sorted(numbers), numbers  # each statement's rows after the one before's
    return [line["row"] for line in lines], err


def test_sql_as_of_equals_delta_time_travel(spark, ran, capsys) -> None:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable

    layout, after, _path = ran
    query = "SELECT key, state_json, n_timers FROM state ORDER BY key"
    # a version: the rows table at it, the sums stream as of its commit time
    mid = after[2]
    got, err = _cli_json(capsys, "--store", layout.root, "--format", "json", "--as-of", str(mid), query,
                         "SELECT count(*) AS n FROM sums", "SELECT max(version) AS v FROM state_history")
    want = _rows_at(spark, layout, versionAsOf=mid)
    assert [(g["key"], json.loads(g["state_json"]), g["n_timers"]) for g in got[:-2]] == want
    assert want == sorted((k, s, 1) for k, (s, _t) in expected_states()[2].items())
    rows = layout.rows_of("summer")
    hist = {int(r["version"]): r["timestamp"] for r in DeltaTable.forPath(spark, rows).history().collect()}
    sums = spark.read.format("delta").option("timestampAsOf", hist[mid].isoformat(sep=" ")).load(layout.stream("sums"))
    assert got[-2] == {"n": sums.count()} and got[-2]["n"] == sum(not r for b in BATCHES[:3] for _k, _v, r in b)
    assert got[-1] == {"v": mid}
    assert f"as of {mid}:" in err and f"rows v{mid}" in err
    # a timestamp (the commit time of batch 3's last commit, in UTC): every table as Delta's own
    # TIMESTAMP AS OF reads it (given in the session's time zone)
    ms = {int(r["version"]): int(r["ms"]) for r in DeltaTable.forPath(spark, rows).history()
          .selectExpr("version", "unix_millis(timestamp) AS ms").collect()}[after[3]]
    utc = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    local = spark.sql(f"SELECT date_format(timestamp_millis({ms}), 'yyyy-MM-dd HH:mm:ss.SSS') AS t").collect()[0]["t"]
    got, err = _cli_json(capsys, "--store", layout.root, "--format", "json", "--as-of", utc, query,
                         "SELECT count(*) AS n FROM sums")
    assert [(g["key"], json.loads(g["state_json"]), g["n_timers"]) for g in got[:-1]] == \
        _rows_at(spark, layout, timestampAsOf=local)
    assert got[-1]["n"] == spark.read.format("delta").option("timestampAsOf", local).load(layout.stream("sums")).count()
    assert got[-1]["n"] == sum(not r for b in BATCHES[:4] for _k, _v, r in b) and f"rows v{after[3]}" in err


def test_as_of_refusals(spark, ran) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.exceptions import ConfigError, VersionNotFoundError
    from deltawheel.statestore.inspection.asof import resolve_as_of, store_tables

    layout, after, _path = ran
    tables = store_tables(spark, layout)
    with pytest.raises(VersionNotFoundError,
                       match=rf"the rows table of 'summer' has no version 999: its log holds versions 0-{after[-1]}"):
        resolve_as_of(spark, layout, "999", tables)
    with pytest.raises(VersionNotFoundError, match="the rows table of 'summer' has no version 999"):
        resolve_as_of(spark, layout, "summer@999", tables)
    with pytest.raises(ConfigError, match="computation 'nope' has no rows table in this store"):
        resolve_as_of(spark, layout, "nope@1", tables)
    with pytest.raises(VersionNotFoundError, match="no version at or before 2001-01-01T00:00:00.000"):
        resolve_as_of(spark, layout, "2001-01-01", tables)
    with pytest.raises(ConfigError, match="--as-of 'yesterday' is neither a version"):
        resolve_as_of(spark, layout, "yesterday", tables)
    got = resolve_as_of(spark, layout, str(after[0]), tables)
    assert got.version_of(layout.rows_of("summer")) == after[0] and got.version_of(layout.stream("sums")) is not None
    assert resolve_as_of(spark, layout, f"summer@{after[0]}", tables) == replace(got, asked=f"summer@{after[0]}")


def test_history_refuses_a_store_it_cannot_read(capsys) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.statestore.exceptions import ConfigError

    from deltawheel.cli.history import _history

    store = "abfss://c@acct.dfs.core.windows.net/store"
    rc = main(["history", "--store", store, "--computation", "summer", "--key", "a"])
    assert rc == 3 and "history reads local folders, file: and s3a:// stores only" in capsys.readouterr().err
    import argparse

    with pytest.raises(ConfigError, match="query the state_history view"):
        _history(argparse.Namespace(store=store, computation="summer", key="a", limit=None,
                                    json=False, allow_pickle=False))
