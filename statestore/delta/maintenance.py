"""Delta log checkpoints of the versions this process committed, written by a background thread of
the driver off the commit path (tables of :data:`COMMIT_CHECKPOINT_INTERVAL`). docs/performance.md."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

from .checkpoints import newest_checkpoint
from .jvm import delta_classes, jsession, per_owner
from .jvm import jvm as jvm_of
from .log import log_files
from .storefs import table_files

__all__ = ["COMMIT_CHECKPOINT_INTERVAL", "CHECKPOINT_EVERY", "REST", "WARM_AFTER", "CheckpointWritten", "LogCheckpointer",
           "checkpointer", "note_commit", "note_merge"]

_LOG = logging.getLogger(__name__)

#: ``delta.checkpointInterval`` of deltawheel's tables: Delta's post-commit hook never checkpoints them
COMMIT_CHECKPOINT_INTERVAL = 2_147_483_647
#: versions between two checkpoints written in the background
CHECKPOINT_EVERY = 100
#: after a checkpoint that took ``d`` seconds the next waits ``REST * d``: the tables of a pipeline's stages,
#: committed in lockstep, pass their interval together, and their checkpoints back to back (each a Spark job)
#: held a core for seconds on end, the batches' backlog growing meanwhile (docs/latency.md, "Fused stages")
REST = 2.0
#: commits noted before the thread warms the checkpoint path on a scratch table (:meth:`LogCheckpointer.warm`)
WARM_AFTER = 20


@dataclass(frozen=True)
class CheckpointWritten:
    """A checkpoint the background thread wrote: the table, its version, how long it took."""

    path: str
    version: int
    seconds: float
    ended: float = 0.0  # when, on the monotonic clock


class LogCheckpointer:
    """The background checkpoints of the tables one driver commits to; one per ``SparkContext``."""

    def __init__(self, spark: Any, *, every: int = CHECKPOINT_EVERY) -> None:
        self.spark = spark
        self.every = every
        self.rest = REST  # after a checkpoint of d seconds, the next waits rest * d
        self.written: list[CheckpointWritten] = []  # newest last (the last 1,000)
        self.failures: list[tuple[str, int, str]] = []  # (path, version, error), the last 100
        self._cond = threading.Condition()
        self._pending: dict[str, int] = {}  # path -> the newest version noted, not yet looked at
        self._known: dict[str, int] = {}  # path -> its newest checkpoint as last seen (-1: none)
        self._busy = False
        self._held = 0  # hold(): notes wait
        self._thread: threading.Thread | None = None
        self._warned = 0.0
        self._noted = 0
        self._rest_until = 0.0  # monotonic time: no checkpoint starts before it (:data:`REST`)
        self._warm_due = False
        self.warmed_s: float | None = None  # how long :meth:`warm` took (None: not run)

    def committed(self, path: str, version: int, *, spark: Any = None) -> None:
        """This process committed ``version`` of the table at ``path`` (returns at once)."""
        with self._cond:
            if spark is not None:
                self.spark = spark
            if version > self._pending.get(path, -1):
                self._pending[path] = version
            self._noted += 1
            self._warm_due = self._warm_due or self._noted == WARM_AFTER
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="deltawheel-log-checkpoints", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def idle(self, timeout_s: float | None = 60.0) -> bool:
        """Wait until every note so far is dealt with; False if ``timeout_s`` passed first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    @contextlib.contextmanager
    def hold(self) -> Iterator[LogCheckpointer]:
        """A context in which notes wait (no checkpoint is started); they are taken on leaving it."""
        with self._cond:
            self._held += 1
        try:
            yield self
        finally:
            with self._cond:
                self._held -= 1
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._pending or self._warm_due) or self._held or time.monotonic() < self._rest_until:
                    self._cond.wait(max(0.0, self._rest_until - time.monotonic()) or None)
                warm, self._warm_due = self._warm_due, False
                path = None if warm else next(iter(self._pending))
                version = -1 if path is None else self._pending.pop(path)
                self._busy = True
                spark = self.spark
            started, wrote = time.monotonic(), False
            try:
                if path is None:
                    self.warm(spark)
                else:
                    wrote = self._maybe_checkpoint(spark, path, version)
            except Exception as exc:  # maintenance must never stop the notes' thread
                self._failed(path or "(warming: a scratch table)", version, f"{type(exc).__name__}: {exc}")
            finally:
                with self._cond:
                    self._busy = False
                    if wrote:
                        self._rest_until = time.monotonic() + self.rest * (time.monotonic() - started)
                    self._cond.notify_all()

    def warm(self, spark: Any) -> None:
        """Checkpoint a scratch table in a local temporary folder (a local master only). A process's first
        checkpoint pays for Spark's code generation and Delta's classes: 5.3 s against 1.5 s for the next
        one, measured; paid at a table's 100th version, that stalled every stage's batches for seconds
        (docs/latency.md, "Fused stages"). The thread pays it after :data:`WARM_AFTER` commits instead."""
        import shutil
        import tempfile

        if not str(spark.sparkContext.master).startswith("local"):
            return  # the executors could not read a folder of the driver's
        started = time.monotonic()
        folder = tempfile.mkdtemp(prefix="deltawheel-warm-checkpoint-")
        try:
            spark.sparkContext.setLocalProperty("spark.job.description", "deltawheel: warming log checkpoints")
            spark.range(1).write.format("delta").save(folder)
            log, d = _delta_log(spark, folder), delta_classes(jvm_of(spark))
            log.checkpoint(log.update(False, d.none, d.none), d.none)
            self.warmed_s = time.monotonic() - started
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _maybe_checkpoint(self, spark: Any, path: str, version: int) -> bool:
        """Checkpoint ``path`` at ``version`` if its interval passed since its newest; whether it ran one."""
        known = self._known.get(path)
        if known is not None and version - known < self.every:
            return False
        files = table_files(spark, path)
        log = _delta_log(spark, path)
        known = _newest_checkpoint(files, log)
        self._known[path] = known
        if version - known < self.every:
            return False
        d = delta_classes(jvm_of(spark))
        snapshot = log.getSnapshotAt(version, d.none, d.none, False)
        if int(log.checkpointInterval(snapshot.metadata())) != COMMIT_CHECKPOINT_INTERVAL:
            self._known[path] = version  # Delta's hook checkpoints it
            return False
        started = time.monotonic()
        sc = spark.sparkContext
        sc.setLocalProperty("spark.job.description", f"deltawheel: log checkpoint of {path} at version {version}")
        log.checkpoint(snapshot, d.none)  # Delta logs and swallows its own failures: look for the file
        if files is not None and _newest_checkpoint(files, log) < version:
            self._failed(path, version, "Delta wrote no checkpoint file (the driver's log has Delta's reason)")
            return True
        self._known[path] = version
        self.written = [*self.written[-999:], CheckpointWritten(path, version, time.monotonic() - started,
                                                                time.monotonic())]
        _LOG.info("deltawheel: checkpointed %s at version %d in %.2f s", path, version, time.monotonic() - started)
        return True

    def _failed(self, path: str, version: int, why: str) -> None:
        self.failures = [*self.failures[-99:], (path, version, why)]
        now = time.monotonic()
        if now - self._warned > 60:
            self._warned = now
            _LOG.warning("deltawheel: could not checkpoint the Delta log of %s at version %d (%s); commits go "
                         "on, and the next one past the interval tries again. Readers replay more JSON commits "
                         "meanwhile", path, version, why)


