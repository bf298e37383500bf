"""The fenced MERGE of :meth:`~.store.RowStore.commit`, evaluated in Python over the partitions' files.

Copy-on-write without Spark jobs: files holding a matched row become one new file per interval."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ..delta.deletionvectors import live_table
from ..delta.storefs import TableFiles
from ..delta.txn import TableLog, decode_path, new_add, partition_file_name, write_file
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


def merge_files(log: TableLog, files: TableFiles, src: Sequence[Mapping[str, Any]], *, computation: str,
                intervals: Sequence[int], meta: str) -> int:
    """Apply the MERGE source ``src`` (rows with ``_op``) to ``intervals`` in one commit; returns its version.

    Raises:
        RuntimeError: the MERGE's stale-sequencer message (``translate_commit_error`` reads it).
        StaleFilesError: commits kept landing in the partitions while their files were read.
        Whatever Delta raises at commit.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = arrow_schema(rows_file_ddl())
    wanted = {str(iv) for iv in intervals}
    source: dict[int, dict[str, Mapping[str, Any]]] = {}
    for r in src:
        source.setdefault(int(r["interval"]), {})[str(r["key"])] = r
    for _ in range(_RELIST_ATTEMPTS):
        version, entries = log.files(
            " OR ".join(f"(computation = '{computation}' AND interval = {iv})" for iv in sorted(wanted)) or "false",
            where=lambda pv: pv.get("computation") == computation and pv.get("interval") in wanted)
        removes, adds = [], []
        for iv in sorted(int(v) for v in wanted):
            mine = source.get(iv, {})
            keys = pa.array(sorted(mine), pa.string())
            kept: list[dict[str, Any]] = []
            targets: dict[str, list[dict[str, Any]]] = {}
            for f in (e for e in entries if e.part("interval") == str(iv)):
                rel = decode_path(f.path)
                dv = json.loads(f.action_json)["add"].get("deletionVector") if f.has_deletion_vector else None
                key_col = live_table(files, rel, dv, columns=["key"]).column(0)
                if not pc.any(pc.is_in(key_col, value_set=keys)).as_py():
                    continue
                removes.append(f)
                for row in live_table(files, rel, dv).to_pylist():
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
        parts = [{"computation": computation, "interval": v} for v in sorted(wanted)]
        try:
            got = log.commit(remove=removes, add=adds, user_metadata=meta, known_version=version,
                             read_partitions=[f"computation = '{computation}' AND interval = {v}" for v in sorted(wanted)],
                             untouched_since=(version, parts))
        except StaleFilesError:
            continue  # list them again
        assert got is not None
        return got
    raise StaleFilesError(f"commits kept landing in {computation}'s intervals {sorted(wanted)} while their files "
                          f"were read ({_RELIST_ATTEMPTS} attempts); nothing of this commit landed")
