"""The executor's floors: what each of its sub-packages may import (docs/architecture.md).

Every import of every executor module is read with ``ast`` (imports inside functions included)
and checked: a module imports from its own sub-package and from lower floors only, and nothing
but the command line imports the benchmarks. statestore, gc and migrations are below the whole
executor and may be imported from anywhere in it (tests/test_layering.py checks statestore's own
floors).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from import_graph import imports_of, module_name

EXECUTOR = Path(__file__).resolve().parents[1] / "executor"
PACKAGE = "deltawheel.executor"

#: The floors, lowest first. ``<api>`` is the user API directly in executor/ (computation,
#: context, exceptions, session); ``testkit`` (the test harness of a user's computation) runs
#: computations with the tasks' key runner and sits with the tools on the top floor.
FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"<api>"}),
    frozenset({"tasks", "servers"}),  # what runs inside Spark tasks; local server processes
    frozenset({"windowing", "sources"}),  # the Dataflow model on the API; the injectors
    frozenset({"protocol"}),  # the per-batch protocol: ComputationExecutor, BatchProtocol
    frozenset({"drivers"}),  # connect/Engine, pipelines and their runner, recover: the one wiring
    frozenset({"demo", "testkit", "chaos"}),  # the demo pipeline; the test harness of a user's computation; chaos runs
    frozenset({"cli"}),  # the command line over all of it
)

#: Modules directly in executor/ that are not on the API floor.
TOP_MODULES = {"testkit": "testkit"}

#: Inside ``tasks/`` (what runs in Spark tasks), lowest first: the Python workers' set-up and the
#: shared job contract and input preparation, with the loops that run user code; a folder per
#: write path; the table that pairs them. A write path's folder does not import another's.
TASK_FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"worker"}),  # the Python workers' per-task overhead removed
    frozenset({"usercode", "input", "job", "daemon"}),  # user code's loops; the input; the user-job contract
    frozenset({"image", "merge"}),  # a folder per write path: its job and its tasks
    frozenset({"paths"}),  # PATHS: each write path's WritePath and user job
)


def _sub_of(module: str, root: Path) -> str:
    rest = module[len(PACKAGE) + 1:].split(".")
    if len(rest) == 1 and not (root / rest[0]).is_dir():
        return TOP_MODULES.get(rest[0], "<api>")
    return rest[0]


def _floor(sub: str) -> int:
    for n, floor in enumerate(FLOORS):
        if sub in floor:
            return n
    raise AssertionError(f"executor sub-package {sub!r} is on no floor: add it to FLOORS here and to "
                         "docs/architecture.md")


def _module_name(path: Path, root: Path = EXECUTOR) -> str:
    return module_name(path, root, PACKAGE)


def _imports(path: Path, root: Path) -> Iterator[tuple[str, int]]:
    return imports_of(path, root, PACKAGE)


def _executor_target(name: str, root: Path) -> str | None:
    """The executor sub-package (or API module floor) ``name`` lies in, None outside the executor."""
    if not name.startswith(PACKAGE + "."):
        return None
    first = name[len(PACKAGE) + 1:].split(".")[0]
    if (root / first).is_dir():
        return first
    return TOP_MODULES.get(first, "<api>")


def _violations(root: Path = EXECUTOR) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        if module == PACKAGE:
            continue
        sub = _sub_of(module, root)
        for target, line in _imports(path, root):
            if target.startswith("deltawheel.benchmarks") and sub != "cli":
                bad.append(f"{module} line {line} imports {target} (only the command line runs benchmarks)")
            dep = _executor_target(target, root)
            if dep is None or dep == sub:
                continue
            if _floor(dep) >= _floor(sub):
                bad.append(f"{module} (floor {_floor(sub)}, {sub}) line {line} imports {target} "
                           f"(floor {_floor(dep)}, {dep})")
    return bad


def _task_part(module: str) -> str | None:
    """The part of ``tasks/`` (a sub-package or a module directly in it) ``module`` lies in."""
    rest = module[len(PACKAGE) + 1:].split(".")
    return rest[1] if rest[0] == "tasks" and len(rest) > 1 else None


def _task_floor(part: str) -> int:
    for n, floor in enumerate(TASK_FLOORS):
        if part in floor:
            return n
    raise AssertionError(f"tasks/{part} is on no floor of tasks/: add it to TASK_FLOORS here and to "
                         "docs/architecture.md")


def _task_violations(root: Path = EXECUTOR) -> list[str]:
    bad = []
    for path in sorted((root / "tasks").rglob("*.py")):
        module = _module_name(path, root)
        part = _task_part(module)
        if part is None:
            continue
        for target, line in _imports(path, root):
            dep = _task_part(target) if target.startswith(PACKAGE + ".tasks.") else None
            if dep is None or dep == part or not ((root / "tasks" / dep).is_dir()
                                                  or (root / "tasks" / f"{dep}.py").is_file()):
                continue
            if _task_floor(dep) >= _task_floor(part):
                bad.append(f"{module} (tasks floor {_task_floor(part)}, {part}) line {line} imports {target} "
                           f"(tasks floor {_task_floor(dep)}, {dep})")
    return bad


def test_inside_the_tasks_imports_go_down_their_floors() -> None:
    bad = _task_violations()
    assert not bad, "\n".join(bad)


def test_the_tasks_check_sees_a_write_path_importing_another(tmp_path: Path) -> None:
    """The check fails on a copy of the executor where the loops of user code import the image path."""
    import shutil

    copy = tmp_path / "executor"
    shutil.copytree(EXECUTOR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "tasks" / "usercode" / "upward.py").write_text("from ..image.spec import ImageSpec\n")
    bad = _task_violations(copy)
    assert any("usercode.upward" in b and "image.spec" in b for b in bad), bad


def test_every_executor_import_goes_down_the_floors() -> None:
    bad = _violations()
    assert not bad, "\n".join(bad)


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The check fails on a copy of the executor where the task side imports the protocol."""
    import shutil

    copy = tmp_path / "executor"
    shutil.copytree(EXECUTOR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "tasks" / "upward.py").write_text("def f():\n    from ..protocol.executor import ComputationExecutor\n"
                                             "    return ComputationExecutor\n")
    bad = _violations(copy)
    assert any("tasks.upward" in b and "protocol.executor" in b for b in bad), bad


@pytest.mark.parametrize("sub", sorted(set().union(*FLOORS) - {"<api>", "testkit"}))
def test_every_floor_named_is_a_package(sub: str) -> None:
    assert (EXECUTOR / sub / "__init__.py").is_file()


def _cli_commands() -> set[str]:
    """The command modules ``deltawheel``'s parser registers (cli/__init__.py's list)."""
    import ast

    tree = ast.parse((EXECUTOR / "cli" / "__init__.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple):
            return {e.value for e in node.iter.elts if isinstance(e, ast.Constant)}
    raise AssertionError("cli/__init__.py lists no command modules")


def test_no_command_imports_another() -> None:
    """What two commands share lives in cli's helper modules or in the drivers, not in a command."""
    commands = _cli_commands()
    assert {"status", "report", "run", "replay", "promote"} <= commands
    bad = []
    for name in sorted(commands):
        path = EXECUTOR / "cli" / f"{name}.py"
        for target, line in imports_of(path, EXECUTOR, "deltawheel.executor"):
            other = target.removeprefix("deltawheel.executor.cli.").split(".")[0]
            if target.startswith("deltawheel.executor.cli.") and other in commands and other != name:
                bad.append(f"cli/{name}.py:{line} imports the command {other}")
    assert not bad, bad
