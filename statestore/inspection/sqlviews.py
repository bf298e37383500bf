"""SQL over a store: decoded temporary views, query formatting, one-key inspection. Every query
is checked to only read first (:mod:`.readonly`).

:func:`register_views` defines these temporary views on a session:

``rows``
    the rows table without the fence rows.
``state``
    one row per key, decoded: computation, interval, key, codec, state_json,
    next_event_timer, next_processing_timer (TIMESTAMP), n_timers,
    n_record_ids, n_checkpointed, watermark_hold (TIMESTAMP), sequencer,
    commit_id, updated (TIMESTAMP).
``timers``
    one row per timer: computation, key, tag, domain, fire_time (TIMESTAMP), time_ms.
``pending_productions``
    one row per checkpointed, undelivered production: computation, key,
    production_id, stream, out_key, value_json, timestamp (TIMESTAMP).
``fences``
    the fence row of each interval: computation, interval, sequencer, commit_id.
``dead_letters``, ``late_data``, ``audit``
    those tables as they are (``audit``: the changes tools made under the leases, promote and repair;
    with the rows a tool that died before appending them left missing, computed from its rows
    commit: ``auditgap.py``, as this module writes nothing).
``<stream>`` and ``<stream>_decoded``
    each stream table, and the same with a ``value_json`` column.

Values are decoded by the SQL function ``dw_decode(codec, data)``, a Python
UDF returning JSON text (bytes inside msgpack values become
``{"$bytes_b64": "..."}``). Pickled values are shown as ``<pickle: N bytes>``
unless ``allow_pickle=True``; undecodable ones as ``<undecodable CODEC: N bytes>``.

Every view's columns carry comments (``statestore/comments.py``; Spark's ``DESCRIBE``,
``deltawheel sql --describe VIEW``).

The views are defined by SQL text, so each query reads the tables' latest
Delta version (a long-running ``sql-server`` sees new commits).

(Over 500 lines: the views' SQL text, the decoding UDF they call and the formatting of their
results are one contract, read together when a view changes; the as-of reads, the audit gap and
the read-only check already live beside it.)
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import io
import json
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence, TextIO

from ..codecs import base_name, get_codec
from ..comments import STREAM, VALUE_JSON, VIEWS, view_columns
from ..exceptions import CodecError, ConfigError
from ..layout import StoreLayout
from ..rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX, KeyRow
from ..sqltext import sql_path, sql_str
from ..tabledefs import AUDIT_COLUMNS, DEAD_LETTERS_COLUMNS, LATE_DATA_COLUMNS
from ..writepath.streams import BUILTIN_VIEWS, list_streams
from .asof import AsOf
from .auditgap import missing_audit_rows
from .readonly import check_read_only

__all__ = [
    "FORMATS",
    "decode_value",
    "decode_json_text",
    "register_views",
    "TABLE_MAX_ROWS",
    "SqlResult",
    "sql_frame",
    "write_sql",
    "run_sql",
    "format_rows",
    "inspect_key",
    "row_json",
]

FORMATS = ("table", "csv", "json")
_MAX_CELL = 60


# --- decoding -----------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """``value`` with bytes, tuples, sets and odd keys made JSON-friendly."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$bytes_b64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _decode(codec: str, data: bytes, *, allow_pickle: bool) -> tuple[bool, Any]:
    """(True, JSON-friendly value) or (False, a ``<...>`` placeholder string)."""
    if base_name(codec) == "pickle" and not allow_pickle:
        return False, f"<pickle: {len(data)} bytes>"
    try:
        return True, _jsonable(get_codec(codec, allow_pickle=allow_pickle).decode(data))
    except CodecError:
        return False, f"<undecodable {codec}: {len(data)} bytes>"


def decode_value(codec: str, data: bytes | None, *, allow_pickle: bool = False) -> Any:
    """Decode ``data`` for display: a JSON-friendly value, or a ``<...>`` placeholder string.

    Never raises: this feeds views and ``inspect``, which must show bad rows too.

    >>> decode_value("json", b'{"n": 1}')
    {'n': 1}
    >>> decode_value("pickle", b"12345")
    '<pickle: 5 bytes>'
    """
    if data is None:
        return None
    return _decode(codec, bytes(data), allow_pickle=allow_pickle)[1]


