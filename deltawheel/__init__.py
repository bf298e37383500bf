"""deltawheel: MillWheel's exactly-once per-key state engine for Spark, on Delta Lake and ZooKeeper.

The root holds what a user writes: the computation API, windowing, a session and the engine
(``connect``/``Engine``/``Pipeline``), the sources, and the errors a user catches::

    from deltawheel import Computation, windowed, FixedWindows, AfterWatermark, AccumulationMode

Everything else is imported from the module that defines it (docs/architecture.md lists the
folders): e.g. ``deltawheel.executor.protocol.executor.ComputationExecutor`` (a hand-wired
``foreachBatch``), ``deltawheel.executor.drivers.runner.PipelineRunner``, the local servers in
``deltawheel.executor.servers``, the store's parts in ``deltawheel.statestore``, and every
error in ``deltawheel.statestore.exceptions`` / ``deltawheel.executor.exceptions``.
``deltawheel.testing`` has the helpers for testing your own computations.

The names the root held before it was narrowed (``PipelineRunner``, ``StoreLayout``, ...) still
import from here for one release, with a DeprecationWarning naming their module (:data:`_MOVED`;
the README's "Changes" lists them).

Names are loaded on first use, so importing ``deltawheel`` (as every Spark task does when it
imports one of its modules) stays cheap. Type checkers read ``__init__.pyi``, which
``tests/test_root_names.py`` holds equal to :func:`_stub_text` (regenerate it with
``python -c "import deltawheel; print(deltawheel._stub_text(), end='')" > deltawheel/__init__.pyi``).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# name -> module that defines it (``module:name`` where it is defined under another name)
_EXPORTS: dict[str, str] = {
    # the computation API
    "Computation": "deltawheel.executor.computation",
    "Record": "deltawheel.executor.computation",
    "make_record": "deltawheel.executor.computation",
    "LatePolicy": "deltawheel.executor.computation",
    "ErrorPolicy": "deltawheel.executor.computation",
    "RECORD_KEY": "deltawheel.executor.computation",
    "Context": "deltawheel.executor.context",
    "TimeDomain": "deltawheel.statestore.rowtable.rows",
    # windowing (the Dataflow model)
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
    # running it: a session, the engine, a pipeline
    "spark_session": "deltawheel.executor.session",
    "build_spark": "deltawheel.executor.session",
    "SparkSettings": "deltawheel.statestore.session.sparkenv",
    "ZkConfig": "deltawheel.statestore.config",
    "connect": "deltawheel.executor.drivers.engine",
    "Engine": "deltawheel.executor.drivers.engine",
    "Pipeline": "deltawheel.executor.drivers.pipeline",
    # sources
    "Injector": "deltawheel.executor.sources.injector",
    "ParquetInjector": "deltawheel.executor.sources.parquet",
    "DeltaTableInjector": "deltawheel.executor.sources.delta",
    "JsonLinesInjector": "deltawheel.executor.sources.jsonl",
    "KafkaInjector": "deltawheel.executor.sources.kafka",
    "MaxSeenMinusBound": "deltawheel.executor.sources.injector",
    "PerPartitionWatermark": "deltawheel.executor.sources.kafka",
    "to_stream_schema": "deltawheel.executor.sources.schema",
    # the errors a user catches (one root; retryable kept apart from fatal)
    "DeltaWheelError": "deltawheel.statestore.exceptions",
    "RetryableError": "deltawheel.statestore.exceptions",
    "FatalError": "deltawheel.statestore.exceptions",
    "UserCodeError": "deltawheel.executor.exceptions",
    "BatchFailedError": "deltawheel.executor.exceptions",
    "WindowingError": "deltawheel.executor.exceptions",
    "LeaseError": "deltawheel.statestore.exceptions",
    "LeaseLostError": "deltawheel.statestore.exceptions",
    "LeaseHeldError": "deltawheel.statestore.exceptions",
    "ConfigError": "deltawheel.statestore.exceptions",
    "SessionConfigError": "deltawheel.statestore.exceptions",
    "StoreDamagedError": "deltawheel.statestore.exceptions",
    "CoordinatorStateLostError": "deltawheel.statestore.exceptions",
    "CodecError": "deltawheel.statestore.exceptions",
    "BadRecordError": "deltawheel.statestore.exceptions",
    "StateTooLargeError": "deltawheel.statestore.exceptions",
}

__all__ = sorted(_EXPORTS)


#: Names the root held before it was narrowed to :data:`_EXPORTS`, and where they live now. Each
#: still imports from the root for one release, with a DeprecationWarning naming its module. They
#: are in neither ``__all__`` nor the stub. Remove this table in the release after.
_MOVED: dict[str, str] = {
    "BatchReport": "deltawheel.executor.protocol.reports",
    "BatchStats": "deltawheel.executor.sources.injector",
    "Clock": "deltawheel.statestore.clock",
    "ComputationExecutor": "deltawheel.executor.protocol.executor",
    "EmbeddedZooKeeper": "deltawheel.executor.servers.zookeeper",
    "IntervalOwner": "deltawheel.statestore.ownership.owner",
    "KafkaBroker": "deltawheel.executor.servers.kafka",
    "LeaseManager": "deltawheel.statestore.zk.leases",
    "LocalCluster": "deltawheel.executor.servers.cluster",
    "ManualClock": "deltawheel.statestore.clock",
    "PipelineRunner": "deltawheel.executor.drivers.runner",
    "RowStore": "deltawheel.statestore.rowtable.store",
    "S3ProxyServer": "deltawheel.executor.servers.s3proxy",
    "StoreLayout": "deltawheel.statestore.layout",
    "SystemClock": "deltawheel.statestore.clock",
    "WatermarkAuthority": "deltawheel.statestore.zk.watermarks",
    "ZooKeeperEnsemble": "deltawheel.executor.servers.ensemble",
    "connect_zk": "deltawheel.statestore.zk.client:connect",
    "get_codec": "deltawheel.statestore.codecs",
    "observe_input": "deltawheel.executor.protocol.metrics",
    "publish_watermark": "deltawheel.executor.sources.injector",
}
_MOVED.update({name: "deltawheel.statestore.exceptions" for name in (
    "BucketMissingError", "CommitConflictError", "JarFetchError", "JavaMissingError", "LeaseSuspendedError",
    "MigrationError", "NotAStoreError", "NotOwnerError", "ObjectStoreAuthError", "ObjectStoreError",
    "ObjectStoreServerError", "ObjectStoreUnreachableError", "SchemaTooNewError", "StaleSequencerError",
    "StoreMismatchError", "ZooKeeperServerError")})


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    moved = module is None and name in _MOVED
    if moved:
        module = _MOVED[name]
    if module is None:
        raise AttributeError(f"module 'deltawheel' has no attribute {name!r}")
    module, _, defined = module.partition(":")
    value = getattr(importlib.import_module(module), defined or name)
    if moved:  # not cached: every use warns (Python shows each place once)
        spelled = f"from {module} import {defined} as {name}" if defined else f"from {module} import {name}"
        warnings.warn(f"deltawheel.{name} left the package root; write '{spelled}'. The root name goes in the "
                      "next release (README, \"Changes\").", DeprecationWarning, stacklevel=2)
        return value
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _stub_text() -> str:
    """The text of ``__init__.pyi``: the same names, imported eagerly, for type checkers and IDEs."""
    by_module: dict[str, list[str]] = {}
    for name, where in _EXPORTS.items():
        module, _, defined = where.partition(":")
        by_module.setdefault(module, []).append(f"{defined} as {name}" if defined else f"{name} as {name}")
    lines = ['"""Type stub of the package root: generated from ``_EXPORTS`` by ``_stub_text``."""', ""]
    for module in sorted(by_module):
        lines.append(f"from {module} import (")
        lines.extend(f"    {item}," for item in sorted(by_module[module]))
        lines.append(")")
    lines += ["", "__all__ = [", *(f"    {name!r}," for name in sorted(_EXPORTS)), "]", ""]
    return "\n".join(lines)
