"""Reading a package's imports with ``ast``, for the floor tests (test_layering*.py)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path


def module_name(path: Path, root: Path, package: str) -> str:
    """The dotted name of ``path``, a module under ``root`` (the folder installed as ``package``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


def imports_of(path: Path, root: Path, package: str) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in ``path`` -- inside functions and ``if
    TYPE_CHECKING:`` blocks too -- relative ones made absolute; ``from X import y`` gives ``X``
    and ``X.y`` (``y`` may be a module)."""
    name = module_name(path, root, package)
    here = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield target, node.lineno
            for alias in node.names:
                yield f"{target}.{alias.name}", node.lineno


def circles(edges: dict[str, set[str]] | dict[str, dict[str, int]]) -> list[list[str]]:
    """Every import circle of ``edges`` (module -> the modules it imports), each as a path back to its start."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for dep in sorted(edges.get(m, ())):
            if state.get(dep) == 1:
                found.append([*path[path.index(dep):], dep])
            elif dep not in state:
                visit(dep)
        path.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return found
