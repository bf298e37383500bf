"""Delta transactions at the file level, through Delta's own transaction API.

The executor's fast write path (``write_path="image"``) does not go through
MERGE: Spark tasks write whole interval images (Parquet files) and the driver
commits them here, one ``OptimisticTransaction`` per batch, built from Delta
actions: ``remove`` the interval's previous files, ``add`` the new ones.
Delta's conflict detection is the mediator, as with MERGE:

- the transaction records a read predicate per interval partition and the
  files it replaces; a concurrent commit that adds or removes files of those
  partitions (a takeover's fence MERGE, another writer) makes it fail with
  ``ConcurrentAppendException`` / ``ConcurrentDeleteDeleteException``;
- commits that landed *before* the transaction started are not seen by that
  check, so :meth:`TableLog.touched_since` reads the log entries after the
  writer's last own commit and reports any that touch its partitions; the
  writer then reloads its images (and meets the newer fence row).

Delivery of productions is an append of already written files with one
``SetTransaction`` (app id, version) per producing interval: Delta's own
idempotence for retried appends; an app id whose version is already at or
past the one given is skipped. (The executor records the stream as read and
checks for a takeover once the snapshot is taken: ``writepath.image.path.ImagePath._deliver_strong``.)

Commits go through the JVM side of Delta (py4j): the log format, checkpoints
and conflict rules stay Delta's; log checkpoints are written by ``maintenance.py``, live files
may be read in Python (``log.py``). Files are plain Parquet written with pyarrow
(:func:`write_file`, whole before a commit names them), readable by any Delta reader.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import quote, unquote

from ..exceptions import StaleFilesError
from .jvm import jsession
from .jvm import jvm as jvm_of
from .log import LogSnapshot, read_snapshot
from .maintenance import note_commit
from .storefs import TableFiles, table_files

__all__ = ["FileEntry", "TableLog", "StaleFilesError", "new_add", "delta_path", "decode_path",
           "write_file", "partition_file_name"]


@dataclass(frozen=True)
class FileEntry:
    """One live data file of a table (an ``add`` action)."""

    path: str  # relative to the table root, as in the log (URL-encoded)
    partition_values: tuple[tuple[str, str], ...]
    size: int
    has_deletion_vector: bool
    action_json: str
    added_at: int | None = None  # the version of the commit that added it (None: not known)
    added_exact: bool = False  # ``added_at`` is that version, not an upper bound (a checkpoint's)

    def part(self, name: str) -> str | None:
        """The file's value of partition column ``name`` (None: not partitioned by it)."""
        return dict(self.partition_values).get(name)


# what java.net.URI leaves unquoted in a path (besides letters, digits and ``_.-~``)
_URI_PATH_SAFE = "/!*'();:@&=+$,"


def delta_path(rel_path: str) -> str:
    """``rel_path`` (below the table folder) as Delta writes it in an ``add`` action: Hadoop's
    ``new Path(rel_path).toUri().toString()``, which quotes only what a URI path cannot hold
    (``%``, spaces, ...) and keeps ``=``, so a partition folder reads ``computation=c``.

    Delta's VACUUM compares the files it lists below the table, in this form, with the live
    files' paths; a path quoted otherwise (``computation%3Dc``, as ``urllib.parse.quote`` does)
    names no listed file, and VACUUM deleted the live file as unreferenced. (Names of
    computations and streams are ASCII identifiers: no character Java and Python quote
    differently occurs in a path written here.)"""
    return quote(rel_path, safe=_URI_PATH_SAFE)


def new_add(rel_path: str, partition_values: Mapping[str, str], size: int, num_records: int) -> str:
    """The JSON of an ``add`` action for a freshly written file (``rel_path`` not yet encoded;
    the action's path is :func:`delta_path`, as Delta writes it)."""
    return json.dumps({"add": {
        "path": delta_path(rel_path), "partitionValues": dict(partition_values), "size": int(size),
        "modificationTime": int(time.time() * 1000), "dataChange": True,
        "stats": json.dumps({"numRecords": int(num_records)})}})


