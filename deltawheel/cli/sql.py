"""``deltawheel sql`` (statements, or a shell), ``inspect`` and ``sql-server``: SQL over a store's
decoded views. ``sql-server`` (HiveServer2, read-only) has no authentication: don't bind it to a
public address."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from typing import Any, Callable, Iterable, TextIO

from deltawheel.statestore.comments import describe as describe_columns
from deltawheel.statestore.delta.jvm import jsession, jvm
from deltawheel.statestore.inspection import sqlviews
from deltawheel.statestore.inspection.asof import resolve_as_of, store_tables
from deltawheel.statestore.inspection.readonly import check_read_only, read_only_session

from .common import add_allow_pickle_arg, add_key_args, add_spark_args, add_store_arg, layout_from, spark_from

__all__ = ["register", "split_statements", "shell"]


def register(subparsers: Any) -> None:
    """Add the ``sql``, ``inspect`` and ``sql-server`` subcommands."""
    p = subparsers.add_parser("sql", help="run read-only SQL queries over the store's decoded views (a shell "
                              "without a query)",
                              description="Views: rows, state, timers, pending_productions, fences, "
                              "dead_letters, late_data, state_history, <stream>, <stream>_decoded. Several queries run in "
                              "one Spark session (repeat QUERY or separate them with ';'); with none, "
                              "statements are read from stdin (an interactive shell on a terminal).")
    add_store_arg(p)
    p.add_argument("query", nargs="*", metavar="QUERY",
                   help='e.g. "SELECT key, state_json FROM state ORDER BY key"')
    p.add_argument("--describe", metavar="VIEW",
                   help="print the columns of VIEW (or table) with their types and comments, and exit")
    p.add_argument("--format", choices=sqlviews.FORMATS, default="table",
                   help="table (for people), csv, or json (JSON Lines; with several statements, or a shell, "
                   "each line is {\"query\": N, \"row\": {...}}, N counting the statements from 1)")
    p.add_argument("--max-rows", type=int, default=None,
                   help="show at most N rows (default: all for csv and json, "
                   f"{sqlviews.TABLE_MAX_ROWS} for table); a cut is said on stderr")
    add_allow_pickle_arg(p)
    p.add_argument("--as-of", metavar="COMPUTATION@VERSION|TIMESTAMP",
                   help="run the views over a past snapshot: the instant of VERSION of COMPUTATION's rows table "
                   "(VERSION alone in a store of one computation), or a TIMESTAMP (ISO 8601, UTC unless an "
                   "offset is given); docs/history.md")
    add_spark_args(p)
    p.set_defaults(func=_sql)

    p = subparsers.add_parser("inspect", help="print everything stored for one key as JSON")
    add_store_arg(p)
    add_key_args(p)
    add_spark_args(p)
    p.set_defaults(func=_inspect)

    p = subparsers.add_parser("sql-server", help="serve the views over JDBC/ODBC (HiveServer2 protocol)")
    add_store_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=10000)
    add_allow_pickle_arg(p)
    add_spark_args(p)
    p.set_defaults(func=_sql_server)


def _checked_spark(args: argparse.Namespace, **kw: Any) -> Any:
    import deltawheel.migrations as migrations

    spark = spark_from(args, **kw)
    migrations.check_store(spark, layout_from(args))
    return spark


def _reading_session(args: argparse.Namespace) -> dict[str, Any]:
    """The session settings of a tool that only reads: no Kafka jars, no object-store ones for a local
    store (a query naming an ``s3a://`` path gets them)."""
    if layout_from(args).is_local and not any("s3a://" in q for q in args.query):
        return {"object_store": False, "kafka": False}
    return {"kafka": False}


def _sql_error(exc: Exception) -> int:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"deltawheel sql: SQL error: {first}. Fix the statement (deltawheel sql --describe VIEW lists a "
          "view's columns)", file=sys.stderr)
    return 2


