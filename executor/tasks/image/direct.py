"""Image tasks that read a Parquet injector's files with pyarrow and prepare them as the JVM does.

Anything unrecognised takes the JVM path. docs/embedding.md, "Direct read"."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any, Sequence

from deltawheel.statestore.delta.jvm import jframe
from deltawheel.statestore.delta.sourceoffsets import add_file_name, batch_adds
from deltawheel.statestore.delta.storefs import S3Settings, TableFiles, files_for, local_path
from deltawheel.statestore.rowtable.rows import MAX_KEY_BYTES, key_hash

from ...exceptions import InputFileError
from ..input import (
    _ERR,  # the key extractors' error marker (a key column can hold it too)
    MALFORMED_CODEC,
    MALFORMED_REASON,
    MAX_EVENT_MS,
    MIN_EVENT_MS,
    KafkaRead,
    ahead_reason,
    range_reason,
)

__all__ = ["DirectSource", "DirectBatch", "BatchReader", "batch_files", "direct_source", "direct_table", "marker_rows",
           "table_source", "TABLE_TYPES"]

#: A stream table's columns the direct read takes, with their Arrow types (``streams.stream_schema_ddl``)
TABLE_TYPES = (("record_id", "string"), ("key", "string"), ("value", "binary"), ("codec", "string"),
               ("timestamp_ms", "int64"), ("commit_id", "string"))

@dataclass(frozen=True, kw_only=True)
class DirectSource:
    """A Parquet injector's columns as its stream schema maps them; ``types``: their Arrow types."""

    stream: str  # the input stream: the injector's name
    key_column: str
    event_time_column: str
    record_id_column: str | None
    types: tuple[tuple[str, str], ...]
    value_columns: tuple[str, ...] = ()  # sorted, as the JVM orders the value's fields
    s3: S3Settings | None = None  # how to reach an s3a:// folder's files (None: a local folder)
    # a stream table's (:func:`table_source`): its local folder and the reading query's checkpoint
    table: str | None = None
    checkpoint: str | None = None
    adds: tuple[dict[str, Any], ...] | None = None  # a fused stage's batch: the table's files it reads (``fused.py``)
    kafka: KafkaRead | None = None  # a Kafka injector's (``kafkaread.py``): its offset ranges, not files

    @property
    def columns(self) -> list[str]:
        """The names of the columns read, in ``types`` order."""
        return [c for c, _t in self.types]


@dataclass(frozen=True, kw_only=True)
class DirectBatch:
    """What the tasks of one batch read: plain values, pickled to the workers."""

    source: DirectSource
    files: tuple[tuple[str, str], ...]  # (local path or s3a:// URI, the file name as Spark's _metadata.file_name)
    num_intervals: int
    late_before: int | None  # records with an earlier event time are late
    tasks: tuple[tuple[int, ...], ...]  # per task (partition index): its intervals
    ahead: tuple[int, int] | None = None  # (processing time now, bound): later event times are dead letters
    ranges: tuple[tuple[int, int, int], ...] = ()  # a Kafka source's: (partition, from, until) per Spark's offsets


def batch_files(df: Any, source: DirectSource, *, batch_id: int | None = None) -> tuple[tuple[str, str], ...] | None:
    """The files a ``foreachBatch`` frame of ``source``'s stream reads, each whole, or None (JVM path)."""
    if source.table is not None:
        return _table_files(source, batch_id)
    try:
        plan = jframe(df).queryExecution().logical()
        if not plan.getClass().getName().endswith(".LogicalRDD"):
            return None
        rdd = plan.rdd()
        while True:
            deps = rdd.dependencies()
            if deps.size() == 0:
                break
            if deps.size() != 1:
                return None
            rdd = deps.head().rdd()
        if not rdd.getClass().getName().endswith(".FileScanRDD"):
            return None
        spans: dict[str, list[tuple[int, int]]] = {}
        parts = rdd.filePartitions()
        for i in range(parts.size()):
            for f in parts.apply(i).files():
                spans.setdefault(f.filePath().toString(), []).append((int(f.start()), int(f.length())))
    except Exception:
        return None
    out = []
    for uri, parts_read in sorted(spans.items()):
        local = local_path(uri)
        path = urllib.parse.unquote(local if local is not None else uri)
        end = 0
        for start, length in sorted(parts_read):
            if start != end:
                return None
            end = start + length
        if not _fits(_file(path, source.s3), source, end):
            return None
        out.append((path, uri.rsplit("/", 1)[-1]))
    return tuple(out)


