"""The table a chaos run ends with (:func:`table`)."""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from .checker import CheckResult
from .faults import KINDS

__all__ = ["table"]


def table(seed: int, result: CheckResult, *, tools: Mapping[str, Sequence[int]] | None = None,
          exits: Sequence[tuple[str, int, str]] = (), drained: bool = True,
          skipped: Sequence[tuple[str, str]] = (), left_out: Mapping[str, str] | None = None) -> str:
    """The report: per fault kind the count, recovery p50/p99/max (s) and how many saw no commit after
    their heal; the faults skipped and the kinds left out, why; records, exits, violations."""
    lines = [f"chaos seed {seed}",
             f"{'fault':<16}{'count':>6}{'p50 s':>8}{'p99 s':>8}{'max s':>8}{'no commit':>11}"]
    by_kind: dict[str, list[float | None]] = {}
    for fault, rec in result.recoveries:
        by_kind.setdefault(fault.kind, []).append(rec)
    for kind in sorted(set(KINDS) | set(by_kind)):
        recs = by_kind.get(kind, [])
        done = [r for r in recs if r is not None]
        figs = [f"{float(np.percentile(done, q)):8.1f}" for q in (50, 99, 100)] if done else [f"{'-':>8}"] * 3
        lines.append(f"{kind:<16}{len(recs):>6}{''.join(figs)}{len(recs) - len(done):>11}")
    lines.append(f"{'all':<16}{len(result.recoveries):>6}")
    if skipped:
        lines.append("skipped: " + ", ".join(f"{k} x{n} ({why})" for (k, why), n in sorted(Counter(skipped).items())))
    lines += [f"{kind} left out: {why}" for kind, why in sorted((left_out or {}).items())]
    outs = ", ".join(f"{s} {n} (version {result.versions.get(s, 0)})" for s, n in result.records_out.items())
    lines.append(f"records in: {result.records_in} moves ({2 * result.records_in} legs); out: {outs}")
    if tools:
        lines.append("tools (exit codes): " + "; ".join(f"{t} {list(rcs)}" for t, rcs in sorted(tools.items())))
    if exits:
        codes = Counter((d, c) for d, c, _ in exits)
        lines.append("driver exits (started again): " + ", ".join(f"{d} exit {c} x{n}" for (d, c), n in
                                                                  sorted(codes.items())))
        errors = Counter(e.split(":")[0] for _, _, e in exits)
        lines.append("  their errors: " + ", ".join(f"{e} x{n}" for e, n in errors.most_common()))
    if not drained:
        lines.append("the drain did not finish in time: what is missing is in the violations")
    lines.append(f"violations: {len(result.violations)}")
    lines += [f"  {v.line()}" for v in result.violations]
    return "\n".join(lines)
