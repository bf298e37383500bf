"""Replay: re-run one computation from a past rows-table version into a shadow store, seeded with
its rows as of that version, each batch on its recorded inputs and watermark; then the diff against
the live store, which is only read. docs/replay.md."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.delta.storefs import TableFiles
from deltawheel.statestore.delta.txn import TableLog
from deltawheel.statestore.exceptions import (
    ConfigError,
    ReplayCodeError,
    ReplayTargetError,
    ReplayUnavailableError,
)
from deltawheel.statestore.inspection.diff import StoreDiff
from deltawheel.statestore.inspection.positions import (
    ComputationCommit,
    ToolChange,
    commits_after,
    computation_commits,
    replay_horizon,
    tool_changes,
    version_at_timestamp,
)
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import FENCE_KEY, interval_of

from ..computation import Computation
from ..protocol.reports import BatchReport, describe_watermark
from ..sources.injector import Injector
from .replay_diff import replay_diff
from .replay_inputs import check_files, check_inputs, input_bytes, replay_input
from .replay_marker import MARKER, into_files, marker_of, read_marker, store_id
from .replay_run import ReplayRun
from .replay_shared import held, seed_marks, skip_sets, skipped_files

__all__ = ["ReplayPlan", "ReplayResult", "MARKER", "plan_replay", "replay", "load_code", "shadow_chroot",
           "read_marker", "replay_scope", "store_id", "into_files"]

BatchSkips = tuple[tuple[tuple[int, ...], tuple[str, ...]], ...]  # (intervals, files): replay_shared.skipped_files
SHOWN = 3  # input file names the plan shows per batch and kind (the rest counted)


def _some(names: Sequence[str]) -> str:
    """``names`` for a terminal line: all of a few, else the first :data:`SHOWN` and a count."""
    if len(names) <= SHOWN:
        return ", ".join(names)
    return f"{len(names)} files: {', '.join(names[:SHOWN])} and {len(names) - SHOWN} more"


@dataclass(frozen=True, kw_only=True)
class ReplayPlan:
    """What a replay reads and writes (``--plan`` prints it); ``from_version`` None: empty state."""

    store: str
    into: str
    pipeline: str
    computation: str
    from_version: int | None
    to_version: int
    horizon: int | None
    batches: tuple[ComputationCommit, ...]
    input_files: int
    input_bytes: int | None
    resume_after: int | None = None
    intervals: tuple[int, ...] | None = None
    keys: tuple[str, ...] | None = None
    tool_changes: tuple[ToolChange, ...] = ()
    skips: tuple[BatchSkips, ...] = ()

    def describe(self) -> str:
        """The plan as lines for a terminal."""
        start = "the start (empty state)" if self.from_version is None else f"rows version {self.from_version}"
        lines = [f"replay {self.computation} of pipeline {self.pipeline} from {start} up to rows version "
                 f"{self.to_version}",
                 f"  read:  {self.store} (rows as of the start version; input files of {len(self.batches)} batches: "
                 f"{self.input_files} files" + (f", {self.input_bytes} bytes" if self.input_bytes is not None else "")
                 + ")",
                 f"  write: {self.into} (its own rows, stream tables and ZooKeeper chroot; the live store is "
                 "not written and no live lease is taken)"]
        if self.intervals is not None:
            lines.append(f"  only intervals {list(self.intervals)}"
                         + (f" (those of keys {list(self.keys)}; the diff compares only these keys)" if self.keys else "")
                         + ": the other intervals' state and records are left out")
        lines += [f"  note: {t.describe()}" for t in self.tool_changes]
        if self.resume_after is not None:
            lines.append(f"  continues a replay that reached rows version {self.resume_after}")
        if self.horizon is not None:
            lines.append(f"  replay possible from rows version {self.horizon} on")
        sets = {held(c) for c in self.batches}
        skips = self.skips or ((),) * len(self.batches)
        for c, skipped in zip(self.batches, skips, strict=True):
            h = held(c)
            if self.intervals is not None and h and not set(h) & set(self.intervals):
                lines.append(f"  batch {c.batch_id} (live version {c.version}): not re-run: its instance held "
                             f"intervals {list(h)}, none of the replay's")
                continue
            read = f"{len(c.files or ())} input files"
            if c.kafka is not None:
                read = f"{sum(e - s for parts in c.kafka.values() for s, e in parts.values())} Kafka records " \
                       f"({', '.join(f'{t}/{p} [{s}, {e})' for t, ps in c.kafka.items() for p, (s, e) in ps.items())})" \
                       + (f" and {len(c.files or ())} input files" if c.files else "")
            lines.append(f"  batch {c.batch_id} (live version {c.version}): {read}, "
                         f"input watermark {describe_watermark(c.input_ms)}"
                         + (f", over intervals {list(h)} (those its instance held)" if len(sets) > 1 else ""))
            if c.files:
                lines.append(f"    reads {_some(c.files)}")
            lines += [f"    skips the records of intervals {list(ivs)} in {_some(files)}: earlier commits processed "
                      "them for those intervals (the live batch skipped them too)" for ivs, files in skipped]
        return "\n".join(lines)


@dataclass(frozen=True)
class ReplayResult:
    """A finished replay: its plan, the reports of its batches, the diff against the live store."""

    plan: ReplayPlan
    reports: tuple[BatchReport, ...]
    diff: StoreDiff | None


#: the entry-point group where a package names its pipelines' computations for the tools
PIPELINES_GROUP = "deltawheel.pipelines"


def registered_computation(pipeline: str, computation: str) -> Computation | None:
    """The computation ``computation`` of the pipeline registered as ``pipeline`` (None: none)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=PIPELINES_GROUP):
        if ep.name == pipeline:
            for c in ep.load()():
                if c.name == computation:
                    return c  # type: ignore[no-any-return]
    return None