def _table_files(source: DirectSource, batch_id: int | None) -> tuple[tuple[str, str], ...] | None:
    """The data files of ``source``'s table micro-batch ``batch_id`` read (None: not known here)."""
    import os

    assert source.table is not None
    if source.adds is not None:
        adds: tuple[dict[str, Any], ...] | None = source.adds
    else:
        assert source.checkpoint is not None
        adds = None if batch_id is None else batch_adds(source.checkpoint, batch_id, source.table)
    if adds is None:
        return None
    out = []
    for add in adds:
        path = os.path.join(source.table, urllib.parse.unquote(add["path"]))
        if not _fits(_file(path, None), source):
            return None
        out.append((path, add_file_name(add)))
    return tuple(out)


def _fits(file: TableFiles | None, source: DirectSource, size: int | None = None) -> bool:
    """``file`` reads, with ``source``'s columns of their types (and ``size`` bytes, when given)."""
    import pyarrow as pa

    if file is None:
        return False
    try:
        if size is not None and file.size() != size:
            return False
        got = {f.name: _plain(f.type) for f in file.read_schema("")}
    except (OSError, pa.ArrowException):
        return False
    return all(got.get(c) == t for c, t in source.types)


def table_source(stream: str, table: str, *, checkpoint: str | None,
                 adds: tuple[dict[str, Any], ...] | None = None) -> DirectSource | None:
    """The :class:`DirectSource` of the local stream table ``table`` for input ``stream`` (else None):
    the files of the reading query's micro-batch (``checkpoint``), or ``adds``."""
    folder = local_path(table)
    chk = None if checkpoint is None else local_path(checkpoint)
    if folder is None or (chk is None and adds is None):
        return None
    return DirectSource(stream=stream, key_column="key", event_time_column="timestamp_ms",
                        record_id_column="record_id", types=TABLE_TYPES, value_columns=(), s3=None,
                        table=folder, checkpoint=chk, adds=adds)


def _file(path: str, s3: S3Settings | None) -> TableFiles | None:
    """One input file (a local path or an ``s3a://`` URI, with the injector's S3 settings)."""
    if path.startswith("s3a://") and s3 is None:
        return None
    return files_for(path, s3)


def _plain(ty: Any) -> str:
    import pyarrow as pa

    return "string" if pa.types.is_large_string(ty) else str(ty)


def direct_source(name: str, arrow_schema: Any, *, key_column: str | None, event_time_column: str,
                  record_id_column: str | None, value_columns: Sequence[str] | None,
                  s3: S3Settings | None = None) -> DirectSource | None:
    """A :class:`DirectSource` for an injector's columns, or None when a type needs the JVM."""
    return direct_or_reason(name, arrow_schema, key_column=key_column, event_time_column=event_time_column,
                            record_id_column=record_id_column, value_columns=value_columns, s3=s3)[0]


