"""``deltawheel zk start|stop|status``: the embedded ZooKeeper server for local stores."""

from __future__ import annotations

import argparse

from deltawheel.statestore.config import DEFAULT_ZK_PORT
from deltawheel.statestore.zk.server import EmbeddedZooKeeper

from .common import layout_from

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``zk start``, ``zk stop`` and ``zk status``."""
    zk = subparsers.add_parser("zk", help="run the embedded ZooKeeper server (from pyspark's jars)")
    sub = zk.add_subparsers(dest="zk_command", metavar="ACTION")
    sub.required = True
    for name, func, help_text in (
        ("start", _start, "start the server in the background; returns once it is ready"),
        ("stop", _stop, "stop the server (no process is left behind)"),
        ("status", _status, "exit 0 if the server runs, 1 if not"),
    ):
        p = sub.add_parser(name, help=help_text)
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--store", help="store folder; the server's data lives in <store>/_zk")
        where.add_argument("--data-dir", help="data folder of the server")
        p.add_argument("--port", type=int, default=None,
                       help=f"client port (default: the running server's, else {DEFAULT_ZK_PORT})")
        p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        if name == "start":
            p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for readiness")
        p.set_defaults(func=func)


def _server(args: argparse.Namespace) -> EmbeddedZooKeeper:
    data_dir = args.data_dir if args.data_dir else layout_from(args).zk_data
    port = args.port if args.port is not None else _configured_port(data_dir)
    return EmbeddedZooKeeper(data_dir, port=port, host=args.host)


def _configured_port(data_dir: str) -> int:
    """The clientPort of an earlier start in ``data_dir`` (so stop/status find it), else the default."""
    import os

    cfg = os.path.join(str(data_dir), "zoo.cfg")
    if os.path.exists(cfg):
        with open(cfg) as f:
            for line in f:
                if line.startswith("clientPort="):
                    return int(line.split("=", 1)[1])
    return DEFAULT_ZK_PORT


def _start(args: argparse.Namespace) -> int:
    server = _server(args)
    server.start(timeout_s=args.timeout)
    st = server.status()
    print(f"ZooKeeper running: pid {st.pid}, data {st.data_dir}")
    print(f"connect with --zk {server.hosts}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    server = _server(args)
    pid = server.status().pid
    if server.stop():
        print(f"stopped ZooKeeper (pid {pid}) on {server.hosts}")
    else:
        print(f"no ZooKeeper running for {server.data_dir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    st = _server(args).status()
    if st.running:
        print(f"running: pid {st.pid}, port {st.port}, data {st.data_dir}")
        return 0
    print(f"not running (port {st.port}, data {st.data_dir})")
    return 1
