"""Kubernetes and YARN on paper (docs/deploy.md, "Kubernetes" and "YARN / EMR"): the files in
deploy/ parsed and held to the tested ``spark-submit`` line. Nothing here runs a container, a pod
or a cluster: the SparkApplication's settings are compared with what ``submit_args`` builds for
the same options, the Dockerfile's instructions with pyproject's pins, the ZooKeeper manifest with
the connect string the job is given."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "deploy" / "kubernetes"
DOCKERFILE = K8S / "Dockerfile"
SPARKAPP = K8S / "sparkapplication.yaml"
ZOOKEEPER = K8S / "zookeeper.yaml"
YARN = REPO / "deploy" / "yarn" / "README.md"
DEPLOY_DOC = REPO / "docs" / "deploy.md"
ENV_REF = re.compile(r"^\$\{env\.([A-Za-z_][A-Za-z0-9_]*)\}$")


def _pyproject() -> dict[str, Any]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _pin(name: str) -> str:
    for dep in _pyproject()["project"]["dependencies"]:
        m = re.fullmatch(rf"{re.escape(name)}==([0-9][^;\s]*)", dep.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"pyproject.toml pins no {name}")


def _dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, arguments), continuations joined, comments out."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        words = (pending + line).split(None, 1)
        pending = ""
        out.append((words[0].upper(), words[1] if len(words) > 1 else ""))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def _instructions(kind: str) -> list[str]:
    return [args for ins, args in _dockerfile() if ins == kind]


def _sparkapp() -> dict[str, Any]:
    doc = yaml.safe_load(SPARKAPP.read_text())
    assert isinstance(doc, dict)
    return doc


def _zookeeper() -> dict[str, dict[str, Any]]:
    """The ZooKeeper manifest's objects by kind."""
    return {d["kind"]: d for d in yaml.safe_load_all(ZOOKEEPER.read_text()) if d}


def _job_args() -> dict[str, str]:
    args = [str(a) for a in _sparkapp()["spec"]["arguments"]]
    assert args[0] == "run", "the SparkApplication runs the clicks job's `run`"
    rest = args[1:]
    assert len(rest) % 2 == 0 and all(k.startswith("--") for k in rest[::2]), rest
    return dict(zip(rest[::2], rest[1::2], strict=True))


def _args_value(name: str, args: str) -> str:
    """The value of ARG ``name`` (``ARG NAME=value``)."""
    key, _, value = args.partition("=")
    assert key == name
    return value.strip().strip('"')


def test_sparkapplication_is_the_operators_cluster_mode_python_job() -> None:
    app = _sparkapp()
    spec = app["spec"]
    assert app["apiVersion"] == "sparkoperator.k8s.io/v1beta2"
    assert app["kind"] == "SparkApplication"
    assert spec["type"] == "Python" and spec["mode"] == "cluster"
    assert spec["sparkVersion"] == _pin("pyspark")
    # the image built from the Dockerfile, tagged with deltawheel's version
    image, _, tag = spec["image"].rpartition(":")
    assert image and tag == _pyproject()["project"]["version"]
    # --supervise's counterpart
    policy = spec["restartPolicy"]
    assert policy["type"] == "OnFailure" and policy["onFailureRetries"] >= 1
    assert policy["onSubmissionFailureRetries"] >= 1
    for role in ("driver", "executor"):
        assert spec[role]["cores"] >= 1 and re.fullmatch(r"\d+[mg]", spec[role]["memory"]), role
    assert spec["executor"]["instances"] >= 1
    assert spec["executor"]["memory"] == "1g"  # the tested line's spark.executor.memory=1g
    assert spec["driver"]["serviceAccount"]
    args = _job_args()
    assert {"--store", "--input", "--zk", "--zk-chroot"} <= args.keys()
    assert args["--store"].startswith("s3a://") and args["--input"].startswith("s3a://")
    # the job file is the one the image carries
    main = spec["mainApplicationFile"]
    assert main.startswith("local:///")
    copied = {shlex.split(a)[-1]: shlex.split(a)[:-1] for a in _instructions("COPY")}
    assert copied.get(main.removeprefix("local://")) == ["examples/clicks_job.py"]


