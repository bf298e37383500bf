"""Numbered, idempotent schema migrations of a store's Delta tables: each a module ``mNNNN_<name>.py``
with ``VERSION``, ``NAME``, ``describe(layout)`` and ``apply(spark, layout)``, safe to re-run, recorded
in ``_meta`` once it succeeds; the highest recorded is the store's schema version."""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any, Callable, ContextManager

from deltawheel.statestore.delta.jvm import require_classic_session
from deltawheel.statestore.delta.log import local_path, local_table_exists, read_snapshot
from deltawheel.statestore.delta.storefs import TableFiles, files_for, table_files
from deltawheel.statestore.delta.txn import decode_path
from deltawheel.statestore.exceptions import MigrationError, NotAStoreError, SchemaTooNewError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.objectstore.errors import probe_store
from deltawheel.statestore.sqltext import sql_path, sql_str

from . import (
    m0001_meta_and_rows,
    m0002_dead_letters_late_data,
    m0003_checkpoint_interval,
    m0004_timer_seq,
    m0005_column_comments,
    m0006_background_log_checkpoints,
    m0007_fold_delta_files,
    m0008_rows_per_computation,
)

__all__ = ["CODE_SCHEMA_VERSION", "MIGRATIONS", "PlannedMigration", "applied_versions", "applied_version",
           "plan", "apply", "apply_when_pending", "check_store", "rows_table_id"]

MIGRATIONS: tuple[ModuleType, ...] = (m0001_meta_and_rows, m0002_dead_letters_late_data, m0003_checkpoint_interval,
                                      m0004_timer_seq, m0005_column_comments, m0006_background_log_checkpoints,
                                      m0007_fold_delta_files, m0008_rows_per_computation)
CODE_SCHEMA_VERSION: int = max(m.VERSION for m in MIGRATIONS)


@dataclass(frozen=True)
class PlannedMigration:
    """A migration that has not run on a store yet."""

    version: int
    name: str
    description: str


def _files(spark: Any, path: str) -> str | TableFiles | None:
    """``path`` as Python reads it: a local path, an ``s3a://`` table's files, None for Spark only."""
    return path if local_path(path) is not None else table_files(spark, path)


def _is_delta_table(spark: Any, path: str) -> bool:
    from delta.tables import DeltaTable

    files = _files(spark, path)  # read by Python where it can: Delta's check costs a snapshot load
    found = local_table_exists(files) if files is not None else None
    return found if found is not None else bool(DeltaTable.isDeltaTable(spark, path))


def _direct_versions(spark: Any, path: str) -> set[int] | None:
    """The ``version`` column of a ``_meta`` table read by Python (None: ask Delta; saves a Spark job)."""
    if (files := _files(spark, path)) is None:
        return None
    snap = read_snapshot(files)
    if snap is None or any(a.get("deletionVector") for a in snap.adds):
        return None
    table = files_for(files) if isinstance(files, str) else files
    if table is None:  # not met: a path _files gives as a string is a local one
        return None
    out: set[int] = set()
    for a in snap.adds:
        col = table.read_parquet(decode_path(a["path"]), columns=["version"]).column("version")
        out.update(int(v) for v in col.to_pylist() if v is not None)
    return out


def _deltawheel_version() -> str:
    try:
        return metadata.version("deltawheel")
    except metadata.PackageNotFoundError:
        return "unknown"


def applied_versions(spark: Any, layout: StoreLayout) -> set[int]:
    """The versions recorded in the store's ``_meta`` table (empty if there is none)."""
    direct = _direct_versions(spark, layout.meta)  # its log and files read by Python
    if direct is not None:
        return direct
    if not _is_delta_table(spark, layout.meta):
        return set()
    rows = spark.read.format("delta").load(layout.meta).select("version").collect()
    return {int(r["version"]) for r in rows}


def applied_version(spark: Any, layout: StoreLayout) -> int:
    """The store's schema version: the highest recorded migration, 0 if ``_meta`` doesn't exist."""
    return max(applied_versions(spark, layout), default=0)


def plan(spark: Any, layout: StoreLayout) -> list[PlannedMigration]:
    """The migrations not yet recorded in the store, in the order :func:`apply` runs them.

    Raises:
        SchemaTooNewError: the store records a version this code doesn't know.
        ObjectStoreUnreachableError, BucketMissingError, ObjectStoreAuthError: see docs/objectstore.md.
        SparkConnectSessionError: ``spark`` is a Spark Connect session.
    """
    require_classic_session(spark)
    probe_store(spark, layout)
    done = applied_versions(spark, layout)
    _check_not_too_new(layout, max(done, default=0))
    return [PlannedMigration(version=m.VERSION, name=m.NAME, description=m.describe(layout))
            for m in sorted(MIGRATIONS, key=lambda m: m.VERSION) if m.VERSION not in done]


