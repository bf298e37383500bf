"""The direct read of a Kafka injector: a batch's offset ranges read with confluent-kafka, prepared as the JVM does.

The offsets stay Spark's (its offset log); the driver reads a batch once for its statistics and to
check each record parses exactly as Spark's ``from_json`` would (else the JVM path); each image task
reads the same ranges and keeps its intervals' rows. docs/embedding.md, "Direct read"."""

from __future__ import annotations

import atexit
import json
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ...exceptions import KafkaDataLossError
from ..input import MALFORMED_CODEC, MAX_EVENT_MS, MIN_EVENT_MS, KafkaRead

__all__ = ["KafkaRecords", "close_consumers", "KafkaRows", "read_ranges", "prepare_records", "batch_ranges",
           "MAX_DIRECT_RECORDS", "record_texts", "Uncertain", "partition_maxima"]

_INT_RANGE = {"int": (-2**31, 2**31 - 1), "bigint": (-2**63, 2**63 - 1)}
_DOUBLE_TEXTS = {"NaN": math.nan, "+INF": math.inf, "+Infinity": math.inf, "Infinity": math.inf,
                 "-INF": -math.inf, "-Infinity": -math.inf}
READ_TIMEOUT_S = 60.0
#: A Kafka batch of more records (a catch-up without ``maxOffsetsPerTrigger``) goes through the JVM: the driver
#: and every task would hold all of it in memory
MAX_DIRECT_RECORDS = 1_000_000


class Uncertain(Exception):
    """A record this module cannot be sure to parse as Spark does: the batch takes the JVM path."""


@dataclass(frozen=True)
class KafkaRecords:
    """A batch's messages in offset order per partition: plain columns."""

    partition: list[int]
    offset: list[int]
    timestamp_ms: list[int]
    key: list[bytes | None]
    value: list[bytes | None]


def batch_ranges(read: KafkaRead, batch_id: int | None) -> tuple[tuple[int, int, int], ...] | None:
    """``((partition, from, until), ...)`` micro-batch ``batch_id`` read per Spark's offset log; None: unknown."""
    from deltawheel.statestore.delta.sourceoffsets import kafka_ranges

    if batch_id is None or read.checkpoint is None:
        return None
    try:
        got = kafka_ranges(read.checkpoint, batch_id, read.topic,
                           new_partition_start=0 if read.fail_on_data_loss else None)
    except OSError:
        return None
    if got is None:
        return None
    return tuple((int(p), int(r[0]), int(r[1])) for p, r in got.get(read.topic, {}).items())


_CONSUMERS: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
_CONSUMERS_LOCK = threading.Lock()


@atexit.register
def close_consumers() -> None:
    """Close this process's kept consumers (at exit; or before the broker they poll goes away)."""
    with _CONSUMERS_LOCK:
        while _CONSUMERS:
            _CONSUMERS.popitem()[1].close()


def _consumer(read: KafkaRead) -> Any:
    """A consumer of this process for ``read``'s servers and settings (kept: a connection per batch costs)."""
    from confluent_kafka import Consumer

    key = (read.servers, read.config)
    c = _CONSUMERS.get(key)
    if c is None:
        conf = {"bootstrap.servers": read.servers, "group.id": "deltawheel-direct-read", "enable.auto.commit": False,
                "enable.auto.offset.store": False, "auto.offset.reset": "error", "enable.partition.eof": True,
                # Spark's Kafka source reads with the Java client's default: every record, committed or not
                "isolation.level": "read_uncommitted", **dict(read.config)}
        c = _CONSUMERS[key] = Consumer(conf)
    return c


def _lost(read: KafkaRead, p: int, lo: int, hi: int, low: int) -> str:
    return (f"topic {read.topic} partition {p}: the batch's offsets {lo} to {hi} are no longer all in Kafka (the "
            f"earliest offset is {low}; retention or a recreated topic); the batch was not committed. With the "
            "injector's option failOnDataLoss=false such records are skipped, as Spark's Kafka source does")