def test_sparkconf_holds_every_setting_submit_args_prints_for_the_same_options() -> None:
    from deltawheel.executor.drivers.deploy import submit_args
    from deltawheel.statestore.objectstore.client import S3Endpoint

    conf = {k: str(v) for k, v in _sparkapp()["spec"]["sparkConf"].items()}
    args = _job_args()
    endpoint = S3Endpoint(url=conf["spark.hadoop.fs.s3a.endpoint"],
                          access_key=conf["spark.hadoop.fs.s3a.access.key"],
                          secret_key=conf["spark.hadoop.fs.s3a.secret.key"])
    want = submit_args(object_store=True, deploy_mode="cluster", endpoint=endpoint, zk=args["--zk"],
                       zk_chroot=args["--zk-chroot"]).conf
    assert want, "submit_args printed no settings"
    missing = {k: v for k, v in want.items() if k not in conf}
    differ = {k: (conf[k], v) for k, v in want.items() if k in conf and conf[k] != v}
    assert not missing, f"sparkConf lacks what submit-args prints: {missing}"
    assert not differ, f"sparkConf differs from submit-args (manifest, submit-args): {differ}"
    # the log store's ZooKeeper is the job's
    assert conf["spark.hadoop.deltawheel.logstore.zk.connect"] == args["--zk"]


def test_object_store_keys_come_from_a_secret_into_driver_and_executors() -> None:
    conf = {k: str(v) for k, v in _sparkapp()["spec"]["sparkConf"].items()}
    for key in ("spark.hadoop.fs.s3a.access.key", "spark.hadoop.fs.s3a.secret.key"):
        m = ENV_REF.match(conf[key])
        assert m, f"{key} must name an environment variable (${{env.NAME}}), not hold a key: {conf[key]!r}"
        for role in ("driver", "executor"):
            ref = conf.get(f"spark.kubernetes.{role}.secretKeyRef.{m.group(1)}", "")
            assert re.fullmatch(r"[a-z0-9][-a-z0-9.]*:[-._a-zA-Z0-9]+", ref), \
                f"the {role} gets no {m.group(1)} from a Secret (secretKeyRef NAME=secret:key): {ref!r}"
    # no other setting looks like a literal secret
    for k, v in conf.items():
        if re.search(r"(secret|password|token|access\.key)$", k, re.I):
            assert ENV_REF.match(v), f"{k} holds a literal value"


def test_dockerfile_builds_the_job_image_from_the_pinned_spark_image() -> None:
    instructions = _dockerfile()
    froms = _instructions("FROM")
    assert len(froms) == 1, froms
    m = re.fullmatch(r"apache/spark:(\d+\.\d+\.\d+)-scala2\.13-java(17|21)-python3-ubuntu", froms[0].split()[0])
    assert m, f"not the official Spark image with Python: {froms[0]}"
    assert m.group(1) == _pin("pyspark"), "the image's Spark is not the pinned pyspark's"
    version = {_args_value("DELTAWHEEL_VERSION", a) for a in _instructions("ARG")
               if a.startswith("DELTAWHEEL_VERSION")}
    assert version == {_pyproject()["project"]["version"]}
    copies = [shlex.split(a) for a in _instructions("COPY")]
    sources = [w for c in copies for w in c[:-1] if not w.startswith("--")]
    assert "dist/deltawheel-${DELTAWHEEL_VERSION}-py3-none-any.whl" in sources
    assert "examples/clicks_job.py" in sources
    for src in sources:
        assert not src.startswith(("/", "~")), f"COPY of an absolute host path: {src}"
    assert (REPO / "examples" / "clicks_job.py").exists()
    runs = " ; ".join(_instructions("RUN"))
    # the environment: a Python deltawheel runs on, the wheel installed into it
    venv = re.search(r"python3\.(\d+) -m venv (/\S+)", runs)
    assert venv, "no virtual environment made in the image"
    need = re.fullmatch(r">=\s*3\.(\d+)", _pyproject()["project"]["requires-python"])
    assert need and int(venv.group(1)) >= int(need.group(1)), "the image's Python is older than deltawheel needs"
    env = venv.group(2)
    assert re.search(rf"{re.escape(env)}/bin/pip install (?:--\S+ )*\S*/deltawheel-\$\{{DELTAWHEEL_VERSION\}}-py3-none-any\.whl",
                     runs), "the wheel is not installed into the environment"
    # the jars submit-args names, onto Spark's class path
    assert re.search(rf"{re.escape(env)}/bin/deltawheel submit-args --object-store --words\b.*/opt/spark/jars/", runs)
    # the SparkApplication's Python is the image's environment
    conf = _sparkapp()["spec"]["sparkConf"]
    assert conf["spark.pyspark.python"] == f"{env}/bin/python"
    assert instructions[-1] == ("USER", "spark"), "the image does not end as Spark's user"


