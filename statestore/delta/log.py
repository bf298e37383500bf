"""The live files of a Delta table, read from its log without Spark (None where it does not fully
understand the log: the caller goes to Delta). docs/architecture-deltalog.md."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..exceptions import StoreDamagedError
from .checkpoints import CHECKPOINT_NAME, UnreadableCheckpoint, checkpoint_actions, newest_checkpoint
from .storefs import TableFiles, local_path

__all__ = ["LogSnapshot", "first_touching", "read_snapshot", "files_of", "log_files", "local_table_exists", "local_path",
           "commit_infos", "commit_info", "commit_info_in", "json_commit_versions", "damaged_entry",
           "DAMAGE_DOC", "newest_commit_info", "user_metadata", "own_snapshot", "note_own_commit", "forget_snapshot",
           "disown_snapshot"]

DAMAGE_DOC = "docs/store-damage.md"


def damaged_entry(file: str, exc: Exception) -> StoreDamagedError:
    """The error for a log entry that does not parse (truncated or corrupt)."""
    return StoreDamagedError(
        f"Delta log entry {file} is truncated or corrupt ({type(exc).__name__}: {exc}); nothing was written. "
        f"Restore that file from a backup of the store, then start again ({DAMAGE_DOC})")


def user_metadata(text: object) -> dict[str, Any] | None:
    """A commit's ``userMetadata`` as a JSON object (None: none, not JSON, or not an object)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def batch_metas(meta: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The batches a commit's ``userMetadata`` records: a group commit's (kind ``group``, ``delta/group.py``)
    each, any other commit itself ([]: none).

    >>> batch_metas({"kind": "group", "batches": [{"commit_id": "a"}, {"commit_id": "b"}]})
    [{'commit_id': 'a'}, {'commit_id': 'b'}]
    >>> batch_metas({"kind": "commit", "commit_id": "a"}), batch_metas(None)
    ([{'kind': 'commit', 'commit_id': 'a'}], [])
    """
    if meta is None:
        return []
    if meta.get("kind") == "group":
        return [dict(b) for b in meta.get("batches") or () if isinstance(b, dict)]
    return [dict(meta)]


def _parse(line: str, file: str) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise damaged_entry(file, exc) from exc


# reader features under which the table's commits are the catalog's (docs/versions.md)
CATALOG_FEATURES = frozenset({"catalogManaged", "catalogOwned-preview"})

_JSON = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True, kw_only=True)
class LogSnapshot:
    """A table's version, live ``add`` actions, configuration and app versions (``txn``)."""

    version: int
    adds: tuple[dict[str, Any], ...]
    configuration: dict[str, str]
    txns: dict[str, int]
    added_at: dict[str, int] = field(default_factory=dict)  # path -> the version that added it
    bounded: frozenset[str] = frozenset()  # paths whose ``added_at`` is a checkpoint's upper bound
    table_id: str | None = None  # ``metaData.id``


def files_of(where: str | TableFiles) -> TableFiles | None:
    """The files of a table or checkpoint folder (None: a remote URI string)."""
    if isinstance(where, TableFiles):
        return where
    root = local_path(where)
    return None if root is None else TableFiles(root)


def log_files(table: str | TableFiles) -> TableFiles | None:
    """The files of ``table``'s ``_delta_log`` folder (a string: a local table only; None: remote)."""
    files = files_of(table)
    return None if files is None else files.sub("_delta_log")


def _log_names(table: str | TableFiles) -> tuple[TableFiles, list[str]] | None:
    log = log_files(table)
    return None if log is None else (log, log.listdir() or [])


def _read_json(log: TableFiles, version: int) -> tuple[str, list[str]] | None:
    text = log.read_text(f"{version:020d}.json")
    return None if text is None else (log.path(f"{version:020d}.json"), text.splitlines())


_CONCURRENT_READS = 8  # JSON commits read at once from an object store


def _read_jsons(log: TableFiles, versions: list[int]) -> list[tuple[str, list[str]] | None]:
    if log.is_local or len(versions) < 2:
        return [_read_json(log, v) for v in versions]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(_CONCURRENT_READS, len(versions)), thread_name_prefix="deltawheel-log") as pool:
        return list(pool.map(lambda v: _read_json(log, v), versions))


def _commit_versions(names: list[str]) -> list[int]:
    return sorted(int(m.group(1)) for n in names if (m := _JSON.match(n)))


def local_table_exists(path: str | TableFiles) -> bool | None:
    """True/False for a table folder (has its first commit or a checkpoint); None if remote (a URI string)."""
    listing = _log_names(path)
    if listing is None:
        return None
    return any(_JSON.match(n) or CHECKPOINT_NAME.match(n) for n in listing[1])


