"""Migrations on real Delta tables, and KeyRow round-trips through the migrated rows schema."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from deltawheel.migrations import m0001_meta_and_rows
from deltawheel.statestore.exceptions import MigrationError, NotAStoreError, SchemaTooNewError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import KeyRow, Production, SeenId, TimeDomain, Timer, rows_schema_ddl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deltawheel import migrations

pytestmark = pytest.mark.spark


def _history_len(spark: Any, path: str) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).history().count())


def test_plan_on_empty_store_lists_all_and_dry_run_changes_nothing(spark, store_layout) -> None:  # type: ignore[no-untyped-def]
    steps = migrations.plan(spark, store_layout)
    assert [(s.version, s.name) for s in steps] == [(1, "meta_and_rows"), (2, "dead_letters_late_data"),
                                                 (3, "checkpoint_interval"), (4, "timer_seq"),
                                                 (5, "column_comments"), (6, "background_log_checkpoints"),
                                                 (7, "fold_delta_files"), (8, "rows_per_computation")]
    assert store_layout.rows in steps[0].description
    assert migrations.apply(spark, store_layout) == steps  # dry run by default
    assert migrations.applied_version(spark, store_layout) == 0
    assert not Path(store_layout.root).exists()
    assert migrations.CODE_SCHEMA_VERSION == 8


def test_apply_creates_tables_and_records_each_step(spark, store_layout) -> None:  # type: ignore[no-untyped-def]
    ran = migrations.apply(spark, store_layout, dry_run=False)
    assert [s.version for s in ran] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert migrations.plan(spark, store_layout) == []
    assert migrations.applied_version(spark, store_layout) == 8
    assert migrations.check_store(spark, store_layout) == 8
    meta = {r["version"]: r for r in spark.read.format("delta").load(store_layout.meta).collect()}
    assert sorted(meta) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert meta[2]["name"] == "dead_letters_late_data" and meta[2]["deltawheel_version"]
    assert meta[1]["applied_ms"] <= meta[2]["applied_ms"]

    detail = spark.sql(f"DESCRIBE DETAIL delta.`{store_layout.rows}`").collect()[0]
    assert list(detail["partitionColumns"]) == ["computation", "interval"]
    assert detail["properties"]["delta.enableDeletionVectors"] == "true"
    assert detail["properties"]["deltawheel.table"] == "rows"
    assert detail["properties"]["deltawheel.format_version"] == "2"
    rows_cols = spark.read.format("delta").load(store_layout.rows).columns
    assert rows_cols[:3] == ["computation", "interval", "key"] and "pending" in rows_cols
    assert rows_cols[-1] == "timer_seq"
    dl = spark.read.format("delta").load(store_layout.dead_letters).schema
    assert dl.simpleString().startswith("struct<computation:string,stream:string,record_id:string")
    assert "raw_value:binary" in dl.simpleString()
    late = spark.read.format("delta").load(store_layout.late_data).schema.simpleString()
    assert "watermark_ms:bigint,reason:string" in late


def test_reapply_is_a_no_op(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    before = {p: _history_len(spark, p) for p in (migrated_store.meta, migrated_store.rows)}
    assert migrations.apply(spark, migrated_store, dry_run=False) == []
    assert {p: _history_len(spark, p) for p in before} == before


def test_resumes_after_a_run_that_died_before_recording(spark, store_layout) -> None:  # type: ignore[no-untyped-def]
    m0001_meta_and_rows.apply(spark, store_layout)  # tables made, nothing recorded: "died" here
    assert migrations.applied_version(spark, store_layout) == 0
    ran = migrations.apply(spark, store_layout, dry_run=False)
    assert [s.version for s in ran] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert migrations.check_store(spark, store_layout) == 8


def test_check_store_on_a_plain_folder(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "plain").mkdir()
    layout = StoreLayout(str(tmp_path / "plain"))
    with pytest.raises(NotAStoreError, match=r"plain is not a deltawheel store: .*_meta is not a Delta "
                       r"table.*deltawheel migrate --store .*plain --apply"):
        migrations.check_store(spark, layout)


def test_store_newer_than_code(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    spark.createDataFrame([(99, "from_the_future", 0, "9.9.9")],
                          schema="version INT, name STRING, applied_ms BIGINT, deltawheel_version STRING"
                          ).write.format("delta").mode("append").save(migrated_store.meta)
    with pytest.raises(SchemaTooNewError, match="schema version 99, .* up to 8; upgrade deltawheel"):
        migrations.check_store(spark, migrated_store)
    with pytest.raises(SchemaTooNewError, match="upgrade deltawheel"):
        migrations.apply(spark, migrated_store, dry_run=False)


def test_store_older_than_code(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, migrated_store.meta).delete("version >= 2")
    with pytest.raises(MigrationError, match=r"schema version 1, this deltawheel needs 8; "
                       r"run 'deltawheel migrate --store .* --apply'"):
        migrations.check_store(spark, migrated_store)
    assert [s.version for s in migrations.plan(spark, migrated_store)] == [2, 3, 4, 5, 6, 7, 8]
    assert [s.version for s in migrations.apply(spark, migrated_store, dry_run=False)] == [2, 3, 4, 5, 6, 7, 8]
    assert migrations.check_store(spark, migrated_store) == 8
    props = spark.sql(f"SHOW TBLPROPERTIES delta.`{migrated_store.rows}`").collect()
    assert {r["key"]: r["value"] for r in props}["delta.checkpointInterval"] == "2147483647"


def test_failed_step_is_reported_and_earlier_steps_stay_recorded(spark, store_layout) -> None:  # type: ignore[no-untyped-def]
    # somebody else's Delta table sits where dead_letters should be
    spark.createDataFrame([(1,)], "x INT").write.format("delta").save(store_layout.dead_letters)
    with pytest.raises(MigrationError, match=r"migration 2 \(dead_letters_late_data\) failed .*already "
                       r"exists with other columns: it lacks computation string.*resumes at this step"):
        migrations.apply(spark, store_layout, dry_run=False)
    assert migrations.applied_version(spark, store_layout) == 1
    shutil.rmtree(store_layout.dead_letters)
    assert [s.version for s in migrations.apply(spark, store_layout, dry_run=False)] == [2, 3, 4, 5, 6, 7, 8]


# --- KeyRow round-trips ---------------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_i64 = st.integers(-(2**63), 2**63 - 1)
_timers = st.lists(
    st.builds(Timer, time_ms=_i64, tag=_text, domain=st.sampled_from(list(TimeDomain))), max_size=4
).map(lambda ts: tuple(sorted(ts)))
key_rows = st.builds(
    KeyRow,
    computation=st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True),
    key=_text.filter(bool),
    interval=st.integers(0, 2**31 - 1),
    state=st.none() | st.binary(max_size=30),
    codec=st.sampled_from(["json", "msgpack", "pickle"]),
    timers=_timers,
    record_ids=st.lists(st.builds(SeenId, record_id=_text, seen_ms=_i64), max_size=4).map(tuple),
    pending=st.lists(st.builds(Production, production_id=_text, stream=_text, key=_text,
                               value=st.binary(max_size=20), timestamp_ms=_i64,
                               codec=st.sampled_from(["json", "msgpack"])), max_size=3).map(tuple),
    watermark_hold_ms=st.none() | _i64,
    sequencer=st.integers(0, 2**63 - 1),
    commit_id=_text,
    updated_ms=_i64,
    timer_seq=st.integers(0, 2**63 - 1),
)


@settings(max_examples=300, deadline=None)
@given(key_rows)
def test_key_row_round_trip_in_python(row: KeyRow) -> None:
    assert KeyRow.from_row(row.to_row()) == row


@pytest.fixture(scope="module")
def shared_store(migrated_template, tmp_path_factory):  # type: ignore[no-untyped-def]
    """A migrated store (a copy of the template: applying the migrations is tested above)."""
    from conftest import copy_migrated_store

    root = tmp_path_factory.mktemp("roundtrip") / "store"
    copy_migrated_store(migrated_template, root)
    return StoreLayout(str(root))


# eight generated lists of rows to a Delta append (one Spark write and read per example)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=st.lists(st.lists(key_rows, min_size=1, max_size=5), min_size=8, max_size=8))
def test_key_row_round_trip_through_the_migrated_delta_table(spark, shared_store, lists) -> None:  # type: ignore[no-untyped-def]
    tags = [uuid.uuid4().hex[:8] for _ in lists]
    sent = {tag: [r.with_(computation=f"{r.computation}_{tag}", key=f"{i}:{r.key}") for i, r in enumerate(rows)]
            for tag, rows in zip(tags, lists, strict=True)}
    df = spark.createDataFrame([r.to_row() for rows in sent.values() for r in rows], schema=rows_schema_ddl())
    df.write.format("delta").mode("append").save(shared_store.rows)
    back: dict[str, list[KeyRow]] = {tag: [] for tag in tags}
    for r in (spark.read.format("delta").load(shared_store.rows)
              .where(" OR ".join(f"computation LIKE '%\\_{tag}'" for tag in tags)).collect()):
        back[r["computation"].rsplit("_", 1)[1]].append(KeyRow.from_row(r))
    for tag, rows in sent.items():
        assert sorted(back[tag], key=lambda r: r.key) == sorted(rows, key=lambda r: r.key)


# a table of up to sixteen generated rows per example (made, then migrated twice: the Spark jobs)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(key_rows, min_size=1, max_size=16))
def test_rows_written_before_the_timer_seq_migration_read_back_with_a_zero_counter(spark, tmp_path_factory,
                                                                                  rows) -> None:  # type: ignore[no-untyped-def]
    """Migration 4 adds ``timer_seq`` to a rows table of format 1 (its rows read back with counter
    0, by Spark and by the image path's file reader), and a second run changes nothing."""
    import pyarrow.parquet as pq
    from delta.tables import DeltaTable
    from deltawheel.migrations import m0004_timer_seq
    from deltawheel.statestore.delta.storefs import TableFiles
    from deltawheel.statestore.rowtable.frames import arrow_schema
    from deltawheel.statestore.rowtable.rows import rows_file_ddl
    from deltawheel.statestore.writepath.image.files import read_rows_file

    layout = StoreLayout(str(tmp_path_factory.mktemp("v1") / "store"))
    old_ddl = rows_schema_ddl().replace(", timer_seq BIGINT", "")
    assert old_ddl != rows_schema_ddl()
    rows = [r.with_(key=f"{i}:{r.key}", timer_seq=0) for i, r in enumerate(rows)]
    old = [{k: v for k, v in r.to_row().items() if k != "timer_seq"} for r in rows]
    spark.createDataFrame(old, schema=old_ddl).write.format("delta").partitionBy(
        "computation", "interval").save(layout.rows)
    m0004_timer_seq.apply(spark, layout)
    versions = _history_len(spark, layout.rows)
    m0004_timer_seq.apply(spark, layout)  # again: the column exists, the property is set already
    assert "timer_seq" in DeltaTable.forPath(spark, layout.rows).toDF().columns
    back = spark.read.format("delta").load(layout.rows).collect()
    assert sorted((KeyRow.from_row(r) for r in back), key=lambda r: r.key) == sorted(rows, key=lambda r: r.key)
    assert _history_len(spark, layout.rows) <= versions + 1
    files = list(Path(layout.rows).rglob("*.parquet"))
    schema = arrow_schema(rows_file_ddl())
    for f in files:
        assert "timer_seq" not in pq.read_schema(f).names
        t = read_rows_file(TableFiles(str(f.parent)), f.name, schema)
        assert t.schema == schema and t.column("timer_seq").null_count == t.num_rows


def test_column_comments_on_existing_tables(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    from deltawheel.migrations import m0005_column_comments
    from deltawheel.statestore import comments
    from deltawheel.statestore.writepath.streams import ensure_stream_table, stream_schema_ddl

    def commented(path: str) -> dict[str, str]:
        return {f.name: f.metadata.get("comment", "") for f in spark.read.format("delta").load(path).schema.fields}

    assert commented(migrated_store.rows)["pending"] == comments.ROWS["pending"]
    assert all(commented(migrated_store.late_data).values())
    # a stream table written before the comments existed (no comments), and one made now (commented)
    old = f"{migrated_store.streams_root}/clicks"
    spark.createDataFrame([], stream_schema_ddl()).write.format("delta").save(old)
    assert not any(commented(old).values())
    assert all(commented(ensure_stream_table(spark, migrated_store, "views")).values())
    m0005_column_comments.apply(spark, migrated_store)
    assert commented(old) == dict(comments.STREAM)
    assert comments.comment_table(spark, old, comments.STREAM) == 0  # already commented: no commit


def test_background_log_checkpoints_on_an_existing_store(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """A store at schema version 5 (its tables checkpointed by their commits every 100 versions, a
    stream table made then): migration 6 moves every one of its tables to background checkpoints,
    and re-running it commits nothing."""
    from delta.tables import DeltaTable
    from deltawheel.migrations import m0006_background_log_checkpoints as m6
    from deltawheel.statestore.writepath.streams import ensure_stream_table

    def interval(path: str) -> str | None:
        props = spark.sql(f"SHOW TBLPROPERTIES delta.`{path}`").collect()
        return {r["key"]: r["value"] for r in props}.get("delta.checkpointInterval")

    made_now = ensure_stream_table(spark, migrated_store, "views")
    assert interval(made_now) == "2147483647"  # a stream table made now has it from the start
    old = f"{migrated_store.streams_root}/clicks"  # one made by a store at version 5
    spark.sql(f"CREATE TABLE delta.`{old}` (record_id STRING) USING DELTA "
              "TBLPROPERTIES ('delta.checkpointInterval' = '100')")
    spark.sql(f"ALTER TABLE delta.`{migrated_store.rows}` SET TBLPROPERTIES ('delta.checkpointInterval' = '100')")
    DeltaTable.forPath(spark, migrated_store.meta).delete("version = 6")
    assert [s.version for s in migrations.apply(spark, migrated_store, dry_run=False)] == [6]
    tables = m6.tables(spark, migrated_store)
    assert sorted(tables) == sorted([migrated_store.rows, migrated_store.dead_letters, migrated_store.late_data,
                                     old, made_now])
    assert {t: interval(t) for t in tables} == {t: "2147483647" for t in tables}
    history = {t: _history_len(spark, t) for t in tables}
    m6.apply(spark, migrated_store)
    assert {t: _history_len(spark, t) for t in tables} == history


def test_delta_files_are_folded_into_one_file_per_interval(spark, migrated_store) -> None:  # type: ignore[no-untyped-def]
    """A store at schema version 6 as the image path's delta files left it (an interval of two
    files, older rows marked by a deletion vector, beside a file of the changed keys): the dry run
    plans migration 7 and changes nothing; migration 7 rewrites each such interval as one plain
    file with the same rows, leaves a one-file interval alone, and re-running commits nothing."""
    import pyarrow.parquet as pq
    from delta.tables import DeltaTable
    from deltawheel.migrations import m0007_fold_delta_files as m7
    from deltawheel.statestore.delta.log import read_snapshot
    from deltawheel.statestore.delta.txn import decode_path
    from dv_util import mark_deleted

    rows = migrated_store.rows
    # interval 0: a's and b's rows, then a delta file of a's new row and c's; interval 1: one file
    for iv, keys in ((0, (("a", b"a"), ("b", b"b"))), (0, (("a", b"\xff"), ("c", b"c"))), (1, (("x", b"x"),))):
        data = [KeyRow(computation="c", key=k, interval=iv, state=v).to_row() for k, v in keys]
        spark.createDataFrame(data, schema=rows_schema_ddl()).coalesce(1).write.format("delta").mode(
            "append").save(rows)
    for a in read_snapshot(rows).adds:  # a's old row marked deleted in the older file
        keys = pq.read_table(f"{rows}/{decode_path(a['path'])}", columns=["key"]).column("key").to_pylist()
        if "b" in keys:
            mark_deleted(spark, rows, a["path"], [keys.index("a")])

    def files() -> dict[int, list[dict[str, Any]]]:
        snap = read_snapshot(rows)
        assert snap is not None
        out: dict[int, list[dict[str, Any]]] = {}
        for a in snap.adds:
            out.setdefault(int(a["partitionValues"]["interval"]), []).append(a)
        return out

    def states() -> list[tuple[int, str, bytes]]:
        got = spark.read.format("delta").load(rows).select("interval", "key", "state").collect()
        return sorted((r["interval"], r["key"], bytes(r["state"])) for r in got)

    before, held = files(), states()
    assert len(before[0]) == 2 and any(a.get("deletionVector") for a in before[0])
    assert held == [(0, "a", b"\xff"), (0, "b", b"b"), (0, "c", b"c"), (1, "x", b"x")]
    DeltaTable.forPath(spark, migrated_store.meta).delete("version = 7")
    assert [s.version for s in migrations.apply(spark, migrated_store)] == [7]  # the dry run
    assert files() == before and sorted(m7.to_fold(spark, migrated_store)[1]["c"]) == [0]
    assert [s.version for s in migrations.apply(spark, migrated_store, dry_run=False)] == [7]
    after = files()
    assert len(after[0]) == 1 and not after[0][0].get("deletionVector") and after[1] == before[1]
    assert states() == held
    versions = _history_len(spark, rows)
    m7.apply(spark, migrated_store)
    assert _history_len(spark, rows) == versions and m7.to_fold(spark, migrated_store)[1] == {}


def test_a_half_created_table_is_named_with_what_to_do(spark, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A _delta_log folder without any commit (a creation that failed part way) stops the migration
    with the folder to remove; once removed, the migration goes through."""
    from deltawheel.cli import main

    store = tmp_path / "store"
    (store / "_meta" / "_delta_log" / "_staged_commits").mkdir(parents=True)
    assert main(["migrate", "--store", str(store), "--apply"]) == 3
    err = capsys.readouterr().err
    assert (f"{store}/_meta has a _delta_log folder without any commit" in err
            and f"remove {store}/_meta and re-run 'deltawheel migrate --apply'" in err), err
    shutil.rmtree(store / "_meta")
    assert main(["migrate", "--store", str(store), "--apply"]) == 0
    assert migrations.check_store(spark, StoreLayout(str(store))) == migrations.CODE_SCHEMA_VERSION


def test_two_starts_at_once_migrate_a_new_store_once_and_an_up_to_date_store_takes_no_lock(
        spark, store_layout, zk_config) -> None:  # type: ignore[no-untyped-def]
    """``apply_when_pending`` as two pipeline starts call it: on a new store, racing, the migrations
    run once (each step recorded once); on the migrated store no lock is taken at all."""
    import threading

    from deltawheel.statestore.zk.client import connect

    taken: list[str] = []
    clients = [connect(zk_config), connect(zk_config)]

    def lock_of(client: Any, who: str) -> Any:
        def make() -> Any:
            taken.append(who)
            return client.Lock("/locks/migrate/racing", who)
        return make

    ran: dict[str, list[Any]] = {}
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            ran[f"start{i}"] = migrations.apply_when_pending(spark, store_layout, lock_of(clients[i], f"start{i}"))
        except BaseException as exc:
            errors.append(exc)

    try:
        threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
        # one start ran every migration, the other found them done under the lock (or before it)
        assert sorted(len(v) for v in ran.values()) == [0, len(migrations.MIGRATIONS)]
        versions = [r["version"] for r in spark.read.format("delta").load(store_layout.meta).collect()]
        assert sorted(versions) == sorted(m.VERSION for m in migrations.MIGRATIONS)  # each recorded once
        assert 1 <= len(taken) <= 2
        taken.clear()
        assert migrations.apply_when_pending(spark, store_layout, lock_of(clients[0], "later")) == []
        assert taken == []  # up to date: no lock
    finally:
        for c in clients:
            c.stop()
            c.close()


@pytest.mark.parametrize(
    "any_migrated_store", ["local", pytest.param("s3a", marks=[pytest.mark.objectstore, pytest.mark.slow])],
    indirect=True)
def test_migration_8_gives_each_computation_a_table_whose_versions_go_on(spark, any_migrated_store,  # type: ignore[no-untyped-def]
                                                                          monkeypatch) -> None:
    """Two computations' rows in the store's first rows table, as schema 7 wrote them: migration 8
    moves each into a table of its own whose next version is past every version of the first table
    (a stream's delivery records those) and empties the first table; a run that died half way
    (a's table done, b's copied without its split commit) is finished by the next run."""
    from deltawheel.migrations import m0008_rows_per_computation as m8
    from deltawheel.statestore.delta.log import read_snapshot
    from deltawheel.statestore.delta.storefs import table_files
    from deltawheel.statestore.rowtable.tables import list_computations

    migrated_store = any_migrated_store

    def snapshot(path: str) -> Any:
        snap = read_snapshot(table_files(spark, path) or path)
        assert snap is not None
        return snap

    rows = migrated_store.rows
    for comp, keys in (("a", ("k1", "k2")), ("b", ("k3",))):
        data = [KeyRow(computation=comp, key=k, interval=i, state=k.encode()).to_row() for i, k in enumerate(keys)]
        spark.createDataFrame(data, schema=rows_schema_ddl()).write.format("delta").mode("append").save(rows)
    spark.sql(f"DELETE FROM delta.`{migrated_store.meta}` WHERE version = 8")
    before = snapshot(rows).version
    assert list_computations(spark, migrated_store) == []

    def content(path: str) -> list[tuple[str, str, int, bytes]]:
        return sorted((r["computation"], r["key"], r["interval"], bytes(r["state"]))
                      for r in spark.read.format("delta").load(path).collect())

    real = m8.TableLog.commit

    def dies_at_b(self, **kw):  # type: ignore[no-untyped-def]
        if '"computation": "b"' in (kw.get("user_metadata") or ""):
            raise OSError("the process died")
        return real(self, **kw)

    monkeypatch.setattr(m8.TableLog, "commit", dies_at_b)
    with pytest.raises(MigrationError, match="migration 8 .*the process died"):
        migrations.apply(spark, migrated_store, dry_run=False)
    monkeypatch.undo()
    assert snapshot(rows).adds != ()  # the first table still holds every row
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # a new process: nothing of the first run cached
    assert [s.version for s in migrations.apply(spark, migrated_store, dry_run=False)] == [8]
    assert list_computations(spark, migrated_store) == ["a", "b"]
    assert content(migrated_store.rows_of("a")) == [("a", "k1", 0, b"k1"), ("a", "k2", 1, b"k2")]
    assert content(migrated_store.rows_of("b")) == [("b", "k3", 0, b"k3")]
    for comp in ("a", "b"):
        assert snapshot(migrated_store.rows_of(comp)).version == before + 1
    assert snapshot(rows).adds == ()
    assert migrations.apply(spark, migrated_store, dry_run=False) == []