def _sql(args: argparse.Namespace) -> int:
    from pyspark.errors import AnalysisException

    from deltawheel.statestore.inspection.views import StoreViews

    spark = _checked_spark(args, **_reading_session(args))
    layout = layout_from(args)
    as_of = None
    if args.as_of is not None:
        as_of = resolve_as_of(spark, layout, args.as_of, store_tables(spark, layout))
        print(f"deltawheel sql: {as_of.describe(layout)}", file=sys.stderr)
    # each view is defined when a statement first names it
    views = StoreViews(spark, layout, allow_pickle=args.allow_pickle, as_of=as_of)
    statements = [s for q in args.query for s in split_statements(q)]
    # several statements (or a shell): each json line says which statement it answers
    numbered = args.format == "json" and (len(statements) > 1 or not statements) and not args.describe
    count = [0]

    def run(query: str) -> int:
        count[0] += 1
        try:
            views.for_statement(query)
            got = sqlviews.write_sql(spark, layout, query, sys.stdout, fmt=args.format,
                                     max_rows=args.max_rows, allow_pickle=args.allow_pickle, register=False,
                                     number=count[0] if numbered else None)
        except AnalysisException as exc:
            return _sql_error(exc)
        sys.stdout.flush()
        if got.cut:
            print(f"deltawheel sql: showed {got.shown} of {got.total} rows (--max-rows); "
                  "raise --max-rows, or use --format csv|json for every row", file=sys.stderr)
        return 0

    def describe(name: str | None) -> int:
        if name is None:
            names = [(v,) for v in sorted(views.ensure_all())]
            sys.stdout.write(sqlviews.format_rows(["view"], names, fmt=args.format))
            return 0
        views.ensure([name])
        try:
            cols = describe_columns(spark, name)
        except AnalysisException as exc:
            return _sql_error(exc)
        sys.stdout.write(sqlviews.format_rows(["column", "type", "comment"], cols, fmt=args.format,
                                              cut=False))
        return 0

    if args.describe:
        return describe(args.describe)
    if not statements:
        return shell(run, describe, stdin=sys.stdin)
    for statement in statements:  # all checked first: one that would write stops the call before any runs
        try:
            check_read_only(spark, statement)
        except AnalysisException as exc:
            return _sql_error(exc)
    worst = 0
    for i, statement in enumerate(statements):
        if i and args.format == "table":
            print()
        worst = max(worst, run(statement))
    return worst


def _inspect(args: argparse.Namespace) -> int:
    from deltawheel.statestore.inspection.sqlviews import key_row_from_files

    layout = layout_from(args)
    # a local store's row is read without starting Spark
    local = key_row_from_files(layout, computation=args.computation, key=args.key) \
        if layout.is_local and os.path.isdir(layout.rows) else False
    spark = _checked_spark(args) if local is False else None
    found = sqlviews.inspect_key(spark, layout, computation=args.computation, key=args.key,
                                 allow_pickle=args.allow_pickle)
    if found is None:
        c, k = args.computation, args.key
        print(f"no row for key {k!r} of computation {c!r}: the key holds no state, timers or pending "
              "productions now (names and keys are case-sensitive); "
              f"deltawheel sql --store {layout.root} \"SELECT key FROM state WHERE computation = '{c}'\" lists the "
              f"computation's keys, deltawheel history --store {layout.root} --computation {c} --key {k} shows a "
              "key's past versions", file=sys.stderr)
        return 1
    print(json.dumps(found, indent=2, ensure_ascii=False))
    return 0


