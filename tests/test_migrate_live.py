"""A migration that changes the rows table, asked for while a pipeline runs on the store: refused
with what to do, nothing changed; after the pipeline stops it runs, and the pipeline resumes on
the new schema with nothing lost."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.zk]


def _versions(spark, layout) -> list[int]:  # type: ignore[no-untyped-def]
    return sorted(int(r["version"]) for r in spark.read.format("delta").load(layout.meta).collect())


def _rows_version(spark, layout) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """The newest versions of the store's first rows table and of the running computation's."""
    return tuple(int(spark.sql(f"DESCRIBE HISTORY delta.`{p}` LIMIT 1").first()["version"])  # type: ignore[return-value]
                 for p in (layout.rows, layout.rows_of("buckets")))


def test_migrate_refuses_while_a_pipeline_runs_then_resumes(spark, migrated_store, zk_config, capsys) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.executor.drivers.wiring import migrate_store
    from deltawheel.statestore.exceptions import StoreInUseError
    from deltawheel.statestore.zk.client import connect
    from executor_util import BucketCounter, events, start_executor, state_of, stop_executor

    from deltawheel import migrations
    from deltawheel.cli import main

    batches = {b: [(f"r{b}-{i}", f"q{i % 3}", 1_000 * i) for i in range(6)] for b in range(4)}
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    try:
        for b in (0, 1):
            ex(events(spark, batches[b]), b)
        # a deltawheel whose migration 4 (the rows table's timer_seq column and format version) has
        # not run on this store: its record taken out of _meta, as an older store would lack it
        spark.sql(f"DELETE FROM delta.`{migrated_store.meta}` WHERE version = 4")
        assert [p.version for p in migrations.plan(spark, migrated_store)] == [4]
        rows_version = _rows_version(spark, migrated_store)
        args = ["migrate", "--store", migrated_store.root, "--zk", zk_config.hosts, "--zk-chroot", zk_config.chroot]
        assert main([*args, "--apply"]) == 3
        err = capsys.readouterr().err
        assert "StoreInUseError" in err and "is in use: pipeline 'test' (lease owners: w)" in err, err
        assert "Stop the pipeline" in err and "4 (timer_seq)" in err, err
        assert 4 not in _versions(spark, migrated_store)  # nothing changed
        assert _rows_version(spark, migrated_store) == rows_version
        # a pipeline (a newer deltawheel) starting on the store meanwhile is refused the same way
        other = connect(zk_config)
        try:
            with pytest.raises(StoreInUseError, match=r"store .* is in use: pipeline 'test' \(lease owners: w\)"):
                migrate_store(spark, migrated_store, other, pipeline="test", owner="newer")
        finally:
            other.stop()
            other.close()
        assert 4 not in _versions(spark, migrated_store)
        assert main(args) == 0  # the plan is shown while it runs (a dry run changes nothing)
        assert "pending migrations" in capsys.readouterr().out
        ex(events(spark, batches[2]), 2)  # the running pipeline went on
    finally:
        stop_executor(ex, client)
    assert main([*args, "--apply"]) == 0  # stopped at a batch boundary: the migration runs
    assert 4 in _versions(spark, migrated_store)
    ex, client = start_executor(spark, migrated_store, zk_config, BucketCounter())
    try:
        ex(events(spark, batches[3]), 3)
    finally:
        stop_executor(ex, client)
    want: dict[str, int] = {}
    for items in batches.values():
        for _rid, q, _ts in items:
            want[q] = want.get(q, 0) + 1
    assert state_of(spark, migrated_store, "buckets") == {q: ({"0": n}, [("0", 9_999)]) for q, n in want.items()}
