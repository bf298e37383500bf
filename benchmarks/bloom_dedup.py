"""Dedup on the image path: the Bloom filter's first check against the exact lookup.

Measures (best of ``--rounds``) on an image of ``--keys`` x ``--ids-per-key`` record ids: building
the filter, its check of a batch of ``--batch`` new and ``--retries`` retried records, the exact
lookup it saves (``executor/tasks/image/ids.py``), its false-positive rate and its memory
(docs/dedup-and-production-ids.md). Prints and saves JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable


def _best(fn: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run(*, keys: int, ids_per_key: int, batch: int, retries: int, rounds: int) -> dict[str, Any]:
    """Measure the filter against the exact lookup (best of ``rounds``); returns the figures."""
    import pyarrow as pa
    from deltawheel.executor.computation import Computation
    from deltawheel.executor.tasks.image import dedup as _dedup
    from deltawheel.executor.tasks.image.ids import already_seen, flat_ids
    from deltawheel.executor.tasks.usercode.columns import Input
    from deltawheel.statestore.rowtable.bloom import IdBloom

    class Comp(Computation):
        name = "bench"
        inputs = {"events": "k"}

    names = [f"k{i:06d}" for i in range(keys)]
    held = [[{"record_id": f"old-{i}-{j}", "seen_ms": 1} for j in range(ids_per_key)] for i in range(keys)]
    image = pa.table({"key": names, "record_ids": held})
    ids = flat_ids(image, None)
    n_held = keys * ids_per_key

    def batch_of(n_retry: int) -> Any:
        rid = [f"new-{i}" for i in range(batch)] + [f"old-{i % keys}-0" for i in range(n_retry)]
        key = [names[i % keys] for i in range(batch)] + [names[i % keys] for i in range(n_retry)]
        n = len(rid)
        return Input(pa.table({"key": key, "record_id": rid, "value": pa.nulls(n, pa.binary()),
                               "codec": ["json"] * n, "timestamp_ms": list(range(n)), "stream": ["events"] * n,
                               "late": [False] * n}))

    fresh, mixed = batch_of(0), batch_of(retries)
    build_s, bloom = _best(lambda: _build(IdBloom, ids, n_held), rounds)
    check_s, maybe = _best(lambda: bloom.might_contain_many(fresh.ids), rounds)
    exact_s, seen = _best(lambda: already_seen(Comp(), fresh, ids), rounds)
    exact_mixed_s, seen_mixed = _best(lambda: already_seen(Comp(), mixed, ids), rounds)
    assert seen is None and seen_mixed is not None and sum(seen_mixed) == retries
    retried = [f"old-{i % keys}-0" for i in range(retries)]
    assert bloom.might_contain_many(retried).all()  # no false negatives
    fp = float(maybe.mean())
    return {"held_ids": n_held, "batch": batch, "retries": retries, "error_rate_target": _dedup.BLOOM_ERROR_RATE,
            "capacity": bloom.capacity, "hashes": bloom.k, "bloom_bytes": bloom.nbytes,
            "false_positive_rate": round(fp, 5), "build_s": round(build_s, 4), "bloom_check_s": round(check_s, 4),
            "exact_lookup_s": round(exact_s, 4), "exact_lookup_with_retries_s": round(exact_mixed_s, 4)}


def _build(cls: Any, ids: Any, n: int) -> Any:
    from deltawheel.executor.tasks.image import dedup as _dedup
    from deltawheel.executor.tasks.usercode.columns import py_list

    bloom = cls(max(2 * n, _dedup.BLOOM_MIN_CAPACITY), error_rate=_dedup.BLOOM_ERROR_RATE)
    bloom.add_many(py_list(ids.table.column("record_id")))
    return bloom


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark from the command line ``argv``; print the JSON (and save it with ``--out``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--ids-per-key", type=int, default=100)
    p.add_argument("--batch", type=int, default=50_000)
    p.add_argument("--retries", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    res = run(keys=a.keys, ids_per_key=a.ids_per_key, batch=a.batch, retries=a.retries, rounds=a.rounds)
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
