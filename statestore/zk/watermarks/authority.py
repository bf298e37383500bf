"""Low watermarks (MillWheel sections 3.3 and 5.4), held in ZooKeeper.

Connection states: every call that writes needs a live session. While the
connection is SUSPENDED (a server went away, or the ensemble lost its quorum and
answers nobody), writes and reads *pause* as commits do
(:meth:`.LeaseManager.await_valid`): they log once that they are paused and why,
wait for ZooKeeper to serve again (``max_pause_s``, default 300 s, None: as long
as the session is not reported expired; then :class:`LeaseSuspendedError`; a
server that lost its data: :class:`CoordinatorStateLostError`, ``refusal.py``), log
that they resume, and go on; a call cut off mid-way by the drop is repeated,
re-reading before it writes. :meth:`WatermarkAuthority.last_known` serves, without ZooKeeper, the
last *published* low watermark this instance saw, flagged ``stale``: safe,
because published values never move backwards, so a stale value is only ever
too low (timers fire late, never early). A LOST session loses nothing here
(every znode is persistent), but a write under a lease sequencer
(:meth:`WatermarkAuthority.publish_oldest_works`) that was in flight or paused
when the session expired raises :class:`LeaseLostError`: the writer's leases
went with the session, so it must publish again with the sequencer of a new grant.

Terms (times are epoch milliseconds): the *oldest work* of a key interval is
the oldest of its unprocessed input, pending event-time timers, undelivered
productions and watermark holds; the executor owning the interval publishes it
with its lease sequencer (``None``: nothing pending). An *injector watermark*
is an estimate the source declares (e.g. min event time of unfinished input, or
max seen minus a bound); records behind it are late; a finished source
publishes :data:`END_OF_TIME`. The *low watermark* of ``A`` = min(oldest work of
every interval of ``A``, low watermarks of its upstream computations and
injectors), recursively. ``None`` means *not known yet* (an interval or input
never published, or an upstream not declared yet): fire no event-time timer.
:data:`END_OF_TIME` means all input is finished and nothing is pending.

Layout below the client's chroot, per pipeline ``p`` (intervals as ``{I:05d}``)::

    /pipelines/{p}/topology/{c}                      {"upstream": ["injector:x", "computation:y"], ...}
    /pipelines/{p}/watermarks/computations/{c}/{I}   oldest work + the publisher's sequencer
    /pipelines/{p}/watermarks/injectors/{i}          injector watermark (monotonic)
    /pipelines/{p}/watermarks/instances/{i}/{n}      instance n's estimate of injector i (monotonic)
                                                     + the intervals (and sequencers) n held
    /pipelines/{p}/watermarks/caught_up/{c}/{I}      the sequencer of the last owner of interval I
                                                     that caught up on its input (rescaling)
    /pipelines/{p}/watermarks/low/{c}                published low watermark (monotonic)

Instances (several job instances sharing a computation's intervals, ``members.py``) each read
the whole input with their own query, so each has its own estimate of an injector:
:meth:`WatermarkAuthority.publish_instance_injector` stores it under the instance's name, and the
injector's watermark (what computations read as ``injector:{i}``) becomes the minimum over the
*live* members' estimates and the publisher's own, still never moving back. A live member that
has published nothing yet holds the injector's watermark where it is; an instance that drained
its input counts with :data:`END_OF_TIME`. A member that left (or whose session died) counts
until every interval it held has been caught up by a later owner
(:meth:`WatermarkAuthority.record_caught_up`): its unread records of those intervals are read by
the taker's catch-up, which must not find them behind a watermark the leaver never reached.

Every update is a compare-and-set on the znode version (concurrent writers
re-read and retry). A writer whose sequencer is older than the stored one, or
than the interval's current lease grant, gets :class:`StaleSequencerError`.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.security import ACL

from ...clock import Clock, SystemClock
from ...exceptions import CodecError, ConfigError, LeaseLostError, LeaseSuspendedError, StaleSequencerError
from ...layout import validate_name
from ..client import zk_errors
from ..grants import MAX_INTERVAL, ZNODE_DAMAGED_HINT, interval_path
from ..layout import ensure_zk_layout
from ..refusal import DEFAULT_MAX_PAUSE_S, check_refused

__all__ = ["END_OF_TIME", "WATERMARK_FORMAT_VERSION", "LastKnown", "Topology", "WatermarkAuthority", "parse_upstream",
           "read_injector_watermark"]

log = logging.getLogger(__name__)

END_OF_TIME = 2**63 - 1
"""The watermark of a finished input: every event time is behind it."""
WATERMARK_FORMAT_VERSION = 1
_KINDS = ("computation", "injector")
_SYSTEM_CLOCK = SystemClock()
Raw = dict[str, Any]


def parse_upstream(text: str) -> tuple[str, str]:
    """Split ``'computation:NAME'`` / ``'injector:NAME'`` into (kind, name).

    >>> parse_upstream("injector:clicks")
    ('injector', 'clicks')

    Raises:
        ConfigError: no known prefix, or an invalid name.
    """
    kind, sep, name = text.partition(":")
    if not sep or kind not in _KINDS:
        raise ConfigError(f"upstream {text!r} must be 'computation:NAME' or 'injector:NAME'")
    return kind, validate_name(kind, name)


@dataclass(frozen=True)
class Topology:
    """The declared inputs (``'kind:name'`` strings) and key-interval count of a computation.

    >>> t = Topology(("injector:src",), 2)
    >>> Topology.from_payload(t.to_payload()) == t
    True
    """

    upstream: tuple[str, ...]
    num_intervals: int

    def to_payload(self) -> bytes:
        """JSON for the topology znode (carries ``format_version``)."""
        return _encode({"upstream": list(self.upstream), "num_intervals": self.num_intervals})

    @classmethod
    def from_payload(cls, data: bytes) -> Topology:
        """Decode :meth:`to_payload` output.

        Raises:
            CodecError: damaged, or written by a newer deltawheel.
        """
        raw = _decode(data, "topology")
        try:
            return cls(tuple(str(u) for u in raw["upstream"]), int(raw["num_intervals"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CodecError(f"topology payload is damaged: {raw}{ZNODE_DAMAGED_HINT}") from exc


@dataclass(frozen=True)
class LastKnown:
    """The last published low watermark this instance saw (``None``: none yet).

    ``stale`` is true while the connection is not CONNECTED: a newer value may exist.
    """

    low_watermark_ms: int | None
    seen_ms: int | None
    stale: bool


def _encode(fields: Raw) -> bytes:
    return json.dumps({"format_version": WATERMARK_FORMAT_VERSION, **fields}, sort_keys=True).encode()


def _decode(data: bytes, what: str) -> Raw:
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CodecError(f"{what} payload is not JSON: {data[:80]!r}{ZNODE_DAMAGED_HINT}") from exc
    if not isinstance(raw, dict):
        raise CodecError(f"{what} payload is not a JSON object: {data[:80]!r}{ZNODE_DAMAGED_HINT}")
    if raw.get("format_version") != WATERMARK_FORMAT_VERSION:
        raise CodecError(f"{what} payload has format_version {raw.get('format_version')!r}, this "
                         f"deltawheel reads {WATERMARK_FORMAT_VERSION}; upgrade deltawheel")
    return raw


def read_injector_watermark(client: KazooClient, *, pipeline: str, injector: str) -> int | None:
    """The stored watermark of ``injector`` in ``pipeline`` (None: never published), read once and
    without a :class:`WatermarkAuthority` (which sets up the ZooKeeper layout): for read-only tools."""
    path = f"/pipelines/{validate_name('pipeline', pipeline)}/watermarks/injectors/{validate_name('injector', injector)}"
    try:
        data, _ = client.get(path)
    except NoNodeError:
        return None
    return int(_decode(data, "injector watermark")["watermark_ms"])


def _check_ms(name: str, value: int | None, *, optional: bool) -> None:
    if (value is not None or not optional) and (not isinstance(value, int) or isinstance(value, bool)
                                                or not -END_OF_TIME <= value <= END_OF_TIME):
        raise CodecError(f"{name} must be epoch milliseconds (an int up to END_OF_TIME), got {value!r}")


def _min(values: Sequence[int | None]) -> int | None:
    """Min in which ``None`` (unknown) wins over everything; no values at all give END_OF_TIME."""
    return None if None in values else min((v for v in values if v is not None), default=END_OF_TIME)


def _handing_off(held: Mapping[str, Mapping[str, int]], caught: Mapping[str, Mapping[int, int]]) -> bool:
    """Whether an instance that is gone still holds an injector's watermark back: an interval it
    held has no later owner that caught up on it (a caught-up sequencer above the one it held)."""
    return any(caught.get(comp, {}).get(int(i), -1) <= int(seq)
               for comp, ivs in held.items() for i, seq in ivs.items())


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _zk_errors(what: str) -> Any:
    return zk_errors(what, expired="acquire the leases again and publish with the new sequencer",
                     lost="the ZooKeeper connection was lost; retry once it reconnects")


_Fence = tuple[str, Callable[[bytes | None, ZnodeStat | None], "tuple[str, int] | None"]]


def _got(res: Any) -> tuple[bytes | None, ZnodeStat | None]:
    """An asynchronous ``get``'s (data, stat); (None, None) for a missing node."""
    try:
        return res.get()  # type: ignore[no-any-return]
    except NoNodeError:
        return None, None


