"""Replays and promotions of continuous runs interrupted at random: after runs of the
two-stage ``balance_pipeline`` ended by SIGKILL or SIGTERM while input kept arriving, a replay of the
unchanged code from any version holds what the live store holds (an empty diff), and a promotion of
such a replay changes no key; real Spark, ZooKeeper and Delta, ``deltawheel run`` in child processes,
``deltawheel replay`` and ``promote`` as a user runs them.

Both are in the slow suite (live runs, replays and a promotion take minutes): one fixed scenario
(a crash and a graceful stop) replayed from a sample of versions, and random scenarios replayed
from every version of both stages. The proof's refusals are tested quickly in
``test_promote_checks.py``.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from live_runs import interrupted_runs, scenario

from deltawheel.cli import main

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def _zk(zk_server: Any) -> Any:
    from deltawheel.statestore.config import ZkConfig

    return ZkConfig(hosts=zk_server.hosts, chroot=f"/prop-{uuid.uuid4().hex[:8]}", session_timeout_s=6.0)


def _commits(spark: Any, store: Path, computation: str) -> list[Any]:
    from deltawheel.statestore.inspection.positions import computation_commits
    from deltawheel.statestore.layout import StoreLayout

    return computation_commits(spark, StoreLayout(str(store)), computation)


def _replay(store: Path, zk: Any, computation: str, start: int | None, into: Path, capsys: Any) -> dict[str, Any]:
    """``deltawheel replay`` of the unchanged code from rows version ``start`` (None: the start); its diff."""
    out = into.parent / f"{into.name}.json"
    frm = ["--from-start"] if start is None else ["--from-version", str(start)]
    rc = main(["replay", "--store", str(store), "--pipeline", "payments", "--computation", computation, *frm,
               "--source", "balance_pipeline:pipeline", "--into", str(into), "--diff-out", str(out),
               "--zk", zk.hosts, "--zk-chroot", zk.chroot])
    printed = capsys.readouterr()
    assert rc == 0, printed.out[-3000:] + printed.err[-3000:]
    got: dict[str, Any] = json.loads(out.read_text())
    assert got["empty"], f"{computation} from {start}: {printed.out[-3000:]}"
    return got


def _promote_changes_nothing(store: Path, zk: Any, computation: str, into: Path, capsys: Any) -> None:
    rc = main(["promote", "--from", str(into), "--store", str(store), "--pipeline", "payments", "--computation",
               computation, "--json", "--zk", zk.hosts, "--zk-chroot", zk.chroot])
    printed = capsys.readouterr()
    assert rc == 0, printed.err[-3000:]
    result = json.loads(printed.out)
    assert (result["rows_written"], result["rows_deleted"], result["version"]) == (0, 0, None), result


def _live_exactly_once(spark: Any, store: Path, payments: dict[str, list[dict[str, Any]]]) -> None:
    """Every payment counted once in the live state and produced once, in sequence, per account."""
    from deltawheel.statestore.codecs import get_codec

    codec = get_codec("json")
    want: dict[str, tuple[int, int]] = {}
    for rows in payments.values():
        for p in rows:
            n, total = want.get(p["account"], (0, 0))
            want[p["account"]] = (n + 1, total + p["amount"])
    rows = spark.read.format("delta").load(f"{store}/computations/balance/rows").where("computation = 'balance'").collect()
    state = {r["key"]: codec.decode(r["state"]) for r in rows if not r["key"].startswith("\x00") and r["state"]}
    assert {k: (s["n"], s["sum"]) for k, s in state.items()} == want
    seqs: dict[str, list[int]] = {}
    for r in spark.read.format("delta").load(f"{store}/streams/balances").collect():
        v = codec.decode(r["value"])
        seqs.setdefault(v["account"], []).append(v["seq"])
    assert {k: sorted(v) for k, v in seqs.items()} == {k: list(range(1, n + 1)) for k, (n, _) in want.items()}


@pytest.fixture(scope="module")
def sample(spark, zk_server, tmp_path_factory):  # type: ignore[no-untyped-def]
    """One fixed scenario: two runs ended by a SIGKILL and a SIGTERM, then a run to the end."""
    sc = scenario(59, runs=2, files=10)
    assert {s.signal for s in sc.stops} == {"kill", "term"}
    zk = _zk(zk_server)
    return interrupted_runs(sc, tmp_path_factory.mktemp("interrupted"), zk, spark) | {"zk": zk}


@pytest.mark.slow  # live runs killed and stopped, then replays and a promotion: minutes (the proof's refusals: test_promote_checks.py)
@pytest.mark.timeout(3600)
def test_replays_of_interrupted_runs_give_empty_diffs_and_their_promotion_changes_nothing(  # type: ignore[no-untyped-def]
        spark, sample, tmp_path, capsys, monkeypatch) -> None:
    from balance_pipeline import INPUT_ENV

    store, zk = sample["store"], sample["zk"]
    monkeypatch.setenv(INPUT_ENV, str(sample["folder"]))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # --source adds its module's folder
    _live_exactly_once(spark, store, sample["payments"])
    commits = _commits(spark, store, "balance")
    claims = [c.version for c in commits if c.kind == "claim"]
    batches = [c.version for c in commits if c.reruns]
    # from the start (across the crash and the graceful stop); from just before the last batch (the
    # one a replay missed when a batch's files were read from the entry numbered like it)
    assert len(claims) >= 2, claims  # the runs restarted: each new owner claimed the intervals
    for i, start in enumerate((None, batches[-2])):
        _replay(store, zk, "balance", start, tmp_path / f"balance-{i}", capsys)
    _replay(store, zk, "totals", None, tmp_path / "totals", capsys)
    _promote_changes_nothing(store, zk, "balance", tmp_path / "balance-0", capsys)


@pytest.mark.slow  # runs of a pipeline killed and restarted, then a replay from each version (long)
@pytest.mark.timeout(4 * 3600)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replays_from_every_version_of_randomly_interrupted_runs_give_empty_diffs(  # type: ignore[no-untyped-def]
        spark, zk_server, tmp_path, capsys, monkeypatch, seed) -> None:
    from balance_pipeline import INPUT_ENV

    zk = _zk(zk_server)
    runs = interrupted_runs(scenario(seed, runs=4, files=18), tmp_path / "live", zk, spark)
    store = runs["store"]
    monkeypatch.setenv(INPUT_ENV, str(runs["folder"]))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    _live_exactly_once(spark, store, runs["payments"])
    for computation in ("balance", "totals"):
        versions = [c.version for c in _commits(spark, store, computation)]
        for start in [None, *versions]:
            _replay(store, zk, computation, start, tmp_path / f"{computation}-{start}", capsys)
        _promote_changes_nothing(store, zk, computation, tmp_path / f"{computation}-None", capsys)
