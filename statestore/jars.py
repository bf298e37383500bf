"""The jars deltawheel fetches or builds, in a per-user cache; every jar user fetches through here."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from .exceptions import JarFetchError

__all__ = ["MAVEN_CENTRAL", "DELTA_VERSION", "BUNDLED_JARS_DIR", "DELTA_JARS", "default_jars_dir",
           "fetch_maven_jar", "ensure_delta_jars", "compile_jar"]

MAVEN_CENTRAL = os.environ.get("DELTAWHEEL_MAVEN_REPO", "https://repo1.maven.org/maven2")

DELTA_VERSION = "4.4.0"
#: Where a built wheel carries the compiled log store jars (setup.py's build step); absent in an
#: editable install, where :func:`compile_jar` compiles them on first use.
BUNDLED_JARS_DIR = Path(__file__).resolve().parent / "lib"
# (group, artifact, version) of delta-spark_4.2_2.13's runtime dependencies that pyspark does not ship
# (kernel and Unity Catalog ones: unused by path-based tables); docs/versions.md: why this pair.
DELTA_JARS: tuple[tuple[str, str, str], ...] = (
    ("io.delta", "delta-spark_4.2_2.13", DELTA_VERSION),
    ("io.delta", "delta-storage", DELTA_VERSION),
    ("io.delta", "delta-kernel-api", DELTA_VERSION),
    ("io.delta", "delta-kernel-defaults", DELTA_VERSION),
    ("io.delta", "delta-kernel-unitycatalog", DELTA_VERSION),
    ("io.unitycatalog", "unitycatalog-client", "0.6.0"),
    ("io.unitycatalog", "unitycatalog-hadoop", "0.6.0"),
)


def default_jars_dir() -> Path:
    """The per-user jar cache: ``$DELTAWHEEL_JARS_DIR`` or ``~/.cache/deltawheel/jars``."""
    env = os.environ.get("DELTAWHEEL_JARS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "deltawheel" / "jars"


def _download(url: str, dest: Path) -> None:
    with urllib.request.urlopen(url, timeout=120) as resp:
        data = resp.read()
    with urllib.request.urlopen(url + ".sha1", timeout=60) as resp:
        want = resp.read().decode().split()[0].strip()
    got = hashlib.sha1(data).hexdigest()
    if got != want:
        raise JarFetchError(f"checksum mismatch for {url}: got {got}, Maven Central says {want}")
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)


def _mvn_copy(coords: str, dest_dir: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarFetchError("fetching over HTTPS failed and mvn is not installed to try Maven's own resolver; "
                            "install Maven (Debian: apt-get install maven) or fix the network route to Maven "
                            "Central, then run 'deltawheel setup' again")
    subprocess.run([mvn, "-q", "dependency:copy", f"-Dartifact={coords}", f"-DoutputDirectory={dest_dir}"],
                   check=True, capture_output=True, timeout=600)


def fetch_maven_jar(group: str, artifact: str, version: str, dest_dir: Path, *, classifier: str | None = None,
                    sha1: str | None = None, quiet: bool = False, hint: str = "") -> Path:
    """The jar ``group:artifact:version[:classifier]`` in ``dest_dir``, fetched once (``sha1`` checked).
    Raises JarFetchError: neither Maven Central nor ``mvn`` could provide the jar, or its checksum is
    wrong."""
    name = f"{artifact}-{version}{'-' + classifier if classifier else ''}.jar"
    dest = dest_dir / name
    if dest.exists():
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    url = f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{name}"
    if not quiet:
        print(f"deltawheel: fetching {name} from Maven Central", file=sys.stderr)
    try:
        _download(url, dest)
    except Exception as first:
        try:
            _mvn_copy(f"{group}:{artifact}:{version}" + (f":jar:{classifier}" if classifier else ""),
                      dest_dir)
        except Exception as second:
            raise JarFetchError(f"could not fetch {name}: download from {url} failed ({first}); mvn "
                                f"dependency:copy failed ({second}). Put the jar into {dest_dir} by hand"
                                f"{hint}.") from second
    if sha1 is not None:
        got = hashlib.sha1(dest.read_bytes()).hexdigest()
        if got != sha1:
            dest.unlink()
            raise JarFetchError(f"checksum mismatch for {name}: got {got}, deltawheel pins {sha1}; "
                                "the download was removed, try again")
    return dest


def ensure_delta_jars(jars_dir: Path | None = None, *, quiet: bool = False) -> list[Path]:
    """Return the paths of the Delta jars, downloading any that are missing.
    Raises JarFetchError: neither Maven Central nor ``mvn`` could provide a jar."""
    jars_dir = Path(jars_dir) if jars_dir is not None else default_jars_dir()
    missing = [a for _g, a, v in DELTA_JARS if not (jars_dir / f"{a}-{v}.jar").exists()]
    if missing and not quiet:
        print(f"deltawheel: first use: fetching {len(missing)} Delta Lake {DELTA_VERSION} jars from Maven Central "
              f"into {jars_dir} (once per user; DELTAWHEEL_JARS_DIR moves the cache)", file=sys.stderr)
    return [fetch_maven_jar(group, artifact, version, jars_dir, quiet=quiet,
                            hint=" or set DELTAWHEEL_JARS_DIR to a folder that has it")
            for group, artifact, version in DELTA_JARS]


def compile_jar(source: Path, jars_dir: Path | None = None, *, quiet: bool = False,
                classpath: Sequence[Path] = ()) -> Path | None:
    """The jar of one of deltawheel's Java classes for Delta and Spark, compiled once from ``source``
    (named by the digest of the source and the jars compiled against; a wheel's bundled jar of that
    name is used as it is), with ``classpath`` (pinned jars) added to Spark's and Delta's.
    None (with a warning) when no ``javac`` is installed.
    Raises JarFetchError: ``javac`` failed, or the Delta jars could not be fetched."""
    import zipfile

    jars_dir = Path(jars_dir) if jars_dir is not None else default_jars_dir()
    jars_dir.mkdir(parents=True, exist_ok=True)
    import pyspark

    # a jar compiled against other Delta or Spark jars is not reused, even if it would still link
    digest = hashlib.sha256(source.read_bytes())
    digest.update(f"delta-storage {DELTA_VERSION} pyspark {pyspark.__version__}".encode())
    dest = jars_dir / f"deltawheel-logstore-{digest.hexdigest()[:12]}.jar"
    bundled = BUNDLED_JARS_DIR / dest.name  # built into the wheel (setup.py): no javac needed
    if bundled.exists():
        return bundled
    if dest.exists():
        return dest
    javac = shutil.which("javac")
    if javac is None:
        print("deltawheel: WARNING: no javac, so Delta's own log store is used for local tables "
              "(its put-if-absent of commit files holds within one JVM only)", file=sys.stderr)
        return None
    delta = [p for p in ensure_delta_jars(jars_dir, quiet=quiet) if p.name.startswith(("delta-storage-", "delta-spark_"))]
    cp = os.pathsep.join([*(str(p) for p in delta), *(str(p) for p in classpath),
                          str(Path(pyspark.__file__).parent / "jars" / "*")])
    if not quiet:
        print(f"deltawheel: compiling {source.name}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", cp, "-d", out, str(source)],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise JarFetchError(f"javac could not compile {source}: {done.stderr.strip()[-2000:]}")
        tmp = dest.with_suffix(".part")
        with zipfile.ZipFile(tmp, "w") as z:
            for f in sorted(Path(out).rglob("*.class")):
                z.write(f, f.relative_to(out).as_posix())
        tmp.replace(dest)
    return dest