def _sql_server(args: argparse.Namespace) -> int:
    # HiveServer2 settings reach its HiveConf through spark.hadoop.; singleSession: every JDBC connection
    # shares this session and its temp views
    derby = tempfile.mkdtemp(prefix="deltawheel-derby-")
    atexit.register(functools.partial(shutil.rmtree, derby, ignore_errors=True))
    extra = {
        "spark.sql.hive.thriftServer.singleSession": "true",
        "spark.hadoop.hive.server2.thrift.bind.host": args.host,
        "spark.hadoop.hive.server2.thrift.port": str(args.port),
        "spark.hadoop.hive.server2.authentication": "NONE",
        "spark.hadoop.hive.server2.enable.doAs": "false",
        # keep the embedded metastore's derby.log out of the working directory
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={derby}",
    }
    spark = _checked_spark(args, hive_support=True, extra=extra)
    views: list[str] = []
    # read-only, as ``sql``: the clients' statements are checked once parsed and once analysed (writes refused)
    session = read_only_session(spark, lambda s: views.extend(
        sqlviews.register_views(s, layout_from(args), allow_pickle=args.allow_pickle)),
        table_names=lambda: views)
    server = jvm(spark).org.apache.spark.sql.hive.thriftserver.HiveThriftServer2.startWithContext(
        jsession(session).sqlContext()
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"deltawheel sql-server: serving {len(views)} views ({', '.join(views)})", flush=True)
    print(f"deltawheel sql-server: SQLAlchemy URL hive://{args.host}:{args.port}/default", flush=True)
    print("deltawheel sql-server: Ctrl-C or SIGTERM stops it", flush=True)
    while not stop.wait(1.0):
        pass
    print("deltawheel sql-server: stopping", flush=True)
    server.stop()
    spark.stop()
    return 0


SHELL_HELP = ("end a statement with ';' (or an empty line); \\d lists the views, \\d VIEW describes one, "
              "\\q or Ctrl-D quits")


def split_statements(text: str) -> list[str]:
    """The statements of ``text`` split at ``;`` outside quotes, backticks and ``--`` comments.

    >>> split_statements("SELECT ';' AS a; SELECT 2 -- x; y\\n;")
    ["SELECT ';' AS a", 'SELECT 2 -- x; y']
    """
    out: list[str] = []
    cur: list[str] = []
    quote = ""
    comment = False
    for ch in text:
        if comment:
            comment = ch != "\n"
        elif quote:
            quote = "" if ch == quote and (not cur or cur[-1] != "\\") else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "-" and cur and cur[-1] == "-":
            comment = True
        elif ch == ";":
            out.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur).strip())
    return [s for s in out if s]


def _lines(stdin: TextIO, prompt: Callable[[], str]) -> Iterable[str]:
    interactive = stdin.isatty()
    if interactive:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history for input())
    while True:
        if interactive:
            try:
                yield input(prompt())
            except EOFError:
                print(file=sys.stderr)
                return
        else:
            line = stdin.readline()
            if not line:
                return
            yield line.rstrip("\n")


def shell(run: Callable[[str], int], describe: Callable[[str | None], int], *, stdin: TextIO) -> int:
    """Read statements from ``stdin`` until EOF or ``\\q`` and ``run`` each (``describe`` for ``\\d``);
    returns the worst exit code of them (0 if all ran)."""
    if stdin.isatty():
        print(f"deltawheel sql: {SHELL_HELP}", file=sys.stderr)
    worst = 0
    buf: list[str] = []
    for line in _lines(stdin, lambda: "...> " if buf else "sql> "):
        stripped = line.strip()
        if not buf and stripped.startswith("\\"):
            cmd, _, arg = stripped.partition(" ")
            if cmd == "\\q":
                break
            if cmd == "\\d":
                worst = max(worst, describe(arg.strip() or None))
            else:
                print(f"unknown command {cmd}; {SHELL_HELP}", file=sys.stderr)
            continue
        buf.append(line)
        text = "\n".join(buf)
        if stripped.endswith(";") or (not stripped and text.strip()):
            for statement in split_statements(text):
                worst = max(worst, run(statement))
            buf.clear()
        elif not text.strip():
            buf.clear()
    for statement in split_statements("\n".join(buf)):
        worst = max(worst, run(statement))
    return worst
