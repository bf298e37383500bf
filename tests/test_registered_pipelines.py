"""The tools find a pipeline's code by its name through the ``deltawheel.pipelines`` entry points
(the demo registers itself in pyproject.toml); no command names the demo."""

from __future__ import annotations

import ast
from pathlib import Path

from deltawheel.executor.drivers.replay import registered_computation

CLI = Path(__file__).resolve().parents[1] / "deltawheel" / "cli"


def test_the_demo_is_found_by_its_pipeline_name_and_nothing_else_is() -> None:
    from deltawheel.demo.pipeline import computations

    for c in computations():
        found = registered_computation("zeitgeist", c.name)
        assert found is not None and (found.name, type(found).__name__) == (c.name, type(c).__name__)
    assert registered_computation("zeitgeist", "no_such_computation") is None
    assert registered_computation("payments", "balance") is None  # nobody registered it


def test_no_tool_command_compares_the_pipeline_with_the_demo_s_name() -> None:
    named = []
    for path in sorted(CLI.glob("*.py")):
        if path.name in ("demo.py", "quickstart.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                    isinstance(c, ast.Constant) and c.value == "zeitgeist" for c in node.comparators):
                named.append(f"{path.name}:{node.lineno}")
    assert named == []
