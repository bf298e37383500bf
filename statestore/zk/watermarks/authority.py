"""The watermark authority: the one object callers hold, built from the package's collaborators.

ZooKeeper SUSPENDED / LOST: every call pauses while the connection is SUSPENDED and is repeated
after a drop (``pause.py``, bounded by ``max_pause_s``); a publish under lease sequencers stops
with :class:`LeaseLostError` when the session was LOST meanwhile; :meth:`WatermarkAuthority.last_known`
answers without ZooKeeper, flagged stale (``seen.py``). Every znode is persistent: a LOST session
loses no watermark.
"""

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

    Args:
        client: a started kazoo client (see :func:`.client.connect`); the caller owns it.
        pipeline: pipeline name.
        clock: stamps ``published_ms`` and measures lag.
        acls: ACLs for created znodes (:func:`.client.digest_acls`); ``None`` = open.
        max_pause_s: how long a call waits for a suspended connection to serve again before it
            raises :class:`LeaseSuspendedError` (default :data:`.refusal.DEFAULT_MAX_PAUSE_S`;
            None: as long as the session is not reported expired); give it the lease manager's
            ``max_pause_s``. A server that lost its data is not waited for (``refusal.py``).

    Every call that reads or writes ZooKeeper raises :class:`LeaseSuspendedError` when it
    paused longer than ``max_pause_s``, and :class:`CodecError` on a damaged payload.
    """

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
        """Stop listening to the client's connection states (the client stays open). An authority
        is cheap to make; one made per call on a long-lived client should be closed, or the
        client keeps its listener alive."""
        self._connection.close()

    def declare(self, computation: str, *, upstream: Sequence[str], num_intervals: int,
                replace: bool = False) -> Topology:
        """Record a computation's inputs (each ``'computation:NAME'`` or ``'injector:NAME'``) and
        its key-interval count (intervals 0..num_intervals-1); idempotent. ``replace`` overwrites
        a different earlier declaration (re-sharding, new inputs).

        Raises:
            ConfigError: bad names or count, a self-loop, or a different declaration exists and
                ``replace`` is false.
        """
        path = self._znodes.topology(computation)
        topo = declared(computation, upstream=upstream, num_intervals=num_intervals)
        self._rounds.cas(path, f"declaring {self.pipeline}/{computation}", declare_update(computation, topo,
                                                                                       replace=replace))
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
        """The low watermark as MillWheel computes it (``reading.py``), maybe below the published
        one: epoch ms, ``None`` when not known yet, :data:`.low.END_OF_TIME` when all is done.
        ``topology``: the computation's, as the caller just read it (else read here).

        Raises:
            ConfigError: ``computation`` is not declared, or the topology has a cycle.
        """
        return self._reader.low_watermark(computation, topology=topology)

    def watermark_lag_ms(self, computation: str) -> int | None:
        """now - max(computed, published low watermark), at least 0; ``None`` while not known."""
        low = later(self.low_watermark(computation), self.published_low_watermark(computation))
        return None if low is None else max(0, self._clock.now_ms() - low)

    def snapshot(self) -> dict[str, Any]:
        """Every watermark of the pipeline, for the CLI and for inspection (as
        :meth:`.reading.Reader.snapshot` describes it)."""
        return self._reader.snapshot()

    def last_known(self, computation: str) -> LastKnown:
        """The last published low watermark this instance read, wrote or was told of; no ZooKeeper call."""
        return self._seen.last_known(computation)

    def watch_low_watermark(self, computation: str, callback: Callable[[int | None], None]) -> None:
        """Call ``callback(value)`` now and whenever the published low watermark changes. It runs on
        kazoo's event thread: it must not block or call ZooKeeper synchronously."""
        self._seen.watch(self._znodes.low(computation), computation, callback)

    def advance_low_watermark(self, computation: str, *, topology: Topology | None = None) -> int | None:
        """Compute the low watermark, publish max(computed, published) and return it.
        ``topology``: the computation's, as the caller just read it (else read here).

        Late data pulls the computed value below the published one, which stays: those records
        are late by definition (the caller counts or routes them). Raises as :meth:`low_watermark`.
        """
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
        """Publish the oldest pending work of one key interval (``None``: none) under the
        sequencer of this instance's lease grant on it, fenced by the lease (``publish.py``). The
        value may go down (late data); the published low watermark does not.

        Raises:
            StaleSequencerError: a newer grant exists or has published (this writer is a zombie).
            ConfigError: bad name, or an interval outside the declared ones.
            CodecError: ``oldest_work_ms`` is not epoch milliseconds.
            LeaseLostError: the session expired while the call was paused or in flight.
        """
        self.publish_oldest_works(computation, {interval: (oldest_work_ms, sequencer)})

    def publish_oldest_works(self, computation: str, works: Mapping[int, tuple[int | None, int]], *,
                             topology: Topology | None = None) -> None:
        """:meth:`publish_oldest_work` for several intervals (interval -> (oldest work, sequencer)) in
        one round of reads and one transaction: all are written or none. ``topology``: as the
        caller just read it (else read here for the range check). Raises as :meth:`publish_oldest_work`."""
        self._publisher.oldest_works(computation, works, topology=topology)

    def publish_and_advance(self, computation: str, works: Mapping[int, tuple[int | None, int]], *,
                            injectors: Mapping[str, tuple[int, int]] | None = None) -> int | None:
        """:meth:`publish_oldest_works` then :meth:`advance_low_watermark`, in one pipelined round of
        reads and one transaction (step 7 of the batch protocol), with ``injectors`` (name ->
        (watermark, sequencer)) published in the same transaction as :meth:`publish_injector` does.
        The new low watermark is the minimum of values that all still hold when it lands; a
        changed topology or a concurrent writer makes the round run again (``publish.py``).

        Returns the published low watermark. Raises as the separate calls (an undeclared
        computation gets its oldest work published, then :class:`ConfigError`, as they do).
        """
        pub = dict(injectors or {})
        declared_, low = self._publisher.and_advance(computation, works, pub)
        if not declared_:  # as the separate calls do: the last raises ConfigError
            for name, (wm_ms, seq) in sorted(pub.items()):
                self.publish_injector(name, wm_ms, sequencer=seq)
            self.publish_oldest_works(computation, works)
            return self.advance_low_watermark(computation)
        self._seen.remember(computation, low)
        return low

    def publish_injector(self, injector: str, watermark_ms: int, *, sequencer: int = 0) -> int:
        """Publish a source's low watermark estimate (records it emits behind it later are late;
        :data:`.low.END_OF_TIME` when it is finished); it never moves backwards.

        Returns:
            The stored watermark: ``watermark_ms``, or the larger one already stored.

        Raises:
            StaleSequencerError: the stored value was published with a newer sequencer.
            CodecError: ``watermark_ms`` is not epoch milliseconds.
        """
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
        """Publish one job instance's estimate of a source (monotonic) with the intervals it holds
        (``held``: computation -> interval -> lease sequencer); the injector's watermark becomes the
        minimum over the instances that count, never moving back (``instances.py``).

        Returns:
            The injector's stored watermark after this call (``None``: still unknown).

        Raises:
            StaleSequencerError, CodecError: as :meth:`publish_injector`.
            ConfigError: a bad instance name.
        """
        low = self._instances.publish(injector, instance, watermark_ms, sequencer=sequencer, held=held)
        if low is None:  # a live instance has no estimate yet: hold
            return self.injector_watermark(injector)
        return self.publish_injector(injector, low, sequencer=sequencer)

    def record_held(self, injector: str, instance: str, held: Mapping[str, Mapping[int, int]], *,
                    sequencer: int = 0) -> None:
        """Record the intervals ``instance`` holds now beside its estimate of ``injector``, without
        publishing one: an instance lost before its first publish still holds the watermark back."""
        self._instances.record_held(injector, instance, held, sequencer=sequencer)

    def record_caught_up(self, computation: str, sequencers: Mapping[int, int]) -> None:
        """Record that the owner of these intervals (interval -> its lease sequencer) caught up on
        their input after taking them (``rescale.py``): a gone instance that held one of them
        stops holding the injectors' watermarks back for it. Never moves back."""
        self._instances.record_caught_up(computation, sequencers)
