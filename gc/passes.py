"""Garbage collection of a store's Delta tables (``deltawheel gc``; docs/operations.md).

Invariants: a stream record whose production is still checkpointed is kept; rewritten rows keep their
commit id (recovery decides "delivered" by it); a too-short VACUUM or replay-horizon retention is refused
before anything changes; keys' rows are never touched (only written under the owner's lease and fence)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from deltawheel.statestore.delta.create import tables_below
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.fencing import is_conflict, on_conflict_again
from deltawheel.statestore.rowtable.tables import rows_tables
from deltawheel.statestore.writepath.streams import list_streams

from .exceptions import ReplayHorizonError, RetentionError, VacuumRetentionError
from .streamretention import StreamRetention, stream_retention
from .unchanged import live_files, nothing_before, nothing_to_compact, nothing_to_vacuum

__all__ = ["GcAction", "GcReport", "run_gc", "VacuumRetentionError", "ReplayHorizonError", "RetentionError",
           "MIN_VACUUM_RETAIN_HOURS", "METRICS_RETENTION_HOURS", "check_replay_horizon"]

MIN_VACUUM_RETAIN_HOURS = 168.0  # Delta's delta.deletedFileRetentionDuration default (one week)
METRICS_RETENTION_HOURS = 720.0  # rows of the metrics tables kept by default (30 days)


@dataclass(frozen=True)
class GcAction:
    """One thing a gc pass did or would do to one table (``count``: records or files, where known)."""
    pass_name: str
    table: str
    detail: str
    count: int | None = None


@dataclass(frozen=True)
class GcReport:
    """What a gc run did (``applied``) or would do (a dry run): its actions, in order."""
    applied: bool
    actions: tuple[GcAction, ...] = field(default_factory=tuple)

    def lines(self) -> list[str]:
        """One line per action, marked ``[done]`` or ``[plan]``."""
        verb = "done" if self.applied else "plan"
        return [f"[{verb}] {a.pass_name:16s} {a.table}: {a.detail}" for a in self.actions]


def _tables(spark: Any, layout: StoreLayout) -> list[tuple[str, str]]:
    """(name, path) of every table gc collects: the rows tables (the first one too), then the side tables."""
    out = [("rows", layout.rows)]
    out += [(f"computations/{c}/rows", p) for c, p in rows_tables(spark, layout).items()]
    out += [("dead_letters", layout.dead_letters), ("late_data", layout.late_data)]
    out += [(s, layout.stream(s)) for s in list_streams(spark, layout)]
    if not layout.is_local or os.path.isdir(os.path.join(layout.metrics_batches, "_delta_log")):
        if _is_delta(spark, layout.metrics_batches):  # the store-wide table of older deltawheels
            out.append(("_metrics/batches", layout.metrics_batches))
    out += [(f"_metrics/computations/{c}", layout.metrics_of(c))
            for c in tables_below(spark, layout.metrics_root, what="metrics tables")]
    return [(n, p) for n, p in out if not layout.is_local or os.path.isdir(os.path.join(p, "_delta_log"))]


def _is_delta(spark: Any, path: str) -> bool:
    """Whether ``path`` holds a Delta table (the metrics table exists only once a batch ran)."""
    from delta.tables import DeltaTable

    try:
        return bool(DeltaTable.isDeltaTable(spark, path))
    except Exception:  # an unreachable or missing folder: no table to collect
        return False


def run_gc(spark: Any, layout: StoreLayout, *, now_ms: int, apply: bool = False,
           stream_retention_ms: int | None = None, vacuum_retain_hours: float = MIN_VACUUM_RETAIN_HOURS,
           force: bool = False, progress: Callable[[str, int], None] | None = None,
           metrics_retention_ms: int | None = int(METRICS_RETENTION_HOURS * 3_600_000),
           log_retention_ms: int | None = None, keep_replay_ms: int | None = None,
           late_data_retention_ms: int | None = None, dead_letter_retention_ms: int | None = None) -> GcReport:
    """Plan (default) or run the GC passes over ``layout``'s tables; ``progress(step, total)`` per pass.

    Raises:
        VacuumRetentionError: ``vacuum_retain_hours`` below :data:`MIN_VACUUM_RETAIN_HOURS` without ``force``.
        ReplayHorizonError: a retention shorter than ``keep_replay_ms``.
        RetentionError: a metrics, late-data or dead-letter retention below 0 (all three: nothing changed).
    """
    _check_retentions(vacuum_retain_hours, force=force, metrics_ms=metrics_retention_ms,
                      late_ms=late_data_retention_ms, dead_ms=dead_letter_retention_ms)
    keep_ms = check_replay_horizon(vacuum_retain_hours=vacuum_retain_hours, stream_retention_ms=stream_retention_ms,
                                   log_retention_ms=log_retention_ms, keep_replay_ms=keep_replay_ms)
    tables = _tables(spark, layout)
    streams = sum(1 for _, path in tables if path.startswith(layout.streams_root))
    metrics = [(n, p) for n, p in tables if p == layout.metrics_batches or p.startswith(layout.metrics_root + "/")]
    recorded = [(pass_name, name, path, ms) for pass_name, name, path, ms in (
        ("late_data_retention", "late_data", layout.late_data, late_data_retention_ms),
        ("dead_letter_retention", "dead_letters", layout.dead_letters, dead_letter_retention_ms))
        if ms is not None and any(p == path for _, p in tables)]
    if metrics_retention_ms is not None:
        recorded += [("metrics_retention", name, path, metrics_retention_ms) for name, path in metrics]
    total = (streams if stream_retention_ms is not None else 0) + 4 * len(tables) + len(recorded)
    run = _Run(spark=spark, layout=layout, now_ms=now_ms, apply=apply, tables=tables, total=total,
               progress=progress)
    if stream_retention_ms is not None:
        run.stream_retention(now_ms - stream_retention_ms)
    for pass_name, name, path, ms in recorded:  # by when a batch routed the record there
        run.recorded_retention(pass_name, name, path, ms)
    run.compact()
    run.vacuum(vacuum_retain_hours, force=force)
    run.logs(log_retention_ms)
    run.actions += [_horizon_action(spark, name, path, now_ms=now_ms, keep_ms=keep_ms)
                    for name, path in tables if path in run.rows_paths()] or [
        _horizon_action(spark, "rows", None, now_ms=now_ms, keep_ms=keep_ms)]
    return GcReport(apply, tuple(run.actions))


def _check_retentions(vacuum_retain_hours: float, *, force: bool, metrics_ms: int | None, late_ms: int | None,
                      dead_ms: int | None) -> None:
    if vacuum_retain_hours < 0 or (vacuum_retain_hours < MIN_VACUUM_RETAIN_HOURS and not force):
        raise VacuumRetentionError(
            f"VACUUM retention {vacuum_retain_hours:g} h is shorter than Delta's safety minimum of "
            f"{MIN_VACUUM_RETAIN_HOURS:g} h: files a running writer or a reader of an older version "
            "still needs could be deleted; nothing was changed. Use a retention of at least "
            f"{MIN_VACUUM_RETAIN_HOURS:g} h, or pass --force (force=True) when no job writes or reads the store"
            if vacuum_retain_hours >= 0 else f"VACUUM retention must be >= 0 hours, got {vacuum_retain_hours:g}")
    for flag, given in (("metrics", metrics_ms), ("late-data", late_ms), ("dead-letter", dead_ms)):
        if given is not None and given < 0:
            raise RetentionError(f"the {flag} retention must be >= 0 hours, got {given / 3_600_000:g}; nothing was "
                                 f"changed. Give --{flag}-retention-hours 0 or more (or leave it out)")


@dataclass(kw_only=True)
class _Run:
    """One gc run's passes over ``tables``, each adding its :class:`GcAction`."""

    spark: Any
    layout: StoreLayout
    now_ms: int
    apply: bool
    tables: list[tuple[str, str]]
    total: int
    progress: Callable[[str, int], None] | None
    actions: list[GcAction] = field(default_factory=list)

    def step(self, what: str) -> None:
        if self.progress is not None:
            self.progress(what, self.total)

    def rows_paths(self) -> list[str]:
        """The computations' rows tables among ``tables`` (the first table holds no rows since migration 8)."""
        return [p for _, p in self.tables if p.startswith(self.layout.computations_root + "/")]

    def stream_retention(self, cutoff: int) -> None:
        for name, path in self.tables:
            if path.startswith(self.layout.streams_root):
                self.step(f"stream retention of {name}")
                snap = live_files(self.spark, path)
                found = StreamRetention(0, 0) if snap is not None and nothing_before(snap, "timestamp_ms", cutoff) \
                    else stream_retention(self.spark, self.layout, path, stream=name, cutoff_ms=cutoff,
                                          apply=self.apply, rows_table=True)
                held = (f"; {found.held} older ones kept: their productions are still checkpointed (a restart "
                        "may redeliver them), the next batch of their interval clears them" if found.held else "")
                self.actions.append(GcAction("stream_retention", name, f"{found.removed} records with timestamp "
                                             f"before {_utc(cutoff)}{held}", found.removed))

    def recorded_retention(self, pass_name: str, name: str, path: str, ms: int) -> None:
        """Late data, dead letters and metrics: rows by when a batch recorded them."""
        from pyspark.sql import functions as F

        self.step("metrics retention" if pass_name == "metrics_retention"
                  else f"{pass_name.replace('_', ' ')} of {name}")
        cutoff = self.now_ms - ms
        snap = live_files(self.spark, path)
        n = 0 if snap is not None and nothing_before(snap, "recorded_ms", cutoff) else (
            self.spark.read.format("delta").load(path).where(F.col("recorded_ms") < cutoff).count())
        if self.apply and n:
            on_conflict_again(lambda: self.spark.sql(f"DELETE FROM delta.`{path}` WHERE recorded_ms < {int(cutoff)}"))
        what = "rows" if pass_name == "metrics_retention" else "records"
        self.actions.append(GcAction(pass_name, name, f"{n} {what} recorded before {_utc(cutoff)} "
                                     f"({ms / 3_600_000:g} h ago)", n))

    def compact(self) -> None:
        for name, path in self.tables:
            self.step(f"{'compacting' if self.apply else 'counting the files of'} {name}")
            snap = live_files(self.spark, path)
            if snap is not None and nothing_to_compact(snap):
                self.actions.append(GcAction("compact", name, f"{len(snap.adds)} files before OPTIMIZE, at most one "
                                             "per partition: nothing to merge", len(snap.adds)))
                continue
            files = self.spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"]
            if self.apply:  # again when a concurrent commit made Delta refuse it
                try:
                    on_conflict_again(partial(self.spark.sql, f"OPTIMIZE delta.`{path}`"))
                except Exception as exc:  # a live pipeline won every attempt: the next run tries again
                    if not is_conflict(exc):
                        raise
                    self.actions.append(GcAction("compact", name, f"skipped: a concurrent commit won each attempt "
                                                 f"({type(exc).__name__}); the next gc tries again", 0))
                    continue
            self.actions.append(GcAction("compact", name, f"{files} files before OPTIMIZE", int(files)))
        for name, path in self.tables:
            self.step(f"checking the recorded paths of {name}")
            if name == "rows" or path in self.rows_paths():
                n = _rerecord_paths(self.spark, path, apply=self.apply)
                if n:
                    self.actions.append(GcAction("paths", name, f"{n} live files recorded under URL-quoted paths", n))

    def vacuum(self, retain_hours: float, *, force: bool) -> None:
        check = "spark.databricks.delta.retentionDurationCheck.enabled"
        was = self.spark.conf.get(check, None)
        if force or not self.apply:  # Delta's own check refuses what the caller forced (and a dry run's 0 h listing)
            self.spark.conf.set(check, "false")
        try:
            for name, path in self.tables:
                self.step(f"{'vacuuming' if self.apply else 'listing unreferenced files of'} {name}")
                snap = live_files(self.spark, path)
                if snap is not None and nothing_to_vacuum(self.spark, path, snap):
                    self.actions.append(GcAction("vacuum", name, "no unreferenced files", 0))
                    continue
                if self.apply:
                    removed = self.spark.sql(f"VACUUM delta.`{path}` RETAIN {retain_hours} HOURS").count()
                    self.actions.append(GcAction("vacuum", name, f"vacuumed files older than {retain_hours:g} h",
                                                 removed))
                else:
                    old, unreferenced = _vacuum_plan(self.spark, path, now_ms=self.now_ms, retain_hours=retain_hours)
                    self.actions.append(GcAction("vacuum", name, _vacuum_detail(old, unreferenced, retain_hours), old))
        finally:
            if force or not self.apply:
                if was is None:
                    self.spark.conf.unset(check)
                else:
                    self.spark.conf.set(check, was)

    def logs(self, log_retention_ms: int | None) -> None:
        from .logs import checkpoint_newest, clean_log

        for name, path in self.tables:
            self.step(f"{'checkpointing' if self.apply else 'looking at'} the log of {name}")
            if not self.apply:
                cut, oldest = clean_log(path, cutoff_s=(self.now_ms - (log_retention_ms or 0)) / 1000, apply=False,
                                        spark=self.spark)
                self.actions.append(GcAction("log", name, "checkpoint at the newest version" + (
                    f"; {cut} log files before version {oldest} are older than the log retention"
                    if log_retention_ms is not None and cut else ""), cut if log_retention_ms is not None else 0))
                continue
            cut, oldest = 0, None  # without a log retention nothing is deleted (the checkpoint only)
            at = checkpoint_newest(self.spark, path)
            if log_retention_ms is not None:  # "now" as the pass runs: the passes above committed meanwhile
                later_ms = max(self.now_ms, int(time.time() * 1000))
                cut, oldest = clean_log(path, cutoff_s=(later_ms - log_retention_ms) / 1000, apply=True,
                                        spark=self.spark)
            self.actions.append(GcAction("log", name, ("checkpointed at version " + str(at) if at is not None
                                                       else "checkpoint is current")
                                         + (f"; deleted {cut} log files before version {oldest}" if cut else ""), cut))


