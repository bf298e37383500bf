"""The fenced MERGE of :meth:`~.store.RowStore.commit`, evaluated in Python over the partitions' files.

Copy-on-write without Spark jobs: files holding a matched row become one new file per interval."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Mapping, Sequence

from ..delta.deletionvectors import live_table
from ..delta.group import Landed, TurnsOf, commit_in_turn
from ..delta.log import disown_snapshot, note_own_commit
from ..delta.storefs import TableFiles, background_uploads
from ..delta.txn import CommitRequest, TableLog, decode_path, new_add, partition_file_name, write_file
from ..exceptions import StaleFilesError
from . import inputfiles
from .fencing import REPLACE_FILES_OP, STALE_MARKER
from .frames import arrow_schema
from .rows import FENCE_KEY, rows_file_ddl

__all__ = ["merge_files"]

#: attempts when a commit lands in the partitions between listing their files and committing
_RELIST_ATTEMPTS = 20


def _fence_state(targets: Sequence[Mapping[str, Any]], source: Mapping[str, Any]) -> Any:
    """A fence row's new ``state``, as ``inputfiles.union_sql`` computes it."""
    if source["_op"] == REPLACE_FILES_OP or not targets:
        return source["state"]
    payloads = [t["state"] for t in targets] + [source["state"]]
    if all(p is None for p in payloads):
        return None
    return inputfiles.encode(set().union(*(inputfiles.decode(p) for p in payloads)))


class _Written:
    """The files this process wrote last, whole, by path (data files never change): the next commit of
    their partitions reads them here instead of from the store. Bounded by ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._tables: OrderedDict[str, Any] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, path: str, table: Any) -> None:
        size = int(table.nbytes)
        if size > self.max_bytes:
            return
        with self._lock:
            self._pop(path)
            self._tables[path] = table
            self._bytes += size
            while self._bytes > self.max_bytes:
                self._pop(next(iter(self._tables)))

    def get(self, path: str) -> Any:
        with self._lock:
            return self._tables.get(path)

    def _pop(self, path: str) -> None:
        old = self._tables.pop(path, None)
        if old is not None:
            self._bytes -= int(old.nbytes)


WRITTEN = _Written(32 << 20)


def _live(files: TableFiles, rel: str, dv: Any, columns: list[str] | None = None) -> Any:
    """:func:`live_table`, from :data:`WRITTEN` when this process wrote the file (no deletion vector)."""
    kept = None if dv else WRITTEN.get(files.path(rel))
    if kept is None:
        return live_table(files, rel, dv, columns=columns)
    return kept if columns is None else kept.select(columns)


def _rewrite(files: TableFiles, entries: Sequence[Any], wanted: set[str], source: Mapping[int, Mapping[str, Any]],
             schema: Any, computation: str, removes: list[Any], adds: list[str]) -> None:
    """Each interval's files holding a source key read, and its new file written (``removes``, ``adds``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for iv in sorted(int(v) for v in wanted):
        mine = source.get(iv, {})
        keys = pa.array(sorted(mine), pa.string())
        kept: list[dict[str, Any]] = []
        targets: dict[str, list[dict[str, Any]]] = {}
        for f in (e for e in entries if e.part("interval") == str(iv)):
            rel = decode_path(f.path)
            dv = json.loads(f.action_json)["add"].get("deletionVector") if f.has_deletion_vector else None
            key_col = _live(files, rel, dv, columns=["key"]).column(0)
            if not pc.any(pc.is_in(key_col, value_set=keys)).as_py():
                continue
            removes.append(f)
            for row in _live(files, rel, dv).to_pylist():
                s = mine.get(row["key"])
                if s is None:
                    kept.append(row)
                    continue
                if int(row["sequencer"] or 0) > int(s["sequencer"]):
                    raise RuntimeError(f"{STALE_MARKER} computation={computation} interval={iv} "
                                       f"current={int(row['sequencer'])} ours={int(s['sequencer'])}")
                targets.setdefault(row["key"], []).append(row)
        for key, s in mine.items():
            if s["_op"] == "delete":
                continue
            new = {c: s.get(c) for c in schema.names}
            if key == FENCE_KEY:
                new["state"] = _fence_state(targets.get(key, []), s)
            kept.append(new)
        if kept:
            table = pa.Table.from_pylist(sorted(kept, key=lambda r: r["key"]), schema=schema)
            rel = partition_file_name(computation, iv, "dw")
            adds.append(new_add(rel, {"computation": computation, "interval": str(iv)},
                                write_file(table, files, rel), table.num_rows))
            WRITTEN.put(files.path(rel), table)


