"""Reading a Delta table's state without Spark: deltawheel's own log replay against delta-rs.

This script measures deltawheel's reader (``statestore/delta/log.py``) against the ``deltalake``
package on tables Delta itself wrote: exactness against Delta's snapshot on every checkpoint kind,
speed on tables shaped like deltawheel's, and the first call in a fresh process (``--s3``: also on
an S3Proxy it starts). Writes ``deltalog_readers.json`` and ``.png``; what it found:
docs/architecture-deltalog.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .deltalog_tables import APPS, build_checkpoint_kinds, build_rows_table, build_stream_table, upload

__all__ = ["TableView", "read_with_delta", "read_with_log", "read_with_delta_rs", "compare", "run", "main"]



@dataclass(frozen=True)
class TableView:
    """What a reader says a table is: its version, live files (decoded path, size, has a deletion
    vector) and each application id's version (None: none recorded)."""

    version: int
    files: frozenset[tuple[str, int, bool]]
    txns: tuple[tuple[str, int | None], ...]


def read_with_delta(spark: Any, uri: str, apps: Sequence[str]) -> TableView:
    """Delta's own snapshot, read in the session's JVM (the reference)."""
    from urllib.parse import unquote

    from deltawheel.statestore.delta.txn import TableLog

    log = TableLog(spark, uri)
    version, files = log.files("true")  # no ``where``: Delta's snapshot, never the Python replay
    txn = log._log.startTransaction()  # noqa: SLF001 - the benchmark reads Delta's own state
    txns = tuple((a, None if int(txn.txnVersion(a)) < 0 else int(txn.txnVersion(a))) for a in apps)
    return TableView(version, frozenset((unquote(f.path), f.size, f.has_deletion_vector) for f in files), txns)


def read_with_log(files: Any, apps: Sequence[str]) -> TableView | None:
    """deltawheel's replay (``log.read_snapshot``) of a :class:`TableFiles`; None: it declines."""
    from urllib.parse import unquote

    from deltawheel.statestore.delta.log import read_snapshot

    snap = read_snapshot(files)
    if snap is None:
        return None
    return TableView(snap.version,
                     frozenset((unquote(a["path"]), int(a["size"]), bool(a.get("deletionVector"))) for a in snap.adds),
                     tuple((a, snap.txns.get(a)) for a in apps))


def delta_rs_options(files: Any) -> dict[str, str]:
    """delta-rs's storage options for a :class:`TableFiles` (the s3a settings as object_store names them)."""
    s3 = files.s3
    if s3 is None:
        return {}
    out = {"AWS_REGION": s3.region or "us-east-1", "AWS_ALLOW_HTTP": str(s3.scheme == "http").lower(),
           "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": str(not s3.path_style).lower()}
    if s3.endpoint:
        out["AWS_ENDPOINT_URL"] = f"{s3.scheme}://{s3.endpoint}"
    if s3.access_key:
        out["AWS_ACCESS_KEY_ID"], out["AWS_SECRET_ACCESS_KEY"] = s3.access_key, s3.secret_key or ""
    return out


def delta_rs_uri(files: Any) -> str:
    """The table's URI as delta-rs takes it."""
    return files.root if files.s3 is None else f"s3://{files.root}"


def read_with_delta_rs(files: Any, apps: Sequence[str]) -> TableView:
    """delta-rs's snapshot, the files with a deletion vector from ``deletion_vectors()``."""
    import pyarrow as pa
    from deltalake import DeltaTable

    dt = DeltaTable(delta_rs_uri(files), storage_options=delta_rs_options(files) or None)
    adds = pa.table(dt.get_add_actions(flatten=True)).select(["path", "size_bytes"]).to_pydict()
    dv: set[str] = set()
    root = delta_rs_uri(files).rstrip("/")
    for batch in dt.deletion_vectors():
        for uri in pa.record_batch(batch).column("filepath").to_pylist():
            dv.add(uri.split(root.split("://", 1)[-1], 1)[-1].lstrip("/"))
    from urllib.parse import unquote

    paths = [unquote(p) for p in adds["path"]]
    return TableView(dt.version(),
                     frozenset((p, int(s), p in dv) for p, s in zip(paths, adds["size_bytes"], strict=True)),
                     tuple((a, dt.transaction_version(a)) for a in apps))


