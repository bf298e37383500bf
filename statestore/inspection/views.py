"""The store's decoded temporary views, each defined on a session when a statement first needs it
(the costly ``audit`` and ``state_history`` cost only when used); a bad stored value shows as ``<...>``."""

from __future__ import annotations

import base64
import json
import re
from functools import reduce
from typing import Any, Callable, Iterable, Mapping

from ..codecs import base_name, get_codec
from ..comments import STREAM, VALUE_JSON, VIEWS, view_columns
from ..delta.log import local_table_exists
from ..exceptions import CodecError, ConfigError
from ..layout import StoreLayout
from ..rowtable.rows import FENCE_KEY, IDS_KEY_PREFIX
from ..rowtable.tables import rows_tables
from ..sqltext import sql_path, sql_str
from ..tabledefs import AUDIT_COLUMNS, DEAD_LETTERS_COLUMNS, LATE_DATA_COLUMNS
from ..writepath.streams import BUILTIN_VIEWS, list_streams
from .asof import AsOf
from .auditgap import audit_gap

__all__ = ["StoreViews", "named_views", "register_views", "decode_value", "decode_json_text"]

#: the views of the rows tables, in the order they are defined
_ROWS_VIEWS = ("rows", "state", "timers", "pending_productions", "fences", "state_history")
#: the side tables: an empty view of their columns before the table exists
_SIDE_TABLES = ("dead_letters", "late_data", "audit")


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
    """Decode ``data`` for display: a JSON-friendly value, or a ``<...>`` placeholder; never raises.

    >>> decode_value("json", b'{"n": 1}')
    {'n': 1}
    >>> decode_value("pickle", b"12345")
    '<pickle: 5 bytes>'
    """
    return None if data is None else _decode(codec, bytes(data), allow_pickle=allow_pickle)[1]


def decode_json_text(codec: str, data: bytes | None, *, allow_pickle: bool = False) -> str | None:
    """Like :func:`decode_value` but as JSON text (placeholders stay plain, non-JSON text).

    >>> decode_json_text("json", b'{"b":2,"a":1}')
    '{"a": 1, "b": 2}'
    """
    if data is None:
        return None
    ok, value = _decode(codec, bytes(data), allow_pickle=allow_pickle)
    return json.dumps(value, sort_keys=True, ensure_ascii=False) if ok else str(value)


def named_views(statement: str, names: Iterable[str]) -> list[str]:
    """The ``names`` that ``statement`` mentions as a word (any case, quoted or not; maybe a few more).

    >>> named_views("SELECT key FROM State s JOIN `timers` USING (key) WHERE note = 'rows'", BUILTIN_VIEWS)
    ['rows', 'state', 'timers']
    """
    words = {w.lower() for w in re.findall(r"[^\W\d]\w*", statement)}
    return [n for n in names if n.lower() in words]