def latest_local_version(path: str | TableFiles) -> int | None:
    """The newest JSON commit version of a table; None if remote (a URI string) or it has no JSON commit."""
    versions = json_commit_versions(path)
    return versions[-1] if versions else None


def _dv_id(dv: dict[str, Any] | None) -> str | None:
    if not dv:
        return None
    uid = f"{dv.get('storageType', '')}{dv.get('pathOrInlineDv', '')}"
    off = dv.get("offset")
    return uid if off is None else f"{uid}@{off}"


class _Replay:
    def __init__(self) -> None:
        self.files: dict[tuple[str, str | None], dict[str, Any]] = {}
        self.config: dict[str, str] = {}
        self.table_id: str | None = None
        self.txns: dict[str, int] = {}
        self.added_at: dict[str, int] = {}
        self.bounded: set[str] = set()
        self.reader_features: set[str] = set()

    def apply(self, kind: str, act: dict[str, Any], version: int, *, checkpoint: bool = False) -> None:
        if kind == "add":
            self.files[(act["path"], _dv_id(act.get("deletionVector")))] = act
            self.added_at[act["path"]] = version
            if checkpoint:
                self.bounded.add(act["path"])
            else:
                self.bounded.discard(act["path"])
        elif kind == "remove":
            self.files.pop((act["path"], _dv_id(act.get("deletionVector"))), None)
        elif kind == "metaData":
            self.config = dict(act.get("configuration") or {})
            self.table_id = act.get("id")
        elif kind == "txn":
            self.txns[str(act["appId"])] = int(act["version"])
        elif kind == "protocol":
            self.reader_features = set(act.get("readerFeatures") or ())

    def copy(self) -> _Replay:
        out = _Replay()
        out.files, out.config, out.table_id = dict(self.files), dict(self.config), self.table_id
        out.txns, out.added_at, out.bounded = dict(self.txns), dict(self.added_at), set(self.bounded)
        out.reader_features = set(self.reader_features)
        return out

    def apply_lines(self, version: int, file: str, lines: list[str]) -> None:
        for line in lines:
            if not line.strip():
                continue
            act = _parse(line, file)
            found = next((k for k in _ACTIONS if k in act), None)
            if found is not None:
                self.apply(found, act[found], version)

    def snapshot(self, version: int) -> LogSnapshot | None:
        """The replayed state at ``version`` (None: a log this module does not handle)."""
        if any(k.startswith("delta.coordinatedCommits") for k in self.config):
            return None
        if self.reader_features & CATALOG_FEATURES:
            return None
        if any(":" in a["path"].split("/", 1)[0] or a["path"].startswith("/") for a in self.files.values()):
            return None  # absolute paths: Delta canonicalises those
        return LogSnapshot(version=version, adds=tuple(self.files.values()), configuration=self.config,
                           txns=self.txns, added_at=self.added_at, bounded=frozenset(self.bounded),
                           table_id=self.table_id)


_ACTIONS = ("add", "remove", "metaData", "txn", "protocol")


@dataclass
class _Kept:
    """A table's replayed log kept between reads (``stamp``: its newest JSON's (size, mtime), None: not
    seen yet; ``writer``: set when the newest commit is that writer's own, applied without reading it)."""

    version: int
    stamp: tuple[int, int] | None
    state: _Replay
    snap: LogSnapshot
    writer: str | None = None


_KEPT: OrderedDict[str, _Kept] = OrderedDict()
_KEPT_LOCK = threading.Lock()
_KEPT_TABLES = 64  # tables whose replayed log is kept (least recently read dropped first)


def _keep(log: TableFiles, kept: _Kept) -> None:
    with _KEPT_LOCK:
        old = _KEPT.get(log.root)
        if old is not None and old.version > kept.version:
            return  # a newer read landed meanwhile
        _KEPT[log.root] = kept
        _KEPT.move_to_end(log.root)
        while len(_KEPT) > _KEPT_TABLES:
            _KEPT.popitem(last=False)


def _kept(log: TableFiles) -> _Kept | None:
    with _KEPT_LOCK:
        return _KEPT.get(log.root)


def forget_snapshot(table: TableFiles) -> None:
    """Drop what is kept of ``table``'s log: the next read lists and replays it."""
    log = log_files(table)
    if log is not None:
        with _KEPT_LOCK:
            _KEPT.pop(log.root, None)