def _memo(cache: dict[str, Any], key: str, make: Callable[[str], Any]) -> Any:
    """``make(key)``, kept in ``cache`` (emptied when it passes 1,024 entries)."""
    value = cache.get(key)
    if value is None:
        if len(cache) > 1024:
            cache.clear()
        value = cache[key] = make(key)
    return value


class _DeltaJvm:
    """The JVM classes and constants a :class:`TableLog` calls, resolved once per JVM: every
    attribute step of ``jvm.a.b.C`` and every call is a py4j round trip (about twenty here, ~8 ms
    on an idle driver and several times that beside a starting query)."""

    def __init__(self, jvm: Any) -> None:
        self.cc = jvm.scala.jdk.javaapi.CollectionConverters
        self.as_scala = self.cc.asScala  # (each attribute step of a class is a reflection round trip)
        utils = jvm.org.apache.spark.util.Utils
        self.action = utils.classForName("org.apache.spark.sql.delta.actions.Action$", True, False) \
            .getField("MODULE$").get(None)
        self.write_op = getattr(jvm.org.apache.spark.sql.delta, "DeltaOperations$Write")
        # Write's constructor grew optional parameters (4 in Delta 4.0, 7 in 4.1-4.2, 9 in 4.3-4.4),
        # all defaulting to None, and py4j applies no Scala defaults: pad the call to its arity
        self.write_arity = int(utils.classForName("org.apache.spark.sql.delta.DeltaOperations$Write", True, False)
                               .getConstructors()[0].getParameterCount())
        save_mode = jvm.org.apache.spark.sql.SaveMode
        self.modes = {True: save_mode.Overwrite, False: save_mode.Append}
        self.array_list = jvm.java.util.ArrayList
        self.none = jvm.scala.Option.empty()
        self.some = jvm.scala.Some
        self.delta_log = jvm.org.apache.spark.sql.delta.DeltaLog


_JVMS: dict[int, tuple[Any, _DeltaJvm]] = {}  # id(py4j JVM view) -> (the view, its classes)
_JVMS_LOCK = threading.Lock()


def _delta_jvm(jvm: Any) -> _DeltaJvm:
    got = _JVMS.get(id(jvm))
    if got is not None and got[0] is jvm:
        return got[1]
    with _JVMS_LOCK:
        got = _JVMS.get(id(jvm))
        if got is None or got[0] is not jvm:  # (a stopped session's view: its id may be reused)
            got = _JVMS[id(jvm)] = (jvm, _DeltaJvm(jvm))
        return got[1]


