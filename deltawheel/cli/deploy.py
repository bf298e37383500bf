"""``deltawheel setup`` (the jars fetched and built into the per-user cache now, not on first use),
``deltawheel submit-args`` and ``deltawheel pack-env`` (what ``spark-submit`` needs; docs/deploy.md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``setup``, ``submit-args`` and ``pack-env``."""
    p = subparsers.add_parser("setup", help="fetch the Delta jars and compile the log store into the per-user cache "
                                            "(~/.cache/deltawheel/jars, or $DELTAWHEEL_JARS_DIR)")
    p.add_argument("--object-store", action="store_true",
                   help="also the S3A and S3Proxy jars and the object-store log store (s3a:// stores)")
    p.add_argument("--kafka", action="store_true",
                   help="also Spark's Kafka connector (KafkaInjector; ~/.cache/deltawheel/kafka-jars)")
    p.add_argument("--toxiproxy", action="store_true",
                   help="also build Toxiproxy from its Go module into ~/.cache/deltawheel/bin (bench commits' "
                        "network latency; needs Go)")
    p.set_defaults(func=_setup)
    p = subparsers.add_parser("submit-args", help="print the --jars/--conf/--archives options spark-submit needs "
                                                  "for a deltawheel job")
    p.add_argument("--object-store", action="store_true", help="tables on s3a://: S3A jars, log store")
    p.add_argument("--archive", default=None, help="the packed environment (pack-env): executors run its Python")
    p.add_argument("--deploy-mode", choices=("client", "cluster"), default="client",
                   help="client: the driver runs here on this Python (default); cluster: on the archive's")
    p.add_argument("--zk", default=None, help="ZooKeeper of the s3a:// log store (default $DELTAWHEEL_ZK)")
    p.add_argument("--s3-endpoint", default=None,
                   help="the object store's URL, with --s3-access-key and --s3-secret-key "
                        "(default $DELTAWHEEL_S3_ENDPOINT and its keys)")
    p.add_argument("--s3-access-key", default="")
    p.add_argument("--s3-secret-key", default="")
    p.add_argument("--driver-python", default=None,
                   help="the driver's Python (client mode: default this one; cluster mode: the cluster's)")
    p.add_argument("--job", default=None, help="cluster mode: the job's .py file (carried by the launcher)")
    p.add_argument("--bundle", default=None,
                   help="cluster mode: folder to copy the jars, archive and launcher into, for the hosts")
    p.add_argument("--base-url", default=None, help="cluster mode: the URL that serves --bundle")
    p.add_argument("--words", action="store_true", help="one word per line (for scripts) instead of shell lines")
    p.set_defaults(func=_submit_args)
    q = subparsers.add_parser("pack-env", help="pack a virtual environment with deltawheel for spark-submit "
                                               "--archives (venv-pack)")
    q.add_argument("output", help="the archive to write, e.g. env.tar.gz")
    q.add_argument("--python", default=None,
                   help="the interpreter to make it from, at this path on the hosts (default: this base)")
    q.add_argument("--wheel", default=None, help="a built deltawheel wheel (default: built from this source tree)")
    q.add_argument("--with", dest="extra", action="append", default=[], help="another requirement (repeatable)")
    q.add_argument("--keep-pyspark", action="store_true", help="ship pyspark too (default: the cluster's)")
    q.set_defaults(func=_pack_env)


def _submit_args(args: argparse.Namespace) -> int:
    from deltawheel.executor.drivers.deploy import submit_args
    from deltawheel.statestore.objectstore.client import S3Endpoint
    from deltawheel.statestore.objectstore.s3a import endpoint_from_env

    endpoint = (S3Endpoint(url=args.s3_endpoint, access_key=args.s3_access_key, secret_key=args.s3_secret_key)
                if args.s3_endpoint else endpoint_from_env())
    sa = submit_args(object_store=args.object_store, archive=args.archive, deploy_mode=args.deploy_mode,
                     endpoint=endpoint, zk=args.zk or os.environ.get("DELTAWHEEL_ZK") or None,
                     driver_python=args.driver_python, job=Path(args.job).resolve() if args.job else None,
                     bundle=Path(args.bundle).resolve() if args.bundle else None, base_url=args.base_url)
    print("\n".join(sa.argv()) if args.words else sa.lines())
    return 0


def _pack_env(args: argparse.Namespace) -> int:
    from deltawheel.executor.drivers.deploy import pack_environment

    out = pack_environment(Path(args.output).resolve(), python=args.python,
                           wheel=Path(args.wheel).resolve() if args.wheel else None, extra=tuple(args.extra),
                           keep_pyspark=args.keep_pyspark)
    print(out)
    return 0


def _setup(args: argparse.Namespace) -> int:
    from deltawheel.statestore.exceptions import JavaMissingError
    from deltawheel.statestore.jars import default_jars_dir
    from deltawheel.statestore.process import find_java
    from deltawheel.statestore.session.sparkenv import setup_jars

    find_java(JavaMissingError)
    jars = setup_jars(object_store=args.object_store)
    print(f"deltawheel: {len(jars)} jars ready (Delta Lake and the log stores in {default_jars_dir()})",
          file=sys.stderr)
    if args.kafka:
        from deltawheel.statestore.session import connectors

        kafka = connectors.ensure_kafka_jars()
        print(f"deltawheel: {len(kafka)} Kafka connector jars ready", file=sys.stderr)
    from deltawheel.statestore.session.cds import ensure_archive

    ensure_archive()  # the driver JVM's classes, recorded once (statestore/session/cds.py)
    if args.toxiproxy:
        from deltawheel.servers.toxiproxy import ensure_toxiproxy

        print(f"deltawheel: Toxiproxy ready ({ensure_toxiproxy()})", file=sys.stderr)
    return 0
