"""Garbage collection in a background thread of a running pipeline: only the passes safe beside it."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from deltawheel.statestore.delta.jvm import activate
from deltawheel.statestore.exceptions import ConfigError
from deltawheel.statestore.layout import StoreLayout

from .passes import MIN_VACUUM_RETAIN_HOURS, GcAction, GcReport, check_replay_horizon, run_gc
from .ranlog import checked_upto, save_checked, table_of

__all__ = ["BackgroundGc", "parse_every", "summary", "audit_recovery", "audit_gaps", "AUDIT_GRACE_MS"]

#: a tool's rows commit younger than this gets no recovered audit row (the tool may still append it)
AUDIT_GRACE_MS = 10 * 60_000

_LOG = logging.getLogger(__name__)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)\s*$")
_UNIT_S = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_every(every: str | int) -> tuple[int | None, float | None]:
    """(every_batches, every_s) of a ``--gc-every`` value: a number of batches, or a duration.

    >>> parse_every("50"), parse_every(3), parse_every("10m"), parse_every("30s"), parse_every("1.5h")
    ((50, None), (3, None), (None, 600.0), (None, 30.0), (None, 5400.0))

    Raises:
        ConfigError: anything else (zero, negative, another unit); nothing started.
    """
    text = every if isinstance(every, str) else repr(every)
    if text.strip().isdigit() and int(text) > 0:
        return int(text), None
    m = _DURATION.match(text)
    if m and float(m.group(1)) > 0:
        return None, float(m.group(1)) * _UNIT_S[m.group(2)]
    raise ConfigError(f"--gc-every / gc_every takes a number of batches > 0 (e.g. 50) or a duration > 0 with its unit "
                      f"(30s, 10m, 1h), got {text!r}; nothing was started")


def summary(report: GcReport) -> str:
    """What a gc run did, in one line (the runners' progress line when a background run ends).

    >>> from deltawheel.gc.passes import GcAction
    >>> summary(GcReport(True, (GcAction("compact", "rows", "12 files before OPTIMIZE", 12),
    ...                        GcAction("log", "rows", "checkpointed at version 9; deleted 4 log files before "
    ...                                 "version 9", 4), GcAction("log", "late_data", "checkpoint is current", 0))))
    'compacted 1 tables (12 files before), vacuumed 0 tables, checkpointed 1 logs (rows at 9), deleted 4 log files'
    """
    by: dict[str, list[Any]] = {}
    for a in report.actions:
        by.setdefault(a.pass_name, []).append(a)
    compact = by.get("compact", [])
    logs = [a for a in by.get("log", []) if a.detail.startswith("checkpointed at version ")]
    at = ", ".join(f"{a.table} at {a.detail.split()[3].rstrip(';')}" for a in logs)
    parts = [f"compacted {len(compact)} tables ({sum(a.count or 0 for a in compact)} files before)",
             f"vacuumed {len(by.get('vacuum', []))} tables",
             f"checkpointed {len(logs)} logs" + (f" ({at})" if at else ""),
             f"deleted {sum(a.count or 0 for a in by.get('log', []))} log files"]
    for name, what in (("stream_retention", "stream records"), ("metrics_retention", "metrics rows"),
                       ("late_data_retention", "late records"), ("dead_letter_retention", "dead letters"),
                       ("audit_recovery", "missing audit rows recovered")):
        if name in by:
            verb = "" if name == "audit_recovery" else "deleted "
            parts.append(f"{verb}{sum(a.count or 0 for a in by[name])} {what}")
    return ", ".join(parts)


class BackgroundGc:
    """gc's passes every ``every_batches`` batches and/or ``every_s`` seconds, in the background.

    Raises:
        ConfigError: no period, a period <= 0, or a VACUUM retention below Delta's minimum.
        ReplayHorizonError: a retention shorter than ``keep_replay_ms``.
    """

    def __init__(self, spark: Any, layout: StoreLayout, *, every_batches: int | None = None,
                 every_s: float | None = None, stream_retention_ms: int | None = None,
                 metrics_retention_ms: int | None = 720 * 3_600_000,
                 vacuum_retain_hours: float = MIN_VACUUM_RETAIN_HOURS, log_retention_ms: int | None = None,
                 keep_replay_ms: int | None = None, progress: Callable[[str], None] | None = None,
                 late_data_retention_ms: int | None = None, dead_letter_retention_ms: int | None = None,
                 audit_grace_ms: int = AUDIT_GRACE_MS) -> None:
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
        for what, ms in (("late_data_retention_ms", late_data_retention_ms),
                         ("dead_letter_retention_ms", dead_letter_retention_ms), ("audit_grace_ms", audit_grace_ms)):
            if ms is not None and ms < 0:
                raise ConfigError(f"background gc's {what} must be >= 0, got {ms}; nothing was started")
        self._options: dict[str, Any] = dict(  # run_gc's settings
            stream_retention_ms=stream_retention_ms, metrics_retention_ms=metrics_retention_ms,
            vacuum_retain_hours=vacuum_retain_hours, log_retention_ms=log_retention_ms,
            late_data_retention_ms=late_data_retention_ms, dead_letter_retention_ms=dead_letter_retention_ms,
            keep_replay_ms=keep_replay_ms)
        self.audit_grace_ms = audit_grace_ms
        self.progress = progress  # a line as a run starts and ends (the runners give theirs when None)
        self.runs = 0  # the runs started
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
        """``n`` more batches ran (0: time only); start a run if due and none runs; True if started."""
        with self._lock:
            self._batches += n
            due = ((self.every_batches is not None and self._batches >= self.every_batches)
                   or (self.every_s is not None and time.monotonic() - self._last >= self.every_s))
            if not due or self.running:
                return False
            self._batches, self._last = 0, time.monotonic()
            self.runs += 1
            self._thread = threading.Thread(target=self._run, name="deltawheel-background-gc", daemon=True)
            self._thread.start()
            return True

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the run in progress (if any) to end; False if ``timeout_s`` passed first."""
        if (t := self._thread) is not None:
            t.join(timeout_s)
        return t is None or not t.is_alive()

    @classmethod
    def every(cls, spark: Any, layout: StoreLayout, every: str | int, **options: Any) -> BackgroundGc:
        """The background gc of ``--gc-every`` (:func:`parse_every`); ``options``: the constructor's."""
        batches, seconds = parse_every(every)
        return cls(spark, layout, every_batches=batches, every_s=seconds, **options)

    def _say(self, line: str) -> None:
        if self.progress is not None:
            with contextlib.suppress(Exception):  # a progress line must never fail the run
                self.progress(line)

    def _run(self) -> None:
        t0 = time.monotonic()
        n = self.runs
        self._say(f"background gc #{n} started")
        try:
            activate(self.spark)  # its commits, from this thread: Delta's post-commit work needs a session
            now_ms = int(time.time() * 1000)
            gap, settled = audit_gaps(self.spark, self.layout, before_ms=now_ms - self.audit_grace_ms)  # before a log clean-up
            report = run_gc(self.spark, self.layout, now_ms=now_ms, apply=True, **self._options)
            report = replace(report, actions=audit_recovery(self.spark, self.layout, gap, apply=True) + report.actions)
            for table, upto in settled.items():  # every tool commit up to it has its row now
                save_checked(self.layout, upto, table)
            self.reports = [*self.reports[-99:], report]
            self._say(f"background gc #{n} done in {time.monotonic() - t0:.1f}s: {summary(report)}")
        except Exception as exc:  # a failed run must not stop the pipeline: the next one tries again
            self.failures = [*self.failures[-99:], f"{type(exc).__name__}: {exc}"]
            self._say(f"background gc #{n} failed after {time.monotonic() - t0:.1f}s ({type(exc).__name__}: "
                      f"{_cause(exc)}); the pipeline goes on, the next run tries again")
            _LOG.warning("deltawheel: background gc of %s failed (%s: %s); the pipeline goes on, the next run "
                         "tries again", self.layout.root, type(exc).__name__, _cause(exc))


def audit_gaps(spark: Any, layout: StoreLayout, *, before_ms: int | None = None
               ) -> tuple[list[dict[str, Any]], dict[str | None, int]]:
    """Audit rows missing for tools' commits before ``before_ms``, and per table the version complete."""
    from deltawheel.statestore.rowtable.tables import list_computations
    from deltawheel.statestore.surgery.audit import audit_gap_of

    rows: list[dict[str, Any]] = []
    settled: dict[str | None, int] = {}
    for c in (None, *list_computations(spark, layout)):
        got = audit_gap_of(spark, layout, table_of(layout, c), after_version=checked_upto(layout, c))
        late = [r for r in got.rows if before_ms is not None and int(r["recorded_ms"]) >= before_ms]
        young = [int(r["commit_version"]) for r in late]
        rows += [r for r in got.rows if r not in late]
        settled[c] = min(young) - 1 if young else got.upto
    return sorted(rows, key=lambda r: int(r["recorded_ms"])), settled


def audit_recovery(spark: Any, layout: StoreLayout, gap: list[dict[str, Any]], *, apply: bool) -> tuple[GcAction, ...]:
    """The missing audit rows ``gap`` (read before the passes), appended with ``apply``, else counted."""
    from deltawheel.statestore.surgery.audit import recover_audit

    ids = [r.audit_id for r in recover_audit(spark, layout, gap)] if apply and gap else [str(r["audit_id"]) for r in gap]
    if not ids:
        return ()
    return (GcAction("audit_recovery", "audit", f"{len(ids)} audit rows missing for tools' rows commits "
                     f"(ids {', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}), rebuilt from the commits", len(ids)),)


def _cause(exc: BaseException) -> str:
    """The first line of ``exc`` that says what happened (not Py4J's preamble), at most 300 characters."""
    lines = [ln.strip().lstrip(": ") for ln in str(exc).splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith("An error occurred while calling")]
    return (said or lines or [""])[0][:300]
