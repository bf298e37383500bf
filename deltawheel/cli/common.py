"""Arguments and helpers shared by the CLI subcommands (parsed once, here, at the edge)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from typing import Any, Callable, Iterator

from deltawheel.executor.session import build_spark
from deltawheel.statestore.config import DEFAULT_ZK_PORT, ZkConfig
from deltawheel.statestore.exceptions import ConfigError, NotAStoreError
from deltawheel.statestore.layout import StoreLayout
from deltawheel.statestore.session.sparkenv import SparkSettings
from deltawheel.statestore.zk.refusal import DEFAULT_MAX_PAUSE_S

__all__ = ["add_handover_args", "handover_wait_s", "add_store_arg", "add_live_args", "add_zk_args", "add_zk_spark_args",
           "add_run_args", "add_log_store_zk_args", "add_spark_args", "add_pipeline_arg",
           "add_json_arg", "add_allow_pickle_arg", "add_key_args", "zk_config_from", "spark_from", "layout_from",
           "existing_layout_from", "zookeeper_for", "add_optional_store", "zk_client", "store_zookeeper", "int_list",
           "computation_code", "timed_say", "engine_from", "say", "print_json", "plural", "say_running",
           "Progress", "running_store_zk"]


def add_store_arg(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Add ``--store`` (the store's folder or URI) to ``p``."""
    p.add_argument("--store", required=required, help="store folder or URI (holds the Delta tables)")


def add_live_args(p: argparse.ArgumentParser, computation: str, *, store: str = "the live store") -> None:
    """Add ``--store``, ``--pipeline`` and ``--computation`` (its help: ``computation``) of a live pipeline."""
    p.add_argument("--store", required=True, help=store)
    add_pipeline_arg(p)
    p.add_argument("--computation", required=True, help=computation)