def decode_json_text(codec: str, data: bytes | None, *, allow_pickle: bool = False) -> str | None:
    """Like :func:`decode_value` but as JSON text (placeholders stay plain, non-JSON text).

    >>> decode_json_text("json", b'{"b":2,"a":1}')
    '{"a": 1, "b": 2}'
    """
    if data is None:
        return None
    ok, value = _decode(codec, bytes(data), allow_pickle=allow_pickle)
    return json.dumps(value, sort_keys=True, ensure_ascii=False) if ok else str(value)


# --- views --------------------------------------------------------------------


def _is_delta(spark: Any, path: str) -> bool:
    from delta.tables import DeltaTable

    return bool(DeltaTable.isDeltaTable(spark, path))


def register_views(spark: Any, layout: StoreLayout, *, allow_pickle: bool = False,
                   as_of: AsOf | None = None) -> list[str]:
    """Register the store's temporary views (and the ``dw_decode`` UDF) on ``spark``.

    Tables that don't exist yet get no view (no rows table: no ``state``), except ``dead_letters``,
    ``late_data`` and ``audit``: an empty view of their columns. ``as_of``
    (:func:`.asof.resolve_as_of`): every view reads its table at the version given there
    (``state_history`` up to the rows table's), a table without one gets no view (those three:
    an empty one).

    Returns:
        The names of the views registered, built-in ones first, then streams.

    Raises:
        ConfigError: a stream table is named like a built-in view.
    """
    streams = list_streams(spark, layout)
    taken = {v.lower() for v in BUILTIN_VIEWS}
    for name in streams:
        for view in (name, f"{name}_decoded"):
            if view.lower() in taken:
                raise ConfigError(
                    f"stream table {layout.stream(name)} would define the view {view!r}, which is "
                    "already taken by a built-in view or another stream; rename the stream"
                )
            taken.add(view.lower())

    def _decode(codec: str | None, data: bytes | None) -> str | None:
        return decode_json_text(codec or "json", data, allow_pickle=allow_pickle)

    spark.udf.register("dw_decode", _decode, "string")

    views: list[str] = []

    def define(name: str, select: str, comments: Mapping[str, str] | None = None) -> None:
        # a view selecting a table's columns as they are shows the table's column comments;
        # a derived view names its columns with theirs
        columns = view_columns(list(comments), comments) if comments else ""
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW `{name}` {columns} AS {select}")
        views.append(name)

    def source(path: str) -> str | None:
        if as_of is None:
            return sql_path(path) if _is_delta(spark, path) else None
        v = as_of.version_of(path)
        return None if v is None else f"{sql_path(path)} VERSION AS OF {v}"

    fence = sql_str(FENCE_KEY)
    raw = source(layout.rows)
    if raw is not None:
        # the record-ids rows of the image path's ids files are hidden, their ids counted per key
        ids = sql_str(IDS_KEY_PREFIX)
        define("rows", f"SELECT * FROM {raw} WHERE key <> {fence} AND NOT startswith(key, {ids})")
        held = (f"SELECT computation AS i_c, substr(key, {len(IDS_KEY_PREFIX) + 1}) AS i_k, "
                f"sum(size(record_ids)) AS i_n FROM {raw} WHERE startswith(key, {ids}) GROUP BY 1, 2")
        define("state", (
            "SELECT computation, `interval`, key, codec, dw_decode(codec, state) AS state_json, "
            "timestamp_millis(next_event_timer_ms) AS next_event_timer, "
            "timestamp_millis(next_processing_timer_ms) AS next_processing_timer, "
            "coalesce(size(timers), 0) AS n_timers, "
            "coalesce(size(record_ids), 0) + coalesce(i_n, 0) AS n_record_ids, "
            "coalesce(size(pending), 0) AS n_checkpointed, "
            "timestamp_millis(watermark_hold_ms) AS watermark_hold, sequencer, commit_id, "
            f"timestamp_millis(updated_ms) AS updated FROM rows LEFT JOIN ({held}) ON computation = i_c AND key = i_k"
        ), VIEWS["state"])
        define("timers", (
            "SELECT computation, key, t.tag, t.domain, timestamp_millis(t.time_ms) AS fire_time, "
            "t.time_ms FROM rows LATERAL VIEW explode(timers) tt AS t"
        ), VIEWS["timers"])
        define("pending_productions", (
            "SELECT computation, key, p.production_id, p.stream, p.key AS out_key, "
            "dw_decode(p.codec, p.value) AS value_json, "
            "timestamp_millis(p.timestamp_ms) AS `timestamp` "
            "FROM rows LATERAL VIEW explode(pending) pp AS p"
        ), VIEWS["pending_productions"])
        define("fences", (
            f"SELECT computation, `interval`, sequencer, commit_id FROM {raw} WHERE key = {fence}"
        ), VIEWS["fences"])
        if _state_history_source(spark, layout, as_of):
            define("state_history", (
                "SELECT computation, `interval`, key, version, timestamp_millis(commit_time_ms) AS commit_time, "
                "change, writer, kind, codec, dw_decode(codec, state) AS state_json, size(timers) AS n_timers, "
                "timers, n_record_ids, size(pending) AS n_checkpointed, "
                "timestamp_millis(watermark_hold_ms) AS watermark_hold, sequencer, commit_id, "
                "timestamp_millis(updated_ms) AS updated FROM _dw_state_history"
            ), VIEWS["state_history"])
    for name, path, ddl in (("dead_letters", layout.dead_letters, DEAD_LETTERS_COLUMNS),
                           ("late_data", layout.late_data, LATE_DATA_COLUMNS),
                           ("audit", layout.audit, AUDIT_COLUMNS)):
        src = source(path)
        gap = _audit_gap(spark, layout, as_of) if name == "audit" and raw is not None else []
        if gap:  # rows a tool that died did not append (this tool writes nothing): shown from the commits
            spark.createDataFrame(gap, ddl).createOrReplaceTempView("_dw_audit_recovered")
            cols = ", ".join(f"`{c.split()[0]}`" for c in ddl.split(", "))
            define(name, (f"SELECT {cols} FROM {src} UNION ALL " if src is not None else "")
                   + f"SELECT {cols} FROM _dw_audit_recovered")
        elif src is not None:
            define(name, f"SELECT * FROM {src}")
        else:  # not written yet (or not at ``as_of``): an empty view of the table's columns
            spark.createDataFrame([], ddl).createOrReplaceTempView(name)
            views.append(name)
    for name in streams:
        if (src := source(layout.stream(name))) is None:
            continue
        define(name, f"SELECT * FROM {src}")
        columns = [*spark.table(name).columns, "value_json"]
        define(f"{name}_decoded", f"SELECT *, dw_decode(codec, value) AS value_json FROM `{name}`",
               {c: STREAM.get(c, VALUE_JSON if c == "value_json" else "") for c in columns})
    return views


