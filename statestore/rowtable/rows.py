"""The single-row-per-key image of a computation's key (:meth:`KeyRow.to_row` / :meth:`KeyRow.from_row`),
and its table schema; each interval partition also holds a fence row (``fencing.py``)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import Any, Mapping, NamedTuple

from ..exceptions import BadRecordError

__all__ = ["ROW_FORMAT_VERSION", "DOMAINS", "DOMAIN_VALUES", "FENCE_KEY", "RESERVED_PREFIX",
           "IDS_KEY_PREFIX", "is_user_key", "MAX_KEY_BYTES", "TimeDomain", "Timer",
           "Production", "make_production", "SeenId", "KeyRow", "interval_of", "key_hash", "validate_key",
           "rows_schema_ddl", "rows_file_ddl"]

ROW_FORMAT_VERSION = 2  # 2: timer_seq (migration 4)
FENCE_KEY = "\x00fence"
#: keys starting with NUL are deltawheel's own rows (users' keys may not: :func:`validate_key`)
RESERVED_PREFIX = "\x00"
#: the rows of an interval's record-ids files (image path): key = this prefix + the user key
IDS_KEY_PREFIX = "\x00id:"
MAX_KEY_BYTES = 4096


class TimeDomain(str, Enum):
    """The clock a timer follows."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


#: a time domain from its stored name (or from itself)
DOMAINS = {d.value: d for d in TimeDomain} | {d: d for d in TimeDomain}
#: a time domain's stored name (faster than ``.value`` in hot loops)
DOMAIN_VALUES = {d: d.value for d in TimeDomain}


class Timer(NamedTuple):
    """A timer of one key (at most one per tag and domain): fires once ``time_ms`` is reached."""

    time_ms: int
    tag: str
    domain: TimeDomain = TimeDomain.EVENT_TIME

    def to_row(self) -> dict[str, Any]:
        """The timer as a row of the ``timers`` column."""
        return {"tag": self.tag, "domain": self.domain.value, "time_ms": self.time_ms}

    @staticmethod
    def from_row(r: Mapping[str, Any]) -> "Timer":
        """The timer of a ``timers`` column row."""
        return Timer(time_ms=int(r["time_ms"]), tag=str(r["tag"]), domain=DOMAINS[r["domain"]])


#: ``Timer`` from a ``(time_ms, tag, domain)`` tuple, in C
new_timer = partial(tuple.__new__, Timer)


def make_row(computation: str, key: str, interval: int, state: bytes | None, codec: str,
             timers: tuple[Timer, ...], watermark_hold_ms: int | None, timer_seq: int = 0) -> "KeyRow":
    """``KeyRow(...)`` from storage, whose timers are already sorted (no ``__post_init__``)."""
    r = object.__new__(KeyRow)
    r.__dict__.update(computation=computation, key=key, interval=interval, state=state, codec=codec,
                      timers=timers, record_ids=(), pending=(), watermark_hold_ms=watermark_hold_ms,
                      sequencer=0, commit_id="", updated_ms=0, format_version=ROW_FORMAT_VERSION,
                      timer_seq=timer_seq, extra={})
    return r


def updated_row(base: "KeyRow", state: bytes | None, codec: str, timers: tuple[Timer, ...],
                record_ids: tuple["SeenId", ...], pending: tuple["Production", ...],
                watermark_hold_ms: int | None, timer_seq: int | None = None) -> "KeyRow":
    """``base.with_(...)`` of the fields a key's run changes; ``timers`` already sorted."""
    r = object.__new__(KeyRow)
    d = r.__dict__
    d.update(base.__dict__)
    d.update(state=state, codec=codec, timers=timers, record_ids=record_ids, pending=pending,
             watermark_hold_ms=watermark_hold_ms)
    if timer_seq is not None:
        d["timer_seq"] = timer_seq
    return r


