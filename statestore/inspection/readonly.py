"""The SQL tools only read: a statement is checked on the plan Spark makes of it, not its text."""

from __future__ import annotations

import re
import threading
from typing import Any, Callable, Sequence

from ..delta.jvm import gateway, jsession, jvm
from ..exceptions import ReadOnlySqlError
from ..sqltext import sql_str

__all__ = ["check_read_only", "read_only_session"]

# commands that only read: SHOW ..., DESCRIBE ... (Spark's and Delta's: DESCRIBE HISTORY / DETAIL), EXPLAIN
_READ_COMMAND_PREFIXES = ("Show", "Describe")
# (USE: the current namespace only; JDBC clients send it when they connect)
_READ_COMMANDS = frozenset({"ExplainCommand", "SetCatalogAndNamespace", "SetNamespaceCommand"})
# plan nodes that write without being a ``Command`` (statements resolved later: INSERT, RESTORE, ...)
_WRITE_MARKS = ("Insert", "Statement", "Restore", "Write", "Merge", "Update", "Delete", "Overwrite")


def check_read_only(spark: Any, query: str) -> None:
    """Refuse ``query`` unless the session's parser plans it as a query or a SHOW, DESCRIBE or EXPLAIN.

    Raises:
        ReadOnlySqlError: the statement would write (UPDATE, INSERT, CREATE, OPTIMIZE, SET, CACHE, ...).
        pyspark.errors.ParseException: not one valid statement (several ``;``-separated ones included).
    """
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import convert_exception

    try:
        plan = jsession(spark).sessionState().sqlParser().parsePlan(query)
    except Py4JJavaError as exc:
        raise convert_exception(exc.java_exception) from None
    _check_plan(jvm(spark), plan)


def _check_plan(jvm: Any, plan: Any) -> None:
    """Raise :class:`ReadOnlySqlError` unless the (parsed or analysed) logical ``plan`` only reads."""
    command = jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.plans.logical.Command")
    to_java = jvm.scala.jdk.javaapi.CollectionConverters.asJava
    root = plan.getClass().getSimpleName()
    if command.isInstance(plan):
        if root in _READ_COMMANDS or root.startswith(_READ_COMMAND_PREFIXES):
            return
        _refuse(root)
    todo = [plan]
    while todo:
        node = todo.pop()
        name = node.getClass().getSimpleName()
        if command.isInstance(node) or any(m in name for m in _WRITE_MARKS):
            _refuse(name)
        todo.extend(to_java(node.children()))


_SHOW_TABLES = re.compile(r"\s*SHOW\s+TABLES(\s+(IN|FROM)\s+`?default`?)?\s*;?\s*", re.IGNORECASE)


def _show_tables_query(names: Sequence[str]) -> str:
    """The query ``SHOW TABLES`` stands for in :func:`read_only_session`: the table name first.
    >>> _show_tables_query(["state"])
    "SELECT * FROM VALUES ('state', '', true) AS t(tableName, namespace, isTemporary)"
    """
    if not names:
        return ("SELECT CAST(NULL AS STRING) AS tableName, CAST(NULL AS STRING) AS namespace, "
                "CAST(NULL AS BOOLEAN) AS isTemporary WHERE false")
    values = ", ".join(f"({sql_str(n)}, '', true)" for n in names)
    return f"SELECT * FROM VALUES {values} AS t(tableName, namespace, isTemporary)"


def read_only_session(spark: Any, prepare: Callable[[Any], Any],
                      table_names: Callable[[], Sequence[str]] | None = None) -> Any:
    """A new session whose every statement :func:`check_read_only` checks, once parsed and once analysed;
    ``prepare(session)`` runs first, unchecked. ``table_names``: what ``SHOW TABLES`` lists."""
    from pyspark.java_gateway import ensure_callback_server_started
    from pyspark.sql import SparkSession

    ensure_callback_server_started(gateway(spark))
    armed = threading.Event()
    driver_jvm = jvm(spark)

    class _Check:
        def apply(self, plan: Any) -> None:
            if armed.is_set():
                _check_plan(driver_jvm, plan)

        class Java:
            implements = ["scala.Function1"]

    class _Rule:
        def apply(self, _session: Any) -> Any:
            return _Check()

        class Java:
            implements = ["scala.Function1"]

    class _Parser:
        """Spark's parser, each parsed plan checked (once armed); SHOW TABLES rewritten; the rest as is."""

        def __init__(self, delegate: Any) -> None:
            self._delegate = delegate

        def __getattr__(self, name: str) -> Any:
            method = getattr(self._delegate, name)
            if not name.startswith("parsePlan"):  # parsePlan, parsePlanWithParameters, ...
                return method

            def parse(text: Any, *rest: Any) -> Any:
                if table_names is not None and isinstance(text, str) and _SHOW_TABLES.fullmatch(text):
                    text = _show_tables_query(table_names())
                plan = method(text, *rest)
                if armed.is_set():
                    _check_plan(driver_jvm, plan)
                return plan

            return parse

        class Java:
            implements = ["org.apache.spark.sql.catalyst.parser.ParserInterface"]

    class _ParserBuilder:
        def apply(self, _session: Any, delegate: Any) -> Any:
            return _Parser(delegate)

        class Java:
            implements = ["scala.Function2"]

    # a new session builds its analyser (and parser) from the application's extensions, these included
    jspark = jsession(spark)
    jspark.extensions().injectCheckRule(_Rule())
    jspark.extensions().injectParser(_ParserBuilder())
    session = SparkSession(spark.sparkContext, jspark.newSession())
    prepare(session)
    armed.set()
    return session


def _refuse(plan_name: str) -> None:
    raise ReadOnlySqlError(
        f"the SQL tool only reads (SELECT, WITH, VALUES, TABLE, SHOW, DESCRIBE, EXPLAIN); this statement "
        f"is a {plan_name}, which would change the store or the session: nothing was run. Changes to state go "
        "through a fenced path only (the executor under its leases and sequencers): an unfenced write "
        "to the rows table can clobber a running owner's commits or be clobbered by them")
