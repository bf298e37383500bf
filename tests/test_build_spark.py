"""build_spark on a process whose session already runs: the session as it is, never reconfigured
by another tool's defaults (an in-process ``deltawheel sql`` on a local store asked for a session
without the object-store jars, and its defaults undid the running session's s3a checkpoint files)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.spark

_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"


def test_a_second_build_returns_the_running_session_with_only_its_extra_settings(spark) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.session import build_spark
    from deltawheel.statestore.session.sparkenv import SparkSettings

    manager, partitions = spark.conf.get(_MANAGER), spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set(_MANAGER, "io.example.SomeManager")  # what the running session's builder chose
    try:
        again = build_spark(SparkSettings(object_store=False, kafka=False,
                                          extra={"spark.sql.shuffle.partitions": "3"}))
        assert again is spark
        assert spark.conf.get(_MANAGER) == "io.example.SomeManager"  # not this build's default
        assert spark.conf.get("spark.sql.shuffle.partitions") == "3"  # what it asked for explicitly
    finally:
        spark.conf.set(_MANAGER, manager)
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
