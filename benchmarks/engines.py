"""The throughput benchmark's engines by name: Spark's own operators and deltawheel's write paths."""

from __future__ import annotations

from typing import Callable

from . import engine_deltawheel
from .engines_spark import Engine, SparkSqlEngine, SparkTwsEngine

__all__ = ["ENGINES"]

ENGINES: dict[str, Callable[[], Engine]] = {
    "spark_sql": SparkSqlEngine,
    "spark_tws": SparkTwsEngine,
    **engine_deltawheel.ENGINES,
}