def load_code(spec: str, computation: str) -> Computation:
    """The computation ``MODULE:NAME`` names (a class, an instance, or a factory); else ReplayCodeError."""
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise ReplayCodeError(f"--code {spec!r}: give MODULE:CLASS (e.g. mypkg.model:FixedModel), importable "
                              "from the current directory or the Python path")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ReplayCodeError(f"--code {spec!r} does not import ({exc!r}); check the module is on the Python "
                              "path (PYTHONPATH) and the name is spelled right") from exc
    try:
        made = obj() if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Computation)) else obj
    except Exception as exc:
        raise ReplayCodeError(f"--code {spec!r}: creating it without arguments failed ({exc!r})") from exc
    if not isinstance(made, Computation):
        raise ReplayCodeError(f"--code {spec!r} is a {type(made).__name__}, not a Computation: name a subclass "
                              "of deltawheel.Computation")
    if isinstance(obj, type) or callable(obj):
        from pyspark import cloudpickle

        # Spark's Python workers may not have the module on their path: its code travels by value
        cloudpickle.register_pickle_by_value(importlib.import_module(type(made).__module__))
    if made.name != computation:
        raise ReplayCodeError(f"--code {spec!r} is computation {made.name!r}, not {computation!r}: the replayed "
                              f"code must keep the computation's name (set name = {computation!r})")
    return made


def replay_scope(num_intervals: int, *, intervals: Sequence[int] | None = None,
                 keys: Sequence[str] | None = None) -> tuple[int, ...] | None:
    """The intervals a partial replay runs: ``intervals``, or those of ``keys`` (None: all); else ConfigError."""
    if intervals is not None and keys is not None:
        raise ConfigError("give --intervals or --keys, not both: keys select their intervals (a key's interval is "
                          "crc32(key) mod num_intervals)")
    if keys is not None:
        if not keys or any(not k for k in keys):
            raise ConfigError(f"--keys {list(keys)}: give one or more non-empty keys, separated by commas")
        return tuple(sorted({interval_of(k, num_intervals) for k in keys}))
    if intervals is None:
        return None
    bad = sorted({i for i in intervals if not 0 <= i < num_intervals})
    if not intervals or bad:
        raise ConfigError(f"--intervals {list(intervals)}: the computation has intervals 0..{num_intervals - 1}"
                          + (f"; {bad} out of range" if bad else "; give at least one"))
    return tuple(sorted(set(intervals)))


