"""The doctests of the packages pytest's doctest collection leaves out: ``gc`` (its folder name is
the standard library's) and ``benchmarks`` (ignored by the default run), imported by their
installed names so that the examples' exception names read as a user sees them."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["deltawheel.gc.passes", "deltawheel.gc.background", "deltawheel.gc.inputsets", "deltawheel.gc.unchanged",
           "deltawheel.benchmarks.memory", "deltawheel.benchmarks.throughput", "deltawheel.benchmarks.commits",
           "deltawheel.benchmarks.threads"]


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_in_the_docstrings_hold(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples left: take it off this list"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (printed above)"


def test_every_module_with_examples_is_listed() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = sorted(f"deltawheel.{p.relative_to(root).with_suffix('').as_posix().replace('/', '.')}"
                   for folder in ("gc", "benchmarks") for p in (root / folder).rglob("*.py")
                   if ">>>" in p.read_text())
    assert found == sorted(MODULES)
