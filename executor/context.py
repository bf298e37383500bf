"""What user code sees of one key while it runs: :class:`Context`."""

from __future__ import annotations

from typing import Any

from deltawheel.statestore.codecs import Codec, codec_of_row
from deltawheel.statestore.exceptions import BadRecordError, ConfigError
from deltawheel.statestore.rowtable.rows import (
    Production,
    TimeDomain,
    Timer,
    make_production,
    new_timer,
    validate_key,
)

__all__ = ["Context", "TimerCause", "TTL_TAG"]

_UNSET = object()
_EVENT = TimeDomain.EVENT_TIME
_PROCESSING = TimeDomain.PROCESSING_TIME

#: The tag of the state TTL's timers (NUL-led tags are reserved; user code never sees them).
TTL_TAG = "\x00ttl"


class TimerCause:
    """What a timer's productions derive their ids and default timestamp from."""

    __slots__ = ("record_id", "timestamp_ms")

    def __init__(self, record_id: str, timestamp_ms: int) -> None:
        self.record_id = record_id
        self.timestamp_ms = timestamp_ms


class Context:
    """Per-key handle: typed state, timers, productions, and the clocks; changes commit with the batch."""

    def __init__(self, *, computation: str, key: str, state_bytes: bytes | None, codec: Codec,
                 timers: tuple[Timer, ...], outputs: tuple[str, ...], input_watermark_ms: int | None,
                 now_ms: int, watermark_hold_ms: int | None, timer_seq: int | None = None,
                 row_codec: str | None = None, state_codec: str | None = None) -> None:
        self.computation = computation
        self.key = key
        self._codec = codec
        self._state_bytes = state_bytes
        self._state: Any = _UNSET
        self._dirty = False
        self._timers: dict[tuple[str, TimeDomain], Timer] = {(t.tag, t.domain): t for t in timers}
        self._outputs = outputs
        self._productions: list[Production] = []
        #: What is being processed: a Record or a TimerCause (production ids derive from it).
        self.cause: Any = TimerCause("", 0)
        self._counted: Any = None  # whose productions self._n counts
        self._n = 0
        #: The input low watermark (None until known); while records run, the one before the batch.
        self.input_watermark_ms = input_watermark_ms
        self.now_ms = now_ms
        self._hold = watermark_hold_ms
        #: The id number of the key's next timer firing (None: a new key, not numbered yet; keyrun seeds it).
        self.timer_seq = timer_seq
        self._row_codec = row_codec  # the codec column of the key's stored state (None: no row)
        # the codec column of state this context encodes: the codec, versioned (``json@2``)
        self._state_codec = codec.name if state_codec is None else state_codec
        self.expired = False  # the state TTL dropped the key in this run (:meth:`expire`)

    @property
    def state(self) -> Any:
        """The key's state (None: none); assign to change it, changes in place are kept too."""
        if self._state is _UNSET:  # as written: the row names its codec (a changed codec reads it still)
            data = self._state_bytes
            self._state = None if data is None else codec_of_row(self._row_codec, self._codec).decode(data)
        return self._state

    @state.setter
    def state(self, value: Any) -> None:
        self._state = value
        self._dirty = True

    def clear_state(self) -> None:
        """Forget the key's state (as ``ctx.state = None``)."""
        self.state = None

    @property
    def low_watermark_ms(self) -> int | None:
        """The computation's input low watermark (None until one is known)."""
        return self.input_watermark_ms

    def set_timer(self, tag: str, time_ms: int, *, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        """Set (or move) the timer ``tag`` of this key to fire at ``time_ms`` in ``domain``."""
        if not isinstance(time_ms, int) or isinstance(time_ms, bool):
            raise BadRecordError(f"timer time must be an int of epoch ms, got {type(time_ms).__name__}")
        d = domain if domain.__class__ is TimeDomain else TimeDomain(domain)
        tag = tag if tag.__class__ is str else str(tag)
        if tag[:1] == "\x00":
            raise ConfigError(f"{self.computation}: timer tag {tag!r} starts with NUL, which is reserved for the "
                              "executor's own timers (the state TTL's); choose another tag")
        self._timers[(tag, d)] = new_timer((time_ms, tag, d))

    def delete_timer(self, tag: str, *, domain: TimeDomain = TimeDomain.EVENT_TIME) -> None:
        """Delete the timer ``tag`` of this key in ``domain`` (nothing if there is none)."""
        self._timers.pop((str(tag), TimeDomain(domain)), None)

    @property
    def timers(self) -> tuple[Timer, ...]:
        """The key's timers, sorted by (time, tag, domain) (the state TTL's are not among them)."""
        return tuple(sorted(t for t in self._timers.values() if t.tag != TTL_TAG))

    def hold_watermark(self, time_ms: int | None) -> None:
        """Hold this computation's low watermark at or below ``time_ms`` (None releases it)."""
        self._hold = time_ms

    def produce(self, stream: str, value: Any, *, timestamp_ms: int | None = None,
                key: str | None = None) -> None:
        """Produce ``value`` to ``stream``; ids are stable across replays (``<computation>:<record id>#<n>``)."""
        if stream not in self._outputs:
            raise ConfigError(
                f"{self.computation} produced to {stream!r}, which is not among its outputs "
                f"{list(self._outputs)}; add it to `outputs`")
        out_key = self.key if key is None else validate_key(key)  # this key was checked on input
        cause = self.cause
        if self._counted is not cause:
            self._counted = cause
            self._n = 0
        self._n += 1
        codec = self._codec
        # prefixed with the computation, so two computations producing one record's ids differ
        pid = (f"{cause.record_id}#{self._n}" if cause.__class__ is TimerCause
               else f"{self.computation}:{cause.record_id}#{self._n}")
        self._productions.append(make_production(
            pid, stream, out_key, codec.encode(value),
            cause.timestamp_ms if timestamp_ms is None else int(timestamp_ms), codec.name))

    @property
    def watermark_hold_ms(self) -> int | None:
        """The hold set by :meth:`hold_watermark` (None: none)."""
        return self._hold

    @property
    def productions(self) -> list[Production]:
        """What the key produced so far, in order (the runner reads and trims this list)."""
        return self._productions

    def drop_productions_of(self, cause: Any) -> None:
        """Drop what was produced while ``cause`` was :attr:`cause`."""
        if self._counted is cause:
            del self._productions[len(self._productions) - self._n:]

    def pop_due_timer(self, input_watermark_ms: int, now_ms: int) -> Timer | None:
        """Remove and return the first due timer by (time, tag, domain), or None."""
        best = None
        for t in self._timers.values():  # one pass (no list of the due ones): it runs for every key with timers
            if (t[0] < input_watermark_ms if t[2] is _EVENT else t[0] <= now_ms) and (best is None or t < best):
                best = t
        if best is None:
            return None
        del self._timers[(best[1], best[2])]
        return best

    @property
    def stored_timers(self) -> tuple[Timer, ...]:
        """Every timer of the key as its row stores them, the state TTL's included, sorted."""
        return tuple(sorted(self._timers.values()))

    def touch(self, event_ms: int | None, ttl_event_ms: int | None, now_ms: int, ttl_processing_ms: int | None) -> None:
        """The key was touched: its TTL timers move to ``event_ms``/``now_ms`` plus their TTL."""
        if ttl_event_ms is not None and event_ms is not None:
            self._timers[(TTL_TAG, _EVENT)] = Timer(event_ms + ttl_event_ms, TTL_TAG, _EVENT)
        if ttl_processing_ms is not None:
            self._timers[(TTL_TAG, _PROCESSING)] = Timer(now_ms + ttl_processing_ms, TTL_TAG, _PROCESSING)

    def holds_nothing(self) -> bool:
        """No state, no timer of user code and no watermark hold (the TTL timers aside)."""
        if self._hold is not None or any(t.tag != TTL_TAG for t in self._timers.values()):
            return False
        state = self._state
        if self._dirty or state is not _UNSET:
            return state is None
        return self._state_bytes is None

    def drop_ttl_timers(self) -> None:
        """Remove the state TTL's timers (a key that holds nothing needs none)."""
        self._timers.pop((TTL_TAG, _EVENT), None)
        self._timers.pop((TTL_TAG, _PROCESSING), None)

    def expire(self) -> None:
        """The state TTL passed: drop the key's state, timers and watermark hold."""
        self._state = None
        self._dirty = True
        self._timers = {}
        self._hold = None
        self.expired = True

    def needs_upgrade(self) -> bool:
        """The stored state was written under another state version than this context encodes."""
        rc = self._row_codec
        return rc is not None and self._state_bytes is not None and rc != self._state_codec

    @property
    def stored_state(self) -> bytes | None:
        """The key's state as its row stores it (None: none)."""
        return self._state_bytes

    @property
    def row_codec(self) -> str | None:
        """The codec column of the key's stored state (None: no row)."""
        return self._row_codec

    def set_upgraded(self, state: Any) -> None:
        """The stored state, upgraded to the current state version (written back as such)."""
        self._state = state
        self._dirty = True

    def stored_codec(self) -> str:
        """The codec column for :meth:`encoded_state`: the stored one while the bytes are kept."""
        rc = self._row_codec
        state = self._state
        if rc is not None and not self._dirty and (state is _UNSET or state is None):
            return rc
        return self._state_codec

    @property
    def has_timers(self) -> bool:
        """Whether the key has a timer set (cheaper than ``bool(ctx.timers)``)."""
        return bool(self._timers)

    def outcome(self) -> tuple[bytes | None, tuple[Timer, ...], int | None, int | None, str, list[Production]]:
        """What the runner stores of the key, in one call."""
        state = self._state
        untouched = not self._dirty and (state is _UNSET or state is None)
        if untouched:
            data = self._state_bytes
        else:
            data = None if state is None else self._codec.encode(state)
        rc = self._row_codec
        codec = rc if rc is not None and untouched else self._state_codec
        timers = self._timers
        stored = tuple(sorted(timers.values())) if len(timers) > 1 else tuple(timers.values())
        return data, stored, self._hold, self.timer_seq, codec, self._productions

    def encoded_state(self) -> bytes | None:
        """The key's state as stored: the bytes read when untouched, else re-encoded (None: none)."""
        state = self._state
        if not self._dirty and (state is _UNSET or state is None):  # never read (or there is none)
            return self._state_bytes
        # assigned, or read and possibly changed in place: what user code left is the state
        return None if state is None else self._codec.encode(state)
