"""A store of the first layout (one rows table for every computation), written by deltawheel at
schema version 7 with a pipeline stopped half way through its input (tests/data/layout7-store.tar.gz,
made by tests/split_store.py): ``deltawheel migrate`` shows migration 8 and changes nothing,
``--apply`` gives each computation its own rows table, and the same pipeline started on the store
again finishes the input with both streams exactly as a count made without deltawheel."""

from __future__ import annotations

import json
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from continuous_pipeline import MINUTE
from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.delta.log import read_snapshot
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.tables import list_computations
from split_store import CLICKS, append_clicks, clicks, run

pytestmark = [pytest.mark.spark, pytest.mark.zk]

TARBALL = Path(__file__).parent / "data" / "layout7-store.tar.gz"


def _expected() -> tuple[Counter[str], Counter[str]]:
    """(user_counts, totals) of every click, as JSON texts, counted without deltawheel."""
    per: Counter[tuple[str, int]] = Counter((c["user"], c["ts"] - c["ts"] % MINUTE) for c in clicks())
    users = Counter(json.dumps({"user": u, "start": s, "clicks": n}, sort_keys=True) for (u, s), n in per.items())
    minutes: dict[int, dict[str, int]] = {}
    for (_u, s), n in per.items():
        m = minutes.setdefault(s, {"users": 0, "clicks": 0})
        m["users"] += 1
        m["clicks"] += n
    totals = Counter(json.dumps({"start": s, **m}, sort_keys=True) for s, m in minutes.items())
    return users, totals


def _stream(spark: Any, layout: StoreLayout, name: str) -> Counter[str]:
    codec = get_codec("json")
    return Counter(json.dumps(codec.decode(r["value"]), sort_keys=True)
                   for r in spark.read.format("delta").load(layout.stream(name)).collect())


def _live_rows(spark: Any, path: str, computation: str) -> dict[str, Any]:
    return {r["key"]: r["state"] for r in spark.read.format("delta").load(path).where(
        f"computation = '{computation}' AND NOT startswith(key, '\\u0000')").collect()}


@pytest.mark.timeout(900)
def test_a_store_of_one_rows_table_migrates_and_its_pipeline_goes_on(spark, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.cli import main

    with tarfile.open(TARBALL) as tar:
        tar.extractall(tmp_path, filter="data")
    store, layout = tmp_path / "store", StoreLayout(str(tmp_path / "store"))
    before = _live_rows(spark, layout.rows, "user_minutes")
    assert before, "the packed store holds user_minutes' open minutes in its one rows table"

    assert main(["migrate", "--store", str(store)]) == 0  # the dry run
    out = capsys.readouterr().out
    assert "rows_per_computation" in out and "8" in out, out
    assert not Path(layout.computations_root).exists()  # nothing changed
    assert main(["migrate", "--store", str(store), "--apply"]) == 0
    capsys.readouterr()
    assert list_computations(None, layout) == ["minute_totals", "user_minutes"]
    snap = read_snapshot(layout.rows)
    assert snap is not None and snap.adds == ()  # the first table is emptied; it keeps the store's id
    assert _live_rows(spark, layout.rows_of("user_minutes"), "user_minutes") == before
    assert main(["migrate", "--store", str(store), "--apply"]) == 0  # nothing left to do
    assert "up to date" in capsys.readouterr().out

    append_clicks(spark, tmp_path / "input", clicks()[CLICKS // 2:])
    run(spark, store, tmp_path / "input", end=True)
    users, totals = _expected()
    assert _stream(spark, layout, "user_counts") == users
    assert _stream(spark, layout, "totals") == totals
