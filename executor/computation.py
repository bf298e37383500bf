"""The user API: a :class:`Computation` with ``process_record`` and ``process_timer``.

A computation declares its input streams (with a key extractor per input),
its output streams, and how its state is encoded. The framework calls the
two methods per key, serialized: records of a key in event-time order, then
its due timers in timestamp order (or, when the computation overrides
``process_records``, one call with all of the key's new records of the batch). Everything they change through the
:class:`~deltawheel.executor.context.Context` (state, timers, productions)
commits atomically with the record ids they consumed.

Example::

    class Counter(Computation):
        name = "counter"
        inputs = {"queries": "query"}          # stream -> key field (or a callable)
        outputs = ("counts",)

        def process_record(self, ctx, record):
            ctx.state = (ctx.state or 0) + 1
            ctx.set_timer("flush", record.timestamp_ms + 60_000)

        def process_timer(self, ctx, timer):
            ctx.produce("counts", {"query": ctx.key, "n": ctx.state})
            ctx.state = None                    # forget the key
"""

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

__all__ = ["RECORD_KEY", "Record", "make_record", "Computation", "ColumnBatch", "ColumnResult", "LatePolicy", "ErrorPolicy", "KeyExtractor", "extract_key"]

KeyExtractor = Union[str, Callable[[Any], Any]]

#: Key extractor meaning "the key the producer gave the record" (the stream's ``key`` column).
RECORD_KEY = "@key"


class Record(NamedTuple):
    """One input record of a key: (key, value, event timestamp) plus its unique id.

    ``late`` is True when the record arrived behind the computation's input
    low watermark (only delivered with ``LatePolicy.PROCESS``). Immutable (a named
    tuple: the executor builds one per input record, in bulk).
    """

    key: str
    value: Any
    timestamp_ms: int
    record_id: str
    stream: str = ""
    late: bool = False


def make_record(key: str, value: Any, timestamp_ms: int, record_id: str, stream: str, late: bool) -> Record:
    """``Record(...)`` for already checked values; :data:`new_record` builds one from a
    ``(key, value, timestamp_ms, record_id, stream, late)`` tuple."""
    return new_record((key, value, timestamp_ms, record_id, stream, late))


#: ``Record`` from a field tuple, in C (``map(new_record, zip(...))`` builds a batch's records).
new_record = partial(tuple.__new__, Record)


@dataclass(frozen=True)
class ColumnBatch:
    """What :meth:`Computation.process_columns` gets: one interval's keys of one batch, as Arrow tables.

    ``keys``: the keys run (string array, sorted): keys with new records and keys with due timers.
    ``records``: their new (not seen before), on-time records, ordered by (key, event time, record
    id), columns ``key``, ``timestamp_ms`` (int64), ``record_id``, ``stream`` (string).
    ``state``: their state as the ``int64map`` codec stores it, one row per entry of a key's dict,
    columns ``key``, ``map_key``, ``map_value`` (int64), sorted by (key, map_key); a key without
    state has no row. ``timers``: their event-time timers, columns ``key``, ``tag``, ``time_ms``
    (sorted by key, time, tag). ``watermark_ms``: the input low watermark (None: none yet; no
    event-time timer is due): a timer with ``time_ms < watermark_ms`` is due."""

    keys: "pa.Array"
    records: "pa.Table"
    state: "pa.Table"
    timers: "pa.Table"
    watermark_ms: int | None


