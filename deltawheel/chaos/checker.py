"""The chaos run's checker: reads only the input files, the stream tables (``deltalake``) and the drivers'
exits, never deltawheel's state or ZooKeeper; a failure is a :class:`Violation` naming versions and keys
(the checks: docs/reliability.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from deltawheel.executor.windowing.windowed import dropped_stream
from deltawheel.statestore.exceptions import ConfigError

from .bank import CLOSING_PREFIX, STREAMS, WINDOW_MS

__all__ = ["Violation", "FaultRecord", "CheckResult", "check_run", "read_stream", "stream_commits",
           "complete", "reference_legs", "DriverExit", "EXPECTED_EXITS", "UNREACHABLE", "exit_violations",
           "exits_note", "recheck", "traceback_violations"]

MAX_SNAPSHOTS = 80  # versions of ``changes`` read for the bank invariant (evenly spread, the last included)
MAX_KEYS = 8  # keys named per violation


@dataclass(frozen=True)
class Violation:
    """One thing the run got wrong: the check, what, the stream versions and keys to look at."""

    check: str
    detail: str
    versions: tuple[int, ...] = ()
    keys: tuple[str, ...] = ()

    def line(self) -> str:
        """One line: the check, what, where."""
        where = f" versions {list(self.versions)}" if self.versions else ""
        keys = f" keys {list(self.keys)}" if self.keys else ""
        return f"[{self.check}] {self.detail}{where}{keys}"


@dataclass(frozen=True, kw_only=True)
class FaultRecord:
    """One fault as it happened (wall-clock seconds): its kind, target, start and heal."""

    kind: str
    target: str
    start: float
    heal: float
    note: str = ""


@dataclass
class CheckResult:
    """What the checker found; a fault's recovery is None without a commit after its heal."""

    violations: list[Violation] = field(default_factory=list)
    records_in: int = 0
    records_out: dict[str, int] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    recoveries: list[tuple[FaultRecord, float | None]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No violation."""
        return not self.violations


def _table(path: str, version: int | None = None) -> Any:
    try:
        from deltalake import DeltaTable
    except ImportError as exc:
        raise ConfigError("the chaos checker reads the stream tables with delta-rs: pip install deltalake "
                          "(or deltawheel's test extra)") from exc

    return DeltaTable(path) if version is None else DeltaTable(path, version=version)


def read_stream(store: Path, stream: str, version: int | None = None) -> Any:
    """The records of ``stream`` (at ``version``) as a pandas frame: ``record_id``, ``key``,
    ``timestamp_ms`` and the decoded value's fields (empty without the table)."""
    import pandas as pd

    path = store / "streams" / stream
    if not (path / "_delta_log").is_dir():
        return pd.DataFrame({"record_id": [], "key": []})
    tbl = _table(str(path), version).to_pyarrow_dataset().to_table(
        columns=["record_id", "key", "value", "codec", "timestamp_ms"])
    rows = []
    for rid, key, value, codec, ts in zip(*(tbl.column(c).to_pylist() for c in tbl.column_names), strict=True):
        decoded = json.loads(value) if codec == "json" and value is not None else {"_undecodable": codec}
        rows.append({**decoded, "record_id": rid, "key": key, "timestamp_ms": ts})
    return pd.DataFrame(rows) if rows else pd.DataFrame({"record_id": [], "key": []})


def stream_commits(store: Path, stream: str) -> list[tuple[int, float]]:
    """(version, commit time in seconds) of every commit of ``stream`` after its creation."""
    path = store / "streams" / stream
    if not (path / "_delta_log").is_dir():
        return []
    hist = _table(str(path)).history()
    return sorted((int(h["version"]), float(h["timestamp"]) / 1000.0) for h in hist if int(h["version"]) > 0)


def read_input(folder: Path) -> Any:
    """Every input move (pandas), from the Parquet files of ``folder``."""
    import pandas as pd
    import pyarrow.parquet as pq

    files = sorted(p for p in folder.glob("moves-*.parquet"))
    if not files:
        return pd.DataFrame({"id": [], "ts": [], "src": [], "dst": [], "amount": []})
    return pd.concat([pq.read_table(p).to_pandas() for p in files], ignore_index=True)


def reference_legs(moves: Any) -> Any:
    """Both legs of every move: ``move``, ``leg``, ``account``, ``delta``, ``ts``."""
    import pandas as pd

    sides = (("debit", "src", -1), ("credit", "dst", 1))
    return pd.concat([pd.DataFrame({"move": moves["id"], "leg": leg, "account": moves[col],
                                    "delta": sign * moves["amount"], "ts": moves["ts"]})
                      for leg, col, sign in sides], ignore_index=True)


def reference_windows(legs: Any) -> dict[tuple[str, int], int]:
    """(account, window start) -> the sum of its deltas (the closing moves' accounts left out)."""
    legs = legs[~legs["account"].astype(str).str.startswith(CLOSING_PREFIX)]
    start = legs["ts"] - legs["ts"] % WINDOW_MS
    sums = legs.assign(start=start).groupby(["account", "start"])["delta"].sum()
    return {(str(a), int(s)): int(v) for (a, s), v in sums.items()}


def complete(store: Path, input_folder: Path) -> bool:
    """Whether every stream holds at least what the input gives (the run has drained)."""
    legs = reference_legs(read_input(input_folder))
    want = reference_windows(legs)
    changes, balances = read_stream(store, "changes"), read_stream(store, "balances")
    sums = read_stream(store, "window_sums")
    have = set() if sums.empty else {(str(k), int(s)) for k, s in zip(sums["key"], sums["window_start"], strict=True)}
    return len(changes) >= len(legs) and len(balances) >= len(legs) and set(want) <= have


def _keys(items: Iterable[Any]) -> tuple[str, ...]:
    return tuple(str(i) for i in sorted(items, key=str)[:MAX_KEYS])


def _legs_once(stage: str, got: Any, legs: Any, version: int) -> list[Violation]:
    """Every leg of ``legs`` exactly once in ``got`` (a stream's records), with its account and delta."""
    out: list[Violation] = []
    if got.empty:
        return [Violation("exactly-once", f"{stage}: no records (want {len(legs)})", (version,))] if len(legs) else []
    counts = got.groupby(["move", "leg"]).size()
    dup = counts[counts > 1]
    if len(dup):
        ids = got.set_index(["move", "leg"]).loc[list(dup.index)]["record_id"]
        out.append(Violation("exactly-once", f"{stage}: {len(dup)} legs more than once (record ids "
                                             f"{_keys(ids)})", (version,), _keys(f"{m}/{lg}" for m, lg in dup.index)))
    want = set(zip(legs["move"], legs["leg"], strict=True))
    have = set(counts.index)
    for what, odd in (("missing", want - have), ("of no input move", have - want)):
        if odd:
            out.append(Violation("exactly-once", f"{stage}: {len(odd)} legs {what}", (version,),
                                 _keys(f"{m}/{lg}" for m, lg in odd)))
    merged = got.drop_duplicates(["move", "leg"]).merge(legs, on=["move", "leg"], suffixes=("", "_want"))
    wrong = merged[(merged["account"] != merged["account_want"]) | (merged["delta"] != merged["delta_want"])]
    if len(wrong):
        out.append(Violation("exactly-once", f"{stage}: {len(wrong)} legs with another account or amount than "
                                             "their move's", (version,), _keys(f"{m}/{lg}" for m, lg in
                                                                                zip(wrong["move"], wrong["leg"],
                                                                                    strict=True))))
    return out


def _bank_snapshots(store: Path, commits: Sequence[tuple[int, float]]) -> list[Violation]:
    """The deltas of ``changes`` sum to zero and every move is whole at each sampled version."""
    versions = [v for v, _ in commits]
    if len(versions) > MAX_SNAPSHOTS:
        step = len(versions) / (MAX_SNAPSHOTS - 1)
        versions = sorted({versions[int(i * step)] for i in range(MAX_SNAPSHOTS - 1)} | {versions[-1]})
    out = []
    for v in versions:
        snap = read_stream(store, "changes", v)
        if snap.empty:
            continue
        total = int(snap["delta"].sum())
        legs = snap.drop_duplicates(["move", "leg"]).groupby("move").size()
        halves = legs[legs != 2]
        if total != 0 or len(halves):
            out.append(Violation("bank", f"changes at version {v}: deltas sum to {total}, {len(halves)} moves with "
                                         "one leg", (v,), _keys(halves.index)))
    return out


def _ledger(got: Any, legs: Any, version: int) -> list[Violation]:
    """Per account: seq 1..n, each balance the previous plus the delta, the last one the input's."""
    out: list[Violation] = []
    if got.empty:
        return out
    want = legs.groupby("account")["delta"].sum()
    finals: dict[str, int] = {}
    for account, part in got.sort_values("seq").groupby("account"):
        seqs = [int(s) for s in part["seq"]]
        if seqs != list(range(1, len(seqs) + 1)):
            out.append(Violation("ledger", f"balances of {account}: seq not 1..{len(seqs)} (repeated or missing: "
                                           f"{sorted(set(range(1, len(seqs) + 1)) ^ set(seqs))[:MAX_KEYS]})",
                                 (version,), (str(account),)))
            continue
        running = 0
        for move, delta, balance in zip(part["move"], part["delta"], part["balance"], strict=True):
            running += int(delta)
            if running != int(balance):
                out.append(Violation("ledger", f"balances of {account}: {balance} after move {move}, the deltas "
                                               f"before give {running}", (version,), (str(account), str(move))))
                break
        finals[str(account)] = int(part["balance"].iloc[-1])
    bad = [a for a, b in finals.items() if int(want.get(a, 0)) != b]
    if bad:
        out.append(Violation("ledger", f"{len(bad)} accounts whose last balance is not the input's sum",
                             (version,), _keys(bad)))
    if finals and sum(finals.values()) != 0:
        out.append(Violation("bank", f"the last balances sum to {sum(finals.values())}, not 0", (version,)))
    return out


def _dropped(got: Any) -> list[Violation]:
    """Every move is on time at the source (written within the watermark delay): none is dropped."""
    if got.empty:
        return []
    first = got.sort_values("timestamp_ms").iloc[0]
    return [Violation("late", f"window_sums: {len(got)} on-time records dropped (first: {first['key']} at "
                              f"{int(first['timestamp_ms'])}, {first.get('reason')})", (),
                      _keys(str(k) for k in got["record_id"]))]


def _windows(got: Any, legs: Any, version: int) -> list[Violation]:
    """The last pane of every (account, window) equals the pandas reference."""
    want = reference_windows(legs)
    if got.empty:
        return [Violation("windows", f"window_sums: no panes (want {len(want)} windows)", (version,))] if want else []
    got = got[~got["key"].astype(str).str.startswith(CLOSING_PREFIX)]
    out: list[Violation] = []
    panes = got.groupby(["key", "window_start", "pane_index"]).size()
    dup = panes[panes > 1]
    if len(dup):
        out.append(Violation("windows", f"window_sums: {len(dup)} panes more than once", (version,),
                             _keys(f"{k}@{w}#{i}" for k, w, i in dup.index)))
    last = got.sort_values("pane_index").groupby(["key", "window_start"]).last()["value"]
    have = {(str(k), int(w)): int(v) for (k, w), v in last.items()}
    for what, keys in (("missing", set(want) - set(have)), ("of no input", set(have) - set(want))):
        if keys:
            out.append(Violation("windows", f"window_sums: {len(keys)} windows {what}", (version,),
                                 _keys(f"{k}@{w}" for k, w in keys)))
    wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
    if wrong:
        out.append(Violation("windows", f"window_sums: {len(wrong)} windows whose last pane differs from the "
                                        f"reference (first: {wrong[0]} = {have[wrong[0]]}, want {want[wrong[0]]})",
                             (version,), _keys(f"{k}@{w}" for k, w in wrong)))
    return out


def _progress(commits: dict[str, list[tuple[int, float]]], faults: Sequence[FaultRecord], *, bound_s: float,
              end: float) -> tuple[list[Violation], list[tuple[FaultRecord, float | None]]]:
    """Each fault's recovery (heal to stage 1's next commit) and the streams stuck after it."""
    out: list[Violation] = []
    recoveries: list[tuple[FaultRecord, float | None]] = []
    for f in faults:
        for stream in STREAMS:
            after = [(v, t) for v, t in commits.get(stream, []) if t > f.heal]
            if stream == STREAMS[0]:
                recoveries.append((f, after[0][1] - f.heal if after else None))
            if not after:
                if end > f.heal + bound_s:
                    out.append(Violation("stuck", f"{stream}: no commit after {f.kind} on {f.target} healed"))
                continue
            v, t = after[0]
            if t - f.heal > bound_s:
                out.append(Violation("stuck", f"{stream}: first commit {t - f.heal:.1f}s after {f.kind} on "
                                              f"{f.target} healed (bound {bound_s:.0f}s)", (v,)))
    return out, recoveries


def check_run(store: Path, input_folder: Path, faults: Sequence[FaultRecord] = (), *, bound_s: float = 600.0,
              end: float | None = None) -> CheckResult:
    """Every check over the run's input and streams; ``end``: when the run stopped (progress is
    required after a heal only when the run went on ``bound_s`` past it)."""
    import time

    moves = read_input(input_folder)
    legs = reference_legs(moves)
    res = CheckResult(records_in=len(moves))
    commits = {s: stream_commits(store, s) for s in STREAMS}
    res.versions = {s: (c[-1][0] if c else 0) for s, c in commits.items()}
    finals = {s: read_stream(store, s) for s in STREAMS}
    res.records_out = {s: len(f) for s, f in finals.items()}
    res.violations += _bank_snapshots(store, commits["changes"])
    res.violations += _legs_once("changes", finals["changes"], legs, res.versions["changes"])
    res.violations += _legs_once("balances", finals["balances"], legs, res.versions["balances"])
    res.violations += _ledger(finals["balances"], legs, res.versions["balances"])
    res.violations += _windows(finals["window_sums"], legs, res.versions["window_sums"])
    res.violations += _dropped(read_stream(store, dropped_stream("window_sums")))
    stuck, res.recoveries = _progress(commits, faults, bound_s=bound_s, end=time.time() if end is None else end)
    res.violations += stuck
    return res


@dataclass(frozen=True)
class DriverExit:
    """A driver that stopped by itself: when, its exit code and error line (it was started again)."""

    driver: str
    code: int
    at: float
    error: str


def exits_note(exits: list[DriverExit], driver: str, watched_s: float) -> str:
    """What ``driver`` did while a fault's watch of ``watched_s`` saw ``exits``: its exits, or that it ran on."""
    mine = [e for e in exits if e.driver == driver]
    if mine:
        return "the driver exited " + ", ".join(f"with {e.code} ({e.error[:160]})" for e in mine)
    return f"the driver ran on for {watched_s:.0f}s"


#: The exit codes a driver may stop with under these faults: 4 (a lease lost or held elsewhere),
#: 9 (a failed batch, a conflict).
EXPECTED_EXITS = (4, 9)
#: On an object-store run also 5 with this error: a driver that found S3Proxy down.
UNREACHABLE = "ObjectStoreUnreachableError"


def exit_violations(exits: list[DriverExit], *, object_store: bool = False) -> list[Violation]:
    """The driver exits outside :data:`EXPECTED_EXITS` (and, on an object-store run, :data:`UNREACHABLE`)."""
    return [Violation("driver-exit", f"driver {e.driver} exited with {e.code}: {e.error}") for e in exits
            if e.code not in EXPECTED_EXITS and not (object_store and e.code == 5 and e.error.startswith(UNREACHABLE))]


def traceback_violations(tracebacks: list[str]) -> list[Violation]:
    """A tool that ended with a traceback: every failure a tool meets under these faults has a typed error."""
    return [Violation("tool-traceback", t) for t in tracebacks]


def recheck(data: Path, *, bound_s: float = 600.0) -> tuple[dict[str, Any], CheckResult]:
    """The check of an earlier run's folder (its input, streams and ``faults.json``) again.

    Raises:
        ConfigError: ``data`` holds no finished chaos run."""
    try:
        saved = json.loads((data / "faults.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"chaos --recheck {data}: no faults.json of a finished run ({exc})") from exc
    faults = [FaultRecord(**f) for f in saved["faults"]]
    result = check_run(data / saved.get("store", "store"), data / "input", faults, bound_s=bound_s,
                       end=saved["phases"].get("drained"))
    result.violations += exit_violations([DriverExit(**e) for e in saved.get("exits", [])],
                                         object_store=bool(saved.get("object_store")))
    result.violations += traceback_violations(saved.get("tracebacks", []))
    return saved, result