def _stale(what: str, ours: int, theirs: object, where: str) -> StaleSequencerError:
    return StaleSequencerError(f"{what}: {where} has sequencer {theirs}, newer than ours ({ours}); drop the "
                               "interval and re-acquire its lease")


def _owner_fence(what: str, owner_path: str, sequencer: int, data: bytes | None,
                 stat: ZnodeStat | None) -> tuple[str, int] | None:
    """The (path, version) check a publish under ``sequencer`` must carry: the lease owner node
    while it names our grant; None when no lease is recorded (released, or leases not in use:
    the stored sequencer decides) or it names an older one. A newer grant raises."""
    if data is None or stat is None:
        return None
    try:
        theirs = json.loads(data.decode("utf-8")).get("sequencer")
    except (UnicodeDecodeError, ValueError, AttributeError):
        theirs = None
    if not isinstance(theirs, int) or theirs > sequencer:
        raise _stale(what, sequencer, theirs if isinstance(theirs, int) else "(being granted)", "the current lease")
    return (owner_path, stat.version) if theirs == sequencer else None


class _Pause:
    """One call's wait for ZooKeeper to serve again, as :meth:`.LeaseManager.await_valid` pauses
    commits: a warning when it starts (what and why), one every ``log_every_s`` while it lasts,
    one when it ends; :class:`LeaseSuspendedError` after ``bound`` seconds (None: no bound).
    ``probe(paused_s, final)`` is asked while it lasts (:func:`.refusal.check_refused`: a server
    that lost its data is not waited for)."""

    def __init__(self, what: str, bound: float | None, *, log_every_s: float = 30.0,
                 probe: Callable[[str, float, bool], None] | None = None) -> None:
        self.what = what
        self.bound = bound
        self.probe = probe
        self.log_every_s = log_every_s
        self.started: float | None = None
        self._next_log = 0.0

    def wait(self, why: str) -> None:
        """Note that ZooKeeper does not serve (``why``), then sleep a moment (or raise past the bound)."""
        now = time.monotonic()
        if self.started is None:
            self.started, self._next_log = now, now + self.log_every_s
            log.warning("%s paused: %s (no ZooKeeper server answers, or the ensemble lost its quorum); waiting "
                        "for it to serve again", self.what, why)
        elif now >= self._next_log:
            self._next_log = now + self.log_every_s
            log.warning("%s still paused after %.0f s: ZooKeeper does not serve", self.what, now - self.started)
        final = self.bound is not None and now - self.started >= self.bound
        if self.probe is not None:
            self.probe(self.what, now - self.started, final)
        if final:
            raise LeaseSuspendedError(
                f"{self.what} paused for {now - self.started:.0f} s and ZooKeeper still does not serve ({why}): no "
                "server answers (unreachable, or down) or the ensemble lost its quorum; nothing was written. Bring "
                "ZooKeeper back (a majority of the ensemble's servers) and run again")
        time.sleep(0.05)

    def resumed(self) -> None:
        """Log the end of the pause, if there was one."""
        if self.started is not None:
            log.warning("%s resumes: ZooKeeper serves again after a pause of %.1f s", self.what,
                        time.monotonic() - self.started)


