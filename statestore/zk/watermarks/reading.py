"""Reading the watermarks: the stored values, and the low watermark computed from its inputs.

ZooKeeper SUSPENDED / LOST: each read is paused while SUSPENDED and repeated after a drop; reads
write nothing. Upstream values count as max(computed, published)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...exceptions import ConfigError
from .codec import Raw, Znodes, decode, encode
from .low import later, low_watermark, work_value
from .pause import zk_call
from .rounds import Rounds, got
from .seen import LastSeen
from .topology import Topology, parse_upstream

__all__ = ["Reader"]


class Reader:
    """The stored watermarks of one pipeline, and low watermarks computed from them."""

    def __init__(self, rounds: Rounds, znodes: Znodes, seen: LastSeen) -> None:
        self._rounds = rounds
        self._znodes = znodes
        self._seen = seen

    def topology(self, computation: str) -> Topology | None:
        """The declared topology of ``computation``, or ``None`` when it is not declared."""
        raw = self._rounds.read(self._znodes.topology(computation), "topology")
        return None if raw is None else Topology.from_payload(encode(raw))

    def injector_watermark(self, injector: str) -> int | None:
        """The stored watermark of ``injector``; ``None`` when it never published."""
        raw = self._rounds.read(self._znodes.injector(injector), "injector watermark")
        return None if raw is None else int(raw["watermark_ms"])

    def published_low_watermark(self, computation: str) -> int | None:
        """The stored (monotonic) low watermark; ``None`` when never advanced."""
        raw = self._rounds.read(self._znodes.low(computation), "low watermark")
        value = None if raw is None else raw["low_watermark_ms"]
        self._seen.remember(computation, value)
        return value

    def oldest_work(self, computation: str, num_intervals: int) -> dict[int, Raw | None]:
        """Published oldest-work payloads of intervals 0..num_intervals-1 (``None``: never published)."""
        return self.inputs_of(computation, (), num_intervals, what=f"reading oldest work of {computation}")[1]

    def low_watermark(self, computation: str, *, topology: Topology | None = None) -> int | None:
        """:meth:`.authority.WatermarkAuthority.low_watermark` (``topology``: as the caller just read it)."""
        topo = topology if topology is not None else self.topology(computation)
        if topo is None:
            raise ConfigError(f"{self._znodes.pipeline}/{computation} is not declared; declare() it with its "
                              "upstream and num_intervals first")
        return self.compute(computation, {}, (), topo=topo)

    def upstream_low(self, computation: str, *, below: str) -> int | None:
        """What upstream ``computation`` counts with for ``below``: max(computed, published)."""
        return later(self.compute(computation, {}, (below,)), self.published_low_watermark(computation))

    def compute(self, computation: str, memo: dict[str, int | None], path: tuple[str, ...], *,
                topo: Topology | None = None) -> int | None:
        """The low watermark of ``computation`` via ``path`` (a cycle raises); ``memo``: upstream values."""
        if computation in path:
            cycle = " -> ".join((*path[path.index(computation):], computation))
            raise ConfigError(f"the topology of {self._znodes.pipeline} has a cycle ({cycle}); low watermarks "
                              "need an acyclic pipeline")
        if topo is None:
            topo = self.topology(computation)
        if topo is None:
            return None
        values: list[int | None] = []
        upstream = [parse_upstream(u) for u in topo.upstream]
        injected, oldest = self.inputs_of(computation, [n for k, n in upstream if k == "injector"],
                                          topo.num_intervals)
        for kind, name in upstream:
            if kind == "injector":
                values.append(injected[name])
                continue
            if name not in memo:
                computed = self.compute(name, memo, (*path, computation))
                memo[name] = later(computed, self.published_low_watermark(name))
            values.append(memo[name])
        return low_watermark(values, (work_value(raw) for raw in oldest.values()))

    def inputs_of(self, computation: str, injectors: Sequence[str], num_intervals: int, *,
                  what: str | None = None) -> tuple[dict[str, int | None], dict[int, Raw | None]]:
        """(:meth:`injector_watermark` of each of ``injectors``, :meth:`oldest_work`), read in one round."""
        client, znodes = self._rounds.client, self._znodes
        what = what or f"reading the inputs of {computation}'s low watermark"

        def read() -> tuple[dict[str, int | None], dict[int, Raw | None]]:
            with zk_call(what):
                inj = {n: client.get_async(znodes.injector(n)) for n in injectors}
                ivs = [client.get_async(znodes.interval(computation, i)) for i in range(num_intervals)]
                marks = {n: None if (data := got(res)[0]) is None else
                         int(decode(data, "injector watermark")["watermark_ms"]) for n, res in inj.items()}
                return marks, {i: None if (data := got(res)[0]) is None else decode(data, "oldest work")
                               for i, res in enumerate(ivs)}

        return self._rounds.connection.resilient(what, read)  # type: ignore[no-any-return]

    def snapshot(self) -> dict[str, Any]:
        """Every watermark of the pipeline: ``{"pipeline", "injectors": {name: {...}}, "computations":
        {name: {declared, upstream, num_intervals, intervals, low_watermark_ms, published_low_watermark_ms}}}``."""
        znodes, rounds = self._znodes, self._rounds
        rounds.connection.connected("reading the watermarks")
        with zk_call("reading the watermarks"):
            injectors = rounds.children(znodes.folder("injectors"))
            names = sorted(set(rounds.children(znodes.folder("topology")))
                           | set(rounds.children(znodes.folder("computations"))))
            published = {n: [int(i) for i in rounds.children(f"{znodes.folder('computations')}/{n}")]
                         for n in names}
        out: dict[str, Any] = {"pipeline": znodes.pipeline, "injectors": {}, "computations": {}}
        for name in injectors:
            raw = rounds.read(znodes.injector(name), "injector watermark")
            if raw is not None:
                out["injectors"][name] = {k: raw[k] for k in ("watermark_ms", "sequencer", "published_ms")}
        for name in names:
            topo = self.topology(name)
            count = topo.num_intervals if topo else max(published[name], default=-1) + 1
            out["computations"][name] = {
                "declared": topo is not None,
                "upstream": list(topo.upstream) if topo else [],
                "num_intervals": topo.num_intervals if topo else None,
                "intervals": {i: None if raw is None else {k: raw[k] for k in
                                                           ("oldest_work_ms", "sequencer", "published_ms")}
                              for i, raw in self.oldest_work(name, count).items()},
                "low_watermark_ms": self.compute(name, {}, ()) if topo else None,
                "published_low_watermark_ms": self.published_low_watermark(name),
            }
        return out

