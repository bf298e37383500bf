"""A Delta table's first commit as a test compares it: a table made from Python
(``statestore/delta/create.py``) against the one Spark's ``CREATE TABLE`` makes
(tests/test_stream_tables.py, tests/test_metrics_table.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DETAIL_KEYS = ("format", "partitionColumns", "properties", "minReaderVersion", "minWriterVersion", "tableFeatures")


def first_commit(table: str) -> dict[str, Any]:
    """The actions of the table's commit 0, by kind (commitInfo, metaData, protocol)."""
    lines = Path(table, "_delta_log", f"{0:020d}.json").read_text().splitlines()
    return {k: v for line in lines for k, v in json.loads(line).items()}


def detail(spark: Any, path: str, keys: tuple[str, ...] = DETAIL_KEYS) -> dict[str, Any]:
    """``keys`` of Delta's ``DESCRIBE DETAIL`` of the table at ``path``."""
    row = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0].asDict()
    return {k: row[k] for k in keys}


def assert_made_as_spark_makes(mine: dict[str, Any], theirs: dict[str, Any]) -> None:
    """``mine`` (our first commit) is ``theirs`` (Spark's): by another engine, with the same
    protocol and the same metadata but the table's id and creation time."""
    assert mine["commitInfo"]["engineInfo"] == "deltawheel"
    assert theirs["commitInfo"]["engineInfo"].startswith("Apache-Spark")
    assert mine["protocol"] == theirs["protocol"]
    drop = ("id", "createdTime")
    assert {k: v for k, v in mine["metaData"].items() if k not in drop} == \
        {k: v for k, v in theirs["metaData"].items() if k not in drop}
