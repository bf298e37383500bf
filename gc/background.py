"""Garbage collection from a running pipeline: ``deltawheel gc --apply``'s Delta passes every N
batches or minutes, in a background thread of the driver.

The pipeline does not wait for it: :meth:`BackgroundGc.batch_done` (called by the runner after each
round of batches) only counts and, when a run is due and none is running, starts one in a daemon
thread; its Spark jobs run beside the batches (they share the machine, not a lock). Only the passes
that are safe under a running job run: stream and metrics retention (blind deletes; executors only
append to those tables), OPTIMIZE (a fenced commit that conflicts is retried by the store; an
OPTIMIZE that loses to a batch fails and is tried again at the next run), the path pass, VACUUM
with at least Delta's 168 h safety minimum (never ``force``: a shorter one could delete files a
batch still reads), and the log checkpoint (log cleanup only past a retention given). A run that
fails is recorded (:attr:`BackgroundGc.failures`) and logged; the pipeline goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout

from .passes import MIN_VACUUM_RETAIN_HOURS, GcReport, check_replay_horizon, run_gc

__all__ = ["BackgroundGc"]

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Options:
    stream_retention_ms: int | None
    metrics_retention_ms: int | None
    vacuum_retain_hours: float
    log_retention_ms: int | None


class BackgroundGc:
    """gc's passes every ``every_batches`` rounds of batches and/or ``every_s`` seconds (the first
    that comes), in the background (see the module docstring).

    Raises:
        ConfigError: neither ``every_batches`` nor ``every_s``, one of them <= 0, or a VACUUM
            retention below Delta's safety minimum.
        ReplayHorizonError: a retention shorter than ``keep_replay_ms``.
    """

    def __init__(self, spark: Any, layout: StoreLayout, *, every_batches: int | None = None,
                 every_s: float | None = None, stream_retention_ms: int | None = None,
                 metrics_retention_ms: int | None = 720 * 3_600_000,
                 vacuum_retain_hours: float = MIN_VACUUM_RETAIN_HOURS, log_retention_ms: int | None = None,
                 keep_replay_ms: int | None = None) -> None:
        if every_batches is None and every_s is None:
            raise ConfigError("background gc needs every_batches or every_s (how often it runs)")
        if (every_batches is not None and every_batches <= 0) or (every_s is not None and not every_s > 0):
            raise ConfigError(f"background gc runs every N > 0 batches or S > 0 seconds, got every_batches="
                              f"{every_batches}, every_s={every_s}")
        if vacuum_retain_hours < MIN_VACUUM_RETAIN_HOURS:
            raise ConfigError(f"a running pipeline's gc keeps VACUUM's safety minimum of {MIN_VACUUM_RETAIN_HOURS:g} h "
                              f"(got {vacuum_retain_hours:g} h): a shorter retention could delete files a batch still "
                              "reads; run `deltawheel gc --apply --force` on the stopped store instead")
        check_replay_horizon(vacuum_retain_hours=vacuum_retain_hours, stream_retention_ms=stream_retention_ms,
                             log_retention_ms=log_retention_ms, keep_replay_ms=keep_replay_ms)
        self.spark, self.layout = spark, layout
        self.every_batches, self.every_s = every_batches, every_s
        self._options = _Options(stream_retention_ms, metrics_retention_ms, vacuum_retain_hours, log_retention_ms)
        self.keep_replay_ms = keep_replay_ms
        self.reports: list[GcReport] = []  # the runs that finished, newest last (the last 100)
        self.failures: list[str] = []  # the runs that failed (the last 100)
        self._batches = 0
        self._last = time.monotonic()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        """Whether a run is in progress."""
        return self._thread is not None and self._thread.is_alive()

    def batch_done(self, n: int = 1) -> bool:
        """``n`` more batches (rounds) ran: start a run when one is due and none runs (returns at
        once; True: one was started)."""
        with self._lock:
            self._batches += n
            due = ((self.every_batches is not None and self._batches >= self.every_batches)
                   or (self.every_s is not None and time.monotonic() - self._last >= self.every_s))
            if not due or self.running:
                return False
            self._batches, self._last = 0, time.monotonic()
            self._thread = threading.Thread(target=self._run, name="deltawheel-background-gc", daemon=True)
            self._thread.start()
            return True

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the run in progress (if any) to end; False if ``timeout_s`` passed first."""
        t = self._thread
        if t is not None:
            t.join(timeout_s)
            return not t.is_alive()
        return True

    def _run(self) -> None:
        o = self._options
        try:
            report = run_gc(self.spark, self.layout, now_ms=int(time.time() * 1000), apply=True,
                            stream_retention_ms=o.stream_retention_ms, metrics_retention_ms=o.metrics_retention_ms,
                            vacuum_retain_hours=o.vacuum_retain_hours, log_retention_ms=o.log_retention_ms,
                            keep_replay_ms=self.keep_replay_ms)
            self.reports = [*self.reports[-99:], report]
        except Exception as exc:  # a failed run must not stop the pipeline: the next one tries again
            self.failures = [*self.failures[-99:], f"{type(exc).__name__}: {exc}"]
            _LOG.warning("deltawheel: background gc of %s failed (%s: %s); the pipeline goes on, the next run "
                         "tries again", self.layout.root, type(exc).__name__, str(exc).splitlines()[0][:300])