def read_ranges(read: KafkaRead, ranges: Sequence[tuple[int, int, int]], *,
                timeout_s: float = READ_TIMEOUT_S) -> KafkaRecords:
    """The records of ``ranges`` (``(partition, from, until)``, until exclusive), exactly those;
    KafkaDataLossError: records of a range are gone and the injector fails on data loss;
    KafkaException: the broker cannot be read within ``timeout_s``."""
    from confluent_kafka import KafkaError, KafkaException

    with _CONSUMERS_LOCK:
        for attempt in (1, 2):
            try:
                return _read(read, ranges, timeout_s)
            except BaseException as exc:
                c = _CONSUMERS.pop((read.servers, read.config), None)
                if c is not None:
                    c.close()
                # a partition added while the kept consumer ran: its metadata does not know it yet, a new one does
                if attempt == 1 and isinstance(exc, KafkaException) and exc.args \
                        and getattr(exc.args[0], "code", lambda: None)() == KafkaError._UNKNOWN_PARTITION:  # noqa: SLF001 - librdkafka's own code
                    continue
                raise
    raise AssertionError("unreachable")


def _read(read: KafkaRead, ranges: Sequence[tuple[int, int, int]], timeout_s: float) -> KafkaRecords:
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    out = KafkaRecords([], [], [], [], [])
    c = _consumer(read)
    want: dict[int, tuple[int, int]] = {}
    for p, lo, hi in ranges:
        if hi <= lo:
            continue
        low, _high = c.get_watermark_offsets(TopicPartition(read.topic, p), timeout=timeout_s, cached=False)
        if low > lo:
            if read.fail_on_data_loss:
                raise KafkaDataLossError(_lost(read, p, lo, hi, low))
            lo = low  # Spark's Kafka source with failOnDataLoss=false: the lost records are skipped
        if lo < hi:
            want[p] = (lo, hi)
    if not want:
        return out
    c.assign([TopicPartition(read.topic, p, lo) for p, (lo, _hi) in want.items()])
    try:
        nxt = {p: lo for p, (lo, _hi) in want.items()}
        got: dict[int, list[Any]] = {p: [] for p in want}
        deadline = time.monotonic() + timeout_s
        while any(nxt[p] < hi for p, (_lo, hi) in want.items()):
            if time.monotonic() > deadline:
                raise KafkaException(f"topic {read.topic}: the batch's offset ranges {sorted(want.items())} were "
                                     f"not read within {timeout_s:.0f} s (read up to {nxt})")
            # consume() waits for as many messages as asked: ask for those still due (a gap: the next call)
            due = sum(max(0, hi - nxt[p]) for p, (_lo, hi) in want.items())
            for m in c.consume(max(1, min(due, 10_000)), timeout=0.5):
                err, p = m.error(), m.partition()
                if p not in want:
                    continue
                hi = want[p][1]
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001  # the log's end: a range ends there (markers)
                        if m.offset() >= hi:
                            nxt[p] = max(nxt[p], hi)
                        continue
                    if err.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET):  # noqa: SLF001
                        if read.fail_on_data_loss:
                            raise KafkaDataLossError(_lost(read, p, nxt[p], hi, -1))
                        raise KafkaException(err)  # a rare race with retention: the batch runs again
                    raise KafkaException(err)
                o = m.offset()
                if o < nxt[p] or nxt[p] >= hi:
                    continue
                nxt[p] = o + 1  # a gap (a transaction marker, a compacted record) is skipped as Spark does
                if o < hi:
                    got[p].append(m)
    finally:
        c.unassign()
    for p in sorted(got):
        for m in got[p]:
            out.partition.append(p)
            out.offset.append(m.offset())
            out.timestamp_ms.append(int(m.timestamp()[1]))
            out.key.append(m.key())
            out.value.append(m.value())
    return out


_DECODER = json.JSONDecoder(strict=True)  # a field given twice: the last one, as Spark's parser


def _field(name: str, ty: str, v: Any) -> Any:
    """A field's value as Spark's JSON parser reads it for type ``ty``; ValueError: the record does not parse."""
    if v is None:
        return None
    if ty == "string":
        if not isinstance(v, str):
            raise Uncertain(f"field {name}: a non-string value for a STRING field")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise Uncertain(f"field {name}: a lone surrogate") from None
        return v
    if ty == "boolean":
        if isinstance(v, bool):
            return v
        raise ValueError(name)
    if ty in _INT_RANGE:
        if type(v) is int and _INT_RANGE[ty][0] <= v <= _INT_RANGE[ty][1]:
            return v
        raise ValueError(name)
    if isinstance(v, bool) or isinstance(v, (dict, list)):
        raise ValueError(name)
    if isinstance(v, str):
        if v in _DOUBLE_TEXTS:
            return _DOUBLE_TEXTS[v]
        raise ValueError(name)
    if isinstance(v, int):
        return float(v) if abs(v) < 2**1023 else math.copysign(math.inf, v)
    return float(v)