def merge_files(log: TableLog, files: TableFiles, src: Sequence[Mapping[str, Any]], *, computation: str,
                intervals: Sequence[int], meta: str, writer: str | None = None,
                turn: TurnsOf | None = None) -> int:
    """Apply the MERGE source ``src`` (rows with ``_op``) to ``intervals`` in one commit; returns its version.

    ``writer``: when this writer made the table's newest commit it knows of, the log is not listed
    again (Delta's conflict check at commit catches any commit since); a failed commit drops that mark.
    ``turn(computation, request)``: held around the Delta commit alone (``RowStore.turns``); its holder
    commits the requests waiting behind it too (``delta/group.py``).

    Raises:
        RuntimeError: the MERGE's stale-sequencer message (``translate_commit_error`` reads it).
        StaleFilesError: commits kept landing in the partitions while their files were read.
        Whatever Delta raises at commit.
    """
    schema = arrow_schema(rows_file_ddl())
    wanted = {str(iv) for iv in intervals}
    source: dict[int, dict[str, Mapping[str, Any]]] = {}
    for r in src:
        source.setdefault(int(r["interval"]), {})[str(r["key"])] = r
    for _ in range(_RELIST_ATTEMPTS):
        version, entries = log.files(
            " OR ".join(f"(computation = '{computation}' AND interval = {iv})" for iv in sorted(wanted)) or "false",
            where=lambda pv: pv.get("computation") == computation and pv.get("interval") in wanted, own=writer)
        removes: list[Any] = []
        adds: list[str] = []
        with background_uploads():  # the intervals' new files go up side by side
            _rewrite(files, entries, wanted, source, schema, computation, removes, adds)
        parts = [{"computation": computation, "interval": v} for v in sorted(wanted)]
        preds = [f"computation = '{computation}' AND interval = {v}" for v in sorted(wanted)]

        def own(removes: list[Any] = removes, adds: list[str] = adds, version: int = version,
                parts: list[dict[str, str]] = parts, preds: list[str] = preds) -> int:
            got = log.commit(remove=removes, add=adds, user_metadata=meta, known_version=version,
                             read_partitions=preds, untouched_since=(version, parts))
            assert got is not None
            return got
        try:
            if turn is None:
                got = Landed(own(), False)
            else:  # instances sharing the table: in turns, and the holder commits for those waiting (group.py)
                request = CommitRequest(removes=tuple(f.action_json for f in removes), adds=tuple(adds),
                                        read_partitions=tuple(preds), user_metadata=meta, read_version=version,
                                        partitions=tuple(parts))
                got = commit_in_turn(log, turn, computation, request, own)
        except StaleFilesError:
            disown_snapshot(files)
            continue  # list them again
        except BaseException:
            disown_snapshot(files)
            raise
        if writer is not None and not got.grouped:
            note_own_commit(files, writer, read=version, version=got.version,
                            added=[json.loads(a)["add"] for a in adds],
                            removed=[(f.path, json.loads(f.action_json)["add"].get("deletionVector")) for f in removes])
        else:
            disown_snapshot(files)
        return got.version
    raise StaleFilesError(f"commits kept landing in {computation}'s intervals {sorted(wanted)} while their files "
                          f"were read ({_RELIST_ATTEMPTS} attempts); nothing of this commit landed")
