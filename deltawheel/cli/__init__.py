"""``deltawheel`` command line: one subcommand module per tool, each with ``register(subparsers)``
adding its subcommands with a ``func`` that takes the parsed args and returns an exit code."""

from __future__ import annotations

import argparse
import importlib
import os
import select
import sys
from typing import Sequence

from deltawheel.statestore.exceptions import (
    EXIT_CODES,
    DeltaWheelError,
    DiskFullError,
    LeaseLostError,
    LeaseSuspendedError,
    SparkGoneError,
    chain,
    disk_full,
    exit_code,
)

__all__ = ["main", "build_parser"]

# the exit status of a command whose output pipe closed (``deltawheel zk status | head``): SIGPIPE's
CLOSED_PIPE_STATUS = 141  # EXIT_CODES


def build_parser() -> argparse.ArgumentParser:
    """The ``deltawheel`` argument parser: the subcommands of every module of this package."""
    parser = argparse.ArgumentParser(
        prog="deltawheel",
        description="MillWheel-style exactly-once state engine on Spark, Delta Lake and ZooKeeper.",
        epilog="exit codes (docs/operations.md, \"The command line\"):\n"
        + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show Spark's and ZooKeeper's log lines (off by default); may also follow the command")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in ("demo", "run", "status", "servers", "migrate", "sql", "history", "leases",
                 "recover", "replay", "promote", "repair", "reseed", "gc", "bench", "scenario", "chaos",
                 "deploy"):  # --help order
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: the process's); the exit status: a DeltaWheelError's code
    (:data:`EXIT_CODES`), 2 for usage errors, 130 for Ctrl-C, 141 for a closed output pipe."""
    try:
        rc = _main(argv)
        sys.stdout.flush()  # what is still buffered: a closed pipe shows here, not at the exit
        return rc
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe or socket (ZooKeeper, Spark): a real failure
        # what is still buffered goes nowhere: the flush at the exit must not report the pipe again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return CLOSED_PIPE_STATUS


def _stdout_closed() -> bool:  # poll reports POLLERR for a pipe whose reading end is closed
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or no file descriptor behind stdout
        return False


def _main(argv: Sequence[str] | None) -> int:
    from deltawheel.statestore.objectstore.logstore import log_store_restored

    from . import logs

    argv = list(sys.argv[1:] if argv is None else argv)
    # the global flag is taken wherever it stands (before or after the command)
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.verbose = args.verbose or verbose
    logs.configure(args.verbose)
    try:
        with log_store_restored():  # main() called inside a process that goes on
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"deltawheel {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a full disk or a lost ZooKeeper connection anywhere is typed too
        err = exc if isinstance(exc, DeltaWheelError) else _typed(exc, getattr(args, "store", None))
        if err is None:
            raise
        print(f"deltawheel {args.command}: {type(err).__name__}: {err}", file=sys.stderr)
        return exit_code(err)


def _typed(exc: Exception, store: object = None) -> DeltaWheelError | None:
    """The typed error of a full disk (exit 9), a lost ZooKeeper session or connection (exit 4) or a failing
    ``s3a://`` ``store`` (exit 5) under any call, Python's or the JVM's; None: another error."""
    from kazoo.exceptions import ConnectionLoss, SessionExpiredError

    cause = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"
    if disk_full(exc):
        return DiskFullError(f"a write failed, the disk is full ({cause}); free space and run the command again")
    if isinstance(exc, ConnectionLoss):
        return LeaseSuspendedError(f"the connection to ZooKeeper was lost ({cause}); run the command again "
                                   "once ZooKeeper serves")
    if isinstance(exc, SessionExpiredError):  # ConnectionClosedError too: the session is gone for good
        return LeaseLostError(f"the ZooKeeper session expired ({cause}): its leases are gone; run the command "
                              "again (it takes them back)")
    if _spark_gone(exc):
        return SparkGoneError(f"the driver's JVM stopped answering or stopped Spark ({cause}); run the command "
                              "again: it resumes from its checkpoints")
    if isinstance(store, str) and store.startswith("s3a://"):
        from deltawheel.statestore.objectstore.errors import store_failure

        return store_failure(exc, store)
    return None


def _spark_gone(exc: BaseException) -> bool:
    """Whether ``exc`` or an error it came from says the JVM behind py4j is gone or Spark stopped."""
    return any(type(e).__name__ == "Py4JNetworkError" or any(m in str(e) for m in _SPARK_GONE) for e in chain(exc))


_SPARK_GONE = ("No active or default Spark session", "SparkContext was shut down",
               "Cannot call methods on a stopped SparkContext")

