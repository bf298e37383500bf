"""``deltawheel history``: a key's versions across a run, on both write paths, against the state
each batch should leave (folded in the test) and against Delta's time travel; its errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from deltawheel.executor.cli import main
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import KeyNeverSeenError, NotAStoreError, UnknownComputationError
from deltawheel.statestore.inspection.history import key_history, walk_history
from history_util import BATCHES, expected_states, run_batches

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def _batch_of(version: int, after: list[int]) -> int:
    """The batch whose commits took the rows table to ``version`` (-1: before the first batch)."""
    return next((b for b, v in enumerate(after) if version <= v), len(after))


@pytest.fixture(scope="module", params=["image", "merge"])
def ran(request, spark, zk_server, tmp_path_factory) -> tuple[Any, list[int], str]:  # type: ignore[no-untyped-def]
    import uuid

    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.layout import StoreLayout

    from deltawheel import migrations

    layout = StoreLayout(str(tmp_path_factory.mktemp(f"hist-{request.param}") / "store"))
    migrations.apply(spark, layout, dry_run=False)
    zk = ZkConfig(hosts=zk_server.hosts, chroot=f"/t-{uuid.uuid4().hex[:12]}", session_timeout_s=6.0)
    return layout, run_batches(spark, layout, zk, write_path=request.param), request.param


@pytest.mark.timeout(900)
def test_each_version_holds_what_its_batch_left(spark, ran) -> None:  # type: ignore[no-untyped-def]
    layout, after, _path = ran
    expected = expected_states()
    files = TableFiles(layout.rows)
    for key in "abcdef":
        hist = key_history(files, computation="summer", key=key)
        changes = list(reversed(hist.changes))  # oldest first
        # the batches after which the key's state (or timer) differs from before it, and its deletions
        want = [b for b in range(len(BATCHES)) if expected[b].get(key) != (expected[b - 1].get(key) if b else None)]
        assert [_batch_of(c.commit.version, after) for c in changes] == want, (key, [c.commit.version for c in changes])
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
            got = (spark.read.format("delta").option("versionAsOf", c.commit.version).load(layout.rows)
                   .where(f"computation = 'summer' AND key = '{key}'").collect())
            assert len(got) == 1 and json.loads(got[0]["state"]) == state
            assert got[0]["commit_id"] == c.row.commit_id
        assert hist.latest_version == after[-1] and hist.first_version == 0


def test_every_key_history_equals_the_per_key_one(ran) -> None:  # type: ignore[no-untyped-def]
    layout, _after, _path = ran
    files = TableFiles(layout.rows)
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
    assert [g["change"] for g in got] == ["insert", "delete", "update", "insert"]
    assert got[0]["row"]["state"] == expected[4]["b"][0] == {"sum": 9, "n": 1}
    assert got[0]["row"]["timers"][0]["tag"] == "last" and got[0]["writer"] == "w"
    assert got[1]["row"] is None and got[3]["row"]["state"] == {"sum": 2, "n": 1}
    assert [g["version"] for g in got] == sorted((g["version"] for g in got), reverse=True)
    rc = main(["history", "--store", layout.root, "--computation", "summer", "--key", "b", "--limit", "2"])
    out, err = capsys.readouterr()
    assert rc == 0 and out.splitlines()[-1] == "(2 rows)" and "insert" in out.splitlines()[2]
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
    files = TableFiles(layout.rows)
    with pytest.raises(KeyNeverSeenError, match=r"never held key 'zzz' in versions 0-\d+ of the rows table; check --key"):
        key_history(files, computation="summer", key="zzz")
    with pytest.raises(UnknownComputationError, match="holds no computation 'nope'.*it holds: summer"):
        key_history(files, computation="nope", key="a")
    with pytest.raises(NotAStoreError, match="has no Delta log"):
        key_history(TableFiles(str(tmp_path / "missing")), computation="summer", key="a")
