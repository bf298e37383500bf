"""``deltawheel cluster up|down|status``: a local Spark standalone cluster and ZooKeeper ensemble."""

from __future__ import annotations

import argparse
import os
import time

__all__ = ["register"]

DEFAULT_DATA = os.path.join("data", "cluster")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``cluster up``, ``cluster down`` and ``cluster status``."""
    cluster = subparsers.add_parser(
        "cluster", help="run a local Spark standalone cluster (master + 2 workers) and a 3-server ZooKeeper ensemble")
    sub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION")
    sub.required = True
    for name, func, help_text in (
        ("up", _up, "start everything in the background; prints the master URL and the --zk connect string"),
        ("down", _down, "stop every process of the cluster (idempotent)"),
        ("status", _status, "each process: pid, alive, ZooKeeper role, workers registered; exit 0 if all run"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--data", default=DEFAULT_DATA,
                       help=f"the cluster's folder: configuration, logs, pid files (default {DEFAULT_DATA})")
        if name == "up":
            p.add_argument("--no-spark", action="store_true", help="only the ZooKeeper ensemble")
            p.add_argument("--no-zk", action="store_true", help="only the Spark cluster")
            p.add_argument("--workers", type=int, default=2, help="Spark workers, 1 core each (default 2)")
            p.add_argument("--worker-memory", default="2g", help="memory each worker offers (default 2g)")
            p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each part")
        p.set_defaults(func=func)


def _up(args: argparse.Namespace) -> int:
    from ..servers.cluster import LocalCluster

    cluster = LocalCluster(os.path.abspath(args.data), zookeeper=not args.no_zk, spark=not args.no_spark,
                           workers=args.workers, worker_memory=args.worker_memory)
    started = time.monotonic()
    cluster.up(timeout_s=args.timeout)
    print(f"cluster up in {time.monotonic() - started:.1f}s (data in {cluster.data_dir})")
    if cluster.master_url is not None:
        assert cluster.spark is not None
        print(f"Spark master: {cluster.master_url}  (web UI {cluster.spark.ui_url})")
    if cluster.zk_hosts is not None:
        print(f"ZooKeeper:    {cluster.zk_hosts}")
    extra = [f"--master {cluster.master_url}" if cluster.master_url else "",
             f"--zk {cluster.zk_hosts}" if cluster.zk_hosts else ""]
    print(f"run a job on it: deltawheel demo --store DIR {' '.join(e for e in extra if e)}")
    print(f"stop it with:    deltawheel cluster down --data {args.data}")
    return 0


def _down(args: argparse.Namespace) -> int:
    from ..servers.cluster import LocalCluster

    cluster = LocalCluster(os.path.abspath(args.data))
    if not cluster.manifest.exists():
        print(f"no cluster in {cluster.data_dir}")
        return 0
    n = cluster.down()
    print(f"stopped {n} process{'es' if n != 1 else ''} of the cluster in {cluster.data_dir}" if n
          else f"no process of the cluster in {cluster.data_dir} was running")
    return 0


def _status(args: argparse.Namespace) -> int:
    from ..servers.cluster import LocalCluster

    cluster = LocalCluster(os.path.abspath(args.data))
    if not cluster.manifest.exists():
        print(f"no cluster in {cluster.data_dir} (start one with: deltawheel cluster up --data {args.data})")
        return 1
    st = cluster.status()

    def pid(p: int | None) -> str:
        return f"pid {p:<7d} alive" if p is not None else "not running      "

    if st.zookeeper is not None:
        z = st.zookeeper
        print(f"ZooKeeper {z.hosts}: quorum {'yes' if z.quorum else 'NO'}, leader "
              f"{'zk' + str(z.leader) if z.leader is not None else '-'}")
        for i, s in enumerate(z.servers, start=1):
            print(f"  {'zk' + str(i):<9s} {pid(s.pid)}  {s.mode or 'not serving':<12s} port {s.port}  "
                  f"log {os.path.join(s.data_dir, 'zookeeper.log')}")
    if st.spark is not None:
        sp = st.spark
        print(f"Spark {sp.master_url} (web UI {sp.ui_url}): master {'ALIVE' if sp.master_alive else 'NOT ANSWERING'}")
        print(f"  {'master':<9s} {pid(sp.master_pid)}  {'':<12s} log {sp.log}")
        for w in sp.workers:
            reg = f"registered {w.cores} core, {w.memory_mb} MB" if w.registered else "NOT registered"
            print(f"  {'worker-' + str(w.index):<9s} {pid(w.pid)}  {reg:<12s} port {w.port}  log {w.log}")
    print("healthy" if st.healthy else "NOT healthy: see the lines above")
    return 0 if st.healthy else 1