def disown_snapshot(table: TableFiles) -> None:
    """Mark ``table``'s kept log as no writer's own: the next read lists the log (and reads only the
    commits after the kept version)."""
    log = log_files(table)
    if log is None:
        return
    with _KEPT_LOCK:
        kept = _KEPT.get(log.root)
        if kept is not None and kept.writer is not None:
            _KEPT[log.root] = dataclasses.replace(kept, writer=None)


def own_snapshot(table: TableFiles, writer: str) -> LogSnapshot | None:
    """The kept snapshot if its newest commit is ``writer``'s own (:func:`note_own_commit`), without
    listing the log: a commit started from it is checked by Delta against any later commit."""
    log = log_files(table)
    kept = None if log is None else _kept(log)
    return kept.snap if kept is not None and kept.writer == writer else None


def note_own_commit(table: TableFiles, writer: str, *, read: int, version: int,
                    removed: list[tuple[str, dict[str, Any] | None]], added: list[dict[str, Any]]) -> None:
    """Apply ``writer``'s own commit ``version`` (files ``removed`` as (path, deletionVector), ``added``
    add actions) to the kept log, if that was at ``read`` and the commit came right after it."""
    log = log_files(table)
    if log is None:
        return
    kept = _kept(log)
    if kept is None or kept.version != read or version != read + 1:
        disown_snapshot(table)  # others committed in between: the next read lists
        return
    state = kept.state.copy()
    for path, dv in removed:
        state.apply("remove", {"path": path, "deletionVector": dv}, version)
    for add in added:
        state.apply("add", add, version)
    snap = state.snapshot(version)
    if snap is not None:
        _keep(log, _Kept(version=version, stamp=None, state=state, snap=snap, writer=writer))


def _listing(log: TableFiles) -> tuple[list[str], Callable[[str], tuple[int, int] | None]]:
    """The log folder's names, and a file's (size, mtime) by name (None: not there)."""
    if log.is_local:
        def stamp(name: str) -> tuple[int, int] | None:
            try:
                st = os.stat(log.path(name))
            except FileNotFoundError:
                return None
            return st.st_size, st.st_mtime_ns
        return log.listdir() or [], stamp
    infos = {name: (size, mtime) for name, size, mtime in log.list_files() or []}
    return list(infos), infos.get


def read_snapshot(path: str | TableFiles) -> LogSnapshot | None:
    """The live files of the Delta table at ``path`` (None: not handled here, ask Delta).

    The replayed log is kept per table: a later read lists the log and reads only the commits after
    the kept one (the whole log again if that one's file changed or commits in between are gone)."""
    log = log_files(path)
    if log is None:
        return None
    names, stamp_of = _listing(log)
    commits = _commit_versions(names)
    kept = _kept(log)
    if kept is not None and commits and commits[-1] >= kept.version:
        stamp = stamp_of(f"{kept.version:020d}.json")
        newer = [v for v in commits if v > kept.version]
        if (stamp is not None and kept.stamp in (None, stamp)
                and newer == list(range(kept.version + 1, commits[-1] + 1))):
            if not newer:
                if kept.stamp is None:
                    _keep(log, dataclasses.replace(kept, stamp=stamp))
                return kept.snap
            return _replay_after(log, kept.state.copy(), newer, stamp_of)
        # the kept version's file changed, or commits after it went: nothing of it is trusted any more
        with _KEPT_LOCK:
            if _KEPT.get(log.root) is kept:
                del _KEPT[log.root]
    cp, usable = newest_checkpoint(names)
    if not usable:
        return None
    cpv = -1 if cp is None else cp.version
    todo = [v for v in commits if v > cpv]
    if not todo and cp is None:
        return None
    if todo and (todo[0] != cpv + 1 or todo[-1] - todo[0] + 1 != len(todo)):
        return None  # a gap
    state = _Replay()
    if cp is not None:
        try:
            for kind, act in checkpoint_actions(log, cp):
                state.apply(kind, act, cpv, checkpoint=True)
        except (UnreadableCheckpoint, FileNotFoundError):
            return None
    if not todo:
        return state.snapshot(cpv)  # a checkpoint's version without its JSON is not kept
    return _replay_after(log, state, todo, stamp_of)


def _replay_after(log: TableFiles, state: _Replay, todo: list[int],
                  stamp_of: Callable[[str], tuple[int, int] | None]) -> LogSnapshot | None:
    """``state`` with the JSON commits ``todo`` (ascending, contiguous) applied, and kept."""
    for v, got in zip(todo, _read_jsons(log, todo), strict=True):
        if got is None:
            return None
        state.apply_lines(v, *got)
    version = todo[-1]
    snap = state.snapshot(version)
    if snap is not None:
        _keep(log, _Kept(version=version, stamp=stamp_of(f"{version:020d}.json"), state=state, snap=snap))
    return snap


