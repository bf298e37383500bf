"""Deploying a deltawheel job the Spark way: ``spark-submit``'s options and a packed environment."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.objectstore.client import S3Endpoint
from deltawheel.statestore.session.sparkenv import (
    CHECKPOINT_FILE_MANAGER,
    LOG_STORE_CLASS,
    ensure_commit_jar,
    ensure_log_store_jar,
)

__all__ = ["SubmitArgs", "submit_args", "pack_environment", "ARCHIVE_ALIAS"]

#: The folder name the archive is unpacked as in each executor's working folder.
ARCHIVE_ALIAS = "environment"


@dataclass(frozen=True)
class SubmitArgs:
    """``spark-submit`` options: jars, settings and the archive, in order."""

    jars: tuple[Path | str, ...]
    conf: dict[str, str] = field(default_factory=dict)
    archive: str | None = None
    #: cluster mode: ``--class``, its value, the launcher's URL and PythonRunner's own arguments
    main: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The options as a list of words."""
        words = ["--jars", ",".join(str(j) for j in self.jars)]
        if self.archive is not None:
            words += ["--archives", f"{self.archive}#{ARCHIVE_ALIAS}"]
        for k, v in self.conf.items():
            words += ["--conf", f"{k}={v}"]
        return words + list(self.main)

    def lines(self) -> str:
        """The options one per line, shell-quoted, each line but the last ending in `` \\``."""
        words = self.argv()[: len(self.argv()) - len(self.main)]
        pairs = [f"{words[i]} {shlex.quote(words[i + 1])}" for i in range(0, len(words), 2)]
        if self.main:
            pairs += [f"{self.main[0]} {self.main[1]}", " ".join(shlex.quote(w) for w in self.main[2:])]
        return " \\\n".join(pairs)


def submit_args(*, object_store: bool = False, archive: str | None = None, deploy_mode: str = "client",
                driver_python: str | None = None, endpoint: S3Endpoint | None = None,
                zk: str | None = None, zk_chroot: str = "/deltawheel", job: Path | None = None,
                bundle: Path | None = None, base_url: str | None = None) -> SubmitArgs:
    """The ``spark-submit`` options a deltawheel job needs (jars fetched or built if missing).
    ``archive``: the packed environment, a path or URL (None: the cluster's Python); ``job``, ``bundle``,
    ``base_url``: cluster mode on a standalone cluster, files copied into ``bundle`` and served at
    ``base_url``. Raises ConfigError (bad deploy mode or cluster set-up) or JarFetchError."""
    from deltawheel.statestore.jars import ensure_delta_jars

    if deploy_mode not in ("client", "cluster"):
        raise ConfigError(f"deploy mode {deploy_mode!r}: choose client or cluster")
    jars = list(ensure_delta_jars(quiet=True))
    conf = {"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.sql.session.timeZone": "UTC",
            "spark.databricks.delta.allFilesInCrc.enabled": "false",
            "spark.sql.streaming.checkpointFileManagerClass": CHECKPOINT_FILE_MANAGER}
    local = ensure_log_store_jar(quiet=True)
    if local is not None:
        jars.append(local)
        conf["spark.delta.logStore.file.impl"] = LOG_STORE_CLASS
    commits = ensure_commit_jar(quiet=True)
    if commits is not None:
        jars.append(commits)
    if object_store:
        from deltawheel.statestore.objectstore import logstore, s3a

        ours = logstore.object_store_jars(quiet=True)
        if ours is None:
            raise ConfigError("object-store tables need deltawheel's s3a log store jar: install a wheel of "
                              "deltawheel (it carries the jar) or a JDK for javac")
        jars += [*s3a.ensure_s3a_jars(quiet=True), *ours]
        conf["spark.delta.logStore.s3a.impl"] = logstore.ZK_LOG_STORE_CLASS
        conf["spark.sql.streaming.checkpointFileManagerClass"] = logstore.DIRECT_CHECKPOINT_MANAGER_CLASS
        conf.update(logstore.S3A_CONF)
        if endpoint is not None:
            conf.update(s3a.spark_conf(endpoint))
        if zk is not None:
            settings = logstore.log_store_settings(zk, chroot=zk_chroot)
            conf.update({f"spark.hadoop.{k}": v for k, v in settings.items()})
    if archive is not None:
        conf["spark.pyspark.python"] = f"./{ARCHIVE_ALIAS}/bin/python"
        if deploy_mode == "client":  # the driver runs here, where the archive is not unpacked
            conf["spark.pyspark.driver.python"] = driver_python or sys.executable
    if deploy_mode == "client" or job is None and bundle is None and base_url is None:
        return SubmitArgs(tuple(jars), conf, archive)
    if job is None or bundle is None or base_url is None or driver_python is None or archive is None:
        raise ConfigError("cluster mode on a standalone cluster needs --job, --bundle, --base-url, --archive and "
                          "--driver-python (the cluster's Python with pyspark): Spark runs a Python driver there "
                          "only through its PythonRunner, from files the workers fetch over HTTP")
    conf["spark.pyspark.driver.python"] = driver_python
    return _bundled(SubmitArgs(tuple(jars), conf, archive), job=job, bundle=bundle, base_url=base_url.rstrip("/"))


