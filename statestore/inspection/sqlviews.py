"""SQL over a store: views, query formatting, one-key inspection; every query is checked to only read."""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import io
import json
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Sequence, TextIO

from ..exceptions import ConfigError
from ..layout import StoreLayout
from ..rowtable.rows import KeyRow
from .readonly import check_read_only
from .views import decode_json_text, decode_value, register_views

__all__ = ["FORMATS", "decode_value", "decode_json_text", "register_views", "TABLE_MAX_ROWS", "SqlResult",
           "sql_frame", "write_sql", "run_sql", "format_rows", "inspect_key", "row_json"]

FORMATS = ("table", "csv", "json")
_MAX_CELL = 60


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
    """Format query results as ``fmt``: ``table`` (cells cut at 60 characters with ``cut``), ``csv`` (a
    header, NULL empty, binary base64) or ``json`` (JSON Lines); ``total``: when ``rows`` are the first.
    ConfigError: unknown ``fmt``."""
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
    footer = (f"({n} of {total} rows shown; raise --max-rows)" if total is not None and total > n
              else f"({n} row{'s' if n != 1 else ''})")
    return "\n".join(out + [footer]) + "\n"


TABLE_MAX_ROWS = 1000  # the ``table`` format's default cut (csv and json are never cut unasked)


@dataclass(frozen=True)
class SqlResult:
    """What :func:`write_sql` wrote: ``shown`` rows of the query's ``total`` (equal unless cut)."""

    shown: int
    total: int

    @property
    def cut(self) -> bool:
        """Whether rows were left out (``--max-rows``)."""
        return self.shown < self.total


def _write_rows(columns: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO, fmt: str,
                query: int | None = None) -> int:
    """Write ``rows`` as ``csv`` or ``json`` lines (``query``: ``{"query": N, "row": ...}``); the count."""
    n = 0
    if fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([_text(v, null="") for v in r])
            n += 1
        return n
    for r in rows:
        obj = {c: _plain(v) for c, v in zip(columns, r, strict=True)}
        out.write(json.dumps(obj if query is None else {"query": query, "row": obj}, ensure_ascii=False) + "\n")
        n += 1
    return n


def sql_frame(spark: Any, layout: StoreLayout, query: str, *, allow_pickle: bool = False,
              register: bool = True) -> Any:
    """Register the views (unless ``register`` is False), check ``query`` only reads; its DataFrame.

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
              max_rows: int | None = None, allow_pickle: bool = False, register: bool = True,
              number: int | None = None) -> SqlResult:
    """Run ``query`` (:func:`sql_frame`), writing at most ``max_rows`` rows to ``out`` in ``fmt``.
    ConfigError: unknown ``fmt`` or ``max_rows`` < 1."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown output format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if max_rows is not None and max_rows < 1:
        raise ConfigError(f"max_rows must be at least 1, got {max_rows}; leave it out to get every row")
    df = sql_frame(spark, layout, query, allow_pickle=allow_pickle, register=register)
    if fmt != "table" and max_rows is None:
        n = _write_rows(df.columns, df.toLocalIterator(), out, fmt, number)
        return SqlResult(shown=n, total=n)
    limit = TABLE_MAX_ROWS if max_rows is None else max_rows
    got = df.take(limit + 1)
    shown = got[:limit]
    total = df.count() if len(got) > limit else len(got)
    if fmt == "table":
        out.write(format_rows(df.columns, shown, fmt=fmt, total=total))
    else:
        _write_rows(df.columns, shown, out, fmt, number)
    return SqlResult(shown=len(shown), total=total)


def run_sql(spark: Any, layout: StoreLayout, query: str, *, fmt: str = "table", max_rows: int | None = None,
            allow_pickle: bool = False) -> str:
    """:func:`write_sql` into a string."""
    buf = io.StringIO()
    write_sql(spark, layout, query, buf, fmt=fmt, max_rows=max_rows, allow_pickle=allow_pickle)
    return buf.getvalue()


def key_row_from_files(layout: StoreLayout, *, computation: str, key: str) -> KeyRow | None | Literal[False]:
    """One key's row read from a local store's files without Spark (None: no row; False: ask Spark)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from ..delta.deletionvectors import live_table
    from ..delta.log import read_snapshot
    from ..delta.storefs import files_for
    from ..delta.txn import decode_path
    from ..rowtable.tables import list_computations

    if not layout.is_local:
        return False
    if computation not in list_computations(None, layout):
        return None if read_snapshot(layout.rows) is not None else False  # it never committed: no row
    files = files_for(layout.rows_of(computation))
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
    """Everything stored for one key as :func:`row_json` (None: no row); ``spark`` None: local stores only."""
    local = key_row_from_files(layout, computation=computation, key=key)
    if local is False:
        if spark is None:
            raise ConfigError(f"{layout.root}: this store's rows can only be read through Spark; pass a session")
        from pyspark.sql import functions as F

        from ..rowtable.tables import rows_frame

        frame = rows_frame(spark, layout, [computation])
        rows = [] if frame is None else frame.where(
            (F.col("computation") == F.lit(computation)) & (F.col("key") == F.lit(key))).collect()
        local = KeyRow.from_row(rows[0]) if rows else None
    return None if local is None else row_json(local, allow_pickle=allow_pickle)


def row_json(row: KeyRow, *, allow_pickle: bool = False) -> dict[str, Any]:
    """A key's row decoded into plain (JSON-ready) values, as ``inspect`` and ``history`` show it."""
    return {
        "computation": row.computation, "key": row.key, "interval": row.interval, "codec": row.codec,
        "state": decode_value(row.codec, row.state, allow_pickle=allow_pickle),
        "timers": [{"tag": t.tag, "domain": t.domain.value, "time_ms": t.time_ms,
                    "fire_time": dt.datetime.fromtimestamp(t.time_ms / 1000, dt.UTC).isoformat()}
                   for t in row.timers],
        "record_ids": [{"record_id": s.record_id, "seen_ms": s.seen_ms} for s in row.record_ids],
        "pending": [{"production_id": p.production_id, "stream": p.stream, "key": p.key, "codec": p.codec,
                     "value": decode_value(p.codec, p.value, allow_pickle=allow_pickle),
                     "timestamp_ms": p.timestamp_ms} for p in row.pending],
        "watermark_hold_ms": row.watermark_hold_ms, "sequencer": row.sequencer, "commit_id": row.commit_id,
        "updated_ms": row.updated_ms, "format_version": row.format_version,
    }
