"""The user API: a :class:`Computation` with ``process_record`` and ``process_timer``, called per key,
serialized: records in event-time order, then due timers in timestamp order. What they change through
the :class:`~deltawheel.executor.context.Context` commits atomically with the record ids they
consumed. docs/embedding.md."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, NamedTuple, Union

from deltawheel.statestore.codecs import get_codec
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import validate_name
from deltawheel.statestore.rowtable.rows import MAX_KEY_BYTES, Timer

if TYPE_CHECKING:
    import pyarrow as pa

    from .context import Context

__all__ = ["RECORD_KEY", "Record", "make_record", "Computation", "ColumnBatch", "ColumnResult", "LatePolicy", "ErrorPolicy", "KeyExtractor",
           "check_instance"]

KeyExtractor = Union[str, Callable[[Any], Any]]

#: Key extractor meaning "the key the producer gave the record" (the stream's ``key`` column).
RECORD_KEY = "@key"


class Record(NamedTuple):
    """One input record of a key: (key, value, event timestamp) plus its unique id; ``late``: it
    arrived behind the input low watermark (only delivered with ``LatePolicy.PROCESS``)."""

    key: str
    value: Any
    timestamp_ms: int
    record_id: str
    stream: str = ""
    late: bool = False


def make_record(key: str, value: Any, timestamp_ms: int, record_id: str, stream: str, late: bool) -> Record:
    """``Record(...)`` for already checked values."""
    return new_record((key, value, timestamp_ms, record_id, stream, late))


#: ``Record`` from a field tuple, in C (``map(new_record, zip(...))`` builds a batch's records).
new_record = partial(tuple.__new__, Record)


@dataclass(frozen=True)
class ColumnBatch:
    """What :meth:`Computation.process_columns` gets: one interval's keys of one batch, as Arrow tables.

    ``keys``: sorted, with new records or due timers; ``records``: new on-time ones (``key``,
    ``timestamp_ms``, ``record_id``, ``stream``); ``state``: ``key``, ``map_key``, ``map_value``;
    ``timers``: ``key``, ``tag``, ``time_ms``; ``watermark_ms``: earlier timers are due (None: none)."""

    keys: "pa.Array"
    records: "pa.Table"
    state: "pa.Table"
    timers: "pa.Table"
    watermark_ms: int | None


@dataclass(frozen=True)
class ColumnResult:
    """What :meth:`Computation.process_columns` returns: the keys' whole new ``state`` and ``timers``,
    the ``fired`` timers in firing order, and ``productions`` (``fired`` row, ``stream``, ``value``,
    optional ``timestamp_ms``)."""

    state: "pa.Table"
    timers: "pa.Table"
    fired: "pa.Table"
    productions: "pa.Table"


class LatePolicy(str, Enum):
    """What to do with a record behind the input low watermark."""

    PROCESS = "process"  # call process_record with record.late = True
    ROUTE = "route"  # write it to the late_data table with the reason, skip it


class ErrorPolicy(str, Enum):
    """What to do when process_record raises."""

    FAIL = "fail"  # fail the batch, naming key and record (a restart retries it)
    DEAD_LETTER = "dead_letter"  # write the record and error to dead_letters, go on


class Computation:
    """Base class of user computations; override the class attributes and the two methods."""

    name: ClassVar[str] = ""
    inputs: ClassVar[Mapping[str, KeyExtractor]] = {}
    outputs: ClassVar[tuple[str, ...]] = ()
    codec: ClassVar[str] = "json"
    allow_pickle: ClassVar[bool] = False
    num_intervals: ClassVar[int] = 4
    exactly_once: ClassVar[bool] = True
    strong_productions: ClassVar[bool] = True
    # weak productions: a delivery still running after this long is checkpointed in the rows instead
    straggler_timeout_s: ClassVar[float] = 5.0
    # how long settling waits for the previous batch's delivery before the batch fails
    delivery_timeout_s: ClassVar[float] = 600.0
    late_policy: ClassVar[LatePolicy] = LatePolicy.PROCESS
    # relies on event-time timers: an executor without a watermark source refuses to start
    event_time_timers: ClassVar[bool] = False
    error_policy: ClassVar[ErrorPolicy] = ErrorPolicy.FAIL
    # how long a processed record's id is kept for dedup, in processing time (persisted)
    dedup_retention: ClassVar[timedelta] = timedelta(minutes=10)
    # state TTL (docs/operations.md, "State TTL"): a key untouched this long is dropped
    state_ttl: ClassVar[timedelta | None] = None
    state_ttl_processing: ClassVar[timedelta | None] = None
    # the state's shape version (docs/operations.md, "State versions"): older rows go through upgrade_state
    state_version: ClassVar[int] = 1

    def upgrade_state(self, state: Any, from_version: int) -> Any:
        """Turn ``state`` of ``state_version`` ``from_version`` into the current shape (None: no state),
        once per key; if it raises, the error policy applies. Default: raise."""
        raise NotImplementedError(f"{self.name} declares state_version {self.state_version} but no upgrade_state "
                                  f"for state of version {from_version}; define upgrade_state(self, state, "
                                  f"from_version)")

    def process_record(self, ctx: "Context", record: Record) -> None:
        """Handle one record of ``ctx.key``. Default: do nothing."""

    def process_records(self, ctx: "Context", records: list[Record]) -> None:
        """Handle ``ctx.key``'s new records of one batch in one call, in event-time order, before its due
        timers (optional; the default calls ``process_record`` per record)."""
        for r in records:
            self.process_record(ctx, r)

    def process_timer(self, ctx: "Context", timer: Timer) -> None:
        """Handle a fired timer of ``ctx.key``. Default: do nothing."""

    # The vectorised path (docs/embedding.md): combine + process_combined do what process_record does.
    def combine(self, records: "pa.Table") -> "pa.Table":
        """Reduce many keys' new records of one batch at once, with Arrow / NumPy (optional).
        ``records``: ``key``, ``value``, ``timestamp_ms``, ``record_id``, ``stream``; return a table with
        a ``key`` column, each key's rows go to :meth:`process_combined`. Keep no state here."""
        raise NotImplementedError(f"{self.name} declares no combine")

    def process_combined(self, ctx: "Context", rows: list[tuple[Any, ...]]) -> None:
        """Handle ``ctx.key``'s rows of :meth:`combine` in place of :meth:`process_record`."""
        raise NotImplementedError(f"{self.name} declares no process_combined")

    # The columnar path (docs/embedding.md): one call does what process_record and process_timer do.
    def process_columns(self, batch: ColumnBatch) -> ColumnResult:
        """Run one interval's keys of one batch over Arrow columns (optional; docs/embedding.md)."""
        raise NotImplementedError(f"{self.name} declares no process_columns")

    @classmethod
    def columnar(cls) -> bool:
        """Does this computation declare the columnar path (:meth:`process_columns` overridden)?"""
        return cls.process_columns is not Computation.process_columns

    @classmethod
    def vectorised(cls) -> bool:
        """Does this computation declare both :meth:`combine` and :meth:`process_combined`?"""
        return (cls.combine is not Computation.combine
                and cls.process_combined is not Computation.process_combined)

    @classmethod
    def batches_records(cls) -> bool:
        """Does this computation override :meth:`process_records` (one call per key and batch)?"""
        return cls.process_records is not Computation.process_records

    @classmethod
    def dedup_retention_ms(cls) -> int:
        """:attr:`dedup_retention` in milliseconds."""
        return int(cls.dedup_retention.total_seconds() * 1000)

    @classmethod
    def state_ttl_ms(cls) -> tuple[int | None, int | None]:
        """(:attr:`state_ttl`, :attr:`state_ttl_processing`) in milliseconds (None: none)."""
        return tuple(None if t is None else int(t.total_seconds() * 1000)  # type: ignore[return-value]
                     for t in (cls.state_ttl, cls.state_ttl_processing))

    def allowed_lateness_ms(self) -> int:
        """How long after its end a window of this computation takes data (0: none)."""
        return 0

    def start_warnings(self) -> list[str]:
        """What the executor warns about at start: a :attr:`state_ttl` shorter than the allowed lateness."""
        ttl_ms = type(self).state_ttl_ms()[0]
        lateness = self.allowed_lateness_ms()
        if ttl_ms is not None and ttl_ms < lateness:
            return [f"{self.name}: state_ttl ({ttl_ms} ms) is shorter than the allowed lateness ({lateness} ms): a "
                    f"key whose windows wait for late data longer than the TTL loses them, with their timers, "
                    f"before they close; set state_ttl to at least the allowed lateness"]
        return []

    @classmethod
    def validate(cls) -> None:
        """Check the declaration; raises ConfigError naming what is wrong."""
        validate_name("computation", cls.name)
        if hasattr(cls, "dedup_retention_batches"):
            raise ConfigError(f"{cls.name}: dedup_retention_batches was replaced by dedup_retention, a time "
                              "(e.g. dedup_retention = timedelta(minutes=10)): ids are kept for a processing "
                              "time, whatever the batch sizes; set that instead")
        if not isinstance(cls.dedup_retention, timedelta) or cls.dedup_retention <= timedelta(0):
            raise ConfigError(f"{cls.name}: dedup_retention must be a positive timedelta, got "
                              f"{cls.dedup_retention!r}")
        for attr in ("state_ttl", "state_ttl_processing"):
            ttl = getattr(cls, attr)
            if ttl is not None and (not isinstance(ttl, timedelta) or ttl <= timedelta(0)):
                raise ConfigError(f"{cls.name}: {attr} must be a positive timedelta (or None: no TTL), got "
                                  f"{ttl!r}; a key untouched for that long is dropped, so it must be > 0")
        if (isinstance(cls.state_version, bool) or not isinstance(cls.state_version, int)
                or cls.state_version < 1):
            raise ConfigError(f"{cls.name}: state_version must be a whole number >= 1, got {cls.state_version!r}")
        if (cls.combine is Computation.combine) != (cls.process_combined is Computation.process_combined):
            raise ConfigError(f"{cls.name}: the vectorised path needs both combine and process_combined (one is "
                              "defined without the other); define both, or neither")
        if cls.columnar() and cls.codec != "int64map":
            raise ConfigError(f"{cls.name}: the columnar path (process_columns) reads and writes state with the "
                              f"int64map codec, the computation declares codec={cls.codec!r}; set codec = 'int64map'")
        if not cls.inputs:
            raise ConfigError(f"computation {cls.name!r} declares no input streams (set `inputs`)")
        for stream, extractor in cls.inputs.items():
            validate_name("stream", stream)
            if not (isinstance(extractor, str) or callable(extractor)):
                raise ConfigError(f"key extractor of {cls.name}.{stream} must be a field name or a callable")
        for stream in cls.outputs:
            validate_name("stream", stream)
        if not 1 <= cls.num_intervals <= 4096:
            raise ConfigError(f"{cls.name}: num_intervals must be 1..4096, got {cls.num_intervals}")
        get_codec(cls.codec, allow_pickle=cls.allow_pickle)


