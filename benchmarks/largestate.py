"""``deltawheel bench state``: state larger than a worker's cache (docs/scale.md, "State larger than memory").

Every key is kept for ever (``KeyTotals`` in ``largestate_job.py``: a count and the latest event
time per key), so the state grows with the keys. Runs, each in a process of its own:

- deltawheel over ``--keys`` keys with the image cache unbounded, recording the workers' image
  lookups (the trace); each worker's peak bytes of live images is "its state";
- the same input with each worker's cache bounded to ``--cache`` shares of its state;
- Spark SQL's ``groupBy(key)`` with RocksDB state on the same input;
- the two restarts: a store of ``--keys / --scale`` keys and the store of ``--keys``, each given one
  more file of ``--restart-records`` records right after its run, from the process's start to its first
  committed batch.

The trace is replayed through the window-aware policy, LRU and Belady's optimum at each share
(``cachebench.run_trace_bench``). Every engine's state is checked: as many keys as the input has,
each record counted once. ``state.json`` and ``state.png`` go to ``--out``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from deltawheel.statestore.exceptions import ConfigError

__all__ = ["write_input", "run_state_bench", "run_from_args", "format_table"]

BASE_MS = 1_767_225_600_000  # 2026-01-01: event time of the first record
GAP_MS = 1  # event time between two consecutive records


def write_input(folder: Path, *, keys: int, passes: int, per_file: int, seed: int,
                say: Any = print) -> dict[str, Any]:
    """``passes`` shuffled passes over ``keys`` keys (``u00000000`` ...), ``per_file`` records a file.

    Written once per parameter set (``manifest.json`` says it is whole); the file source reads them
    in name order (their modification times ascend)."""
    import numpy as np

    manifest = folder / "manifest.json"
    want = {"keys": keys, "passes": passes, "per_file": per_file, "seed": seed, "event_time": "timestamp[ms, UTC]"}
    if manifest.exists():
        old: dict[str, Any] = json.loads(manifest.read_text())
        if old.get("params") == want:
            return old
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "input").mkdir(parents=True)
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(keys) for _ in range(passes)])
    files = 0
    for start in range(0, len(order), per_file):
        _write_part(folder / "input", files, order[start:start + per_file], first=start, keys=keys)
        files += 1
        if files % 10 == 0:
            say(f"input: {min(start + per_file, len(order)):,} of {len(order):,} records written")
    got = {"params": want, "records": int(len(order)), "files": files}
    manifest.write_text(json.dumps(got))
    return got


def _restart_file(folder: Path, *, keys: int, records: int, seed: int, after: int) -> None:
    """One more input file (``records`` records over random keys of ``keys``) after ``after`` records."""
    import numpy as np

    ids = np.random.default_rng(seed + 1).integers(0, keys, records)
    _write_part(folder, len(list(folder.glob("part-*.parquet"))), ids, first=after, keys=keys)


def _write_part(folder: Path, n: int, key_ids: Any, *, first: int, keys: int) -> None:
    """``part-<n>.parquet``: a record per key number of ``key_ids``, record ids and event times from
    record number ``first`` on; its modification time orders it after part ``n - 1``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    seq = np.arange(first, first + len(key_ids), dtype=np.int64)
    width = max(8, len(str(keys - 1)))
    key = pc.binary_join_element_wise("u", pc.utf8_lpad(pc.cast(pa.array(key_ids), pa.string()), width, "0"), "")
    path = folder / f"part-{n:05d}.parquet"
    pq.write_table(pa.table({"record_id": pc.cast(pa.array(seq), pa.string()), "key": key,
                             "event_time": pa.array(BASE_MS + seq * GAP_MS, pa.timestamp("ms", tz="UTC"))}), path)
    os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))


def _linked(src: Path, dst: Path) -> Path:
    """A fresh folder of hard links to ``src``'s input files (a run may add files to its own)."""
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for f in sorted(src.glob("part-*.parquet")):
        os.link(f, dst / f.name)
        st = f.stat()
        os.utime(dst / f.name, (st.st_atime, st.st_mtime))
    return dst


