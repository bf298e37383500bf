"""Promote (``deltawheel promote``): a replay's state replaces the live computation's in one fenced
commit, under its leases; :func:`plan_promote` is the dry run. docs/replay.md, "6. Promote"."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.exceptions import ConfigError, LeaseHeldError, ReplayTargetError
from deltawheel.statestore.inspection.positions import (
    ComputationCommit,
    commits_after,
    commits_since,
    computation_commits,
)
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.rowtable.rows import KeyRow
from deltawheel.statestore.surgery.replace import (
    Held,
    Surgery,
    SurgeryResult,
    plan_replacement,
    refuse_live_owners,
    replace_intervals,
)
from deltawheel.statestore.surgery.timeline import Timeline
from deltawheel.statestore.zk.handover import read_handover

from ..computation import Computation
from ..sources.injector import Injector
from .promote_checks import behind, prove_caught_up
from .promote_rows import promoted_rows, shadow_rows
from .replay import plan_replay, read_marker, replay_scope, store_id
from .replay_run import ReplayRun

# keys written (and deleted) a plan names one by one; the rest are counted
_SHOWN = 5

__all__ = ["PromotePlan", "check_replay", "close_gap", "plan_promote", "promote", "promote_intervals", "shadow_rows"]


@dataclass(frozen=True, kw_only=True)
class PromotePlan:
    """What a promotion would do: ``reached``, ``newest``, ``behind`` (batches to catch up), ``change``."""

    store: str
    into: str
    pipeline: str
    computation: str
    reached: int
    newest: int
    behind: int
    change: SurgeryResult

    def describe(self) -> str:
        """The plan as lines for a terminal."""
        lines = [f"promote the replay in {self.into} to {self.computation} of pipeline {self.pipeline} in {self.store}",
                 f"  the replay reached live rows version {self.reached}; the newest live commit of "
                 f"{self.computation} is {self.newest}" + (f": {self.behind} batches to catch up first, under the "
                                                           "leases" if self.behind else " (caught up)"),
                 f"  would take the leases of intervals {list(self.change.intervals)}, write "
                 f"{len(self.change.upserted)} keys and delete {len(self.change.deleted)} (against the replay as it "
                 "is now), in one fenced commit recorded in the audit table"]
        lines += [f"  write  {r.key!r} (interval {r.interval})" for r in self.change.upserted[:_SHOWN]]
        lines += [f"  delete {k!r} (interval {iv})" for iv, k in self.change.deleted[:_SHOWN]]
        more = max(0, len(self.change.upserted) - _SHOWN) + max(0, len(self.change.deleted) - _SHOWN)
        if more:
            lines.append(f"  ... and {more} more keys: deltawheel diff --store {self.store} --store {self.into} "
                         f"--computation {self.computation} compares them all")
        return "\n".join(lines)


def check_replay(store: StoreLayout, into: StoreLayout, *, pipeline: str, computation: str,
                 spark: Any = None) -> dict[str, Any]:
    """The marker of the replay in ``into``, checked to be of ``store``'s ``pipeline`` and ``computation``."""
    if store_id(into) == store_id(store):
        raise ReplayTargetError(f"--from {into.root} is the live store itself: give the folder a `deltawheel "
                                "replay --into` wrote")
    if not into.is_local and spark is None:
        raise ConfigError(f"--from {into.root} is on an object store: its marker is read with a session's S3 "
                          "settings (check_replay(..., spark=spark))")
    m = read_marker(into, spark=spark)
    if m is None:
        raise ReplayTargetError(f"--from {into.root} is not a replay's folder (no _replay.json): run `deltawheel "
                                f"replay --store {store.root} --pipeline {pipeline} --computation {computation} "
                                f"--into {into.root} ...` first")
    for what, want in (("store", store_id(store)), ("pipeline", pipeline), ("computation", computation)):
        if m.get(what) != want:
            raise ReplayTargetError(f"--from {into.root} is a replay of {what} {m.get(what)!r}, not {want!r}: a "
                                    f"replay promotes only into the {what} it replayed")
    if m.get("reached") is None:
        raise ReplayTargetError(f"--from {into.root}: the replay never finished its seeding; run the replay again")
    return m


