"""The paper model of docs/scale.md ("On paper"): the page shows what the model prints, and the
model's arithmetic behaves as the page says (pure Python, no Spark)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    # by path: this checkout's model, whichever installed deltawheel the interpreter imports
    spec = importlib.util.spec_from_file_location("scale_model_under_test", ROOT / "benchmarks" / "scale_model.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


sm = _load()
D: Any = sm.Deployment


def _doc_block(marker: str) -> str:
    text = (ROOT / "docs" / "scale.md").read_text()
    m = re.search(rf"<!-- scale_model{re.escape(marker)} -->\n(.*?)\n<!-- /scale_model -->", text, re.S)
    assert m, f"docs/scale.md has no block <!-- scale_model{marker} -->"
    return m.group(1)


@pytest.mark.parametrize(("marker", "deployment"), [("", D()), (" --today", sm.TODAY)])
def test_the_page_shows_what_the_model_prints(marker: str, deployment: Any) -> None:
    assert _doc_block(marker) == sm.markdown(sm.model(deployment)), (
        "docs/scale.md's table is not the model's output: paste `python benchmarks/scale_model.py"
        f"{marker}` between its markers")


def _puts(m: dict[str, Any]) -> float:
    return sum(p["count"] * p["put"] for p in m["prefixes"].values())


def _rows(m: dict[str, Any]) -> dict[str, Any]:
    return dict(m["tables"]["rows"])


def test_doubling_the_records_doubles_the_puts_not_the_commits() -> None:
    # few records per batch against many held intervals: each record touches its own interval
    sparse = D(records_per_s=1_000, intervals=1_000_000, batch_s=1.0, group_commit=False)
    one, two = sm.model(sparse), sm.model(replace(sparse, records_per_s=2_000))
    data = "rows/<computation>/ (images, ids files)"
    assert two["prefixes"][data]["put"] == pytest.approx(2 * one["prefixes"][data]["put"], rel=1e-3)
    assert _rows(two)["commits_per_s"] == _rows(one)["commits_per_s"]
    # once every held interval is touched (the page's deployment), more records add no request
    dense = sm.model(D())
    assert _puts(sm.model(D(records_per_s=2_000_000))) == pytest.approx(_puts(dense))


def test_more_intervals_raise_the_puts_not_the_commits() -> None:
    for gc in (False, True):
        few, many = sm.model(D(intervals=1_000, group_commit=gc)), sm.model(D(intervals=4_000, group_commit=gc))
        assert _puts(many) > 3 * _puts(few) - 1e-9
        assert _rows(many)["commits_per_s"] == _rows(few)["commits_per_s"]
        assert many["zookeeper"]["reads_per_s"] > few["zookeeper"]["reads_per_s"]


@pytest.mark.parametrize("computations", [2, 4, 7])
def test_a_rows_table_per_computation_divides_the_commits_per_table(computations: int) -> None:
    base = D(computations=computations, group_commit=False)
    single = _rows(sm.model(replace(base, layout="single")))
    per = sm.model(replace(base, layout="computation"))
    assert per["tables"]["rows"]["count"] == computations
    assert _rows(per)["commits_per_s"] == pytest.approx(single["commits_per_s"] / computations)


def test_group_commit_folds_the_writers_commits() -> None:
    without, with_ = _rows(sm.model(D(group_commit=False))), _rows(sm.model(D(group_commit=True)))
    assert without["batches_per_version"] == 1 and without["commits_per_s"] == without["batches_per_s"]
    assert with_["commits_per_s"] == pytest.approx(sm.MEASURED_50MS[1])  # one committer, at the N = 1 figure
    assert with_["batches_per_version"] == pytest.approx(with_["batches_per_s"] / with_["commits_per_s"])
    assert with_["batches_per_version"] > 9
    # a version every half batch interval is what the committer needs: 1 s batches need 2/s
    assert _rows(sm.model(D(batch_s=1.0)))["headroom"] == pytest.approx(1.1 / 2)


def test_the_prefix_check_flags_a_deployment_past_3500_puts_per_second() -> None:
    m = sm.model(D(intervals=20_000, batch_s=1.0))
    held = 200
    touched = held * (1 - (1 - 1 / held) ** 10_000)
    data = m["prefixes"]["rows/<computation>/ (images, ids files)"]["put"]
    assert data == pytest.approx(100 * touched * (1 + 1 + 1 / 8))  # 100 batches/s, 2 1/8 files each
    assert data > 3_500
    check = next(c for c in m["limits"] if c["limit"] == "S3 PUT/s, busiest prefix")
    assert check["headroom"] == pytest.approx(3_500 / data) and check["headroom"] < 1
    assert m["breaks_first"] is not None


def test_the_page_s_figures_by_hand() -> None:
    m = sm.model(D())
    assert m["prefixes"]["rows/<computation>/ (images, ids files)"]["put"] == pytest.approx(10 * 20 * 2.125)
    assert m["zookeeper"]["reads_per_s"] == pytest.approx(40 * (3 + 2_000 + 20))  # 400 executors / 10 s
    assert m["zookeeper"]["log_entries_busiest_table"] == pytest.approx(1.1 * 3_600)
    s3 = m["s3"]
    assert s3["usd_per_hour"] == pytest.approx(3_600 * (s3["put_list_per_s"] * 0.005 + s3["get_head_per_s"] * 0.0004) / 1_000)
    assert m["breaks_first"] is None and m["limits"][0]["limit"] == "ZooKeeper reads/s"
    today = sm.model(sm.TODAY)
    entries = next(c for c in today["limits"] if c["limit"].startswith("log-store entries"))
    assert entries["capacity"] == pytest.approx(1_048_575 / 29) and entries["used"] == pytest.approx(100 * 86_400)  # a table per computation: 100 writers


def test_main_prints_markdown_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert sm.main([]) == 0
    assert capsys.readouterr().out.strip() == _doc_block("")
    assert sm.main(["--json", "--today"]) == 0
    assert json.loads(capsys.readouterr().out)["deployment"]["layout"] == "computation"
