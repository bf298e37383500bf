"""The live files of a Delta table, read from its log without Spark.

Delta's own snapshot read (``DeltaLog.startTransaction().filterFiles``) builds
the table state with Spark jobs: 1-1.5 s on the benchmark machine even for a
table of a few files, paid at every executor start and on every schema check.
The log replay is small enough to do here, for a table in a local folder (a
path given as a string) or on any store Python reaches (a
:class:`~.storefs.TableFiles`: a local folder or an ``s3a://`` prefix):

- the newest *classic single-file* checkpoint (``<v>.checkpoint.parquet``),
  read with pyarrow, then
- every JSON commit after it, in version order (they must be contiguous),
- live files keyed by (path, deletion-vector id), as Delta keys them: an
  ``add`` puts, a ``remove`` deletes; application versions (``txn``) by app id,
  the last one recorded wins.

Anything this reader does not fully understand returns ``None`` and the
caller goes to Delta: a remote table given as a bare URI, multi-part or V2
checkpoints (newer than the classic one), coordinated commits, absolute file
paths, a gap in the commits. Commits only go through Delta
(``deltatxn.TableLog``), whose conflict checks see everything committed after
the version read here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..exceptions import StoreDamagedError
from .storefs import TableFiles, local_path

__all__ = ["LogSnapshot", "read_snapshot", "log_files", "local_table_exists", "local_path", "commit_infos", "commit_info",
           "json_commit_versions", "damaged_entry", "DAMAGE_DOC",
           "newest_commit_info"]

DAMAGE_DOC = "docs/store-damage.md"


def damaged_entry(file: str, exc: Exception) -> StoreDamagedError:
    """The error for a log entry that does not parse (truncated or corrupt)."""
    return StoreDamagedError(
        f"Delta log entry {file} is truncated or corrupt ({type(exc).__name__}: {exc}); nothing was written. "
        f"Restore that file from a backup of the store, then start again ({DAMAGE_DOC})")


def _parse(line: str, file: str) -> Any:
    try:
        return json.loads(line)
    except ValueError as exc:
        raise damaged_entry(file, exc) from exc

# reader features under which the table's commits are the catalog's (Unity Catalog managed tables,
# Delta 4.4; docs/versions.md): the log folder alone is not the table's state
CATALOG_FEATURES = frozenset({"catalogManaged", "catalogOwned-preview"})

_JSON = re.compile(r"^(\d{20})\.json$")
_CLASSIC_CP = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_OTHER_CP = re.compile(r"^(\d{20})\.checkpoint\..+")  # multi-part or V2 (uuid-named) checkpoints


@dataclass(frozen=True)
class LogSnapshot:
    """A table's version, its live ``add`` actions, configuration and application versions
    (``txn`` actions: app id -> the last version recorded)."""

    version: int
    adds: tuple[dict[str, Any], ...]
    configuration: dict[str, str]
    txns: dict[str, int]
    # path -> the version of the commit that added it (for an add read from the checkpoint: the
    # checkpoint's version, an upper bound)
    added_at: dict[str, int] = field(default_factory=dict)
    bounded: frozenset[str] = frozenset()  # paths whose ``added_at`` is only that upper bound
    table_id: str | None = None  # the table's ``metaData.id`` (fixed when the table is created)


def log_files(table: str | TableFiles) -> TableFiles | None:
    """The files of ``table``'s ``_delta_log`` folder (a string: a local table only; None: remote)."""
    if isinstance(table, TableFiles):
        return table.sub("_delta_log")
    root = local_path(table)
    return None if root is None else TableFiles(root).sub("_delta_log")


def _log_names(table: str | TableFiles) -> tuple[TableFiles, list[str]] | None:
    """(the table's ``_delta_log`` folder, its file names; none if it is missing); None if remote."""
    log = log_files(table)
    if log is None:
        return None
    return log, log.listdir() or []


