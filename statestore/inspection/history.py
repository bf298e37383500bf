"""A key's versions (or every key's), read from the rows table's Delta log without Spark, from
version 0 or the oldest checkpoint every later commit follows (docs/history.md, "How history is read")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ..delta.checkpoints import CHECKPOINT_NAME, checkpoint_actions, newest_checkpoint
from ..delta.deletionvectors import deleted_rows
from ..delta.log import _commit_versions, batch_metas, damaged_entry, user_metadata
from ..delta.storefs import TableFiles
from ..delta.txn import decode_path
from ..exceptions import (
    ConfigError,
    KeyNeverSeenError,
    NotAStoreError,
    StoreDamagedError,
    UnknownComputationError,
    VersionNotFoundError,
)
from ..layout import StoreLayout
from ..rowtable.rows import IDS_KEY_PREFIX, KeyRow, is_user_key

__all__ = ["Commit", "Change", "History", "walk_history", "key_history", "store_key_history", "HISTORY_COLUMNS"]

_STAMPS = ("commit_id", "updated_ms", "sequencer")


@dataclass(frozen=True)
class Commit:
    """One commit of the rows table (time as Delta's time travel orders them) and deltawheel's metadata."""

    version: int
    timestamp_ms: int
    operation: str | None
    meta: Mapping[str, Any]

    @property
    def writer(self) -> str | None:
        """The job instance that committed it (None: not a deltawheel commit, e.g. the table's creation)."""
        w = self.meta.get("writer")
        return None if w is None else str(w)

    def of_interval(self, interval: str) -> Commit:
        """This commit as the batch that wrote ``interval`` recorded it: of a group commit's batches
        (``delta/group.py``), the one whose sequencers name it; any other commit itself."""
        if self.meta.get("kind") != "group":
            return self
        batch = next((b for b in batch_metas(self.meta) if str(interval) in (b.get("sequencers") or {})), None)
        return self if batch is None else Commit(self.version, self.timestamp_ms, self.operation, batch)


@dataclass(frozen=True, kw_only=True)
class Change:
    """A key's new row (``delete``: None) in a commit; ``ids_apart``: its record ids in ids files then."""

    commit: Commit
    computation: str
    key: str
    change: str
    row: KeyRow | None
    ids_apart: int = 0

    @property
    def n_record_ids(self) -> int:
        """The record ids the store held for the key at this version, in its row and apart from it."""
        return (0 if self.row is None else len(self.row.record_ids)) + self.ids_apart


@dataclass(frozen=True)
class History:
    """A key's changes, newest first, and the oldest version the log still holds."""

    computation: str
    key: str
    changes: tuple[Change, ...]
    first_version: int
    latest_version: int


class _Table:
    """Reads of the rows table's data files, each file's key column read once."""

    def __init__(self, files: TableFiles) -> None:
        self.files = files
        self._keys: dict[str, Any] = {}
        self._dvs: dict[tuple[str, str], frozenset[int]] = {}

    def _file(self, path: str) -> Any:
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(self.files.path(decode_path(path)), filesystem=self.files.fs)
        except FileNotFoundError:
            raise self._vacuumed(f"the data file {path}") from None

    def _key_column(self, path: str) -> list[str]:
        """The ``key`` column of a file (read once while the file is live)."""
        keys: list[str] | None = self._keys.get(path)
        if keys is None:
            keys = self._keys[path] = self._file(path).read(columns=["key"]).column("key").to_pylist()
        return keys

    def places(self, add: Mapping[str, Any], wanted: frozenset[str] | None) -> dict[str, int]:
        """key -> row index of the live rows of ``add``'s file (only ``wanted`` keys; None: all)."""
        keys = self._key_column(str(add["path"]))
        gone = self._gone(add)
        return {k: i for i, k in enumerate(keys)
                if is_user_key(k) and (wanted is None or k in wanted) and i not in gone}

    def ids_apart(self, add: Mapping[str, Any], wanted: frozenset[str] | None) -> dict[str, int]:
        """user key -> record ids the live ids rows of ``add``'s file hold for it (``wanted``; None: all)."""
        import pyarrow.compute as pc

        path = str(add["path"])
        keys = self._key_column(path)
        cut = len(IDS_KEY_PREFIX)
        at = [i for i, k in enumerate(keys)
              if k.startswith(IDS_KEY_PREFIX) and (wanted is None or k[cut:] in wanted)]
        if at:
            gone = self._gone(add)
            at = [i for i in at if i not in gone]
        if not at:
            return {}
        f = self._file(path)
        schema = f.schema
        # the ids' seen_ms leaf gives the lists' lengths without reading the record ids' text
        leaf = next((c.path for c in (schema.column(j) for j in range(len(schema)))
                     if c.path.startswith("record_ids.") and c.path.endswith(".seen_ms")), "record_ids")
        lengths = pc.fill_null(pc.list_value_length(f.read(columns=[leaf]).column("record_ids")), 0).to_pylist()
        held: dict[str, int] = {}
        for i in at:
            if lengths[i]:
                held[keys[i][cut:]] = held.get(keys[i][cut:], 0) + int(lengths[i])
        return held

    def _gone(self, add: Mapping[str, Any]) -> frozenset[int]:
        """The row indexes of ``add``'s file its deletion vector marks deleted (none without one)."""
        path = str(add["path"])
        dv = add.get("deletionVector")
        if not dv:
            return frozenset()
        dv_id = json.dumps(dv, sort_keys=True)
        got = self._dvs.get((path, dv_id))
        if got is None:
            try:
                got = self._dvs[(path, dv_id)] = deleted_rows(self.files, dv)
            except StoreDamagedError as exc:
                if dv.get("storageType") != "u" or not isinstance(exc.__cause__, FileNotFoundError):
                    raise
                # a later commit's cumulative vector replaced this file, and VACUUM removed it
                raise self._vacuumed(f"the deletion vector file of {path}") from None
        return got

    def _vacuumed(self, what: str) -> VersionNotFoundError:
        return VersionNotFoundError(
            f"{what} of an old version of {self.files.root} is gone (vacuumed: deltawheel gc --vacuum-retain-hours): "
            "the versions before the vacuum can no longer be read. Read the history of a store whose old files "
            "are kept, or raise the retention before the next gc")

    def forget(self, live: set[str]) -> None:
        """Drop what was read of files no longer live (a history of every key reads them all)."""
        self._keys = {p: keys for p, keys in self._keys.items() if p in live}

    def rows(self, path: str, indexes: list[int], *, columns: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        """The rows at ``indexes`` of a file (only ``columns``: None, every column)."""
        import pyarrow as pa

        table = self._file(path).read(columns=list(columns) if columns else None)
        return table.take(pa.array(indexes, pa.int64())).to_pylist()  # type: ignore[no-any-return]


def _log(files: TableFiles) -> tuple[TableFiles, list[str], dict[str, int]]:
    log = files.sub("_delta_log")
    listed = log.list_files()
    if listed is None:
        raise NotAStoreError(f"{files.root} has no Delta log: not a deltawheel store's rows table "
                             "(pass the store's folder, the one holding rows/ and _meta/)")
    return log, [n for n, _s, _m in listed], {n: m // 1_000_000 for n, _s, m in listed}


def _start(log: TableFiles, names: list[str]) -> tuple[int, list[tuple[str, dict[str, Any]]], list[int]]:
    """(the version history starts at, the actions of its checkpoint or none, the JSON commits after it)."""
    versions = _commit_versions(names)
    if versions and versions[0] == 0:
        return -1, [], versions
    if not versions:
        raise StoreDamagedError(f"{log.root} holds no commit; the rows table is damaged (docs/store-damage.md)")
    by_version: dict[int, list[str]] = {}
    for n in names:
        m = CHECKPOINT_NAME.match(n)
        if m and int(m.group(1)) >= versions[0] - 1:
            by_version.setdefault(int(m.group(1)), []).append(n)
    for v in sorted(by_version):
        cp, usable = newest_checkpoint(by_version[v])
        if cp is not None and usable:
            return cp.version, list(checkpoint_actions(log, cp)), [x for x in versions if x > cp.version]
    raise StoreDamagedError(
        f"{log.root}: the oldest commits were cleaned up and no checkpoint is followed by every commit "
        "after it, so no version can be rebuilt from the log (docs/store-damage.md)")


def _commit_facts(version: int, lines: list[str], file: str, mtime_ms: int) -> tuple[Commit, list[Any]]:
    info: dict[str, Any] = {}
    actions = []
    for line in lines:
        if not line.strip():
            continue
        try:
            act = json.loads(line)
        except ValueError as exc:
            raise damaged_entry(file, exc) from exc
        if "commitInfo" in act:
            info = act["commitInfo"]
        elif "add" in act or "remove" in act:
            actions.append(act)
    ts = int(info.get("inCommitTimestamp") or mtime_ms or info.get("timestamp") or 0)
    return Commit(version, ts, info.get("operation"), user_metadata(info.get("userMetadata")) or {}), actions


class _Walk:
    """The live files and each key's last row while the log is replayed; :meth:`apply` per commit."""

    def __init__(self, rows: TableFiles, computation: str | None, keys: frozenset[str] | None) -> None:
        self.table = _Table(rows)
        self.computation, self.keys = computation, keys
        self.live: dict[str, dict[str, Any]] = {}
        # (computation, interval) -> key -> (file path, row index); key -> its last row's stamps and row
        self.where: dict[tuple[str, str], dict[str, tuple[str, int]]] = {}
        self.last: dict[tuple[str, str], tuple[Any, ...]] = {}
        # record ids held apart: per live file, user key -> count; per (computation, key), the sum
        self.apart_of: dict[str, tuple[str, dict[str, int]]] = {}
        self.apart: dict[tuple[str, str], int] = {}

    def part(self, add: Mapping[str, Any]) -> tuple[str, str] | None:
        pv = add.get("partitionValues") or {}
        c = pv.get("computation")
        if c is None or (self.computation is not None and c != self.computation):
            return None
        return (c, str(pv.get("interval")))

    def held_apart(self, path: str, add: Mapping[str, Any] | None) -> None:
        """Take off what the file ``path`` held apart, and count what ``add`` (its new entry) holds."""
        old = self.apart_of.pop(path, None)
        if old is not None:
            for k, n in old[1].items():
                if left := self.apart.pop((old[0], k)) - n:
                    self.apart[(old[0], k)] = left
        p = None if add is None else self.part(add)
        if add is None or p is None:
            return
        got = self.table.ids_apart(add, self.keys)
        if got:
            self.apart_of[path] = (p[0], got)
            for k, n in got.items():
                self.apart[(p[0], k)] = self.apart.get((p[0], k), 0) + n

    def _touched(self, actions: list[Any]) -> set[tuple[str, str]]:
        """Apply the removes, then the adds; the partitions they touched."""
        touched: set[tuple[str, str]] = set()
        for act in actions:
            if "remove" in act:
                gone = self.live.pop(str(act["remove"]["path"]), None)
                self.held_apart(str(act["remove"]["path"]), None)
                p = self.part(gone or act["remove"])
                if p is not None:
                    touched.add(p)
        for act in actions:
            if "add" in act:
                add = act["add"]
                self.live[str(add["path"])] = add
                self.held_apart(str(add["path"]), add)
                p = self.part(add)
                if p is not None:
                    touched.add(p)
        return touched

    def apply(self, commit: Commit, actions: list[Any]) -> Iterator[Change]:
        for p in sorted(self._touched(actions)):
            yield from self._partition(commit.of_interval(p[1]), p)
        self.table.forget(set(self.live))

    def _partition(self, commit: Commit, p: tuple[str, str]) -> Iterator[Change]:
        """The changes of partition ``p``: keys gone from every interval, rows moved and changed."""
        now: dict[str, tuple[str, int]] = {}
        for path, add in self.live.items():
            if self.part(add) == p:
                now.update({k: (path, i) for k, i in self.table.places(add, self.keys).items()})
        before = self.where.get(p, {})
        self.where[p] = now
        moved: dict[str, list[tuple[str, int]]] = {}
        for k, place in now.items():
            if before.get(k) != place:
                moved.setdefault(place[0], []).append((k, place[1]))
        for k in sorted(set(before) - set(now)):
            if (p[0], k) in self.last and not any(k in self.where.get(q, {}) for q in self.where if q[0] == p[0]):
                del self.last[(p[0], k)]
                yield Change(commit=commit, computation=p[0], key=k, change="delete", row=None,
                             ids_apart=self.apart.get((p[0], k), 0))
        for path, found in sorted(moved.items()):
            yield from self._moved(commit, p, path, found)

    def _moved(self, commit: Commit, p: tuple[str, str], path: str, found: list[tuple[str, int]]
               ) -> Iterator[Change]:
        """Keys whose row now lives at ``path``: an insert or update where the row changed."""
        stamps = self.table.rows(path, [i for _k, i in found], columns=_STAMPS)
        changed = [(k, i) for (k, i), s in zip(found, stamps, strict=True)
                   if self.last.get((p[0], k), (None,))[0] != tuple(s[c] for c in _STAMPS)]
        if not changed:
            return
        full = self.table.rows(path, [i for _k, i in changed])
        for (k, _i), r in zip(changed, full, strict=True):
            row = KeyRow.from_row({**r, "computation": p[0], "interval": int(p[1])})
            prev = self.last.get((p[0], k))
            self.last[(p[0], k)] = (tuple(r[c] for c in _STAMPS), row)
            if prev is None or prev[1] != row:
                yield Change(commit=commit, computation=p[0], key=k,
                             change="insert" if prev is None else "update", row=row,
                             ids_apart=self.apart.get((p[0], k), 0))


def walk_history(rows: TableFiles, *, computation: str | None = None, keys: frozenset[str] | None = None,
                 to_version: int | None = None) -> Iterator[Change]:
    """Every change up to ``to_version``, oldest first, the first version's rows as ``insert`` (None: all).

    Raises:
        NotAStoreError: ``rows`` has no Delta log.
        StoreDamagedError: a log entry or deletion vector cannot be read, or no version can be rebuilt.
    """
    log, names, mtimes = _log(rows)
    start, cp_actions, versions = _start(log, names)
    walk = _Walk(rows, computation, keys)
    if cp_actions:
        commit = Commit(start, mtimes.get(f"{start:020d}.json", 0), "CHECKPOINT", {})
        yield from walk.apply(commit, [{"add": a} for kind, a in cp_actions if kind == "add"])
    prev_ts = 0
    for v in versions:
        if to_version is not None and v > to_version:
            break
        name = f"{v:020d}.json"
        text = log.read_text(name)
        if text is None:
            raise StoreDamagedError(f"{log.path(name)} went missing while the history was read (log cleanup); "
                                    "read it again")
        commit, actions = _commit_facts(v, text.splitlines(), log.path(name), mtimes.get(name, 0))
        if commit.timestamp_ms <= prev_ts:  # Delta's time travel keeps commit times increasing likewise
            commit = Commit(v, prev_ts + 1, commit.operation, commit.meta)
        prev_ts = commit.timestamp_ms
        yield from walk.apply(commit, actions)


def computations(rows: TableFiles) -> set[str]:
    """The computations the rows table's log ever named in a partition (an add or a remove)."""
    log, names, _m = _log(rows)
    bodies = []
    for v in _commit_versions(names):
        for line in (log.read_text(f"{v:020d}.json") or "").splitlines():
            if '"partitionValues"' in line:
                act = json.loads(line)
                bodies.append(act.get("add") or act.get("remove") or {})
    bodies += [a for kind, a in _start(log, names)[1] if kind == "add"]
    return {str(c) for b in bodies if (c := (b.get("partitionValues") or {}).get("computation"))}


def key_history(rows: TableFiles, *, computation: str, key: str, limit: int | None = None) -> History:
    """``key``'s changes in ``computation``, newest first (at most ``limit``).

    Raises:
        NotAStoreError: no rows table there.
        VersionNotFoundError: a data file of an old version was vacuumed.
        UnknownComputationError: no commit still in the log names ``computation``.
        KeyNeverSeenError: ``computation`` never held ``key`` in a version still in the log.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    changes = list(walk_history(rows, computation=computation, keys=frozenset({key})))
    log, names, _m = _log(rows)
    versions = _commit_versions(names)
    start, _cp, _after = _start(log, names)
    if not changes:
        known = computations(rows)
        if computation not in known:
            raise UnknownComputationError(
                f"the store's rows table holds no computation {computation!r} in any version still in its log; "
                f"it holds: {', '.join(sorted(known)) or 'none'}. Check --computation")
        raise KeyNeverSeenError(
            f"computation {computation!r} never held key {key!r} in versions {max(start, 0)}-{versions[-1]} of "
            "the rows table; check --key (keys are case-sensitive; deltawheel sql \"SELECT key FROM state\" lists them)")
    newest = changes[::-1]
    return History(computation, key, tuple(newest[:limit] if limit else newest), max(start, 0), versions[-1])


def store_key_history(layout: StoreLayout, *, computation: str, key: str, limit: int | None = None) -> History:
    """:func:`key_history` of a local, ``file:`` or ``s3a://`` store (endpoint and keys from the environment).

    Raises:
        ConfigError: ``limit`` < 1, or a store of another scheme.
        NotAStoreError: no rows table there.
        UnknownComputationError: the store has no rows table of ``computation``.
        ObjectStoreError and its subclasses: the object store failed the read.
    """
    from ..objectstore.errors import check_bucket, pyarrow_error
    from ..objectstore.s3a import files_from_env

    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {limit}; leave it out for every version")
    files = files_from_env(layout.rows_of(computation))
    if files is None:
        raise ConfigError(f"--store {layout.root}: history reads local folders, file: and s3a:// stores only; for "
                          "another scheme, query the state_history view (deltawheel sql)")
    try:
        listed = files.listdir("_delta_log")
    except OSError as exc:  # the object store did not answer, or refused (pyarrow's error)
        raise pyarrow_error(exc, layout.root) from exc
    if listed is None and not files.is_local:
        check_bucket(files, layout.root)
    if listed is None:
        first = files_from_env(layout.rows)
        if first is None or first.listdir("_delta_log") is None:
            raise NotAStoreError(f"--store {layout.root} holds no rows table ({layout.rows}/_delta_log is missing): "
                                 "pass the folder of a store a pipeline has run on")
        raise UnknownComputationError(
            f"the store has no rows table of computation {computation!r} ({layout.rows_of(computation)}): it never "
            f"committed; it holds: {', '.join(_computations_of(layout)) or 'none'}. Check --computation")
    try:
        return key_history(files, computation=computation, key=key, limit=limit)
    except OSError as exc:
        if files.is_local:
            raise
        raise pyarrow_error(exc, layout.root) from exc


def _computations_of(layout: StoreLayout) -> list[str]:
    """The computations with a rows table in ``layout``, read without Spark (sorted)."""
    from pyarrow import fs as pafs

    from ..objectstore.s3a import files_from_env

    root = files_from_env(layout.computations_root)
    if root is None:
        return []
    infos = root.fs.get_file_info(pafs.FileSelector(root.path(""), allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory
                  and root.fs.get_file_info(root.path(f"{i.base_name}/rows/_delta_log")).type
                  == pafs.FileType.Directory)


#: the columns of the ``state_history`` view (:mod:`.sqlviews`) before decoding
HISTORY_COLUMNS = (
    ("computation", "string"), ("interval", "int"), ("key", "string"), ("version", "bigint"),
    ("commit_time_ms", "bigint"), ("change", "string"), ("writer", "string"), ("kind", "string"),
    ("codec", "string"), ("state", "binary"),
    ("timers", "array<struct<tag:string,domain:string,time_ms:bigint>>"),
    ("n_record_ids", "int"),
    ("pending", "array<struct<production_id:string,stream:string,key:string,codec:string,value:binary,"
                "timestamp_ms:bigint>>"),
    ("watermark_hold_ms", "bigint"), ("sequencer", "bigint"), ("commit_id", "string"), ("updated_ms", "bigint"),
)

_N_IDS = [n for n, _t in HISTORY_COLUMNS].index("n_record_ids")


def history_tuple(c: Change) -> tuple[Any, ...]:
    """A change as a row of :data:`HISTORY_COLUMNS`."""
    r = c.row
    kind = c.commit.meta.get("kind") or c.commit.operation
    head = (c.computation, None if r is None else r.interval, c.key, c.commit.version, c.commit.timestamp_ms,
            c.change, c.commit.writer, kind)
    if r is None:  # a deleted row: only the ids still held for the key
        tail: list[Any] = [None] * (len(HISTORY_COLUMNS) - len(head))
        tail[_N_IDS - len(head)] = c.n_record_ids
        return head + tuple(tail)
    return head + (
        r.codec, r.state, [t.to_row() for t in r.timers], c.n_record_ids,
        [{"production_id": p.production_id, "stream": p.stream, "key": p.key, "codec": p.codec,
          "value": p.value, "timestamp_ms": p.timestamp_ms} for p in r.pending],
        r.watermark_hold_ms, r.sequencer, r.commit_id, r.updated_ms)