def _child(name: str, spec: dict[str, Any], *, work: Path, env: dict[str, str] | None = None,
           say: Any = print, timeout_s: float) -> dict[str, Any]:
    """Run one ``largestate_job`` and return its result (its output goes to ``work/<name>.log``)."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, log = work / f"{name}.spec.json", work / f"{name}.result.json", work / f"{name}.log"
    spec_path.write_text(json.dumps(spec))
    result_path.unlink(missing_ok=True)
    say(f"{name}: running ({spec['engine']}, {spec['input']})")
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.run([sys.executable, "-m", "deltawheel.benchmarks.largestate_job", str(spec_path),
                               str(result_path)], stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                              env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}, check=False)
    if proc.returncode != 0 or not result_path.exists():
        tail = "\n".join(line[:300] for line in log.read_text(errors="replace").splitlines()[-25:])
        raise RuntimeError(f"bench state: run {name} failed (exit {proc.returncode}); {log}:\n{tail}")
    got: dict[str, Any] = json.loads(result_path.read_text())
    got["process_s"] = round(time.monotonic() - t0, 3)
    say(f"{name}: {got['records']:,} records in {got['wall_s']:.1f}s "
        f"({got['records'] / max(got['wall_s'], 1e-9):,.0f} records/s)")
    return got


def _checked(name: str, got: dict[str, Any], *, keys: int, records: int) -> None:
    """The run's state holds ``keys`` keys and counts ``records`` records (else RuntimeError)."""
    st = got.get("state_records")
    if st is None:
        return
    if st != {"keys": keys, "counted": records}:
        raise RuntimeError(f"bench state: {name}'s state is wrong: {st}, expected {keys:,} keys "
                           f"counting {records:,} records")
    got["checked"] = True


def _worker_peaks(trace: Path) -> dict[str, int]:
    from .cachebench import peak_live_bytes, read_trace

    return {w: peak_live_bytes(events) for w, events in read_trace(trace).items()}