def _read_json(log: TableFiles, version: int) -> tuple[str, list[str]] | None:
    """(the file's name for messages, its lines) of JSON commit ``version`` (None: not there)."""
    text = log.read_text(f"{version:020d}.json")
    return None if text is None else (log.path(f"{version:020d}.json"), text.splitlines())


def _commit_versions(names: list[str]) -> list[int]:
    """The versions of the JSON commits among a ``_delta_log`` folder's file names, ascending."""
    return sorted(int(m.group(1)) for n in names if (m := _JSON.match(n)))


def local_table_exists(path: str | TableFiles) -> bool | None:
    """True/False for a table folder (has its first commit or a checkpoint); None if remote (a URI string)."""
    listing = _log_names(path)
    if listing is None:
        return None
    return any(_JSON.match(n) or _CLASSIC_CP.match(n) or _OTHER_CP.match(n) for n in listing[1])


def latest_local_version(path: str | TableFiles) -> int | None:
    """The newest JSON commit version of a table; None if remote (a URI string) or it has no JSON commit."""
    listing = _log_names(path)
    if listing is None:
        return None
    versions = _commit_versions(listing[1])
    return versions[-1] if versions else None


def _dv_id(dv: dict[str, Any] | None) -> str | None:
    if not dv:
        return None
    uid = f"{dv.get('storageType', '')}{dv.get('pathOrInlineDv', '')}"
    off = dv.get("offset")
    return uid if off is None else f"{uid}@{off}"


_MAPS = frozenset({"partitionValues", "tags", "configuration", "options"})


def _clean(value: Any) -> Any:
    """A checkpoint struct (pyarrow ``to_pylist``) as the JSON Delta writes: no nulls, maps as objects."""
    if isinstance(value, dict):
        return {k: (dict(v) if k in _MAPS else _clean(v)) for k, v in value.items()
                if v is not None and not k.endswith("_parsed")}
    if isinstance(value, list):
        return [_clean(x) for x in value]
    return value


def read_snapshot(path: str | TableFiles) -> LogSnapshot | None:
    """The live files of the Delta table at ``path`` (None: not handled here, ask Delta)."""
    listing = _log_names(path)
    if listing is None:
        return None
    log, names = listing
    commits = _commit_versions(names)
    classic = [int(m.group(1)) for n in names if (m := _CLASSIC_CP.match(n))]
    other = [int(m.group(1)) for n in names if not _CLASSIC_CP.match(n) and (m := _OTHER_CP.match(n))]
    cp = max(classic, default=-1)
    if other and max(other) > cp:
        return None  # a multi-part / V2 checkpoint is the newest: Delta reads those
    todo = [v for v in commits if v > cp]
    if not todo and cp < 0:
        return None
    if todo and (todo[0] != cp + 1 or todo[-1] - todo[0] + 1 != len(todo)):
        return None  # a gap (cleaned-up history without a usable checkpoint, or a commit in flight)
    files: dict[tuple[str, str | None], dict[str, Any]] = {}
    config: dict[str, str] = {}
    table_id: str | None = None
    txns: dict[str, int] = {}
    added_at: dict[str, int] = {}
    bounded: set[str] = set()
    reader_features: set[str] = set()
    if cp >= 0:
        table = log.read_parquet(f"{cp:020d}.checkpoint.parquet")
        cols = set(table.column_names)
        if "add" in cols:
            for a in table.column("add").to_pylist():
                if a is not None:
                    a = _clean(a)
                    files[(a["path"], _dv_id(a.get("deletionVector")))] = a
                    added_at[a["path"]] = cp
                    bounded.add(a["path"])
        if "metaData" in cols:
            for m in table.column("metaData").to_pylist():
                if m is not None:
                    config = dict(_clean(m).get("configuration") or {})
                    table_id = m.get("id")
        if "protocol" in cols:
            for pr in table.column("protocol").to_pylist():
                if pr is not None:
                    reader_features = set(pr.get("readerFeatures") or ())
        if "txn" in cols:
            for t in table.column("txn").to_pylist():
                if t is not None:
                    txns[str(t["appId"])] = int(t["version"])
    for v in todo:
        got = _read_json(log, v)
        if got is None:
            return None  # cleaned up meanwhile: ask Delta
        file, lines = got
        for line in lines:
            if not line.strip():
                continue
            act = _parse(line, file)
            if "add" in act:
                a = act["add"]
                files[(a["path"], _dv_id(a.get("deletionVector")))] = a
                added_at[a["path"]] = v
                bounded.discard(a["path"])
            elif "remove" in act:
                r = act["remove"]
                files.pop((r["path"], _dv_id(r.get("deletionVector"))), None)
            elif "metaData" in act:
                config = dict(act["metaData"].get("configuration") or {})
                table_id = act["metaData"].get("id")
            elif "txn" in act:
                txns[str(act["txn"]["appId"])] = int(act["txn"]["version"])
            elif "protocol" in act:
                reader_features = set(act["protocol"].get("readerFeatures") or ())
    if any(k.startswith("delta.coordinatedCommits") for k in config):
        return None
    if reader_features & CATALOG_FEATURES:
        return None  # the catalog owns the table's commits: its newest version may not be in this folder
    if any(":" in a["path"].split("/", 1)[0] or a["path"].startswith("/") for a in files.values()):
        return None  # absolute paths (a shallow clone, a converted table): Delta canonicalises those
    version = todo[-1] if todo else cp
    return LogSnapshot(version, tuple(files.values()), config, txns, added_at, frozenset(bounded), table_id)


