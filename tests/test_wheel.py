"""The wheel built from pyproject.toml carries every sub-package: build it, install it into a
fresh virtual environment, and import everything from there (not from this checkout)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from conftest import free_port

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


def _no_checkout_path() -> dict[str, str]:
    """This process's environment without ``PYTHONPATH``: a command run in this process (``run``,
    ``replay --source``) puts a module's folder there for Spark's workers, and pip would then take
    the checkout for an installed deltawheel."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel of this checkout, built from a copy of its sources (an in-tree build/ folder would
    carry files of earlier builds)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(src)], check=True, cwd=tmp_path, env=_no_checkout_path())
    (wheel,) = dist.glob("deltawheel-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout, built once for this module's tests."""
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.mark.timeout(600)
def test_the_wheel_installs_into_a_fresh_venv_and_imports_everything(tmp_path: Path, wheel: Path) -> None:

    names = zipfile.ZipFile(wheel).namelist()
    in_wheel = {n[: -len("/__init__.py")].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert _source_packages() - in_wheel == set(), "sub-packages missing from the wheel (pyproject's packages)"
    assert "deltawheel/statestore/session/ExclusiveLocalLogStore.java" in names
    assert "deltawheel/statestore/objectstore/ZkS3LogStore.java" in names
    assert "deltawheel/py.typed" in names
    assert "deltawheel/__init__.pyi" in names

    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    clean = _no_checkout_path()
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, env=clean)
    # the dependencies (pyspark, kazoo, ...) come from this environment, appended after the fresh
    # site-packages as a plain path: this checkout's editable install is not activated there
    fresh_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()
    (Path(fresh_site) / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    run = subprocess.run([str(py), "-c", _IMPORT_ALL], check=True, capture_output=True, text=True, cwd=tmp_path,
                         env=clean)
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["failed"] == {}
    assert got["missing_public"] == []
    assert got["root"].startswith(fresh_site)
    outside = {m: f for m, f in got["modules"].items() if not f.startswith(fresh_site)}
    assert outside == {}, "modules imported from outside the installed wheel"
    assert _source_packages() <= set(got["modules"]) | {"deltawheel"}
    assert "deltawheel/cli/__main__.py" in names

    cli = subprocess.run([str(venv / "bin" / "deltawheel"), "--help"], capture_output=True, text=True, cwd=tmp_path,
                         env=clean)
    assert cli.returncode == 0, cli.stderr
    listed = {line.split()[0] for line in cli.stdout.splitlines() if line.startswith("    ") and line.split()}
    assert {"demo", "status", "report", "sql", "recover", "reseed", "gc", "bench", "migrate", "zk", "objectstore",
            "cluster", "setup"} <= listed, cli.stdout
    module = subprocess.run([str(py), "-m", "deltawheel.cli", "--help"], capture_output=True, text=True,
                            cwd=tmp_path, env=clean)
    assert module.returncode == 0 and module.stdout == cli.stdout, module.stderr


def _user_env(jars: Path) -> dict[str, str]:
    """A user's environment: nothing of this checkout or its virtual environment (no PYTHONPATH,
    PYSPARK_PYTHON, DELTAWHEEL_* settings), ``java`` on PATH, and a jars cache of its own."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DELTAWHEEL_", "PYSPARK_", "PYTHON", "VIRTUAL_ENV", "PYTEST_"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if str(REPO) not in p)
    env["DELTAWHEEL_JARS_DIR"] = str(jars)  # empty: the first use fetches and compiles into it
    return env


def _delta_rows(table: Path) -> list[dict[str, object]]:
    from deltalake import DeltaTable

    return list(DeltaTable(str(table)).to_pyarrow_table().to_pylist())


@pytest.mark.slow
@pytest.mark.zk
@pytest.mark.timeout(3000)
def test_the_installed_wheel_runs_the_demo_and_an_embedded_job_outside_the_repository(tmp_path: Path,
                                                                                       zk_server: object) -> None:
    """``pip install`` of the built wheel into a fresh virtual environment outside the checkout (its
    dependencies from PyPI, or pip's cache), then from a folder of its own: ``deltawheel demo`` with
    nothing else (the Delta jars fetched into the empty cache with a progress line, deltawheel's
    own jars taken from the wheel, nothing compiled) ends with the demo's rows, and the README's
    embedding snippet runs there as written."""
    import re

    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "user-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], check=True, timeout=1800)
    home = tmp_path / "work"
    home.mkdir()
    env = _user_env(tmp_path / "jars")
    assert not str(venv).startswith(str(REPO)) and not str(home).startswith(str(REPO))

    port = free_port()
    demo = subprocess.run([str(venv / "bin" / "deltawheel"), "demo", "--zk", f"127.0.0.1:{port}"], cwd=home, env=env,
                          capture_output=True, text=True, timeout=1500)
    print(demo.stdout[-2500:])
    print(demo.stderr[-1500:])
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "first use: fetching 7 Delta Lake 4.4.0 jars from Maven Central" in demo.stderr
    assert "compiling" not in demo.stderr  # the wheel carries the compiled jars (docs/deploy.md)
    assert not list((tmp_path / "jars").glob("deltawheel-logstore-*.jar"))
    out = demo.stdout
    assert "records read by window_counter : 20000\n" in out
    panes = int(re.search(r"window panes \(window_counts\)\s+: (\d+)", out).group(1))  # type: ignore[union-attr]
    store = home / "data" / "demo"
    assert panes > 0 and len(_delta_rows(store / "streams" / "window_counts")) == panes
    anomalies = [json.loads(bytes(r["value"])) for r in _delta_rows(store / "streams" / "anomalies")]  # type: ignore[arg-type]
    # the planted spike (query rank 5) and dip (rank 0, absent during the dip) are found
    from deltawheel.demo.zeitgeist import AnomalySchedule, query_name

    found = {(a["kind"], a["query"]) for a in anomalies}
    assert {("spike", query_name(AnomalySchedule.spike_rank)), ("dip", query_name(AnomalySchedule.dip_rank))} <= found
    assert re.search(rf"^anomalies\s+: {len(anomalies)}$", out, flags=re.M)

    # the README's computation and embedding snippet, as a user's script in that environment
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    counter = next(b for b in blocks if "class BucketCounter(Computation)" in b)
    snippet = next(b for b in blocks if b.startswith("import deltawheel\n"))
    snippet = re.sub(r"^STORE, ZK = .*$", f"STORE, ZK = 'data/buckets', {zk_server.hosts!r}",  # type: ignore[attr-defined]
                     snippet, flags=re.M)
    import pyarrow as pa
    import pyarrow.parquet as pq

    (home / "data" / "events").mkdir(parents=True)
    rows = [{"q": f"k{i % 3}", "ts": i * 1_000} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(rows), home / "data" / "events" / "part-0.parquet")
    (home / "job.py").write_text(counter + "\n" + snippet, encoding="utf-8")
    job = subprocess.run([str(venv / "bin" / "python"), "job.py"], cwd=home, env=env, capture_output=True, text=True,
                         timeout=900)
    assert job.returncode == 0, job.stderr[-3000:]
    got = {(r["key"], json.loads(bytes(r["value"]))["start"]): json.loads(bytes(r["value"]))["n"]  # type: ignore[arg-type]
           for r in _delta_rows(home / "data" / "buckets" / "streams" / "counts")}
    want: dict[tuple[str, int], int] = {}
    for r in rows:
        k = (str(r["q"]), int(r["ts"]) - int(r["ts"]) % 10_000)
        want[k] = want.get(k, 0) + 1
    assert got == want


@pytest.mark.timeout(600)
def test_wheel_carries_the_log_store_jars(wheel: Path) -> None:
    """The log store jars are compiled into the wheel (deploy.md: an installed wheel compiles nothing)."""
    from deltawheel.statestore.jars import compile_jar
    from deltawheel.statestore.objectstore.logstore import ensure_commit_status_fs_jar, ensure_interceptor_jar

    with zipfile.ZipFile(wheel) as z:
        inside = [n for n in z.namelist() if n.startswith("deltawheel/statestore/lib/")]
        one = zipfile.ZipFile(io.BytesIO(z.read(inside[0])))
    # the names compile_jar looks for: the same digests as the jars it compiles itself
    sources = ("statestore/session/ExclusiveLocalLogStore.java", "statestore/objectstore/ZkS3LogStore.java",
               "statestore/objectstore/DirectCheckpointFileManager.java", "statestore/delta/TxnCommit.java")
    want = set()
    # the last two: against the SDK and S3A
    for jar in [*(compile_jar(REPO / s) for s in sources), ensure_interceptor_jar(), ensure_commit_status_fs_jar()]:
        assert jar is not None
        want.add(jar.name)
    assert {Path(n).name for n in inside} == want
    assert one.namelist() and all(n.endswith(".class") for n in one.namelist())
