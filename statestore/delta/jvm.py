"""The JVM behind a PySpark session: the one place that reaches into pyspark's private handles.

Some of what deltawheel does has no Python API: parsing and checking a SQL plan, Delta's
commit internals, Hadoop's file system, the Thrift server. Those calls go to the JVM
objects pyspark keeps behind underscore names (``spark._jvm``, ``spark._jsparkSession``,
``df._jdf``, ...). They are read here, so a pyspark that renames them is fixed in one file.
"""

from __future__ import annotations

from typing import Any

__all__ = ["jvm", "jsession", "jcontext", "jframe", "gateway"]


def jvm(spark: Any) -> Any:
    """The py4j view of the driver JVM's packages (``jvm(spark).org.apache...``)."""
    return spark._jvm  # noqa: SLF001 - pyspark has no public accessor


def jsession(spark: Any) -> Any:
    """The JVM ``SparkSession`` behind the Python session ``spark``."""
    return spark._jsparkSession  # noqa: SLF001 - pyspark has no public accessor


def jcontext(spark: Any) -> Any:
    """The JVM ``JavaSparkContext`` of ``spark`` (its Hadoop configuration, for one)."""
    return spark._jsc  # noqa: SLF001 - pyspark has no public accessor


def jframe(df: Any) -> Any:
    """The JVM ``Dataset`` behind the Python DataFrame ``df``."""
    return df._jdf  # noqa: SLF001 - pyspark has no public accessor


def gateway(spark: Any) -> Any:
    """The py4j ``JavaGateway`` of ``spark``'s driver (to start its callback server)."""
    return spark.sparkContext._gateway  # noqa: SLF001 - pyspark has no public accessor
