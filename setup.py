"""The wheel's build step: deltawheel's Java classes (the log stores, the checkpoint file manager)
compiled into jars inside the wheel, so a host that runs a deltawheel job needs no ``javac``.

Everything else is in pyproject.toml. The jars go to ``deltawheel/statestore/lib/`` under the
names :func:`deltawheel.statestore.jars.compile_jar` gives them (the digest of the source, the
Delta and the pyspark versions), where it looks first. The compilation needs ``javac``, pyspark
(Spark's and Hadoop's jars to compile against) and the ``delta-storage`` jar (from the per-user
cache, else Maven Central): build the wheel from an environment that has pyspark, e.g.
``./dw wheel`` (``pip wheel --no-build-isolation --no-deps -w dist .``). An editable install
skips the step: the classes are compiled on first use into the per-user cache, as before.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SOURCES = ("statestore/session/ExclusiveLocalLogStore.java", "statestore/objectstore/ZkS3LogStore.java",
           "statestore/objectstore/DirectCheckpointFileManager.java", "statestore/delta/TxnCommit.java",
           "statestore/objectstore/NoExpectContinue.java", "statestore/objectstore/CommitStatusS3AFileSystem.java")
# compiled against jars S3A brings too (statestore/objectstore/s3a.py): the AWS SDK's interceptor interface, S3A
S3A_SOURCES = {"statestore/objectstore/NoExpectContinue.java": ("sdk-core", "http-client-spi", "utils"),
               "statestore/objectstore/CommitStatusS3AFileSystem.java": ("hadoop-aws",)}


def _delta_version() -> str:
    m = re.search(r'^DELTA_VERSION = "([^"]+)"', (HERE / "statestore" / "jars.py").read_text(), re.M)
    if m is None:
        raise SystemExit("setup.py: DELTA_VERSION not found in statestore/jars.py")
    return m.group(1)


def _maven_jar(artifact: str, version: str, *, group: str = "io/delta", env: str = "DELTAWHEEL_JARS_DIR",
               folder: str = "jars") -> Path:
    name = f"{artifact}-{version}.jar"
    cache = Path(os.environ.get(env) or Path.home() / ".cache" / "deltawheel" / folder)
    if (cache / name).exists():
        return cache / name
    dest = Path(tempfile.mkdtemp()) / name
    repo = os.environ.get("DELTAWHEEL_MAVEN_REPO", "https://repo1.maven.org/maven2")
    with urllib.request.urlopen(f"{repo}/{group}/{artifact}/{version}/{name}", timeout=120) as resp:
        dest.write_bytes(resp.read())
    return dest


def _s3a_jars(artifacts: tuple[str, ...]) -> list[Path]:
    """Jars of S3A's set (``S3A_JARS`` in s3a.py, at its versions), from the S3 jar cache or Maven Central."""
    text = (HERE / "statestore" / "objectstore" / "s3a.py").read_text()
    consts = dict(re.findall(r'^(_AWS|_SDK) = "([^"]+)"', text, re.M))
    out = []
    for artifact in artifacts:
        m = re.search(rf'\((_AWS|"[^"]+"), "{artifact}", (_SDK|"[^"]+"),', text)
        if m is None:
            raise SystemExit(f"setup.py: {artifact} not found in S3A_JARS of statestore/objectstore/s3a.py")
        group, version = (consts.get(v) or v.strip('"') for v in m.groups())
        out.append(_maven_jar(artifact, version, group=group.replace(".", "/"), env="DELTAWHEEL_S3_JARS_DIR",
                              folder="s3-jars"))
    return out


def build_jars(out: Path) -> list[Path]:
    """Compile each Java source into its own jar in ``out``; returns the jars."""
    try:
        import pyspark
    except ImportError as exc:
        raise SystemExit("setup.py: building deltawheel's wheel compiles its log store jars against pyspark's "
                         "jars; build from an environment with pyspark (./dw wheel, or pip wheel "
                         "--no-build-isolation --no-deps .)") from exc
    javac = shutil.which("javac")
    if javac is None:
        raise SystemExit("setup.py: building deltawheel's wheel needs javac (a JDK 17+) for its log store jars")
    delta = _delta_version()
    spark_artifact = re.search(r'"(delta-spark_[^"]+)"', (HERE / "statestore" / "jars.py").read_text())
    if spark_artifact is None:
        raise SystemExit("setup.py: the delta-spark artifact not found in statestore/jars.py")
    cp = os.pathsep.join([str(_maven_jar("delta-storage", delta)), str(_maven_jar(spark_artifact.group(1), delta)),
                          str(Path(pyspark.__file__).parent / "jars" / "*")])
    out.mkdir(parents=True, exist_ok=True)
    built = []
    for rel in SOURCES:
        source = HERE / rel
        digest = hashlib.sha256(source.read_bytes())
        digest.update(f"delta-storage {delta} pyspark {pyspark.__version__}".encode())
        dest = out / f"deltawheel-logstore-{digest.hexdigest()[:12]}.jar"
        full = os.pathsep.join([*(str(j) for j in _s3a_jars(S3A_SOURCES[rel])), cp]) if rel in S3A_SOURCES else cp
        with tempfile.TemporaryDirectory() as classes:
            subprocess.run([javac, "--release", "17", "-nowarn", "-cp", full, "-d", classes, str(source)], check=True)
            with zipfile.ZipFile(dest, "w") as z:
                for f in sorted(Path(classes).rglob("*.class")):
                    z.write(f, f.relative_to(classes).as_posix())
        built.append(dest)
    return built


class BuildPyWithJars(build_py):
    """``build_py`` plus the jars of :data:`SOURCES` (not for an editable install)."""

    def run(self) -> None:
        """Copy the packages, then compile the jars into the build folder."""
        super().run()
        if not getattr(self, "editable_mode", False):
            build_jars(Path(self.build_lib) / "deltawheel" / "statestore" / "lib")


setup(cmdclass={"build_py": BuildPyWithJars})