_LAUNCHER_MAIN = """\
# deltawheel's launcher of a Python job in cluster mode: the session's start unpacks
# spark.archives, whose site-packages go on sys.path before the job module runs.
import glob, os, runpy, site, sys
from pyspark import SparkFiles
from pyspark.sql import SparkSession

SparkSession.builder.getOrCreate()
for folder in glob.glob(os.path.join(SparkFiles.getRootDirectory(), "environment", "lib", "python*", "site-packages")):
    site.addsitedir(folder)
job = sys.argv[1]
sys.argv = [job + ".py", *sys.argv[2:]]
runpy.run_module(job, run_name="__main__", alter_sys=True)
"""
LAUNCHER = "deltawheel-launch.jar"


def launcher(job: Path, dest: Path) -> Path:
    """A zip named ``.jar`` that puts the shipped environment on ``sys.path`` and runs ``job``."""
    import zipfile

    with zipfile.ZipFile(dest, "w") as z:
        z.writestr("__main__.py", _LAUNCHER_MAIN)
        z.write(job, job.name)
    return dest


def _bundled(sa: SubmitArgs, *, job: Path, bundle: Path, base_url: str) -> SubmitArgs:
    import shutil

    bundle.mkdir(parents=True, exist_ok=True)
    urls = []
    for j in sa.jars:
        jar = Path(j)
        if not (bundle / jar.name).exists() or (bundle / jar.name).stat().st_size != jar.stat().st_size:
            shutil.copy2(jar, bundle / jar.name)
        urls.append(f"{base_url}/{jar.name}")
    archive = Path(str(sa.archive))
    if not (bundle / archive.name).exists() or (bundle / archive.name).stat().st_mtime < archive.stat().st_mtime:
        shutil.copy2(archive, bundle / archive.name)
    launcher(job, bundle / LAUNCHER)
    return SubmitArgs(tuple(urls), sa.conf, f"{base_url}/{archive.name}",
                      main=("--class", "org.apache.spark.deploy.PythonRunner", f"{base_url}/{LAUNCHER}",
                            LAUNCHER, LAUNCHER, job.stem))


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise ConfigError(f"{what} failed: {' '.join(cmd)}\n{(done.stdout + done.stderr).strip()[-2000:]}")


def _copy_sources(root: Path, dest: Path) -> Path:
    """What the wheel is built from, copied (an in-tree ``build/`` would add files of older builds)."""
    import shutil
    import tomllib

    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(root / name, dest / name)
    with open(root / "pyproject.toml", "rb") as f:
        folders = set(tomllib.load(f)["tool"]["setuptools"]["package-dir"].values())
    for folder in sorted(folders):
        shutil.copytree(root / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def pack_environment(dest: Path, *, python: str | None = None, wheel: Path | None = None,
                     extra: tuple[str, ...] = (), keep_pyspark: bool = False) -> Path:
    """Pack a virtual environment with deltawheel and ``extra`` into ``dest`` (.tar.gz), kept if up to
    date; ``python`` must exist at the same path on the cluster's hosts. Raises ConfigError."""
    try:
        import venv_pack
    except ImportError as exc:
        raise ConfigError("packing needs venv-pack: pip install 'deltawheel[deploy]' (or venv-pack)") from exc
    started = time.monotonic()
    stamp = dest.with_name(dest.name + ".json")
    want = json.dumps({"python": python, "wheel": str(wheel), "extra": list(extra), "keep_pyspark": keep_pyspark})
    import deltawheel

    tree = Path(deltawheel.__file__).resolve().parents[1]  # deltawheel's source tree, when it runs from one
    root = tree if (tree / "pyproject.toml").exists() and (tree / "setup.py").exists() else None
    if wheel is None and root is not None and dest.exists() and stamp.exists() and stamp.read_text() == want:
        newest = max(p.stat().st_mtime for folder in ("deltawheel", "statestore", "executor", "gc", "migrations")
                     for p in (root / folder).rglob("*") if p.suffix in (".py", ".java", ".pyi"))
        if dest.stat().st_mtime > max(newest, (root / "pyproject.toml").stat().st_mtime):
            print(f"deltawheel: {dest} is up to date (newer than the sources it was packed from)", file=sys.stderr)
            return dest
    base = str(python or getattr(sys, "_base_executable", None) or sys.executable)
    with tempfile.TemporaryDirectory(prefix="deltawheel-pack-") as tmp:
        if wheel is None:
            if root is None:
                raise ConfigError("no wheel of deltawheel given (--wheel) and no source tree to build one from")
            _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps", "-w", tmp,
                  str(_copy_sources(root, Path(tmp) / "src"))], "building deltawheel's wheel")
            wheel = next(Path(tmp).glob("deltawheel-*.whl"))
        env = Path(tmp) / "env"
        _run([base, "-m", "venv", str(env)], "making the environment")
        pip = [str(env / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        _run([*pip, "install", "--quiet", str(wheel), *extra], "installing deltawheel into the environment")
        if not keep_pyspark:
            _run([*pip, "uninstall", "--quiet", "-y", "pyspark"], "removing pyspark from the environment")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        venv_pack.pack(prefix=str(env), output=str(dest), compress_level=1)
        stamp.write_text(want)
    print(f"deltawheel: packed {dest} ({os.path.getsize(dest) / 2**20:.0f} MiB) in "
          f"{time.monotonic() - started:.0f}s", file=sys.stderr)
    return dest
