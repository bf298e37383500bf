"""A class-data-sharing archive of the driver JVM (Java's CDS): the classes a Spark session and its
first Delta commits load, recorded once by ``deltawheel setup`` into the per-user jar cache and
mapped by every later driver JVM instead of being loaded and verified again. A session starts about
1.5 s sooner and its first Delta commit about as much (docs/performance.md, "The driver JVM's
start"). The archive belongs to one JDK and one pyspark install (its name is their digest); a JVM
that cannot map it starts without it. ``DELTAWHEEL_CDS=0`` neither makes nor uses one."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["RECORD", "archive_path", "driver_java_options", "ensure_archive"]

_ENV = "DELTAWHEEL_CDS"
RECORD = "-XX:ArchiveClassesAtExit="
_USE = "-XX:SharedArchiveFile="


def _enabled() -> bool:
    return os.environ.get(_ENV, "1").strip() not in ("0", "false", "no", "off")


def archive_path(jars_dir: Path | None = None) -> Path | None:
    """Where this JDK's and pyspark's archive is (None: no ``java`` found)."""
    import pyspark

    from ..exceptions import JavaMissingError
    from ..jars import default_jars_dir
    from ..process import find_java

    try:
        real = os.path.realpath(find_java(JavaMissingError))  # the java Spark starts
    except JavaMissingError:
        return None
    spark_jars = os.path.realpath(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
    family = hashlib.sha256(f"{real} {spark_jars}".encode()).hexdigest()[:12]
    # the JVM refuses an archive whose class path's jars changed (a virtual environment made again
    # at the same path): their sizes and times are part of the name
    files = hashlib.sha256(f"{os.stat(real).st_mtime_ns} {pyspark.__version__}".encode())
    with os.scandir(spark_jars) as entries:
        for e in sorted(entries, key=lambda e: e.name):
            st = e.stat()
            files.update(f" {e.name} {st.st_size} {st.st_mtime_ns}".encode())
    return (Path(jars_dir) if jars_dir is not None else default_jars_dir()) / (
        f"driver-cds-{family}-{files.hexdigest()[:12]}.jsa")


def driver_java_options(current: str | None) -> str | None:
    """``spark.driver.extraJavaOptions`` with the archive mapped, when it exists (else ``current``)."""
    if not _enabled() or (current and (RECORD in current or _USE in current)):
        return current
    path = archive_path()
    if path is None or not path.is_file():
        return current
    mine = f"{_USE}{path} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
    return f"{mine} {current}" if current else mine


def ensure_archive(*, quiet: bool = False, timeout_s: float = 300.0) -> Path | None:
    """Record the archive once (a short training session in a process of its own); returns it, or
    None when disabled, without java, or when the recording failed (said on stderr; nothing breaks)."""
    path = archive_path()
    if not _enabled() or path is None:
        return None
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    if not quiet:
        print("deltawheel: recording the driver JVM's classes for a faster start (once, about a minute)",
              file=sys.stderr)
    t0 = time.monotonic()
    try:
        # no SPARK_CONF_DIR: a folder with files on the JVM's class path refuses the recording
        env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
        done = subprocess.run([sys.executable, "-m", f"{__package__}.cds_train", str(tmp)], capture_output=True,
                              text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0 or not tmp.is_file():
        log = path.with_suffix(".log")
        log.write_text("timed out" if done is None else f"exit code {done.returncode}\n{done.stdout}\n{done.stderr}")
        print(f"deltawheel: WARNING: no class-data archive, sessions start without it (the recording's "
              f"output: {log})", file=sys.stderr)
        tmp.unlink(missing_ok=True)
        return None
    os.replace(tmp, path)
    for old in path.parent.glob(f"{path.name.rsplit('-', 1)[0]}-*.jsa"):  # this install's stale ones
        if old != path:
            old.unlink(missing_ok=True)
    if not quiet:
        print(f"deltawheel: class-data archive ready in {time.monotonic() - t0:.0f}s ({path})", file=sys.stderr)
    return path
