"""The command line's exit codes per error class, its --help table, and typed errors for a bad --store."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from deltawheel.executor.exceptions import ClusterError, UserCodeError
from deltawheel.statestore.exceptions import (
    EXIT_CODES,
    BucketMissingError,
    ConfigError,
    DeltaWheelError,
    LeaseHeldError,
    NotAStoreError,
    ObjectStoreUnreachableError,
    ReadOnlySqlError,
    StaleViewError,
    StoreDamagedError,
    StoreMismatchError,
    exit_code,
)

from deltawheel.cli import build_parser, main


def test_exit_code_per_error_class() -> None:
    assert [exit_code(e) for e in (
        ReadOnlySqlError("x"), ConfigError("x"), NotAStoreError("x"), StoreDamagedError("x"), LeaseHeldError("x"),
        BucketMissingError("x"), ObjectStoreUnreachableError("x"), StoreMismatchError("x"),
        UserCodeError("c", "k", "r", ValueError()), ClusterError("x"), StaleViewError("x"), DeltaWheelError("x"),
    )] == [2, 3, 3, 3, 4, 5, 5, 6, 7, 8, 9, 10]
    documented = dict(EXIT_CODES)
    assert all(exit_code(e) in documented for e in (ConfigError("x"), UserCodeError("c", "k", "r", ValueError())))


def test_help_lists_the_exit_codes(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "exit codes" in out and "--verbose" in out
    for code, text in EXIT_CODES:
        assert f"{code:>3}  {text[:30]}" in out
    with pytest.raises(SystemExit) as bad:
        build_parser().parse_args(["sql", "--no-such-flag"])
    assert bad.value.code == 2


def test_the_repository_wrapper_help_lists_the_subcommands() -> None:
    """`./dw --help` (what the README points a new user to) shows deltawheel's subcommands and exit
    codes after the wrapper's own lines, not the wrapper's lines alone."""
    dw = Path(__file__).resolve().parents[1] / "dw"
    done = subprocess.run([str(dw), "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "./dw test" in done.stdout                      # the wrapper's own lines
    assert "usage: deltawheel" in done.stdout              # then deltawheel's
    for sub in ("demo", "status", "upgrade-state", "gc", "bench"):
        assert re.search(rf"\n    {sub}\s", done.stdout), sub
    assert "exit codes" in done.stdout


def test_store_that_is_a_plain_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    plain = tmp_path / "store.txt"
    plain.write_text("not a store\n")
    for argv in (["sql", "--store", str(plain), "SELECT 1"], ["migrate", "--store", str(plain)],
                 ["gc", "--store", str(plain)], ["--verbose", "inspect", "--store", str(plain), "--computation", "c",
                                                  "--key", "k"]):
        assert main(argv) == 3, argv
        err = capsys.readouterr().err
        assert f"NotAStoreError: --store {plain} is a file, not a folder" in err, err
        assert "Traceback" not in err and "deltawheel migrate --store DIR --apply" in err


@pytest.mark.spark
def test_migrate_shows_a_line_per_step(spark, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from deltawheel import migrations

    assert main(["migrate", "--store", str(tmp_path / "new"), "--apply"]) == 0
    err = capsys.readouterr().err.splitlines()
    n = migrations.CODE_SCHEMA_VERSION
    assert [line.split(" (")[0] for line in err] == [
        f"deltawheel migrate: [{i}/{n}] migration {m.VERSION}" for i, m in enumerate(migrations.MIGRATIONS, 1)]
    assert "s left)" in err[-1] and "s left" not in err[0]
