"""What Delta's streaming source read in a micro-batch, from the offset log and the Delta log
(``statestore/delta/sourceoffsets.py``): the plain append case, and every case it leaves to Spark.

A table log and a query checkpoint written here action by action (no Spark): the comparison with
what Delta's own source reads is ``tests/test_direct_tables.py``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deltawheel.statestore.delta.sourceoffsets import END_INDEX, add_file_name, batch_adds

META = {"metaData": {"id": "table-1", "format": {"provider": "parquet", "options": {}}, "schemaString": "{}",
                     "partitionColumns": [], "configuration": {}}}


def _add(path: str, **more: Any) -> dict[str, Any]:
    return {"add": {"path": path, "partitionValues": {}, "size": 1, "modificationTime": 0, "dataChange": True,
                    **more}}


def _log(table: Path, commits: list[list[dict[str, Any]]]) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True)
    for v, actions in enumerate(commits):
        (log / f"{v:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n", encoding="utf-8")


def _offsets(chk: Path, offsets: list[tuple[int, int, bool]], *, table_id: str = "table-1") -> None:
    (chk / "offsets").mkdir(parents=True)
    for b, (version, index, starting) in enumerate(offsets):
        line = {"sourceVersion": 1, "reservoirId": table_id, "reservoirVersion": version, "index": index,
                "isStartingVersion": starting}
        (chk / "offsets" / str(b)).write_text(f"v1\n{{}}\n{json.dumps(line)}", encoding="utf-8")


def test_the_adds_of_whole_versions_and_none_for_what_spark_must_answer(tmp_path: Path) -> None:
    table, chk = tmp_path / "t", tmp_path / "chk"
    _log(table, [
        [{"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}, META],
        [_add("a%20b.parquet"), _add("rewritten.parquet", dataChange=False)],  # 1
        [_add("c.parquet")],  # 2
        [{"remove": {"path": "c.parquet", "dataChange": True}}],  # 3: a delete
        [_add("d.parquet", deletionVector={"storageType": "u", "pathOrInlineDv": "x", "sizeInBytes": 1,
                                           "cardinality": 1})],  # 4
        [META],  # 5: a schema change
        [_add("e.parquet"), _add("f.parquet")],  # 6
    ])
    _offsets(chk, [(1, -1, False),  # batch 0: the query's first (its start is not known here)
                   (3, -1, False),  # batch 1: versions 1 and 2
                   (4, -1, False),  # batch 2: the delete
                   (4, END_INDEX, False),  # batch 3: version 4, to its end
                   (6, -1, False),  # batch 4: the schema change
                   (6, 0, False),  # batch 5: inside version 6 (a per-trigger limit)
                   (6, 0, False),  # batch 6: nothing new
                   (7, -1, False)])  # batch 7: from inside version 6
    got = {b: batch_adds(str(chk), b, str(table)) for b in range(8)}
    assert [add_file_name(a) for a in got[1] or ()] == ["a b.parquet", "c.parquet"]
    assert got[6] == ()
    assert [b for b, adds in got.items() if adds is None] == [0, 2, 3, 4, 5, 7]
    assert batch_adds(str(chk), 8, str(table)) is None  # not planned yet


def test_another_table_or_a_snapshot_offset_is_not_known_here(tmp_path: Path) -> None:
    table, chk, other = tmp_path / "t2", tmp_path / "chk", tmp_path / "chk2"
    meta = {"metaData": {**META["metaData"], "id": "table-2"}}
    _log(table, [[{"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}, meta], [_add("a.parquet")]])
    _offsets(chk, [(0, -1, True), (2, -1, False)], table_id="table-2")  # batch 0 read the snapshot
    assert batch_adds(str(chk), 1, str(table)) is None  # from inside the starting snapshot
    _offsets(other, [(1, -1, False), (2, -1, False)], table_id="table-1")  # another table's query
    assert batch_adds(str(other), 1, str(table)) is None
