"""Delta transactions at the file level through Delta's own transaction API: whole files removed and
added, a read predicate per partition, a ``SetTransaction`` per producing interval of a delivery."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import quote, unquote

from ..exceptions import StaleFilesError
from .jvm import DeltaClasses, delta_classes, jsession, per_owner
from .jvm import jvm as jvm_of
from .log import (
    LogSnapshot,
    commit_infos,
    json_commit_versions,
    own_snapshot,
    partition_changes,
    read_snapshot,
)
from .maintenance import note_commit
from .storefs import TableFiles, table_files

__all__ = ["CommitRequest", "FileEntry", "TableLog", "StaleFilesError", "new_add", "delta_path", "decode_path",
           "write_file", "partition_file_name"]


@dataclass(frozen=True, kw_only=True)
class FileEntry:
    """One live data file of a table (an ``add`` action)."""

    path: str  # relative to the table root, URL-encoded
    partition_values: tuple[tuple[str, str], ...]
    size: int
    has_deletion_vector: bool
    action_json: str
    added_at: int | None = None  # the version of the commit that added it (None: not known)

    def part(self, name: str) -> str | None:
        """The file's value of partition column ``name`` (None: not partitioned by it)."""
        return dict(self.partition_values).get(name)


# what java.net.URI leaves unquoted in a path (besides letters, digits and ``_.-~``)
_URI_PATH_SAFE = "/!*'();:@&=+$,"


def delta_path(rel_path: str) -> str:
    """``rel_path`` as Delta writes it (Hadoop's ``Path.toUri()``), or VACUUM would delete the live file."""
    return quote(rel_path, safe=_URI_PATH_SAFE)


def new_add(rel_path: str, partition_values: Mapping[str, str], size: int, num_records: int,
            tags: Mapping[str, str] | None = None) -> str:
    """The JSON of an ``add`` action for a freshly written file (``rel_path`` not yet encoded)."""
    return json.dumps({"add": {
        "path": delta_path(rel_path), "partitionValues": dict(partition_values), "size": int(size),
        "modificationTime": int(time.time() * 1000), "dataChange": True,
        "stats": json.dumps({"numRecords": int(num_records)}), **({"tags": dict(tags)} if tags else {})}})


def _memo(cache: dict[str, Any], key: str, make: Callable[[str], Any]) -> Any:
    """``make(key)``, kept in ``cache`` (emptied when it passes 1,024 entries)."""
    value = cache.get(key)
    if value is None:
        if len(cache) > 1024:
            cache.clear()
        value = cache[key] = make(key)
    return value


@dataclass
class _Memo:
    """The JVM objects one JVM's table logs share (see :func:`_memo`)."""

    parsed: dict[str, Any] = field(default_factory=dict)
    seqs: dict[str, Any] = field(default_factory=dict)
    somes: dict[str, Any] = field(default_factory=dict)
    actions: dict[str, Any] = field(default_factory=dict)


