"""The commit benchmark's figures: a point's summary and its progress line (the plot: :mod:`.plot`)."""

from __future__ import annotations

from typing import Any, Sequence

from .commits_writer import WriterStats

__all__ = ["summarize", "point_line", "percentile"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank) of ``values``; None when empty.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.0
    """
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def summarize(stats: Sequence[WriterStats], *, elapsed_s: float, zk_writes: int) -> dict[str, Any]:
    """A point's figures from its writers' counts over ``elapsed_s`` measured seconds."""
    commits = sum(s.commits for s in stats)
    commit_s = [x for s in stats for x in s.commit_s]
    batch_s = [x for s in stats for x in s.batch_s]
    failed: dict[str, int] = {}
    for s in stats:
        for k, v in s.failed.items():
            failed[k] = failed.get(k, 0) + v
    batches = commits + sum(failed.values())
    return {
        "seconds": round(elapsed_s, 2),
        "commits": commits,
        # the writers commit to the rows table only: its rate is the store's
        "commits_per_s_table": round(commits / elapsed_s, 2),
        "commits_per_s_store": round(commits / elapsed_s, 2),
        "commits_per_s_per_writer": [round(s.commits / elapsed_s, 2) for s in stats],
        "commit_p50_ms": _ms(percentile(commit_s, 50)),
        "commit_p99_ms": _ms(percentile(commit_s, 99)),
        "batch_p50_ms": _ms(percentile(batch_s, 50)),
        "batch_p99_ms": _ms(percentile(batch_s, 99)),
        "retries_per_commit": round(sum(s.attempts - s.commits for s in stats) / commits, 3) if commits else None,
        "conflicts_per_commit": round(sum(s.conflicts for s in stats) / commits, 3) if commits else None,
        "failed_batches": sum(failed.values()),
        "failed": failed,
        "zk_writes": zk_writes,
        "zk_writes_per_batch": round(zk_writes / batches, 2) if batches else None,
        "zk_writes_per_s": round(zk_writes / elapsed_s, 1),
    }


def point_line(p: dict[str, Any]) -> str:
    """One progress line for a finished point."""
    return (f"commits: {p['target']} {p['latency_ms']} ms {p['shape']} N={p['writers']}: "
            f"{p['commits_per_s_store']:.1f} commits/s, commit p50/p99 {p['commit_p50_ms']}/{p['commit_p99_ms']} ms, "
            f"batch p50/p99 {p['batch_p50_ms']}/{p['batch_p99_ms']} ms, retries/commit {p['retries_per_commit']}, "
            f"conflicts/commit {p['conflicts_per_commit']}, failed {p['failed_batches']}, "
            f"writers without a commit {p['writers_without_commit']}, "
            f"ZooKeeper writes/batch {p['zk_writes_per_batch']} ({p['zk_writes_per_s']}/s), load {p['load_avg_1m']}")
