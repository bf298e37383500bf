"""Rows-table versions -> input positions: a replay from V re-runs the batch commits after V."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..delta.log import batch_metas, user_metadata
from ..exceptions import NotAStoreError, ReplayUnavailableError
from ..layout import StoreLayout
from ..objectstore.errors import raise_store_failure
from ..rowtable.inputfiles import entry_of, kafka_of

__all__ = ["ComputationCommit", "ToolChange", "computation_commits", "commits_since", "replay_horizon", "position_at",
           "commits_after", "tool_changes", "version_at_timestamp", "outside_commit_ids"]


@dataclass(frozen=True, kw_only=True)
class ComputationCommit:
    """One commit of a computation to its rows table and its input positions (``files`` None: none
    recorded); ``kind``: ``batch``, ``claim`` or a tool's; ``kafka``: offset ranges, start inclusive."""

    version: int
    timestamp_ms: int
    kind: str
    batch_id: int | None
    files: tuple[str, ...] | None
    input_ms: int | None
    late_ms: int | None
    late_raised: Mapping[int, int] = field(default_factory=dict)  # intervals it judged against a higher line
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)
    kafka: Mapping[str, Mapping[str, tuple[int, int]]] | None = None  # {topic: {partition: (start, end)}}

    @property
    def replayable(self) -> bool:
        """It records its input positions, or changes no user row (a claim)."""
        return self.files is not None or self.kind == "claim"

    @property
    def reruns(self) -> bool:
        """A replay re-runs it: a batch with recorded positions (not a claim, a tool's, a compaction)."""
        return self.files is not None and self.batch_id is not None and self.kind != "claim"


@dataclass(frozen=True)
class ToolChange:
    """A tool's commit (promote, repair) a replay does not re-run: the live state has its change."""

    version: int
    tool: str
    audit_id: str | None

    def describe(self) -> str:
        """One line for the plan and the diff."""
        return (f"the live state contains a {self.tool} change at rows version {self.version} (audit id "
                f"{self.audit_id}) that the replay does not: keys it wrote differ unless later input rewrote them")


def _history(spark: Any, layout: StoreLayout, computation: str) -> list[Any]:
    path = layout.rows_of(computation)
    try:
        return sorted(spark.sql(f"DESCRIBE HISTORY delta.`{path}`")
                      .select("version", "timestamp", "userMetadata").collect(), key=lambda r: r["version"])
    except Exception as exc:  # Spark's AnalysisException: not a Delta table
        raise_store_failure(exc, layout.root)
        raise NotAStoreError(f"{layout.root} has no rows table for computation {computation!r} ({path}): not a "
                             "deltawheel store, not migrated yet, or the computation never committed; check --store "
                             f"and --computation ({str(exc).splitlines()[0][:200]})") from exc


def computation_commits(spark: Any, layout: StoreLayout, computation: str) -> list[ComputationCommit]:
    """Oldest first, every commit of ``computation`` to its rows table (NotAStoreError: none)."""
    return [c for r in _history(spark, layout, computation)
            for c in _commits(int(r["version"]), int(r["timestamp"].timestamp() * 1000), r["userMetadata"], computation)]


def commits_since(spark: Any, layout: StoreLayout, computation: str, *, after: int) -> list[ComputationCommit]:
    """Oldest first, the commits of ``computation`` after version ``after`` (NotAStoreError: no table)."""
    from ..delta.log import commit_infos
    from ..delta.storefs import table_files

    files = table_files(spark, layout.rows_of(computation))
    infos = None if files is None else commit_infos(files, after=after)
    if infos is None:
        return [c for c in computation_commits(spark, layout, computation) if c.version > after]
    return [c for v, info in infos
            for c in _commits(v, int(info.get("timestamp") or 0), info.get("userMetadata"), computation)]


def _commits(version: int, timestamp_ms: int, user_meta: object, computation: str) -> list[ComputationCommit]:
    """The commits of ``computation`` a rows-table version holds: one, or a group commit's batches each
    (``delta/group.py``: they share the version); none where it is another's or not deltawheel's."""
    return [c for meta in batch_metas(user_metadata(user_meta))
            if (c := _commit(version, timestamp_ms, meta, computation)) is not None]