def promote_intervals(marker: Mapping[str, Any], intervals: Sequence[int] | None, num_intervals: int, *,
                      into: str) -> tuple[int, ...] | None:
    """``intervals`` (checked: ConfigError, ReplayTargetError), else the replay's."""
    replayed = marker.get("intervals")
    if intervals is None:
        return None if replayed is None else tuple(sorted(int(i) for i in replayed))
    scope = replay_scope(num_intervals, intervals=intervals)
    other = sorted(set(intervals) - set(replayed)) if replayed is not None else []
    if other and replayed is not None:
        raise ReplayTargetError(f"--intervals {list(intervals)}: the replay in {into} replayed only intervals "
                                f"{sorted(replayed)}, not {other}; promote a subset of them, or replay those "
                                "intervals too (a new replay with --intervals)")
    return scope


def plan_promote(spark: Any, *, store: StoreLayout, into: StoreLayout, pipeline: str, computation: str,
                 num_intervals: int, intervals: Sequence[int] | None = None) -> PromotePlan:
    """The dry run; ``intervals`` as :func:`promote`'s."""
    m = check_replay(store, into, pipeline=pipeline, computation=computation, spark=spark)
    ivs = promote_intervals(m, intervals, num_intervals, into=into.root)
    commits = computation_commits(spark, store, computation)
    reached = int(m["reached"])
    change = plan_replacement(spark, store, computation=computation, num_intervals=num_intervals, intervals=ivs,
                              build=lambda held: promoted_rows(shadow_rows(spark, into, computation,
                                                                           intervals=held.intervals),
                                                               {r.key: r for r in held.rows}))
    return PromotePlan(store=store.root, into=into.root, pipeline=pipeline, computation=computation,
                       reached=reached, newest=commits[-1].version if commits else -1,
                       behind=len(behind(commits, reached)), change=change)


def promote(spark: Any, *, store: StoreLayout, into: StoreLayout, client: Any, pipeline: str, code: Computation,
            injectors: Sequence[Injector] = (), shadow_zk: ZkConfig | None = None, wait_s: float = 0.0,
            no_wait: bool = False, catch_up: bool = True, progress: Callable[[str], None] | None = None,
            before_commit: Callable[[Mapping[int, int]], None] | None = None,
            intervals: Sequence[int] | None = None, timeline: Timeline | None = None) -> SurgeryResult:
    """Promote the replay in ``into`` to ``code``'s computation of the live ``store``. Raises, nothing
    changed: ReplayTargetError (not a replay of this computation, or behind with ``catch_up=False``),
    ReplayBehindError (a live commit it would replace not re-run), ConfigError (``intervals`` out of
    range, an injector input not in ``injectors``), ReplayUnavailableError or InputGoneError (a live
    commit to catch up has no positions or input), LeaseHeldError (``no_wait`` and an interval held, or
    another tool at work), StaleSequencerError or LeaseLostError (a takeover raced the promotion)."""
    say = progress or (lambda line: None)
    tl = timeline or Timeline()
    computation, num = code.name, type(code).num_intervals
    with tl.phase("checks: the replay, the intervals, the live commits to catch up, their input"):
        m = check_replay(store, into, pipeline=pipeline, computation=computation, spark=spark)
        ivs = promote_intervals(m, intervals, num, into=into.root)
        if no_wait:
            refuse_live_owners(client, pipeline=pipeline, computation=computation,
                               intervals=range(num) if ivs is None else ivs)
        other = read_handover(client, pipeline, computation)  # refused at once while another tool works
        if other is not None:
            raise LeaseHeldError(f"another tool is changing {pipeline}/{computation} ({other.tool} by {other.by}, "
                                 f"intervals {list(other.intervals)}); wait for it to finish and run this one again")
        commits = computation_commits(spark, store, computation)
        todo = behind(commits, int(m["reached"]))
        if todo and not catch_up:
            raise ReplayTargetError(_not_caught_up(into, len(todo)))
        fv = m.get("from_version")
        plan = plan_replay(spark, store=store, into=into, pipeline=pipeline, computation=computation,
                           from_version=fv, from_start=fv is None, intervals=m.get("intervals"),
                           num_intervals=num, code=code if catch_up else None,
                           injectors=injectors) if catch_up else None
        # what the replay ran so far must be complete (an older marker, a commit without positions)
        prove_caught_up(commits, m, into=into.root, computation=computation, num_intervals=num, intervals=ivs,
                        upto=int(m["reached"]))
    with contextlib.ExitStack() as stack:
        run: ReplayRun | None = None
        rounds: list[int] = []
        if plan is not None:
            with tl.phase("the replay's shadow store opened (its ZooKeeper, its leases)"):
                run = ReplayRun(spark, plan, code=code, zk=shadow_zk, injectors=injectors, write_path="auto",
                                progress=say, seed=_no_seed, old=m, source=m.get("source"))
                run.check(commits, plan.batches)
                stack.enter_context(run)
            with tl.phase(f"catch-up before the hand-over: {len(plan.batches)} live batches"):
                if plan.batches:
                    say(f"catching up before the hand-over: {len(plan.batches)} live batches the replay has not run")
                run.run(plan.batches, commits)
                run.finish(plan.to_version)  # its executor started: a catch-up under the leases only runs batches
                commits, rounds = _close_gap(spark, store, computation, run, commits, say)
        seen = commits[-1].version if commits else -1
        caught: list[int] = [len(plan.batches), *rounds] if plan is not None else [0]

        def build(held: Held) -> list[KeyRow]:
            # the leases are held: no live commit of these intervals can land until they are given back
            with tl.phase("catch-up under the leases: the live commits since the check"):
                newer = commits_since(spark, store, computation, after=seen)
                marker = run.marker if run is not None else m
                # every live commit past the replay's reach: those that landed since, and the one the
                # catch-up before the hand-over may have left (it stops one behind: ``close_gap``'s near)
                late = behind([*commits, *newer], int(marker["reached"]))
                if late and run is None:
                    raise ReplayTargetError(_not_caught_up(into, len(late)))
                if late and run is not None:
                    caught.append(_rerun(run, [*commits, *newer], say, "under the leases: {} live batches"))
                if run is not None and newer:
                    run.finish(newer[-1].version)
            with tl.phase("proof: the replay ran every live commit up to the version replaced"):
                prove_caught_up([*commits, *newer], marker, into=into.root, computation=computation,
                                num_intervals=num, intervals=held.intervals)
            with tl.phase("the replayed rows read and compared"):
                return promoted_rows(shadow_rows(spark, into, computation, intervals=held.intervals),
                                     {r.key: r for r in held.rows})

        result = replace_intervals(
            spark, store, client, pipeline=pipeline, computation=computation, num_intervals=num,
            build=build, wait_s=wait_s, no_wait=False, progress=say, before_commit=before_commit, intervals=ivs,
            timeline=tl,
            surgery=Surgery("promote", into.root, detail={"from_version": m.get("from_version"),
                                                          "code": f"{type(code).__module__}:{type(code).__qualname__}",
                                                          "caught_up_batches": caught,
                                                          "replayed_intervals": m.get("intervals"),
                                                          "replayed_keys": m.get("keys")}))
    return result