@dataclass(frozen=True)
class ColumnResult:
    """What :meth:`Computation.process_columns` returns: the keys' whole new state and timers, the
    timers fired, and the productions they made.

    ``state``: ``key``, ``map_key``, ``map_value`` (int64), at most one row per (key, map_key); a
    key without rows has no state left. ``timers``: ``key``, ``tag``, ``time_ms``: each key's
    event-time timers after the batch (at most one per key and tag). ``fired``: ``key``, ``tag``,
    ``time_ms``: the timers fired, in firing order per key (timestamp order, as the per-record
    path fires them). ``productions``: ``fired`` (int64: the row of ``fired`` whose firing made
    it), ``stream``, ``value`` (binary: the value as the computation's codec encodes it; any
    other type: its Python values, which the framework encodes) and optionally ``timestamp_ms``
    (null or absent: the timer's time), in production order per firing. Productions come from
    timers only (a computation whose records produce runs per record)."""

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
    # weak productions (strong_productions = False) are appended to their streams before the
    # commit, without a checkpoint; a delivery still running after this many seconds is a
    # straggler: the batch then checkpoints its productions in the rows instead and goes on,
    # and the next batch settles the straggler before it clears the checkpoint
    straggler_timeout_s: ClassVar[float] = 5.0
    # how long settling waits for the previous batch's delivery still in flight (asynchronous, or
    # a straggler) before the batch fails instead; its productions stay checkpointed, so the
    # restart redelivers them (a hung stream table must not block the pipeline forever)
    delivery_timeout_s: ClassVar[float] = 600.0
    late_policy: ClassVar[LatePolicy] = LatePolicy.PROCESS
    # declares that the computation relies on event-time timers (windowed computations do): an
    # executor without a watermark source (a watermark authority and upstream) then refuses to
    # start, since those timers would never fire (see ComputationExecutor's manual_watermarks)
    event_time_timers: ClassVar[bool] = False
    error_policy: ClassVar[ErrorPolicy] = ErrorPolicy.FAIL
    # how long a processed record's id is kept for dedup, in processing time (the injected
    # clock) from when the record was processed: a retry of it (a producer's retry, a recovery's
    # redelivery, a Spark replay) arriving within this time is dropped as a duplicate. Processing
    # time, not event time: how long a sender may retry is bounded by wall time (its timeouts,
    # restarts), not by how far its records' timestamps are behind; the low watermark can stall
    # for hours or jump by days. Independent of batch sizes and persisted (each id carries when
    # it was seen), so a restart does not shorten it. Ids past it leave the rows even for keys
    # that never see another record (the executor sweeps them: BatchReport.ids_expired).
    dedup_retention: ClassVar[timedelta] = timedelta(minutes=10)
    # state TTL (docs/operations.md, "State TTL"): a key not touched (no record of it run, no timer
    # of it fired) for this span of event time, measured against the input low watermark, is
    # dropped -- state, timers and record ids -- by the next batch that runs its interval, also
    # when no record of it ever comes again (the executor keeps a reserved event-time timer per
    # key for it). None: no TTL. ``state_ttl_processing``: the same in processing time (the
    # executor's clock). Either, both or neither; each a positive timedelta.
    state_ttl: ClassVar[timedelta | None] = None
    state_ttl_processing: ClassVar[timedelta | None] = None
    # the version of the state's shape (docs/operations.md, "State versions"): a key whose row was
    # written under an older version is read through :meth:`upgrade_state` the first time a batch
    # runs it, and written back under this version; keys no batch runs keep their old rows
    state_version: ClassVar[int] = 1

    def upgrade_state(self, state: Any, from_version: int) -> Any:
        """Turn ``state``, written under ``state_version`` ``from_version`` (older than the
        computation's), into the shape of the current version. Called once per key, the first
        time a batch runs the key after the version changed; what it returns is the key's state
        (None: the key has none). If it raises, the batch fails naming the key (or, with
        ``ErrorPolicy.DEAD_LETTER``, the key's records of the batch go to dead letters and its row
        stays as it was, to be upgraded by a later batch). Default: refuse (raise)."""
        raise NotImplementedError(f"{self.name} declares state_version {self.state_version} but no upgrade_state "
                                  f"for state of version {from_version}; define upgrade_state(self, state, "
                                  f"from_version)")

    def process_record(self, ctx: "Context", record: Record) -> None:
        """Handle one record of ``ctx.key``. Default: do nothing."""

    def process_records(self, ctx: "Context", records: list[Record]) -> None:
        """Handle all of ``ctx.key``'s new records of one batch at once (optional).

        Override it instead of :meth:`process_record` to pay the per-call cost once per key and
        batch instead of once per record (read the state once, loop in your own code, assign it
        once). ``records`` are the key's records not seen before, in event-time order (ties by
        record id), late ones included with ``record.late`` set; the framework calls it at most
        once per key and batch, before the key's due timers. Productions made here take their ids
        from the call's first record and their default timestamp from its last (latest) record.
        If it raises, the batch fails naming the key and the records (or, with
        ``ErrorPolicy.DEAD_LETTER``, all of the call's records go to dead letters and its
        productions are dropped; state it changed before raising is kept, as with
        ``process_record``). When it is overridden, ``process_record`` is not called. Default:
        ``process_record`` per record."""
        for r in records:
            self.process_record(ctx, r)

    def process_timer(self, ctx: "Context", timer: Timer) -> None:
        """Handle a fired timer of ``ctx.key``. Default: do nothing."""

    # The vectorised path (docs/embedding.md, "The vectorised path"): a computation that overrides
    # both methods below declares that, for a key's new records of a batch, ``combine`` followed by
    # ``process_combined`` does exactly what ``process_record`` per record does.
    def combine(self, records: "pa.Table") -> "pa.Table":
        """Reduce the new records of many keys of one batch at once, with Arrow / NumPy (optional).

        ``records``: the new (not seen before), on-time records of the keys the vectorised path
        runs, in one Arrow table ordered by (key, event time, record id), with the columns ``key``
        (string), ``value`` (the decoded values; all null for an input without value columns),
        ``timestamp_ms`` (int64), ``record_id`` and ``stream`` (string). Return a table with a
        ``key`` column and any others (e.g. a count and a sum per key and window: a group-by);
        each key's rows, in the table's order, go to :meth:`process_combined` as tuples of the
        other columns. Called once per interval and batch (on the per-key paths and in the
        testing harness: once per key). Must not keep state of its own: everything lasting goes
        through the context in :meth:`process_combined`. Default: not declared."""
        raise NotImplementedError(f"{self.name} declares no combine")

    def process_combined(self, ctx: "Context", rows: list[tuple[Any, ...]]) -> None:
        """Handle ``ctx.key``'s rows of :meth:`combine` (the columns after ``key``, as tuples, in
        the combined table's order), in place of :meth:`process_record` over the key's new
        records: called at most once per key and batch, before the key's due timers, as
        :meth:`process_records` is (productions made here take their ids from the key's first
        new record and their default timestamp from its last). A key with a late record among
        its new ones, and every key of a computation with ``ErrorPolicy.DEAD_LETTER`` or of a
        batch that carries a record id twice, runs :meth:`process_record` per record instead."""
        raise NotImplementedError(f"{self.name} declares no process_combined")

    # The columnar path (docs/embedding.md, "The columnar path"): a computation that overrides
    # ``process_columns`` (and keeps its state with the ``int64map`` codec: a dict of int64 ->
    # int64 per key) declares that one call over an interval's keys does exactly what
    # ``process_record`` per record and ``process_timer`` per due timer do.
    def process_columns(self, batch: ColumnBatch) -> ColumnResult:
        """Run one interval's keys of one batch at once, over Arrow columns (optional): their new
        on-time records, their state and timers in; their new state and timers, the timers fired
        and the productions out (:class:`ColumnBatch`, :class:`ColumnResult`). The framework does
        the rest as on the per-record path: dedup, record ids, late records (a key with one runs
        per record), production ids, the row image, the commit. Taken when the computation keeps
        no processing-time timers, holds or state TTL, has no dead-letter policy, its input has no
        value columns and no record id repeats within the batch; keys with late records or rows
        not in the ``int64map`` shape run per record. Default: not declared."""
        raise NotImplementedError(f"{self.name} declares no process_columns")

    @classmethod
    def columnar(cls) -> bool:
        """Does this computation declare the columnar path (:meth:`process_columns` overridden)?"""
        return cls.process_columns is not Computation.process_columns

    @classmethod
    def vectorised(cls) -> bool:
        """Does this computation declare the vectorised path (:meth:`combine` and
        :meth:`process_combined` both overridden)?"""
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
        """How long after its end a window of this computation takes data (0: none; windowed
        computations say theirs): a :attr:`state_ttl` shorter than it drops windows still open."""
        return 0

    def start_warnings(self) -> list[str]:
        """What the executor (and the testing harness) warn about when they start with this
        computation: a :attr:`state_ttl` shorter than the allowed lateness."""
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


def key_or_reason(extractor: KeyExtractor, value: Any) -> tuple[str | None, str | None]:
    """(the key of a record whose decoded value is ``value``, None) or (None, why it has none), by the
    rules of a Spark batch's input preparation (``tasks/input.py``), so the testing harness keys and
    dead-letters records as the executor does: a field name gives the field's value as text (a
    number or a nested value as its JSON text; a missing or null field has no key); a callable must
    return a non-empty string (anything else, or a raise, has no key); an empty key, a key starting
    with NUL (reserved) or longer than ``MAX_KEY_BYTES`` bytes has none either.

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


def extract_key(extractor: KeyExtractor, value: Any) -> Any:
    """Apply a key extractor: a field name of a mapping value, or a callable."""
    if isinstance(extractor, str):
        if not isinstance(value, Mapping):
            raise TypeError(f"value is a {type(value).__name__}, not a mapping with field {extractor!r}")
        return value[extractor]
    return extractor(value)