def shadow_chroot(base: str, into: StoreLayout) -> str:
    """The ZooKeeper chroot of a shadow store: below ``base`` (the live one's), its own per folder."""
    return f"{base.rstrip('/')}-replay-{hashlib.sha1(into.root.encode()).hexdigest()[:12]}"


def _is_empty(files: TableFiles) -> bool:
    if files.is_local:
        return not os.path.isdir(files.root) or not os.listdir(files.root)
    from pyarrow import fs as pafs

    return not files.fs.get_file_info(pafs.FileSelector(files.root, allow_not_found=True, recursive=False))


def _check_into(store: StoreLayout, into: StoreLayout, *, pipeline: str, computation: str,
                spark: Any = None) -> dict[str, Any] | None:
    """The marker of a previous replay into ``into`` (None: a new one); ReplayTargetError if it is unfit."""
    files = into_files(spark, into)
    if store_id(into) == store_id(store):
        raise ReplayTargetError(f"--into {into.root} is the live store: a replay writes into a separate folder "
                                "(its own rows and stream tables) so that the live outputs are never duplicated; "
                                "give an empty folder")
    if _is_empty(files):
        return None
    m = marker_of(files)
    want = {"store": store_id(store), "pipeline": pipeline, "computation": computation}
    if m is None or {k: m.get(k) for k in want} != want:
        what = ("a store of pipeline " + repr(m.get("pipeline")) + ", computation " + repr(m.get("computation"))
                + " of " + str(m.get("store"))) if m is not None else "files that are not a replay of this computation"
        raise ReplayTargetError(f"--into {into.root} is not empty: it holds {what}. Give an empty folder, or the "
                                f"folder of an earlier replay of {computation} of pipeline {pipeline} of this store "
                                "to continue it")
    return m


def _check_source(spark: Any, store: StoreLayout, *, pipeline: str, computation: str) -> list[ComputationCommit]:
    if store.is_local and not os.path.isdir(os.path.join(store.root, "rows", "_delta_log")):
        from deltawheel.statestore.exceptions import NotAStoreError

        raise NotAStoreError(f"--store {store.root} has no rows table: not a deltawheel store (or a path typo)")
    if store.is_local and not os.path.isdir(os.path.join(store.root, "_checkpoints", pipeline)):
        known = sorted(os.listdir(os.path.join(store.root, "_checkpoints"))) \
            if os.path.isdir(os.path.join(store.root, "_checkpoints")) else []
        raise ConfigError(f"pipeline {pipeline!r} has never run on store {store.root} (pipelines that have: "
                          f"{', '.join(known) or 'none'}); check --pipeline")
    from deltawheel.statestore.rowtable.tables import list_computations

    commits = computation_commits(spark, store, computation) if computation in list_computations(spark, store) else []
    if not commits:
        raise ConfigError(f"computation {computation!r} has no commit in the rows table of {store.root}; check "
                          "--computation (deltawheel status --store DIR lists the computations)")
    return commits