def close_gap(fetch: Callable[[], Sequence[ComputationCommit]], reached: Callable[[], int],
              catch_up: Callable[[Sequence[ComputationCommit]], None], *, near: int = 1,
              rounds: int = 5) -> list[int]:
    """Catch up on the live commits past ``reached()`` while more than ``near`` are behind and fewer
    than in the round before (the live stage keeps committing meanwhile); returns each round's count."""
    done: list[int] = []
    while len(done) < rounds:
        todo = behind(fetch(), reached())
        if len(todo) <= near or (done and len(todo) >= done[-1]):
            break
        catch_up(todo)
        done.append(len(todo))
    return done


def _close_gap(spark: Any, store: StoreLayout, computation: str, run: ReplayRun,
               commits: Sequence[ComputationCommit], say: Callable[[str], None]
               ) -> tuple[list[ComputationCommit], list[int]]:
    """:func:`close_gap` on the live store: the live commits known at the end, and the rounds' counts."""
    known = list(commits)

    def fetch() -> list[ComputationCommit]:
        known.extend(commits_since(spark, store, computation, after=known[-1].version if known else -1))
        return known

    def catch_up(todo: Sequence[ComputationCommit]) -> None:
        _rerun(run, known, say, "before the hand-over: {} live batches that landed meanwhile")
        run.finish(known[-1].version)

    return known, close_gap(fetch, lambda: int(run.marker["reached"]), catch_up)


def _rerun(run: ReplayRun, commits: list[ComputationCommit], say: Callable[[str], None], what: str) -> int:
    """Re-run the live ``commits`` past the replay's marker, said as ``catching up <what>``; how many."""
    batches = commits_after(commits, int(run.marker["reached"]))
    say(f"catching up {what.format(len(batches))}")
    run.check(commits, batches)
    run.run(batches, commits)
    return len(batches)


def _no_seed() -> None:
    raise AssertionError("a promotion continues a replay: it never seeds one")


def _not_caught_up(into: StoreLayout, n: int) -> str:
    return (f"--from {into.root} is {n} live batches behind the live input position; promote without "
            "--no-catch-up (it continues the replay under the leases), or run `deltawheel replay` into the same "
            "folder again first")