def json_commit_versions(path: str | TableFiles) -> list[int] | None:
    """The versions of the JSON commits still in the table's log, ascending; None if remote."""
    listing = _log_names(path)
    return None if listing is None else _commit_versions(listing[1])


def commit_info(path: str | TableFiles, version: int) -> dict[str, Any] | None:
    """The ``commitInfo`` of JSON commit ``version`` of the table at ``path`` (None: the
    commit has none, its JSON is gone, or the table is remote)."""
    log = log_files(path)
    got = None if log is None else _read_json(log, version)
    if got is None:
        return None
    file, lines = got
    for line in lines:
        if '"commitInfo"' in line:
            return dict(_parse(line, file)["commitInfo"])
    return None


def commit_infos(path: str | TableFiles, *, after: int) -> list[tuple[int, dict[str, Any]]] | None:
    """(version, ``commitInfo``) of each JSON commit of the table at ``path`` after version
    ``after``, oldest first (a commit without one is left out); None for a remote table."""
    listing = _log_names(path)
    if listing is None:
        return None
    log, names = listing
    out = []
    for v in _commit_versions(names):
        if v <= after:
            continue
        got = _read_json(log, v)
        if got is None:
            continue
        file, lines = got
        for line in lines:
            if '"commitInfo"' in line:
                out.append((v, _parse(line, file)["commitInfo"]))
                break
    return out


def newest_commit_info(path: str | TableFiles,
                       match: Callable[[dict[str, Any]], bool]) -> tuple[int, dict[str, Any]] | None:
    """(version, ``commitInfo``) of the newest JSON commit of the table at ``path`` whose
    commit info ``match`` accepts, read newest first (stops at the first match); None when there
    is none among the JSON commits left in the log. Raises ``ValueError`` for a remote table."""
    listing = _log_names(path)
    if listing is None:
        raise ValueError(f"{path} is not a local table")
    log, names = listing
    for v in reversed(_commit_versions(names)):
        got = _read_json(log, v)
        if got is None:  # cleaned up meanwhile: older commits are gone as well
            return None
        file, lines = got
        for line in lines:
            if '"commitInfo"' in line:
                info = _parse(line, file)["commitInfo"]
                if match(info):
                    return v, info
                break
    return None