def direct_or_reason(name: str, arrow_schema: Any, *, key_column: str | None, event_time_column: str,
                     record_id_column: str | None, value_columns: Sequence[str] | None,
                     s3: S3Settings | None = None) -> tuple[DirectSource | None, str | None]:
    """(:func:`direct_source`, None), or (None, why the image tasks cannot read the files themselves)."""
    import pyarrow as pa

    t = pa.types
    fields = {f.name: f.type for f in arrow_schema}
    if key_column is None or key_column not in fields or event_time_column not in fields:
        return None, "the key or event-time column is not a column of the files (a computed key?)"
    if value_columns is None:
        value_columns = [c for c in fields if c not in (event_time_column, record_id_column)]
    values = tuple(sorted(set(value_columns)))
    cols = [key_column, event_time_column] + ([record_id_column] if record_id_column else [])
    if len(set(cols)) != len(cols) or (record_id_column is not None and record_id_column not in fields):
        return None, "the key, event-time and record-id columns are not three distinct columns of the files"
    for c in values:
        ty = fields.get(c)
        if ty is None or not (t.is_string(ty) or t.is_large_string(ty) or t.is_boolean(ty)
                              or t.is_signed_integer(ty) or t.is_float64(ty)):
            return None, (f"value column {c!r} is {ty}; the tasks read strings, booleans, signed integers and "
                          "doubles")
    cols += [c for c in values if c not in cols]
    for k in (key_column, record_id_column):
        if k is not None and not (t.is_string(fields[k]) or t.is_large_string(fields[k])):
            return None, f"column {k!r} is {fields[k]}, not a string"
    et = fields[event_time_column]
    if not ((t.is_timestamp(et) and et.tz is not None and et.unit in ("ms", "us"))
            or t.is_int64(et) or t.is_int32(et)):
        return None, (f"event-time column {event_time_column!r} is {et}; the tasks read a timestamp with a time "
                      "zone (ms or us: write it with tz='UTC') or an integer of epoch milliseconds")
    return DirectSource(stream=name, key_column=key_column, event_time_column=event_time_column,
                        record_id_column=record_id_column, types=tuple((c, _plain(fields[c])) for c in cols),
                        value_columns=values, s3=s3), None


class BatchReader:
    """One task's view of the batch's files: each read, and its keys hashed, once."""

    def __init__(self, batch: DirectBatch) -> None:
        self.batch = batch
        self._files: list[tuple[str, Any, Any, Any]] = []

    def _read(self) -> list[tuple[str, Any, Any, Any]]:
        import pyarrow as pa

        if not self._files:
            batch = self.batch
            for path, name in batch.files:
                file = _file(path, batch.source.s3)
                assert file is not None  # batch_files checked it
                # the key column as a dictionary: its distinct keys hashed and checked once (:func:`_keyed`)
                try:
                    t = file.read_parquet("", columns=batch.source.columns, read_dictionary=[batch.source.key_column])
                except (OSError, pa.ArrowException) as exc:  # truncated or corrupt: the file, not a retry
                    raise InputFileError(f"input file {path} cannot be read ({type(exc).__name__}: "
                                         f"{str(exc).splitlines()[0][:300] if str(exc) else ''}); {InputFileError.ADVICE}") from exc
                t, not_utf8 = _valid_utf8(t)
                self._files.append((name, t, _keyed(batch, t), not_utf8))
        return self._files

    def rows_of(self, intervals: Sequence[int]) -> Any:
        """The rows of ``intervals`` plus one marker row per interval (see :func:`direct_table`)."""
        import pyarrow as pa

        parts = [_prepared_table(self.batch, t, keyed, name, intervals) if self.batch.source.table is not None
                 else _prepared(self.batch, t, keyed, name, intervals, not_utf8)
                 for name, t, keyed, not_utf8 in self._read()]
        parts.append(marker_rows(intervals))
        return pa.concat_tables(parts)


def direct_table(batch: DirectBatch, intervals: Sequence[int]) -> Any:
    """The rows of ``intervals`` plus one marker row per interval, in the JVM path's task columns."""
    return BatchReader(batch).rows_of(intervals)


def marker_rows(intervals: Sequence[int]) -> Any:
    """One marker row per interval (every interval gets its task's attention, input or not)."""
    import pyarrow as pa

    return _table(interval=pa.array(list(intervals), pa.int32()), _m=pa.array([True] * len(intervals)))


#: the tasks' input columns, with their Arrow types
_TASK_COLUMNS = (("record_id", "string"), ("key", "string"), ("value", "binary"), ("codec", "string"),
                 ("timestamp_ms", "int64"), ("stream", "string"), ("position", "string"), ("late", "bool"),
                 ("_bad", "string"), ("interval", "int32"), ("_m", "bool"))