def apply(spark: Any, layout: StoreLayout, *, dry_run: bool = True,
          on_step: Callable[[PlannedMigration, int], None] | None = None) -> list[PlannedMigration]:
    """Run the pending migrations in order and return them; ``dry_run`` (the default) only returns them.

    Each is recorded right after it succeeds (a run that dies resumes at the first unrecorded one);
    ``on_step(step, total)`` is called before each runs.

    Raises:
        SchemaTooNewError: the store was migrated by a newer deltawheel.
        MigrationError: a migration failed (the message names it; earlier ones stay recorded).
    """
    pending = plan(spark, layout)
    if dry_run:
        return pending
    by_version = {m.VERSION: m for m in MIGRATIONS}
    for step in pending:
        if on_step is not None:  # progress: the step about to run, of how many
            on_step(step, len(pending))
        try:
            by_version[step.version].apply(spark, layout)
        except MigrationError as exc:  # says what to do itself
            raise MigrationError(f"migration {step.version} ({step.name}) failed on {layout.root}: {exc} "
                                 "(the migration resumes at this step)") from exc
        except Exception as exc:
            raise MigrationError(f"migration {step.version} ({step.name}) failed on {layout.root}: {exc}. "
                                 "Fix the cause and re-run 'deltawheel migrate --apply'; it resumes at "
                                 "this step") from exc
        _record(spark, layout, step)
    return pending


def apply_when_pending(spark: Any, layout: StoreLayout, lock: Callable[[], ContextManager[Any]], *,
                       check: Callable[[list[PlannedMigration]], None] | None = None,
                       planned: list[PlannedMigration] | None = None) -> list[PlannedMigration]:
    """:func:`apply` under ``lock()``, taken only when :func:`plan` finds something; returns what ran.

    The plan is made again under the lock, where ``check(pending)`` may raise to refuse (nothing
    changed); ``planned``: a fresh plan to use instead of planning here. Raises as :func:`apply`.
    """
    if not (plan(spark, layout) if planned is None else planned):
        return []
    with lock():
        if check is not None:
            check(plan(spark, layout))
        return apply(spark, layout, dry_run=False)


def _record(spark: Any, layout: StoreLayout, step: PlannedMigration) -> None:
    # SQL text, not ``createDataFrame``: a frame of Python rows forks a Python worker per task
    spark.sql(f"INSERT INTO {sql_path(layout.meta)} (version, name, applied_ms, deltawheel_version) "
              f"VALUES ({int(step.version)}, {sql_str(step.name)}, {int(time.time() * 1000)}, "
              f"{sql_str(_deltawheel_version())})")


def _check_not_too_new(layout: StoreLayout, version: int) -> None:
    if version > CODE_SCHEMA_VERSION:
        raise SchemaTooNewError(f"store {layout.root} has schema version {version}, but this deltawheel "
                                f"only knows versions up to {CODE_SCHEMA_VERSION}; upgrade deltawheel to use "
                                "this store")


def check_store(spark: Any, layout: StoreLayout) -> int:
    """Check that ``layout`` is a store at exactly :data:`CODE_SCHEMA_VERSION` and return that version.

    Raises:
        NotAStoreError: ``layout.meta`` is not a Delta table.
        SchemaTooNewError: the store was migrated by a newer deltawheel.
        MigrationError: the store is older than this code.
        ObjectStoreUnreachableError, BucketMissingError, ObjectStoreAuthError: see docs/objectstore.md.
    """
    probe_store(spark, layout)
    if not _is_delta_table(spark, layout.meta):
        raise NotAStoreError(f"{layout.root} is not a deltawheel store: {layout.meta} is not a Delta table. "
                             f"Create or upgrade it with 'deltawheel migrate --store {layout.root} --apply'")
    version = applied_version(spark, layout)
    _check_not_too_new(layout, version)
    if version < CODE_SCHEMA_VERSION:
        raise MigrationError(f"store {layout.root} has schema version {version}, this deltawheel needs "
                             f"{CODE_SCHEMA_VERSION}; run 'deltawheel migrate --store {layout.root} --apply'")
    return version


def rows_table_id(spark: Any, layout: StoreLayout) -> str | None:
    """The Delta table id of the store's rows table (None: no rows table yet, a new store)."""
    from deltawheel.statestore.delta.txn import TableLog

    if not _is_delta_table(spark, layout.rows):
        return None
    return str(TableLog(spark, layout.rows).table_id())