def add_pipeline_arg(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Add ``--pipeline``: the pipeline's name, or (not ``required``) a filter to one pipeline."""
    p.add_argument("--pipeline", required=required, help="the pipeline's name" if required else "only this pipeline")


def add_json_arg(p: argparse.ArgumentParser) -> None:
    """Add ``--json``."""
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def add_allow_pickle_arg(p: argparse.ArgumentParser) -> None:
    """Add ``--allow-pickle``."""
    p.add_argument("--allow-pickle", action="store_true", help="decode pickled values (runs code!)")


def add_key_args(p: argparse.ArgumentParser) -> None:
    """Add ``--computation``, ``--key`` and ``--allow-pickle``."""
    p.add_argument("--computation", required=True)
    p.add_argument("--key", required=True)
    add_allow_pickle_arg(p)


def add_zk_args(p: argparse.ArgumentParser, *, timeout: bool = False) -> None:
    """Add the ZooKeeper options to ``p``; ``timeout``: also ``--zk-timeout``."""
    g = p.add_argument_group("ZooKeeper")
    g.add_argument("--zk", default=os.environ.get("DELTAWHEEL_ZK"),
                   help="host:port[,host:port] (env DELTAWHEEL_ZK; default: a local --store's own embedded "
                        f"server, see 'deltawheel zk status --store DIR'; else 127.0.0.1:{DEFAULT_ZK_PORT})")
    g.add_argument("--zk-chroot", default=os.environ.get("DELTAWHEEL_ZK_CHROOT", "/deltawheel"),
                   help="znode path all of deltawheel's znodes live below")
    g.add_argument("--zk-digest", default=os.environ.get("DELTAWHEEL_ZK_DIGEST"),
                   help="user:password for digest ACLs on lease znodes (env DELTAWHEEL_ZK_DIGEST)")
    g.add_argument("--zk-session-timeout", type=float,
                   default=float(os.environ.get("DELTAWHEEL_ZK_SESSION_TIMEOUT", ZkConfig.session_timeout_s)),
                   help="seconds (env DELTAWHEEL_ZK_SESSION_TIMEOUT; default "
                        f"{ZkConfig.session_timeout_s:g}): a shorter outage pauses commits, a longer one "
                        "stops the run; leases of a killed run stay held this long")
    if timeout:
        p.add_argument("--zk-timeout", type=float, default=10.0, help="seconds to wait for ZooKeeper")


def add_zk_spark_args(p: argparse.ArgumentParser, *, timeout: bool = False) -> None:
    """Add the ZooKeeper options (:func:`add_zk_args`), then Spark's."""
    add_zk_args(p, timeout=timeout)
    add_spark_args(p)


def add_run_args(p: argparse.ArgumentParser) -> None:
    """Add the options of a pipeline run: ``--gc-every``, ZooKeeper's, ``--max-pause``, Spark's."""
    p.add_argument("--gc-every", default=None, type=_gc_every, metavar="N|DURATION",
                   help="run gc's Delta passes from the running pipeline every N batches (e.g. 50) or every "
                        "DURATION (30s, 10m, 1h), beside the stages (default: never; docs/operations.md, gc)")
    add_zk_args(p)
    p.add_argument("--max-pause", type=_non_negative, default=DEFAULT_MAX_PAUSE_S, metavar="SECONDS",
                   help="batches pause while ZooKeeper does not serve; stop the run after this many seconds "
                        f"of pause (default {DEFAULT_MAX_PAUSE_S:g}; 'inf': until the session is reported "
                        "expired; docs/coordinator-recovery.md)")
    add_spark_args(p)


def add_handover_args(p: argparse.ArgumentParser) -> None:
    """Add ``--wait S`` / ``--no-wait``: how a tool gets the intervals a running pipeline holds."""
    wait = p.add_mutually_exclusive_group()
    wait.add_argument("--wait", type=float, default=60.0, metavar="S",
                      help="seconds to wait for the running pipeline to hand the intervals over at its next batch "
                           "boundary (default 60)")
    wait.add_argument("--no-wait", action="store_true", help="refuse at once if a running owner holds an interval")


def handover_wait_s(args: argparse.Namespace) -> float:
    """The seconds :func:`add_handover_args`'s options ask to wait (0 with ``--no-wait``)."""
    return 0.0 if args.no_wait else float(args.wait)


def _gc_every(text: str) -> str:
    from deltawheel.gc.background import parse_every

    try:
        parse_every(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds (a number >= 0), got {text!r}")
    return value


def add_log_store_zk_args(p: argparse.ArgumentParser, *, digest: bool = False) -> None:
    """Add ``--zk`` / ``--zk-chroot`` for a command that commits to an ``s3a://`` store but holds no
    lease; ``digest``: also ``--zk-digest`` and ``--zk-timeout``."""
    g = p.add_argument_group("ZooKeeper (object-store stores only)")
    g.add_argument("--zk", default=os.environ.get("DELTAWHEEL_ZK"),
                   help="ZooKeeper connection string host:port[,host:port] that arbitrates commits to an "
                        "s3a:// store: the one its pipelines use (env DELTAWHEEL_ZK)")
    g.add_argument("--zk-chroot", default=os.environ.get("DELTAWHEEL_ZK_CHROOT", "/deltawheel"),
                   help="the pipelines' ZooKeeper chroot (env DELTAWHEEL_ZK_CHROOT; default /deltawheel)")
    if digest:
        p.add_argument("--zk-digest", default=os.environ.get("DELTAWHEEL_ZK_DIGEST"),
                       help="user:password of the pipelines' ZooKeeper ACLs (env DELTAWHEEL_ZK_DIGEST)")
        p.add_argument("--zk-timeout", type=float, default=10.0, help="seconds to wait for ZooKeeper")


def add_spark_args(p: argparse.ArgumentParser) -> None:
    """Add the Spark options (master, driver memory) to ``p``."""
    g = p.add_argument_group("Spark")
    g.add_argument("--master", default=os.environ.get("DELTAWHEEL_SPARK_MASTER", "local[2]"),
                   help="Spark master (env DELTAWHEEL_SPARK_MASTER; default local[2])")
    g.add_argument("--driver-memory", default="2g")


def running_store_zk(layout: StoreLayout) -> str | None:
    """The connection string of a local store's own ZooKeeper when it runs, else None."""
    from ..servers.embedded import StoreZooKeeper

    running = StoreZooKeeper(layout).running() if layout.is_local else None
    return None if running is None else running.hosts


def zk_config_from(args: argparse.Namespace) -> ZkConfig:
    """The ZooKeeper settings of ``args`` (no ``--zk``: a local store's running server, else :2181)."""
    hosts = args.zk
    if hosts is None:
        running = running_store_zk(layout_from(args)) if getattr(args, "store", None) else None
        hosts = running or f"127.0.0.1:{DEFAULT_ZK_PORT}"
    return ZkConfig(hosts=hosts, chroot=args.zk_chroot, digest=args.zk_digest,
                    session_timeout_s=getattr(args, "zk_session_timeout", ZkConfig.session_timeout_s))


def zookeeper_for(args: argparse.Namespace, layout: StoreLayout) -> Any:
    """The ZooKeeper of a command on ``layout``, a :class:`~..servers.embedded.ZooKeeperUse` to release."""
    from ..servers.embedded import ensure_zookeeper

    return ensure_zookeeper(zk_config_from(args), layout, own=args.zk is None)


def layout_from(args: argparse.Namespace) -> StoreLayout:
    """The store layout of ``--store`` (a local path made absolute).

    Raises:
        NotAStoreError: ``--store`` names a file, not a folder.
    """
    if "://" in args.store:
        return StoreLayout(args.store)
    path = os.path.abspath(args.store)
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotAStoreError(
            f"--store {args.store} is a file, not a folder: a store is a folder of Delta tables. Pass the "
            "store's folder (the one holding rows/ and _meta/), or a path that does not exist yet to "
            f"create a store there with 'deltawheel migrate --store DIR --apply'")
    return StoreLayout(path)


def existing_layout_from(args: argparse.Namespace) -> StoreLayout:
    """:func:`layout_from` for a command that only looks at a store: a missing local store is refused.

    Raises:
        NotAStoreError: ``--store`` names a file, or a local folder that does not exist.
    """
    layout = layout_from(args)
    if layout.is_local and not os.path.isdir(layout.root):
        raise NotAStoreError(f"--store {args.store} does not exist ({layout.root}): pass the folder of a "
                             "pipeline's store (the one holding rows/ and _meta/)")
    return layout


def spark_from(args: argparse.Namespace, *, announce: bool = False, **kw: Any) -> Any:
    """A Spark session with Delta built from ``args`` (``kw``: more :class:`SparkSettings` fields);
    ``announce``: say on stderr when a JVM starts and is ready.

    Raises:
        ConfigError: the store is on an object store and no ZooKeeper is given."""
    store = getattr(args, "store", None)
    remote = store is not None and not layout_from(args).is_local
    if remote and getattr(args, "zk", None) is None and hasattr(args, "zk_digest"):
        args.zk = zk_config_from(args).hosts  # a lease-taking command: its default ZooKeeper arbitrates too
    if remote and hasattr(args, "zk") and not args.zk:
        raise ConfigError(f"store {store} is on an object store: commits to it are arbitrated by ZooKeeper; "
                          "pass --zk host:port[,host:port] (the one its pipelines use) or set DELTAWHEEL_ZK")
    from .logs import spark_log_level

    kw.setdefault("log_level", spark_log_level())
    master = getattr(args, "master", "local[2]")
    from pyspark.sql import SparkSession

    fresh = announce and SparkSession.getActiveSession() is None  # building the session starts a JVM
    if fresh:
        print(f"deltawheel: starting Spark ({master}) ...", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    spark = build_spark(SparkSettings(master=master, driver_memory=getattr(args, "driver_memory", "2g"), **kw))
    if fresh:
        print(f"deltawheel: Spark ready in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    if remote and getattr(args, "zk", None):
        from deltawheel.statestore.objectstore.logstore import configure_log_store

        configure_log_store(spark, args.zk, chroot=getattr(args, "zk_chroot", "/deltawheel"),
                            digest=getattr(args, "zk_digest", None))
    return spark


@contextlib.contextmanager
def store_zookeeper(args: argparse.Namespace) -> Iterator[tuple[StoreLayout, ZkConfig, Any]]:
    """(layout, ZooKeeper config, connected kazoo client) for a command on ``--store``, released after."""
    layout = layout_from(args)
    with zookeeper_for(args, layout) as use, connected(use.config, args.zk_timeout) as client:
        yield layout, use.config, client


def add_optional_store(p: argparse.ArgumentParser) -> None:
    """Add an optional ``--store`` and the ZooKeeper options (with ``--zk-timeout``)."""
    add_store_arg(p, required=False)
    p.set_defaults(store=None)
    p.description = ((p.description + " ") if p.description else "") + (
        "With --store DIR and no --zk: the store's own embedded ZooKeeper (the one its commands use, "
        f"started for this command when none runs); with neither: 127.0.0.1:{DEFAULT_ZK_PORT}.")
    add_zk_args(p, timeout=True)


@contextlib.contextmanager
def zk_client(args: argparse.Namespace) -> Iterator[tuple[ZkConfig, Any]]:
    """(config, connected kazoo client) for a command with :func:`add_optional_store`."""
    if getattr(args, "store", None) is not None:
        with store_zookeeper(args) as (_, cfg, client):
            yield cfg, client
        return
    cfg = zk_config_from(args)
    with connected(cfg, args.zk_timeout) as client:
        yield cfg, client


@contextlib.contextmanager
def connected(cfg: ZkConfig, timeout_s: float) -> Iterator[Any]:
    """A kazoo client connected to ``cfg`` (waiting ``timeout_s`` at most), stopped and closed after."""
    from deltawheel.statestore.zk.client import connect

    logging.getLogger("kazoo.client").setLevel(logging.ERROR)  # no per-retry warnings on a CLI
    client = connect(cfg, timeout_s=timeout_s)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def int_list(text: str | None, what: str) -> list[int] | None:
    """``--intervals I,J`` as integers (None: not given).

    Raises:
        ConfigError: not a comma-separated list of integers.
    """
    if text is None:
        return None
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise ConfigError(f"{what} {text!r}: give interval numbers separated by commas (e.g. 0,2)") from exc


def computation_code(args: argparse.Namespace, spec: str | None, missing: str, *, source: Any = None,
                     strict: bool = False) -> Any:
    """The code of ``args.computation``: MODULE:CLASS ``spec``, else the ``source`` pipeline's, else the
    one a package registered for ``args.pipeline`` (the demo's).

    Raises:
        ReplayCodeError: none of them (``missing``), or ``strict`` and ``source`` has no such computation.
    """
    from deltawheel.executor.drivers.replay import load_code, registered_computation
    from deltawheel.statestore.exceptions import ReplayCodeError

    if spec:
        return load_code(spec, args.computation)
    for c in source.computations if source is not None else ():
        if c.name == args.computation:
            return c
    if strict and source is not None:
        raise ReplayCodeError(f"--source pipeline {source.name!r} has no computation {args.computation!r} (it has "
                              f"{', '.join(c.name for c in source.computations)}); check --computation")
    registered = registered_computation(args.pipeline, args.computation)
    if registered is None:
        raise ReplayCodeError(missing)
    return registered


def timed_say(started: float) -> Callable[[str], None]:
    """Print a line with the seconds since ``started`` (``time.monotonic()``) before it."""
    return lambda line: print(f"[{time.monotonic() - started:6.1f}s] {line}", flush=True)


@contextlib.contextmanager
def engine_from(args: argparse.Namespace, layout: StoreLayout, pipeline: str) -> Iterator[tuple[Any, Any]]:
    """(Spark session, connected engine) of a pipeline run on ``layout``: its ZooKeeper released after."""
    import deltawheel

    with zookeeper_for(args, layout) as zookeeper:  # the store's own server unless --zk is given
        cfg = zookeeper.config
        spark = spark_from(args, announce=True)
        with deltawheel.connect(spark, store=layout.root, zk=cfg.hosts, zk_chroot=cfg.chroot, zk_digest=cfg.digest,
                                pipeline=pipeline, wait_s=args.wait, max_pause_s=args.max_pause,
                                instance=args.instance, zk_session_timeout_s=args.zk_session_timeout) as engine:
            yield spark, engine


def say(line: str) -> None:
    """Print a progress line at once (a driver's ``progress``)."""
    print(line, flush=True)


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON."""
    print(json.dumps(value, indent=2, default=str))


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 process``, ``2 processes`` (``many``: the plural, default ``word + "s"``)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def say_running(running: bool, pid: int | None, port: object, data_dir: str) -> int:
    """Print whether a server runs, for the ``status`` actions: 0 if it does, else 1."""
    print(f"running: pid {pid}, port {port}, data {data_dir}" if running else f"not running (port {port}, data {data_dir})")
    return 0 if running else 1


class Progress:
    """Progress lines of a long command on stderr: ``step(what)`` prints
    ``deltawheel CMD: [i/N] what (12.3 s, about 40 s left)``, timed from the first step."""

    def __init__(self, command: str, total: int | None = None) -> None:
        self.command = command
        self.total = total
        self.done = 0
        self._started: float | None = None

    def step(self, what: str, total: int | None = None) -> None:
        """Report that the next step (``what``) starts; ``total``: the number of steps, if not given yet."""
        self._started = self._started or time.monotonic()
        self.total = self.total if total is None else total
        elapsed = time.monotonic() - self._started
        count = f"[{self.done + 1}/{self.total}] " if self.total else f"[{self.done + 1}] "
        eta = ""
        if self.total and self.done:
            eta = f", about {elapsed / self.done * (self.total - self.done):.0f} s left"
        print(f"deltawheel {self.command}: {count}{what} ({elapsed:.1f} s{eta})", file=sys.stderr, flush=True)
        self.done += 1
