"""The package root: what a user writes, each name importable, and the type stub equal to it."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import deltawheel

STUB = Path(deltawheel.__file__).with_name("__init__.pyi")


def test_the_root_is_kept_to_what_a_user_writes() -> None:
    names = set(deltawheel.__all__)
    assert 50 <= len(names) <= 75, len(names)
    for user_name in ("Computation", "windowed", "connect", "Engine", "Pipeline", "ParquetInjector",
                      "spark_session", "DeltaWheelError", "LeaseLostError", "UserCodeError"):
        assert user_name in names
    for wiring in ("LeaseManager", "RowStore", "IntervalOwner", "WatermarkAuthority", "ComputationExecutor",
                   "PipelineRunner", "EmbeddedZooKeeper", "LocalCluster", "KafkaBroker", "S3ProxyServer"):
        assert wiring not in names, f"{wiring} is wiring or a local server: import it from its module"


def test_every_root_name_resolves_to_its_module_s_object() -> None:
    for name, where in deltawheel._EXPORTS.items():
        module, _, defined = where.partition(":")
        assert getattr(deltawheel, name) is getattr(importlib.import_module(module), defined or name), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'deltawheel' has no attribute 'LeaseManagr'"):
        deltawheel.LeaseManagr  # noqa: B018


def test_a_name_that_left_the_root_imports_for_one_release_with_a_warning_naming_its_module() -> None:
    """A user's ``from deltawheel import PipelineRunner`` (or ``StoreLayout``) written before the
    root was narrowed still runs, and the warning says what to write instead."""
    from deltawheel.executor.drivers.runner import PipelineRunner as Runner
    from deltawheel.statestore.layout import StoreLayout as Layout

    with pytest.warns(DeprecationWarning, match=r"^deltawheel.PipelineRunner left the package root; write "
                                                r"'from deltawheel.executor.drivers.runner import PipelineRunner'"):
        from deltawheel import PipelineRunner
    with pytest.warns(DeprecationWarning, match=r"write 'from deltawheel.statestore.layout import StoreLayout'"):
        from deltawheel import StoreLayout
    assert PipelineRunner is Runner and StoreLayout is Layout
    with pytest.warns(DeprecationWarning, match=r"write 'from deltawheel.statestore.zk.client import connect as "
                                                r"connect_zk'"):
        from deltawheel import connect_zk
    assert connect_zk is importlib.import_module("deltawheel.statestore.zk.client").connect


@pytest.mark.parametrize("name", sorted(deltawheel._MOVED))
def test_every_name_that_left_the_root_still_resolves_with_a_warning(name: str) -> None:
    module, _, defined = deltawheel._MOVED[name].partition(":")
    with pytest.warns(DeprecationWarning, match=rf"^deltawheel.{name} left the package root; write 'from {module} "):
        value = getattr(deltawheel, name)
    assert value is getattr(importlib.import_module(module), defined or name)
    with pytest.warns(DeprecationWarning):  # every use warns, not only the first (the name is not cached)
        getattr(deltawheel, name)


def test_the_names_that_left_are_every_name_of_the_root_before_and_in_no_listing() -> None:
    """The root held 106 names before it was narrowed (commit 08d130a); every one is a root name
    or a moved one. Moved names are in neither ``__all__``, ``dir()`` nor the stub."""
    moved = set(deltawheel._MOVED)
    assert len(moved) == 37 and moved.isdisjoint(deltawheel._EXPORTS)
    assert len(moved) + len(deltawheel._EXPORTS) == 106
    assert {"PipelineRunner", "StoreLayout", "ComputationExecutor", "LeaseManager"} <= moved
    assert moved.isdisjoint(deltawheel.__all__) and moved.isdisjoint(dir(deltawheel))
    assert not any(f" as {name}," in deltawheel._stub_text() for name in moved)


def test_the_changes_page_lists_every_name_that_left_with_its_module() -> None:
    section = (Path(__file__).resolve().parents[1] / "docs" / "changes.md").read_text()
    listed = {}
    for module, names in re.findall(r"^\| `([\w.]+)` \| (.*) \|$", section, flags=re.M):
        for name, defined in re.findall(r"`(\w+)`(?: \(`(\w+)` there\))?", names):
            listed[name] = f"{module}:{defined}" if defined else module
    assert listed == deltawheel._MOVED


def test_the_stub_is_generated_from_the_export_table() -> None:
    assert STUB.read_text() == deltawheel._stub_text(), (
        "deltawheel/__init__.pyi is stale: regenerate it with "
        "python -c \"import deltawheel; print(deltawheel._stub_text(), end='')\" > deltawheel/__init__.pyi")
    tree = ast.parse(STUB.read_text())
    stubbed = {a.asname for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert stubbed == set(deltawheel.__all__)


def test_importing_the_root_imports_no_engine_module() -> None:
    """Names load on first use: a Spark task importing ``deltawheel`` pays for nothing else."""
    code = ("import sys, deltawheel; print(sorted(m for m in sys.modules if m.startswith('deltawheel.')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]", out