def run_state_bench(*, out: Path, keys: int, passes: int, per_file: int, intervals: int,
                    shares: Sequence[float], engines: Sequence[str], scale: int, restart_records: int,
                    seed: int = 11, data_root: Path | None = None, timeout_s: float = 7200.0,
                    say: Any = print) -> dict[str, Any]:
    """Every run of the benchmark (see the module docstring); the report, also in ``out/state.json``."""
    from .cachebench import run_trace_bench

    out = out.resolve()  # the workers' folders are not ours
    out.mkdir(parents=True, exist_ok=True)
    root = (data_root or Path("bench-out") / "data").resolve()
    runs: dict[str, Any] = {}
    data = {}
    small_keys = max(1, keys // scale)
    for k in dict.fromkeys([keys, small_keys]):
        folder = root / f"state-k{k}-p{passes}-b{per_file}-s{seed}"
        data[k] = (folder, write_input(folder, keys=k, passes=passes, per_file=per_file, seed=seed, say=say))
    common = {"intervals": intervals}

    def deltawheel_run(name: str, k: int, env: dict[str, str] | None = None) -> dict[str, Any]:
        folder, manifest = data[k]
        run_dir = out / name
        shutil.rmtree(run_dir, ignore_errors=True)
        inp = _linked(folder / "input", run_dir / "input")
        got = _child(name, {**common, "engine": "deltawheel", "input": str(inp), "store": str(run_dir / "store")},
                     work=out, env=env, say=say, timeout_s=timeout_s)
        _checked(name, got, keys=k, records=manifest["records"])
        got.update(keys=k, run_dir=str(run_dir))
        return got

    restarts: dict[str, Any] = {}

    def restart(label: str, k: int, base: dict[str, Any]) -> None:
        """Restart ``base``'s store on one more file, right after its run (the same age of record ids at
        every size: the dedup horizon is processing time, and ids past it are dropped by the next batch)."""
        run_dir = Path(base["run_dir"])
        _restart_file(run_dir / "input", keys=k, records=restart_records, seed=seed, after=data[k][1]["records"])
        got = _child(f"restart_{label}", {**common, "engine": "deltawheel", "input": str(run_dir / "input"),
                                          "store": str(run_dir / "store"), "check": False},
                     work=out, say=say, timeout_s=timeout_s)
        got["keys"] = k
        restarts[label] = got

    trace = out / "trace"
    shutil.rmtree(trace, ignore_errors=True)
    trace.mkdir()
    if "deltawheel" in engines:
        runs["deltawheel"] = deltawheel_run("deltawheel", keys, {"DELTAWHEEL_IMAGE_CACHE_TRACE": str(trace)})
        if restart_records:
            restart(f"{scale}x", keys, runs["deltawheel"])
            if small_keys != keys:
                restart("1x", small_keys, deltawheel_run("deltawheel_small", small_keys))
        peaks = _worker_peaks(trace)
        state_bytes = max(peaks.values())
        runs["deltawheel"]["worker_state_bytes"] = peaks
        for share in shares:
            bound = max(1, int(share * state_bytes))
            runs[f"deltawheel_cache_{share:g}"] = deltawheel_run(
                f"deltawheel_cache_{share:g}", keys, {"DELTAWHEEL_IMAGE_CACHE_BYTES": str(bound)})
            runs[f"deltawheel_cache_{share:g}"]["cache_bytes"] = bound
    if "spark_sql" in engines:
        folder, manifest = data[keys]
        shutil.rmtree(out / "spark_sql", ignore_errors=True)
        got = _child("spark_sql", {**common, "engine": "spark_sql", "input": str(folder / "input"),
                                   "store": str(out / "spark_sql")}, work=out, say=say, timeout_s=timeout_s)
        _checked("spark_sql", got, keys=keys, records=manifest["records"])
        runs["spark_sql"] = got
    report: dict[str, Any] = {
        "benchmark": "state", "keys": keys, "passes": passes, "per_file": per_file, "intervals": intervals,
        "records": data[keys][1]["records"], "shares": list(shares), "runs": runs, "restarts": restarts,
        "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg()}}
    if "deltawheel" in engines:
        report["cache_trace"] = run_trace_bench(trace, out=out, shares=shares)
    (out / "state.json").write_text(json.dumps(report, indent=1))
    _plot(report, out / "state.png")
    return report


def _plot(report: dict[str, Any], path: Path) -> None:
    """Per-batch seconds over the run, one line per run."""
    from .plot import figure

    with figure(path, figsize=(8, 4)) as (_fig, ax):
        for name, got in report["runs"].items():
            ax.plot([b["wall_s"] for b in got["batches"]], label=name, marker=".")
        ax.set_xlabel("batch")
        ax.set_ylabel("seconds")
        ax.set_title(f"{report['keys']:,} keys kept, {report['per_file']:,} records a batch")
        ax.legend(fontsize=7)


def format_table(report: dict[str, Any]) -> str:
    """Records/s, batch seconds and hit rates per run; the restarts; the trace's policies."""
    lines = [f"{report['keys']:,} keys, {report['records']:,} records, {report['intervals']} intervals",
             f"{'run':<24} {'records/s':>10} {'batch p50':>9} {'batch max':>9} {'hit rate':>8} {'checked':>7}"]
    for name, got in report["runs"].items():
        secs = sorted(b["wall_s"] for b in got["batches"]) or [0.0]
        run_ = sum(b.get("intervals_run", 0) for b in got["batches"])
        hit = 1 - sum(b.get("images_read", 0) for b in got["batches"]) / run_ if run_ else None
        lines.append(f"{name:<24} {got['records'] / max(got['wall_s'], 1e-9):>10,.0f} {secs[len(secs) // 2]:>9.2f} "
                     f"{secs[-1]:>9.2f} {'-' if hit is None else f'{hit:.3f}':>8} {str(got.get('checked', '-')):>7}")
    for label, got in report["restarts"].items():
        lines.append(f"restart at {label} ({got['keys']:,} keys, {got['rows_live_bytes'] / 2**20:,.0f} MiB of rows): "
                     f"session {got['session_s']:.1f}s, executor started {got['executor_started_s']}s, "
                     f"first batch {got['first_batch_s']}s after the process's start")
    if "cache_trace" in report:
        from .cachebench import format_trace_table

        lines.append(format_trace_table(report["cache_trace"]))
    return "\n".join(lines)


def run_from_args(args: argparse.Namespace) -> int:
    """``deltawheel bench state``: run, print the table, write ``state.json`` and ``state.png``.

    Raises:
        ConfigError: a bad number or share.
    """
    from .args import pick_names

    try:
        shares = [float(c) for c in str(args.cache).split(",") if c.strip()]
    except ValueError:
        raise ConfigError(f"--cache must be shares like 0.1,0.25, got {args.cache!r}") from None
    if any(not 0 < s <= 1 for s in shares):
        raise ConfigError(f"--cache must be shares in (0, 1], got {args.cache!r}")
    for opt in ("keys", "passes", "per_file", "intervals", "scale"):
        if getattr(args, opt) < 1:
            raise ConfigError(f"--{opt.replace('_', '-')} must be at least 1, got {getattr(args, opt)}")
    engines = pick_names(args.engines, ("deltawheel", "spark_sql"), "engine", "state")
    report = run_state_bench(out=Path(args.out), keys=args.keys, passes=args.passes, per_file=args.per_file,
                             intervals=args.intervals, shares=shares, engines=engines, scale=args.scale,
                             restart_records=args.restart_records, timeout_s=args.timeout)
    print(format_table(report))
    print(f"wrote {Path(args.out) / 'state.json'} and {Path(args.out) / 'state.png'}")
    return 0