def _table(**cols: Any) -> Any:
    """The tasks' input table of ``cols``: ``_m`` False and any other column missing null."""
    import pyarrow as pa

    n = len(cols["interval"])
    cols.setdefault("_m", pa.repeat(pa.scalar(False), n))
    return pa.table([cols[c] if c in cols else pa.nulls(n, pa.type_for_alias(t)) for c, t in _TASK_COLUMNS],
                    names=[c for c, _t in _TASK_COLUMNS])


def _key_facts(keys: Any, num_intervals: int) -> tuple[Any, list[str | None] | None]:
    """Per distinct key: its interval and why it is bad (the JVM's checks), or None when none is."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    raw = keys.cast(pa.binary()).to_numpy(zero_copy_only=False).tolist()
    ivs = np.fromiter(map(key_hash, raw), dtype=np.int64, count=len(raw)) % num_intervals
    suspect = pc.or_(pc.or_(pc.starts_with(keys, "\x00"), pc.equal(keys, "")),
                     pc.greater(pc.binary_length(keys), MAX_KEY_BYTES))
    if not pc.any(suspect).as_py():
        return ivs.astype(np.int32), None
    bad: list[str | None] = []
    for k in keys.to_pylist():
        if k.startswith(_ERR):
            bad.append(k[2:1002])
        elif k == "":
            bad.append("key extractor returned an empty key")
        elif k.startswith("\x00"):
            bad.append("keys starting with NUL are reserved")
        elif len(k.encode("utf-8")) > MAX_KEY_BYTES:
            bad.append(f"key longer than {MAX_KEY_BYTES} bytes")
        else:
            bad.append(None)
    return ivs.astype(np.int32), bad


@dataclass(frozen=True)
class _Keyed:
    """A file's keys dictionary-encoded: distinct keys, each row's code, their intervals and faults."""

    keys: Any
    codes: Any
    ivs_of: Any
    bad_of: list[str | None] | None
    is_bad: Any

    def rows_of(self, intervals: Sequence[int], num_intervals: int) -> Any:
        """The row numbers (numpy int64, ascending) whose key falls in ``intervals``."""
        return rows_in(self.ivs_of[self.codes], intervals, num_intervals)

    def key(self, codes: Any) -> Any:
        import pyarrow as pa

        return self.keys.take(pa.array(codes))

    def bad(self, codes: Any) -> list[str | None] | None:
        """Why each key of ``codes`` is bad (None each that is not), or None when none is."""
        if self.is_bad is None or not self.is_bad[codes].any():
            return None
        bad_of = self.bad_of
        assert bad_of is not None
        return [bad_of[c] for c in codes.tolist()]


def rows_in(ivs: Any, intervals: Sequence[int], num_intervals: int) -> Any:
    """The row numbers (numpy int64, ascending) whose interval in ``ivs`` is one of ``intervals``."""
    import numpy as np

    wanted = np.zeros(num_intervals, dtype=bool)
    wanted[[i for i in intervals if 0 <= i < num_intervals]] = True
    return np.flatnonzero(wanted[ivs]) if len(ivs) else np.zeros(0, np.int64)


def _keyed(batch: DirectBatch, t: Any) -> _Keyed:
    """A file's keys: the Parquet column's own dictionary when it has no nulls, else encoded here."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    col = t.column(batch.source.key_column)
    if pa.types.is_dictionary(col.type) and col.null_count == 0 and col.num_chunks:
        enc = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        keys = enc.dictionary.cast(pa.string())
    else:
        enc = pc.dictionary_encode(pc.fill_null(pc.cast(col, pa.string()).combine_chunks(), ""))
        keys = enc.dictionary
    ivs_of, bad_of = _key_facts(keys, batch.num_intervals)
    is_bad = None if bad_of is None else np.array([b is not None for b in bad_of], dtype=bool)
    return _Keyed(keys, enc.indices.to_numpy(zero_copy_only=False), ivs_of, bad_of, is_bad)


