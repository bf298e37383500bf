"""Several job instances reading one injector: each one's estimate, and who still holds it back.

ZooKeeper SUSPENDED / LOST: every call is a round of :class:`.rounds.Rounds`; estimates persist;
who counts: :func:`.low.instances_low`."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from ...clock import Clock
from ...layout import validate_name
from ..members import live_members
from .codec import Znodes, caught_up_payload, check_ms, decode, instance_update
from .low import instances_low, watched
from .pause import zk_call
from .rounds import Rounds, got

__all__ = ["Instances"]

Held = Mapping[str, Mapping[int, int]]  #: computation -> interval -> the lease sequencer it is held with


class Instances:
    """The instances' estimates of a pipeline's injectors."""

    def __init__(self, rounds: Rounds, znodes: Znodes, clock: Clock) -> None:
        self._rounds = rounds
        self._znodes = znodes
        self._clock = clock

    def publish(self, injector: str, instance: str, watermark_ms: int, *, sequencer: int,
                held: Held | None) -> int | None:
        """Store ``instance``'s estimate of ``injector`` and the intervals it holds; return the minimum."""
        check_ms("watermark_ms", watermark_ms, optional=False)
        validate_name("instance", instance)
        pipeline = self._znodes.pipeline
        what = f"publishing instance {instance}'s watermark of injector {pipeline}/{injector}"
        update = instance_update(what, instance, watermark_ms, sequencer=sequencer, held=held, clock=self._clock)
        base = self._znodes.instances(injector)
        self._rounds.cas(f"{base}/{instance}", what, update)
        return self.low(injector, instance, what)

    def low(self, injector: str, instance: str, what: str) -> int | None:
        """The injector's watermark from the stored estimates, releases and catch-ups (``instance`` live)."""
        pipeline, base, client = self._znodes.pipeline, self._znodes.instances(injector), self._rounds.client

        def estimate() -> int | None:
            with zk_call(what):
                live = set(live_members(client, pipeline)) | {instance}
                names = set(self._rounds.children(base)) | live
                pending = {n: client.get_async(f"{base}/{n}") for n in sorted(names)}
                stored = {n: None if (data := got(res)[0]) is None else decode(data, what)
                          for n, res in pending.items()}
                caught = self._caught_up(watched(stored, live=live))
                return instances_low(stored, live=live, caught=caught)

        return self._rounds.connection.resilient(what, estimate)  # type: ignore[no-any-return]

    def record_held(self, injector: str, instance: str, held: Held, *, sequencer: int) -> int | None:
        """Store the intervals ``instance`` holds beside its unchanged estimate; returns :meth:`low`."""
        validate_name("instance", instance)
        what = (f"recording the intervals instance {instance} holds, for injector "
                f"{self._znodes.pipeline}/{injector}")
        base = self._znodes.instances(injector)
        self._rounds.cas(f"{base}/{instance}", what, instance_update(what, instance, None, sequencer=sequencer,
                                                                     held=held, clock=self._clock))
        return self.low(injector, instance, what)

    def record_caught_up(self, computation: str, sequencers: Mapping[int, int]) -> None:
        """Record, per interval, the sequencer of its owner that caught up (never an older one)."""
        what = f"recording the catch-up of {self._znodes.pipeline}/{computation}"
        base = self._znodes.caught_up(computation)
        for interval, seq in sorted(sequencers.items()):
            self._rounds.cas(f"{base}/{interval:05d}", what,
                             functools.partial(caught_up_payload, sequencer=int(seq), clock=self._clock))

    def _caught_up(self, computations: Iterable[str]) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        client = self._rounds.client
        for comp in sorted(computations):
            base = f"{self._znodes.folder('caught_up')}/{comp}"
            pending = {int(i): client.get_async(f"{base}/{i}") for i in self._rounds.children(base)}
            out[comp] = {i: int(decode(data, base)["sequencer"]) for i, res in pending.items()
                         if (data := got(res)[0]) is not None}
        return out
