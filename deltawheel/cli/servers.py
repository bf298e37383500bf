"""``deltawheel zk start|stop|status`` (the embedded ZooKeeper: a store's own, or of a ``--data-dir``),
``deltawheel objectstore start|stop|status|create-bucket`` (S3Proxy) and ``deltawheel cluster
up|down|status|exec|env|fault [--hosts]`` (a local Spark cluster and ZooKeeper ensemble)."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import time
from typing import Any, Callable

from deltawheel.statestore.config import DEFAULT_ZK_PORT
from deltawheel.statestore.exceptions import ObjectStoreServerError
from deltawheel.statestore.objectstore import s3a

from ..servers.embedded import StoreZooKeeper
from ..servers.s3proxy import DEFAULT_OBJECTSTORE_PORT, S3ProxyServer
from ..servers.zookeeper import EmbeddedZooKeeper, default_port
from .common import layout_from, plural, say_running

__all__ = ["register"]

_OBJECTSTORE_DATA = os.path.join(".deltawheel", "objectstore")
DEFAULT_DATA = os.path.join("data", "cluster")
DEFAULT_HOSTS_DATA = os.path.join("data", "hosts")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``zk start|stop|status``, ``objectstore start|stop|status|create-bucket`` and ``cluster``."""
    sub = _actions(subparsers, "zk", "run the embedded ZooKeeper server (from pyspark's jars)", (
        ("start", _zk_start, "start the server in the background; returns once it is ready"),
        ("stop", _zk_stop, "stop the server (no process is left behind)"),
        ("status", _zk_status, "exit 0 if the server runs, 1 if not; with --store: whose it is, its port, pid and "
                               "users"),
    ))
    for name, p in sub.items():
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--store", help="store folder: its own server (data and record in <store>/_zk), the "
                                           "one its commands use when no --zk is given")
        where.add_argument("--data-dir", help="data folder of a server of your own")
        _server_args(p, name, "client port (default: with --store the store's recorded port when free, else a free "
                     f"one; with --data-dir the server's last port, else {DEFAULT_ZK_PORT} when free, else a free "
                     "one)", "address to listen on, with --data-dir (default 127.0.0.1)", 30.0)
        if name == "stop":
            p.add_argument("--force", action="store_true",
                           help="with --store: stop it even while processes use it (they lose ZooKeeper)")
    sub = _actions(subparsers, "objectstore", "run a local S3-compatible server (S3Proxy) for s3a:// stores", (
        ("start", _s3_start, "start the server in the background; prints the endpoint, credentials and settings"),
        ("stop", _s3_stop, "stop the server (no process is left behind)"),
        ("status", _s3_status, "exit 0 if the server runs (printing how to reach it), 1 if not"),
        ("create-bucket", _create_bucket, "create a bucket on the running server"),
    ))
    for name, p in sub.items():
        if name == "create-bucket":
            p.add_argument("bucket", help="bucket name (3-63 lower-case letters, digits, '-' or '.')")
        p.add_argument("--data", default=_OBJECTSTORE_DATA,
                       help=f"data folder of the server: configuration, buckets, log (default {_OBJECTSTORE_DATA})")
        _server_args(p, name, f"HTTP port (default: the data folder's earlier port, else {DEFAULT_OBJECTSTORE_PORT})",
                     "address to listen on (default 127.0.0.1)", 60.0)
    cluster = subparsers.add_parser(
        "cluster", help="run a local Spark standalone cluster (master + 2 workers) and a 3-server ZooKeeper ensemble")
    sub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION")
    sub.required = True
    for name, funcs, help_text in (
        ("up", (_up, _hosts_up), "start everything in the background; prints the master URL and the --zk connect "
                                 "string"),
        ("down", (_down, _hosts_down), "stop every process of the cluster (idempotent)"),
        ("status", (_status, _hosts_status), "each process: pid, alive, ZooKeeper role, workers registered; exit 0 "
                                             "if all run"),
        ("exec", (_exec, _exec), "run a command on one host of the --hosts test bed: cluster exec HOST -- CMD ..."),
        ("env", (_env, _env), "print shell exports for the --hosts test bed: DW_MASTER, DW_SPARK_PYTHON, DW_CLIENT, "
                              "DELTAWHEEL_ZK, DELTAWHEEL_S3_*"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--data", default=None,
                       help=f"the cluster's folder (default {DEFAULT_DATA}; --hosts: {DEFAULT_HOSTS_DATA})")
        p.add_argument("--hosts", action="store_true", default=name in ("exec", "env"),
                       help="separate hosts on this machine (namespaces; root only; docs/cluster.md)")
        if name == "exec":
            p.add_argument("host", help="s3, zk1, zk2, zk3, master, worker1, worker2 or client")
            p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command (after --)")
        if name == "up":
            p.add_argument("--no-spark", action="store_true", help="only the ZooKeeper ensemble")
            p.add_argument("--no-zk", action="store_true", help="only the Spark cluster")
            p.add_argument("--workers", type=int, default=2, help="Spark workers, 1 core each (default 2)")
            p.add_argument("--worker-memory", default="2g", help="memory each worker offers (default 2g)")
            p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each part")
            p.add_argument("--fresh", action="store_true", help="with --hosts: delete the hosts' data first")
        p.set_defaults(func=lambda args, f=funcs: f[args.hosts](args))  # with --hosts: the test bed's
    _register_fault(sub)


def _actions(subparsers: Any, command: str, help_text: str,
             actions: tuple[tuple[str, Callable[[argparse.Namespace], int], str], ...]) -> dict[str, Any]:
    """Add ``command`` with one subcommand per (name, func, help) of ``actions``; their parsers by name."""
    sub = subparsers.add_parser(command, help=help_text).add_subparsers(dest=f"{command}_command", metavar="ACTION")
    sub.required = True
    parsers = {}
    for name, func, action_help in actions:
        parsers[name] = sub.add_parser(name, help=action_help)
        parsers[name].set_defaults(func=func)
    return parsers


def _server_args(p: argparse.ArgumentParser, action: str, port_help: str, host_help: str, timeout_s: float) -> None:
    """Add ``--port``, ``--host`` and, to ``start``, ``--timeout`` (default ``timeout_s``)."""
    p.add_argument("--port", type=int, default=None, help=port_help)
    p.add_argument("--host", default="127.0.0.1", help=host_help)
    if action == "start":
        p.add_argument("--timeout", type=float, default=timeout_s, help="seconds to wait for readiness")


def _zk_server(args: argparse.Namespace) -> EmbeddedZooKeeper:
    data_dir = args.data_dir if args.data_dir else layout_from(args).zk_data
    port = args.port if args.port is not None else default_port(data_dir, args.host)
    return EmbeddedZooKeeper(data_dir, port=port, host=args.host)


def _zk_start(args: argparse.Namespace) -> int:
    if args.store:
        layout = layout_from(args)
        server, _, started = StoreZooKeeper(layout).acquire(keep=True, port=args.port, register=False,
                                                            timeout_s=args.timeout)
    else:
        server = _zk_server(args)
        server.start(timeout_s=args.timeout)
    st = server.status()
    print(f"ZooKeeper running: pid {st.pid}, port {st.port}, data {st.data_dir}")
    print(f"connect with --zk {server.hosts}")
    if args.store:
        print(f"it is the store's own server: commands with --store {layout.root} use it without --zk; it stays "
              f"running until `deltawheel zk stop --store {layout.root}`")
    return 0


def _zk_stop(args: argparse.Namespace) -> int:
    if args.store:
        owner = StoreZooKeeper(layout_from(args))
        server = owner.server()
        pid = server.process.pid()
        stopped = owner.stop(force=args.force)
    else:
        server = _zk_server(args)
        pid = server.status().pid
        stopped = server.stop()
    print(f"stopped ZooKeeper (pid {pid}) on {server.hosts}" if stopped else
          f"no ZooKeeper running for {server.data_dir}")
    return 0


def _zk_status(args: argparse.Namespace) -> int:
    if not args.store:
        own = _zk_server(args).status()
        return say_running(own.running, own.pid, own.port, own.data_dir)
    layout = layout_from(args)
    owner = StoreZooKeeper(layout)
    st = owner.status()
    rec = st.record
    port = owner.server().port or (rec.port if rec else None)
    say_running(st.running, st.pid, port if st.running else port or "-", st.data_dir)
    if not st.running and rec is not None and rec.pid is not None:
        print(f"stale record: its server (pid {rec.pid}) is gone; the next command on the store starts a new one")
    print(f"store: {layout.root}" + ("" if rec is None or rec.store == layout.root else
                                     f" (recorded for {rec.store}: this folder is a copy)"))
    if rec is not None and st.running:
        print(f"started by: {rec.started_by} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(rec.started_at))}")
        print("stays running: " + ("yes (started by `zk start`; `zk stop --store` stops it)" if rec.keep else
                                   "no (its last user stops it)"))
    print(f"users: {len(st.users)}")
    for u in st.users:
        print(f"  pid {u.pid} since {time.strftime('%H:%M:%S', time.localtime(u.since))}: {u.command}")
    if st.running:
        print(f"connect with --zk 127.0.0.1:{port}")
    return 0 if st.running else 1


def _s3_server(args: argparse.Namespace) -> S3ProxyServer:
    return S3ProxyServer.of_data(args.data, port=args.port, host=args.host)


def _print_settings(server: S3ProxyServer) -> None:
    ep = server.endpoint
    print(f"endpoint    {ep.url}")
    print(f"access key  {ep.access_key}")
    print(f"secret key  {ep.secret_key}")
    print("\nfor deltawheel (every s3a:// bucket on this server; ./dw and build_spark read them):")
    print(f"  export {s3a.ENV_ENDPOINT}={ep.url}")
    print(f"  export {s3a.ENV_ACCESS_KEY}={ep.access_key}")
    print(f"  export {s3a.ENV_SECRET_KEY}={ep.secret_key}")
    print("\nfor any Spark application (spark-submit --conf ..., with hadoop-aws on the classpath):")
    for k, v in s3a.spark_conf(ep).items():
        print(f"  {k}={v}")
    print("\nthen: deltawheel objectstore create-bucket BUCKET, and use --store s3a://BUCKET/PATH")


def _s3_start(args: argparse.Namespace) -> int:
    server = _s3_server(args)
    server.start(timeout_s=args.timeout)
    st = server.status()
    print(f"S3Proxy running: pid {st.pid}, data {st.data_dir} (buckets in {server.blobs_dir})")
    _print_settings(server)
    return 0


def _s3_stop(args: argparse.Namespace) -> int:
    server = _s3_server(args)
    pid = server.status().pid
    if server.stop():
        print(f"stopped S3Proxy (pid {pid}) on port {server.port}")
    elif other := server.foreign():
        print(f"no S3Proxy running for {server.data_dir}\n{other}")
    else:
        print(f"no S3Proxy running for {server.data_dir}")
    return 0


def _s3_status(args: argparse.Namespace) -> int:
    server = _s3_server(args)
    st = server.status()
    if say_running(st.running, st.pid, st.port, st.data_dir) == 0:
        _print_settings(server)
        return 0
    if other := server.foreign():
        print(other)
    return 1


def _create_bucket(args: argparse.Namespace) -> int:
    server = _s3_server(args)
    if not server.status().running:
        raise ObjectStoreServerError(server.foreign() or f"no server of {server.data_dir} runs on port {server.port}: "
                                     f"start it with 'deltawheel objectstore start --data {server.data_dir}'")
    created = server.create_bucket(args.bucket)
    print(f"created bucket {args.bucket!r}: use s3a://{args.bucket}/PATH" if created else
          f"bucket {args.bucket!r} exists already")
    return 0


def _data(args: argparse.Namespace) -> str:
    return os.path.abspath(args.data or (DEFAULT_HOSTS_DATA if args.hosts else DEFAULT_DATA))


def _up(args: argparse.Namespace) -> int:
    from ..servers.cluster import LocalCluster

    cluster = LocalCluster(_data(args), zookeeper=not args.no_zk, spark=not args.no_spark,
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
    print(f"stop it with:    deltawheel cluster down --data {args.data or DEFAULT_DATA}")
    return 0


def _hosts_up(args: argparse.Namespace) -> int:
    from ..servers.hosts import HostsCluster

    services = [s for s, off in (("s3", False), ("zk", args.no_zk), ("spark", args.no_spark)) if not off]
    cluster = HostsCluster(_data(args), services=services, worker_memory=args.worker_memory)
    started = time.monotonic()
    cluster.up(timeout_s=args.timeout, fresh=args.fresh)
    print(f"hosts up in {time.monotonic() - started:.1f}s (data in {cluster.data_dir})")
    for name, host in cluster.hosts.items():
        print(f"  {name:<8s} {host.address:<12s} namespace {host.netns}")
    print(f"Spark master: {cluster.master_url}  (web UI {cluster.master_ui})")
    print(f"ZooKeeper:    {cluster.zk_hosts}")
    ep = cluster.s3_endpoint
    print(f"S3:           {ep.url}  access key {ep.access_key}  secret key {ep.secret_key}")
    print("run on a host: deltawheel cluster exec client -- CMD ...;  stop: deltawheel cluster down --hosts")
    return 0


def _hosts_down(args: argparse.Namespace) -> int:
    from ..servers.hosts import HostsCluster

    n, left = HostsCluster(_data(args)).down()
    print(f"stopped {plural(n, 'process', 'processes')}; namespaces, veths and the bridge deleted")
    if left:
        print("STILL THERE: " + "; ".join(left))
        return 1
    return 0


def _exec(args: argparse.Namespace) -> int:
    from ..servers.hosts import HostsCluster

    cluster = HostsCluster(_data(args))
    if args.host not in cluster.hosts:
        print(f"no host {args.host!r}: choose among {', '.join(cluster.hosts)}")
        return 2
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print("give the command after --, e.g. deltawheel cluster exec client -- hostname -I")
        return 2
    prefix = cluster.client_prefix() if args.host == "client" else cluster.isolated(args.host)
    return subprocess.run([*prefix, *cmd]).returncode


def _env(args: argparse.Namespace) -> int:
    from ..servers.hosts import HostsCluster

    cluster = HostsCluster(_data(args))
    ep = cluster.s3_endpoint
    for k, v in (("DW_MASTER", cluster.master_url), ("DW_SPARK_PYTHON", str(cluster.spark_python)),
                 ("DW_CLIENT", cluster.hosts["client"].address), ("DELTAWHEEL_ZK", cluster.zk_hosts),
                 (s3a.ENV_ENDPOINT, ep.url), (s3a.ENV_ACCESS_KEY, ep.access_key), (s3a.ENV_SECRET_KEY, ep.secret_key)):
        print(f"export {k}={shlex.quote(v)}")
    return 0


def _down(args: argparse.Namespace) -> int:
    from ..servers.cluster import LocalCluster

    cluster = LocalCluster(_data(args))
    if not cluster.manifest.exists():
        print(f"no cluster in {cluster.data_dir}")
        return 0
    n = cluster.down()
    print(f"stopped {plural(n, 'process', 'processes')} of the cluster in {cluster.data_dir}" if n
          else f"no process of the cluster in {cluster.data_dir} was running")
    return 0


def _hosts_status(args: argparse.Namespace) -> int:
    from ..servers.hosts import HostsCluster

    cluster = HostsCluster(_data(args))
    st = cluster.status()
    for name, services in st.services.items():
        for what, pid in services:
            mode = st.zk_modes.get(name)
            print(f"  {name:<8s} {cluster.hosts[name].address:<12s} {what:<13s} "
                  f"{'pid ' + str(pid) if pid else 'NOT RUNNING'}{'  ' + mode if mode else ''}")
    print(f"workers registered with the master: {st.workers_registered}")
    print("healthy" if st.healthy else "NOT healthy: see the lines above")
    return 0 if st.healthy else 1


def _status(args: argparse.Namespace) -> int:
    from ..servers.cluster import LocalCluster

    cluster = LocalCluster(_data(args))
    if not cluster.manifest.exists():
        print(f"no cluster in {cluster.data_dir} (start one with: deltawheel cluster up --data {args.data or DEFAULT_DATA})")
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


def _register_fault(sub: Any) -> None:
    """Add ``cluster fault cut|heal|kill|restart|show``: faults between the hosts of the test bed."""
    fault = sub.add_parser("fault", help="inject a fault between hosts of the --hosts test bed: cut a host off "
                           "(whole or from some hosts), heal it, kill it whole, start what was killed")
    acts = fault.add_subparsers(dest="fault_command", metavar="FAULT")
    acts.required = True
    for name, help_text in (
        ("cut", "cut HOST off the bridge, or with --from only from those hosts (both ways; packets vanish)"),
        ("heal", "undo cuts of HOST: every one, or with --from only those"),
        ("kill", "SIGKILL every process of HOST (its network namespace's)"),
        ("restart", "start again every service of the test bed that does not run"),
        ("show", "list the cuts in place"),
    ):
        p = acts.add_parser(name, help=help_text)
        p.add_argument("--data", default=DEFAULT_HOSTS_DATA,
                       help=f"the test bed's folder (default {DEFAULT_HOSTS_DATA})")
        p.add_argument("--hosts", action="store_true", default=True, help="the --hosts test bed (the only choice)")
        if name in ("cut", "heal", "kill"):
            p.add_argument("host", help="s3, zk1, zk2, zk3, master, worker1, worker2 or client")
        if name in ("cut", "heal"):
            p.add_argument("--from", dest="peers", action="append", default=[], metavar="HOST",
                           help="a host to cut HOST off from (repeat, or separate with commas)")
        p.set_defaults(func=_fault)


def _fault(args: argparse.Namespace) -> int:
    from ..servers.hostfaults import HostFaults
    from ..servers.hosts import HostsCluster

    faults = HostFaults(HostsCluster(os.path.abspath(args.data)))
    what = args.fault_command
    peers = [p for word in getattr(args, "peers", []) for p in word.split(",") if p]
    if what == "cut":
        faults.cut(args.host, peers)
        print(f"{args.host} cut off " + (f"from {', '.join(peers)}" if peers else "whole"))
    elif what == "heal":
        faults.heal(args.host, peers)
        print(f"{args.host} healed" + (f" (from {', '.join(peers)})" if peers else ""))
    elif what == "kill":
        pids = faults.kill(args.host)
        print(f"killed {plural(len(pids), 'process', 'processes')} on {args.host}"
              + (f": {' '.join(map(str, pids))}" if pids else ""))
    elif what == "restart":
        faults.restart()
        print("every service of the test bed runs")
    else:
        cuts = faults.cuts()
        print("\n".join(str(c) for c in cuts) if cuts else "no cut in place")
    return 0