class TableLog:
    """File-level reads and commits of one Delta table (driver side).

    Reads that Python can make from the table's log (:func:`log.read_snapshot`: local and
    ``s3a://`` tables) make no JVM call; the JVM side (Delta's ``DeltaLog`` and the classes the
    commits use) is reached on first use."""

    def __init__(self, spark: Any, path: str) -> None:
        self.spark = spark
        self.path = path
        self._jvm = jvm_of(spark)
        self._files = table_files(spark, path)  # the log read in Python (None: only through Delta)
        self._j: _DeltaJvm | None = None
        self._jlog: Any = None
        self._parser: Any = None
        self._parsed: dict[str, Any] = {}  # predicate SQL -> parsed expression (immutable, reused)
        self._seqs: dict[str, Any] = {}  # predicates (one a line) -> the Seq of them parsed (immutable)
        self._somes: dict[str, Any] = {}  # the operation's OR of predicates -> its Some (immutable)
        self._actions: dict[str, Any] = {}  # action JSON -> Delta action object (see _from_json)

    @property
    def _d(self) -> _DeltaJvm:
        if self._j is None:
            self._j = _delta_jvm(self._jvm)
        return self._j

    @property
    def _log(self) -> Any:
        """Delta's ``DeltaLog`` of the table (Delta caches it per path: a second one is the same)."""
        if self._jlog is None:
            self._jlog = self._d.delta_log.forTable(jsession(self.spark), self.path)
        return self._jlog

    # ------------------------------------------------------------ reading

    def _seq(self, items: Sequence[Any]) -> Any:
        """A Scala ``Seq`` of ``items``: len(items) + 3 round trips (the list, its elements, the
        conversion, ``toSeq``)."""
        d = self._d
        lst = d.array_list()
        for item in items:
            lst.add(item)
        return d.as_scala(lst).toSeq()

    def _from_json(self, action_json: str) -> Any:
        """Delta's action object of ``action_json``; the adds of a commit are kept, since the
        next commit of their partition removes exactly those files (actions are immutable)."""
        return _memo(self._actions, action_json, self._d.action.fromJson)

    def _pred(self, sql: str) -> Any:
        if self._parser is None:
            self._parser = jsession(self.spark).sessionState().sqlParser()
        return _memo(self._parsed, sql, self._parser.parseExpression)

    def _preds(self, predicates: Sequence[str]) -> Any:
        """The Scala ``Seq`` of the parsed ``predicates`` (kept: a writer reads the same partitions
        batch after batch, and a ``Seq`` of parsed expressions is immutable)."""
        return _memo(self._seqs, "\n".join(predicates), lambda _k: self._seq([self._pred(p) for p in predicates]))

    def _operation(self, overwrite: bool, predicates: Sequence[str] = (), user_metadata: str | None = None) -> Any:
        """The commit's operation: a Delta ``WRITE`` (``Append``, or ``Overwrite`` of the partitions
        whose files it replaces, as ``replaceWhere`` records it), carrying ``user_metadata``.

        Not ``ManualUpdate``: Delta derives no incremental checksum for a manual update, so after
        each such commit it rebuilt the new snapshot's protocol and metadata with a Spark job
        (60-120 ms per commit); a ``WRITE`` carries the checksum forward in memory (no job).
        The user metadata rides on the operation, not on the session setting
        ``spark.databricks.delta.commitInfo.userMetadata``: Delta reads that setting from the
        calling thread's *active* session, which need not be this one (claims made outside a
        streaming batch were committed without it), and a setting is shared by the threads
        committing concurrently (a delivery thread beside a batch)."""
        d = self._d
        none = d.none
        pred = _memo(self._somes, " OR ".join(f"({p})" for p in predicates), d.some) if predicates else none
        meta = d.some(user_metadata) if user_metadata is not None else none
        return d.write_op(d.modes[overwrite], none, pred, meta, *([none] * (d.write_arity - 4)))

    def files(self, predicate_sql: str, *,
              where: Callable[[Mapping[str, str]], bool] | None = None) -> tuple[int, list[FileEntry]]:
        """(snapshot version, live files matching a partition predicate) — a full snapshot read.

        With ``where`` (the same predicate over a file's partition values) a local table's log is
        replayed in Python (:func:`log.read_snapshot`, no Spark job); otherwise, or when that
        reader declines the table, Delta reads its snapshot with ``predicate_sql``."""
        if where is not None:
            snap = self._snapshot()
            if snap is not None:
                entries = []
                for a in snap.adds:
                    pv = {str(k): str(v) for k, v in (a.get("partitionValues") or {}).items()}
                    if where(pv):
                        entries.append(FileEntry(str(a["path"]), tuple(sorted(pv.items())), int(a["size"]),
                                                 bool(a.get("deletionVector")), json.dumps({"add": a}),
                                                 snap.added_at.get(str(a["path"])),
                                                 str(a["path"]) in snap.added_at and str(a["path"]) not in snap.bounded))
                return snap.version, entries
        txn = self._log.startTransaction()
        cc = self._d.cc
        adds = cc.asJava(txn.filterFiles(self._seq([self._pred(predicate_sql)]), False))
        out = []
        for a in adds:
            pv = cc.asJava(a.partitionValues())
            out.append(FileEntry(str(a.path()), tuple(sorted((str(k), str(v)) for k, v in pv.items())),
                                 int(a.size()), a.deletionVector() is not None, str(a.json())))
        return int(txn.snapshot().version()), out

    def _snapshot(self) -> LogSnapshot | None:
        """The table's live files read from its log in Python (None: ask Delta)."""
        return None if self._files is None else read_snapshot(self._files)

    def _touched(self, txn: Any, version: int, partitions: Iterable[Mapping[str, str]], *,
                 upto: int | None = None) -> int | None:
        """The first commit in (version, txn's snapshot] that touched ``partitions`` or the metadata
        (``upto``: the snapshot's version when the caller knows it)."""
        wanted = {tuple(sorted(p.items())) for p in partitions}
        if upto is None:
            upto = int(txn.snapshot().version())
        if upto <= version:
            return None
        # getChanges(startVersion, catalogTable, failOnDataLoss): a path-based table has no catalog entry
        cc = self._d.cc
        changes = self._log.getChanges(version + 1, self._d.none, False)
        while changes.hasNext():
            pair = changes.next()
            v = int(pair._1())
            if v > upto:
                break
            for act in cc.asJava(pair._2()):
                name = act.getClass().getSimpleName()
                if name in ("Metadata", "Protocol"):
                    return v
                if name in ("AddFile", "RemoveFile"):
                    pv = tuple(sorted((str(k), str(x)) for k, x in cc.asJava(act.partitionValues()).items()))
                    if pv in wanted:
                        return v
        return None

    def table_id(self) -> str:
        """The table's Delta id (``metaData.id``, fixed when the table was created): from the
        replayed log, else from Delta's snapshot."""
        snap = self._snapshot()
        if snap is not None and snap.table_id:
            return snap.table_id
        return str(self._log.startTransaction().metadata().id())

    def txn_version(self, app_id: str) -> int:
        """The version last recorded for ``app_id`` (-1 if none); see :meth:`txn_versions`."""
        return self.txn_versions([app_id])[app_id]

    def txn_versions(self, app_ids: Iterable[str]) -> dict[str, int]:
        """The version last recorded for each of ``app_ids`` (-1 if none), from one read.

        The log is replayed in Python where it can be; otherwise Delta reads them from the snapshot's
        state (a state reconstruction: Spark jobs, once per snapshot). Not read inside the
        commit's transaction: callers must not rely on Delta to detect a concurrent commit of the
        same app id."""
        snap = self._snapshot()
        if snap is not None and "delta.setTransactionRetentionDuration" not in snap.configuration:
            return {a: snap.txns.get(a, -1) for a in app_ids}
        txn = self._log.startTransaction()
        return {a: int(txn.txnVersion(a)) for a in app_ids}

    # ------------------------------------------------------------ writing

    def commit(self, *, remove: Sequence[FileEntry] = (), add: Sequence[str] = (),
               read_partitions: Sequence[str] = (), app_versions: Mapping[str, int] | None = None,
               user_metadata: str | None = None,
               untouched_since: tuple[int, Sequence[Mapping[str, str]]] | None = None,
               check: Callable[[], None] | None = None, known_version: int | None = None) -> int | None:
        """One Delta transaction: remove files, add files (``add`` action JSON), set app versions.

        ``read_partitions`` are SQL predicates recorded as read: any concurrent
        commit adding files there makes this one fail. ``untouched_since``
        = (version, partitions): fail with :class:`StaleFilesError` if a commit
        after ``version`` touched those partitions. ``check`` runs once the transaction has
        taken its snapshot, before anything is committed (raise to abort): what it finds
        absent is then either absent at the commit or committed after the snapshot, where
        Delta's conflict check sees it. Returns the new version. ``known_version``: the newest
        version the caller knows of (its view of the table); if the snapshot this JVM holds is
        that version, the transaction reads it instead of listing the log for newer versions
        first (on an object store a LIST and a ZooKeeper read per commit). A commit another
        process made since is then found by Delta's conflict check at commit time (the attempt
        at the taken version fails, the winners are checked against what this transaction read,
        and it goes on at the next version), as for any commit racing another.
        Raises whatever Delta raises (conflicts are translated by the caller).
        """
        held = self._log.unsafeVolatileSnapshot() if known_version is not None else None
        at: int | None = None  # the transaction's snapshot version, when known without asking
        if held is not None and int(held.version()) == known_version:
            txn = self._log.startTransaction(self._d.none, self._d.some(held))
            at = known_version
        else:
            txn = self._log.startTransaction()
        if check is not None:
            check()
        if untouched_since is not None:
            v = self._touched(txn, *untouched_since, upto=at)
            if v is not None:
                raise StaleFilesError(f"commit {v} of {self.path} changed partitions this writer holds images of")
        if read_partitions:
            # (partitionOnly=True, shouldRewriteFilter=True): Delta must rewrite the parsed
            # predicate onto ``partitionValues`` itself. Unrewritten, its conflict check (run only
            # when another commit landed after this snapshot, in any partition) evaluated it over
            # the winner's add actions and failed with an AnalysisException instead of either
            # committing or raising ConcurrentAppendException (test_deltalog, "racing").
            txn.trackReadPredicates(self._preds(read_partitions), True, True)
        now = int(time.time() * 1000)
        actions = []
        if remove:
            old = [self._from_json(f.action_json) for f in remove]
            txn.trackFilesRead(self._seq(old))
            actions += [a.removeWithTimestamp(now, True) for a in old]
        actions += [self._from_json(a) for a in add]
        for app, ver in (app_versions or {}).items():
            actions.append(self._d.action.fromJson(json.dumps(
                {"txn": {"appId": app, "version": int(ver), "lastUpdated": now}})))
        version = int(txn.commit(self._seq(actions), self._operation(bool(remove), read_partitions, user_metadata)))
        note_commit(self.spark, self.path, version)  # its log checkpoint, if due: in the background
        return version