#: Delta's own log retention (``delta.logRetentionDuration``'s default), without ``log_retention_ms``
DELTA_LOG_RETENTION_MS = 30 * 24 * 3_600_000


def check_replay_horizon(*, vacuum_retain_hours: float, stream_retention_ms: int | None,
                         log_retention_ms: int | None, keep_replay_ms: int | None) -> int:
    """The span back from now that a gc with these retentions leaves replayable (ms): the shortest.

    >>> check_replay_horizon(vacuum_retain_hours=168, stream_retention_ms=None, log_retention_ms=None,
    ...                      keep_replay_ms=None) // 3_600_000
    168

    Raises:
        ReplayHorizonError: ``keep_replay_ms`` is longer than one of them, or a retention is negative.
    """
    spans = {"--vacuum-retain-hours": int(vacuum_retain_hours * 3_600_000),
             "--log-retention-hours": DELTA_LOG_RETENTION_MS if log_retention_ms is None else log_retention_ms}
    if stream_retention_ms is not None:
        spans["--stream-retention-hours"] = stream_retention_ms
    for flag, ms in spans.items():
        if ms < 0:
            raise ReplayHorizonError(f"{flag} must be >= 0 hours, got {ms / 3_600_000:g}; nothing was changed")
    if keep_replay_ms is not None:
        if keep_replay_ms < 0:
            raise ReplayHorizonError(f"--keep-replay-hours must be >= 0, got {keep_replay_ms / 3_600_000:g}; "
                                     "nothing was changed")
        short = {flag: ms for flag, ms in spans.items() if ms < keep_replay_ms}
        if short:
            said = ", ".join(f"{flag} {ms / 3_600_000:g}" for flag, ms in short.items())
            raise ReplayHorizonError(
                f"{said} would cut below the replay horizon of {keep_replay_ms / 3_600_000:g} h asked for "
                "(--keep-replay-hours): versions of the rows table (or stream records) a replay from that far "
                "back reads would be deleted; nothing was changed. Give retentions of at least "
                f"{keep_replay_ms / 3_600_000:g} h, or a shorter --keep-replay-hours")
    return min(spans.values())


