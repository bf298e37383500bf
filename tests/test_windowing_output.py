"""What a windowed computation produces, as docs/windowing.md documents it: the page's Python blocks
run here as written (the complete user-combiner example among them), and a combiner whose
accumulator or pane value the codec cannot encode is refused naming the combiner and the fix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import pytest
from deltawheel.executor.tasks.usercode.keyrun import UserCodeError
from deltawheel.executor.windowing.combiners import CombineFn
from deltawheel.executor.windowing.windowed import WindowedComputation, windowed
from deltawheel.executor.windowing.windows import FixedWindows, Sessions, WindowingError

from deltawheel.testing import ComputationTester

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "windowing.md"


def fenced_blocks(markdown: str) -> list[tuple[str, str]]:
    """The fenced blocks of a Markdown page, in order: (language, text)."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", markdown, flags=re.MULTILINE | re.DOTALL)


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def test_the_python_blocks_of_the_windowing_page_run_as_written(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Every Python block of docs/windowing.md, in order, in one namespace, from the repository
    root: the complete example's own asserts check the panes, the dropped element and the
    downstream stage it shows, and a block that prints is followed by a plain block showing
    exactly what it prints."""
    blocks = fenced_blocks(DOC.read_text())
    python = [code for lang, code in blocks if lang == "python"]
    assert len(python) >= 4 and any("class DistinctPages(CombineFn)" in code for code in python)
    monkeypatch.chdir(REPO)
    namespace: dict[str, Any] = {"__name__": "windowing_md"}
    shown = 0
    for i, (lang, code) in enumerate(blocks):
        if lang != "python":
            continue
        capsys.readouterr()
        exec(compile(code, f"docs/windowing.md block {i}", "exec"), namespace)
        printed = capsys.readouterr().out
        if printed:
            assert i + 1 < len(blocks) and blocks[i + 1][0] == "", f"block {i} prints, and no block shows it"
            assert _lines(printed) == _lines(blocks[i + 1][1]), f"block {i} prints something else than shown"
            shown += 1
    assert shown >= 1 and isinstance(namespace["sessions"], WindowedComputation)


# ------------------------------------------------------ codec refusals

class SetOnCreate(CombineFn):
    """Distinct values in a set (which no safe codec encodes)."""

    def create(self) -> Any:
        return set()

    def add(self, acc: Any, value: Any) -> Any:
        acc.add(value)
        return acc

    def merge(self, accs: Sequence[Any]) -> Any:
        return set().union(*accs)

    def extract(self, acc: Any) -> Any:
        return len(acc)


class SetOnAdd(SetOnCreate):
    """Starts from a list, but add returns a set."""

    def create(self) -> Any:
        return []

    def add(self, acc: Any, value: Any) -> Any:
        return set(acc) | {value}


class SetOnMerge(SetOnAdd):
    """Lists, except that merge returns a set."""

    def add(self, acc: Any, value: Any) -> Any:
        return sorted(set(acc) | {value})


class SetOnExtract(SetOnAdd):
    """A list accumulator, a set as the pane value."""

    def add(self, acc: Any, value: Any) -> Any:
        return sorted(set(acc) | {value})

    def merge(self, accs: Sequence[Any]) -> Any:
        return sorted(set().union(*accs))

    def extract(self, acc: Any) -> Any:
        return set(acc)


def _distinct(combine: CombineFn, **settings: Any) -> WindowedComputation:
    return windowed(name="distinct", inputs={"clicks": "user"}, output="panes", windowing=Sessions(10_000),
                    combine=combine, value=lambda v: v["page"], **settings)


FIX = (r"return lists, dicts with string keys, str, int, float, bool or None \(e\.g\. a sorted list instead "
       r"of a set\), or build the computation with codec='pickle', allow_pickle=True")


@pytest.mark.parametrize("codec", ["json", "msgpack"])
def test_an_accumulator_the_codec_cannot_encode_is_refused_where_the_computation_is_built(codec: str) -> None:
    with pytest.raises(WindowingError, match=rf"combiner SetOnCreate: create\(\) returned a set, which the "
                                             rf"computation's codec '{codec}' cannot encode \(.*\)\. Accumulators "
                                             rf"and pane values are kept in the key's state and produced through "
                                             rf"the codec: {FIX}"):
        _distinct(SetOnCreate(), codec=codec)


@pytest.mark.parametrize("combine, method", [(SetOnAdd(), "add"), (SetOnMerge(), "merge"),
                                             (SetOnExtract(), "extract")])
def test_a_set_from_add_merge_or_extract_is_refused_naming_the_combiner_and_the_fix(combine: CombineFn,
                                                                                    method: str) -> None:
    """Not a codec traceback from deep in the runner: the user-code error names the key and record,
    and its cause names the combiner, the method, the type and the fix."""
    t = ComputationTester(_distinct(combine))
    with pytest.raises(UserCodeError, match=rf"distinct: user code failed for key 'ann' on (record|timer) .*"
                                            rf"WindowingError: combiner {type(combine).__name__}: {method}\(\) "
                                            rf"returned a set, which the computation's codec 'json' cannot "
                                            rf"encode .*{FIX}"):
        t.add({"user": "ann", "page": "/a"}, event_time_ms=0)
        t.add({"user": "ann", "page": "/b"}, event_time_ms=15_000)
        t.add({"user": "ann", "page": "/c"}, event_time_ms=8_000)  # bridges the two sessions: merge
        t.finish()  # the panes: extract


def test_with_the_pickle_codec_a_set_accumulator_is_kept() -> None:
    t = ComputationTester(_distinct(SetOnCreate(), codec="pickle", allow_pickle=True))
    for page, ts in (("/a", 0), ("/b", 1_000), ("/a", 2_000)):
        t.add({"user": "ann", "page": page}, event_time_ms=ts)
    t.finish()
    assert [o.value["value"] for o in t.output("panes")] == [2]


def test_a_built_in_combiner_with_a_list_accumulator_passes_the_check() -> None:
    t = ComputationTester(windowed(name="sums", inputs={"clicks": "user"}, output="panes",
                                   windowing=FixedWindows(10_000), combine="mean", value=lambda v: v["n"]))
    for n, ts in ((1, 0), (2, 1_000)):
        t.add({"user": "ann", "n": n}, event_time_ms=ts)
    t.finish()
    assert [o.value["value"] for o in t.output("panes")] == [1.5]
