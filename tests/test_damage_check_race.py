"""The store's damage check beside a live instance: a rows commit and its delivery landing while the
check runs are no damage (a chaos run's driver stopped with StoreDamagedError, exit 3, on a whole
store: it had listed the rows log before the other instance's commit and read the stream after its
delivery); a stream truly ahead of the rows is still refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from deltawheel.statestore.exceptions import StoreDamagedError
from deltawheel.statestore.inspection import damage

APP = "deltawheel.bank.0"


def _newest(log: Path) -> int:
    return max(int(p.stem) for p in log.glob("*.json"))


def _append(log: Path, action: dict[str, Any]) -> int:
    """One more commit of ``action`` in the Delta log ``log``, as a writer lands it; its version."""
    version = _newest(log) + 1
    (log / f"{version:020d}.json").write_text(json.dumps(action) + "\n")
    return version


def _deliver(stream_log: Path, rows_version: int) -> None:
    _append(stream_log, {"txn": {"appId": APP, "version": rows_version}})


def test_a_commit_and_its_delivery_landing_during_the_check_are_no_damage(
        spark: Any, migrated_store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from deltawheel.statestore.rowtable.tables import ensure_rows_table

    rows_log = Path(ensure_rows_table(spark, migrated_store, "bank")) / "_delta_log"  # the computation delivering
    stream = Path(migrated_store.stream("changes"))
    write_deltalake(str(stream), pa.table({"x": [1]}))
    stream_log = stream / "_delta_log"
    _deliver(stream_log, _newest(rows_log))  # every delivery so far is of a rows commit that exists
    damage.check_store(migrated_store)

    read = damage.read_snapshot
    landed: list[int] = []

    def another_instance_commits_then_read(path: str) -> Any:
        if not landed:  # the other instance's next batch: its rows commit, then its delivery
            landed.append(_append(rows_log, {"commitInfo": {"operation": "WRITE"}}))
            _deliver(stream_log, landed[0])
        return read(path)

    monkeypatch.setattr(damage, "read_snapshot", another_instance_commits_then_read)
    damage.check_store(migrated_store)  # without reading the streams first: "the rows table is behind"
    assert landed, "the stream was not read"

    monkeypatch.setattr(damage, "read_snapshot", read)
    _deliver(stream_log, landed[0] + 2)  # a delivery of a rows commit the rows table does not hold
    with pytest.raises(StoreDamagedError, match=rf"stream 'changes' records the productions of rows commit "
                                                rf"{landed[0] + 2} .* ends at version {landed[0]}"):
        damage.check_store(migrated_store)
