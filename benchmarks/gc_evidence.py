"""The cost of ``deltawheel gc``'s ``input_sets`` evidence read: every JSON commit of the rows table,
against the commits since the last gc (``gc/ranlog.py``).

Times (CPU, JSON commits opened) gc's ``full`` read of every commit against the ``bounded``
``read_ran`` from a kept read, on a rows table of ``--commits`` commits plus ``--since`` more, and
checks both give the same evidence. Run: ``.venv/bin/python -m benchmarks.gc_evidence --commits 300 1000``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

__all__ = ["main"]


def _commit(spark: Any, rows: str, n: int, *, first: int) -> None:
    from deltawheel.statestore.delta.txn import TableLog
    from deltawheel.statestore.rowtable.inputfiles import commit_entry

    log = TableLog(spark, rows)
    for i in range(first, first + n):
        files = [f"part-{i:05d}.parquet"] if i % 2 == 0 else []
        log.commit(user_metadata=json.dumps({"computation": "c", **commit_entry(i, files, intervals=range(4))}))


def _full(rows: str) -> dict[str, dict[int, set[str]]]:
    """The evidence read of every commit (the read before the bound, kept here to time it)."""
    from deltawheel.statestore.delta.log import commit_infos
    from deltawheel.statestore.rowtable.inputfiles import ran_of

    out: dict[str, dict[int, set[str]]] = {}
    for _v, info in commit_infos(rows, after=-1) or ():
        meta = json.loads(info.get("userMetadata") or "{}")
        got = ran_of(meta)
        if got is not None:
            for iv in got[0]:
                out.setdefault(meta["computation"], {}).setdefault(iv, set()).update(got[1])
    return out


def run(spark: Any, work: str, *, commits: int, since: int, rounds: int) -> dict[str, Any]:
    """Build the store of ``commits`` + ``since`` commits under ``work`` and time both reads."""
    from deltawheel.gc.ranlog import RanLog, ran_in_log, read_ran, save_ran
    from deltawheel.statestore.delta.log import json_commit_versions
    from deltawheel.statestore.layout import StoreLayout

    from deltawheel import migrations

    layout = StoreLayout(f"{work}/store-{commits}")
    migrations.apply(spark, layout, dry_run=False)
    _commit(spark, layout.rows, commits, first=0)
    kept = read_ran(layout)
    assert save_ran(layout, kept)
    _commit(spark, layout.rows, since, first=commits)
    versions = json_commit_versions(layout.rows) or []
    figures: dict[str, Any] = {"commits": commits, "since": since, "log_versions": len(versions)}
    for name, read in (("full", lambda: _full(layout.rows)), ("bounded", lambda: read_ran(layout))):
        cpu = []
        for _ in range(rounds):
            t0 = time.process_time()
            got = read()
            cpu.append(time.process_time() - t0)
        figures[f"{name}_cpu_ms"] = round(1000 * statistics.median(cpu), 2)
        figures[f"{name}_files"] = got.read if isinstance(got, RanLog) else len(versions)
    bounded = read_ran(layout)
    full = ran_in_log(layout.rows)
    assert bounded.ran == full == {c: {iv: frozenset(fs) for iv, fs in per.items()}
                                   for c, per in _full(layout.rows).items()}
    return figures


def main(argv: list[str] | None = None) -> int:
    """Print (and with ``--out``, save as JSON) the figures of each ``--commits``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--commits", type=int, nargs="+", default=[300])
    p.add_argument("--since", type=int, default=10, help="commits after the kept read (default 10)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None, help="a JSON file for the figures")
    args = p.parse_args(argv)
    from deltawheel.statestore.session.sparkenv import build_spark

    spark = build_spark()
    out = []
    with tempfile.TemporaryDirectory(prefix="gc-evidence-") as work:
        for n in args.commits:
            fig = run(spark, work, commits=n, since=args.since, rounds=args.rounds)
            print(json.dumps(fig), flush=True)
            out.append(fig)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
