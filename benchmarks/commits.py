"""``deltawheel bench commits``: the commit ceiling of one store's rows tables, N writers at once.

Shape ``computations``: a rows table per writer; ``instances``: one shared rows table, its writers taking
turns at its commits as instances sharing intervals do (``zk/turns.py``). The writers are
threads of one session with Delta's in-JVM commit lock off, so they race as processes do; the Delta
log read back must hold exactly what they counted (docs/scale.md)."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

from .args import pick_names
from .commits_writer import WriterSpec, WriterStats, run_writer
from .plot import plot_commits

__all__ = ["run", "failed_checks", "run_from_args", "measure_point", "Servers", "summarize", "point_line", "percentile"]

SHAPES = ("computations", "instances")
TARGETS = ("local", "s3a")
BUCKET = "dw-bench-commits"
#: Delta's in-JVM lock around a table's commit, off (the writers share one JVM)
NO_COMMIT_LOCK = {"spark.databricks.delta.commitLock.enabled": "false"}


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


def summarize(stats: Sequence[WriterStats], *, elapsed_s: float, zk_writes: int,
              tables: Sequence[str] | None = None) -> dict[str, Any]:
    """A point's figures from its writers' counts over ``elapsed_s`` measured seconds; ``tables``: the
    rows table (computation) each writer commits to, in ``stats``' order (None: one table, ``rows``).

    >>> a, b = WriterStats(name="w0", commits=10), WriterStats(name="w1", commits=30)
    >>> p = summarize([a, b], elapsed_s=10.0, zk_writes=0, tables=["c0", "c1"])
    >>> p["commits_per_s_table"], p["commits_per_s_store"]
    ({'c0': 1.0, 'c1': 3.0}, 4.0)
    >>> summarize([a, b], elapsed_s=10.0, zk_writes=0, tables=["s", "s"])["commits_per_s_table"]
    {'s': 4.0}
    """
    commits = sum(s.commits for s in stats)
    per_table: Counter[str] = Counter()
    for table, s in zip(tables or ["rows"] * len(stats), stats, strict=True):
        per_table[table] += s.commits
    commit_s = [x for s in stats for x in s.commit_s]
    batch_s = [x for s in stats for x in s.batch_s]
    failed = dict(sum((Counter(s.failed) for s in stats), Counter[str]()))
    batches = commits + sum(failed.values())
    return {
        "seconds": round(elapsed_s, 2),
        "commits": commits,
        # the writers commit to the rows tables only: the store's rate is the sum of the tables'
        "tables": len(per_table),
        "commits_per_s_table": {t: round(n / elapsed_s, 2) for t, n in sorted(per_table.items())},
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
            f"{p['commits_per_s_store']:.1f} commits/s over {p['tables']} rows tables "
            f"(per table up to {max(p['commits_per_s_table'].values(), default=0.0):.1f}), commit p50/p99 {p['commit_p50_ms']}/{p['commit_p99_ms']} ms, "
            f"batch p50/p99 {p['batch_p50_ms']}/{p['batch_p99_ms']} ms, retries/commit {p['retries_per_commit']}, "
            f"conflicts/commit {p['conflicts_per_commit']}, failed {p['failed_batches']}, "
            f"writers without a commit {p['writers_without_commit']}, "
            f"ZooKeeper writes/batch {p['zk_writes_per_batch']} ({p['zk_writes_per_s']}/s), load {p['load_avg_1m']}")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def zxid(hosts: str) -> int:
    """The last zxid the ZooKeeper server (or the first that answers of ``hosts``) has applied."""
    from deltawheel.servers.zookeeper import four_letter_word

    for hp in hosts.split(","):
        host, port = hp.rsplit(":", 1)
        text = four_letter_word(host, int(port), "srvr", timeout_s=5.0) or ""
        for line in text.splitlines():
            if line.startswith("Zxid:"):
                return int(line.split(":", 1)[1].strip(), 16)
    raise RuntimeError(f"no ZooKeeper server of {hosts} answered srvr")


class Servers:
    """ZooKeeper (one server or a three-server ensemble), and for ``s3a`` S3Proxy behind Toxiproxy."""

    def __init__(self, root: Path, *, ensemble: bool, object_store: bool) -> None:
        self.root = root
        self.ensemble = ensemble
        self.object_store = object_store
        self._zk: Any = None
        self._s3: Any = None
        self.toxiproxy: Any = None
        self.s3_url: str | None = None
        self.zk_hosts = ""  # the ZooKeeper connection string (every server of an ensemble), once started

    def leader_hosts(self) -> str:
        """``host:port`` of the server whose zxid counts the writes (the leader of an ensemble)."""
        myid = self._zk.leader() if self.ensemble else None
        return self.zk_hosts if myid is None else str(self._zk.server(myid).hosts)

    def start(self) -> None:
        """Start ZooKeeper, and for ``s3a`` S3Proxy, its bucket and Toxiproxy in front of it."""
        from deltawheel.statestore.process import free_ports

        from deltawheel.servers.ensemble import ZooKeeperEnsemble
        from deltawheel.servers.zookeeper import EmbeddedZooKeeper

        tag = uuid.uuid4().hex[:6]
        self._zk = (ZooKeeperEnsemble(self.root / f"_zk-{tag}") if self.ensemble
                    else EmbeddedZooKeeper(self.root / f"_zk-{tag}", port=free_ports(1)[0]))
        self._zk.start()
        self.zk_hosts = str(self._zk.hosts)
        if self.object_store:
            from deltawheel.servers.s3proxy import S3ProxyServer
            from deltawheel.servers.toxiproxy import ToxiproxyServer

            s3_port, api_port, listen = free_ports(3)
            self._s3 = S3ProxyServer(self.root / f"_s3-{tag}", port=s3_port)
            self._s3.start()
            self._s3.create_bucket(BUCKET)
            self.toxiproxy = ToxiproxyServer(self.root / f"_toxiproxy-{tag}", port=api_port)
            self.toxiproxy.start()
            self.s3_url = self.toxiproxy.proxy("s3", listen_port=listen, upstream=f"127.0.0.1:{s3_port}")

    def set_latency(self, latency_ms: int) -> None:
        """Add ``latency_ms`` to every object-store response (0: none)."""
        self.toxiproxy.set_latency("s3", latency_ms)

    def configure(self, spark: Any) -> None:
        """Point ``spark`` at the bucket through Toxiproxy, commits arbitrated by this ZooKeeper."""
        from deltawheel.statestore.objectstore.client import S3Endpoint
        from deltawheel.statestore.objectstore.logstore import configure_log_store
        from deltawheel.statestore.objectstore.s3a import configure_bucket

        ep = self._s3.endpoint
        configure_bucket(spark, S3Endpoint(url=str(self.s3_url), access_key=ep.access_key, secret_key=ep.secret_key),
                         BUCKET)
        configure_log_store(spark, self.zk_hosts, chroot="/dw-bench-logstore")

    def stop(self) -> None:
        """Stop every server started (each tried even if another fails to stop)."""
        for server in (self.toxiproxy, self._s3, self._zk):
            if server is not None:
                try:
                    server.stop()
                except Exception as exc:  # the others still stop
                    print(f"commits: stopping {type(server).__name__} failed: {exc}", flush=True)


def _specs(shape: str, n: int, keys_per_batch: int) -> list[WriterSpec]:
    if shape == "computations":
        return [WriterSpec(f"w{i:02d}", f"c{i:02d}", (0, 1), 2, keys_per_batch) for i in range(n)]
    return [WriterSpec(f"w{i:02d}", "shared", (2 * i, 2 * i + 1), 2 * n, keys_per_batch, turns=True)
            for i in range(n)]


def measure_point(spark: Any, *, zk_hosts: str, store_uri: str, shape: str, n: int, seconds: float,
                  warmup: float, keys_per_batch: int = 8, latency_ms: int = 0,
                  set_latency: Callable[[int], None] | None = None,
                  count_hosts: Callable[[], str] | None = None) -> dict[str, Any]:
    """Run ``n`` writers of ``shape`` on a fresh store at ``store_uri`` for ``warmup`` + ``seconds``.

    ``count_hosts``: the ZooKeeper server whose zxid counts the writes (default ``zk_hosts``);
    ``set_latency``: Toxiproxy's, 0 while the store is made. Returns the figures and checks."""
    from deltawheel.statestore.config import ZkConfig
    from deltawheel.statestore.delta.log import batch_metas, commit_infos, user_metadata
    from deltawheel.statestore.delta.storefs import table_files
    from deltawheel.statestore.layout import StoreLayout
    from deltawheel.statestore.rowtable.store import RowStore
    from deltawheel.statestore.rowtable.tables import ensure_rows_table
    from deltawheel.statestore.zk.client import connect
    from deltawheel.statestore.zk.watermarks.authority import WatermarkAuthority

    from deltawheel import migrations

    layout = StoreLayout(store_uri)
    set_latency = set_latency or (lambda _ms: None)
    set_latency(0)  # making the store is not measured
    migrations.apply(spark, layout, dry_run=False)
    specs = _specs(shape, n, keys_per_batch)
    tables = sorted({s.computation for s in specs})
    for c in tables:  # each computation's rows table, made before the measured time
        ensure_rows_table(spark, layout, c)
    set_latency(latency_ms)
    counter = count_hosts or (lambda: zk_hosts)
    zk = ZkConfig(hosts=zk_hosts, chroot=f"/dw-bench-{uuid.uuid4().hex[:10]}", session_timeout_s=20.0)
    pipeline = "bench"
    admin = connect(zk)
    authority = WatermarkAuthority(admin, pipeline=pipeline)
    for comp in sorted({(s.computation, s.num_intervals) for s in specs}):
        authority.declare(comp[0], upstream=[], num_intervals=comp[1])
    authority.close()
    found = {c: table_files(spark, layout.rows_of(c)) for c in tables}
    files = {c: f for c, f in found.items() if f is not None}
    assert files.keys() == found.keys(), f"{layout.root}: the benchmark needs a store Python reaches (a folder, s3a://)"
    start, measuring, stop = threading.Event(), threading.Event(), threading.Event()
    ready = threading.Barrier(n + 1)
    stats = [WriterStats(name=s.name) for s in specs]
    errors: list[BaseException] = []

    def body(spec: WriterSpec, st: WriterStats) -> None:
        try:
            run_writer(spark, layout, zk, pipeline=pipeline, spec=spec, start=start, measuring=measuring, stop=stop,
                       stats=st, ready=ready)
        except BaseException as exc:
            errors.append(exc)
            ready.abort()

    threads = [threading.Thread(target=body, args=(s, st), name=f"writer-{s.name}", daemon=True)
               for s, st in zip(specs, stats, strict=True)]
    for t in threads:
        t.start()
    try:
        try:
            ready.wait(timeout=300)
        except threading.BrokenBarrierError:
            raise RuntimeError(f"a writer failed to start: {errors[0] if errors else 'timeout'}") from None
        v0 = {c: max((v for v, _ in commit_infos(f, after=-1) or []), default=0) for c, f in files.items()}
        start.set()
        time.sleep(warmup)
        z0, load0 = zxid(counter()), os.getloadavg()[0]
        measuring.set()
        t0 = time.monotonic()
        time.sleep(seconds)
        measuring.clear()
        now = time.monotonic()
        elapsed = now - t0
        in_flight = [now - st.batch_started for st in stats if st.batch_started is not None]
        z1 = zxid(counter())
    finally:
        stop.set()
        start.set()
        for t in threads:
            t.join(timeout=600)
    infos = [vi for c, f in files.items() for vi in commit_infos(f, after=v0[c]) or []]
    counted = {cid for st in stats for cid in st.commit_ids}
    # a group commit's version holds several writers' batches (``delta/group.py``): each counts once
    landed = [(v, info) for v, info in infos for b in batch_metas(user_metadata(info.get("userMetadata")))
              if b.get("commit_id") in counted]
    versions = {v: info for v, info in landed}
    between = [v - int(info["readVersion"]) - 1 for v, info in versions.items() if info.get("readVersion") is not None]
    reader = RowStore(spark, layout, writer="bench-reader")
    missing = sum(len(st.keys - {r.key for r in reader.scan_intervals(spec.computation, spec.intervals)})
                  for spec, st in zip(specs, stats, strict=True))
    point = summarize(stats, elapsed_s=elapsed, zk_writes=z1 - z0, tables=[s.computation for s in specs])
    point.update({
        "shape": shape, "writers": n, "load_avg_1m": round(load0, 2),
        "log_versions_of_counted_commits": len(landed),  # batches: a group commit's each
        "versions_holding_counted_commits": len(versions),
        "batches_per_version": round(len(landed) / len(versions), 2) if versions else None,
        "log_versions_after_start": len(infos),
        "commits_between_snapshot_and_version_mean": round(sum(between) / len(between), 3) if between else None,
        "writers_without_commit": sum(1 for st in stats if st.commits == 0),
        "commits_without_turn": sum(st.turns_skipped for st in stats),
        "longest_batch_in_flight_at_end_s": round(max(in_flight, default=0.0), 2),
        "keys_missing": missing, "writer_errors": [repr(e) for e in errors],
    })
    return point


