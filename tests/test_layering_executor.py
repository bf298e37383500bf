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
#: The rooms beside the executor, folders of the package root (deltawheel/<room>/).
ROOT = Path(__file__).resolve().parents[1] / "deltawheel"
ROOMS = ("servers", "demo", "chaos", "cli")

#: The floors, lowest first. ``<api>`` is the user API directly in executor/ (computation,
#: context, exceptions, session); ``testkit`` (the test harness of a user's computation) runs
#: computations with the tasks' key runner and sits with the tools. ``servers``, ``demo``,
#: ``chaos`` and ``cli`` are the rooms of deltawheel/ beside the executor: the local servers below
#: it (they import statestore only), the tools over it.
FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"servers"}),  # local server processes: ZooKeeper, S3Proxy, Kafka, a Spark cluster, hosts
    frozenset({"<api>"}),
    frozenset({"tasks"}),  # what runs inside Spark tasks
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
    if module.startswith(PACKAGE + ".") or module == PACKAGE:
        rest = module[len(PACKAGE) + 1:].split(".")
        if len(rest) == 1 and not (root / rest[0]).is_dir():
            return TOP_MODULES.get(rest[0], "<api>")
        return rest[0]
    return module.split(".")[1]  # deltawheel.<room>....


def _floor(sub: str) -> int:
    for n, floor in enumerate(FLOORS):
        if sub in floor:
            return n
    raise AssertionError(f"executor sub-package {sub!r} is on no floor: add it to FLOORS here and to "
                         "docs/architecture.md")


def _module_name(path: Path, root: Path = EXECUTOR) -> str:
    return module_name(path, root, PACKAGE)


def _executor_target(name: str, root: Path) -> str | None:
    """The executor sub-package (or API module floor) or room ``name`` lies in, None elsewhere."""
    parts = name.split(".")
    if len(parts) > 1 and parts[0] == "deltawheel" and parts[1] in ROOMS:
        return parts[1]
    if not name.startswith(PACKAGE + "."):
        return None
    first = name[len(PACKAGE) + 1:].split(".")[0]
    if (root / first).is_dir():
        return first
    return TOP_MODULES.get(first, "<api>")


def _modules(root: Path, rooms: Path) -> Iterator[tuple[Path, str, Iterator[tuple[str, int]]]]:
    """Every module of the executor (under ``root``) and of the rooms: its path, name and imports."""
    for path in sorted(root.rglob("*.py")):
        yield path, _module_name(path, root), imports_of(path, root, PACKAGE)
    for room in ROOMS:
        for path in sorted((rooms / room).rglob("*.py")):
            yield path, module_name(path, rooms, "deltawheel"), imports_of(path, rooms, "deltawheel")


def _violations(root: Path = EXECUTOR, rooms: Path = ROOT) -> list[str]:
    bad = []
    for _path, module, imports in _modules(root, rooms):
        if module == PACKAGE:
            continue
        sub = _sub_of(module, root)
        for target, line in imports:
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
        for target, line in imports_of(path, root, PACKAGE):
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


def test_the_check_sees_a_server_importing_the_executor(tmp_path: Path) -> None:
    """The local servers sit below the executor: a copy where one imports the drivers fails."""
    import shutil

    copy = tmp_path / "deltawheel"
    for room in ROOMS:
        shutil.copytree(ROOT / room, copy / room, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "servers" / "upward.py").write_text("from deltawheel.executor.drivers.engine import connect\n")
    bad = _violations(EXECUTOR, copy)
    assert any("servers.upward" in b and "drivers.engine" in b for b in bad), bad


@pytest.mark.parametrize("sub", sorted(set().union(*FLOORS) - {"<api>", "testkit"}))
def test_every_floor_named_is_a_package(sub: str) -> None:
    assert ((ROOT if sub in ROOMS else EXECUTOR) / sub / "__init__.py").is_file()


def _cli_commands() -> set[str]:
    """The command modules ``deltawheel``'s parser registers (cli/__init__.py's list)."""
    import ast

    tree = ast.parse((ROOT / "cli" / "__init__.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple):
            return {e.value for e in node.iter.elts if isinstance(e, ast.Constant)}
    raise AssertionError("cli/__init__.py lists no command modules")


def test_no_command_imports_another() -> None:
    """What two commands share lives in cli's helper modules or in the drivers, not in a command."""
    commands = _cli_commands()
    assert {"status", "servers", "run", "replay", "promote"} <= commands
    bad = []
    for name in sorted(commands):
        path = ROOT / "cli" / f"{name}.py"
        for target, line in imports_of(path, ROOT, "deltawheel"):
            other = target.removeprefix("deltawheel.cli.").split(".")[0]
            if target.startswith("deltawheel.cli.") and other in commands and other != name:
                bad.append(f"cli/{name}.py:{line} imports the command {other}")
    assert not bad, bad