class TableLog:
    """File-level reads and commits of one Delta table (driver side); the JVM is reached on first use."""

    def __init__(self, spark: Any, path: str) -> None:
        self.spark = spark
        self.path = path
        self._jvm = jvm_of(spark)
        self._files = table_files(spark, path)
        self._jlog: Any = None
        # made once per JVM and shared by its tables' logs (a TableLog is often made per commit):
        # predicate SQL -> parsed expression; predicates (one a line) -> the Seq of them parsed; the
        # operation's OR of predicates -> its Some; action JSON -> Delta action object
        memo = per_owner("txn-memo", self._jvm, _Memo)
        self._parsed, self._seqs, self._somes, self._actions = memo.parsed, memo.seqs, memo.somes, memo.actions

    @property
    def _d(self) -> DeltaClasses:
        return delta_classes(self._jvm)

    @property
    def _log(self) -> Any:
        if self._jlog is None:
            self._jlog = self._d.delta_log.forTable(jsession(self.spark), self.path)
        return self._jlog

    def version_now(self) -> int:
        """The table's newest version, the JVM's snapshot of it brought up to date (-1: no table)."""
        return int(self._log.startTransaction().snapshot().version())

    def _seq(self, items: Sequence[Any]) -> Any:
        d = self._d
        lst = d.array_list()
        for item in items:
            lst.add(item)
        return d.as_scala(lst).toSeq()

    def _from_json(self, action_json: str) -> Any:
        return _memo(self._actions, action_json, self._d.action.fromJson)

    def _pred(self, sql: str) -> Any:
        return _memo(self._parsed, sql, lambda q: jsession(self.spark).sessionState().sqlParser().parseExpression(q))

    def _preds(self, predicates: Sequence[str]) -> Any:
        return _memo(self._seqs, "\n".join(predicates), lambda _k: self._seq([self._pred(p) for p in predicates]))

    def _operation(self, overwrite: bool, predicates: Sequence[str] = (), user_metadata: str | None = None) -> Any:
        """A Delta ``WRITE`` carrying ``user_metadata`` (``ManualUpdate`` costs a Spark job; the session's
        setting is shared by committers)."""
        d = self._d
        none = d.none
        pred = _memo(self._somes, " OR ".join(f"({p})" for p in predicates), d.some) if predicates else none
        meta = d.some(user_metadata) if user_metadata is not None else none
        return d.write_op(d.modes[overwrite], none, pred, meta, *([none] * (d.write_arity - 4)))

    def files(self, predicate_sql: str, *, where: Callable[[Mapping[str, str]], bool] | None = None,
              own: str | None = None) -> tuple[int, list[FileEntry]]:
        """(snapshot version, live files matching a partition predicate; ``where``: it in Python).

        ``own``: a writer whose own commit is the newest known takes the kept snapshot without listing
        the log (:func:`.log.own_snapshot`)."""
        if where is not None:
            snap = (own_snapshot(self._files, own) if own is not None and self._files is not None else None
                    ) or self._snapshot()
            if snap is not None:
                entries = []
                for a in snap.adds:
                    pv = {str(k): str(v) for k, v in (a.get("partitionValues") or {}).items()}
                    if where(pv):
                        path = str(a["path"])
                        entries.append(FileEntry(
                            path=path, partition_values=tuple(sorted(pv.items())), size=int(a["size"]),
                            has_deletion_vector=bool(a.get("deletionVector")),
                            action_json=json.dumps({"add": a}), added_at=snap.added_at.get(path)))
                return snap.version, entries
        txn = self._log.startTransaction()
        cc = self._d.cc
        adds = cc.asJava(txn.filterFiles(self._seq([self._pred(predicate_sql)]), False))
        out = []
        for a in adds:
            pv = cc.asJava(a.partitionValues())
            out.append(FileEntry(path=str(a.path()),
                                 partition_values=tuple(sorted((str(k), str(v)) for k, v in pv.items())),
                                 size=int(a.size()), has_deletion_vector=a.deletionVector() is not None,
                                 action_json=str(a.json())))
        return int(txn.snapshot().version()), out

    def _snapshot(self) -> LogSnapshot | None:
        return None if self._files is None else read_snapshot(self._files)

    def _touched(self, txn: Any, version: int, partitions: Iterable[Mapping[str, str]], *,
                 upto: int | None = None) -> int | None:
        """The first commit in (version, txn's snapshot] that touched ``partitions`` or the metadata, by the
        JVM's walk (a py4j call per action): :meth:`commit` reads them in Python where it can."""
        wanted = _partition_keys(partitions)
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

    def commits_after(self, version: int) -> list[tuple[int, dict[str, Any]]] | None:
        """(version, ``commitInfo``) of each JSON commit after ``version``, oldest first (None: not readable
        here, ask Delta)."""
        return None if self._files is None else commit_infos(self._files, after=version)

    def table_id(self) -> str:
        """The table's Delta id (``metaData.id``, fixed when the table was created)."""
        snap = self._snapshot()
        if snap is not None and snap.table_id:
            return snap.table_id
        return str(self._log.startTransaction().metadata().id())

    def txn_version(self, app_id: str) -> int:
        """The version last recorded for ``app_id`` (-1 if none); see :meth:`txn_versions`."""
        return self.txn_versions([app_id])[app_id]

    def txn_versions(self, app_ids: Iterable[str]) -> dict[str, int]:
        """The version last recorded for each of ``app_ids`` (-1 if none), not inside a transaction."""
        snap = self._snapshot()
        if snap is not None and "delta.setTransactionRetentionDuration" not in snap.configuration:
            return {a: snap.txns.get(a, -1) for a in app_ids}
        txn = self._log.startTransaction()
        return {a: int(txn.txnVersion(a)) for a in app_ids}

    def commit(self, *, remove: Sequence[FileEntry] = (), add: Sequence[str] = (),
               read_partitions: Sequence[str] = (), app_versions: Mapping[str, int] | None = None,
               user_metadata: str | None = None,
               untouched_since: tuple[int, Sequence[Mapping[str, str]]] | None = None,
               check: Callable[[], None] | None = None, known_version: int | None = None) -> int | None:
        """One Delta transaction: remove files, add files (``add`` action JSON), set app versions.

        ``read_partitions``: SQL predicates recorded as read; ``untouched_since`` = (version, partitions):
        :class:`StaleFilesError` if a later commit touched them; ``check`` runs once the snapshot is taken
        (raise to abort); ``known_version``: the JVM's snapshot at it is used without listing the log.
        Returns the new version; raises whatever Delta raises."""
        held = self._log.unsafeVolatileSnapshot() if known_version is not None else None
        at: int | None = None
        stale: int | None = None  # a commit since the writer's read that touched its partitions
        if held is not None and int(held.version()) == known_version:
            txn = self._log.startTransaction(self._d.none, self._d.some(held))
            at = known_version
        else:
            # the commits since the writer's read are read in Python while the JVM lists the log
            files, since = self._files, untouched_since
            wanted = set() if since is None else _partition_keys(since[1])
            early = None if since is None or files is None else _READS.submit(_changes_listed, files, since[0])
            txn = self._log.startTransaction()
            if early is not None and files is not None and since is not None:
                changes = _changes_within(early.result(), files, since[0], int(txn.snapshot().version()))
                first = None if changes is None else next(
                    (v for v, touched in changes if touched is None or touched & wanted), -1)
                if first is not None:  # checked here
                    stale, untouched_since = (first if first >= 0 else None), None
        if check is not None:
            check()
        if untouched_since is not None:
            stale = self._touched(txn, *untouched_since, upto=at)
        if stale is not None:
            raise StaleFilesError(f"commit {stale} of {self.path} changed partitions this writer holds images of")
        now = int(time.time() * 1000)
        app_actions = [json.dumps({"txn": {"appId": app, "version": int(ver), "lastUpdated": now}})
                       for app, ver in (app_versions or {}).items()]
        return self._finish(txn, [f.action_json for f in remove], [*add, *app_actions], read_partitions,
                            user_metadata, now)

    def _finish(self, txn: Any, removes: Sequence[str], adds: Sequence[str], read_partitions: Sequence[str],
                user_metadata: str | None, now: int) -> int:
        """Commit ``txn``: files removed (their ``add`` action JSON), actions added, partitions read."""
        operation = self._operation(bool(removes), read_partitions, user_metadata)
        helper = self._d.txn_commit
        if helper is not None:  # one py4j call for what follows (TxnCommit.java)
            version = int(helper.commit(txn, self._preds(read_partitions) if read_partitions else None,
                                        "\n".join(removes), "\n".join(adds), operation, now))
            note_commit(self.spark, self.path, version)
            return version
        if read_partitions:
            # (partitionOnly, shouldRewriteFilter): unrewritten, the conflict check raises AnalysisException
            txn.trackReadPredicates(self._preds(read_partitions), True, True)
        actions = []
        if removes:
            old = [self._from_json(r) for r in removes]
            txn.trackFilesRead(self._seq(old))
            actions += [a.removeWithTimestamp(now, True) for a in old]
        actions += [self._from_json(a) for a in adds]
        version = int(txn.commit(self._seq(actions), operation))
        note_commit(self.spark, self.path, version)
        return version

    def commit_requests(self, requests: Sequence[CommitRequest], *, group_meta: Callable[[list[str]], str],
                        more: Callable[[], Sequence[CommitRequest]] | None = None) -> tuple[int, list[int]]:
        """One version holding the first of ``requests`` (the holder's own) and each other one whose
        partitions no commit since its read touched and no request before it holds (a group commit,
        ``group.py``); returns (the version, the indexes of the requests it holds, the first always).
        ``more``: asked once the snapshot is updated, for the requests queued meanwhile (counted after
        ``requests``). ``group_meta``: the version's ``userMetadata`` from the requests' own. Raises
        :class:`StaleFilesError` if the first request's partitions were touched; whatever Delta raises."""
        files = self._files
        # the commits since the oldest read, read in Python; where they show none past the JVM's snapshot
        # (its own or a group's commit in this JVM) it is used as it is, else brought up to date
        listed = None if files is None else _changes_listed(files, min(r.read_version for r in requests))
        snap = self._log.unsafeVolatileSnapshot()
        if listed is not None and int(snap.version()) >= max(listed[1], *(r.read_version for r in requests)):
            txn = self._log.startTransaction(self._d.none, self._d.some(snap))
        else:
            txn = self._log.startTransaction()  # the newest snapshot: the requests read at different versions
        upto = int(txn.snapshot().version())
        requests = [*requests, *(more() if more is not None else ())]
        low = min(r.read_version for r in requests)
        changes = None if files is None else _changes_within(listed, files, low, upto)
        taken: set[tuple[tuple[str, str], ...]] = set()
        held: list[int] = []
        for i, req in enumerate(requests):
            wanted = _partition_keys(req.partitions)
            if wanted & taken or req.read_version > upto:
                continue
            found = None if changes is None else next(
                (v for v, touched in changes if v > req.read_version and (touched is None or touched & wanted)), -1)
            if found is None:  # not readable here: the JVM's walk
                walked = self._touched(txn, req.read_version, req.partitions, upto=upto)
                found = -1 if walked is None else walked
            if found >= 0:
                if i == 0:
                    raise StaleFilesError(f"commit {found} of {self.path} changed partitions this writer holds "
                                          "images of")
                continue
            held.append(i)
            taken |= wanted
        chosen = [requests[i] for i in held]
        version = self._finish(txn, [r for q in chosen for r in q.removes], [a for q in chosen for a in q.adds],
                               [p for q in chosen for p in q.read_partitions],
                               group_meta([q.user_metadata for q in chosen]) if len(chosen) > 1
                               else chosen[0].user_metadata, int(time.time() * 1000))
        return version, held


