"""The image write path: whole interval partitions replaced, one Delta transaction per batch."""

from __future__ import annotations

import itertools
import json
import random
import time
from functools import cached_property
from typing import Any, Mapping, Sequence

from ...delta.group import commit_in_turn
from ...delta.log import commit_infos, user_metadata
from ...delta.storefs import TableFiles, table_files
from ...delta.txn import CommitRequest, FileEntry, StaleFilesError, TableLog, decode_path, new_add
from ...exceptions import CommitConflictError, StaleSequencerError
from ...layout import StoreLayout
from ...ownership.owner import IntervalOwner
from ...rowtable.fencing import translate_commit_error
from ...rowtable.frames import arrow_schema
from ...rowtable.store import COMMIT_META_VERSION, raise_if_fenced
from ...rowtable.tables import ensure_rows_table
from .. import Recovered, StaleViewError, WritePath
from ..delivery import deliver_productions
from ..streams import STREAM_FORMAT_VERSION, ensure_stream_table, stream_schema_ddl
from .beside import Beside
from .files import is_ids_path, write_production_files
from .fold import fold_intervals
from .recovery import Checkpoint, Recovery, facts_tag, resolve, scan
from .summary import BatchOutput

__all__ = ["ImagePath"]

_DELIVERY_RETRIES = 20  # conflicts with other deliveries to the same stream, retried with jitter


class _DeliveredMeanwhile(Exception):
    """Aborts a strong delivery's transaction: its checkpoint was delivered since it was last read."""


