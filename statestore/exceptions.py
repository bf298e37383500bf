"""Errors raised by deltawheel: one root, :class:`DeltaWheelError`.

Errors that the same call may get past later derive from :class:`RetryableError`, the rest from
:class:`FatalError`. Messages say what happened and what to do about it."""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "EXIT_CODES", "exit_code", "chain", "DeltaWheelError", "RetryableError", "FatalError", "LeaseError",
    "LeaseLostError", "LeaseHeldError", "SessionLostError", "SparkGoneError", "LeaseSuspendedError", "NotOwnerError", "StoreMismatchError",
    "StoreInUseError", "StoreDamagedError", "UnknownComputationError", "KeyNeverSeenError",
    "VersionNotFoundError", "CoordinatorStateLostError", "StaleSequencerError", "CommitConflictError",
    "CodecError", "BadRecordError", "StateTooLargeError", "NotAStoreError", "SchemaTooNewError",
    "MigrationError", "ZooKeeperServerError", "ClusterError", "HostsUnavailableError", "UnknownHostError",
    "KafkaServerError", "ConfigError", "InputGoneError", "ReplayUnavailableError",
    "ReplayTargetError", "ReplayBehindError", "ReplayCodeError", "RepairStatementError", "JarFetchError",
    "SessionConfigError", "JavaMissingError", "SparkConnectSessionError", "ObjectStoreError",
    "ObjectStoreUnreachableError", "BucketMissingError", "ObjectStoreAuthError", "ObjectStoreServerError",
    "StaleFilesError", "StaleViewError", "ReadOnlySqlError", "DiskFullError", "disk_full",
]


# Exit status of ``deltawheel`` per error class (a subclass inherits); --help and docs/operations.md list it
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "done"),
    (1, "done, found nothing or something is not healthy (inspect: no such key; history: a key never seen "
        "(KeyNeverSeenError); zk/cluster status: not running)"),
    (2, "usage: bad arguments, invalid SQL or a statement that would write (ReadOnlySqlError)"),
    (3, "configuration or store content: ConfigError, NotAStoreError, SchemaTooNewError, MigrationError, "
        "StoreDamagedError, InputGoneError, InputSchemaError (an input file's column of another type), InputFileError "
        "(an input file that cannot be read), CodecError, BadRecordError"),
    (4, "coordination: LeaseError (held, lost, suspended, not owner), StaleSequencerError, "
        "CoordinatorStateLostError, ZooKeeperServerError"),
    (5, "object store: ObjectStoreError (bucket missing, credentials refused), ObjectStoreUnreachableError, "
        "ObjectStoreServerError"),
    (6, "StoreMismatchError: the ZooKeeper state belongs to another store"),
    (7, "UserCodeError: the computation's code raised"),
    (8, "environment: JarFetchError (Delta jars), JavaMissingError, ClusterError (local Spark cluster), "
        "KafkaServerError (local Kafka broker)"),
    (9, "retry: a conflict with a concurrent writer (CommitConflictError, StaleFilesError, StaleViewError, "
        "BatchFailedError), a write that found the disk full (DiskFullError); running the command again may "
        "succeed"),
    (10, "another deltawheel error"),
    (130, "interrupted (Ctrl-C)"),
    (141, "the output's reader went away (`deltawheel status | head`): stopped quietly, as on SIGPIPE"),
)


def exit_code(exc: BaseException) -> int:
    """The exit status of the ``deltawheel`` command for ``exc`` (:data:`EXIT_CODES`).

    >>> exit_code(StoreMismatchError("x")), exit_code(LeaseHeldError("x")), exit_code(ValueError())
    (6, 4, 10)
    """
    return int(getattr(exc, "exit_code", 10))