class WatermarkAuthority:
    """Publishes oldest work and injector watermarks; computes and publishes low watermarks.

    Args:
        client: a started kazoo client (see :func:`.zkclient.connect`); the caller owns it.
        pipeline: pipeline name.
        clock: stamps ``published_ms`` and measures lag.
        acls: ACLs for created znodes (:func:`.zkclient.digest_acls`); ``None`` = open.
        max_pause_s: how long a call waits for a suspended connection to serve again before it
            raises :class:`LeaseSuspendedError` (default :data:`.refusal.DEFAULT_MAX_PAUSE_S`;
            None: as long as the session is not reported expired); give it the lease manager's
            ``max_pause_s``. A server that lost its data is not waited for (``refusal.py``).
    """

    def __init__(self, client: KazooClient, *, pipeline: str, clock: Clock = _SYSTEM_CLOCK,
                 acls: list[ACL] | None = None, max_pause_s: float | None = DEFAULT_MAX_PAUSE_S) -> None:
        self._client = client
        self.max_pause_s = max_pause_s
        self.pipeline = validate_name("pipeline", pipeline)
        self._clock = clock
        self._acls = acls
        self._base = f"/pipelines/{pipeline}"
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[int | None, int]] = {}
        self._topologies: dict[str, Topology] = {}  # as publish_and_advance last read them
        self._expiries = 0  # sessions of ``client`` reported expired (LOST) so far
        ensure_zk_layout(client)
        client.add_listener(self._on_state)

    def close(self) -> None:
        """Stop listening to the client's connection states (the client stays open). An authority
        is cheap to make; one made per call on a long-lived client should be closed, or the
        client keeps it (its listener) alive."""
        self._client.remove_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        """kazoo listener: counts expired sessions (never blocks or calls ZooKeeper)."""
        if state == KazooState.LOST:
            with self._lock:
                self._expiries += 1

    def _path(self, kind: str, name: str) -> str:
        folder = {"topology": "topology", "injector": "watermarks/injectors", "low": "watermarks/low",
                  "computation": "watermarks/computations"}[kind]
        return f"{self._base}/{folder}/{validate_name('injector' if kind == 'injector' else 'computation', name)}"

    def _session(self) -> int:
        """Which session of the client this is (the count of expired ones: kazoo hides the id while
        the connection is suspended)."""
        with self._lock:
            return self._expiries

    def _connected(self, what: str, pause: _Pause | None = None, *, session: int | None = None) -> None:
        """Return once the connection is CONNECTED, *pausing* meanwhile (see :class:`_Pause`).

        ``session``: the session a fenced write started in; a different one when the
        connection is back means it expired meanwhile (:class:`LeaseLostError`).
        """
        own = pause is None
        pause = pause or self._pause(what)
        while self._client.state != KazooState.CONNECTED:
            pause.wait(f"the ZooKeeper connection is {str(self._client.state).lower()}")
        if session is not None and self._session() != session:
            raise LeaseLostError(f"{what}: the ZooKeeper session expired while it was paused; acquire the "
                                 "leases again and publish with the new sequencer")
        if own:
            pause.resumed()

    def _resilient(self, what: str, call: Callable[[], Any], *, session: int | None = None) -> Any:
        """``call()`` after :meth:`_connected`; again when the connection drops during it (every call
        made this way re-reads before it writes, so a repeat is safe). One pause for all of it:
        logged once, bounded by ``max_pause_s``. ``session``: the call writes under lease
        sequencers granted in that session, so it must not go on in a new one."""
        pause = self._pause(what)
        while True:
            self._connected(what, pause, session=session)
            try:
                result = call()
            except LeaseSuspendedError as exc:
                pause.wait(str(exc))
                continue
            pause.resumed()
            return result

    def _pause(self, what: str) -> _Pause:
        def probe(what: str, paused_s: float, final: bool) -> None:
            check_refused(self._client, paused_s=paused_s, what=what, pipeline=self.pipeline, final=final)

        return _Pause(what, self.max_pause_s, probe=probe)

    def _get(self, path: str) -> tuple[bytes | None, ZnodeStat | None]:
        try:
            return self._client.get(path)  # type: ignore[no-any-return]
        except NoNodeError:
            return None, None

    def _read(self, path: str, what: str) -> Raw | None:
        def read() -> bytes | None:
            with _zk_errors(f"reading {what}"):
                return self._get(path)[0]

        data = self._resilient(f"reading {what}", read)
        return None if data is None else _decode(data, what)

    def _cas(self, path: str, what: str, update: Callable[[Raw | None], bytes | None]) -> None:
        """Read-modify-write ``path`` until no concurrent writer got in between (see :meth:`_cas_many`)."""
        self._cas_many(what, [(path, update, None)])

    def _cas_many(self, what: str, items: Sequence[tuple[str, Callable[[Raw | None], bytes | None], _Fence | None]],
                  *, session: int | None = None) -> None:
        """Read-modify-write several nodes in one transaction until no concurrent writer got in between.

        Per item (path, update, fence): ``update`` maps the stored payload (``None``: absent) to the
        new one (``None``: write nothing) and may raise; ``fence`` is None or (node, judge):
        ``judge(data, stat)`` of that node returns a (path, version) that must still hold when the
        write commits (or None) and may raise. All reads of a try are one pipelined round; every
        write of a try commits or none does. A connection lost meanwhile is waited for and the
        whole read-modify-write repeated (:meth:`_resilient`; ``session``: not in another one).
        """
        self._resilient(what, lambda: self._cas_loop(what, items), session=session)

    def _cas_loop(self, what: str, items: Sequence[tuple[str, Callable[[Raw | None], bytes | None], _Fence | None]]
                  ) -> None:
        with _zk_errors(what):
            while True:
                reads = [(self._client.get_async(path), None if fence is None else self._client.get_async(fence[0]))
                         for path, _, fence in items]
                tx = self._client.transaction()
                writes = 0
                for (path, update, fence), (res, fence_res) in zip(items, reads, strict=True):
                    data, stat = _got(res)
                    new = update(None if data is None else _decode(data, what))
                    check = None if fence is None else fence[1](*_got(fence_res))
                    if new is None:
                        continue
                    if check is not None:
                        tx.check(*check)
                    self._put(tx, path, new, stat)
                    writes += 1
                if not writes or not any(isinstance(r, Exception) for r in tx.commit()):
                    return
                log.debug("%s: concurrent update, retrying", what)

    def _put(self, tx: Any, path: str, data: bytes, stat: ZnodeStat | None) -> None:
        """Add to ``tx`` the write of ``data`` to ``path``: a create where the read found no node
        (its parent made now), else a set at the version read."""
        if stat is None:
            self._client.ensure_path(path.rsplit("/", 1)[0], acl=self._acls)
            tx.create(path, data, acl=self._acls)
        else:
            tx.set_data(path, data, stat.version)

    def _oldest_work_payload(self, what: str, old: Raw | None, oldest: int | None, sequencer: int) -> bytes:
        """The new oldest-work payload of an interval whose stored one is ``old``; a newer
        publisher's sequencer there raises :class:`StaleSequencerError`."""
        if old is not None and int(old["sequencer"]) > sequencer:
            raise _stale(what, sequencer, old["sequencer"], "the published oldest work")
        return _encode({"sequencer": sequencer, "oldest_work_ms": oldest, "published_ms": self._clock.now_ms()})

    def _low_payload(self, old: Raw | None, computed: int | None) -> tuple[int | None, bytes | None]:
        """(max(stored, computed), the new low-watermark payload; None when it does not move)."""
        before = None if old is None else old["low_watermark_ms"]
        low = _max(before, computed)
        if low == before:
            return low, None
        return low, _encode({"low_watermark_ms": low, "computed_ms": computed,
                             "revision": 0 if old is None else int(old["revision"]) + 1,
                             "published_ms": self._clock.now_ms()})

    # --- publishing ---------------------------------------------------------

    def publish_oldest_work(self, computation: str, interval: int, oldest_work_ms: int | None, *,
                            sequencer: int) -> None:
        """Publish the oldest pending work of one key interval (step 7 of the batch protocol).

        The value may go down (late data arrived); the published low watermark does not.
        When the interval's lease owner znode carries our sequencer, the write is
        conditional on it (a takeover racing this write makes it fail).

        Args:
            computation: computation name.
            interval: key interval (below the declared ``num_intervals`` once declared).
            oldest_work_ms: oldest unprocessed input / timer / production / hold; ``None`` = none.
            sequencer: the sequencer of this instance's lease grant on the interval.

        Raises:
            StaleSequencerError: a newer grant exists or has published (this writer is a zombie).
            ConfigError: bad name, or an interval outside the declared ones.
            CodecError: ``oldest_work_ms`` is not epoch milliseconds.
            LeaseSuspendedError: the connection is suspended; retry after the reconnect.
        """
        self.publish_oldest_works(computation, {interval: (oldest_work_ms, sequencer)})

    def publish_oldest_works(self, computation: str, works: Mapping[int, tuple[int | None, int]], *,
                             topology: Topology | None = None) -> None:
        """:meth:`publish_oldest_work` for several intervals of one computation at once:
        ``works`` maps interval -> (oldest work ms or None, sequencer of our grant). One round
        of reads (pipelined) and one ZooKeeper transaction: all are written or none (a
        concurrent update makes it read and try again). ``topology``: the computation's, as the
        caller just read it (:meth:`topology`; else it is read here for the range check).
        Raises as :meth:`publish_oldest_work`."""
        session = self._session()  # the sequencers are this session's grants: publish in no other
        ivs = sorted(works)
        if not ivs:
            return
        for iv in ivs:
            _check_ms("oldest_work_ms", works[iv][0], optional=True)
        owners = {iv: f"{interval_path(self.pipeline, computation, iv)}/owner" for iv in ivs}  # range check
        topo = topology if topology is not None else self.topology(computation)
        if topo is not None and ivs[-1] >= topo.num_intervals:
            raise ConfigError(f"{computation} is declared with {topo.num_intervals} intervals; "
                              f"interval {ivs[-1]} does not exist")
        base = self._path("computation", computation)
        items = []
        for iv in ivs:
            oldest, sequencer = works[iv]
            one = f"publishing oldest work of interval {iv} of {self.pipeline}/{computation}"

            update = functools.partial(self._oldest_work_payload, one, oldest=oldest, sequencer=sequencer)

            judge = functools.partial(_owner_fence, one, owners[iv], sequencer)
            items.append((f"{base}/{iv:05d}", update, (owners[iv], judge)))
        self._cas_many(f"publishing oldest work of interval{'s' if len(ivs) > 1 else ''} "
                       f"{', '.join(map(str, ivs))} of {self.pipeline}/{computation}", items, session=session)

    def publish_and_advance(self, computation: str, works: Mapping[int, tuple[int | None, int]], *,
                            injectors: Mapping[str, tuple[int, int]] | None = None) -> int | None:
        """:meth:`publish_oldest_works` then :meth:`advance_low_watermark`, in one pipelined round of
        reads and one ZooKeeper transaction (step 7 of the batch protocol; the two calls take five
        rounds and two transactions).

        ``injectors`` (name -> (watermark, sequencer)): publish these injector estimates in the same
        round and transaction, as :meth:`publish_injector` does each (never backwards; a stored
        newer sequencer raises :class:`StaleSequencerError` and nothing is written), and compute
        the low watermark with the values they leave stored (the batch's injector hook, whose
        own read-modify-write took two more round trips per injector before the step).

        The low watermark is computed as :meth:`advance_low_watermark` does, from the oldest work
        being written, the other intervals' and the injectors' as read in the same round. The
        intervals' oldest work and the low watermark are written at the versions they were read at,
        each lease owner node is checked at its version, and a new low watermark also checks the
        other intervals' and the injectors' nodes: else the whole step reads again. So no published
        value moves back, a takeover racing the write fails it as :meth:`publish_oldest_works` does,
        and a new low watermark is the minimum of values that all still hold when it lands. The computation's topology is read in the same round
        (the one read last time says what else to read; a changed one makes the round run again).

        Returns the published low watermark. Raises as the two calls (an undeclared computation
        gets its oldest work published, then :class:`ConfigError`, as they do).
        """
        session = self._session()  # the sequencers are this session's grants: publish in no other
        ivs = sorted(works)
        for iv in ivs:
            _check_ms("oldest_work_ms", works[iv][0], optional=True)
        pub = dict(injectors or {})
        for wm_ms, _ in pub.values():
            _check_ms("watermark_ms", wm_ms, optional=False)
        what = (f"publishing oldest work of interval{'s' if len(ivs) > 1 else ''} {', '.join(map(str, ivs))} "
                f"of {self.pipeline}/{computation} and advancing its low watermark")

        def step() -> tuple[bool, int | None]:
            while True:
                topo = self._topologies.get(computation)
                if topo is None:
                    topo = self.topology(computation)
                    if topo is None:
                        return False, None
                    self._topologies[computation] = topo
                done, low = self._publish_round(computation, works, topo, what, pub)
                if done:
                    return True, low

        got: tuple[bool, int | None] = self._resilient(what, step, session=session)
        declared, low = got
        if not declared:  # as the separate calls do: the last raises ConfigError
            for name, (wm_ms, seq) in sorted(pub.items()):
                self.publish_injector(name, wm_ms, sequencer=seq)
            self.publish_oldest_works(computation, works)
            return self.advance_low_watermark(computation)
        self._remember(computation, low)
        return low

    def _publish_round(self, computation: str, works: Mapping[int, tuple[int | None, int]], topo: Topology,
                       what: str, pub: Mapping[str, tuple[int, int]]) -> tuple[bool, int | None]:
        """One try of :meth:`publish_and_advance` with the topology read last time: (done, low
        watermark); not done when the topology changed or a concurrent writer got in between."""
        ivs = sorted(works)
        if ivs and ivs[-1] >= topo.num_intervals:
            raise ConfigError(f"{computation} is declared with {topo.num_intervals} intervals; "
                              f"interval {ivs[-1]} does not exist")
        upstream = [parse_upstream(u) for u in topo.upstream]
        memo: dict[str, int | None] = {}
        for kind, name in upstream:  # upstream computations (other stages): read as advance does
            if kind == "computation" and name not in memo:
                memo[name] = _max(self._compute(name, {}, (computation,)), self.published_low_watermark(name))
        base = self._path("computation", computation)
        owners = {iv: f"{interval_path(self.pipeline, computation, iv)}/owner" for iv in ivs}
        low_path = self._path("low", computation)
        with _zk_errors(what):
            get = self._client.get_async
            r_topo = get(self._path("topology", computation))
            names = sorted({n for k, n in upstream if k == "injector"} | set(pub))
            r_inj = {n: get(self._path("injector", n)) for n in names}
            r_ivs = [get(f"{base}/{i:05d}") for i in range(topo.num_intervals)]
            r_own = {iv: get(owners[iv]) for iv in ivs}
            r_low = get(low_path)
            topo_data, _ = _got(r_topo)
            inj = {n: _got(r) for n, r in r_inj.items()}
            olds = [_got(r) for r in r_ivs]
            own = {iv: _got(r) for iv, r in r_own.items()}
            low_data, low_stat = _got(r_low)
            if (None if topo_data is None else Topology.from_payload(topo_data)) != topo:
                self._topologies.pop(computation, None)  # redeclared (or removed): read it again
                return False, None
            tx = self._client.transaction()
            writes = 0
            stored: dict[str, int | None] = {}
            written: set[str] = set()
            for name in names:  # the injector estimates this step publishes, then what is stored
                data, stat = inj[name]
                old_inj = None if data is None else _decode(data, "injector watermark")
                if name in pub:
                    wm_ms, seq = pub[name]
                    value, new_inj = self._injector_payload(f"publishing the watermark of injector "
                                                            f"{self.pipeline}/{name}", old_inj, wm_ms, seq)
                    stored[name] = value
                    if new_inj is not None:
                        self._put(tx, self._path("injector", name), new_inj, stat)
                        written.add(name)
                        writes += 1
                else:
                    stored[name] = None if old_inj is None else int(old_inj["watermark_ms"])
            values: list[int | None] = [memo[name] if kind == "computation" else stored[name] for kind, name in upstream]
            # what the low watermark reads (a node this step writes is checked by its own write)
            inputs = [(self._path("injector", n), inj[n][1]) for n in names if n not in written]
            for i, (data, stat) in enumerate(olds):
                old = None if data is None else _decode(data, "oldest work")
                if i not in works:
                    values.append(None if old is None else END_OF_TIME if old["oldest_work_ms"] is None
                                  else int(old["oldest_work_ms"]))
                    inputs.append((f"{base}/{i:05d}", stat))
                    continue
                oldest, sequencer = works[i]
                one = f"publishing oldest work of interval {i} of {self.pipeline}/{computation}"
                new = self._oldest_work_payload(one, old, oldest, sequencer)
                check = _owner_fence(one, owners[i], sequencer, *own[i])
                if check is not None:
                    tx.check(*check)
                self._put(tx, f"{base}/{i:05d}", new, stat)
                writes += 1
                values.append(END_OF_TIME if oldest is None else oldest)
            low, new_low = self._low_payload(None if low_data is None else _decode(low_data, "low watermark"),
                                             _min(values))
            if new_low is not None:
                self._put(tx, low_path, new_low, low_stat)
                writes += 1
                for path, st in inputs:  # a new value is computed from inputs that still hold as it lands
                    if st is not None:
                        tx.check(path, st.version)
            if writes and any(isinstance(r, Exception) for r in tx.commit()):
                log.debug("%s: concurrent update, retrying", what)
                return False, None
            return True, low

    def publish_injector(self, injector: str, watermark_ms: int, *, sequencer: int = 0) -> int:
        """Publish a source's low watermark estimate; it never moves backwards.

        The value is whatever the source declares (see the module docstring):
        records it emits behind it later are late. Publish :data:`END_OF_TIME`
        when the source is finished.

        Returns:
            The stored watermark: ``watermark_ms``, or the larger one already stored.

        Raises:
            StaleSequencerError: the stored value was published with a newer sequencer.
            CodecError: ``watermark_ms`` is not epoch milliseconds.
            LeaseSuspendedError: the connection is suspended; retry after the reconnect.
        """
        _check_ms("watermark_ms", watermark_ms, optional=False)
        what = f"publishing the watermark of injector {self.pipeline}/{injector}"
        stored: list[int] = []

        def update(old: Raw | None) -> bytes | None:
            value, new = self._injector_payload(what, old, watermark_ms, sequencer)
            stored[:] = [value]
            return new

        self._cas(self._path("injector", injector), what, update)
        return stored[0]

    def _injector_payload(self, what: str, old: Raw | None, watermark_ms: int, sequencer: int) -> tuple[int, bytes | None]:
        """(the value stored after publishing ``watermark_ms`` over ``old``, the new payload or None
        when nothing changes): never backwards; a newer stored sequencer raises StaleSequencerError."""
        before = None if old is None else int(old["watermark_ms"])
        if old is not None and int(old["sequencer"]) > sequencer:
            raise StaleSequencerError(f"{what}: stored sequencer {old['sequencer']} is newer than ours "
                                      f"({sequencer}); another instance runs this source, stop this one")
        value = max(watermark_ms, before if before is not None else watermark_ms)
        if old is not None and before == value and int(old["sequencer"]) == sequencer:
            return value, None  # never backwards, nothing new
        return value, _encode({"sequencer": sequencer, "watermark_ms": value, "published_ms": self._clock.now_ms()})

    def publish_instance_injector(self, injector: str, instance: str, watermark_ms: int, *,
                                  sequencer: int = 0,
                                  held: Mapping[str, Mapping[int, int]] | None = None) -> int | None:
        """Publish one job instance's estimate of a source; the injector's watermark becomes the
        minimum over the live instances' estimates (never moving back).

        ``instance``'s own estimate is monotonic too (its query resumes from its checkpoint: what
        it read stays read). The instances that count are the live members of the pipeline
        (``members.py``, :func:`.live_members`: a graceful leave or a lost session ends one),
        ``instance`` itself (an instance given its intervals by hand is no member), and an
        instance that is no longer live while an interval it held (``held``: computation ->
        interval -> lease sequencer, as of its last publish or :meth:`record_held`) has not been
        caught up by a later owner (:meth:`record_caught_up`): until then its unread records of
        that interval are still to come, at its reading position. A counting
        instance with no estimate yet holds the injector's watermark where it is: a new member
        may still have to read records of its intervals behind it (the stall lasts until its
        first batch is consumed). :data:`END_OF_TIME` (an instance that drained its input) counts
        as its value.

        Returns:
            The injector's stored watermark after this call (``None``: still unknown).

        Raises:
            StaleSequencerError, CodecError, LeaseSuspendedError: as :meth:`publish_injector`.
            ConfigError: a bad instance name.
        """
        from ..members import live_members

        _check_ms("watermark_ms", watermark_ms, optional=False)
        validate_name("instance", instance)
        what = f"publishing instance {instance}'s watermark of injector {self.pipeline}/{injector}"

        update = self._instance_update(what, instance, watermark_ms, sequencer=sequencer, held=held)
        base = f"{self._base}/watermarks/instances/{validate_name('injector', injector)}"
        self._cas(f"{base}/{instance}", what, update)

        def estimates() -> dict[str, int | None]:
            with _zk_errors(what):
                live = set(live_members(self._client, self.pipeline)) | {instance}
                names = set(self._children(base)) | live
                pending = {n: self._client.get_async(f"{base}/{n}") for n in sorted(names)}
                stored = {n: None if (data := _got(res)[0]) is None else _decode(data, what)
                          for n, res in pending.items()}
                left = {n: raw.get("held") or {} for n, raw in stored.items() if n not in live and raw is not None}
                caught = self._caught_up({c for held in left.values() for c in held})
                return {n: None if raw is None or raw.get("watermark_ms") is None else int(raw["watermark_ms"])
                        for n, raw in stored.items() if n in live or _handing_off(left[n], caught)}

        low = _min(list(self._resilient(what, estimates).values()))
        if low is None:  # a live instance has no estimate yet: hold
            return self.injector_watermark(injector)
        return self.publish_injector(injector, low, sequencer=sequencer)

    def record_held(self, injector: str, instance: str, held: Mapping[str, Mapping[int, int]], *,
                    sequencer: int = 0) -> None:
        """Record the intervals ``instance`` holds now (computation -> interval -> lease sequencer)
        beside its estimate of ``injector``, without publishing one: an instance that took
        intervals and is lost before its first publish still holds the watermark back for them
        (:meth:`publish_instance_injector`)."""
        validate_name("instance", instance)
        what = f"recording the intervals instance {instance} holds, for injector {self.pipeline}/{injector}"
        base = f"{self._base}/watermarks/instances/{validate_name('injector', injector)}"
        self._cas(f"{base}/{instance}", what, self._instance_update(what, instance, None, sequencer=sequencer,
                                                                   held=held))

    def _instance_update(self, what: str, instance: str, watermark_ms: int | None, *, sequencer: int,
                         held: Mapping[str, Mapping[int, int]] | None) -> Callable[[Raw | None], bytes | None]:
        """The compare-and-set update of an instance's znode: its estimate (monotonic; ``None``
        keeps it) and the intervals it holds per computation (``None`` keeps them)."""
        def update(old: Raw | None) -> bytes | None:
            if old is not None and int(old["sequencer"]) > sequencer:
                raise StaleSequencerError(f"{what}: stored sequencer {old['sequencer']} is newer than ours "
                                          f"({sequencer}); another run of instance {instance} reads this source, "
                                          "stop this one")
            before = None if old is None else old.get("watermark_ms")
            value = _max(None if before is None else int(before), watermark_ms)
            now_held = dict(old.get("held") or {}) if old is not None else {}
            if held is not None:
                now_held.update({c: {str(i): int(s) for i, s in ivs.items()} for c, ivs in held.items()})
            if old is not None and (value, sequencer, now_held) == (before, int(old["sequencer"]),
                                                                    old.get("held") or {}):
                return None  # never backwards, nothing new
            return _encode({"sequencer": sequencer, "watermark_ms": value, "published_ms": self._clock.now_ms(),
                            "held": now_held})
        return update

    def record_caught_up(self, computation: str, sequencers: Mapping[int, int]) -> None:
        """Record that the owner of these intervals (interval -> its lease sequencer) caught up on
        their input after taking them (``rescale.py``): an instance that held one of them before
        and is gone stops holding the injectors' watermarks back for it
        (:meth:`publish_instance_injector`). Never moves back to an older sequencer."""
        what = f"recording the catch-up of {self.pipeline}/{computation}"
        base = f"{self._base}/watermarks/caught_up/{validate_name('computation', computation)}"
        for interval, seq in sorted(sequencers.items()):
            def update(old: Raw | None, seq: int = int(seq)) -> bytes | None:
                if old is not None and int(old["sequencer"]) >= seq:
                    return None
                return _encode({"sequencer": seq, "published_ms": self._clock.now_ms()})

            self._cas(f"{base}/{interval:05d}", what, update)

    def _caught_up(self, computations: Iterable[str]) -> dict[str, dict[int, int]]:
        """computation -> interval -> the sequencer of its last owner that caught up (ZooKeeper
        calls; the caller handles errors and retries)."""
        out: dict[str, dict[int, int]] = {}
        for comp in sorted(computations):
            base = f"{self._base}/watermarks/caught_up/{comp}"
            pending = {int(i): self._client.get_async(f"{base}/{i}") for i in self._children(base)}
            out[comp] = {i: int(_decode(data, base)["sequencer"]) for i, res in pending.items()
                         if (data := _got(res)[0]) is not None}
        return out

    def declare(self, computation: str, *, upstream: Sequence[str], num_intervals: int,
                replace: bool = False) -> Topology:
        """Record a computation's inputs and key-interval count (idempotent).

        Args:
            computation: computation name.
            upstream: inputs, each ``'computation:NAME'`` or ``'injector:NAME'``.
            num_intervals: how many key intervals (0..num_intervals-1) it has.
            replace: overwrite a different earlier declaration (re-sharding, new inputs).

        Raises:
            ConfigError: bad names or count, a self-loop, or a different declaration
                exists and ``replace`` is false.
        """
        path = self._path("topology", computation)
        if not 1 <= num_intervals <= MAX_INTERVAL + 1:
            raise ConfigError(f"num_intervals of {computation} must be 1..{MAX_INTERVAL + 1}, got {num_intervals}")
        ups = tuple(dict.fromkeys(":".join(parse_upstream(u)) for u in upstream))
        if f"computation:{computation}" in ups:
            raise ConfigError(f"{computation} cannot be its own upstream")
        topo = Topology(ups, num_intervals)

        def update(old: Raw | None) -> bytes | None:
            have = None if old is None else Topology.from_payload(_encode(old))
            if have == topo:
                return None
            if have is not None and not replace:
                raise ConfigError(f"{computation} is already declared with upstream {list(have.upstream)} "
                                  f"and {have.num_intervals} intervals; pass replace=True to change it")
            return topo.to_payload()

        self._cas(path, f"declaring {self.pipeline}/{computation}", update)
        return topo

    # --- reading ------------------------------------------------------------

    def topology(self, computation: str) -> Topology | None:
        """The declared topology of ``computation``, or ``None`` when it is not declared."""
        raw = self._read(self._path("topology", computation), "topology")
        return None if raw is None else Topology.from_payload(_encode(raw))

    def injector_watermark(self, injector: str) -> int | None:
        """The stored watermark of ``injector``; ``None`` when it never published."""
        raw = self._read(self._path("injector", injector), "injector watermark")
        return None if raw is None else int(raw["watermark_ms"])

    def published_low_watermark(self, computation: str) -> int | None:
        """The stored (monotonic) low watermark; ``None`` when never advanced."""
        raw = self._read(self._path("low", computation), "low watermark")
        value = None if raw is None else raw["low_watermark_ms"]
        self._remember(computation, value)
        return value

    def oldest_work(self, computation: str, num_intervals: int) -> dict[int, Raw | None]:
        """Published oldest-work payloads of intervals 0..num_intervals-1 (``None``: never published)."""
        return self._inputs_of(computation, (), num_intervals, what=f"reading oldest work of {computation}")[1]

    def low_watermark(self, computation: str, *, topology: Topology | None = None) -> int | None:
        """The low watermark as MillWheel computes it; may be below the published one.

        Each upstream computation counts with max(its computed, its published)
        value: downstream may already have acted on the published one. ``topology``: the
        computation's, as the caller just read it (else read here).

        Returns:
            Epoch ms; ``None`` when not known yet; :data:`END_OF_TIME` when all is done.

        Raises:
            ConfigError: ``computation`` is not declared, or the topology has a cycle.
            LeaseSuspendedError: the connection is suspended (see :meth:`last_known`).
        """
        topo = topology if topology is not None else self.topology(computation)
        if topo is None:
            raise ConfigError(f"{self.pipeline}/{computation} is not declared; declare() it with its "
                              "upstream and num_intervals first")
        return self._compute(computation, {}, (), topo=topo)

    def _compute(self, computation: str, memo: dict[str, int | None], path: tuple[str, ...], *,
                 topo: Topology | None = None) -> int | None:
        if computation in path:
            cycle = " -> ".join((*path[path.index(computation):], computation))
            raise ConfigError(f"the topology of {self.pipeline} has a cycle ({cycle}); low watermarks "
                              "need an acyclic pipeline")
        if topo is None:  # (the caller's read of it, for the computation asked about)
            topo = self.topology(computation)
        if topo is None:
            return None  # declared later (or a typo: snapshot() shows it undeclared)
        values: list[int | None] = []
        upstream = [parse_upstream(u) for u in topo.upstream]
        # the injectors' watermarks and the intervals' oldest work: one pipelined round
        injected, oldest = self._inputs_of(computation, [n for k, n in upstream if k == "injector"],
                                           topo.num_intervals)
        for kind, name in upstream:
            if kind == "injector":
                values.append(injected[name])
                continue
            if name not in memo:
                computed = self._compute(name, memo, (*path, computation))
                memo[name] = _max(computed, self.published_low_watermark(name))
            values.append(memo[name])
        for raw in oldest.values():
            values.append(None if raw is None else
                          END_OF_TIME if raw["oldest_work_ms"] is None else int(raw["oldest_work_ms"]))
        return _min(values)

    def _inputs_of(self, computation: str, injectors: Sequence[str], num_intervals: int, *,
                   what: str | None = None) -> tuple[dict[str, int | None], dict[int, Raw | None]]:
        """(the stored watermark of each of ``injectors``, as :meth:`injector_watermark`; the
        oldest work of intervals 0..num_intervals-1, as :meth:`oldest_work`), read in one round."""
        base = self._path("computation", computation)
        what = what or f"reading the inputs of {computation}'s low watermark"

        def read() -> tuple[dict[str, int | None], dict[int, Raw | None]]:
            with _zk_errors(what):
                inj = {n: self._client.get_async(self._path("injector", n)) for n in injectors}
                ivs = [self._client.get_async(f"{base}/{i:05d}") for i in range(num_intervals)]
                marks: dict[str, int | None] = {}
                for n, res in inj.items():
                    try:
                        marks[n] = int(_decode(res.get()[0], "injector watermark")["watermark_ms"])
                    except NoNodeError:
                        marks[n] = None
                out: dict[int, Raw | None] = {}
                for i, res in enumerate(ivs):
                    try:
                        out[i] = _decode(res.get()[0], "oldest work")
                    except NoNodeError:
                        out[i] = None
                return marks, out

        return self._resilient(what, read)  # type: ignore[no-any-return]

    def advance_low_watermark(self, computation: str, *, topology: Topology | None = None) -> int | None:
        """Compute the low watermark, publish max(computed, published) and return it.
        ``topology``: the computation's, as the caller just read it (else read here).

        Late data: records behind the published watermark pull oldest work (and
        the computed value) below it; the published value stays, and those
        records are late by definition (the executor counts or routes them).

        Raises:
            ConfigError: as :meth:`low_watermark`.
            LeaseSuspendedError: the connection is suspended; retry after the reconnect.
        """
        computed = self.low_watermark(computation, topology=topology)
        result: list[int | None] = [None]

        def update(old: Raw | None) -> bytes | None:
            result[0], new = self._low_payload(old, computed)
            return new

        self._cas(self._path("low", computation), f"advancing the low watermark of {computation}", update)
        self._remember(computation, result[0])
        return result[0]

    def watermark_lag_ms(self, computation: str) -> int | None:
        """now - max(computed, published low watermark), at least 0; ``None`` while not known."""
        low = _max(self.low_watermark(computation), self.published_low_watermark(computation))
        return None if low is None else max(0, self._clock.now_ms() - low)

    def snapshot(self) -> dict[str, Any]:
        """Every watermark of the pipeline, for the CLI and for inspection.

        Returns:
            ``{"pipeline", "injectors": {name: {watermark_ms, sequencer, published_ms}},
            "computations": {name: {declared, upstream, num_intervals, intervals: {I:
            {oldest_work_ms, sequencer, published_ms} or None}, low_watermark_ms,
            published_low_watermark_ms}}}``. Computations that published oldest work
            without being declared appear with ``declared`` false.
        """
        self._connected("reading the watermarks")
        with _zk_errors("reading the watermarks"):
            injectors = self._children(f"{self._base}/watermarks/injectors")
            names = sorted(set(self._children(f"{self._base}/topology"))
                           | set(self._children(f"{self._base}/watermarks/computations")))
            published = {n: [int(i) for i in self._children(f"{self._base}/watermarks/computations/{n}")]
                         for n in names}
        out: dict[str, Any] = {"pipeline": self.pipeline, "injectors": {}, "computations": {}}
        for name in injectors:
            raw = self._read(self._path("injector", name), "injector watermark")
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
                "low_watermark_ms": self._compute(name, {}, ()) if topo else None,
                "published_low_watermark_ms": self.published_low_watermark(name),
            }
        return out

    def _children(self, path: str) -> list[str]:
        try:
            return sorted(self._client.get_children(path))
        except NoNodeError:
            return []

    # --- cache and watches --------------------------------------------------

    def _remember(self, computation: str, value: int | None) -> None:
        with self._lock:
            self._seen[computation] = (value, self._clock.now_ms())

    def last_known(self, computation: str) -> LastKnown:
        """The last published low watermark this instance read, wrote or was told of; no ZooKeeper call."""
        with self._lock:
            value, seen = self._seen.get(computation, (None, None))
        return LastKnown(value, seen, stale=self._client.state != KazooState.CONNECTED)

    def watch_low_watermark(self, computation: str, callback: Callable[[int | None], None]) -> None:
        """Call ``callback(value)`` now and whenever the published low watermark changes.

        The callback runs on kazoo's event thread: it must not block or call
        ZooKeeper synchronously. kazoo re-registers the watch after a reconnect.
        """
        path = self._path("low", computation)

        def on_change(data: bytes | None, _stat: object) -> None:
            try:
                value = None if data is None else _decode(data, "low watermark")["low_watermark_ms"]
            except CodecError:
                log.exception("ignoring a damaged low watermark at %s", path)
                return
            self._remember(computation, value)
            try:
                callback(value)
            except Exception:  # a failing callback must not end the watch
                log.exception("low watermark callback for %s failed", computation)

        self._client.DataWatch(path, on_change)