def plan_replay(spark: Any, *, store: StoreLayout, into: StoreLayout, pipeline: str, computation: str,
                from_version: int | None = None, from_timestamp_ms: int | None = None, from_start: bool = False,
                to_version: int | None = None, intervals: Sequence[int] | None = None,
                keys: Sequence[str] | None = None, num_intervals: int | None = None,
                code: Computation | None = None, injectors: Sequence[Injector] = ()) -> ReplayPlan:
    """What a replay of ``computation`` would read and write: exactly one of ``from_version``,
    ``from_timestamp_ms`` and ``from_start``. Raises NotAStoreError, ConfigError, ReplayUnavailableError
    (no such version, or past the horizon), ReplayTargetError or InputGoneError."""
    scope = None
    if intervals is not None or keys is not None:
        if num_intervals is None:
            raise ConfigError("a replay of some intervals or keys needs the computation's num_intervals "
                              "(plan_replay(..., num_intervals=type(code).num_intervals))")
        scope = replay_scope(num_intervals, intervals=intervals, keys=keys)
    if sum((from_version is not None, from_timestamp_ms is not None, bool(from_start))) != 1:
        raise ConfigError("give exactly one of --from-version, --from-timestamp and --from-start")
    commits = _check_source(spark, store, pipeline=pipeline, computation=computation)
    marker = _check_into(store, into, pipeline=pipeline, computation=computation, spark=spark)
    horizon = replay_horizon(commits)
    newest = commits[-1].version
    if from_timestamp_ms is not None:
        from_version = version_at_timestamp(spark, store, computation, from_timestamp_ms)
    if from_start and horizon is not None:
        raise ReplayUnavailableError(f"{computation}: commits up to rows version {horizon} record no input positions, "
                                     f"so a replay cannot start from the start: use --from-version {horizon} or later")
    if from_version is not None:
        history = spark.sql(f"DESCRIBE HISTORY delta.`{store.rows_of(computation)}`").select("version").collect()
        versions = [int(r[0]) for r in history]
        oldest, latest = min(versions), max(versions)
        if from_version < oldest or from_version > latest:
            raise ReplayUnavailableError(
                f"rows version {from_version} does not exist in {computation}'s rows table of {store.root}: its log keeps versions {oldest} to "
                f"{latest} (older ones are past Delta's log retention); replay possible "
                f"from version {max(oldest, horizon or oldest)} on")
        if horizon is not None and from_version < horizon:
            raise ReplayUnavailableError(
                f"{computation}: rows version {from_version} is before the replay horizon: commits up to version "
                f"{horizon} record no input positions (written by an older deltawheel or a tool); replay from "
                f"version {horizon} or later")
    if to_version is not None and (to_version > newest or (from_version is not None and to_version < from_version)):
        raise ReplayUnavailableError(f"--to-version {to_version} must be between the start version and the newest "
                                     f"commit of {computation} ({newest})")
    resume = None if marker is None else int(marker["reached"])
    if marker is not None and marker.get("from_version") != from_version:
        raise ReplayTargetError(f"--into {into.root} holds a replay from version {marker.get('from_version')}, not "
                                f"{from_version}: give the same start to continue it, or an empty folder")
    if marker is not None and marker.get("intervals") != (None if scope is None else list(scope)):
        raise ReplayTargetError(f"--into {into.root} holds a replay of intervals "
                                f"{marker.get('intervals') or 'all'}, not {list(scope) if scope else 'all'}: give the "
                                "same --intervals/--keys to continue it, or an empty folder")
    start = from_version if resume is None else resume
    batches = tuple(commits_after(commits, start, to_version=to_version))
    files = sorted({f for c in batches for f in (c.files or ())})
    sizes = check_inputs(spark, store, batches)
    if code is not None:
        check_files(replay_input(spark, store, into, code, injectors), batches)
    return ReplayPlan(store=store.root, into=into.root, pipeline=pipeline, computation=computation,
                      from_version=from_version, to_version=to_version if to_version is not None else newest,
                      horizon=horizon, batches=batches, input_files=len(files), input_bytes=input_bytes(sizes, files),
                      resume_after=resume, intervals=scope, keys=None if keys is None else tuple(keys),
                      tool_changes=tuple(tool_changes(commits, from_version, to_version=to_version)),
                      skips=tuple(skipped_files(c, done, scope=scope)
                                  for c, done in zip(batches, skip_sets(commits, batches), strict=True)))