def _delta_log(spark: Any, path: str) -> Any:
    return delta_classes(jvm_of(spark)).delta_log.forTable(jsession(spark), path)


def _newest_checkpoint(files: Any, log: Any) -> int:
    """The version of the table's newest complete checkpoint (-1: none)."""
    if files is not None:
        names = log_files(files)
        cp, _ok = newest_checkpoint((names.listdir() or []) if names is not None else [])
        return -1 if cp is None else cp.version
    return int(log.unsafeVolatileSnapshot().checkpointProvider().version())


def checkpointer(spark: Any) -> LogCheckpointer:
    """The :class:`LogCheckpointer` of ``spark``'s ``SparkContext`` (made on first use)."""
    return per_owner("checkpointer", spark.sparkContext, lambda: LogCheckpointer(spark))


def note_commit(spark: Any, path: str, version: int) -> None:
    """This process committed ``version`` of the table at ``path``: checkpoint it in the background if due."""
    checkpointer(spark).committed(path, version, spark=spark)


def note_merge(spark: Any, path: str) -> None:
    """Note the version this thread's SQL write into the table at ``path`` just committed; never raises."""
    try:
        version = int(_delta_log(spark, path).unsafeVolatileSnapshot().version())
    except Exception as exc:
        _LOG.warning("deltawheel: could not read the version just committed to %s (%s: %s); its log "
                     "checkpoint waits for the next commit", path, type(exc).__name__, exc)
        return
    if version >= 0:
        note_commit(spark, path, version)
