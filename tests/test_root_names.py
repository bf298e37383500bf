"""The package root: what a user writes, each name importable, and the type stub equal to it."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

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
    try:
        deltawheel.LeaseManager  # noqa: B018
    except AttributeError as exc:
        assert "no attribute 'LeaseManager'" in str(exc)
    else:
        raise AssertionError("LeaseManager is not a root name any more")


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
