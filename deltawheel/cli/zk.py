"""``deltawheel zk start|stop|status``: the embedded ZooKeeper server for local stores.

With ``--store`` it is the store's own server (:mod:`..servers.embedded`); with ``--data-dir``, one
of your own on ``--port``."""

from __future__ import annotations

import argparse
import time

from deltawheel.servers.zookeeper import EmbeddedZooKeeper, configured_port, four_letter_word
from deltawheel.statestore.config import DEFAULT_ZK_PORT
from deltawheel.statestore.process import free_ports, port_free

from ..servers.embedded import StoreZooKeeper
from .common import layout_from, say_running

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``zk start``, ``zk stop`` and ``zk status``."""
    zk = subparsers.add_parser("zk", help="run the embedded ZooKeeper server (from pyspark's jars)")
    sub = zk.add_subparsers(dest="zk_command", metavar="ACTION")
    sub.required = True
    for name, func, help_text in (
        ("start", _start, "start the server in the background; returns once it is ready"),
        ("stop", _stop, "stop the server (no process is left behind)"),
        ("status", _status, "exit 0 if the server runs, 1 if not; with --store: whose it is, its port, pid and users"),
    ):
        p = sub.add_parser(name, help=help_text)
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--store", help="store folder: its own server (data and record in <store>/_zk), the "
                                           "one its commands use when no --zk is given")
        where.add_argument("--data-dir", help="data folder of a server of your own")
        p.add_argument("--port", type=int, default=None,
                       help="client port (default: with --store the store's recorded port when free, else a free "
                            f"one; with --data-dir the server's last port, else {DEFAULT_ZK_PORT} when free, else "
                            "a free one)")
        p.add_argument("--host", default="127.0.0.1", help="address to listen on, with --data-dir (default 127.0.0.1)")
        if name == "start":
            p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for readiness")
        if name == "stop":
            p.add_argument("--force", action="store_true",
                           help="with --store: stop it even while processes use it (they lose ZooKeeper)")
        p.set_defaults(func=func)


def _server(args: argparse.Namespace) -> EmbeddedZooKeeper:
    data_dir = args.data_dir if args.data_dir else layout_from(args).zk_data
    port = args.port if args.port is not None else _default_port(data_dir, args.host)
    return EmbeddedZooKeeper(data_dir, port=port, host=args.host)


def _default_port(data_dir: str, host: str) -> int:
    """The port of an earlier start in ``data_dir`` (so stop/status find it), else 2181 unless another
    program (e.g. another ZooKeeper) holds it, else a free port."""
    port = configured_port(data_dir)
    if port is not None:
        return port
    if port_free(host, DEFAULT_ZK_PORT) and four_letter_word(host, DEFAULT_ZK_PORT) is None:
        return DEFAULT_ZK_PORT
    return free_ports(1, host)[0]


def _start(args: argparse.Namespace) -> int:
    if args.store:
        layout = layout_from(args)
        server, _, started = StoreZooKeeper(layout).acquire(keep=True, port=args.port, register=False,
                                                            timeout_s=args.timeout)
    else:
        server = _server(args)
        server.start(timeout_s=args.timeout)
    st = server.status()
    print(f"ZooKeeper running: pid {st.pid}, port {st.port}, data {st.data_dir}")
    print(f"connect with --zk {server.hosts}")
    if args.store:
        print(f"it is the store's own server: commands with --store {layout.root} use it without --zk; it stays "
              f"running until `deltawheel zk stop --store {layout.root}`")
    return 0


def _stop(args: argparse.Namespace) -> int:
    if args.store:
        owner = StoreZooKeeper(layout_from(args))
        server = owner.server()
        pid = server.process.pid()
        stopped = owner.stop(force=args.force)
    else:
        server = _server(args)
        pid = server.status().pid
        stopped = server.stop()
    if stopped:
        print(f"stopped ZooKeeper (pid {pid}) on {server.hosts}")
    else:
        print(f"no ZooKeeper running for {server.data_dir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    if args.store:
        return _store_status(args)
    st = _server(args).status()
    return say_running(st.running, st.pid, st.port, st.data_dir)


def _store_status(args: argparse.Namespace) -> int:
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