class Production(NamedTuple):
    """A record produced to a stream, checkpointed in the producer's row until delivered."""

    production_id: str
    stream: str
    key: str
    value: bytes
    timestamp_ms: int
    codec: str = "json"

    def to_row(self) -> dict[str, Any]:
        """The production as a row of the ``pending`` column."""
        return {"production_id": self.production_id, "stream": self.stream, "key": self.key,
                "value": bytes(self.value), "timestamp_ms": self.timestamp_ms, "codec": self.codec}

    @staticmethod
    def from_row(r: Mapping[str, Any]) -> "Production":
        """The production of a ``pending`` column row."""
        return Production(production_id=str(r["production_id"]), stream=str(r["stream"]), key=str(r["key"]),
                          value=bytes(r["value"]), timestamp_ms=int(r["timestamp_ms"]), codec=str(r["codec"]))


def make_production(production_id: str, stream: str, key: str, value: bytes, timestamp_ms: int,
                    codec: str) -> Production:
    """``Production(...)`` for already checked values (runs for every production of every batch)."""
    return _new_production((production_id, stream, key, value, timestamp_ms, codec))


_new_production = partial(tuple.__new__, Production)


@dataclass(frozen=True)
class SeenId:
    """A record id this key has processed, and when (for garbage collection)."""

    record_id: str
    seen_ms: int

    def to_row(self) -> dict[str, Any]:
        """The id as a row of the ``record_ids`` column."""
        return {"record_id": self.record_id, "seen_ms": self.seen_ms}

    @staticmethod
    def from_row(r: Mapping[str, Any]) -> "SeenId":
        """The id of a ``record_ids`` column row."""
        return SeenId(record_id=str(r["record_id"]), seen_ms=int(r["seen_ms"]))


@dataclass(frozen=True, kw_only=True)
class KeyRow:
    """Everything stored for one (computation, key)."""

    computation: str
    key: str
    interval: int
    state: bytes | None = None
    codec: str = "json"
    timers: tuple[Timer, ...] = ()
    record_ids: tuple[SeenId, ...] = ()
    pending: tuple[Production, ...] = ()
    watermark_hold_ms: int | None = None
    sequencer: int = 0
    commit_id: str = ""
    updated_ms: int = 0
    format_version: int = ROW_FORMAT_VERSION
    timer_seq: int = 0  # the id number of the key's next timer firing (``keyrun``)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "timers", tuple(sorted(self.timers)))

    @property
    def next_event_timer_ms(self) -> int | None:
        """The earliest event-time timer, or None."""
        return min((t.time_ms for t in self.timers if t.domain is TimeDomain.EVENT_TIME), default=None)

    @property
    def next_processing_timer_ms(self) -> int | None:
        """The earliest processing-time timer, or None."""
        return min((t.time_ms for t in self.timers if t.domain is TimeDomain.PROCESSING_TIME), default=None)

    @property
    def is_fence(self) -> bool:
        """True for an interval's fence row, which holds its sequencer, not a key's data."""
        return self.key == FENCE_KEY

    def with_(self, **changes: Any) -> "KeyRow":
        """A copy with some fields changed (a fast ``dataclasses.replace``)."""
        new = object.__new__(KeyRow)
        d = new.__dict__
        d.update(self.__dict__)
        for k in changes:
            if k not in d:
                raise TypeError(f"KeyRow has no field {k!r}")
        d.update(changes)
        if "timers" in changes:
            d["timers"] = tuple(sorted(d["timers"]))
        return new

    def to_row(self) -> dict[str, Any]:
        """The row as a dict of the rows table's columns."""
        return {
            "computation": self.computation, "interval": self.interval, "key": self.key,
            "state": None if self.state is None else bytes(self.state), "codec": self.codec,
            "timers": [t.to_row() for t in sorted(self.timers)],
            "next_event_timer_ms": self.next_event_timer_ms,
            "next_processing_timer_ms": self.next_processing_timer_ms,
            "record_ids": [s.to_row() for s in self.record_ids],
            "pending": [p.to_row() for p in self.pending], "watermark_hold_ms": self.watermark_hold_ms,
            "sequencer": self.sequencer, "commit_id": self.commit_id, "updated_ms": self.updated_ms,
            "format_version": self.format_version, "timer_seq": self.timer_seq,
        }

    @staticmethod
    def from_row(r: Any) -> "KeyRow":
        """The row of a Spark ``Row`` or a mapping of the rows table's columns."""
        d = r.asDict(recursive=True) if hasattr(r, "asDict") else dict(r)
        return KeyRow(
            computation=str(d["computation"]), key=str(d["key"]), interval=int(d["interval"]),
            state=None if d.get("state") is None else bytes(d["state"]), codec=str(d.get("codec") or "json"),
            timers=tuple(sorted(Timer.from_row(t) for t in (d.get("timers") or ()))),
            record_ids=tuple(SeenId.from_row(s) for s in (d.get("record_ids") or ())),
            pending=tuple(Production.from_row(p) for p in (d.get("pending") or ())),
            watermark_hold_ms=d.get("watermark_hold_ms"), sequencer=int(d.get("sequencer") or 0),
            commit_id=str(d.get("commit_id") or ""), updated_ms=int(d.get("updated_ms") or 0),
            format_version=int(d.get("format_version") or ROW_FORMAT_VERSION),
            timer_seq=int(d.get("timer_seq") or 0),  # null: a row written before migration 4
        )


