"""The JVM behind a PySpark session: the one place that reaches into pyspark's private handles."""

from __future__ import annotations

import sys
import threading
from contextlib import suppress
from typing import Any, Callable, TypeVar

from ..exceptions import SparkConnectSessionError, chain

__all__ = ["jvm", "jsession", "activate", "jcontext", "jframe", "jobservation", "gateway", "require_classic_session",
           "java_errors", "per_owner", "DeltaClasses", "delta_classes"]

_T = TypeVar("_T")
_OWNED: dict[tuple[str, int], tuple[Any, Any]] = {}  # (kind, id(owner)) -> (the owner, its value)
_OWNED_LOCK = threading.Lock()


def jvm(spark: Any) -> Any:
    """The py4j view of the driver JVM's packages (``jvm(spark).org.apache...``)."""
    return spark._jvm  # noqa: SLF001 - pyspark has no public accessor


def jsession(spark: Any) -> Any:
    """The JVM ``SparkSession`` behind the Python session ``spark``."""
    return spark._jsparkSession  # noqa: SLF001 - pyspark has no public accessor


def activate(spark: Any) -> None:
    """Make ``spark`` the JVM's active session of the calling thread: a thread of deltawheel's own
    that commits through Delta's JVM API (the metrics writer) has none, and Delta's post-commit
    work falls back to the default session, which a driver may no longer have."""
    jvm(spark).org.apache.spark.sql.SparkSession.setActiveSession(jsession(spark))


def jcontext(spark: Any) -> Any:
    """The JVM ``JavaSparkContext`` of ``spark`` (its Hadoop configuration, for one)."""
    return spark._jsc  # noqa: SLF001 - pyspark has no public accessor


def jframe(df: Any) -> Any:
    """The JVM ``Dataset`` behind the Python DataFrame ``df``."""
    return df._jdf  # noqa: SLF001 - pyspark has no public accessor


def jobservation(observation: Any) -> Any:
    """The JVM ``Observation`` behind a used pyspark ``Observation`` (its metrics' future)."""
    return observation._jo  # noqa: SLF001 - pyspark has no public accessor


def gateway(spark: Any) -> Any:
    """The py4j ``JavaGateway`` of ``spark``'s driver (to start its callback server)."""
    return spark.sparkContext._gateway  # noqa: SLF001 - pyspark has no public accessor


def per_owner(kind: str, owner: Any, make: Callable[[], _T]) -> _T:
    """``make()``, made once per ``kind`` and live ``owner`` (a py4j JVM view, a ``SparkContext``)."""
    got = _OWNED.get((kind, id(owner)))
    if got is not None and got[0] is owner:
        return got[1]  # type: ignore[no-any-return]
    with _OWNED_LOCK:
        got = _OWNED.get((kind, id(owner)))
        if got is None or got[0] is not owner:  # a stopped owner's id may be reused
            got = _OWNED[(kind, id(owner))] = (owner, make())
        return got[1]


_TXN_COMMIT = "io.deltawheel.delta.TxnCommit"


class DeltaClasses:
    """The JVM classes deltawheel calls Delta through (each step of resolving one is a py4j round trip)."""

    def __init__(self, jvm: Any) -> None:
        self.cc = jvm.scala.jdk.javaapi.CollectionConverters
        self.as_scala = self.cc.asScala
        utils = jvm.org.apache.spark.util.Utils
        self.action = utils.classForName("org.apache.spark.sql.delta.actions.Action$", True, False) \
            .getField("MODULE$").get(None)
        self.write_op = getattr(jvm.org.apache.spark.sql.delta, "DeltaOperations$Write")
        # Write's arity differs across Delta versions and py4j applies no Scala defaults: pad with None
        self.write_arity = int(utils.classForName("org.apache.spark.sql.delta.DeltaOperations$Write", True,
                                                  False).getConstructors()[0].getParameterCount())
        save_mode = jvm.org.apache.spark.sql.SaveMode
        self.modes = {True: save_mode.Overwrite, False: save_mode.Append}
        self.array_list = jvm.java.util.ArrayList
        self.none = jvm.scala.Option.empty()
        self.some = jvm.scala.Some
        self.delta_log = jvm.org.apache.spark.sql.delta.DeltaLog
        # a commit's actions in one call (TxnCommit.java); None: its jar is not in the session
        try:
            utils.classForName(_TXN_COMMIT, True, False)
            self.txn_commit: Any = jvm.io.deltawheel.delta.TxnCommit
        except Exception:  # py4j's error: the class is missing
            self.txn_commit = None


def delta_classes(jvm: Any) -> DeltaClasses:
    """The :class:`DeltaClasses` of the py4j view ``jvm``, resolved once per JVM."""
    return per_owner("delta", jvm, lambda: DeltaClasses(jvm))


def require_classic_session(spark: Any) -> None:
    """Refuse a Spark Connect session: it has no driver JVM. Every public entry taking a session calls this.
    Raises SparkConnectSessionError: ``spark`` is a Spark Connect session."""
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
    """(error condition, message parameters) of each Java throwable behind ``exc`` that has one."""
    out: list[tuple[str, dict[str, str]]] = []
    jexc = next((j for e in chain(exc) if (j := getattr(e, "java_exception", None) or getattr(e, "_origin", None))),
                None)
    for _ in range(50):  # a cycle is not followed forever
        if jexc is None:
            break
        with suppress(Exception):  # a plain Java exception: no condition
            condition = jexc.getCondition()
            params = jexc.getMessageParameters()
            if condition:
                out.append((str(condition), {str(k): str(v) for k, v in dict(params or {}).items()}))
        try:
            jexc = jexc.getCause()
        except Exception:
            break
    return out