_FOLDERS = "|".join(("work", "home", "root", "Users"))
_MACHINE_PATH = re.compile(rf"/(?:{_FOLDERS})/|~/\.cache|\.cache/deltawheel")


def test_files_name_no_host_paths_and_hold_no_keys() -> None:
    for f in (DOCKERFILE, SPARKAPP, ZOOKEEPER, YARN):
        text = f.read_text()
        # a user's or a build machine's folder, or deltawheel's per-user cache
        found = _MACHINE_PATH.search(text)
        assert found is None, f"{f.relative_to(REPO)} names a machine path ({found and found.group()})"
        assert not re.search(r"(?i)(access|secret)[-_.]?key\s*[=:]\s*['\"]?[A-Za-z0-9/+]{16,}", text), \
            f"{f.relative_to(REPO)} holds what looks like a key"


def test_zookeeper_ensemble_is_three_servers_the_job_connects_to() -> None:
    objs = _zookeeper()
    sts, svc = objs["StatefulSet"], objs["Service"]
    ns = _sparkapp()["metadata"]["namespace"]
    assert sts["metadata"]["namespace"] == svc["metadata"]["namespace"] == ns
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None", "the servers' stable names need a headless Service"
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert {"client", "peer", "election"} <= ports.keys()
    hosts = [f"{sts['metadata']['name']}-{i}.{svc['metadata']['name']}.{ns}.svc.cluster.local"
             for i in range(sts["spec"]["replicas"])]
    # the connect string the job and its log store use: every server, by its stable name
    assert _job_args()["--zk"].split(",") == [f"{h}:{ports['client']}" for h in hosts]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    servers = env["ZOO_SERVERS"].split()
    assert servers == [f"server.{i + 1}={h}:{ports['peer']}:{ports['election']};{ports['client']}"
                       for i, h in enumerate(hosts)]
    assert "ZOO_MY_ID=$(( ${HOSTNAME##*-} + 1 ))" in " ".join(container["command"])
    # the ZooKeeper version pyspark ships, the one the test bed runs
    import pyspark

    shipped = sorted(Path(pyspark.__file__).parent.glob("jars/zookeeper-[0-9]*.jar"))
    if shipped:
        assert container["image"] == "zookeeper:" + shipped[0].name.removeprefix("zookeeper-").removesuffix(".jar")


def test_deploy_doc_names_the_files_in_its_code_blocks() -> None:
    text = DEPLOY_DOC.read_text()
    blocks = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", text, re.S))
    for f in (DOCKERFILE, SPARKAPP, ZOOKEEPER):
        assert str(f.relative_to(REPO)) in blocks, f"docs/deploy.md's code blocks never name {f.relative_to(REPO)}"
    assert re.search(r"^## Kubernetes", text, re.M) and re.search(r"^## YARN / EMR", text, re.M)
    assert "spark-submit --master yarn --deploy-mode cluster" in blocks
    assert "deploy/yarn/README.md" in text
    assert "spark-submit --master yarn --deploy-mode cluster" in YARN.read_text()
