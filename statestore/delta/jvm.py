"""The JVM behind a PySpark session: the one place that reaches into pyspark's private handles.

Some of what deltawheel does has no Python API: parsing and checking a SQL plan, Delta's
commit internals, Hadoop's file system, the Thrift server. Those calls go to the JVM
objects pyspark keeps behind underscore names (``spark._jvm``, ``spark._jsparkSession``,
``df._jdf``, ...). They are read here, so a pyspark that renames them is fixed in one file; and a session
without a driver JVM (Spark Connect) is refused here (:func:`require_classic_session`).
"""

from __future__ import annotations

import sys
from typing import Any

from ..exceptions import SparkConnectSessionError

__all__ = ["jvm", "jsession", "jcontext", "jframe", "gateway", "require_classic_session", "java_errors"]


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


def require_classic_session(spark: Any) -> None:
    """Refuse a Spark Connect session (``SparkSession.builder.remote(...)``): it has no driver JVM,
    and deltawheel commits through Delta Lake's JVM API and runs its jobs on the driver's
    SparkContext. Every public entry that takes a session calls this first.

    Raises:
        SparkConnectSessionError: ``spark`` is a Spark Connect session.
    """
    # a Connect session is an instance of this class, whose module is loaded once one exists
    connect = sys.modules.get("pyspark.sql.connect.session")
    if connect is None or not isinstance(spark, connect.SparkSession):
        return
    raise SparkConnectSessionError(
        "deltawheel was given a Spark Connect session (SparkSession.builder.remote(...)); it needs a classic "
        "SparkSession: a Spark Connect client has no driver JVM, and deltawheel commits its rows through "
        "Delta Lake's JVM API and runs its jobs on the driver's SparkContext. Build a classic session in this "
        "process with deltawheel.spark_session() (with SPARK_REMOTE unset), or run the job as a classic Spark "
        "application (spark-submit without --remote) (docs/embedding.md, 'Session settings')")


def java_errors(exc: BaseException) -> list[tuple[str, dict[str, str]]]:
    """The Spark errors behind a Python exception a py4j call raised, outermost first: each Java
    throwable's error condition (``FAILED_READ_FILE.PARQUET_COLUMN_DATA_TYPE_MISMATCH``, ...) and
    message parameters. Java throwables without a condition are left out; none: an empty list.

    The Java exception is ``java_exception`` of a py4j error, or the ``_origin`` pyspark keeps
    behind an error it converted (no public accessor); its causes are walked with ``getCause``.
    """
    out: list[tuple[str, dict[str, str]]] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    jexc = None
    while cur is not None and id(cur) not in seen and jexc is None:
        seen.add(id(cur))
        jexc = getattr(cur, "java_exception", None) or getattr(cur, "_origin", None)
        cur = cur.__cause__ or cur.__context__
    for _ in range(50):  # a cause chain is short; a cycle is not followed forever
        if jexc is None:
            break
        try:
            condition = jexc.getCondition()
            params = jexc.getMessageParameters()
            if condition:
                out.append((str(condition), {str(k): str(v) for k, v in dict(params or {}).items()}))
        except Exception:  # a plain Java exception: no condition
            pass
        try:
            jexc = jexc.getCause()
        except Exception:
            break
    return out

