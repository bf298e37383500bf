"""statestore's floors: what each sub-package may import (the package docstring of statestore).

Every import of every statestore module is read with ``ast`` -- lazy ones inside functions and
``if TYPE_CHECKING:`` blocks too, they are imports all the same -- and checked against three
rules: nothing in statestore imports the executor, the migrations or the benchmarks; the
statestore modules import each other without a circle; and a sub-package imports only from
floors below its own (or from itself), never from a higher floor or a sibling on its floor.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from import_graph import circles, imports_of, module_name

STATESTORE = Path(__file__).resolve().parents[1] / "statestore"
PACKAGE = "deltawheel.statestore"

#: The floors, lowest first. A module directly in statestore/ is on the ground floor; a
#: sub-package is on the floor that names it. A module may import from its own sub-package and
#: from any lower floor; sub-packages on one floor do not import each other.
FLOORS: tuple[frozenset[str], ...] = (
    # the modules directly in statestore/: exceptions, clock, config, codecs, layout, process,
    # jars, sqltext, comments
    frozenset({"<ground>"}),
    frozenset({"delta", "zk"}),  # Delta at the protocol level; ZooKeeper coordination
    frozenset({"rowtable", "objectstore"}),  # the rows table on Delta; S3 through s3a:// (the JVM seam)
    frozenset({"ownership"}),  # lease -> fence -> recovery: zk and rowtable together
    frozenset({"writepath"}),  # the write paths, through an interval owner
    frozenset({"inspection"}),  # read-only SQL views, the damage check: over every table the writers write
    frozenset({"surgery"}),  # a tool's fenced replacing write under the leases (promote, repair), the audit table
    frozenset({"session"}),  # building and checking a SparkSession: jars, connectors, log stores, Java
)

#: Imports of the layers above statestore that are still there, each with the change that ends it.
KNOWN_EXCEPTIONS: frozenset[tuple[str, str]] = frozenset()


def _above_statestore(name: str) -> bool:
    """``name`` is deltawheel's but not statestore's: the executor, migrations, gc, benchmarks, the root."""
    return (name == "deltawheel" or name.startswith("deltawheel.")) and not (
        name == PACKAGE or name.startswith(PACKAGE + "."))


def _module_name(path: Path) -> str:
    return module_name(path, STATESTORE, PACKAGE)


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    return imports_of(path, STATESTORE, PACKAGE)


def _graph() -> dict[str, dict[str, int]]:
    """statestore module -> {imported deltawheel name: first line}."""
    graph: dict[str, dict[str, int]] = {}
    for path in sorted(STATESTORE.rglob("*.py")):
        deps: dict[str, int] = {}
        for target, line in _imports(path):
            if target.startswith("deltawheel"):
                deps.setdefault(target, line)
        graph[_module_name(path)] = deps
    return graph


def _floor_of(module: str) -> tuple[int, str]:
    """(floor, sub-package) of a statestore module (``<ground>`` for a top-level one)."""
    rest = module[len(PACKAGE) + 1:].split(".") if module != PACKAGE else []
    sub = rest[0] if len(rest) > 1 else "<ground>"
    for n, floor in enumerate(FLOORS):
        if sub in floor:
            return n, sub
    raise AssertionError(f"{module}: sub-package {sub!r} is on no floor; add it to FLOORS and to the "
                         "floors in statestore/__init__.py")


def _statestore_module(name: str, graph: dict[str, dict[str, int]]) -> str | None:
    """The statestore module ``name`` is, or is in (``pkg.mod.Name`` -> ``pkg.mod``)."""
    while name.startswith(PACKAGE):
        if name in graph:
            return name
        name = name.rsplit(".", 1)[0]
    return None


def _edges() -> dict[str, dict[str, int]]:
    """statestore module -> {statestore module it imports: line}."""
    graph = _graph()
    edges: dict[str, dict[str, int]] = {}
    for module, deps in graph.items():
        out: dict[str, int] = {}
        for target, line in deps.items():
            dep = _statestore_module(target, graph)
            if dep is not None and dep != module and not module.startswith(dep + "."):
                out.setdefault(dep, line)
        edges[module] = out
    return edges


def test_the_graph_sees_lazy_imports() -> None:
    """A function's own import counts (today's s3a imports ConfigError inside a function)."""
    deps = _graph()[f"{PACKAGE}.objectstore.s3a"]
    assert f"{PACKAGE}.exceptions.ConfigError" in deps


def test_nothing_in_statestore_imports_the_layers_above_it() -> None:
    """Not the executor, the migrations, gc, the benchmarks, nor the package root."""
    bad = sorted(f"{m} (line {line}) imports {t}" for m, deps in _graph().items() for t, line in deps.items()
                 if _above_statestore(t) and (m, t) not in KNOWN_EXCEPTIONS
                 and (m, t.rsplit(".", 1)[0]) not in KNOWN_EXCEPTIONS)
    assert not bad, "\n".join(bad)


def test_nothing_in_statestore_names_a_module_above_it() -> None:
    """A module named in a string (a Spark setting, ``importlib``) is an import too: the executor
    passes its own (the Python worker daemon: ``SparkSettings.python_daemon``)."""
    # the packages above statestore (pyproject's package-dir) and the modules of the package root
    above = {"executor", "migrations", "gc", "benchmarks"} | {
        p.stem for p in (STATESTORE.parent / "deltawheel").iterdir() if p.suffix == ".py" or p.is_dir()}
    named = re.compile(r"deltawheel\.(\w+)(\.\w+)*")
    bad = []
    for path in sorted(STATESTORE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                    and (m := named.fullmatch(node.value)) and m.group(1) in above - {"__init__"}):
                bad.append(f"{_module_name(path)} line {node.lineno}: {node.value!r}")
    assert not bad, "\n".join(bad)


def test_no_import_circle_among_statestore_modules() -> None:
    found = circles(_edges())
    short = [" -> ".join(x.removeprefix(PACKAGE + ".") for x in c) for c in found]
    assert not found, "import circles:\n" + "\n".join(short)


def test_every_import_goes_down_the_floors() -> None:
    up: list[str] = []
    for module, deps in _edges().items():
        floor, sub = _floor_of(module)
        for dep, line in deps.items():
            dep_floor, dep_sub = _floor_of(dep)
            if dep_sub != sub and dep_floor >= floor:
                up.append(f"{module.removeprefix(PACKAGE + '.')} (floor {floor}) line {line} imports "
                          f"{dep.removeprefix(PACKAGE + '.')} (floor {dep_floor})")
    assert not up, "\n".join(sorted(up))


@pytest.mark.parametrize("sub", sorted(set().union(*FLOORS) - {"<ground>"}))
def test_every_floor_named_is_a_package(sub: str) -> None:
    assert (STATESTORE / sub / "__init__.py").is_file()


@pytest.mark.parametrize("top", ["statestore", "executor", "gc", "migrations", "deltawheel"])
def test_no_relative_import_climbs_out_of_its_top_folder(top: str) -> None:
    """A relative import stays inside its top folder: pytest's doctest collector imports each
    top folder as a package of its own, where ``from ...statestore`` from the executor fails."""
    root = Path(__file__).resolve().parents[1] / top
    bad = []
    for path in sorted(root.rglob("*.py")):
        depth = len(path.relative_to(root).parts) - 1  # folders below the top folder
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level and node.level - 1 > depth:
                bad.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert not bad, f"relative imports that leave {top}/ (use deltawheel.<folder>...): {bad}"