def _valid_utf8(t: Any) -> tuple[Any, Any | None]:
    """``t`` with non-UTF-8 text made valid (U+FFFD), and which rows had such text (malformed; None: none)."""
    import numpy as np
    import pyarrow as pa

    try:
        t.validate(full=True)
        return t, None
    except pa.ArrowInvalid:
        pass
    bad = np.zeros(t.num_rows, dtype=bool)
    for i, field in enumerate(t.schema):
        col = t.column(i).combine_chunks()
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            continue
        raw = col.cast(pa.binary()).to_pylist()
        fixed = [None if b is None else b.decode("utf-8", "replace") for b in raw]
        bad |= np.array([f is not None and f.encode("utf-8") != b for f, b in zip(fixed, raw, strict=True)],
                        dtype=bool)
        t = t.set_column(i, field.with_type(pa.string()), pa.array(fixed, pa.string()))
    return t, bad


def _prepared(batch: DirectBatch, t: Any, keyed: _Keyed, name: str, intervals: Sequence[int],
              not_utf8: Any | None = None) -> Any:
    """One file's rows of ``intervals``, prepared; ``not_utf8``: its rows whose text was not UTF-8."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    src = batch.source
    rows, take, codes = _picked(batch, keyed, intervals)
    m = len(rows)
    # the event time in epoch ms: unix_millis (floor) of a timestamp, or the int column itself
    et = t.column(src.event_time_column).combine_chunks().take(take)
    ts_null = et.is_null().to_numpy(zero_copy_only=False)
    ms = et.cast(pa.int64()).fill_null(0).to_numpy()
    if pa.types.is_timestamp(et.type) and et.type.unit == "us":
        ms = ms // 1000
    ts = pa.array(ms, pa.int64(), mask=ts_null if et.null_count else None)
    # the record id: the column (null or empty: a dead letter), else the position "{injector}/{file}#{row}"
    if src.record_id_column is not None:
        rid = t.column(src.record_id_column).combine_chunks().take(take).cast(pa.string())
        rid_empty = pc.fill_null(pc.equal(rid, ""), True).to_numpy(zero_copy_only=False)
        if rid_empty.any():
            rid = pc.if_else(pa.array(rid_empty), pa.nulls(m, pa.string()), rid)
    else:
        rid = pa.array([f"{src.stream}/{name}#{r}" for r in rows.tolist()], pa.string())
        rid_empty = np.zeros(m, dtype=bool)  # a position is never empty
    ok = ~ts_null
    mal = np.zeros(m, dtype=bool) if not_utf8 is None else not_utf8[rows]
    key = keyed.key(codes)
    codec = _repeat("json", m)
    if mal.any():  # as the JVM: a malformed record has no key, id or event time of its own
        key = pc.if_else(pa.array(mal), pa.scalar("", pa.string()), key)
        ts = pc.if_else(pa.array(mal), pa.nulls(m, pa.int64()), ts)
        codec = pc.if_else(pa.array(mal), MALFORMED_CODEC, codec)
        ok &= ~mal
    why, late = _checks(batch, ms, ok, mal, keyed.bad(codes), rid_empty, ts_null)
    if why is None:
        bad = position = pa.nulls(m, pa.string())
    else:
        bad = pa.array(why, pa.string())
        position = pa.array([None if w is None else f"file={name}#row={r}" for w, r in zip(why, rows.tolist(), strict=True)],
                            pa.string())
    value = _json_values(t, src.value_columns, take) if src.value_columns else pa.nulls(m, pa.binary())
    return _table(record_id=rid, key=key, value=value, codec=codec, timestamp_ms=ts,
                  stream=_repeat(src.stream, m), position=position, late=late, _bad=bad,
                  interval=pa.array(keyed.ivs_of[codes], pa.int32()))


def _picked(batch: DirectBatch, keyed: _Keyed, intervals: Sequence[int]) -> tuple[Any, Any, Any]:
    """(the row numbers of ``intervals``, them as an Arrow array, their keys' codes)."""
    import pyarrow as pa

    rows = keyed.rows_of(intervals, batch.num_intervals)
    return rows, pa.array(rows, pa.int64()), keyed.codes[rows]


def _checks(batch: DirectBatch, ms: Any, ok: Any, mal: Any, key_bad: list[str | None] | None, rid_bad: Any,
            ts_null: Any) -> tuple[list[str | None] | None, Any]:
    """(each row's dead-letter reason, the first failing check as ``prepare_input`` orders them, or None
    when no row fails; the late flags); ``ok``: the rows with an event time of their own."""
    import numpy as np
    import pyarrow as pa

    none = np.zeros(len(ms), dtype=bool)
    far = none if batch.ahead is None else (ms > sum(batch.ahead)) & ok
    out = ((ms < MIN_EVENT_MS) | (ms > MAX_EVENT_MS)) & ok
    late = pa.array(none if batch.late_before is None else (ms < batch.late_before) & ok)
    if not (mal.any() or key_bad is not None or rid_bad.any() or ts_null.any() or far.any() or out.any()):
        return None, late
    now, bound = batch.ahead or (0, 0)
    return [MALFORMED_REASON if mf else kb if kb is not None else "record without record_id" if rb else
            "record without timestamp" if tn else range_reason(t_ms) if oo else
            ahead_reason(t_ms, bound, now) if fa else None
            for mf, kb, rb, tn, oo, fa, t_ms in zip(mal.tolist(), key_bad or [None] * len(ms),
                                                    rid_bad.tolist(), ts_null.tolist(), out.tolist(),
                                                    far.tolist(), ms.tolist(), strict=True)], late


def _repeat(text: str, n: int) -> Any:
    import pyarrow as pa

    return pa.repeat(pa.scalar(text, pa.string()), n)


def _prepared_table(batch: DirectBatch, t: Any, keyed: _Keyed, name: str, intervals: Sequence[int]) -> Any:
    """One stream-table file's rows of ``intervals``, prepared as ``input.prepare_input`` does."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows, take, codes = _picked(batch, keyed, intervals)
    col = {c: t.column(c).combine_chunks().take(take) for c in ("record_id", "value", "codec", "timestamp_ms",
                                                                "commit_id")}
    codec = pc.fill_null(col["codec"].cast(pa.string()), "json")
    ts = col["timestamp_ms"].cast(pa.int64())
    ts_null = ts.is_null().to_numpy(zero_copy_only=False)
    rid = col["record_id"].cast(pa.string())
    rid_bad = pc.fill_null(pc.equal(rid, ""), True).to_numpy(zero_copy_only=False)
    malformed = pc.fill_null(pc.equal(codec, MALFORMED_CODEC), False).to_numpy(zero_copy_only=False)
    ms = ts.fill_null(0).to_numpy()
    why, late = _checks(batch, ms, ~ts_null, malformed, keyed.bad(codes), rid_bad, ts_null)
    bad = pa.nulls(len(rows), pa.string()) if why is None else pa.array(why, pa.string())
    position = pc.if_else(bad.is_null(), pa.nulls(len(rows), pa.string()), col["commit_id"].cast(pa.string()))
    return _table(record_id=rid, key=keyed.key(codes), value=col["value"].cast(pa.binary()), codec=codec,
                  timestamp_ms=ts, stream=_repeat(batch.source.stream, len(rows)), position=position,
                  late=late, _bad=bad, interval=pa.array(keyed.ivs_of[codes], pa.int32()))


def _json_values(t: Any, columns: Sequence[str], take: Any) -> Any:
    """The taken rows' ``value``: a JSON object of ``columns``, nulls left out, NaN as Spark writes it."""
    import json
    import math

    import pyarrow as pa

    lists = []
    for c in columns:
        a = t.column(c).combine_chunks().take(take)
        vals = a.to_pylist()
        if pa.types.is_floating(a.type):
            vals = [v if v is None or math.isfinite(v) else "NaN" if v != v else "Infinity" if v > 0 else "-Infinity"
                    for v in vals]
        lists.append(vals)
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    return pa.array([dumps({c: v for c, v in zip(columns, row, strict=True) if v is not None}).encode()
                     for row in zip(*lists, strict=True)], pa.binary())
