"""No import circle anywhere in the library: every module of statestore, the executor, gc, the
migrations, the package root's rooms and the benchmarks, with lazy imports inside functions and
``if TYPE_CHECKING:`` blocks counted (a circle there is still a circle of the design)."""

from __future__ import annotations

from pathlib import Path

from import_graph import circles, imports_of, module_name

REPO = Path(__file__).resolve().parents[1]
#: top folder -> its installed package (pyproject's package-dir)
TOPS = {"statestore": "deltawheel.statestore", "executor": "deltawheel.executor", "gc": "deltawheel.gc",
        "migrations": "deltawheel.migrations", "benchmarks": "deltawheel.benchmarks", "deltawheel": "deltawheel"}


def _edges(repo: Path = REPO) -> dict[str, set[str]]:
    """module -> the library modules it imports (``pkg.mod.Name`` counted as ``pkg.mod``; a module's
    own enclosing packages left out: importing them is not a circle of design)."""
    deps: dict[str, set[str]] = {}
    for top, package in TOPS.items():
        for path in sorted((repo / top).rglob("*.py")):
            deps[module_name(path, repo / top, package)] = {t for t, _ in imports_of(path, repo / top, package)}
    edges: dict[str, set[str]] = {}
    for module, targets in deps.items():
        out = set()
        for name in targets:
            while name and name not in deps:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                out.add(name)
        edges[module] = out
    return edges


def test_no_import_circle_in_the_library() -> None:
    found = circles(_edges())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_check_sees_a_circle_through_a_lazy_import(tmp_path: Path) -> None:
    """A copy of the benchmarks where the workload imports the throughput run inside a function."""
    import shutil

    for top in TOPS:
        (tmp_path / top).mkdir()
    shutil.copytree(REPO / "benchmarks", tmp_path / "benchmarks", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "benchmarks" / "workload.py", "a") as f:
        f.write("\n\ndef _lazy():\n    from .throughput import run_throughput\n    return run_throughput\n")
    found = circles(_edges(tmp_path))
    assert any("deltawheel.benchmarks.workload" in c and "deltawheel.benchmarks.throughput" in c
               for c in found), found