def _seed(spark: Any, store: StoreLayout, into: StoreLayout, plan: ReplayPlan, commits: Sequence[ComputationCommit]) -> None:
    """C's rows as of the start version of its table into its shadow rows table, with the mark of C's newest commit."""
    from deltawheel.statestore.rowtable.tables import ensure_rows_table
    from pyspark.sql import functions as F

    v = plan.from_version
    assert v is not None
    marks = seed_marks(commits, v)  # one per set of intervals an instance held (the newest last)
    meta: dict[str, Any] = {"deltawheel": 1, "kind": "replay-seed", "computation": plan.computation,
                            "replay": {"store": plan.store, "from_version": v}}
    if marks:
        meta["late"] = marks[0]
    try:
        rows = spark.read.format("delta").option("versionAsOf", v).load(store.rows_of(plan.computation))
    except Exception as exc:
        raise ReplayUnavailableError(f"rows version {v} of {store.rows_of(plan.computation)} cannot be read ({str(exc).splitlines()[0][:200]}): "
                                     "its files are past Delta's retention (VACUUM); replay from a newer version") from exc
    rows = rows.where((F.col("computation") == plan.computation) & (F.col("key") != FENCE_KEY))
    if plan.intervals is not None:
        rows = rows.where(F.col("interval").isin(list(plan.intervals)))
    rows = rows.withColumn("sequencer", F.lit(0).cast("long")).withColumn(
        "pending", F.expr("filter(pending, p -> false)"))  # the live store delivers those
    target = ensure_rows_table(spark, into, plan.computation)
    target_cols = spark.read.format("delta").load(target).columns
    (rows.select(*target_cols).write.format("delta").mode("append")
     .option("userMetadata", json.dumps(meta, sort_keys=True)).save(target))
    # the other instances' marks (newer): one empty commit each
    for mark in marks[1:]:
        TableLog(spark, target).commit(user_metadata=json.dumps({**meta, "late": mark}, sort_keys=True))


def replay(spark: Any, plan: ReplayPlan, *, code: Computation, zk: ZkConfig | None = None,
           injectors: Sequence[Injector] = (), write_path: str = "auto",
           progress: Callable[[str], None] | None = None, diff: bool = True, source: str | None = None,
           code_spec: str | None = None) -> ReplayResult:
    """Run ``plan`` with ``code``; returns the reports and the diff. ``zk`` None: an embedded server.
    ``source``: the live pipeline's MODULE:PIPELINE, recorded for promote (a ``.py`` file by its
    absolute path). Raises ReplayCodeError, ConfigError (an injector not given) or InputGoneError."""
    if source is not None and source.partition(":")[0].endswith(".py"):
        module, sep, name = source.partition(":")
        source = f"{os.path.abspath(module)}{sep}{name}"
    if code.name != plan.computation:
        raise ReplayCodeError(f"the replayed code is computation {code.name!r}, the plan replays {plan.computation!r}")
    store, into = StoreLayout(plan.store), StoreLayout(plan.into)
    commits = computation_commits(spark, store, plan.computation)
    run = ReplayRun(spark, plan, code=code, zk=zk, injectors=injectors, write_path=write_path, progress=progress,
                    seed=lambda: _seed(spark, store, into, plan, commits), source=source, code_spec=code_spec,
                    old=None if plan.resume_after is None else read_marker(into, spark=spark))
    run.check(commits, plan.batches)  # before anything is written
    with run:
        reports = run.run(plan.batches, commits)
        run.finish(plan.to_version)
    return ReplayResult(plan=plan, reports=tuple(reports), diff=replay_diff(
        spark, store, into, computation=plan.computation, from_version=plan.from_version, to_version=plan.to_version,
        num_intervals=type(code).num_intervals, streams=code.outputs, intervals=plan.intervals, keys=plan.keys,
        commits=commits) if diff else None)