class DeltaWheelError(Exception):
    """Root of every error deltawheel raises on purpose; ``class X(Base, exit_code=N)`` sets an exit code."""

    exit_code: ClassVar[int] = 10

    def __init_subclass__(cls, *, exit_code: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code


class RetryableError(DeltaWheelError, exit_code=9):
    """The operation may succeed if retried (after re-acquiring what was lost)."""


class SparkGoneError(RetryableError):
    """The driver's JVM stopped answering, or its SparkContext stopped: nothing in flight counts; run again."""


class DiskFullError(RetryableError):
    """A write failed for lack of space (a full disk, a quota): nothing it wrote counts; free some, rerun."""


def chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the errors it was raised from (``__cause__``, else ``__context__``), each once."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and all(cur is not e for e in out):
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` or an error it was raised from is a full disk: an ``OSError`` of ``ENOSPC``
    or ``EDQUOT``, or a Java error (through Py4J) whose message says ``No space left on device``."""
    import errno

    return any((isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT))
               or "No space left on device" in str(e) for e in chain(exc))


class FatalError(DeltaWheelError):
    """Retrying the same call will fail again; input or configuration must change."""


class LeaseError(RetryableError, exit_code=4):
    """Base for problems with key-interval leases."""


class LeaseHeldError(LeaseError):
    """Another job instance holds the lease on an interval."""


class LeaseLostError(LeaseError):
    """A lease this instance held is gone (session expired, lease broken or taken over)."""


class SessionLostError(LeaseLostError):
    """This process's ZooKeeper session expired, and every lease it held went with it; a new session of
    the same process may take them again (a live stage does: docs/continuous.md)."""


class LeaseSuspendedError(LeaseError):
    """The ZooKeeper connection is suspended; lease validity is unknown until it reconnects."""


class NotOwnerError(LeaseError):
    """A write names a key interval this instance holds no lease (sequencer) for."""


class StaleSequencerError(RetryableError, exit_code=4):
    """A commit carried a sequencer a newer owner fenced out; nothing landed. Re-acquire before writing."""


class CommitConflictError(RetryableError):
    """Delta reported a concurrent commit on the same partitions; nothing landed."""


class ZooKeeperServerError(FatalError, exit_code=4):
    """The embedded ZooKeeper server could not be started, reached or stopped."""


class ClusterError(FatalError, exit_code=8):
    """The local Spark standalone cluster (``deltawheel cluster``) could not be started, reached or stopped."""


class HostsUnavailableError(ClusterError):
    """The test bed of separate hosts cannot be made here (no network or mount namespaces)."""


class UnknownHostError(ClusterError):
    """A command named a host the test bed of separate hosts does not have."""


class KafkaServerError(FatalError, exit_code=8):
    """The local Kafka broker (``deltawheel/servers/kafka.py``) could not be started or reached."""


class CodecError(FatalError, exit_code=3):
    """A value could not be encoded or decoded with its declared codec."""


class BadRecordError(FatalError, exit_code=3):
    """Input that can never be processed: empty or non-string key, bad timestamp, ..."""


class StateTooLargeError(BadRecordError):
    """A key's encoded state exceeds the configured size limit."""


class NotAStoreError(FatalError, exit_code=3):
    """The given path is not a deltawheel store (no metadata table)."""


class StoreMismatchError(FatalError, exit_code=6):
    """A pipeline's ZooKeeper state (leases, sequencers, watermarks) belongs to another store."""


class StoreDamagedError(FatalError, exit_code=3):
    """A table's Delta log is damaged: a commit is missing, truncated or corrupt (docs/store-damage.md)."""


class CoordinatorStateLostError(FatalError, exit_code=4):
    """ZooKeeper lost a pipeline's state, so two writers could share a fence: run ``deltawheel reseed``."""


class SchemaTooNewError(FatalError, exit_code=3):
    """The store was migrated by a newer deltawheel than this one."""


class MigrationError(FatalError, exit_code=3):
    """A schema migration failed or the recorded migrations are inconsistent."""


class StoreInUseError(MigrationError):
    """A migration was asked for while a pipeline of the store runs (holds leases); stop it first."""


class ConfigError(FatalError, exit_code=3):
    """Configuration is missing or invalid."""


class InputGoneError(FatalError, exit_code=3):
    """Input that must be read again is gone (vacuumed, deleted, past Kafka's retention)."""


class ReplayUnavailableError(FatalError, exit_code=3):
    """A rows-table version a replay or diff needs is missing, past retention or without input positions."""


class WritePathSwitchError(ConfigError):
    """A store whose ids the image path keeps in ids files was started on the MERGE path; nothing changed."""


class ReplayTargetError(ConfigError):
    """A replay's ``--into`` is the live store or another's non-empty store, or a promotion's source
    is not a caught-up replay of the computation."""


class ReplayBehindError(ReplayTargetError):
    """A promotion's replay has not run every live commit up to the version it would replace."""


class ReplayCodeError(ConfigError):
    """A replay's ``--code`` does not import, or is not a Computation of the replayed name."""


class RepairStatementError(ConfigError):
    """A repair statement ``repair`` does not accept, names another computation, or writes an unusable row."""


class JarFetchError(FatalError, exit_code=8):
    """The Delta Lake jars could not be found or downloaded."""


class SessionConfigError(ConfigError):
    """A SparkSession given to deltawheel lacks settings it needs; the message names each and the fix."""


class SparkConnectSessionError(SessionConfigError):
    """A Spark Connect session was given; deltawheel needs a classic one (Delta's JVM API in the driver)."""


class JavaMissingError(ConfigError, exit_code=8):
    """No ``java`` executable: Spark (and the embedded ZooKeeper) need a Java 17+ JDK."""


class ObjectStoreError(FatalError, exit_code=5):
    """The object store (S3 through ``s3a://``) refused a request; the message says why."""


class ObjectStoreUnreachableError(RetryableError, exit_code=5):
    """No object store answers at the configured endpoint, or it failed a request with HTTP 5xx."""


class BucketMissingError(ObjectStoreError):
    """A store URI names a bucket that does not exist on the object store."""


class ObjectStoreAuthError(ObjectStoreError):
    """The object store refused the configured credentials (wrong access key or secret)."""


class ObjectStoreServerError(FatalError, exit_code=5):
    """The local S3-compatible server could not be started, reached or stopped."""


class StaleFilesError(RetryableError):
    """Someone else committed to partitions whose files a writer was about to replace."""


class StaleViewError(RetryableError):
    """The writer's view of its partitions is out of date; nothing of the batch was committed: reload
    it and run steps 3-5 again. ``interval``, ``sequencer`` (None: no fence row), ``ours``: a fence found."""

    def __init__(self, message: str, *, interval: int | None = None, sequencer: int | None = None,
                 ours: int | None = None) -> None:
        super().__init__(message)
        self.interval = interval
        self.sequencer = sequencer
        self.ours = ours


class ReadOnlySqlError(FatalError, exit_code=2):
    """A statement given to the read-only SQL tool would change something (a table, a view, a setting)."""


class UnknownComputationError(ConfigError):
    """A read-only tool named a computation the store's rows table never held (history, SQL as of)."""


class KeyNeverSeenError(FatalError, exit_code=1):
    """``deltawheel history`` named a key its computation never held in any version still in the log."""


class VersionNotFoundError(ConfigError):
    """A version or timestamp asked for (``sql --as-of``) is not in a table's log (or was cleaned up)."""
