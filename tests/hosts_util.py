"""Helpers for the tests on the hosts test bed (its fixture, which skips where it cannot run, is in conftest)."""

from __future__ import annotations

from pathlib import Path

#: The tests' test bed folder: kept between runs (the hosts' Spark installation, made once, is in it).
HOSTS_DATA = Path(__file__).resolve().parents[1] / "data" / "hosts-test"