def _parse(read: KafkaRead, text: str) -> dict[str, Any] | None:
    """The schema's fields of a message value (None: it does not parse: malformed)."""
    if not text.strip():  # from_json gives null: no field, not malformed
        return {}
    try:
        obj, end = _DECODER.raw_decode(text, len(text) - len(text.lstrip()))
    except ValueError:
        if "'" in text:  # Spark's parser allows single quotes
            raise Uncertain("a value in single quotes") from None
        return None
    if not isinstance(obj, dict):
        return None
    if text[end:].strip():  # Spark reads the first object and ignores the rest; not checked here
        raise Uncertain("text after the JSON object")
    out = {}
    for name, ty in read.fields:
        try:
            out[name] = _field(name, ty, obj.get(name))
        except ValueError:
            return None
    return out


def _value_text(fields: Mapping[str, Any], columns: Sequence[str]) -> bytes:
    """``to_json`` of ``columns``: nulls left out, NaN and infinities as Spark writes them."""
    def one(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if v != v else "Infinity" if v > 0 else "-Infinity"
        return v
    return json.dumps({c: one(fields[c]) for c in columns if fields.get(c) is not None}, ensure_ascii=False,
                      separators=(",", ":")).encode()


@dataclass(frozen=True)
class Prepared:
    """A batch's records in the stream schema (per record), plus ``raw``: the message values."""

    record_id: list[str]
    key: list[str]
    value: list[bytes | None]
    codec: list[str]
    timestamp_ms: list[int | None]
    position: list[str]
    raw: list[bytes | None]
    partition: list[int]


def prepare_records(read: KafkaRead, stream: str, recs: KafkaRecords) -> Prepared:
    """The records as ``KafkaInjector._prepare`` gives them (the JVM path's stream schema); Uncertain: a
    record whose parse by Spark this module cannot be sure of."""
    out = Prepared([], [], [], [], [], [], [], [])
    values = read.value_columns
    for p, o, kts, k, v in zip(recs.partition, recs.offset, recs.timestamp_ms, recs.key, recs.value, strict=True):
        where = f"{read.topic}/{p}@{o}"
        fields: dict[str, Any] | None = {}
        malformed = False
        if v is not None:
            try:
                text = v.decode("utf-8")
            except UnicodeDecodeError:
                text, malformed = "", True
            if not malformed:
                fields = _parse(read, text)
                malformed = fields is None
        if malformed or fields is None:
            key, value, codec, ts = "", v, MALFORMED_CODEC, None
        else:
            if read.key_column is None:
                try:
                    key = "" if k is None else k.decode("utf-8")
                except UnicodeDecodeError:
                    raise Uncertain("a message key that is not UTF-8") from None
            else:
                kv = fields.get(read.key_column)
                key = "" if kv is None else str(kv)
            value = _value_text(fields, values) if values else None
            codec = "json"
            ts = kts if read.event_time_column is None else fields.get(read.event_time_column)
        out.record_id.append(f"{stream}/{where}")
        out.key.append(key)
        out.value.append(value)
        out.codec.append(codec)
        out.timestamp_ms.append(ts)
        out.position.append(f"kafka={where}")
        out.raw.append(v)
        out.partition.append(p)
    return out


def partition_maxima(read: KafkaRead, prep: Prepared, *, now_ms: int,
                     max_event_ahead_ms: int | None) -> tuple[int, int | None, int | None, tuple[tuple[str, int | None], ...]]:
    """(count, min, max event time, per ``topic/partition`` max) as ``kafka.partition_stats`` computes them."""
    maxima: dict[str, int | None] = {}
    lo: int | None = None
    for p, ts in zip(prep.partition, prep.timestamp_ms, strict=True):
        name = f"{read.topic}/{p}"
        ok = ts is not None and MIN_EVENT_MS <= ts <= MAX_EVENT_MS and (
            max_event_ahead_ms is None or ts <= now_ms + max_event_ahead_ms)
        old = maxima.get(name)
        if ok and ts is not None:
            maxima[name] = ts if old is None else max(old, ts)
            lo = ts if lo is None else min(lo, ts)
        else:
            maxima[name] = old
    hi = max((m for m in maxima.values() if m is not None), default=None)
    return len(prep.record_id), lo, hi, tuple(sorted(maxima.items()))


class KafkaRows:
    """One task's view of a Kafka batch: its ranges read and prepared once, its intervals' rows on demand."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch
        self._all: tuple[Prepared, Any] | None = None

    def _prepared(self) -> tuple[Prepared, Any]:
        if self._all is None:
            read = self.batch.source.kafka
            prep = prepare_records(read, self.batch.source.stream, read_ranges(read, self.batch.ranges))
            self._all = prep, _intervals(prep.key, self.batch.num_intervals)
        return self._all

    def rows_of(self, intervals: Sequence[int]) -> Any:
        """The prepared rows of ``intervals`` plus one marker row per interval (``direct.direct_table``)."""
        import numpy as np
        import pyarrow as pa

        from .direct import _checks, _repeat, _table, marker_rows, rows_in

        prep, (ivs, bad_of) = self._prepared()
        rows = rows_in(ivs, intervals, self.batch.num_intervals)
        pick = rows.tolist()
        m = len(pick)
        ts_list = [prep.timestamp_ms[i] for i in pick]
        ts_null = np.array([t is None for t in ts_list], dtype=bool)
        ms = np.array([0 if t is None else t for t in ts_list], dtype=np.int64)
        mal = np.array([prep.codec[i] == MALFORMED_CODEC for i in pick], dtype=bool)
        key_bad = None if bad_of is None else [bad_of[i] for i in pick]
        if key_bad is not None and not any(b is not None for b in key_bad):
            key_bad = None
        why, late = _checks(self.batch, ms, ~ts_null & ~mal, mal, key_bad, np.zeros(m, dtype=bool), ts_null)
        value = [prep.value[i] for i in pick]
        if why is None:
            bad = position = pa.nulls(m, pa.string())
        else:  # an input dead letter keeps the message's value as sent (prepare_input's raw_value)
            bad = pa.array(why, pa.string())
            position = pa.array([None if w is None else prep.position[i] for w, i in zip(why, pick, strict=True)],
                                pa.string())
            value = [v if w is None or prep.raw[i] is None else prep.raw[i]
                     for v, w, i in zip(value, why, pick, strict=True)]
        part = _table(record_id=pa.array([prep.record_id[i] for i in pick], pa.string()),
                      key=pa.array([prep.key[i] for i in pick], pa.string()), value=pa.array(value, pa.binary()),
                      codec=pa.array([prep.codec[i] for i in pick], pa.string()),
                      timestamp_ms=pa.array(ts_list, pa.int64()), stream=_repeat(self.batch.source.stream, m),
                      position=position, late=late, _bad=bad, interval=pa.array(ivs[rows], pa.int32()))
        return pa.concat_tables([part, marker_rows(intervals)])


def _intervals(keys: list[str], num_intervals: int) -> tuple[Any, list[str | None] | None]:
    """Each record's interval and why its key is bad (None each that is not; None: none is)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from .direct import _key_facts

    if not keys:
        return np.zeros(0, np.int32), None
    enc = pc.dictionary_encode(pa.array(keys, pa.string()))
    ivs_of, bad_of = _key_facts(enc.dictionary, num_intervals)
    codes = enc.indices.to_numpy(zero_copy_only=False)
    return ivs_of[codes], None if bad_of is None else [bad_of[c] for c in codes.tolist()]


def record_texts(read: KafkaRead, stream: str, ids: Iterable[str]) -> tuple[dict[str, str], dict[str, bytes]]:
    """(record id -> source position, record id -> message value) of the batch's records ``ids``."""
    where: dict[str, tuple[int, int]] = {}
    prefix = f"{stream}/{read.topic}/"
    for rid in ids:
        if rid.startswith(prefix):
            part, _, off = rid[len(prefix):].partition("@")
            where[rid] = (int(part), int(off))
    pos = {rid: f"kafka={read.topic}/{p}@{o}" for rid, (p, o) in where.items()}
    texts: dict[str, bytes] = {}
    for rid, (p, o) in where.items():
        got = read_ranges(read, ((p, o, o + 1),))
        if got.value and got.value[0] is not None:
            texts[rid] = got.value[0]
    return pos, texts
