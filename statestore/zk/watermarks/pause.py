"""How a call waits for ZooKeeper: *paused* while SUSPENDED, up to ``max_pause_s`` (then
:class:`LeaseSuspendedError`), repeated from its reads after a drop; a write under lease
sequencers whose session was LOST raises :class:`LeaseLostError`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState

from ...exceptions import LeaseSuspendedError, SessionLostError
from ..client import zk_errors
from ..refusal import check_refused

__all__ = ["Connection", "Pause", "zk_call"]

log = logging.getLogger(__name__)


def zk_call(what: str) -> Any:
    """Translate kazoo's session errors of a watermark call (:func:`.client.zk_errors`)."""
    return zk_errors(what, expired="acquire the leases again and publish with the new sequencer",
                     lost="the ZooKeeper connection was lost; retry once it reconnects")


class Pause:
    """One call's wait for ZooKeeper to serve again, logged to ``logger`` while it lasts.

    Raises :class:`LeaseSuspendedError` after ``bound`` seconds (None: no bound); probes ``client``'s
    ensemble for lost data meanwhile (:func:`.refusal.check_refused`). ``nothing``: what waits."""

    def __init__(self, what: str, bound: float | None, *, client: KazooClient, pipeline: str,
                 log_every_s: float = 30.0, nothing: str = "written", logger: logging.Logger = log) -> None:
        self.what = what
        self.bound = bound
        self.client = client
        self.pipeline = pipeline
        self.log_every_s = log_every_s
        self.nothing = nothing
        self.log = logger
        self.started: float | None = None
        self._next_log = 0.0

    def note(self, why: str) -> float:
        """Note that ZooKeeper does not serve (``why``); raise past the bound. Returns the seconds paused."""
        now = time.monotonic()
        if self.started is None:
            self.started, self._next_log = now, now + self.log_every_s
            self.log.warning("%s paused: %s (no ZooKeeper server answers, or the ensemble lost its quorum); "
                             "waiting for it to serve again, nothing is %s meanwhile", self.what, why, self.nothing)
        elif now >= self._next_log:
            self._next_log = now + self.log_every_s
            self.log.warning("%s still paused after %.0f s: ZooKeeper does not serve", self.what, now - self.started)
        paused = now - self.started
        final = self.bound is not None and paused >= self.bound
        check_refused(self.client, paused_s=paused, what=self.what, pipeline=self.pipeline, final=final)
        if final:
            raise LeaseSuspendedError(
                f"{self.what} paused for {paused:.0f} s and ZooKeeper still does not serve ({why}): no server "
                f"answers (unreachable, or down) or the ensemble lost its quorum; nothing was {self.nothing}. "
                "Bring ZooKeeper back (a majority of the ensemble's servers) and run again")
        return paused

    def wait(self, why: str) -> None:
        """:meth:`note`, then sleep a moment."""
        self.note(why)
        time.sleep(0.05)

    def resumed(self, how: str = "") -> float:
        """Log the end of the pause, if there was one; the seconds it lasted (0.0: none)."""
        if self.started is None:
            return 0.0
        paused = time.monotonic() - self.started
        self.log.warning("%s resumes: ZooKeeper serves again%s after a pause of %.1f s", self.what, how, paused)
        return paused


class Connection:
    """The client's connection as the authority's calls see it; runs calls once it serves."""

    def __init__(self, client: KazooClient, *, pipeline: str, max_pause_s: float | None) -> None:
        self.client = client
        self.pipeline = pipeline
        self.max_pause_s = max_pause_s
        self._lock = threading.Lock()
        self._expiries = 0  # sessions reported LOST so far

    def listen(self) -> None:
        """Start counting expired sessions."""
        self.client.add_listener(self._on_state)

    def close(self) -> None:
        """Stop listening to the client's connection states (the client stays open)."""
        self.client.remove_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            with self._lock:
                self._expiries += 1

    def session(self) -> int:
        """Which session of the client this is (the count of expired ones)."""
        with self._lock:
            return self._expiries

    def connected(self, what: str, pause: Pause | None = None, *, session: int | None = None) -> None:
        """Return once CONNECTED, *pausing* meanwhile; ``session``: a fenced write's (another raises)."""
        own = pause is None
        pause = pause or self.pause(what)
        while self.client.state != KazooState.CONNECTED:
            pause.wait(f"the ZooKeeper connection is {str(self.client.state).lower()}")
        if session is not None and self.session() != session:
            raise SessionLostError(f"{what}: the ZooKeeper session expired while it was paused; acquire the "
                                   "leases again and publish with the new sequencer")
        if own:
            pause.resumed()

    def resilient(self, what: str, call: Callable[[], Any], *, session: int | None = None) -> Any:
        """``call()`` after :meth:`connected`; again when the connection drops during it."""
        pause = self.pause(what)
        while True:
            self.connected(what, pause, session=session)
            try:
                result = call()
            except LeaseSuspendedError as exc:
                pause.wait(str(exc))
                continue
            pause.resumed()
            return result

    def pause(self, what: str) -> Pause:
        """A new pause for ``what``, bounded by ``max_pause_s``."""
        return Pause(what, self.max_pause_s, client=self.client, pipeline=self.pipeline)
