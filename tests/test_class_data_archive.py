"""The driver JVM's class-data archive (statestore/session/cds.py): a session maps it (a JVM told to
insist on it starts and runs a job), and it is left out when switched off or while recording."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from deltawheel.statestore.session import cds

pytestmark = pytest.mark.spark

_SESSION = ("from deltawheel.statestore.session.sparkenv import SparkSettings, build_spark\n"
            "s = build_spark(SparkSettings(master='local[1]', object_store=False, kafka=False, "
            "extra={'spark.driver.extraJavaOptions': '-Xshare:on'}))\n"
            "print('count', s.range(7).count())\n"
            "s.stop()\n")


def test_a_session_starts_with_the_archive_mapped() -> None:
    """``-Xshare:on`` after deltawheel's options: a JVM that cannot map the archive refuses to start."""
    path = cds.ensure_archive(quiet=True)  # recorded by ``deltawheel setup`` already; else now
    assert path is not None and path.is_file()
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "DELTAWHEEL_CDS")}
    done = subprocess.run([sys.executable, "-c", _SESSION], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "count 7" in done.stdout


def test_the_archive_is_left_out_when_off_or_while_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    path = cds.ensure_archive(quiet=True)
    assert path is not None
    mapped = cds.driver_java_options("-Dx=1")
    assert mapped is not None and mapped.startswith(f"-XX:SharedArchiveFile={path} ") and mapped.endswith(" -Dx=1")
    assert cds.driver_java_options(f"-XX:ArchiveClassesAtExit={path}.new") == f"-XX:ArchiveClassesAtExit={path}.new"
    monkeypatch.setenv("DELTAWHEEL_CDS", "0")
    assert cds.driver_java_options("-Dx=1") == "-Dx=1"
    assert cds.driver_java_options(None) is None
    assert cds.ensure_archive(quiet=True) is None