def run(spark: Any, servers: Servers, out: Path, *, targets: list[str], latencies: list[int], shapes: list[str],
        writers: list[int], seconds: float, warmup: float, keys_per_batch: int) -> dict[str, Any]:
    """Every point of ``targets`` x latency x ``shapes`` x ``writers``, one after the other."""
    result: dict[str, Any] = {"cpus": os.cpu_count(), "load_avg_before": os.getloadavg(), "seconds": seconds,
                              "warmup_s": warmup, "keys_per_batch": keys_per_batch,
                              "zookeeper": "three-server ensemble" if servers.ensemble else "one server",
                              "points": []}
    run_id = uuid.uuid4().hex[:6]
    for target in targets:
        for lat in (latencies if target == "s3a" else [0]):
            for shape in shapes:
                for n in writers:
                    name = f"{run_id}-{target}-{lat}ms-{shape}-n{n}"
                    local = str((out / "stores" / name).resolve())
                    uri = f"s3a://{BUCKET}/{name}" if target == "s3a" else local
                    print(f"commits: {target} {lat} ms {shape} N={n}: running {warmup:g}+{seconds:g} s ...", flush=True)
                    point = measure_point(
                        spark, zk_hosts=servers.zk_hosts, count_hosts=servers.leader_hosts, store_uri=uri,
                        shape=shape, n=n, seconds=seconds, warmup=warmup, keys_per_batch=keys_per_batch,
                        latency_ms=lat, set_latency=servers.set_latency if target == "s3a" else None)
                    point.update({"target": target, "latency_ms": lat, "store": uri})
                    result["points"].append(point)
                    print(point_line(point), flush=True)
                    (out / "commits.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    result["load_avg_after"] = os.getloadavg()
    return result


def run_from_args(args: argparse.Namespace) -> int:
    """Run every point and write ``commits.json`` and ``commits.png`` into ``--out``; exit code 1 if a check failed."""
    from deltawheel.executor.session import build_spark
    from deltawheel.statestore.session.sparkenv import SparkSettings

    if args.quick:
        args.writers, args.targets, args.seconds, args.warmup = "1,2", "local", 4.0, 1.0
    targets = pick_names(args.targets, TARGETS, "target", "commits")
    shapes = pick_names(args.shapes, SHAPES, "shape", "commits")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    servers = Servers(out, ensemble=args.ensemble, object_store="s3a" in targets)
    spark = None
    try:
        servers.start()
        spark = build_spark(SparkSettings(master="local[2]", app_name="deltawheel-bench-commits",
                                          object_store="s3a" in targets, extra=NO_COMMIT_LOCK))
        if "s3a" in targets:
            servers.configure(spark)
        result = run(spark, servers, out, targets=targets, latencies=_ints(args.latencies), shapes=shapes,
                     writers=_ints(args.writers), seconds=args.seconds, warmup=args.warmup,
                     keys_per_batch=args.keys_per_batch)
    finally:
        if spark is not None:
            from deltawheel.statestore.delta.maintenance import checkpointer

            checkpointer(spark).idle(60.0)  # a log checkpoint under way ends before the session does
            spark.stop()
        servers.stop()
    (out / "commits.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    plot_commits(result, out / "commits.png")
    print(f"commits: wrote {out / 'commits.json'} and {out / 'commits.png'}", flush=True)
    bad = failed_checks(result["points"])
    for line in bad:
        print(f"commits: CHECK FAILED at {line}", flush=True)
    return 1 if bad else 0


def failed_checks(points: list[dict[str, Any]]) -> list[str]:
    """A line per point with a failed batch, a missing key, a writer's error, a commit not logged, or none."""
    return [f"{p['target']} {p['latency_ms']} ms {p['shape']} N={p['writers']}: failed {p['failed']}, keys missing "
            f"{p['keys_missing']}, counted {p['commits']} vs log {p['log_versions_of_counted_commits']}"
            + (", no commit" if not p["commits"] else "")
            for p in points if p["failed_batches"] or p["keys_missing"] or p["writer_errors"] or not p["commits"]
            or p["log_versions_of_counted_commits"] != p["commits"]]
