"""Test a computation without Spark: feed records, move time, look at state, timers and output."""

from __future__ import annotations

import itertools
import logging
import tempfile
from typing import Any, Iterable, NamedTuple

from deltawheel.statestore.delta.jvm import require_classic_session
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import Timer, interval_of
from deltawheel.statestore.zk.watermarks import END_OF_TIME

from .computation import RECORD_KEY, Computation, LatePolicy, Record, key_or_reason
from .context import TTL_TAG
from .exceptions import WindowingError
from .tasks.usercode.keyrun import codec_of, run_key
from .windowing.harness import DeltaRows, MemoryRows

__all__ = ["ComputationTester", "Output"]

_LOG = logging.getLogger(__name__)


class Output(NamedTuple):
    """One production of the computation, its value decoded with the computation's codec."""

    stream: str
    key: str
    value: Any
    timestamp_ms: int
    production_id: str


class ComputationTester:
    """Run a computation key by key, without Spark, or with ``spark`` in a Delta store (``store``, default
    a new temporary folder); ``now_ms``: the processing clock's start.

    >>> from deltawheel import Computation
    >>> class Count(Computation):
    ...     name = "count"; inputs = {"clicks": "user"}; outputs = ("totals",)
    ...     def process_record(self, ctx, record):
    ...         ctx.state = (ctx.state or 0) + 1
    ...         ctx.set_timer("flush", record.timestamp_ms // 60_000 * 60_000 + 60_000)
    ...     def process_timer(self, ctx, timer):
    ...         ctx.produce("totals", ctx.state)
    ...         ctx.state = None
    >>> t = ComputationTester(Count())
    >>> t.add({"user": "ann"}, event_time_ms=1_000); t.add({"user": "ann"}, event_time_ms=2_000)
    >>> t.state("ann"), [x.time_ms for x in t.timers("ann")]
    (2, [60000])
    >>> t.advance_watermark(61_000)
    >>> [(o.key, o.value) for o in t.output("totals")], t.state("ann")
    ([('ann', 2)], None)
    """

    def __init__(self, computation: Computation, *, spark: Any = None, store: str | None = None,
                 now_ms: int = 0) -> None:
        type(computation).validate()
        for warning in computation.start_warnings():  # as the executor warns at its start
            _LOG.warning("%s", warning)
        self.computation = computation
        self._rows: MemoryRows | DeltaRows = MemoryRows()
        if spark is not None:
            require_classic_session(spark)
            layout = StoreLayout(store or tempfile.mkdtemp(prefix="dw-tester-"))
            n = type(computation).num_intervals
            self._rows = DeltaRows(spark, layout, computation.name, n, writer="tester")
        self.codec = codec_of(computation)
        self.watermark_ms: int | None = None
        self.now_ms = now_ms
        self._acted_ms: int | None = None  # the watermark timers last fired under (lateness)
        self._ids = itertools.count()
        self._outputs: list[Output] = []
        self.dead_letters: list[tuple[Record, str]] = []
        self.late_data: list[Record] = []
        self.expired: list[str] = []  # keys the state TTL dropped, in order
        self.processed = self.duplicates = self.late = self.timers_fired = 0

    @property
    def store(self) -> str | None:
        """The Delta store's folder (None in memory)."""
        return self._rows.layout.root if isinstance(self._rows, DeltaRows) else None

    def add(self, value: Any, *, event_time_ms: int, stream: str | None = None, key: str | None = None,
            record_id: str | None = None) -> None:
        """Run one record now, then its key's due timers. ``key`` defaults to the stream's key extractor
        on ``value`` (no usable key: a dead letter); a repeated ``record_id`` is a duplicate. Raises
        WindowingError: the stream is not an input, or is keyed by ``RECORD_KEY`` without ``key``."""
        comp = self.computation
        inputs = dict(type(comp).inputs)
        if stream is None:
            if len(inputs) != 1:
                raise WindowingError(f"{comp.name} reads {sorted(inputs)}: say which stream the record is from "
                                     "(stream=...)")
            stream = next(iter(inputs))
        elif inputs and stream not in inputs:
            raise WindowingError(f"{comp.name} does not read stream {stream!r}; its inputs: {sorted(inputs)}")
        if record_id is None:
            record_id = f"tester-{next(self._ids)}"
        if key is None:
            extractor = inputs.get(stream)
            if extractor is None or extractor == RECORD_KEY:
                raise WindowingError(f"no key for the record of {stream!r}: its extractor is {extractor!r} (the "
                                     "producer's key); pass key=...")
            key, why = key_or_reason(extractor, value)
            if key is None:  # as a Spark batch does: a dead letter with the reason, nothing run
                assert why is not None
                self.dead_letters.append((Record(key="", value=value, timestamp_ms=int(event_time_ms),
                                                 record_id=record_id, stream=stream), why))
                return
        late = self._acted_ms is not None and event_time_ms < self._acted_ms
        rec = Record(key=key, value=value, timestamp_ms=int(event_time_ms), record_id=record_id,
                     stream=stream, late=late)
        if late and comp.late_policy is LatePolicy.ROUTE:
            self.late += 1
            self.late_data.append(rec)
            return
        self._run(key, [rec])
        self._rows.commit()

    def add_many(self, records: Iterable[tuple[Any, int]], *, stream: str | None = None) -> None:
        """:meth:`add` for each ``(value, event_time_ms)``."""
        for value, ts in records:
            self.add(value, event_time_ms=ts, stream=stream)

    def advance_watermark(self, watermark_ms: int) -> None:
        """Move the input low watermark (never back) and fire the event-time timers before it."""
        if self.watermark_ms is not None and watermark_ms < self.watermark_ms:
            raise WindowingError(f"the watermark only moves forward: {watermark_ms} < {self.watermark_ms}")
        self.watermark_ms = int(watermark_ms)
        self._fire_due()

    def advance_processing_time(self, now_ms: int) -> None:
        """Move the processing clock (never back) and fire the processing-time timers due."""
        if now_ms < self.now_ms:
            raise WindowingError(f"processing time only moves forward: {now_ms} < {self.now_ms}")
        self.now_ms = int(now_ms)
        self._fire_due()

    def finish(self) -> None:
        """The input is complete: the watermark goes to the end of time (every event-time timer fires)."""
        self.advance_watermark(END_OF_TIME)

    def state(self, key: str) -> Any:
        """The key's state, decoded (None: none)."""
        row = self._rows.load(key)
        return None if row is None or row.state is None else self.codec.decode(row.state)

    def timers(self, key: str) -> list[Timer]:
        """The key's timers, in firing order (the state TTL's are not among them)."""
        row = self._rows.load(key)
        return sorted(t for t in row.timers if t.tag != TTL_TAG) if row is not None else []

    def keys(self) -> list[str]:
        """The keys that hold a row (state, timers or seen record ids)."""
        return self._rows.keys()

    def output(self, stream: str | None = None) -> list[Output]:
        """Everything produced so far (to ``stream`` only, if given), in production order."""
        return [o for o in self._outputs if stream is None or o.stream == stream]

    def take_output(self, stream: str | None = None) -> list[Output]:
        """:meth:`output`, then forget it (so the next call shows only what is new)."""
        got = self.output(stream)
        self._outputs = [o for o in self._outputs if o not in got]
        return got

    def with_computation(self, computation: Computation) -> ComputationTester:
        """A tester of ``computation`` (e.g. the next version) over this tester's rows and clocks;
        ConfigError when ``computation`` is invalid or has another name."""
        from deltawheel.statestore.exceptions import ConfigError

        if computation.name != self.computation.name:
            raise ConfigError(f"with_computation: {computation.name!r} is not {self.computation.name!r}; the rows "
                              "belong to the computation of that name")
        other = ComputationTester(computation, now_ms=self.now_ms)
        other._rows = self._rows
        other.watermark_ms, other._acted_ms, other._ids = self.watermark_ms, self._acted_ms, self._ids
        return other

    def reload(self) -> None:
        """With a Delta store: read the rows back from the table (what a restarted executor sees)."""
        if isinstance(self._rows, DeltaRows):
            self._rows.reread()

    def _run(self, key: str, records: list[Record]) -> None:
        comp = self.computation  # record ids seen before the horizon no longer count (``dedup_retention``)
        horizon = self.now_ms - comp.dedup_retention_ms() if comp.exactly_once else None
        out = run_key(comp, key=key, interval=interval_of(key, type(comp).num_intervals),
                      row=self._rows.load(key), records=records, input_watermark_ms=self.watermark_ms,
                      now_ms=self.now_ms, dedup_horizon_ms=horizon)
        self.processed += out.processed
        self.duplicates += out.duplicates
        self.late += out.late
        self.timers_fired += out.timers_fired
        self.dead_letters.extend(out.dead_letters)
        if out.keys_expired:
            self.expired.append(key)
        for p in out.productions:
            self._outputs.append(Output(p.stream, p.key, self.codec.decode(p.value), p.timestamp_ms,
                                        p.production_id))
        row = out.row.with_(pending=()) if out.row is not None else None  # delivered at once
        self._rows.save(key, row)

    def _fire_due(self) -> None:
        wm, now = self.watermark_ms, self.now_ms
        for key in self._rows.keys():
            row = self._rows.load(key)
            if row is None:
                continue
            ev, pt = row.next_event_timer_ms, row.next_processing_timer_ms
            if (ev is not None and wm is not None and ev < wm) or (pt is not None and pt <= now):
                self._run(key, [])
        self._acted_ms = wm
        self._rows.commit()