def compare(reference: TableView, got: TableView | None) -> str:
    """``exact``, ``declined`` (the reader returned None) or what differs."""
    if got is None:
        return "declined"
    diffs = []
    if got.version != reference.version:
        diffs.append(f"version {got.version} != {reference.version}")
    if got.files != reference.files:
        diffs.append(f"files: {len(got.files - reference.files)} extra, {len(reference.files - got.files)} missing")
    if got.txns != reference.txns:
        diffs.append(f"txns {dict(got.txns)} != {dict(reference.txns)}")
    return "; ".join(diffs) or "exact"


def fences_with_log(files: Any) -> dict[int, int] | None:
    """interval -> newest fence sequencer of computation ``c``, read as ``RowStore.fences`` does."""
    import pyarrow.compute as pc
    from deltawheel.statestore.delta.log import read_snapshot
    from deltawheel.statestore.delta.txn import decode_path
    from deltawheel.statestore.rowtable.rows import FENCE_KEY

    snap = read_snapshot(files)
    if snap is None:
        return None
    out: dict[int, int] = {}
    for add in snap.adds:
        pv = add.get("partitionValues") or {}
        if pv.get("computation") != "c":
            continue
        table = files.read_parquet(decode_path(str(add["path"])), columns=["key", "sequencer"])
        table = table.filter(pc.equal(table["key"], FENCE_KEY))
        if table.num_rows:
            out[int(pv["interval"])] = max(out.get(int(pv["interval"]), -1), pc.max(table["sequencer"]).as_py())
    return out


def fences_with_delta_rs(files: Any) -> dict[int, int]:
    """The same read through delta-rs's own scan (DataFusion; deletion vectors applied)."""
    import pyarrow as pa
    from deltalake import DeltaTable
    from deltawheel.statestore.rowtable.rows import FENCE_KEY

    dt = DeltaTable(delta_rs_uri(files), storage_options=delta_rs_options(files) or None)
    fence = FENCE_KEY.replace("'", "''")
    table = pa.table(dt.scan(columns=["interval", "sequencer"], predicate=f"computation = 'c' AND key = '{fence}'"))
    out: dict[int, int] = {}
    for iv, seq in zip(table["interval"].to_pylist(), table["sequencer"].to_pylist(), strict=True):
        out[int(iv)] = max(out.get(int(iv), -1), int(seq))
    return out


