"""The watermark authority: the one object callers hold, built from the package's collaborators.

ZooKeeper SUSPENDED / LOST: every call pauses while SUSPENDED (``pause.py``, bounded by
``max_pause_s``); a publish under lease sequencers raises :class:`LeaseLostError` after a LOST
session; :meth:`WatermarkAuthority.last_known` answers without ZooKeeper. Every znode is persistent."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kazoo.client import KazooClient
from kazoo.security import ACL

from ...clock import Clock, SystemClock
from ...layout import validate_name
from ..layout import ensure_zk_layout
from ..refusal import DEFAULT_MAX_PAUSE_S
from .codec import Raw, Znodes, check_ms, injector_payload, low_payload
from .instances import Instances
from .low import later
from .pause import Connection
from .publish import Publisher
from .reading import Reader
from .rounds import Rounds
from .seen import LastKnown, LastSeen
from .topology import Topology, declare_update, declared

__all__ = ["WatermarkAuthority"]

_SYSTEM_CLOCK = SystemClock()


class WatermarkAuthority:
    """Publishes oldest work and injector watermarks; computes and publishes low watermarks.

    ``max_pause_s``: how long a call waits for a suspended connection (the lease manager's), then
    raises :class:`LeaseSuspendedError`; a damaged payload raises :class:`CodecError`."""

    def __init__(self, client: KazooClient, *, pipeline: str, clock: Clock = _SYSTEM_CLOCK,
                 acls: list[ACL] | None = None, max_pause_s: float | None = DEFAULT_MAX_PAUSE_S) -> None:
        self.pipeline = validate_name("pipeline", pipeline)
        self._clock = clock
        self._znodes = Znodes(self.pipeline)
        self._connection = Connection(client, pipeline=self.pipeline, max_pause_s=max_pause_s)
        self._rounds = Rounds(self._connection, acls=acls)
        self._seen = LastSeen(client, clock)
        self._reader = Reader(self._rounds, self._znodes, self._seen)
        self._publisher = Publisher(self._rounds, self._znodes, self._reader, clock)
        self._instances = Instances(self._rounds, self._znodes, clock)
        ensure_zk_layout(client)
        self._connection.listen()

    @property
    def max_pause_s(self) -> float | None:
        """The bound of a call's pause (None: none)."""
        return self._connection.max_pause_s

    def close(self) -> None:
        """Stop listening to the client's connection states (the client stays open)."""
        self._connection.close()

    def declare(self, computation: str, *, upstream: Sequence[str], num_intervals: int,
                replace: bool = False) -> Topology:
        """Record a computation's inputs (``'computation:NAME'`` / ``'injector:NAME'``) and interval count;
        idempotent, ``replace`` overwrites a different earlier declaration.
        Raises ConfigError: bad names or count, a self-loop, or a different declaration without
        ``replace``."""
        topo = declared(computation, upstream=upstream, num_intervals=num_intervals)
        self._rounds.cas(self._znodes.topology(computation), f"declaring {self.pipeline}/{computation}",
                         declare_update(computation, topo, replace=replace))
        return topo

    def topology(self, computation: str) -> Topology | None:
        """The declared topology of ``computation``, or ``None`` when it is not declared."""
        return self._reader.topology(computation)

    def injector_watermark(self, injector: str) -> int | None:
        """The stored watermark of ``injector``; ``None`` when it never published."""
        return self._reader.injector_watermark(injector)

    def published_low_watermark(self, computation: str) -> int | None:
        """The stored (monotonic) low watermark; ``None`` when never advanced."""
        return self._reader.published_low_watermark(computation)

    def oldest_work(self, computation: str, num_intervals: int) -> dict[int, Raw | None]:
        """Published oldest-work payloads of intervals 0..num_intervals-1 (``None``: never published)."""
        return self._reader.oldest_work(computation, num_intervals)

    def low_watermark(self, computation: str, *, topology: Topology | None = None) -> int | None:
        """The low watermark as MillWheel computes it (``reading.py``), maybe below the published one;
        ``None``: not known yet, :data:`.low.END_OF_TIME`: all done. ``topology``: as the caller just read it.
        Raises ConfigError: not declared, or the topology has a cycle."""
        return self._reader.low_watermark(computation, topology=topology)

    def watermark_lag_ms(self, computation: str) -> int | None:
        """now - max(computed, published low watermark), at least 0; ``None`` while not known."""
        low = later(self.low_watermark(computation), self.published_low_watermark(computation))
        return None if low is None else max(0, self._clock.now_ms() - low)

    def snapshot(self) -> dict[str, Any]:
        """Every watermark of the pipeline (:meth:`.reading.Reader.snapshot`)."""
        return self._reader.snapshot()

    def last_known(self, computation: str) -> LastKnown:
        """The last published low watermark this instance read, wrote or was told of; no ZooKeeper call."""
        return self._seen.last_known(computation)

    def watch_low_watermark(self, computation: str, callback: Callable[[int | None], None]) -> None:
        """Call ``callback(value)`` now and after each change, on kazoo's thread (must not block);
        changes in quick succession may come as one call with the latest value (ZooKeeper's watches)."""
        self._seen.watch(self._znodes.low(computation), computation, callback)

    def advance_low_watermark(self, computation: str, *, topology: Topology | None = None) -> int | None:
        """Publish max(computed, published) low watermark and return it; as :meth:`low_watermark`."""
        computed = self.low_watermark(computation, topology=topology)
        result: list[int | None] = [None]

        def update(old: Raw | None) -> bytes | None:
            result[0], new = low_payload(old, computed, clock=self._clock)
            return new

        self._rounds.cas(self._znodes.low(computation), f"advancing the low watermark of {computation}", update)
        self._seen.remember(computation, result[0])
        return result[0]

    def publish_oldest_work(self, computation: str, interval: int, oldest_work_ms: int | None, *,
                            sequencer: int) -> None:
        """Publish the oldest pending work of one key interval (``None``: none) under its lease sequencer.

        Raises:
            StaleSequencerError: a newer grant exists or has published (this writer is a zombie).
            ConfigError: bad name, or an interval outside the declared ones.
            CodecError: ``oldest_work_ms`` is not epoch milliseconds.
            LeaseLostError: the session expired while the call was paused or in flight.
        """
        self.publish_oldest_works(computation, {interval: (oldest_work_ms, sequencer)})

    def publish_oldest_works(self, computation: str, works: Mapping[int, tuple[int | None, int]], *,
                             topology: Topology | None = None) -> None:
        """:meth:`publish_oldest_work` for several intervals (interval -> (work, sequencer)), all or none."""
        self._publisher.oldest_works(computation, works, topology=topology)

    def publish_and_advance(self, computation: str, works: Mapping[int, tuple[int | None, int]], *,
                            injectors: Mapping[str, tuple[int, int]] | None = None) -> int | None:
        """:meth:`publish_oldest_works`, :meth:`advance_low_watermark` and ``injectors`` (name ->
        (watermark, sequencer)) in one transaction (step 7); returns the low watermark."""
        pub = dict(injectors or {})
        declared_, low = self._publisher.and_advance(computation, works, pub)
        if not declared_:  # the last raises ConfigError
            for name, (wm_ms, seq) in sorted(pub.items()):
                self.publish_injector(name, wm_ms, sequencer=seq)
            self.publish_oldest_works(computation, works)
            return self.advance_low_watermark(computation)
        self._seen.remember(computation, low)
        return low

    def publish_injector(self, injector: str, watermark_ms: int, *, sequencer: int = 0) -> int:
        """Publish a source's low watermark estimate (:data:`.low.END_OF_TIME`: finished); never backwards.
        Returns the stored watermark: ``watermark_ms``, or the larger one already stored. Raises
        StaleSequencerError (stored under a newer sequencer) or CodecError (not epoch milliseconds)."""
        check_ms("watermark_ms", watermark_ms, optional=False)
        what = f"publishing the watermark of injector {self.pipeline}/{injector}"
        stored: list[int] = []

        def update(old: Raw | None) -> bytes | None:
            value, new = injector_payload(what, old, watermark_ms, sequencer, clock=self._clock)
            stored[:] = [value]
            return new

        self._rounds.cas(self._znodes.injector(injector), what, update)
        return stored[0]

    def publish_instance_injector(self, injector: str, instance: str, watermark_ms: int, *,
                                  sequencer: int = 0,
                                  held: Mapping[str, Mapping[int, int]] | None = None) -> int | None:
        """Publish one job instance's estimate of a source with the intervals it ``held`` (computation ->
        interval -> lease sequencer); returns the injector's stored watermark (``None``: still unknown).
        Raises as :meth:`publish_injector`, and ConfigError for a bad instance name."""
        low = self._instances.publish(injector, instance, watermark_ms, sequencer=sequencer, held=held)
        if low is None:
            return self.injector_watermark(injector)
        return self.publish_injector(injector, low, sequencer=sequencer)

    def record_held(self, injector: str, instance: str, held: Mapping[str, Mapping[int, int]], *,
                    sequencer: int = 0) -> None:
        """Record the intervals ``instance`` holds beside its estimate of ``injector``, then publish the
        injector's watermark: a release a catch-up cleared lets it move on before the next input."""
        low = self._instances.record_held(injector, instance, held, sequencer=sequencer)
        if low is not None:
            self.publish_injector(injector, low, sequencer=sequencer)

    def record_caught_up(self, computation: str, sequencers: Mapping[int, int]) -> None:
        """Record that the owner of these intervals (interval -> sequencer) caught up on their input."""
        self._instances.record_caught_up(computation, sequencers)