def _commit(version: int, timestamp_ms: int, meta: Mapping[str, Any], computation: str) -> ComputationCommit | None:
    """The commit of ``computation`` one batch's ``meta`` records (None: another's)."""
    if meta.get("computation") != computation:
        return None
    entry = entry_of(meta)
    late_entry = meta.get("late")
    late: dict[str, Any] = late_entry if isinstance(late_entry, dict) else {}
    return ComputationCommit(
        version=version, timestamp_ms=timestamp_ms,
        kind=str(meta.get("kind", "batch")), batch_id=None if entry is None else entry[0],
        files=None if entry is None else entry[1],
        input_ms=None if late.get("input_ms") is None else int(late["input_ms"]),
        late_ms=None if late.get("late_ms") is None else int(late["late_ms"]), meta=meta, kafka=kafka_of(meta),
        late_raised={int(i): int(ms) for i, ms in (late.get("raised") or {}).items()})


def replay_horizon(commits: Sequence[ComputationCommit]) -> int | None:
    """The first version a replay may start from: the newest commit without positions (None: none)."""
    missing = [c.version for c in commits if not c.replayable]
    return missing[-1] if missing else None


def position_at(commits: Sequence[ComputationCommit], version: int) -> frozenset[str] | None:
    """Every input file the computation's commits up to ``version`` read (None: one records none)."""
    out: set[str] = set()
    for c in commits:
        if c.version > version:
            break
        if not c.replayable:
            return None
        out.update(c.files or ())
    return frozenset(out)


def _inside(c: ComputationCommit, version: int | None, to_version: int | None) -> bool:
    """``c`` is after ``version`` (None: the start) and not after ``to_version`` (None: the end)."""
    return (version is None or c.version > version) and (to_version is None or c.version <= to_version)


def commits_after(commits: Sequence[ComputationCommit], version: int | None, *,
                  to_version: int | None = None) -> list[ComputationCommit]:
    """The batch commits a replay from ``version`` (None: the start) up to ``to_version`` re-runs.
    ReplayUnavailableError: one of them records no input positions (names the horizon)."""
    out = []
    for c in commits:
        if not _inside(c, version, to_version):
            continue
        if not c.replayable:
            h = replay_horizon(commits)
            raise ReplayUnavailableError(
                f"version {c.version} of the rows table of {c.meta.get('computation')!r} (kind {c.kind}) records no "
                f"input positions (written by an older deltawheel or a tool), so a replay cannot start before it: "
                f"replay from version {h} or later (--from-version {h})")
        if c.reruns:
            out.append(c)
    return out


def outside_commit_ids(commits: Sequence[ComputationCommit], version: int | None, *,
                       to_version: int | None = None) -> frozenset[str]:
    """The commit ids outside ``(version, to_version]`` whose batch id a commit inside has too (a flush's)."""
    ids = {c.batch_id for c in commits if c.reruns and _inside(c, version, to_version)}
    return frozenset(str(c.meta["commit_id"]) for c in commits
                     if c.batch_id in ids and not _inside(c, version, to_version) and c.meta.get("commit_id"))


def tool_changes(commits: Sequence[ComputationCommit], version: int | None, *,
                 to_version: int | None = None) -> list[ToolChange]:
    """The tools' commits after ``version`` (None: the start) up to ``to_version``: not in a replay."""
    return [ToolChange(c.version, str(c.meta.get("tool")), None if c.meta.get("audit_id") is None
                       else str(c.meta["audit_id"]))
            for c in commits if c.meta.get("tool") and _inside(c, version, to_version)]


def version_at_timestamp(spark: Any, layout: StoreLayout, computation: str, timestamp_ms: int) -> int:
    """The newest version of ``computation``'s rows table committed at or before ``timestamp_ms``.

    Raises:
        NotAStoreError: the store has no rows table for ``computation``.
        ReplayUnavailableError: every version is newer (names the oldest one and its time).
    """
    hist = _history(spark, layout, computation)
    older = [int(r["version"]) for r in hist if r["timestamp"].timestamp() * 1000 <= timestamp_ms]
    if not older:
        first = hist[0]
        raise ReplayUnavailableError(f"the rows table of {computation!r} has no version at or before {timestamp_ms} ms; its oldest "
                                     f"kept version is {first['version']} ({first['timestamp']}): give a later "
                                     "--from-timestamp, or --from-version")
    return max(older)