def _ms(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def time_side_by_side(calls: dict[str, Callable[[], Any]], rounds: int) -> dict[str, dict[str, float]]:
    """Each call once per round, the order rotating; per call its median and quartiles in ms."""
    names = list(calls)
    for n in names:
        calls[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(_ms(calls[n]))
    out = {}
    for n, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        out[n] = {"median_ms": round(statistics.median(ts), 2), "q1_ms": round(q[0], 2), "q3_ms": round(q[2], 2)}
    return out


_FIRST_CALL = r"""
import json, sys, time
t0 = time.perf_counter()
args = json.loads(sys.argv[1])
from deltawheel.benchmarks import deltalog_readers as b
from deltawheel.statestore.delta.storefs import S3Settings, TableFiles
files = TableFiles(args["root"], S3Settings(**args["s3"]) if args["s3"] else None)
read = b.FIRST_CALL_READERS[args["reader"]]
t1 = time.perf_counter()
read(files, args["apps"])
t2 = time.perf_counter()
read(files, args["apps"])
t3 = time.perf_counter()
print(json.dumps({"first_ms": (t2 - t0) * 1000, "second_ms": (t3 - t2) * 1000}))
"""

FIRST_CALL_READERS: dict[str, Callable[[Any, Sequence[str]], Any]] = {
    "log.py": read_with_log,
    "delta-rs": read_with_delta_rs,
}


def first_calls(files: Any, apps: Sequence[str], rounds: int) -> dict[str, dict[str, float]]:
    """Per Python reader in a fresh interpreter: imports plus the first read (``first_ms``) and a
    second read (``second_ms``); medians of ``rounds`` processes."""
    from dataclasses import asdict

    arg = json.dumps({"root": files.root, "s3": asdict(files.s3) if files.s3 else None, "apps": list(apps)})
    got: dict[str, list[dict[str, float]]] = {n: [] for n in FIRST_CALL_READERS}
    names = list(FIRST_CALL_READERS)
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            res = subprocess.run([sys.executable, "-c", _FIRST_CALL, json.dumps({**json.loads(arg), "reader": n})],
                                 capture_output=True, text=True, check=True)
            got[n].append(json.loads(res.stdout.strip().splitlines()[-1]))
    return {n: {k: round(statistics.median(x[k] for x in xs), 1) for k in ("first_ms", "second_ms")}
            for n, xs in got.items()}


def _exactness(spark: Any, uri: str, files: Any, apps: Sequence[str]) -> dict[str, str]:
    ref = read_with_delta(spark, uri, apps)
    out = {"version": str(ref.version), "files": str(len(ref.files)),
           "log.py": compare(ref, read_with_log(files, apps))}
    try:
        out["delta-rs"] = compare(ref, read_with_delta_rs(files, apps))
    except Exception as exc:
        out["delta-rs"] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
    return out


def _log_shape(files: Any) -> dict[str, int]:
    """JSON commits after the newest checkpoint and the checkpoint's version (-1: none)."""
    import re

    names = files.sub("_delta_log").listdir() or []
    cps = [int(n[:20]) for n in names if re.match(r"^\d{20}\.checkpoint", n)]
    cp = max(cps, default=-1)
    return {"checkpoint": cp, "json_after_checkpoint": sum(1 for n in names if re.match(r"^\d{20}\.json$", n)
                                                            and int(n[:20]) > cp)}


def run(spark: Any, stores: dict[str, str], work: str, *, commits: int, intervals: int, rounds: int,
        first_call_rounds: int, kinds: bool = True) -> dict[str, Any]:
    """Build the tables below each store root of ``stores`` (name -> a folder or ``s3a://`` prefix),
    check and time the readers; returns the report."""
    import deltalake
    from deltawheel.statestore.delta.storefs import table_files

    report: dict[str, Any] = {"deltalake": deltalake.__version__, "commits": commits, "intervals": intervals,
                              "rounds": rounds, "first_call_rounds": first_call_rounds,
                              "machine": {"logical_cores": os.cpu_count(), "load_average_start": os.getloadavg()},
                              "kinds": {}, "tables": {}}
    if kinds:
        local = build_checkpoint_kinds(spark, f"{work}/kinds")
        for store, root in stores.items():
            for kind, folder in local.items():
                uri = folder if not root.startswith("s3a://") else f"{root}/kinds/{kind}"
                files = table_files(spark, uri)
                if uri != folder:
                    upload(folder, files)
                report["kinds"].setdefault(store, {})[kind] = _exactness(spark, uri, files, APPS)
                print(f"{store:6} {kind:22} {report['kinds'][store][kind]}", flush=True)
    stream_apps = [f"deltawheel.c.{iv}" for iv in range(intervals)]
    for store, root in stores.items():
        tables: dict[str, tuple[str, Sequence[str]]] = {f"rows, checkpoint every {cpi}": (build_rows_table(spark, f"{root}/rows{cpi}", commits=commits,
                                                                     intervals=intervals, checkpoint_interval=cpi),
                                                    ())
                  for cpi in (10, 100)}
        tables["stream, checkpoint every 100"] = (build_stream_table(spark, f"{root}/streams", commits=commits,
                                                                     intervals=intervals), stream_apps)
        for name, (uri, apps) in tables.items():
            files = table_files(spark, uri)
            entry: dict[str, Any] = {"uri": uri, **_log_shape(files), "exactness": _exactness(spark, uri, files, apps)}
            calls: dict[str, Callable[[], Any]] = {
                "log.py": functools.partial(read_with_log, files, apps),
                "delta-rs": functools.partial(read_with_delta_rs, files, apps),
                "Delta in the JVM": functools.partial(read_with_delta, spark, uri, apps),
            }
            if name.startswith("rows"):
                calls["fences: log.py + pyarrow"] = functools.partial(fences_with_log, files)
                calls["fences: delta-rs scan"] = functools.partial(fences_with_delta_rs, files)
                want = fences_with_log(files)
                entry["fences_equal"] = want == fences_with_delta_rs(files)
            entry["warm"] = time_side_by_side(calls, rounds)
            entry["first_call"] = first_calls(files, apps, first_call_rounds)
            w, fc = entry["warm"], entry["first_call"]
            entry["delta_rs_over_log_py"] = {
                "warm": round(w["delta-rs"]["median_ms"] / w["log.py"]["median_ms"], 2),
                "first_call": round(fc["delta-rs"]["first_ms"] / fc["log.py"]["first_ms"], 2)}
            report["tables"].setdefault(store, {})[name] = entry
            print(f"{store:6} {name:30} {json.dumps({k: v for k, v in entry.items() if k != 'uri'})}", flush=True)
    report["machine"]["load_average_end"] = os.getloadavg()
    return report


def plot(report: dict[str, Any], path: Path) -> Path:
    """Per store: warm reads and first calls per table, and the checkpoint kinds' exactness."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stores = list(report["tables"])
    fig, axes = plt.subplots(len(stores), 3, figsize=(17, 4.6 * len(stores)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1.6, 1.6]})
    colors = {"log.py": "#4C72B0", "delta-rs": "#DD8452",
              "Delta in the JVM": "#8C8C8C", "fences: log.py + pyarrow": "#55A868", "fences: delta-rs scan": "#C44E52"}
    for row, store in enumerate(stores):
        tables = report["tables"][store]
        ax = axes[row][0]
        names = list(colors)
        width = 0.8 / len(names)
        for i, n in enumerate(names):
            xs = [t for t, e in enumerate(tables.values()) if n in e["warm"]]
            ys = [e["warm"][n]["median_ms"] for e in tables.values() if n in e["warm"]]
            bars = ax.bar([x + i * width for x in xs], ys, width, label=n, color=colors[n])
            for b, y in zip(bars, ys, strict=True):
                ax.annotate(f"{y:.0f}" if y >= 10 else f"{y:.1f}", (b.get_x() + b.get_width() / 2, y),
                            ha="center", va="bottom", fontsize=7)
        ax.set_xticks([t + 0.4 - width / 2 for t in range(len(tables))])
        ax.set_xticklabels([f"{t}\n({e['json_after_checkpoint']} JSON after cp {e['checkpoint']})"
                            for t, e in tables.items()], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms per read (median, warm process)")
        ax.set_title(f"{store}: warm reads, readers alternating ({report['rounds']} rounds)", fontsize=10)
        ax.legend(fontsize=7, ncol=2)
        ax = axes[row][1]
        for i, n in enumerate(("log.py", "delta-rs")):
            ys = [e["first_call"][n]["first_ms"] for e in tables.values()]
            bars = ax.bar([t + i * 0.4 for t in range(len(tables))], ys, 0.4, label=n, color=colors[n])
            for b, y in zip(bars, ys, strict=True):
                ax.annotate(f"{y:.0f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
        ax.set_xticks([t + 0.2 for t in range(len(tables))])
        ax.set_xticklabels([t.split(",")[0] + t.split("every")[-1] for t in tables], fontsize=8)
        ax.set_ylabel("ms: imports + first read")
        ax.set_title(f"{store}: first call in a fresh process", fontsize=10)
        ax.legend(fontsize=7)
        ax = axes[row][2]
        ax.axis("off")
        kinds = report["kinds"].get(store, {})
        lines = [f"{'kind':22} {'log.py':>9} {'delta-rs':>9}"]
        for kind, res in kinds.items():
            short = {k: ("exact" if v == "exact" else "declined" if v == "declined" else "WRONG")
                     for k, v in res.items() if k in ("log.py", "delta-rs")}
            lines.append(f"{kind:22} {short['log.py']:>9} {short['delta-rs']:>9}")
        ax.text(0, 1, "vs Delta's snapshot\n(files, DVs, txn versions)\n\n" + "\n".join(lines), va="top",
                family="monospace", fontsize=8, transform=ax.transAxes)
    load = report["machine"]
    fig.suptitle(f"Delta log readers without Spark (deltalake {report['deltalake']}, {report['commits']} commits); "
                 f"{load['logical_cores']} cores, load average {load['load_average_start'][0]:.1f} -> "
                 f"{load['load_average_end'][0]:.1f} (a shared machine: compare side-by-side ratios)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, start what ``--s3`` needs, run, save the JSON and the PNG."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", required=True, help="output folder for deltalog_readers.json / .png")
    p.add_argument("--commits", type=int, default=390,
                   help="commits of each timed table (390: the tables checkpointed every 100 end 90-odd JSON commits past it)")
    p.add_argument("--intervals", type=int, default=8, help="key intervals (partitions / application ids)")
    p.add_argument("--rounds", type=int, default=9, help="timed rounds of warm reads (median reported)")
    p.add_argument("--first-call-rounds", type=int, default=5, help="fresh processes per reader (median)")
    p.add_argument("--s3", action="store_true", help="also on s3a:// (an S3Proxy and a ZooKeeper for the run)")
    p.add_argument("--no-kinds", action="store_true", help="skip the checkpoint-kinds exactness tables")
    args = p.parse_args(argv)
    from deltawheel.statestore.session.sparkenv import SparkSettings, build_spark

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = os.path.abspath(tempfile.mkdtemp(prefix="tables-", dir=out))
    servers: list[Any] = []
    spark = build_spark(SparkSettings(master="local[2]", app_name="deltawheel-deltalog-readers",
                                      object_store=True if args.s3 else None))
    try:
        stores = {"local": f"{work}/local"}
        if args.s3:
            stores["s3a"] = _start_s3(spark, work, servers)
        report = run(spark, stores, work, commits=args.commits, intervals=args.intervals, rounds=args.rounds,
                     first_call_rounds=args.first_call_rounds, kinds=not args.no_kinds)
    finally:
        spark.stop()
        for server in reversed(servers):
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    (out / "deltalog_readers.json").write_text(json.dumps(report, indent=1))
    plot(report, out / "deltalog_readers.png")
    print(f"wrote {out / 'deltalog_readers.json'} and {out / 'deltalog_readers.png'}")
    return 0


def _start_s3(spark: Any, work: str, servers: list[Any]) -> str:
    """Start an S3Proxy and a ZooKeeper (the commits' log store) in ``work``; the bucket's root URI."""
    import socket

    from deltawheel.executor.servers.s3proxy import S3ProxyServer
    from deltawheel.executor.servers.zookeeper import EmbeddedZooKeeper
    from deltawheel.statestore.objectstore.logstore import configure_log_store
    from deltawheel.statestore.objectstore.s3a import configure_bucket

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    zk = EmbeddedZooKeeper(Path(work) / "zk", port=port())
    zk.start()
    servers.append(zk)
    s3 = S3ProxyServer(Path(work) / "s3", port=port())
    s3.start()
    servers.append(s3)
    s3.create_bucket("bench")
    configure_bucket(spark, s3.endpoint, "bench")
    configure_log_store(spark, zk.hosts, chroot="/deltalog-bench")
    return f"s3a://bench/{uuid.uuid4().hex[:8]}"


if __name__ == "__main__":
    sys.exit(main())
