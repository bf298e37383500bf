"""``deltawheel setup``: fetch and build the jars into the per-user cache now, not on first use."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``setup`` subcommand to ``sub``."""
    p = sub.add_parser("setup", help="fetch the Delta jars and compile the log store into the per-user cache "
                                     "(~/.cache/deltawheel/jars, or $DELTAWHEEL_JARS_DIR)")
    p.add_argument("--object-store", action="store_true",
                   help="also the S3A and S3Proxy jars and the object-store log store (s3a:// stores)")
    p.add_argument("--kafka", action="store_true",
                   help="also Spark's Kafka connector (KafkaInjector; ~/.cache/deltawheel/kafka-jars)")
    p.add_argument("--toxiproxy", action="store_true",
                   help="also build Toxiproxy from its Go module into ~/.cache/deltawheel/bin (bench commits' "
                        "network latency; needs Go)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from deltawheel.statestore.jars import default_jars_dir
    from deltawheel.statestore.session.sparkenv import require_java, setup_jars

    require_java()
    jars = setup_jars(object_store=args.object_store)
    print(f"deltawheel: {len(jars)} jars ready (Delta Lake and the log stores in {default_jars_dir()})",
          file=sys.stderr)
    if args.kafka:
        from deltawheel.statestore.session import connectors

        kafka = connectors.ensure_kafka_jars()
        print(f"deltawheel: {len(kafka)} Kafka connector jars ready", file=sys.stderr)
    if args.toxiproxy:
        from deltawheel.servers.toxiproxy import ensure_toxiproxy

        print(f"deltawheel: Toxiproxy ready ({ensure_toxiproxy()})", file=sys.stderr)
    return 0
