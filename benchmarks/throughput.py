"""Throughput benchmark: run several engines on the same workload, each run in its own process.

A run is sampled during its measured part only; ``throughput.json`` and ``throughput.png`` go to ``--out``."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import itertools
import json
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import psutil
from deltawheel.statestore.jars import DELTA_VERSION

from . import engine_deltawheel
from .engines_spark import SPARK_BENCH_CONF, EngineResult, ProgressFn
from .isolated import RunSpec, build_bench_session, run_isolated
from .memory import MemorySampler
from .plot import plot_throughput
from .workload import WorkloadData, WorkloadError, WorkloadParams, ensure_workload

__all__ = ["ENGINES", "WARMUP", "round_orders", "run_throughput", "format_table"]

WARMUP = WorkloadParams(n=4_000, b=2_000, k=500, rate=100)
ENGINES = engine_deltawheel.ENGINES


def _machine_info(spark_version: str) -> dict[str, Any]:
    import pandas
    import pyarrow

    vm = psutil.virtual_memory()
    return {
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_total_mib": round(vm.total / 2**20),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "spark": spark_version,  # every engine runs on this Spark (its own session of it, or the shared one)
        "delta": DELTA_VERSION,
        "pyarrow": pyarrow.__version__,
        "pandas": pandas.__version__,
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
    }


def _ratios(results: Mapping[str, EngineResult]) -> dict[str, float]:
    return {f"{a}/{b}": round(ra.records_per_s / rb.records_per_s, 3)
            for a, ra in results.items() for b, rb in results.items() if a != b and rb.records_per_s > 0}


def format_table(report: Mapping[str, Any]) -> str:
    """The printed summary: peak PSS/RSS and CPU seconds per engine, then the ratios."""
    isolated = report.get("mode") == "isolated"
    last, last_w = ("start_s", 9) if isolated else ("idle MiB", 10)
    w = max([16, *(len(n) + 2 for n in report["engines"])])  # deltawheel_columnar is longer than 16
    hdr = f"{'engine':<{w}}{'records/s':>12}{'wall_s':>10}{'correct':>9}{'rows':>9}{'late':>7}" \
          f"{'open':>8}{'PSS MiB':>9}{'RSS MiB':>9}{'CPU s':>8}{last:>{last_w}}"
    lines = [hdr, "-" * len(hdr)]
    for name, e in report["engines"].items():
        mem = e.get("peak_memory") or {}
        tail = (f"{e.get('session_start_s') or float('nan'):>9.1f}" if isolated
                else f"{mem.get('at_peak_idle_pss_mib', float('nan')):>10.0f}")
        lines.append(
            f"{name:<{w}}{e['records_per_s']:>12,.0f}{e['wall_s']:>10.2f}{str(e['correct']):>9}"
            f"{e['emitted_rows']:>9}{str(e['late_dropped']):>7}{str(e['open_events_at_end']):>8}"
            f"{mem.get('pss_mib', float('nan')):>9.0f}{mem.get('rss_mib', float('nan')):>9.0f}"
            f"{mem.get('cpu_s', float('nan')):>8.1f}{tail}")
    if report.get("ratios"):
        lines.append("ratios (records/s): " + ", ".join(f"{k} = {v:.2f}" for k, v in report["ratios"].items()))
    return "\n".join(lines)


def _order_score(orders: Sequence[Sequence[str]], names: Sequence[str]) -> tuple[int, int, int]:
    """A schedule's unevenness: (place + predecessor spread, predecessor spread, sum of squares)."""
    flat = [e for o in orders for e in o]
    follows = Counter(zip(flat, flat[1:], strict=False))
    pairs = [follows[(a, b)] for a in names for b in names if a != b]
    places = Counter((e, i) for o in orders for i, e in enumerate(o))
    place = [places[(e, i)] for e in names for i in range(len(names))]
    dp = max(pairs) - min(pairs) if pairs else 0
    return dp + max(place) - min(place), dp, sum(x * x for x in pairs) + sum(x * x for x in place)