#: the declarations parts of the framework read from a computation's class (``type(comp).num_intervals``,
#: the classmethod ``state_ttl_ms``); the others are read from the instance
_DECLARED = ("num_intervals", "inputs", "state_ttl", "state_ttl_processing")


def check_instance(comp: Computation) -> None:
    """ConfigError when ``comp`` sets one of the declarations read from its class on itself with
    another value (an instance's ``num_intervals = 8`` beside the class's 4 would lease 4 intervals
    and publish watermarks of 8)."""
    own = getattr(comp, "__dict__", {})
    for attr in _DECLARED:
        if attr in own and own[attr] != getattr(type(comp), attr):
            cls = type(comp).__name__
            raise ConfigError(f"{cls}: {attr} is set on the instance ({own[attr]!r}), the class declares "
                              f"{getattr(type(comp), attr)!r}; declarations are read from the class: set it there "
                              f"(a subclass per value, e.g. type('{cls}2', ({cls},), {{'{attr}': ...}}))")


def key_or_reason(extractor: KeyExtractor, value: Any) -> tuple[str | None, str | None]:
    """(the key of a record whose decoded value is ``value``, None) or (None, why it has none).

    As ``tasks/input.py`` keys a Spark batch: a field's value as text, or a callable's string; an
    empty key, a NUL-led key or one over ``MAX_KEY_BYTES`` bytes is none.

    >>> key_or_reason("q", {"q": "shoes"}), key_or_reason("n", {"n": 5}), key_or_reason("q", {})
    (('shoes', None), ('5', None), (None, "no field 'q' in the value"))
    >>> key_or_reason(lambda v: v["n"], {"n": 5})
    (None, 'key extractor returned int 5')
    """
    if isinstance(extractor, str):
        got = value.get(extractor) if isinstance(value, Mapping) else None
        if got is None:
            return None, f"no field {extractor!r} in the value"
        key = got if isinstance(got, str) else json.dumps(got, separators=(",", ":"))
    else:
        try:
            key = extractor(value)
        except Exception as exc:
            return None, f"key extractor failed: {type(exc).__name__}: {exc}"
        if not isinstance(key, str):
            return None, f"key extractor returned {type(key).__name__} {key!r}"
    if key == "":
        return None, "key extractor returned an empty key"
    if key.startswith("\x00"):
        return None, "keys starting with NUL are reserved"
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        return None, f"key longer than {MAX_KEY_BYTES} bytes"
    return key, None
