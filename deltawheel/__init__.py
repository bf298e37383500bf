"""deltawheel: MillWheel's exactly-once per-key state engine for Spark, on Delta Lake and ZooKeeper.

The public API, importable from here::

    from deltawheel import Computation, windowed, FixedWindows, AfterWatermark, AccumulationMode

The code lives in sub-packages, one per top-level folder of the repository:

* ``deltawheel.statestore`` — durable state: the rows and stream tables and their write paths
  (``rowtable``, ``writepath``), Delta Lake at the protocol level (``delta``), and coordination
  in ZooKeeper (``zk``: leases, sequencers, the watermark authority);
* ``deltawheel.executor`` — running user code: the ``Computation`` API, the per-batch protocol
  and pipelines (``runtime``), what runs inside Spark tasks (``tasks``), the Dataflow model
  (``windowing``), the command line (``cli``) and the demo (``demo``);
* ``deltawheel.gc``, ``deltawheel.migrations``, ``deltawheel.benchmarks``;
* ``deltawheel.testing`` — helpers for testing your own computations.

Names are loaded on first use, so importing ``deltawheel`` (as every Spark task does when it
imports one of its modules) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> module that defines it (``module:name`` where it is defined under another name)
_EXPORTS: dict[str, str] = {
    # the core API
    "Computation": "deltawheel.executor.computation",
    "Record": "deltawheel.executor.computation",
    "make_record": "deltawheel.executor.computation",
    "LatePolicy": "deltawheel.executor.computation",
    "ErrorPolicy": "deltawheel.executor.computation",
    "RECORD_KEY": "deltawheel.executor.computation",
    "Context": "deltawheel.executor.context",
    "TimeDomain": "deltawheel.statestore.rowtable.rows",
    # windowing
    "windowed": "deltawheel.executor.windowing.windowed",
    "WindowingStrategy": "deltawheel.executor.windowing.windowed",
    "Window": "deltawheel.executor.windowing.windows",
    "WindowFn": "deltawheel.executor.windowing.windows",
    "GlobalWindows": "deltawheel.executor.windowing.windows",
    "FixedWindows": "deltawheel.executor.windowing.windows",
    "SlidingWindows": "deltawheel.executor.windowing.windows",
    "Sessions": "deltawheel.executor.windowing.windows",
    "Trigger": "deltawheel.executor.windowing.triggers",
    "AfterWatermark": "deltawheel.executor.windowing.triggers",
    "AfterCount": "deltawheel.executor.windowing.triggers",
    "AfterProcessingTime": "deltawheel.executor.windowing.triggers",
    "Repeatedly": "deltawheel.executor.windowing.triggers",
    "AfterAny": "deltawheel.executor.windowing.triggers",
    "AfterAll": "deltawheel.executor.windowing.triggers",
    "AfterEach": "deltawheel.executor.windowing.triggers",
    "OrFinally": "deltawheel.executor.windowing.triggers",
    "Always": "deltawheel.executor.windowing.triggers",
    "Never": "deltawheel.executor.windowing.triggers",
    "DefaultTrigger": "deltawheel.executor.windowing.triggers",
    "AccumulationMode": "deltawheel.executor.windowing.panes",
    "Timing": "deltawheel.executor.windowing.panes",
    "Pane": "deltawheel.executor.windowing.panes",
    "PaneInfo": "deltawheel.executor.windowing.panes",
    "CombineFn": "deltawheel.executor.windowing.combiners",
    "Sum": "deltawheel.executor.windowing.combiners",
    "Count": "deltawheel.executor.windowing.combiners",
    "Min": "deltawheel.executor.windowing.combiners",
    "Max": "deltawheel.executor.windowing.combiners",
    "Mean": "deltawheel.executor.windowing.combiners",
    # running it
    "ComputationExecutor": "deltawheel.executor.protocol.executor",
    "BatchReport": "deltawheel.executor.protocol.reports",
    "Pipeline": "deltawheel.executor.drivers.pipeline",
    "PipelineRunner": "deltawheel.executor.drivers.runner",
    "Injector": "deltawheel.executor.sources.injector",
    "ParquetInjector": "deltawheel.executor.sources.parquet",
    "DeltaTableInjector": "deltawheel.executor.sources.delta",
    "MaxSeenMinusBound": "deltawheel.executor.sources.injector",
    "BatchStats": "deltawheel.executor.sources.injector",
    "publish_watermark": "deltawheel.executor.sources.injector",
    "to_stream_schema": "deltawheel.executor.sources.schema",
    "JsonLinesInjector": "deltawheel.executor.sources.jsonl",
    "KafkaInjector": "deltawheel.executor.sources.kafka",
    "PerPartitionWatermark": "deltawheel.executor.sources.kafka",
    "KafkaBroker": "deltawheel.executor.servers.kafka",
    "observe_input": "deltawheel.executor.protocol.metrics",
    # the store and its coordination
    "StoreLayout": "deltawheel.statestore.layout",
    "ZkConfig": "deltawheel.statestore.config",
    "Clock": "deltawheel.statestore.clock",
    "SystemClock": "deltawheel.statestore.clock",
    "ManualClock": "deltawheel.statestore.clock",
    "get_codec": "deltawheel.statestore.codecs",
    "build_spark": "deltawheel.executor.session",
    "SparkSettings": "deltawheel.statestore.session.sparkenv",
    "connect": "deltawheel.executor.drivers.engine",
    "Engine": "deltawheel.executor.drivers.engine",
    "spark_session": "deltawheel.executor.session",
    "connect_zk": "deltawheel.statestore.zk.client:connect",  # the kazoo client of a ZkConfig
    "LeaseManager": "deltawheel.statestore.zk.leases",
    "IntervalOwner": "deltawheel.statestore.ownership.owner",
    "RowStore": "deltawheel.statestore.rowtable.store",
    "WatermarkAuthority": "deltawheel.statestore.zk.watermarks",
    "EmbeddedZooKeeper": "deltawheel.executor.servers.zookeeper",
    # beyond one machine: for local trials and tests (the CLI's `objectstore` and `cluster`)
    "ZooKeeperEnsemble": "deltawheel.executor.servers.ensemble",
    "S3ProxyServer": "deltawheel.executor.servers.s3proxy",
    "LocalCluster": "deltawheel.executor.servers.cluster",
    # errors: one root, retryable kept apart from fatal
    "DeltaWheelError": "deltawheel.statestore.exceptions",
    "RetryableError": "deltawheel.statestore.exceptions",
    "FatalError": "deltawheel.statestore.exceptions",
}
_EXPORTS.update({name: "deltawheel.statestore.exceptions" for name in (
    "LeaseError", "LeaseHeldError", "LeaseLostError", "LeaseSuspendedError", "NotOwnerError",
    "StaleSequencerError", "CommitConflictError", "CodecError", "BadRecordError", "StateTooLargeError",
    "NotAStoreError", "StoreMismatchError", "StoreDamagedError", "CoordinatorStateLostError",
    "SchemaTooNewError", "MigrationError", "ConfigError", "ZooKeeperServerError", "JarFetchError",
    "SessionConfigError", "JavaMissingError",
    "ObjectStoreError", "ObjectStoreUnreachableError", "BucketMissingError", "ObjectStoreAuthError",
    "ObjectStoreServerError")})
_EXPORTS.update({name: "deltawheel.executor.exceptions" for name in (
    "UserCodeError", "BatchFailedError", "WindowingError")})

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'deltawheel' has no attribute {name!r}")
    module, _, defined = module.partition(":")
    value = getattr(importlib.import_module(module), defined or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # type checkers and IDEs see the same names, imported eagerly
    from deltawheel.executor.computation import (  # noqa: F401
        RECORD_KEY,
        Computation,
        ErrorPolicy,
        LatePolicy,
        Record,
        make_record,
    )
    from deltawheel.executor.context import (  # noqa: F401
        Context,
    )
    from deltawheel.executor.drivers.engine import Engine, connect  # noqa: F401
    from deltawheel.executor.drivers.pipeline import Pipeline  # noqa: F401
    from deltawheel.executor.drivers.runner import PipelineRunner  # noqa: F401
    from deltawheel.executor.exceptions import (  # noqa: F401
        BatchFailedError,
        UserCodeError,
        WindowingError,
    )
    from deltawheel.executor.protocol.executor import ComputationExecutor  # noqa: F401
    from deltawheel.executor.protocol.metrics import observe_input  # noqa: F401
    from deltawheel.executor.protocol.reports import BatchReport  # noqa: F401
    from deltawheel.executor.servers.cluster import LocalCluster  # noqa: F401
    from deltawheel.executor.servers.ensemble import ZooKeeperEnsemble  # noqa: F401
    from deltawheel.executor.servers.kafka import KafkaBroker  # noqa: F401
    from deltawheel.executor.servers.s3proxy import S3ProxyServer  # noqa: F401
    from deltawheel.executor.servers.zookeeper import EmbeddedZooKeeper  # noqa: F401
    from deltawheel.executor.session import (  # noqa: F401
        build_spark,
        spark_session,
    )
    from deltawheel.executor.sources.delta import DeltaTableInjector  # noqa: F401
    from deltawheel.executor.sources.injector import (  # noqa: F401
        BatchStats,
        Injector,
        MaxSeenMinusBound,
        publish_watermark,
    )
    from deltawheel.executor.sources.jsonl import JsonLinesInjector  # noqa: F401
    from deltawheel.executor.sources.kafka import KafkaInjector, PerPartitionWatermark  # noqa: F401
    from deltawheel.executor.sources.parquet import ParquetInjector  # noqa: F401
    from deltawheel.executor.sources.schema import to_stream_schema  # noqa: F401
    from deltawheel.executor.windowing.combiners import (  # noqa: F401
        CombineFn,
        Count,
        Max,
        Mean,
        Min,
        Sum,
    )
    from deltawheel.executor.windowing.panes import (  # noqa: F401
        AccumulationMode,
        Pane,
        PaneInfo,
        Timing,
    )
    from deltawheel.executor.windowing.triggers import (  # noqa: F401
        AfterAll,
        AfterAny,
        AfterCount,
        AfterEach,
        AfterProcessingTime,
        AfterWatermark,
        Always,
        DefaultTrigger,
        Never,
        OrFinally,
        Repeatedly,
        Trigger,
    )
    from deltawheel.executor.windowing.windowed import (  # noqa: F401
        WindowingStrategy,
        windowed,
    )
    from deltawheel.executor.windowing.windows import (  # noqa: F401
        FixedWindows,
        GlobalWindows,
        Sessions,
        SlidingWindows,
        Window,
        WindowFn,
    )
    from deltawheel.statestore.clock import (  # noqa: F401
        Clock,
        ManualClock,
        SystemClock,
    )
    from deltawheel.statestore.codecs import (  # noqa: F401
        get_codec,
    )
    from deltawheel.statestore.config import (  # noqa: F401
        ZkConfig,
    )
    from deltawheel.statestore.exceptions import (  # noqa: F401
        BadRecordError,
        BucketMissingError,
        CodecError,
        CommitConflictError,
        ConfigError,
        CoordinatorStateLostError,
        DeltaWheelError,
        FatalError,
        JarFetchError,
        JavaMissingError,
        LeaseError,
        LeaseHeldError,
        LeaseLostError,
        LeaseSuspendedError,
        MigrationError,
        NotAStoreError,
        NotOwnerError,
        ObjectStoreAuthError,
        ObjectStoreError,
        ObjectStoreServerError,
        ObjectStoreUnreachableError,
        RetryableError,
        SchemaTooNewError,
        SessionConfigError,
        StaleSequencerError,
        StateTooLargeError,
        StoreDamagedError,
        StoreMismatchError,
        ZooKeeperServerError,
    )
    from deltawheel.statestore.layout import (  # noqa: F401
        StoreLayout,
    )
    from deltawheel.statestore.ownership.owner import (  # noqa: F401
        IntervalOwner,
    )
    from deltawheel.statestore.rowtable.rows import (  # noqa: F401
        TimeDomain,
    )
    from deltawheel.statestore.rowtable.store import (  # noqa: F401
        RowStore,
    )
    from deltawheel.statestore.session.sparkenv import (  # noqa: F401
        SparkSettings,
    )
    from deltawheel.statestore.zk.client import (  # noqa: F401
        connect as connect_zk,
    )
    from deltawheel.statestore.zk.leases import (  # noqa: F401
        LeaseManager,
    )
    from deltawheel.statestore.zk.watermarks import (  # noqa: F401
        WatermarkAuthority,
    )
