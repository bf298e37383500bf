"""History reads of delta images whose deletion vector files are gone: a vector file that a later
cumulative vector replaced is removed by VACUUM like any unreferenced file; reading a version
that named it is a vacuumed version (VersionNotFoundError), not a damaged store."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltawheel.statestore.delta.deletionvectors import vector_file_name, z85_decode
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.exceptions import StoreDamagedError, VersionNotFoundError
from deltawheel.statestore.inspection.history import _Table
from dv_util import write_vectors


def _table(tmp_path) -> tuple[TableFiles, dict[str, object]]:  # type: ignore[no-untyped-def]
    pq.write_table(pa.table({"key": ["a", "b", "c", "d"]}), str(tmp_path / "part-0.parquet"))
    files = TableFiles(str(tmp_path))
    (dv,) = write_vectors(files, [[1, 3]])
    return files, {"path": "part-0.parquet", "deletionVector": dv}


def _vector_path(tmp_path, add) -> str:  # type: ignore[no-untyped-def]
    encoded = str(add["deletionVector"]["pathOrInlineDv"])[-20:]  # type: ignore[index]
    import uuid
    return str(tmp_path / vector_file_name(uuid.UUID(bytes=z85_decode(encoded))))


def test_a_history_read_applies_a_vector_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    files, add = _table(tmp_path)
    assert _Table(files).places(add, None) == {"a": 0, "c": 2}


def test_a_vacuumed_vector_file_is_a_version_no_longer_readable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    files, add = _table(tmp_path)
    os.remove(_vector_path(tmp_path, add))
    with pytest.raises(VersionNotFoundError, match="deletion vector file of part-0.parquet .* is gone"):
        _Table(files).places(add, None)


def test_a_damaged_vector_file_stays_damage(tmp_path) -> None:  # type: ignore[no-untyped-def]
    files, add = _table(tmp_path)
    path = _vector_path(tmp_path, add)
    data = bytearray(open(path, "rb").read())
    data[-6] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(StoreDamagedError, match="cannot be read"):
        _Table(files).places(add, None)