def _audit_gap(spark: Any, layout: StoreLayout, as_of: AsOf | None) -> list[dict[str, Any]]:
    """The audit rows missing for tools' rows commits (``auditgap.py``), as of ``as_of``."""
    if as_of is None:
        return missing_audit_rows(spark, layout)
    rows_v = as_of.version_of(layout.rows)
    if rows_v is None:
        return []
    audit_v = as_of.version_of(layout.audit)
    return missing_audit_rows(spark, layout, rows_version=rows_v, audit_version=audit_v,
                              audit_existed=audit_v is not None)


def _state_history_source(spark: Any, layout: StoreLayout, as_of: AsOf | None) -> bool:
    """Register the raw ``_dw_state_history`` view (a Python data source read only when queried);
    False for a store whose files Python does not reach."""
    from ..delta.storefs import table_files
    from .historysource import StateHistorySource, source_options

    files = table_files(spark, layout.rows)
    if files is None:
        return False
    spark.dataSource.register(StateHistorySource)
    (spark.read.format(StateHistorySource.name())
     .options(**source_options(files, to_version=None if as_of is None else as_of.rows_version))
     .load().createOrReplaceTempView("_dw_state_history"))
    return True


# --- formatting ---------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A query result value as something ``json.dumps`` accepts."""
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _text(value: Any, *, null: str) -> str:
    if value is None:
        return null
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float, decimal.Decimal, dt.date)):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    return json.dumps(_plain(value), ensure_ascii=False, sort_keys=True)


def _cut(s: str) -> str:
    s = s.replace("\n", "\\n")
    return s if len(s) <= _MAX_CELL else s[: _MAX_CELL - 3] + "..."


