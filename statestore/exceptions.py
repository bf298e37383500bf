"""Errors raised by deltawheel.

One root, :class:`DeltaWheelError`. Errors a caller may retry (the same call
can succeed later without anybody changing anything) derive from
:class:`RetryableError`; everything else derives from :class:`FatalError`.
Messages say what happened and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "DeltaWheelError",
    "RetryableError",
    "FatalError",
    "LeaseError",
    "LeaseLostError",
    "LeaseHeldError",
    "LeaseSuspendedError",
    "NotOwnerError",
    "StoreMismatchError",
    "StoreDamagedError",
    "CoordinatorStateLostError",
    "StaleSequencerError",
    "CommitConflictError",
    "CodecError",
    "BadRecordError",
    "StateTooLargeError",
    "NotAStoreError",
    "SchemaTooNewError",
    "MigrationError",
    "ZooKeeperServerError",
    "ConfigError",
    "InputGoneError",
    "JarFetchError",
    "SessionConfigError",
    "JavaMissingError",
    "ObjectStoreError",
    "ObjectStoreUnreachableError",
    "BucketMissingError",
    "ObjectStoreAuthError",
    "ObjectStoreServerError",
    "StaleFilesError",
    "StaleViewError",
    "ReadOnlySqlError",
]


class DeltaWheelError(Exception):
    """Root of every error deltawheel raises on purpose."""


class RetryableError(DeltaWheelError):
    """The operation may succeed if retried (after re-acquiring what was lost)."""


class FatalError(DeltaWheelError):
    """Retrying the same call will fail again; input or configuration must change."""


# --- coordination -----------------------------------------------------------


class LeaseError(RetryableError):
    """Base for problems with key-interval leases."""


class LeaseHeldError(LeaseError):
    """Another job instance holds the lease on an interval."""


class LeaseLostError(LeaseError):
    """A lease this instance held is gone (session expired, lease broken or taken over)."""


class LeaseSuspendedError(LeaseError):
    """The ZooKeeper connection is suspended; lease validity is unknown until it reconnects."""


class NotOwnerError(LeaseError):
    """A write names a key interval this instance holds no lease (sequencer) for."""


class StaleSequencerError(RetryableError):
    """A commit carried a sequencer that is no longer current: a newer owner fenced it out.

    Nothing of the failed commit landed. The instance must drop its leases and
    re-acquire them (getting new sequencers) before it writes again.
    """


class CommitConflictError(RetryableError):
    """Delta reported a concurrent commit on the same partitions; nothing landed."""


class ZooKeeperServerError(FatalError):
    """The embedded ZooKeeper server could not be started, reached or stopped."""


# --- input and storage ------------------------------------------------------


class CodecError(FatalError):
    """A value could not be encoded or decoded with its declared codec."""


class BadRecordError(FatalError):
    """Input that can never be processed: empty or non-string key, bad timestamp, ..."""


class StateTooLargeError(BadRecordError):
    """A key's encoded state exceeds the configured size limit."""


class NotAStoreError(FatalError):
    """The given path is not a deltawheel store (no metadata table)."""


class StoreMismatchError(FatalError):
    """A pipeline's ZooKeeper state (leases, sequencers, watermarks) belongs to another store."""


class StoreDamagedError(FatalError):
    """A table's Delta log is damaged: a commit is missing, truncated or corrupt (docs/store-damage.md)."""


class CoordinatorStateLostError(FatalError):
    """ZooKeeper has lost a pipeline's state: the store holds sequencers it never granted.

    Seen on acquisition when a fence row carries a sequencer at or above what
    ZooKeeper would grant next (its data was wiped or restored from an older
    copy). Writing on would reuse sequencers and let two writers share one fence.
    Recover with ``deltawheel reseed --store DIR --pipeline P --apply``
    (docs/coordinator-recovery.md), then start the pipeline again.
    """


class SchemaTooNewError(FatalError):
    """The store was migrated by a newer deltawheel than this one."""


class MigrationError(FatalError):
    """A schema migration failed or the recorded migrations are inconsistent."""


class ConfigError(FatalError):
    """Configuration is missing or invalid."""


class InputGoneError(FatalError):
    """Input a moved interval's new owner must catch up on is gone (e.g. a stream table's data
    file removed by VACUUM): the move cannot be made exact."""


class JarFetchError(FatalError):
    """The Delta Lake jars could not be found or downloaded."""


class SessionConfigError(ConfigError):
    """A SparkSession given to deltawheel lacks settings it needs (Delta, the log store, s3a);
    the message names each missing setting and how to get it."""


class JavaMissingError(ConfigError):
    """No ``java`` executable: Spark (and the embedded ZooKeeper) need a Java 17+ JDK."""


# --- object storage ---------------------------------------------------------


class ObjectStoreError(FatalError):
    """The object store (S3 through ``s3a://``) refused a request; the message says why."""


class ObjectStoreUnreachableError(RetryableError):
    """No object store answers at the configured endpoint (down, wrong host or port)."""


class BucketMissingError(ObjectStoreError):
    """A store URI names a bucket that does not exist on the object store."""


class ObjectStoreAuthError(ObjectStoreError):
    """The object store refused the configured credentials (wrong access key or secret)."""


class ObjectStoreServerError(FatalError):
    """The local S3-compatible server could not be started, reached or stopped."""


class StaleFilesError(RetryableError):
    """Someone else committed to partitions whose files a writer was about to replace."""


class StaleViewError(RetryableError):
    """The writer's view of its partitions is out of date (someone else committed to them).

    Raised by the tasks' loading (step 3) or by a write path's commit (step 5); nothing of
    the batch was committed. Reload the view (which fails typed if the cause was a takeover)
    and run the batch's steps 3-5 again."""


class ReadOnlySqlError(FatalError):
    """A statement given to the read-only SQL tool would change something (a table, a view, a setting)."""