class ImagePath(WritePath[BatchOutput]):
    """The image write path of computation ``name``'s owned intervals (holds their file lists), on a
    store whose files Python reaches; ``retention_ms``: the dedup retention (None: no dedup)."""

    deliver_in_background = True

    def __init__(self, spark: Any, layout: StoreLayout, owner: IntervalOwner, *, name: str, outputs: Sequence[str],
                 retention_ms: int | None) -> None:
        self.spark, self.layout, self.owner, self.name = spark, layout, owner, name
        self.outputs, self.retention_ms = tuple(outputs), retention_ms
        self._stream_files: dict[str, TableFiles] = {}
        self.files: dict[int, list[FileEntry]] = {}
        self.version = -1
        self._streams: dict[str, TableLog] = {}
        self._delivered: dict[tuple[str, str], int] = {}
        self._oldest: dict[int, int | None] = {}
        self._next_proc: dict[int, int | None] = {}
        self._tables: Beside | None = None  # the output streams' tables being made (streams_ready)

    @cached_property
    def log(self) -> TableLog:
        """The computation's rows table's log (opened on first use: after the store exists)."""
        return TableLog(self.spark, ensure_rows_table(self.spark, self.layout, self.name))

    @cached_property
    def rows_files(self) -> TableFiles:
        """The computation's rows table's files (what the tasks read and write)."""
        files = table_files(self.spark, ensure_rows_table(self.spark, self.layout, self.name))
        assert files is not None  # the executor picks this path only where storefs.supports the store
        return files

    def stream_files(self, stream: str) -> TableFiles:
        """The files of ``stream``'s table, once the table exists (:meth:`streams_ready`)."""
        self.streams_ready()
        files = self._stream_files.get(stream)
        if files is None:
            got = table_files(self.spark, self.layout.stream(stream))
            assert got is not None  # the same store as the rows table
            files = self._stream_files[stream] = got
        return files

    def acquire(self, intervals: Sequence[int] | None, *, wait_s: float = 0.0) -> Recovered:
        """Take and fence the intervals with a claim (its fence rows checked in the images), then recover."""
        # the stream tables are made beside the claim's commit, and waited for where first needed
        self._tables = tables = self._make_tables()
        granted, self.owner.on_granted = self.owner.on_granted, tables.chain(self.owner.on_granted)
        try:
            self.owner.acquire(intervals, wait_s=wait_s, claim_only=True, scan=False, check_fences=False)
        except BaseException:
            tables.join(raise_error=False, run=False)
            raise
        finally:
            self.owner.on_granted = granted
        steps = list(self.owner.acquire_s.items())
        t0 = time.monotonic()
        try:
            self._load()
            t1 = time.monotonic()
            found = self.recovery()
            t2 = time.monotonic()
            self._oldest, self._next_proc = found.oldest, found.next_processing
            appended = self.redeliver(found.appends)
        except StaleSequencerError:
            self.owner.release()
            raise
        merge = sorted((p for c in found.merge for p in c.prods), key=lambda p: (p.timestamp_ms, p.production_id))
        if merge:  # in timestamp order, each with the id of the commit that checkpointed it
            self.streams_ready()
            deliver_productions(self.spark, self.layout, merge, producer=self.name,
                                commit_ids={p.production_id: c.commit_id for c in found.merge for p in c.prods})
        steps += [("files", t1 - t0), ("recovery_scan", t2 - t1), ("redeliver", time.monotonic() - t2)]
        return Recovered(appended=appended, merged=len(merge), steps_s=tuple((k, round(v, 3)) for k, v in steps))

    def streams_ready(self) -> None:
        """Wait until the output streams' tables exist; one that cannot be made raises its ConfigError."""
        tables = self._tables
        if tables is None:
            tables = self._tables = self._make_tables()
        tables.join()

    def _make_tables(self) -> Beside:
        return Beside(lambda: [ensure_stream_table(self.spark, self.layout, s) for s in self.outputs])

    def oldest_work(self) -> Mapping[int, int | None]:
        """Per interval, its oldest pending work, as recovery or the last commit found it."""
        return self._oldest

    def next_processing(self) -> Mapping[int, int | None] | None:
        """Per interval, when it next has work without input, as recovery or the last commit found it."""
        return self._next_proc

    def images(self) -> dict[int, tuple[str, ...]]:
        """interval -> the paths (relative to the rows table, decoded) of its live files."""
        return {iv: tuple(decode_path(f.path) for f in self.files.get(iv, ())) for iv in self.owner.intervals}

    def load(self) -> None:
        """Read the partitions' files again after :class:`StaleViewError`; StaleSequencerError if fenced."""
        self.owner.store.check_fences(self.name, self.owner.sequencers)
        self._load()

    def _load(self) -> None:
        """Read the live files of the owned partitions; files with deletion vectors are rewritten first."""
        ivs = sorted(self.owner.intervals)
        name, wanted = self.name, {str(iv) for iv in ivs}
        version, files = self.log.files(
            f"computation = '{name}' AND interval IN ({', '.join(map(str, ivs))})",
            where=lambda pv: pv.get("computation") == name and pv.get("interval") in wanted)
        self.files = {iv: [] for iv in ivs}
        for f in files:
            self.files.setdefault(int(f.part("interval") or -1), []).append(f)
        self.version = version
        dirty = sorted({iv for iv, fs in self.files.items() if any(f.has_deletion_vector for f in fs)})
        if dirty:  # a stale owner must not rewrite (the images' rows are not all live: ask Delta)
            self.owner.store.check_fences(self.name, self.owner.sequencers)
            self._rewrite(dirty)

    def recovery(self) -> Recovery:
        """:func:`.recovery.scan` less the strong deliveries that landed; StaleSequencerError if fenced."""
        out, checkpoints = scan(self.rows_files, self.files, name=self.name, sequencers=self.owner.sequencers,
                                retention_ms=self.retention_ms)
        # a held row's checkpointing commit is at or before its file's add ``version``: delivered once
        # the stream recorded that version for the interval; else look the commit up by id (resolve)
        for stream in sorted({c.stream for c in checkpoints if c.version is not None}):
            self._read_delivered(stream, [self._app(c.interval) for c in checkpoints
                                          if c.stream == stream and c.version is not None])
        for c in checkpoints:
            delivered = -1 if c.version is None else self._delivered[(c.stream, self._app(c.interval))]
            if c.version is not None and delivered >= c.version:
                continue
            todo = resolve(self.rows_files, c, delivered, name=self.name)
            if todo is not None:
                (out.appends if todo else out.merge).append(c)
        return out

    def redeliver(self, checkpoints: Sequence[Checkpoint]) -> int:
        """Deliver checkpoints of known commits as their own deliveries would have (the same application
        version: a zombie's late delivery of that commit cannot land too); returns how many."""
        n = 0
        for c in checkpoints:
            assert c.version is not None
            files = write_production_files(
                c.prods, producer=self.name, commit_id=c.commit_id, iv=c.interval,
                roots={c.stream: self.stream_files(c.stream)},
                schema=arrow_schema(stream_schema_ddl()), format_version=STREAM_FORMAT_VERSION)
            adds = [new_add(p.path, {}, p.size, p.num_rows) for p in files]
            self._deliver_strong(c.stream, self._stream_log(c.stream), {self._app(c.interval): adds}, c.version)
            n += len(c.prods)
        return n

    def _app(self, iv: int) -> str:
        """The application id an interval's strong deliveries record in a stream table."""
        return f"deltawheel.{self.name}.{iv}"

    def _stream_log(self, stream: str) -> TableLog:
        self.streams_ready()
        log = self._streams.get(stream)
        if log is None:
            log = self._streams[stream] = TableLog(self.spark, self.layout.stream(stream))
        return log

    def _read_delivered(self, stream: str, apps: Sequence[str]) -> None:
        """Remember the versions ``stream`` records for those of ``apps`` not known yet (one log read)."""
        unknown = [app for app in apps if (stream, app) not in self._delivered]
        if unknown:
            for app, v in self._stream_log(stream).txn_versions(unknown).items():
                self._delivered[(stream, app)] = v

    def _rewrite(self, ivs: list[int]) -> None:
        """Replace the files of ``ivs`` by one plain Parquet file each, same rows (:mod:`.fold`)."""
        self.version, new = fold_intervals(self.spark, self.log, self.rows_files, name=self.name,
                                           files={iv: self.files.get(iv, []) for iv in ivs}, version=self.version)
        self.files.update(new)

    def commit(self, out: BatchOutput, *, commit_id: str, meta: Mapping[str, Any]) -> bool:
        """:meth:`WritePath.commit` of the new images; ``out.version`` becomes the rows version it made."""
        name = self.name
        new = out.changed()
        self.owner.check()
        if not new:
            self._observe(out)
            return False
        ivs = sorted(iv for iv, _s in new)
        seqs = self.owner.sequencers
        info = json.dumps({**(meta or {}), "deltawheel": COMMIT_META_VERSION, "kind": "commit",
                           "writer": self.owner.store.writer, "computation": name, "commit_id": commit_id,
                           "write_path": "image", "sequencers": {str(iv): seqs[iv] for iv in ivs}},
                          sort_keys=True)
        parts = {iv: {"computation": name, "interval": str(iv)} for iv in ivs}
        made = {iv: [f for f in (s.image, s.ids_file, s.ids_merged) if f is not None] for iv, s in new}
        # each file carries its interval's facts after this commit (a restart's recovery reads them, not the image)
        tags = {iv: facts_tag(oldest=s.oldest_ms, next_proc=s.next_proc_ms, pending=s.pending_rows, sequencer=seqs[iv],
                              retention_ms=self.retention_ms, base=self.version) for iv, s in new}
        adds = {iv: [new_add(f.path, parts[iv], f.size, f.rows, tags=tags[iv]) for f in made[iv]] for iv in ivs}
        removes: list[FileEntry] = []
        kept: dict[int, list[FileEntry]] = {}
        for iv, s in new:
            gone = set(s.ids_removed)
            # a new image replaces every file of the partition but its ids files; dropped ids files go
            drop = [f for f in self.files.get(iv, ())
                    if (s.image is not None and not is_ids_path(decode_path(f.path))) or decode_path(f.path) in gone]
            removes += drop
            kept[iv] = [f for f in self.files.get(iv, ()) if f not in drop]
        added = [a for iv in ivs for a in adds[iv]]
        preds = [f"computation = '{name}' AND interval = {iv}" for iv in ivs]
        request = CommitRequest(removes=tuple(f.action_json for f in removes), adds=tuple(added),
                                read_partitions=tuple(preds), user_metadata=info, read_version=self.version,
                                partitions=tuple(parts.values()))

        def own() -> int:
            got = self.log.commit(remove=removes, add=added, user_metadata=info, read_partitions=preds,
                                  untouched_since=(self.version, list(parts.values())), known_version=self.version)
            assert got is not None
            return got
        try:
            # instances sharing the table take turns, and a holder commits the waiting batches with its own
            version = commit_in_turn(self.log, self.owner.store.turns, name, request, own).version
        except StaleFilesError as exc:
            # a takeover first (a zombie fails typed, never as a mere reload)
            self.owner.store.check_fences(name, seqs)
            raise StaleViewError(str(exc)) from exc
        except Exception as exc:
            err = translate_commit_error(exc, sequencers=seqs)
            if err is None:
                raise
            if isinstance(err, StaleSequencerError):
                raise err from exc
            self.owner.store.check_fences(name, seqs)
            raise StaleViewError(f"concurrent commit on {name}'s partitions: {err}") from exc
        for iv in ivs:
            pv = (("computation", name), ("interval", str(iv)))
            self.files[iv] = kept[iv] + [FileEntry(path=f.path, partition_values=pv, size=f.size,
                                                   has_deletion_vector=False, action_json=add)
                                         for f, add in zip(made[iv], adds[iv], strict=True)]
        self.version = out.version = version
        self._observe(out)
        return True

    def _observe(self, out: BatchOutput) -> None:
        """The committed images' oldest work (before the delivery thread publishes)."""
        for iv, s in out.intervals():
            self._oldest[iv] = s.oldest_ms
            self._next_proc[iv] = s.next_proc_ms

    def deliver(self, out: BatchOutput, *, strong: bool) -> int:
        """:meth:`WritePath.deliver`: ``strong`` appends once per (interval, rows version)."""
        version = out.version if strong else None
        by_stream: dict[str, dict[str, list[str]]] = {}
        n = 0
        for iv, s in out.intervals():
            for p in s.prod_files:
                app = self._app(iv)
                by_stream.setdefault(p.stream, {}).setdefault(app, []).append(new_add(p.path, {}, p.size, p.num_rows))
                n += p.num_rows
        for stream, files in sorted(by_stream.items()):
            log = self._stream_log(stream)
            if version is None:  # weak productions: blind append, consumers dedup by record id
                log.commit(add=[a for adds in files.values() for a in adds])
                continue
            self._deliver_strong(stream, log, files, version)
        return n

    def _deliver_strong(self, stream: str, log: TableLog, files: dict[str, list[str]], version: int) -> None:
        """Append once per (app id, version), unless this writer was taken over since ``version``.

        A zombie may still deliver a commit the new owner redelivers, so the append reads the whole stream
        and, once its snapshot is taken, checks for a newer claim or fence and reads the versions again
        (a delivery between the earlier read and the snapshot is invisible to Delta's conflict check)."""
        for attempt in itertools.count(1):
            self._read_delivered(stream, list(files))  # read once (one replay for all app ids), then remembered
            todo = {app: adds for app, adds in files.items() if self._delivered[(stream, app)] < version}
            if not todo:
                return

            def check(todo: Mapping[str, Any] = todo) -> None:
                self._not_taken_over_since(version)
                now = log.txn_versions(list(todo))
                if any(v >= version for v in now.values()):
                    self._delivered.update({(stream, app): v for app, v in now.items()})
                    raise _DeliveredMeanwhile
            try:
                log.commit(add=[a for adds in todo.values() for a in adds], app_versions={a: version for a in todo},
                           read_partitions=["true"], check=check)
            except _DeliveredMeanwhile:
                continue  # the todo is computed again from what was just read
            except StaleSequencerError:
                raise
            except Exception as exc:
                err = translate_commit_error(exc, sequencers={})
                if not isinstance(err, CommitConflictError) or attempt >= _DELIVERY_RETRIES:
                    raise
                for app in todo:  # another delivery landed meanwhile: read the versions again
                    self._delivered.pop((stream, app), None)
                time.sleep(random.uniform(0.01, 0.02 * min(attempt, 10)))
                continue
            for app in todo:
                self._delivered[(stream, app)] = version
            return

    def _not_taken_over_since(self, version: int) -> None:
        """Raise StaleSequencerError on a newer claim or fence of an owned interval after ``version``."""
        mine = self.owner.sequencers
        for _v, info in commit_infos(self.rows_files, after=version) or ():
            meta = user_metadata(info.get("userMetadata")) or {}
            if meta.get("kind") not in ("claim", "fence") or meta.get("computation") != self.name:
                continue
            newer = {int(iv): int(seq) for iv, seq in (meta.get("sequencers") or {}).items()
                     if int(iv) in mine and int(seq) > mine[int(iv)]}
            if newer:
                raise_if_fenced(self.name, newer, mine)
