"""The wheel built from pyproject.toml carries every sub-package: build it, install it into a
fresh virtual environment, and import everything from there (not from this checkout)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# source folder -> the package it is installed as (pyproject.toml's package-dir)
FOLDERS = {"deltawheel": "deltawheel", "statestore": "deltawheel.statestore", "executor": "deltawheel.executor",
           "gc": "deltawheel.gc", "migrations": "deltawheel.migrations", "benchmarks": "deltawheel.benchmarks"}

_IMPORT_ALL = r"""
import importlib, json, pkgutil, sys
import deltawheel
out = {"root": deltawheel.__file__, "modules": {}, "failed": {}}
for top in ("deltawheel",):
    for info in pkgutil.walk_packages(deltawheel.__path__, "deltawheel."):
        if info.name.endswith(".__main__"):  # a command line: run below, not imported
            continue
        try:
            mod = importlib.import_module(info.name)
        except Exception as exc:  # reported, not raised: the test lists every failure at once
            out["failed"][info.name] = f"{type(exc).__name__}: {exc}"
        else:
            out["modules"][info.name] = mod.__file__
missing = [n for n in deltawheel.__all__ if getattr(deltawheel, n, None) is None]
out["missing_public"] = missing
print(json.dumps(out))
"""


def _source_packages() -> set[str]:
    found = set()
    for folder, dotted in FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((dotted, *rel)))
    return found


@pytest.mark.timeout(600)
def test_the_wheel_installs_into_a_fresh_venv_and_imports_everything(tmp_path: Path) -> None:
    # built from a copy of the sources: an in-tree build/ folder would carry files of earlier builds
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(src)], check=True, cwd=tmp_path)
    (wheel,) = dist.glob("deltawheel-*.whl")

    names = zipfile.ZipFile(wheel).namelist()
    in_wheel = {n[: -len("/__init__.py")].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert _source_packages() - in_wheel == set(), "sub-packages missing from the wheel (pyproject's packages)"
    assert "deltawheel/statestore/delta/ExclusiveLocalLogStore.java" in names
    assert "deltawheel/statestore/objectstore/ZkS3LogStore.java" in names
    assert "deltawheel/py.typed" in names

    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True)
    # the dependencies (pyspark, kazoo, ...) come from this environment, appended after the fresh
    # site-packages as a plain path: this checkout's editable install is not activated there
    fresh_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()
    (Path(fresh_site) / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    run = subprocess.run([str(py), "-c", _IMPORT_ALL], check=True, capture_output=True, text=True, cwd=tmp_path)
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["failed"] == {}
    assert got["missing_public"] == []
    assert got["root"].startswith(fresh_site)
    outside = {m: f for m, f in got["modules"].items() if not f.startswith(fresh_site)}
    assert outside == {}, "modules imported from outside the installed wheel"
    assert _source_packages() <= set(got["modules"]) | {"deltawheel"}
    assert "deltawheel/executor/cli/__main__.py" in names

    cli = subprocess.run([str(venv / "bin" / "deltawheel"), "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    for command in ("demo", "sql", "recover", "reseed", "gc", "bench", "migrate", "zk"):
        assert f"    {command} " in cli.stdout
    assert "    objectstore\n" in cli.stdout  # a long name: argparse puts its help on the next line
    module = subprocess.run([str(py), "-m", "deltawheel.executor.cli", "--help"], capture_output=True, text=True,
                            cwd=tmp_path)
    assert module.returncode == 0 and module.stdout == cli.stdout, module.stderr
