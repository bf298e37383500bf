"""A paused client whose ZooKeeper lost its data: found, named, and never waited for forever.

ZooKeeper SUSPENDED / LOST: this acts only while a client is SUSPENDED. A server that lost its data
refuses a session that has seen a newer zxid and kazoo just stays SUSPENDED; :func:`check_refused`
then probes with a new session and compares the ensemble's last zxid with the client's."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from dataclasses import dataclass

from kazoo.client import KazooClient, KazooState

from ..exceptions import CoordinatorStateLostError

__all__ = ["DEFAULT_MAX_PAUSE_S", "PROBE_MARGIN_S", "PROBE_EVERY_S", "check_refused", "hosts_of",
           "session_timeout_s"]

log = logging.getLogger(__name__)
_PROBE_LOG = logging.getLogger(f"{__name__}.probe")
_PROBE_LOG.setLevel(logging.ERROR)

DEFAULT_MAX_PAUSE_S = 300.0  #: how long a batch pauses while ZooKeeper does not serve, then the run stops
PROBE_MARGIN_S = 5.0  #: plus the session timeout: how long a paused client waits before it probes
PROBE_EVERY_S = 5.0  #: seconds between two probes of one client's ensemble
_PROBE_CONNECT_S = 5.0


@dataclass
class _Probing:
    """What is known about one client's ensemble while it is paused."""

    next_at: float = 0.0
    lost: str | None = None  # why its data is known lost


_STATE: weakref.WeakKeyDictionary[KazooClient, _Probing] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def hosts_of(client: KazooClient) -> str:
    """The client's servers as a connection string, without its chroot.

    >>> hosts_of(KazooClient(hosts="127.0.0.1:2181,[::1]:2182/dw"))
    '127.0.0.1:2181,[::1]:2182'
    """
    return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in client.hosts)


def session_timeout_s(client: KazooClient) -> float:
    """The session timeout ``client`` asked for, in seconds (kazoo keeps it in ms)."""
    return float(getattr(client, "_session_timeout", 10_000)) / 1000.0


def _ensemble_zxid(hosts: str) -> int | None:
    """The ensemble's last zxid as a new session sees it after a sync; None: no server serves."""
    probe = KazooClient(hosts=hosts, timeout=10.0, connection_retry={"max_tries": 0}, logger=_PROBE_LOG)
    try:
        probe.start(timeout=_PROBE_CONNECT_S)
    except Exception:
        return None
    try:
        probe.sync("/")
        probe.exists("/")
        return int(probe.last_zxid)
    except Exception:
        return None
    finally:
        probe.stop()
        probe.close()


def check_refused(client: KazooClient, *, paused_s: float, what: str, pipeline: str, final: bool = False) -> None:
    """Raise when the ensemble of a paused ``client`` lost its data: probes once paused past the
    session timeout plus :data:`PROBE_MARGIN_S` (or ``final``), at most every :data:`PROBE_EVERY_S`.
    Raises CoordinatorStateLostError: the ensemble is behind the last transaction this client saw."""
    with _LOCK:
        state = _STATE.setdefault(client, _Probing())
        if client.state == KazooState.CONNECTED:
            state.lost = None
            return
        lost = state.lost
        now = time.monotonic()
        due = now >= state.next_at and (final or paused_s >= session_timeout_s(client) + PROBE_MARGIN_S)
        if lost is None and due:
            state.next_at = now + PROBE_EVERY_S
    if lost is None and due:
        seen = int(client.last_zxid or 0)
        hosts = hosts_of(client)
        theirs = _ensemble_zxid(hosts)
        log.warning("%s: paused %.0f s; ZooKeeper at %s %s", what, paused_s, hosts,
                    "does not serve a new session either (unreachable, or without quorum)" if theirs is None else
                    f"serves a new session at zxid 0x{theirs:x}; this client has seen 0x{seen:x}")
        if theirs is not None and theirs < seen:
            lost = (f"ZooKeeper at {hosts} lost its data: it serves new sessions but refuses this client's, "
                    f"which has seen transaction zxid 0x{seen:x} while the ensemble's last is 0x{theirs:x} (its "
                    "data folder was wiped, or restored from an older copy)")
            with _LOCK:
                state.lost = lost
    if lost is not None:
        raise CoordinatorStateLostError(
            f"{what}: {lost}. Nothing was committed or published since the pause began. Stop every running "
            f"copy of pipeline {pipeline!r}, then run `deltawheel reseed --store <its store> --pipeline {pipeline} "
            "--apply` (docs/coordinator-recovery.md, 'Lost ZooKeeper data') and start the pipeline again")
