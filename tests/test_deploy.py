"""Shipping a deltawheel job the Spark way (the log store jars in the wheel: test_wheel.py): the options
``deltawheel submit-args`` prints, the environment ``deltawheel pack-env`` packs, and executors on
hosts that share nothing running from that archive only (docs/deploy.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from cluster_util import cli
from hosts_util import HOSTS_DATA

REPO = Path(__file__).resolve().parents[1]
ARCHIVE = REPO / "data" / "deploy-test" / "env.tar.gz"


def test_submit_args_name_the_jars_settings_and_archive() -> None:
    done = cli("submit-args", "--object-store", "--archive", "env.tar.gz", "--zk", "h1:2181,h2:2181",
               "--s3-endpoint", "http://s3:9000", "--s3-access-key", "ak", "--s3-secret-key", "sk", "--words")
    assert done.returncode == 0, done.stderr
    words = done.stdout.split("\n")
    opts = dict(zip(words[::2], words[1::2], strict=False))
    jars = opts["--jars"].split(",")
    names = [Path(j).name for j in jars]
    assert all(Path(j).exists() for j in jars)
    assert "delta-spark_4.2_2.13-4.4.0.jar" in names and "hadoop-aws-3.5.0.jar" in names
    # local, commit helper, s3a, checkpoint manager, upload interceptor, S3A with commit statuses
    assert sum(n.startswith("deltawheel-logstore-") for n in names) == 6
    assert opts["--archives"] == "env.tar.gz#environment"
    conf = dict(w.split("=", 1) for w in words[words.index("--conf") + 1::2] if "=" in w)
    assert conf["spark.pyspark.python"] == "./environment/bin/python"
    assert conf["spark.pyspark.driver.python"] == sys.executable
    assert conf["spark.delta.logStore.s3a.impl"] == "io.deltawheel.storage.ZkS3LogStore"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://s3:9000"
    assert conf["spark.hadoop.fs.s3a.audit.execution.interceptors"] == "io.deltawheel.storage.NoExpectContinue"
    assert conf["spark.hadoop.fs.s3a.impl"] == "io.deltawheel.storage.CommitStatusS3AFileSystem"
    assert conf["spark.hadoop.deltawheel.logstore.zk.connect"] == "h1:2181,h2:2181"
    # the shell form: one option a line
    shell = cli("submit-args", "--archive", "env.tar.gz", "--deploy-mode", "cluster")
    assert shell.stdout.splitlines()[1] == "--archives 'env.tar.gz#environment' \\"
    assert "spark.pyspark.driver.python" not in shell.stdout


def test_submit_args_refuses_an_unknown_deploy_mode() -> None:
    from deltawheel.executor.drivers.deploy import submit_args
    from deltawheel.statestore.exceptions import ConfigError

    with pytest.raises(ConfigError, match="deploy mode 'yarn': choose client or cluster"):
        submit_args(deploy_mode="yarn")


def pack(dest: Path) -> Path:
    """The packed environment (made once per checkout: it is reused while the wheel's sources are
    older than it)."""
    newest = max(p.stat().st_mtime for d in ("deltawheel", "statestore", "executor") for p in (REPO / d).rglob("*.py"))
    if dest.exists() and dest.stat().st_mtime > newest:
        return dest
    from deltawheel.servers.hosts import host_python

    done = cli("pack-env", "--python", str(host_python()), str(dest), timeout=1500)
    assert done.returncode == 0, done.stdout + done.stderr
    return dest


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_pack_env_archive_has_deltawheel_and_no_pyspark() -> None:
    archive = pack(ARCHIVE)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        python = tar.getmember("bin/python")
    assert any(re.fullmatch(r"lib/python3\.\d+/site-packages/deltawheel/__init__\.py", n) for n in names)
    assert any(n.startswith("lib/python3") and "/site-packages/deltawheel/statestore/lib/deltawheel-logstore-" in n
               for n in names)
    assert any("/site-packages/kazoo/" in n for n in names)
    assert not any("/site-packages/pyspark/" in n for n in names)
    assert any(n.endswith("bin/venv-activate") or n.endswith("bin/activate") for n in names)
    assert python.issym() or python.isfile()


def _submit(cluster: object, *, archive: Path | None) -> subprocess.CompletedProcess[str]:
    from deltawheel.executor.drivers.deploy import submit_args

    from deltawheel.servers.hosts import HostsCluster

    assert isinstance(cluster, HostsCluster)
    args = submit_args(archive=None if archive is None else str(archive)).argv()
    if archive is None:  # the cluster's own Python: pyspark alone
        args += ["--conf", f"spark.pyspark.python={cluster.spark_python}",
                 "--conf", f"spark.pyspark.driver.python={sys.executable}"]
    spark_submit = str(Path(sys.executable).parent / "spark-submit")
    cmd = [spark_submit, "--master", cluster.master_url, "--deploy-mode", "client",
           "--conf", "spark.executor.memory=512m", "--conf", "spark.task.maxFailures=1",
           *args, str(REPO / "tests" / "deploy_probe_job.py")]
    return cluster.on_client(cmd, capture_output=True, timeout=400)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_executors_on_other_hosts_run_from_the_archive_only(hosts_available: None) -> None:
    from deltawheel.servers.hosts import HostsCluster

    archive = pack(ARCHIVE)
    cluster = HostsCluster(HOSTS_DATA, services=("spark",))
    try:
        cluster.up()
        shipped = _submit(cluster, archive=archive)
        assert shipped.returncode == 0, shipped.stdout[-3000:] + shipped.stderr[-5000:]
        line = next(ln for ln in shipped.stdout.splitlines() if ln.startswith("PROBE "))
        rows = json.loads(line[len("PROBE "):])
        assert {r["host"] for r in rows} <= {"10.61.0.21", "10.61.0.22"}
        for r in rows:  # the executor's Python and deltawheel: the unpacked archive in its work folder
            assert re.search(r"\bwork/app-[^/]+/\d+/(\./)?environment/bin/python", r["executable"]), r
            assert re.search(r"/environment/lib/python3\.\d+/site-packages/deltawheel/__init__\.py$",
                             r["deltawheel"]), r
            assert not r["deltawheel"].startswith(str(REPO / "deltawheel"))
        without = _submit(cluster, archive=None)
        assert without.returncode != 0
        assert "ModuleNotFoundError: No module named 'deltawheel'" in without.stdout + without.stderr
    finally:
        _, left = cluster.down()
    assert left == []


def test_cluster_mode_bundles_jars_archive_and_a_launcher(tmp_path: Path) -> None:
    from deltawheel.executor.drivers.deploy import LAUNCHER, submit_args
    from deltawheel.statestore.exceptions import ConfigError

    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"not really an archive")
    job = REPO / "examples" / "clicks_job.py"
    with pytest.raises(ConfigError, match="cluster mode on a standalone cluster needs --job, --bundle"):
        submit_args(deploy_mode="cluster", archive=str(archive), job=job)
    bundle = tmp_path / "bundle"
    sa = submit_args(deploy_mode="cluster", archive=str(archive), job=job, bundle=bundle,
                     base_url="http://10.61.0.30:8000/", driver_python="/cluster/python")
    words = sa.argv()
    assert words[-6:] == ["--class", "org.apache.spark.deploy.PythonRunner", f"http://10.61.0.30:8000/{LAUNCHER}",
                          LAUNCHER, LAUNCHER, "clicks_job"]
    jars = words[words.index("--jars") + 1].split(",")
    assert all(j.startswith("http://10.61.0.30:8000/") and (bundle / j.rsplit("/", 1)[1]).exists() for j in jars)
    assert words[words.index("--archives") + 1] == "http://10.61.0.30:8000/env.tar.gz#environment"
    assert "spark.pyspark.driver.python=/cluster/python" in words
    with zipfile.ZipFile(bundle / LAUNCHER) as z:
        assert sorted(z.namelist()) == ["__main__.py", "clicks_job.py"]
        assert "runpy.run_module(job" in z.read("__main__.py").decode()