def round_orders(names: Sequence[str], rounds: int, *, search_limit: int = 50_000) -> list[list[str]]:
    """The engines' order per round: the first as given, then as balanced as possible (else rotation)."""
    names = list(names)
    perms = [list(p) for p in itertools.permutations(names)] if len(names) <= 8 else []
    if perms and len(perms) ** (rounds - 1) <= search_limit:
        return min(([names, *rest] for rest in itertools.product(perms, repeat=rounds - 1)),
                   key=lambda orders: _order_score(orders, names))
    return [names[r % len(names):] + names[:r % len(names)] for r in range(rounds)]


_Runs = dict[str, list[tuple[EngineResult, dict[str, Any]]]]  # per engine, every round's result and facts


def _in_rounds(names: Sequence[str], rounds: int, say: ProgressFn,
               one: Callable[[str, int], tuple[EngineResult, dict[str, Any]]]) -> _Runs:
    """``one(engine, round)`` -> (result, facts) for each engine in each round's order, with progress lines."""
    runs: _Runs = {n: [] for n in names}
    total_runs, done_runs, t_runs = len(names) * rounds, 0, time.perf_counter()
    for rnd, order in enumerate(round_orders(names, rounds)):
        tag = f" (round {rnd + 1} of {rounds})" if rounds > 1 else ""
        for name in order:
            eta = "" if not done_runs else \
                f", about {(time.perf_counter() - t_runs) / done_runs * (total_runs - done_runs):.0f} s left"
            say(f"engine {name}: running{tag} [run {done_runs + 1} of {total_runs}{eta}]")
            done_runs += 1
            res, facts = one(name, rnd)
            runs[name].append((res, {"run": done_runs, "round": rnd + 1, **facts}))
            say(f"engine {name}: {res.records_per_s:,.0f} records/s, wall {res.wall_s:.2f} s, "
                f"correct={res.correct}{tag}")
    return runs


def _shared_runs(names: Sequence[str], rounds: int, *, data: WorkloadData, wdata: WorkloadData | None,
                 conf: Mapping[str, str], out_dir: Path, store_uri: str | None, spark: Any,
                 progress: ProgressFn | None) -> tuple[_Runs, dict[str, Any]]:
    """Every run in this process and one session (``--shared-session``), each sampled on this process's tree."""
    say = progress or (lambda _msg: None)
    session, session_start_s = build_bench_session(conf, spark=spark)
    say(f"spark session ready in {session_start_s:.1f} s")
    if wdata is not None:
        for name in names:
            say(f"engine {name}: warm-up on {wdata.n:,} events")
            t_w = time.perf_counter()
            # warm the store too, so its first-request cost falls in no engine's measured run
            more = {} if store_uri is None else {"store": f"{store_uri}/warmup"}
            ENGINES[name]().run(wdata, out_dir=out_dir / "warmup", spark=session, progress=None, **more)
            say(f"engine {name}: warm-up took {time.perf_counter() - t_w:.1f} s")

    def one(name: str, rnd: int) -> tuple[EngineResult, dict[str, Any]]:
        with MemorySampler(interval_s=1.0) as mem:
            more = {} if store_uri is None else {"store": f"{store_uri}/round{rnd}"}
            res = ENGINES[name]().run(data, out_dir=out_dir / "engines" / f"round{rnd}", spark=session,
                                      progress=progress, **more)
        return replace(res, name=name, session_start_s=session_start_s, peak_memory=mem.peak.to_dict()), \
            {"pid": os.getpid()}

    return _in_rounds(names, rounds, say, one), {
        "spark_version": session.version, "session_start_s": session_start_s,
        "checkpoint_file_manager": session.conf.get("spark.sql.streaming.checkpointFileManagerClass", None)}