def validate_key(key: object) -> str:
    """Return ``key`` if it is a usable key, else raise :class:`BadRecordError`.

    >>> validate_key("q1")
    'q1'
    """
    if not isinstance(key, str):
        raise BadRecordError(f"key must be a non-empty str, got {type(key).__name__} {key!r}; "
                             "convert it in the key extractor (e.g. str(x))")
    if key == "":
        raise BadRecordError("key must be a non-empty str, got ''; fix the key extractor")
    if key.startswith("\x00"):
        raise BadRecordError(f"keys starting with NUL are reserved for deltawheel, got {key!r}")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise BadRecordError(f"key is longer than {MAX_KEY_BYTES} bytes; hash or shorten it")
    return key


def interval_of(key: str, num_intervals: int) -> int:
    """The key interval of ``key``: CRC-32 of its UTF-8 bytes modulo ``num_intervals``.

    >>> interval_of("q000001", 8) == interval_of("q000001", 8)
    True
    """
    return key_hash(key.encode("utf-8")) % num_intervals


#: The hash of a key's UTF-8 bytes that :func:`interval_of` takes modulo the number of intervals
key_hash = zlib.crc32


def rows_schema_ddl() -> str:
    """The rows table's columns as a Spark DDL string."""
    return (
        "computation STRING NOT NULL, interval INT NOT NULL, key STRING NOT NULL, "
        "state BINARY, codec STRING, "
        "timers ARRAY<STRUCT<tag: STRING, domain: STRING, time_ms: BIGINT>>, "
        "next_event_timer_ms BIGINT, next_processing_timer_ms BIGINT, "
        "record_ids ARRAY<STRUCT<record_id: STRING, seen_ms: BIGINT>>, "
        "pending ARRAY<STRUCT<production_id: STRING, stream: STRING, key: STRING, value: BINARY, "
        "timestamp_ms: BIGINT, codec: STRING>>, "
        "watermark_hold_ms BIGINT, sequencer BIGINT NOT NULL, commit_id STRING, "
        "updated_ms BIGINT, format_version INT, timer_seq BIGINT"
    )


def rows_file_ddl() -> str:
    """The columns stored in the rows table's data files (the partition columns live in the log)."""
    return rows_schema_ddl().replace("computation STRING NOT NULL, interval INT NOT NULL, ", "")


def is_user_key(key: str) -> bool:
    """Whether ``key`` is a user's key (not a fence row's nor a record-ids row's)."""
    return not key.startswith(RESERVED_PREFIX)
