"""The embedded defaults: a local ZooKeeper started from pyspark's jars when none answers."""

from __future__ import annotations

import sys

from deltawheel.statestore.config import ZkConfig
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.zk.server import EmbeddedZooKeeper, four_letter_word

__all__ = ["ensure_zookeeper"]


def ensure_zookeeper(cfg: ZkConfig, layout: StoreLayout, *, embedded: bool = True) -> EmbeddedZooKeeper | None:
    """Make sure ``cfg.hosts`` answers; start an embedded server for a local single host if allowed.

    Returns the server this call started (the caller stops it), or None when one was running.
    """
    first = cfg.hosts.split(",")[0]
    host, _, port = first.rpartition(":")
    if four_letter_word(host or "127.0.0.1", int(port)) is not None:
        return None
    if not embedded or "," in cfg.hosts or host not in ("127.0.0.1", "localhost") or not layout.is_local:
        return None  # kazoo will report it cannot connect
    server = EmbeddedZooKeeper(layout.zk_data, port=int(port), host="127.0.0.1")
    print(f"deltawheel: starting embedded ZooKeeper on {server.hosts} (data in {layout.zk_data})", file=sys.stderr)
    server.start()
    return server
