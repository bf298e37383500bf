"""Reads and fenced, atomic commits of the single-row-per-key table (docs/fencing.md, "MERGE commits").

:meth:`RowStore.commit`'s steps are numbered in its code; the MERGE runs in Python over the files
where they are reachable (``filecommit.py``), else in Delta."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable, Mapping, Sequence

from ..clock import Clock, SystemClock
from ..codecs import CODEC_NAMES, base_name
from ..config import StoreLimits
from ..delta.deletionvectors import live_table
from ..delta.group import TurnsOf
from ..delta.jvm import jframe, jsession, require_classic_session
from ..delta.log import read_snapshot
from ..delta.maintenance import note_merge
from ..delta.storefs import TableFiles, background_uploads, table_files
from ..delta.txn import TableLog, decode_path, new_add, partition_file_name, write_file
from ..exceptions import (
    BadRecordError,
    CommitConflictError,
    NotOwnerError,
    StaleSequencerError,
    StateTooLargeError,
)
from ..layout import StoreLayout, validate_name
from . import inputfiles
from .fencing import REPLACE_FILES_OP, merge_sql, translate_commit_error
from .filecommit import merge_files
from .filescan import interval_rows
from .frames import arrow_schema, local_frame
from .rows import FENCE_KEY, KeyRow, interval_of, is_user_key, rows_file_ddl, rows_schema_ddl, validate_key
from .tables import ensure_rows_table

__all__ = ["RowStore", "CommitResult", "StoreStats", "COMMIT_META_VERSION", "commit_metadata",
           "raise_if_fenced"]

COMMIT_META_VERSION = 1
_SOURCE_DDL = rows_schema_ddl() + ", _op STRING"
_view_ids = itertools.count()


@dataclass
class StoreStats:
    """Counters of storage traffic: commits that landed, and Delta conflicts retried."""

    commits: int = 0
    conflicts: int = 0


@dataclass(frozen=True, kw_only=True)
class CommitResult:
    """What a commit wrote."""

    commit_id: str
    computation: str
    sequencers: Mapping[int, int]
    rows_written: int
    rows_deleted: int
    attempts: int
    duration_s: float
    dry_run: bool = False
    plan: Sequence[str] = field(default_factory=tuple)
    images: Sequence[KeyRow] = field(default_factory=tuple, compare=False, repr=False)


def _no_turn(_computation: str, _request: bytes | None = None) -> ContextManager[Any]:
    return contextlib.nullcontext()


class RowStore:
    """The rows table of one (migrated) store, written under sequencers; ``writer`` names the commits."""

    def __init__(self, spark: Any, layout: StoreLayout, *, writer: str, limits: StoreLimits = StoreLimits(),
                 clock: Clock = SystemClock(), conflict_retries: int = 3, fence_retries: int = 60) -> None:
        require_classic_session(spark)
        self._spark = spark.newSession()
        self.layout = layout
        self.writer = writer
        self.limits = limits
        self.clock = clock
        self.conflict_retries = conflict_retries
        self.fence_retries = fence_retries
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._row_files: dict[str, TableFiles | None] = {}
        #: (computation, the commit's request or None) -> a context manager around each Delta commit
        #: (``zk/turns.py``: writers sharing a table take turns at it, ``delta/group.py``); none by default
        self.turns: TurnsOf = _no_turn

    def table_id(self) -> str:
        """The store's first rows table's Delta table id: the store's identity."""
        return TableLog(self._spark, self.layout.rows).table_id()

    def path(self, computation: str) -> str:
        """``computation``'s rows table, made on first use (``tables.py``)."""
        return ensure_rows_table(self._spark, self.layout, computation)

    def _files(self, computation: str) -> TableFiles | None:
        if computation not in self._row_files:
            self._row_files[computation] = table_files(self._spark, self.path(computation))
        return self._row_files[computation]

    def _table(self, computation: str) -> Any:
        return self._spark.read.format("delta").load(self.path(computation))

    def _collect(self, df: Any) -> list[KeyRow]:
        return [KeyRow.from_row(r) for r in df.toArrow().to_pylist()]

    def read_keys(self, computation: str, keys: Iterable[str], *, num_intervals: int) -> dict[str, KeyRow]:
        """The stored rows of ``keys`` (missing keys are absent from the result)."""
        from pyspark.sql import functions as F

        keys = sorted(set(keys))
        if not keys:
            return {}
        ivs = sorted({interval_of(k, num_intervals) for k in keys})
        df = self._table(computation).where((F.col("computation") == computation) & F.col("interval").isin(ivs)
                                            & F.col("key").isin(keys))
        return {r.key: r for r in self._collect(df)}

    def scan_intervals(self, computation: str, intervals: Iterable[int], *, include_fences: bool = False) -> list[KeyRow]:
        """Every user row of ``intervals`` (and the fence rows if ``include_fences``)."""
        from pyspark.sql import functions as F

        ivs = sorted(set(intervals))
        files = self._files(computation)
        rows = None if files is None else interval_rows(files, computation, ivs)
        if rows is None:
            rows = self._collect(self._table(computation).where((F.col("computation") == computation) & F.col("interval").isin(ivs)))
        return [r for r in rows if is_user_key(r.key) or (include_fences and r.is_fence)]

    def fences(self, computation: str) -> dict[int, int]:
        """interval -> greatest fence-row sequencer of a computation (read in Python where it can)."""
        import pyarrow.compute as pc
        from pyspark.sql import functions as F

        # a claim (see fence()) can leave two fence rows in an interval until its next rewrite
        found = self._fence_rows_from_files(computation, "sequencer")
        if found is not None:
            out: dict[int, int] = {}
            for iv, table in found:
                top = pc.max(table["sequencer"]).as_py()
                out[iv] = max(out.get(iv, top), top)
            return out
        df = self._table(computation).where((F.col("computation") == computation) & (F.col("key") == FENCE_KEY))
        return {int(r["interval"]): int(r["s"]) for r in
                df.groupBy("interval").agg(F.max("sequencer").alias("s")).collect()}

    def _fence_rows_from_files(self, computation: str, column: str) -> list[tuple[int, Any]] | None:
        """(interval, ``column`` of its live fence rows) per file of ``computation``; None: Spark only."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        files = self._files(computation)
        if files is None:
            return None
        snap = read_snapshot(files)
        if snap is None:
            return None
        out: list[tuple[int, Any]] = []
        for add in snap.adds:
            pv = add.get("partitionValues") or {}
            if pv.get("computation") != computation:
                continue
            rel = decode_path(str(add["path"]))
            if add.get("deletionVector"):
                table = live_table(files, rel, dict(add["deletionVector"]), columns=["key", column])
                table = table.filter(pc.equal(table["key"], FENCE_KEY))
            elif files.is_local:  # the key column's statistics skip row groups without a fence row
                table = pq.read_table(files.path(rel), columns=[column], filters=[("key", "=", FENCE_KEY)])
            else:
                table = files.read_parquet(rel, columns=["key", column])
                table = table.filter(pc.equal(table["key"], FENCE_KEY))
            if table.num_rows:
                out.append((int(pv["interval"]), table))
        return out

    def input_files(self, computation: str) -> dict[int, frozenset[str]]:
        """interval -> the input files committed for it (``inputfiles.py``); none: absent."""
        from pyspark.sql import functions as F

        found = self._fence_rows_from_files(computation, "state")
        if found is not None:
            states = [(iv, s) for iv, table in found for s in table["state"].to_pylist()]
        else:
            df = self._table(computation).where((F.col("computation") == computation) & (F.col("key") == FENCE_KEY)
                                     & F.col("state").isNotNull()).select("interval", "state")
            states = [(int(r["interval"]), r["state"]) for r in df.collect()]
        out: dict[int, frozenset[str]] = {}
        for iv, state in states:
            if state is not None:
                out[iv] = out.get(iv, frozenset()) | inputfiles.decode(state)
        return out

    def check_fences(self, computation: str, sequencers: Mapping[int, int]) -> None:
        """Raise :class:`StaleSequencerError` if a fence row carries a greater sequencer than ours."""
        raise_if_fenced(computation, self.fences(computation), sequencers)

    def fence(self, computation: str, sequencers: Mapping[int, int], *, claim_only: bool = False,
              check: bool = True) -> CommitResult:
        """The takeover commit: move the fence rows of ``sequencers``' intervals to the new sequencers.

        Raises :class:`StaleSequencerError` if a fence carries a greater sequencer. Where Python
        writes the files, a quick *claim* commit goes first, so an old owner in a tight loop cannot
        win every race; ``claim_only``: stop after it; ``check=False``: the caller checks."""
        validate_name("computation", computation)
        if sequencers and (files := self._files(computation)) is not None:
            self._claim(computation, sequencers, files)
            if claim_only:
                if check:
                    self.check_fences(computation, sequencers)
                return CommitResult(commit_id=f"{self.writer}:claim", computation=computation, sequencers=dict(sequencers),
                                    rows_written=0, rows_deleted=0, attempts=0, duration_s=0.0)
        return self.commit(computation, [], sequencers=sequencers, kind="fence",
                           conflict_retries=max(self.conflict_retries, self.fence_retries))

    def _claim(self, computation: str, sequencers: Mapping[int, int], files: TableFiles) -> None:
        import pyarrow as pa

        now = self.clock.now_ms()
        commit_id = f"{self.writer}:{now}:claim:{next(_view_ids)}"
        schema = arrow_schema(rows_file_ddl())
        adds = []
        with background_uploads():
            for iv, seq in sorted(sequencers.items()):
                row = _source_row(computation, FENCE_KEY, iv, seq, commit_id, now, "upsert")  # _op: dropped
                rel = partition_file_name(computation, iv, "claim")
                size = write_file(pa.Table.from_pylist([row], schema=schema), files, rel)
                adds.append(new_add(rel, {"computation": computation, "interval": str(iv)}, size, 1))
        meta = json.dumps({"deltawheel": COMMIT_META_VERSION, "kind": "claim", "writer": self.writer,
                           "computation": computation, "commit_id": commit_id,
                           "sequencers": {str(iv): s for iv, s in sequencers.items()}}, sort_keys=True)
        log = TableLog(self._spark, self.path(computation))
        for attempt in itertools.count(1):
            try:
                # no read recorded: a blind append conflicts with no concurrent commit, and a commit
                # that read the partition conflicts with it (Delta's only isolation level, Serializable)
                log.commit(add=adds, user_metadata=meta)
                return
            except Exception as exc:
                err = translate_commit_error(exc, sequencers=sequencers)
                if not isinstance(err, CommitConflictError) or attempt > 10 * self.fence_retries:
                    raise
                self.stats.conflicts += 1
                time.sleep(random.uniform(0.0, 0.02))

    def commit(self, computation: str, rows: Sequence[KeyRow], *, sequencers: Mapping[int, int],
               deletes: Sequence[tuple[int, str]] = (), num_intervals: int | None = None,
               commit_id: str | None = None, lease_check: Callable[[], None] | None = None,
               dry_run: bool = False, kind: str = "commit", conflict_retries: int | None = None,
               meta: Mapping[str, Any] | None = None,
               input_sets: Mapping[int, Iterable[str]] | None = None) -> CommitResult:
        """Write ``rows`` (new images) and ``deletes`` ((interval, key) pairs) in one fenced transaction;
        ``input_sets``: interval -> its input-file set *replacing* the stored one (gc's pruning).

        Raises:
            BadRecordError / StateTooLargeError: a row is invalid (nothing written).
            NotOwnerError: a row's interval has no sequencer in ``sequencers``.
            StaleSequencerError: a newer owner fenced one of the intervals.
            CommitConflictError: concurrent commits kept conflicting after retries.
        """
        started = time.monotonic()
        # 1: validate before any I/O
        validate_name("computation", computation)
        now = self.clock.now_ms()
        commit_id = commit_id or f"{self.writer}:{now}:{next(_view_ids)}"
        images = [self._validated(r, computation, sequencers, num_intervals, now, commit_id) for r in rows]
        for iv, key in deletes:
            validate_key(key)
            self._require_sequencer(sequencers, iv, key)
        sets = {iv: inputfiles.encode(fs) for iv, fs in (input_sets or {}).items()}
        for iv in sets:
            self._require_sequencer(sequencers, iv, FENCE_KEY)
        touched = sorted({r.interval for r in images} | {iv for iv, _ in deletes} | set(sets) | (
            set(sequencers) if kind == "fence" else set()))
        plan = [f"upsert {r.key!r} (interval {r.interval})" for r in images] + [
            f"delete {k!r} (interval {iv})" for iv, k in deletes]
        if dry_run or not touched:  # nothing touched: nothing to write
            return CommitResult(commit_id=commit_id, computation=computation, sequencers=dict(sequencers),
                                rows_written=len(images), rows_deleted=len(deletes), attempts=0,
                                duration_s=time.monotonic() - started if touched else 0.0, dry_run=dry_run,
                                plan=tuple(plan))
        # 3: the MERGE source: rows, deletions, fences
        src = [r.to_row() | {"_op": "upsert"} for r in images]
        src += [_source_row(computation, k, iv, sequencers[iv], commit_id, now, "delete")
                for iv, k in deletes]
        src += [_source_row(computation, FENCE_KEY, iv, sequencers[iv], commit_id, now,
                            REPLACE_FILES_OP if iv in sets else "upsert", state=sets.get(iv))
                for iv in touched]
        if kind == "fence":  # an acquisition reads no input
            meta = {**inputfiles.no_input_entry(), **(meta or {})}
        res = self._commit_source(computation, src, None, sequencers=sequencers, touched=touched,
                                  commit_id=commit_id, kind=kind, lease_check=lease_check,
                                  conflict_retries=conflict_retries, started=started, meta=meta)
        return dataclasses.replace(res, rows_written=len(images), rows_deleted=len(deletes), plan=tuple(plan),
                                   images=tuple(images))

    def commit_frame(self, computation: str, frame: Any, *, sequencers: Mapping[int, int],
                     intervals: Sequence[int], commit_id: str,
                     lease_check: Callable[[], None] | None = None,
                     meta: Mapping[str, Any] | None = None, input_files: Sequence[str] = ()) -> CommitResult:
        """:meth:`commit` of a DataFrame (columns plus ``_op``), materialized; fence rows added here."""
        validate_name("computation", computation)
        for iv in intervals:
            self._require_sequencer(sequencers, iv, FENCE_KEY)
        now = self.clock.now_ms()
        files = inputfiles.encode(input_files) if input_files else None
        fences = [_source_row(computation, FENCE_KEY, iv, sequencers[iv], commit_id, now, "upsert",
                              state=files) for iv in intervals]
        return self._commit_source(computation, fences, frame, sequencers=sequencers, touched=sorted(intervals),
                                   commit_id=commit_id, kind="commit", lease_check=lease_check,
                                   conflict_retries=None, started=time.monotonic(), meta=meta)

    def _commit_source(self, computation: str, src: list[dict[str, Any]], frame: Any, *,
                       sequencers: Mapping[int, int], touched: Sequence[int], commit_id: str, kind: str,
                       lease_check: Callable[[], None] | None, conflict_retries: int | None, started: float,
                       meta: Mapping[str, Any] | None = None) -> CommitResult:
        info = json.dumps({**(meta or {}), "deltawheel": COMMIT_META_VERSION, "kind": kind,
                           "writer": self.writer, "computation": computation, "commit_id": commit_id,
                           "sequencers": {str(iv): sequencers[iv] for iv in touched}}, sort_keys=True)
        attempts = 0
        with self._lock:
            while True:
                attempts += 1
                # 2: leases still valid (checked before every attempt)
                if lease_check is not None:
                    lease_check()
                try:
                    if frame is None and (files := self._files(computation)) is not None:
                        merge_files(TableLog(self._spark, self.path(computation)), files, src, computation=computation,
                                    intervals=touched, meta=info, writer=self.writer, turn=self.turns)
                    else:
                        self._merge(src, computation, touched, info, frame=frame)
                    break
                except Exception as exc:
                    # 5: map failures
                    err = translate_commit_error(exc, sequencers=sequencers)
                    if err is None:
                        raise
                    if isinstance(err, CommitConflictError):
                        self.stats.conflicts += 1
                        limit = self.conflict_retries if conflict_retries is None else conflict_retries
                        if attempts <= limit:
                            time.sleep(random.uniform(0.02, 0.05 * min(attempts, 8)))
                            continue
                    raise err from None
        self.stats.commits += 1
        return CommitResult(commit_id=commit_id, computation=computation,
                            sequencers={iv: sequencers[iv] for iv in touched}, rows_written=0, rows_deleted=0,
                            attempts=attempts, duration_s=time.monotonic() - started)

    def _merge(self, src: list[dict[str, Any]], computation: str, intervals: Sequence[int], meta: str,
               *, frame: Any = None) -> None:
        # 4: one MERGE = one Delta transaction, metadata attached
        view = f"dw_src_{next(_view_ids)}"
        df = local_frame(self._spark, src, _SOURCE_DDL)
        if frame is not None:
            from pyspark.sql import DataFrame  # re-home the caller's frame in our session

            jdf = jframe(frame.select(*df.columns))
            moved = DataFrame(jsession(self._spark).createDataFrame(jdf.javaRDD(), jdf.schema()), self._spark)
            df = moved.unionByName(df)
        df.createOrReplaceTempView(view)
        conf = self._spark.conf
        conf.set("spark.databricks.delta.commitInfo.userMetadata", meta)
        try:
            path = self.path(computation)
            with self.turns(computation, None):
                self._spark.sql(merge_sql(path, view, computation=computation, intervals=intervals))
            note_merge(self._spark, path)
        finally:
            conf.unset("spark.databricks.delta.commitInfo.userMetadata")
            self._spark.catalog.dropTempView(view)

    @staticmethod
    def _require_sequencer(sequencers: Mapping[int, int], interval: int, key: str) -> None:
        if interval not in sequencers:
            raise NotOwnerError(f"key {key!r} is in interval {interval}, for which this writer holds no "
                                f"lease; held: {sorted(sequencers)}. Acquire the interval's lease before "
                                "writing.")

    def _validated(self, row: KeyRow, computation: str, sequencers: Mapping[int, int],
                   num_intervals: int | None, now: int, commit_id: str) -> KeyRow:
        validate_key(row.key)
        if row.computation != computation:
            raise BadRecordError(f"row of computation {row.computation!r} in a commit of {computation!r}")
        if num_intervals is not None and row.interval != interval_of(row.key, num_intervals):
            raise BadRecordError(f"key {row.key!r} belongs to interval {interval_of(row.key, num_intervals)} "
                                 f"of {num_intervals}, the row says {row.interval}")
        self._require_sequencer(sequencers, row.interval, row.key)
        if base_name(row.codec) not in CODEC_NAMES:
            raise BadRecordError(f"row of key {row.key!r} names unknown codec {row.codec!r}")
        size = len(row.state or b"")
        if size > self.limits.max_state_bytes:
            raise StateTooLargeError(f"state of key {row.key!r} is {size} bytes, over the limit of "
                                     f"{self.limits.max_state_bytes}; keep per-key state small (use "
                                     "combiners, move bulk data elsewhere) or raise "
                                     "StoreLimits.max_state_bytes")
        if len(row.record_ids) > self.limits.max_record_ids_per_key:
            raise BadRecordError(f"key {row.key!r} keeps {len(row.record_ids)} record ids, over "
                                 f"{self.limits.max_record_ids_per_key}; run gc or raise "
                                 "StoreLimits.max_record_ids_per_key")
        return row.with_(sequencer=sequencers[row.interval], commit_id=commit_id, updated_ms=now)


def _source_row(computation: str, key: str, interval: int, sequencer: int, commit_id: str, now: int, op: str,
                state: bytes | None = None) -> dict[str, Any]:
    return KeyRow(computation=computation, key=key, interval=interval, state=state, sequencer=sequencer,
                  commit_id=commit_id, updated_ms=now).to_row() | {"_op": op}


def raise_if_fenced(computation: str, fences: Mapping[int, int], sequencers: Mapping[int, int]) -> None:
    """Raise :class:`StaleSequencerError` if ``fences`` holds a greater sequencer than ``sequencers``."""
    for iv, seq in sorted(sequencers.items()):
        if fences.get(iv, seq) > seq:
            raise StaleSequencerError(
                f"stale sequencer: interval {iv} of {computation} is now owned under sequencer {fences[iv]} "
                f"(taken over; this writer holds {seq}); nothing was committed. Stop this instance.")


def commit_metadata(spark: Any, layout: StoreLayout, computation: str) -> list[tuple[int, dict[str, Any] | None]]:
    """(version, parsed userMetadata) of every commit of ``computation``'s rows table, oldest first."""
    hist = spark.sql(f"DESCRIBE HISTORY delta.`{layout.rows_of(computation)}`").select("version", "userMetadata").collect()
    return [(int(r["version"]), json.loads(r["userMetadata"]) if r["userMetadata"] else None)
            for r in sorted(hist, key=lambda r: r["version"])]
