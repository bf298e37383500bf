"""Publishing oldest work under the lease fence, alone or with the low watermark's advance (step 7).

ZooKeeper SUSPENDED / LOST: as ``pause.py``; a publish whose session was LOST raises
:class:`LeaseLostError`. The write checks the version of the lease owner znode carrying the
writer's sequencer; a newer grant or stored sequencer raises :class:`StaleSequencerError`."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from kazoo.protocol.states import ZnodeStat

from ...clock import Clock
from ...exceptions import ConfigError
from .codec import Znodes, check_ms, decode, injector_payload, low_payload, oldest_work_payload, stale
from .low import END_OF_TIME, low_watermark, work_value
from .pause import zk_call
from .reading import Reader
from .rounds import Rounds, got
from .topology import Topology, parse_upstream

__all__ = ["Publisher", "owner_fence"]

log = logging.getLogger(__name__)

Works = Mapping[int, tuple[int | None, int]]  #: interval -> (oldest work in ms, None: nothing; our sequencer)
_Got = tuple[bytes | None, ZnodeStat | None]


def owner_fence(what: str, owner_path: str, sequencer: int, data: bytes | None,
                stat: ZnodeStat | None) -> tuple[str, int] | None:
    """The (path, version) check a publish under ``sequencer`` must carry; a newer grant raises."""
    if data is None or stat is None:
        return None
    try:
        theirs = json.loads(data.decode("utf-8")).get("sequencer")
    except (UnicodeDecodeError, ValueError, AttributeError):
        theirs = None
    if not isinstance(theirs, int) or theirs > sequencer:
        raise stale(what, sequencer, theirs if isinstance(theirs, int) else "(being granted)", "the current lease")
    return (owner_path, stat.version) if theirs == sequencer else None


def _check_range(computation: str, ivs: list[int], topo: Topology | None) -> None:
    if topo is not None and ivs and ivs[-1] >= topo.num_intervals:
        raise ConfigError(f"{computation} is declared with {topo.num_intervals} intervals; "
                          f"interval {ivs[-1]} does not exist")


@dataclass(frozen=True)
class _Read:
    """What one round of :meth:`Publisher.and_advance` read: (data, stat) of each node."""

    injectors: dict[str, _Got]
    intervals: list[_Got]
    owners: dict[int, _Got]
    low: _Got


class Publisher:
    """Publishes a computation's oldest work (and advances its low watermark with it)."""

    def __init__(self, rounds: Rounds, znodes: Znodes, reader: Reader, clock: Clock) -> None:
        self._rounds = rounds
        self._znodes = znodes
        self._reader = reader
        self._clock = clock
        self._topologies: dict[str, Topology] = {}

    def oldest_works(self, computation: str, works: Works, *, topology: Topology | None = None) -> None:
        """One compare-and-set of the oldest work of several intervals, each under its lease fence."""
        session = self._rounds.connection.session()  # the sequencers are this session's grants
        ivs = sorted(works)
        if not ivs:
            return
        for iv in ivs:
            check_ms("oldest_work_ms", works[iv][0], optional=True)
        owners = {iv: self._znodes.owner(computation, iv) for iv in ivs}  # range check
        _check_range(computation, ivs, topology if topology is not None else self._reader.topology(computation))
        items = []
        for iv in ivs:
            oldest, sequencer = works[iv]
            one = f"publishing oldest work of interval {iv} of {self._znodes.pipeline}/{computation}"
            update = functools.partial(oldest_work_payload, one, oldest=oldest, sequencer=sequencer, clock=self._clock)
            judge = functools.partial(owner_fence, one, owners[iv], sequencer)
            items.append((self._znodes.interval(computation, iv), update, (owners[iv], judge)))
        self._rounds.cas_many(f"publishing oldest work of interval{'s' if len(ivs) > 1 else ''} "
                              f"{', '.join(map(str, ivs))} of {self._znodes.pipeline}/{computation}", items,
                              session=session)

    def and_advance(self, computation: str, works: Works, injectors: Mapping[str, tuple[int, int]]
                    ) -> tuple[bool, int | None]:
        """(declared, published low watermark): :meth:`.authority.WatermarkAuthority.publish_and_advance`."""
        session = self._rounds.connection.session()
        ivs = sorted(works)
        for iv in ivs:
            check_ms("oldest_work_ms", works[iv][0], optional=True)
        for wm_ms, _ in injectors.values():
            check_ms("watermark_ms", wm_ms, optional=False)
        what = (f"publishing oldest work of interval{'s' if len(ivs) > 1 else ''} {', '.join(map(str, ivs))} "
                f"of {self._znodes.pipeline}/{computation} and advancing its low watermark")

        def step() -> tuple[bool, int | None]:
            while True:
                topo = self._topologies.get(computation)
                if topo is None:
                    topo = self._reader.topology(computation)
                    if topo is None:
                        return False, None
                    self._topologies[computation] = topo
                done, low = self._round(computation, works, topo, what, injectors)
                if done:
                    return True, low

        return self._rounds.connection.resilient(what, step, session=session)  # type: ignore[no-any-return]

    def _round(self, computation: str, works: Works, topo: Topology, what: str,
               pub: Mapping[str, tuple[int, int]]) -> tuple[bool, int | None]:
        """One try with the topology read last time: (done, low watermark)."""
        ivs = sorted(works)
        _check_range(computation, ivs, topo)
        upstream = [parse_upstream(u) for u in topo.upstream]
        memo = {name: self._reader.upstream_low(name, below=computation)
                for kind, name in upstream if kind == "computation"}
        owners = {iv: self._znodes.owner(computation, iv) for iv in ivs}
        low_path = self._znodes.low(computation)
        names = sorted({n for k, n in upstream if k == "injector"} | set(pub))
        with zk_call(what):
            read = self._read(computation, topo, names, owners, low_path)
            if read is None:
                self._topologies.pop(computation, None)  # redeclared: read it again
                return False, None
            return self._write(computation, works, read, what=what, pub=pub, memo=memo, upstream=upstream,
                               owners=owners, low_path=low_path)

    def _read(self, computation: str, topo: Topology, names: list[str], owners: Mapping[int, str],
              low_path: str) -> _Read | None:
        """The round's reads, pipelined; None when the stored topology is no longer ``topo``."""
        get, znodes = self._rounds.client.get_async, self._znodes
        r_topo = get(znodes.topology(computation))
        r_inj = {n: get(znodes.injector(n)) for n in names}
        r_ivs = [get(znodes.interval(computation, i)) for i in range(topo.num_intervals)]
        r_own = {iv: get(path) for iv, path in owners.items()}
        r_low = get(low_path)
        topo_data, _ = got(r_topo)
        read = _Read({n: got(r) for n, r in r_inj.items()}, [got(r) for r in r_ivs],
                     {iv: got(r) for iv, r in r_own.items()}, got(r_low))
        return read if (None if topo_data is None else Topology.from_payload(topo_data)) == topo else None

    def _write(self, computation: str, works: Works, read: _Read, *, what: str, pub: Mapping[str, tuple[int, int]],
               memo: Mapping[str, int | None], upstream: list[tuple[str, str]], owners: Mapping[int, str],
               low_path: str) -> tuple[bool, int | None]:
        """The round's one transaction, the low watermark checked against every input it read."""
        tx = self._rounds.client.transaction()
        writes = 0
        stored: dict[str, int | None] = {}
        written: set[str] = set()
        pipeline = self._znodes.pipeline
        for name, (data, stat) in read.injectors.items():
            old_inj = None if data is None else decode(data, "injector watermark")
            if name in pub:
                wm_ms, seq = pub[name]
                value, new_inj = injector_payload(f"publishing the watermark of injector {pipeline}/{name}", old_inj,
                                                  wm_ms, seq, clock=self._clock)
                stored[name] = value
                if new_inj is not None:
                    self._rounds.put(tx, self._znodes.injector(name), new_inj, stat)
                    written.add(name)
                    writes += 1
            else:
                stored[name] = None if old_inj is None else int(old_inj["watermark_ms"])
        ups = [memo[name] if kind == "computation" else stored[name] for kind, name in upstream]
        # what the low watermark reads (a node this step writes is checked by its own write)
        inputs = [(self._znodes.injector(n), st) for n, (_, st) in read.injectors.items() if n not in written]
        values: list[int | None] = []
        for i, (data, stat) in enumerate(read.intervals):
            old = None if data is None else decode(data, "oldest work")
            path = self._znodes.interval(computation, i)
            if i not in works:
                values.append(work_value(old))
                inputs.append((path, stat))
                continue
            oldest, sequencer = works[i]
            one = f"publishing oldest work of interval {i} of {pipeline}/{computation}"
            new = oldest_work_payload(one, old, oldest, sequencer, clock=self._clock)
            check = owner_fence(one, owners[i], sequencer, *read.owners[i])
            if check is not None:
                tx.check(*check)
            self._rounds.put(tx, path, new, stat)
            writes += 1
            values.append(END_OF_TIME if oldest is None else oldest)
        low_data, low_stat = read.low
        low, new_low = low_payload(None if low_data is None else decode(low_data, "low watermark"),
                                   low_watermark(ups, values), clock=self._clock)
        if new_low is not None:
            self._rounds.put(tx, low_path, new_low, low_stat)
            writes += 1
            for path, st in inputs:
                if st is not None:
                    tx.check(path, st.version)
        if writes and any(isinstance(r, Exception) for r in tx.commit()):
            log.debug("%s: concurrent update, retrying", what)
            return False, None
        return True, low