class StoreViews:
    """The views of ``layout`` on ``spark``, defined as :meth:`ensure` asks. ``as_of``: tables read at
    those versions (one without: left out); ``rows_source``: SQL read in the rows tables' place.
    ConfigError (when constructed): a stream table is named like a built-in view."""

    def __init__(self, spark: Any, layout: StoreLayout, *, allow_pickle: bool = False,
                 as_of: AsOf | None = None, rows_source: str | None = None) -> None:
        self.spark, self.layout, self.allow_pickle, self.as_of = spark, layout, allow_pickle, as_of
        self.streams = list_streams(spark, layout)
        taken = {v.lower() for v in BUILTIN_VIEWS}
        for name in self.streams:
            for view in (name, f"{name}_decoded"):
                if view.lower() in taken:
                    raise ConfigError(
                        f"stream table {layout.stream(name)} would define the view {view!r}, which is "
                        "already taken by a built-in view or another stream; rename the stream")
                taken.add(view.lower())
        self.defined: list[str] = []  # in the order they were defined
        self._tried: set[str] = set()
        # the rows tables' source text (None: no table, or not looked yet), or ``rows_source``
        self._raw: str | None = rows_source
        self._raw_known = rows_source is not None
        self._udf = False

    def candidates(self) -> list[str]:
        """Every view this store can have, in :func:`register_views`' order (some may get none)."""
        return [*_ROWS_VIEWS, *_SIDE_TABLES, *(v for s in self.streams for v in (s, f"{s}_decoded"))]

    def for_statement(self, statement: str) -> list[str]:
        """:meth:`ensure` the views ``statement`` names (:func:`named_views`); the views defined now."""
        return self.ensure(named_views(statement, self.candidates()))

    def ensure(self, names: Iterable[str]) -> list[str]:
        """Define ``names`` (and the views they read) that are not defined yet; every view defined now."""
        wanted = {n.lower() for n in names}
        for name in self.candidates():
            if name.lower() in wanted and name not in self._tried:
                self._tried.add(name)
                self._define(name)
        return list(self.defined)

    def ensure_all(self) -> list[str]:
        """Define every view; the views defined, built-in ones first, then streams."""
        self.ensure(self.candidates())
        order = {n: i for i, n in enumerate(self.candidates())}
        return sorted(self.defined, key=order.__getitem__)

    def _decoder(self) -> None:
        if self._udf:
            return
        allow = self.allow_pickle

        def decode(codec: str | None, data: bytes | None) -> str | None:
            return decode_json_text(codec or "json", data, allow_pickle=allow)

        self.spark.udf.register("dw_decode", decode, "string")
        self._udf = True

    def _sql(self, name: str, select: str, comments: Mapping[str, str] | None = None) -> None:
        # a derived view names its columns with the table's comments
        columns = view_columns(list(comments), comments) if comments else ""
        self.spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW `{name}` {columns} AS {select}")
        self.defined.append(name)

    def _source(self, path: str) -> str | None:
        """The SQL naming the Delta table at ``path`` (at ``as_of``'s version); None: no table."""
        if self.as_of is None:
            exists = local_table_exists(path)  # a local table: its log's files, no JVM call
            if exists is None:
                from delta.tables import DeltaTable

                exists = bool(DeltaTable.isDeltaTable(self.spark, path))
            return sql_path(path) if exists else None
        return None if self.as_of.version_of(path) is None else self._table_source(path)

    def _rows_tables(self) -> dict[str, str]:
        """computation -> its rows table, for the computations with one (at ``as_of``: one by then)."""
        tables = rows_tables(self.spark, self.layout)
        if self.as_of is None:
            return tables
        return {c: p for c, p in tables.items() if self.as_of.version_of(p) is not None}

    def _rows_source(self) -> str | None:
        """SQL naming every computation's rows (a UNION ALL of their tables); None: no table at all."""
        if not self._raw_known:
            sources = [f"SELECT * FROM {self._table_source(p)}" for p in self._rows_tables().values()]
            if not sources and (first := self._source(self.layout.rows)) is not None:
                sources = [f"SELECT * FROM {first}"]  # no computation yet: the first table's columns, no row
            self._raw = f"({' UNION ALL '.join(sources)})" if sources else None
            self._raw_known = True
        return self._raw

    def _table_source(self, path: str) -> str:
        """The SQL naming the existing Delta table at ``path`` (at ``as_of``'s version)."""
        v = None if self.as_of is None else self.as_of.version_of(path)
        return sql_path(path) if v is None else f"{sql_path(path)} VERSION AS OF {v}"

    def _define(self, name: str) -> None:
        definers: dict[str, Callable[[], None]] = {
            "rows": self._rows, "state": self._state, "timers": self._timers,
            "pending_productions": self._pending, "fences": self._fences, "state_history": self._history}
        if name in definers:
            if self._rows_source() is not None:
                definers[name]()
        elif name in _SIDE_TABLES:
            self._side(name)
        elif name.endswith("_decoded") and name[: -len("_decoded")] in self.streams:
            self.ensure([name[: -len("_decoded")]])
            if name[: -len("_decoded")] in self.defined:
                self._decoded(name[: -len("_decoded")])
        elif name in self.streams and (src := self._source(self.layout.stream(name))) is not None:
            self._sql(name, f"SELECT * FROM {src}")

    def _rows(self) -> None:
        # the record-ids rows of the image path's ids files are hidden, their ids counted per key
        fence, ids = sql_str(FENCE_KEY), sql_str(IDS_KEY_PREFIX)
        self._sql("rows", f"SELECT * FROM {self._raw} WHERE key <> {fence} AND NOT startswith(key, {ids})")

    def _state(self) -> None:
        self.ensure(["rows"])
        self._decoder()
        ids = sql_str(IDS_KEY_PREFIX)
        held = (f"SELECT computation AS i_c, substr(key, {len(IDS_KEY_PREFIX) + 1}) AS i_k, "
                f"sum(size(record_ids)) AS i_n FROM {self._raw} WHERE startswith(key, {ids}) GROUP BY 1, 2")
        self._sql("state", (
            "SELECT computation, `interval`, key, codec, dw_decode(codec, state) AS state_json, "
            "timestamp_millis(next_event_timer_ms) AS next_event_timer, "
            "timestamp_millis(next_processing_timer_ms) AS next_processing_timer, "
            "coalesce(size(timers), 0) AS n_timers, "
            "coalesce(size(record_ids), 0) + coalesce(i_n, 0) AS n_record_ids, "
            "coalesce(size(pending), 0) AS n_checkpointed, "
            "timestamp_millis(watermark_hold_ms) AS watermark_hold, sequencer, commit_id, "
            f"timestamp_millis(updated_ms) AS updated FROM rows LEFT JOIN ({held}) ON computation = i_c AND key = i_k"
        ), VIEWS["state"])

    def _timers(self) -> None:
        self.ensure(["rows"])
        self._sql("timers", (
            "SELECT computation, key, t.tag, t.domain, timestamp_millis(t.time_ms) AS fire_time, "
            "t.time_ms FROM rows LATERAL VIEW explode(timers) tt AS t"
        ), VIEWS["timers"])

    def _pending(self) -> None:
        self.ensure(["rows"])
        self._decoder()
        self._sql("pending_productions", (
            "SELECT computation, key, p.production_id, p.stream, p.key AS out_key, "
            "dw_decode(p.codec, p.value) AS value_json, "
            "timestamp_millis(p.timestamp_ms) AS `timestamp` "
            "FROM rows LATERAL VIEW explode(pending) pp AS p"
        ), VIEWS["pending_productions"])

    def _fences(self) -> None:
        self._sql("fences", (
            f"SELECT computation, `interval`, sequencer, commit_id FROM {self._raw} WHERE key = {sql_str(FENCE_KEY)}"
        ), VIEWS["fences"])

    def _history(self) -> None:
        """The ``state_history`` view over a Python data source (none where Python cannot reach the files)."""
        from ..delta.storefs import table_files
        from .historysource import StateHistorySource, source_options

        frames: list[Any] = []
        for path in self._rows_tables().values():  # one source per computation's table
            files = table_files(self.spark, path)
            if files is None:
                return
            if not frames:
                self.spark.dataSource.register(StateHistorySource)
            to_version = None if self.as_of is None else self.as_of.version_of(path)
            frames.append(self.spark.read.format(StateHistorySource.name())
                          .options(**source_options(files, to_version=to_version)).load())
        if not frames:
            return
        self._decoder()
        reduce(lambda a, b: a.unionByName(b), frames).createOrReplaceTempView("_dw_state_history")
        self._sql("state_history", (
            "SELECT computation, `interval`, key, version, timestamp_millis(commit_time_ms) AS commit_time, "
            "change, writer, kind, codec, dw_decode(codec, state) AS state_json, size(timers) AS n_timers, "
            "timers, n_record_ids, size(pending) AS n_checkpointed, "
            "timestamp_millis(watermark_hold_ms) AS watermark_hold, sequencer, commit_id, "
            "timestamp_millis(updated_ms) AS updated FROM _dw_state_history"
        ), VIEWS["state_history"])

    def _side(self, name: str) -> None:
        path, ddl = {"dead_letters": (self.layout.dead_letters, DEAD_LETTERS_COLUMNS),
                     "late_data": (self.layout.late_data, LATE_DATA_COLUMNS),
                     "audit": (self.layout.audit, AUDIT_COLUMNS)}[name]
        src = self._source(path)
        gap = self._audit_gap() if name == "audit" and self._rows_source() is not None else []
        if gap:  # rows a tool that died did not append (this tool writes nothing): shown from the commits
            self.spark.createDataFrame(gap, ddl).createOrReplaceTempView("_dw_audit_recovered")
            cols = ", ".join(f"`{c.split()[0]}`" for c in ddl.split(", "))
            self._sql(name, (f"SELECT {cols} FROM {src} UNION ALL " if src is not None else "")
                      + f"SELECT {cols} FROM _dw_audit_recovered")
        elif src is not None:
            self._sql(name, f"SELECT * FROM {src}")
        else:  # not written yet (or not at ``as_of``): an empty view of the table's columns
            self.spark.createDataFrame([], ddl).createOrReplaceTempView(name)
            self.defined.append(name)

    def _audit_gap(self) -> list[dict[str, Any]]:
        """The audit rows missing for tools' commits to every rows table, as of ``as_of``."""
        tables = [self.layout.rows, *rows_tables(self.spark, self.layout).values()]
        if self.as_of is None:
            return [r for t in tables for r in audit_gap(self.spark, self.layout, table=t).rows]
        audit_v = self.as_of.version_of(self.layout.audit)
        return [r for t in tables if (v := self.as_of.version_of(t)) is not None
                for r in audit_gap(self.spark, self.layout, table=t, rows_version=v, audit_version=audit_v,
                                   audit_existed=audit_v is not None).rows]

    def _decoded(self, stream: str) -> None:
        self._decoder()
        columns = [*self.spark.table(stream).columns, "value_json"]
        self._sql(f"{stream}_decoded", f"SELECT *, dw_decode(codec, value) AS value_json FROM `{stream}`",
                  {c: STREAM.get(c, VALUE_JSON if c == "value_json" else "") for c in columns})


def register_views(spark: Any, layout: StoreLayout, *, allow_pickle: bool = False,
                   as_of: AsOf | None = None) -> list[str]:
    """Register every view of the store and ``dw_decode``; their names, built-in ones first, then streams."""
    return StoreViews(spark, layout, allow_pickle=allow_pickle, as_of=as_of).ensure_all()