@dataclass(frozen=True)
class CommitRequest:
    """One writer's commit as another writer can make it (``group.py``): the ``add`` action JSON of the
    files it removes, the actions it adds, the partition predicates it read, its ``userMetadata``, and the
    version it read its partitions at (each a mapping of partition column to value)."""

    removes: tuple[str, ...]
    adds: tuple[str, ...]
    read_partitions: tuple[str, ...]
    user_metadata: str
    read_version: int
    partitions: tuple[Mapping[str, str], ...]

    def to_bytes(self) -> bytes:
        """The request as :meth:`from_bytes` reads it (compact JSON)."""
        return json.dumps({"removes": self.removes, "adds": self.adds, "read": self.read_partitions,
                           "meta": self.user_metadata, "version": self.read_version,
                           "partitions": [dict(p) for p in self.partitions]}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> CommitRequest | None:
        """The request in ``data`` (None: not one this deltawheel reads)."""
        try:
            d = json.loads(data)
            return cls(removes=tuple(map(str, d["removes"])), adds=tuple(map(str, d["adds"])),
                       read_partitions=tuple(map(str, d["read"])), user_metadata=str(d["meta"]),
                       read_version=int(d["version"]),
                       partitions=tuple({str(k): str(v) for k, v in p.items()} for p in d["partitions"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


_READS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="deltawheel-touched")


def _partition_keys(partitions: Iterable[Mapping[str, str]]) -> set[tuple[tuple[str, str], ...]]:
    return {tuple(sorted(p.items())) for p in partitions}


_Changes = dict[int, "frozenset[tuple[tuple[str, str], ...]] | None"]


def _changes_listed(files: TableFiles, after: int) -> tuple[int, int, _Changes] | None:
    """(``after``, the newest JSON commit listed, :func:`partition_changes` of each commit between)."""
    versions = json_commit_versions(files)
    newest = max(versions[-1], after) if versions else after
    got = partition_changes(files, after, newest)
    return None if got is None else (after, newest, dict(got))


def _changes_within(listed: tuple[int, int, _Changes] | None, files: TableFiles, after: int, upto: int
                    ) -> list[tuple[int, frozenset[tuple[tuple[str, str], ...]] | None]] | None:
    """:func:`partition_changes` of (``after``, ``upto``] from :func:`_changes_listed`'s answer, the commits
    it did not cover read now (None: one is not readable here)."""
    if listed is None:
        return None
    first, newest, known = listed
    for lo, hi in ((after, min(first, upto)), (max(newest, after), upto)):
        if hi > lo:
            got = partition_changes(files, lo, hi)
            if got is None:
                return None
            known.update(got)
    if any(v not in known for v in range(after + 1, upto + 1)):
        return None
    return [(v, known[v]) for v in range(after + 1, upto + 1)]


def decode_path(rel: str) -> str:
    """A log path (URL-encoded) as a path below the table folder."""
    return unquote(rel)


def partition_file_name(computation: str, interval: int, tag: str) -> str:
    """A new file's path below the rows table, in its partition's folder (Hive layout, as Spark writes)."""
    import uuid

    return f"computation={computation}/interval={interval}/part-{uuid.uuid4().hex}-{tag}.snappy.parquet"


def write_file(table: Any, root: TableFiles, rel: str) -> int:
    """Write ``table`` as Parquet to ``rel`` below ``root``; returns the file's size."""
    # dictionary pages only for the low-cardinality columns
    names = set(table.schema.names)
    return root.write_parquet(table, rel, compression="snappy", use_dictionary=[c for c in _DICT_COLUMNS if c in names],
                              write_statistics=_stats_columns(table.schema))


def _stats_columns(schema: Any) -> list[str]:
    """The columns whose Parquet statistics are written: the flat non-binary ones.

    >>> import pyarrow as pa
    >>> _stats_columns(pa.schema([("key", pa.string()), ("state", pa.binary()), ("sequencer", pa.int64()),
    ...                           ("record_ids", pa.list_(pa.string()))]))
    ['key', 'sequencer']
    """
    import pyarrow as pa

    return [f.name for f in schema
            if not (pa.types.is_nested(f.type) or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type))]


_DICT_COLUMNS = ("codec", "commit_id", "stream", "producer", "computation")