def _isolated_runs(names: Sequence[str], rounds: int, *, data: WorkloadData, wdata: WorkloadData | None,
                   conf: Mapping[str, str], out_dir: Path, store_uri: str | None,
                   progress: ProgressFn | None) -> tuple[_Runs, dict[str, Any]]:
    """Every (engine, round) run in a process of its own (:mod:`.isolated`), its warm-up first there."""
    facts: dict[str, Any] = {}

    def one(name: str, rnd: int) -> tuple[EngineResult, dict[str, Any]]:
        spec = RunSpec(engine=name, data=data, out_dir=out_dir / "engines" / f"round{rnd}", conf=conf,
                       store=None if store_uri is None else f"{store_uri}/round{rnd}", warmup=wdata,
                       warmup_out_dir=out_dir / "warmup" / f"round{rnd}",
                       warmup_store=None if store_uri is None else f"{store_uri}/warmup/round{rnd}")
        got = run_isolated(spec, work_dir=out_dir / "processes" / f"round{rnd}", progress=progress)
        facts.setdefault("spark_version", got.spark_version)
        facts.setdefault("checkpoint_file_manager", got.checkpoint_file_manager)
        res = replace(got.result, name=name, session_start_s=got.session_start_s,
                      peak_memory=got.peak.to_dict())
        return res, {"pid": got.pid, "warmup_s": got.warmup_s, "conf_applied": dict(got.conf_applied or {})}

    runs = _in_rounds(names, rounds, progress or (lambda _msg: None), one)
    starts = sorted(r.session_start_s or 0.0 for rs in runs.values() for r, _ in rs)
    facts["session_start_s"] = starts[(len(starts) - 1) // 2]
    return runs, facts


def run_throughput(size: str, *, out_dir: Path, engines: Sequence[str] | None = None, data_root: Path | None = None,
                   params: WorkloadParams | None = None, spark: Any = None, warmup: bool = False, rounds: int = 1,
                   store_uri: str | None = None, isolate: bool | None = None, conf: Mapping[str, str] | None = None,
                   progress: ProgressFn | None = print) -> dict[str, Any]:
    """Run ``engines`` (default: all) one after another on the workload ``size`` (a custom name takes
    ``params``); write and return ``throughput.json`` and ``throughput.png`` in ``out_dir``.

    ``isolate``: a process per (engine, round), default unless ``spark`` is given; ``rounds``: runs per
    engine in balanced orders; ``store_uri``: state and output of engines with ``takes_store``.

    Raises:
        WorkloadError: unknown engine, bad input, ``isolate`` with ``spark``, or an isolated run failed.
    """
    t_proc0 = psutil.Process().create_time()
    say = progress or (lambda _msg: None)
    names = list(engines) if engines else list(ENGINES)
    if unknown := [n for n in names if n not in ENGINES]:
        raise WorkloadError(f"unknown engine(s) {unknown}; registered: {sorted(ENGINES)}")
    if rounds < 1:
        raise WorkloadError(f"rounds must be at least 1, got {rounds}")
    if isolate and spark is not None:
        raise WorkloadError("an isolated run builds a session in each engine's process; pass spark= only "
                            "with isolate=False (--shared-session)")
    isolate = spark is None if isolate is None else isolate
    if store_uri is not None:
        if cannot := [n for n in names if not getattr(ENGINES[n], "takes_store", False)]:
            raise WorkloadError(f"engine(s) {cannot} cannot keep their state on --store-uri; choose among "
                                f"{sorted(n for n, e in ENGINES.items() if getattr(e, 'takes_store', False))}")
        store_uri = store_uri.rstrip("/") + f"/{_dt.datetime.now(_dt.UTC).strftime('%Y%m%dT%H%M%S')}"
    extra = dict(conf or {})
    if not isolate and any(not k.startswith("spark.sql.") for k in extra):
        raise WorkloadError("--conf with --shared-session takes spark.sql.* settings only (the session's "
                            "JVM is started already); run isolated for the others")
    conf = {**SPARK_BENCH_CONF, **extra}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    say(f"workload {size}: preparing input")
    data: WorkloadData = ensure_workload(size, root=data_root, params=params)
    ref = data.reference
    say(f"workload {size}: N={data.n:,} in {len(data.files)} files, sha256 {data.content_sha256[:16]}…, "
        f"reference {ref.emitted_rows:,} rows")

    wdata = ensure_workload("warmup", root=data_root, params=WARMUP) if warmup else None
    if isolate:
        runs, facts = _isolated_runs(names, rounds, data=data, wdata=wdata, conf=conf, out_dir=out_dir,
                                     store_uri=store_uri, progress=progress)
    else:
        runs, facts = _shared_runs(names, rounds, data=data, wdata=wdata, conf=conf, out_dir=out_dir,
                                   store_uri=store_uri, spark=spark, progress=progress)
    results: dict[str, tuple[EngineResult, Mapping[str, Any]]] = {}
    for name, rs in runs.items():
        med = sorted(rs, key=lambda r: r[0].records_per_s)[(len(rs) - 1) // 2]
        results[name] = (replace(med[0], correct=all(r.correct for r, _ in rs),
                                      rounds_records_per_s=tuple(r.records_per_s for r, _ in rs)), med[1])

    report: dict[str, Any] = {
        "workload": "zeitgeist-window-count", "size": size, "n": data.n, "n_files": len(data.files),
        "params": dataclasses.asdict(data.params), "content_sha256": data.content_sha256,
        "content_verified_against_workload_md": data.verified,
        "reference": {"emitted_rows": ref.emitted_rows, "sum_counts": ref.sum_counts,
                      "late_dropped": ref.late_dropped, "open_events_at_end": ref.open_events,
                      "open_windows_at_end": ref.open_windows},
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": _machine_info(str(facts["spark_version"])),
        "mode": "isolated" if isolate else "shared_session",
        "session_start_s": facts["session_start_s"],
        "spark_conf": {**conf, "spark.sql.streaming.checkpointFileManagerClass": facts["checkpoint_file_manager"]},
        "engines": {n: {**r.to_dict(), **info} for n, (r, info) in results.items()},
        "ratios": _ratios({n: r for n, (r, _) in results.items()}),
        "runs": sorted(({"engine": n, **info, "session_start_s": r.session_start_s, "records_per_s": r.records_per_s,
                         "correct": r.correct, "pss_mib": (r.peak_memory or {}).get("pss_mib"),
                         "cpu_s": (r.peak_memory or {}).get("cpu_s")}
                        for n, rs in runs.items() for r, info in rs), key=lambda d: int(d["run"])),
        "warmup": dataclasses.asdict(WARMUP) if warmup else None, "rounds": rounds, "store_uri": store_uri,
        "process_wall_s": round(time.time() - t_proc0, 3),
    }
    (out_dir / "throughput.json").write_text(json.dumps(report, indent=1, default=str))
    plot_throughput(report, out_dir / "throughput.png")
    say(format_table(report))
    say(f"wrote {out_dir / 'throughput.json'} and {out_dir / 'throughput.png'}")
    return report


def parse_conf(items: Sequence[str]) -> dict[str, str]:
    """``--conf KEY=VALUE`` items as a mapping.

    >>> parse_conf(["spark.driver.memory=1g", "spark.driver.extraJavaOptions=-XX:+UseSerialGC -Xss1m"])
    {'spark.driver.memory': '1g', 'spark.driver.extraJavaOptions': '-XX:+UseSerialGC -Xss1m'}
    >>> parse_conf(["spark.driver.memory"])
    Traceback (most recent call last):
    ...
    deltawheel.benchmarks.workload.WorkloadError: --conf takes KEY=VALUE (a Spark setting), got 'spark.driver.memory'
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise WorkloadError(f"--conf takes KEY=VALUE (a Spark setting), got {item!r}")
        out[key.strip()] = value
    return out


def run_from_args(args: argparse.Namespace) -> int:
    engines = [e.strip() for e in args.engines.split(",") if e.strip()] if args.engines else None
    report = run_throughput(args.size, out_dir=args.out, engines=engines, data_root=args.data_root,
                            warmup=args.warmup, rounds=args.rounds, store_uri=args.store_uri,
                            isolate=not args.shared_session, conf=parse_conf(args.conf or []))
    return 0 if all(e["correct"] for e in report["engines"].values()) else 1