def json_commit_versions(path: str | TableFiles) -> list[int] | None:
    """The versions of the JSON commits still in the table's log, ascending; None if remote."""
    listing = _log_names(path)
    return None if listing is None else _commit_versions(listing[1])


def commit_info(path: str | TableFiles, version: int) -> dict[str, Any] | None:
    """The ``commitInfo`` of JSON commit ``version`` (None: none, gone, or a remote table)."""
    log = log_files(path)
    got = None if log is None else _read_json(log, version)
    return None if got is None else commit_info_in(*got)


def commit_info_in(file: str, lines: list[str]) -> dict[str, Any] | None:
    """The ``commitInfo`` among the ``lines`` of JSON commit ``file`` (None: it has none).
    Raises StoreDamagedError: its line does not parse."""
    return next((dict(_parse(line, file)["commitInfo"]) for line in lines if '"commitInfo"' in line), None)


def commit_infos(path: str | TableFiles, *, after: int) -> list[tuple[int, dict[str, Any]]] | None:
    """(version, ``commitInfo``) of each JSON commit after version ``after``, oldest first; None: remote."""
    listing = _log_names(path)
    if listing is None:
        return None
    log, names = listing
    versions = [v for v in _commit_versions(names) if v > after]
    return [(v, info) for v, got in zip(versions, _read_jsons(log, versions), strict=True)
            if got is not None and (info := commit_info_in(*got)) is not None]


def first_touching(path: str | TableFiles, after: int, upto: int,
                   partitions: set[tuple[tuple[str, str], ...]]) -> int | None:
    """The first commit in (``after``, ``upto``] that changed the metadata or the protocol, or added or
    removed a file of ``partitions`` (each sorted (column, value) pairs); -1: none; None: a commit is not
    readable here (remote, cleaned up). The JSON commits are read at once, not one after another.

    >>> import tempfile
    >>> d = tempfile.mkdtemp(); os.mkdir(f"{d}/_delta_log")
    >>> def put(v, act): open(f"{d}/_delta_log/{v:020d}.json", "w").write(json.dumps(act) + "\\n")
    >>> put(1, {"add": {"path": "a", "partitionValues": {"interval": "1"}}})
    >>> put(2, {"remove": {"path": "b", "partitionValues": {"interval": "2"}}})
    >>> first_touching(d, 0, 2, {(("interval", "2"),)}), first_touching(d, 0, 1, {(("interval", "2"),)})
    (2, -1)
    >>> first_touching(d, 0, 3, {(("interval", "9"),)}) is None  # version 3 is not there
    True
    """
    changes = partition_changes(path, after, upto)
    if changes is None:
        return None
    return next((v for v, touched in changes if touched is None or touched & partitions), -1)


def partition_changes(path: str | TableFiles, after: int, upto: int
                      ) -> list[tuple[int, frozenset[tuple[tuple[str, str], ...]] | None]] | None:
    """Each commit in (``after``, ``upto``] with the partitions (sorted (column, value) pairs) whose
    files it added or removed, None for one that changed the metadata or the protocol; None: a commit
    is not readable here. The JSON commits are read at once (:func:`first_touching` asks of them)."""
    log = log_files(path)
    if log is None:
        return None
    versions = list(range(after + 1, upto + 1))
    out: list[tuple[int, frozenset[tuple[tuple[str, str], ...]] | None]] = []
    for v, got in zip(versions, _read_jsons(log, versions), strict=True):
        if got is None:
            return None
        file, lines = got
        touched: set[tuple[tuple[str, str], ...]] = set()
        meta = False
        for line in lines:
            if '"metaData"' in line or '"protocol"' in line:
                if {"metaData", "protocol"} & _parse(line, file).keys():
                    meta = True
                    break
            elif '"add"' in line or '"remove"' in line:
                act = _parse(line, file)
                f = act.get("add") or act.get("remove")
                if f is not None:
                    touched.add(tuple(sorted((f.get("partitionValues") or {}).items())))
        out.append((v, None if meta else frozenset(touched)))
    return out


def newest_commit_info(path: str | TableFiles,
                       match: Callable[[dict[str, Any]], bool]) -> tuple[int, dict[str, Any]] | None:
    """(version, ``commitInfo``) of the newest JSON commit ``match`` accepts; ValueError if remote."""
    listing = _log_names(path)
    if listing is None:
        raise ValueError(f"{path} is not a local table")
    log, names = listing
    for v in reversed(_commit_versions(names)):
        got = _read_json(log, v)
        if got is None:  # cleaned up meanwhile
            return None
        info = commit_info_in(*got)
        if info is not None and match(info):
            return v, info
    return None