def decode_path(rel: str) -> str:
    """A log path (URL-encoded) as a path below the table folder."""
    return unquote(rel)


def partition_file_name(computation: str, interval: int, tag: str) -> str:
    """A new file's path below the rows table, in its partition's folder (Hive layout, as Spark writes)."""
    import uuid

    return f"computation={computation}/interval={interval}/part-{uuid.uuid4().hex}-{tag}.snappy.parquet"


def write_file(table: Any, root: TableFiles, rel: str) -> int:
    """Write ``table`` as Parquet to ``rel`` below the table folder ``root``; returns the file's
    size. The file is complete when this returns and invisible to readers until a commit adds it."""
    # dictionary pages only for the low-cardinality columns: on unique strings (keys, record ids)
    # pyarrow builds a dictionary and then falls back, a third of the write time for nothing
    names = set(table.schema.names)
    return root.write_parquet(table, rel, compression="snappy", use_dictionary=[c for c in _DICT_COLUMNS if c in names],
                              write_statistics=_stats_columns(table.schema))


def _stats_columns(schema: Any) -> list[str]:
    """The columns whose Parquet statistics are written: the flat non-binary ones (key, sequencer,
    times...; a reader's filter on them skips row groups). Nothing reads the min/max of the state's
    bytes or of the timers' and record ids' lists, and computing them cost ~10 % of an ids file's write.

    >>> import pyarrow as pa
    >>> _stats_columns(pa.schema([("key", pa.string()), ("state", pa.binary()), ("sequencer", pa.int64()),
    ...                           ("record_ids", pa.list_(pa.string()))]))
    ['key', 'sequencer']
    """
    import pyarrow as pa

    return [f.name for f in schema
            if not (pa.types.is_nested(f.type) or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type))]


_DICT_COLUMNS = ("codec", "commit_id", "stream", "producer", "computation")
