"""Upgrading every key's state to ``state_version`` in one fenced, audited commit
(``deltawheel upgrade-state``); one key's failing ``upgrade_state`` refuses it all. docs/operations.md."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.codecs import codec_version, get_codec
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import KeyRow, is_user_key
from deltawheel.statestore.rowtable.store import RowStore
from deltawheel.statestore.surgery.repair import pipeline_intervals
from deltawheel.statestore.surgery.replace import Held, Surgery, SurgeryResult, replace_intervals

from ..computation import Computation
from ..exceptions import StateUpgradeError
from ..tasks.usercode.keyrun import codec_of, state_codec_of

__all__ = ["UpgradePlan", "plan_upgrade", "upgrade_all"]

TOOL = "upgrade-state"


@dataclass(frozen=True)
class UpgradePlan:
    """What :func:`upgrade_all` would do: rows per stored version, intervals, and a sample."""

    computation: str
    to_version: int
    versions: Mapping[int, int]
    intervals: tuple[int, ...]
    sample: tuple[tuple[str, int, Any, Any], ...]

    @property
    def to_upgrade(self) -> int:
        """How many rows are of an older version."""
        return sum(n for v, n in self.versions.items() if v < self.to_version)


def _upgraded(code: Computation, rows: Sequence[KeyRow]) -> tuple[list[KeyRow], list[tuple[str, int, Any, Any]]]:
    """``rows`` with older states upgraded, and (key, from, before, after) of those; else StateUpgradeError."""
    to = code.state_version
    codec, column = codec_of(code), state_codec_of(code)
    out: list[KeyRow] = []
    changed: list[tuple[str, int, Any, Any]] = []
    failed: list[str] = []
    for r in rows:
        if not is_user_key(r.key) or r.state is None:
            out.append(r)
            continue
        version = codec_version(r.codec)
        if version > to:
            raise StateUpgradeError(
                f"key {r.key!r} of {code.name} holds state of state_version {version} ({r.codec}), newer than the "
                f"code's {to}: give the code that wrote it (--code); a downgrade is not done. Nothing was changed")
        if version == to:
            out.append(r)
            continue
        try:
            old = get_codec(r.codec, allow_pickle=code.allow_pickle).decode(r.state)
            new = code.upgrade_state(old, version)
            data = codec.encode(new)
        except Exception as exc:  # the user's upgrade_state: every failing key is named
            failed.append(f"{r.key!r} ({type(exc).__name__}: {exc})")
            continue
        out.append(r.with_(state=data, codec=column))
        changed.append((r.key, version, old, codec.decode(data)))
    if failed:
        raise StateUpgradeError(
            f"upgrade_state of {code.name} to state_version {to} failed for {len(failed)} keys: "
            f"{', '.join(failed[:5])}{', ...' if len(failed) > 5 else ''}; the whole upgrade is refused and nothing "
            "was changed: fix upgrade_state and run it again")
    return out, changed


def plan_upgrade(spark: Any, layout: StoreLayout, client: Any, *, pipeline: str, code: Computation,
                 sample: int = 5) -> UpgradePlan:
    """What :func:`upgrade_all` would do, over the rows now; raises as it does, writes nothing."""
    n = pipeline_intervals(client, pipeline=pipeline, computation=code.name)
    rows = [r for r in RowStore(spark, layout, writer="plan").scan_intervals(code.name, range(n))
            if is_user_key(r.key) and r.state is not None]
    versions = Counter(codec_version(r.codec) for r in rows)
    _, changed = _upgraded(code, rows)
    ivs = sorted({r.interval for r in rows if codec_version(r.codec) < code.state_version})
    return UpgradePlan(code.name, code.state_version, dict(sorted(versions.items())), tuple(ivs),
                       tuple(changed[:sample]))


def upgrade_all(spark: Any, layout: StoreLayout, client: Any, *, pipeline: str, code: Computation,
                wait_s: float = 0.0, no_wait: bool = False, source: str = "",
                progress: Callable[[str], None] | None = None,
                before_commit: Callable[[Mapping[int, int]], None] | None = None) -> SurgeryResult:
    """Upgrade every older-version row of ``code``'s computation. Raises ConfigError (no such
    computation), StateUpgradeError (nothing changed), LeaseHeldError, StaleSequencerError or
    LeaseLostError."""
    plan = plan_upgrade(spark, layout, client, pipeline=pipeline, code=code, sample=0)
    if not plan.intervals:
        return SurgeryResult(computation=code.name, intervals=(), sequencers={}, upserted=(), deleted=(),
                             before={}, version=None, audit_id=None, planned=False)
    n = pipeline_intervals(client, pipeline=pipeline, computation=code.name)

    def build(held: Held) -> list[KeyRow]:  # the leases are held: the rows cannot change now
        return _upgraded(code, held.rows)[0]

    detail = {"to_version": code.state_version, "from_versions": {str(v): c for v, c in plan.versions.items()
                                                                   if v < code.state_version}}
    return replace_intervals(spark, layout, client, pipeline=pipeline, computation=code.name, num_intervals=n,
                             intervals=plan.intervals, build=build, wait_s=wait_s, no_wait=no_wait, progress=progress,
                             before_commit=before_commit,
                             surgery=Surgery(TOOL, source or f"{type(code).__module__}:{type(code).__qualname__} "
                                             f"state_version {code.state_version}", detail=detail))