def _horizon_action(spark: Any, name: str, rows: str | None, *, now_ms: int, keep_ms: int) -> GcAction:
    """The replay horizon left in the rows table ``rows`` (None: none yet): its oldest version within it."""
    import datetime

    cutoff = now_ms - keep_ms
    when = datetime.datetime.fromtimestamp(cutoff / 1000, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    try:
        hist = [] if rows is None else spark.sql(f"DESCRIBE HISTORY delta.`{rows}`").select(
            "version", "timestamp").collect()
    except Exception:  # the table went meanwhile
        hist = []
    within = [int(r["version"]) for r in hist if r["timestamp"].timestamp() * 1000 >= cutoff]
    oldest = min(within, default=None)
    return GcAction("replay_horizon", name,
                    f"replay can start from versions committed after {when} ({keep_ms / 3_600_000:g} h back)"
                    + (f": the oldest is version {oldest}" if oldest is not None else
                       ": no computation has a rows table yet" if rows is None else
                       ": no version of the rows table is that recent"), oldest)


def _vacuum_plan(spark: Any, path: str, *, now_ms: int, retain_hours: float) -> tuple[int, int]:
    """(files VACUUM would remove now, unreferenced files of any age) from one 0-hour DRY RUN listing."""
    listed = [r[0] for r in spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS DRY RUN").collect()]
    horizon_s = now_ms / 1000 - retain_hours * 3600
    try:
        old = sum(1 for p in listed if os.path.getmtime(p.removeprefix("file:")) < horizon_s)
    except OSError:  # not local files: ask Delta for the retention's own listing
        old = spark.sql(f"VACUUM delta.`{path}` RETAIN {retain_hours} HOURS DRY RUN").count()
    return old, len(listed)


def _vacuum_detail(old: int, unreferenced: int, retain_hours: float) -> str:
    """The dry run's vacuum line: what goes now, and what later once it is old enough.

    >>> _vacuum_detail(0, 12, 168.0)
    '12 unreferenced files, none older than the retention of 168 h yet: nothing to remove now; a gc after they reach it removes them'
    """
    if not unreferenced:
        return "no unreferenced files"
    if not old:
        return (f"{unreferenced} unreferenced files, none older than the retention of {retain_hours:g} h yet: "
                "nothing to remove now; a gc after they reach it removes them")
    return (f"{old} unreferenced files older than the retention of {retain_hours:g} h would be removed"
            + (f" ({unreferenced - old} younger ones stay until they reach it)" if unreferenced > old else ""))


def _rerecord_paths(spark: Any, path: str, *, apply: bool) -> int:
    """A rows table's live files logged under a path not in Delta's form; ``apply`` re-adds them."""
    import json

    from deltawheel.statestore.delta.txn import TableLog, decode_path, delta_path

    log = TableLog(spark, path)
    _version, live = log.files("true", where=lambda _pv: True)
    odd = [f for f in live if delta_path(decode_path(f.path)) != f.path]
    if apply and odd:
        adds = [json.dumps({"add": {**json.loads(f.action_json)["add"], "path": delta_path(decode_path(f.path)),
                                    "dataChange": False}}) for f in odd]
        log.commit(remove=odd, add=adds, user_metadata=json.dumps({"deltawheel": 1, "kind": "gc_paths"}))
    return len(odd)


def _utc(ms: int) -> str:
    """A cutoff in a plan line: the UTC time, with its epoch milliseconds (what the tables hold)."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(ms / 1000))} UTC ({ms} ms)"
