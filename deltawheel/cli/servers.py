"""``deltawheel zk start|stop|status`` (the embedded ZooKeeper: a store's own, or of a ``--data-dir``)
and ``deltawheel objectstore start|stop|status|create-bucket`` (S3Proxy)."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any, Callable

from deltawheel.statestore.config import DEFAULT_ZK_PORT
from deltawheel.statestore.exceptions import ObjectStoreServerError
from deltawheel.statestore.objectstore import s3a

from ..servers.embedded import StoreZooKeeper
from ..servers.s3proxy import DEFAULT_OBJECTSTORE_PORT, S3ProxyServer
from ..servers.zookeeper import EmbeddedZooKeeper, default_port
from .common import layout_from, say_running

__all__ = ["register"]

_OBJECTSTORE_DATA = os.path.join(".deltawheel", "objectstore")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``zk start|stop|status`` and ``objectstore start|stop|status|create-bucket``."""
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
