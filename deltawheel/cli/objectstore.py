"""``deltawheel objectstore start|stop|status|create-bucket``: a local S3-compatible server (S3Proxy)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from deltawheel.servers.s3proxy import DEFAULT_OBJECTSTORE_PORT, S3ProxyServer
from deltawheel.servers.service import read_properties
from deltawheel.statestore.exceptions import ObjectStoreServerError
from deltawheel.statestore.objectstore import s3a

from .common import say_running

__all__ = ["register"]

_DEFAULT_DATA = os.path.join(".deltawheel", "objectstore")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``objectstore start``, ``stop``, ``status`` and ``create-bucket``."""
    p = subparsers.add_parser("objectstore", help="run a local S3-compatible server (S3Proxy) for s3a:// stores")
    sub = p.add_subparsers(dest="objectstore_command", metavar="ACTION")
    sub.required = True
    for name, func, help_text in (
        ("start", _start, "start the server in the background; prints the endpoint, credentials and settings"),
        ("stop", _stop, "stop the server (no process is left behind)"),
        ("status", _status, "exit 0 if the server runs (printing how to reach it), 1 if not"),
        ("create-bucket", _create_bucket, "create a bucket on the running server"),
    ):
        a = sub.add_parser(name, help=help_text)
        if name == "create-bucket":
            a.add_argument("bucket", help="bucket name (3-63 lower-case letters, digits, '-' or '.')")
        a.add_argument("--data", default=_DEFAULT_DATA,
                       help=f"data folder of the server: configuration, buckets, log (default {_DEFAULT_DATA})")
        a.add_argument("--port", type=int, default=None,
                       help=f"HTTP port (default: the data folder's earlier port, else {DEFAULT_OBJECTSTORE_PORT})")
        a.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        if name == "start":
            a.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
        a.set_defaults(func=func)


def _server(args: argparse.Namespace) -> S3ProxyServer:
    """The server of ``--data`` on ``--port``, else its earlier start's port (so stop/status find it)."""
    port = args.port
    if port is None:
        endpoint = read_properties(Path(args.data) / "s3proxy.conf").get("s3proxy.endpoint")
        port = int(endpoint.rsplit(":", 1)[1]) if endpoint else DEFAULT_OBJECTSTORE_PORT
    return S3ProxyServer(args.data, port=port, host=args.host)


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


def _start(args: argparse.Namespace) -> int:
    server = _server(args)
    server.start(timeout_s=args.timeout)
    st = server.status()
    print(f"S3Proxy running: pid {st.pid}, data {st.data_dir} (buckets in {server.blobs_dir})")
    _print_settings(server)
    return 0


def _stop(args: argparse.Namespace) -> int:
    server = _server(args)
    pid = server.status().pid
    if server.stop():
        print(f"stopped S3Proxy (pid {pid}) on port {server.port}")
    else:
        print(f"no S3Proxy running for {server.data_dir}")
        _say_foreign(server)
    return 0


def _status(args: argparse.Namespace) -> int:
    server = _server(args)
    st = server.status()
    if say_running(st.running, st.pid, st.port, st.data_dir) == 0:
        _print_settings(server)
        return 0
    _say_foreign(server)
    return 1


def _say_foreign(server: S3ProxyServer) -> None:
    if (other := _foreign(server)) is not None:
        print(other)


def _foreign(server: S3ProxyServer) -> str | None:
    """What to say when this data folder's server does not run but something answers on its port
    (usually the server of another data folder: its credentials are not this folder's)."""
    if not server.ready():
        return None
    return (f"port {server.port} is answered by another process: not the server of {server.data_dir} (another "
            "data folder's, whose credentials are not this folder's?); pass the --data folder it was started "
            "with, or --port to start this one beside it")


def _create_bucket(args: argparse.Namespace) -> int:
    server = _server(args)
    if not server.status().running:
        other = _foreign(server)
        raise ObjectStoreServerError(other or f"no server of {server.data_dir} runs on port {server.port}: start "
                                     f"it with 'deltawheel objectstore start --data {server.data_dir}'")
    if server.create_bucket(args.bucket):
        print(f"created bucket {args.bucket!r}: use s3a://{args.bucket}/PATH")
    else:
        print(f"bucket {args.bucket!r} exists already")
    return 0