def format_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, fmt: str = "table",
                total: int | None = None, cut: bool = True) -> str:
    """Format query results.

    Args:
        columns: column names.
        rows: the rows (tuples or ``pyspark.sql.Row``).
        fmt: ``table`` (aligned, for people: long cells cut to 60 characters,
            NULL shown as ``NULL``, ``(N rows)`` footer), ``csv`` (header line,
            RFC 4180 quoting, NULL as an empty field, timestamps ISO 8601,
            binary base64) or ``json`` (JSON Lines: one object per row, no
            enclosing array, so output can be streamed and cut).
        total: the query's row count when ``rows`` are only the first of them: the ``table``
            footer then says ``(N of TOTAL rows shown; raise --max-rows)``.
        cut: ``table`` cuts cells longer than 60 characters (False: shows them whole).

    Raises:
        ConfigError: unknown ``fmt``.
    """
    if fmt in ("csv", "json"):
        buf = io.StringIO()
        _write_rows(columns, rows, buf, fmt)
        return buf.getvalue()
    if fmt != "table":
        raise ConfigError(f"unknown output format {fmt!r}; choose one of {', '.join(FORMATS)}")
    cells = [[(_cut if cut else str)(_text(v, null="NULL")) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    numeric = [bool(rows) and all(isinstance(r[i], (int, float, decimal.Decimal)) and
                                  not isinstance(r[i], bool) for r in rows if r[i] is not None)
               for i in range(len(columns))]

    def line(vals: Sequence[str]) -> str:
        return " | ".join(v.rjust(w) if num else v.ljust(w)
                          for v, w, num in zip(vals, widths, numeric, strict=True)).rstrip()

    out = [line(list(columns)), "-+-".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    n = len(rows)
    if total is not None and total > n:
        footer = f"({n} of {total} rows shown; raise --max-rows)"
    else:
        footer = f"({n} row{'s' if n != 1 else ''})"
    return "\n".join(out + [footer]) + "\n"


TABLE_MAX_ROWS = 1000  # the ``table`` format's default cut (people read it; csv and json are never cut unasked)


@dataclass(frozen=True)
class SqlResult:
    """What :func:`write_sql` wrote: ``shown`` rows of the query's ``total`` (equal unless cut)."""

    shown: int
    total: int

    @property
    def cut(self) -> bool:
        """Whether rows were left out (``--max-rows``)."""
        return self.shown < self.total


def _write_rows(columns: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO, fmt: str) -> int:
    """Write ``rows`` as ``csv`` (with its header) or ``json`` lines to ``out`` as they come; the count."""
    n = 0
    if fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([_text(v, null="") for v in r])
            n += 1
        return n
    for r in rows:
        out.write(json.dumps({c: _plain(v) for c, v in zip(columns, r, strict=True)}, ensure_ascii=False) + "\n")
        n += 1
    return n


def sql_frame(spark: Any, layout: StoreLayout, query: str, *, allow_pickle: bool = False,
              register: bool = True) -> Any:
    """Register the views (unless ``register`` is False: the caller did), check ``query`` only reads (:func:`check_read_only`) and return its DataFrame.

    Raises:
        ReadOnlySqlError: ``query`` would change something; nothing was run.
        ConfigError: a stream named like a built-in view.
        pyspark.errors.AnalysisException: the query is not valid SQL or names an unknown table/column.
    """
    if register:
        register_views(spark, layout, allow_pickle=allow_pickle)
    check_read_only(spark, query)
    return spark.sql(query)


def write_sql(spark: Any, layout: StoreLayout, query: str, out: TextIO, *, fmt: str = "table",
              max_rows: int | None = None, allow_pickle: bool = False, register: bool = True) -> SqlResult:
    """Run ``query`` (:func:`sql_frame`) and write its rows to ``out`` in ``fmt`` (see :func:`format_rows`).

    ``csv`` and ``json`` write every row, streamed from Spark a partition at a time (memory stays
    flat however many rows), unless ``max_rows`` is given; ``table`` shows at most ``max_rows``
    (default :data:`TABLE_MAX_ROWS`) and, when it cuts, counts the total so the caller can say so.

    Raises:
        ConfigError: unknown ``fmt`` or ``max_rows`` < 1; and what :func:`sql_frame` raises.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown output format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if max_rows is not None and max_rows < 1:
        raise ConfigError(f"max_rows must be at least 1, got {max_rows}; leave it out to get every row")
    df = sql_frame(spark, layout, query, allow_pickle=allow_pickle, register=register)
    if fmt != "table" and max_rows is None:
        n = _write_rows(df.columns, df.toLocalIterator(), out, fmt)
        return SqlResult(shown=n, total=n)
    limit = TABLE_MAX_ROWS if max_rows is None else max_rows
    got = df.take(limit + 1)
    shown = got[:limit]
    total = df.count() if len(got) > limit else len(got)
    if fmt == "table":
        out.write(format_rows(df.columns, shown, fmt=fmt, total=total))
    else:
        _write_rows(df.columns, shown, out, fmt)
    return SqlResult(shown=len(shown), total=total)


def run_sql(spark: Any, layout: StoreLayout, query: str, *, fmt: str = "table", max_rows: int | None = None,
            allow_pickle: bool = False) -> str:
    """:func:`write_sql` into a string (``csv``/``json``: every row unless ``max_rows``; ``table``: at
    most ``max_rows``, default :data:`TABLE_MAX_ROWS`, its footer saying how many of how many)."""
    buf = io.StringIO()
    write_sql(spark, layout, query, buf, fmt=fmt, max_rows=max_rows, allow_pickle=allow_pickle)
    return buf.getvalue()


def key_row_from_files(layout: StoreLayout, *, computation: str, key: str) -> KeyRow | None | Literal[False]:
    """One key's row read with pyarrow from the data files the rows table's Delta log names, no
    Spark: a local store only (deletion vectors applied). Returns the row, None when the key has
    none, or False where only Spark can answer exactly (not a local folder, an unreadable log)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from ..delta.deletionvectors import live_table
    from ..delta.log import read_snapshot
    from ..delta.storefs import files_for
    from ..delta.txn import decode_path

    if not layout.is_local:
        return False
    files = files_for(layout.rows)
    snap = None if files is None else read_snapshot(files)
    if files is None or snap is None:
        return False
    found: list[dict[str, Any]] = []
    for add in snap.adds:
        pv = add.get("partitionValues") or {}
        if pv.get("computation") != computation:
            continue
        rel = decode_path(str(add["path"]))
        if add.get("deletionVector"):  # the rows its deletion vector leaves live, then the key's
            table = live_table(files, rel, dict(add["deletionVector"]))
            table = table.filter(pc.equal(table.column("key"), key))
        else:
            table = pq.read_table(files.path(rel), filters=[("key", "=", key)])
        found += [{**r, "computation": computation, "interval": int(pv["interval"])} for r in table.to_pylist()]
    return KeyRow.from_row(found[0]) if found else None


def inspect_key(spark: Any, layout: StoreLayout, *, computation: str, key: str,
                allow_pickle: bool = False) -> dict[str, Any] | None:
    """Everything stored for one key, decoded into plain (JSON-ready) Python values.

    ``spark`` may be None for a local store: the row is then read without Spark
    (:func:`key_row_from_files`), and a store only Spark can read raises ConfigError.

    Returns:
        ``None`` if the key has no row; else a dict with computation, key,
        interval, codec, state (decoded), timers, record_ids, pending (values
        decoded), watermark_hold_ms, sequencer, commit_id, updated_ms and
        format_version.
    """
    local = key_row_from_files(layout, computation=computation, key=key)
    if local is False:
        if spark is None:
            raise ConfigError(f"{layout.root}: this store's rows can only be read through Spark; pass a session")
        from pyspark.sql import functions as F

        df = spark.read.format("delta").load(layout.rows).where(
            (F.col("computation") == F.lit(computation)) & (F.col("key") == F.lit(key))
        )
        rows = df.collect()
        local = KeyRow.from_row(rows[0]) if rows else None
    if local is None:
        return None
    return row_json(local, allow_pickle=allow_pickle)


def row_json(row: KeyRow, *, allow_pickle: bool = False) -> dict[str, Any]:
    """A key's row decoded into plain (JSON-ready) values, as ``inspect`` and ``history`` show it."""
    return {
        "computation": row.computation,
        "key": row.key,
        "interval": row.interval,
        "codec": row.codec,
        "state": decode_value(row.codec, row.state, allow_pickle=allow_pickle),
        "timers": [
            {"tag": t.tag, "domain": t.domain.value, "time_ms": t.time_ms,
             "fire_time": dt.datetime.fromtimestamp(t.time_ms / 1000, dt.UTC).isoformat()}
            for t in row.timers
        ],
        "record_ids": [{"record_id": s.record_id, "seen_ms": s.seen_ms} for s in row.record_ids],
        "pending": [
            {"production_id": p.production_id, "stream": p.stream, "key": p.key, "codec": p.codec,
             "value": decode_value(p.codec, p.value, allow_pickle=allow_pickle),
             "timestamp_ms": p.timestamp_ms}
            for p in row.pending
        ],
        "watermark_hold_ms": row.watermark_hold_ms,
        "sequencer": row.sequencer,
        "commit_id": row.commit_id,
        "updated_ms": row.updated_ms,
        "format_version": row.format_version,
    }
