"""Type stub of the package root: generated from ``_EXPORTS`` by ``_stub_text``."""

from deltawheel.executor.computation import (
    RECORD_KEY as RECORD_KEY,
)
from deltawheel.executor.computation import (
    Computation as Computation,
)
from deltawheel.executor.computation import (
    ErrorPolicy as ErrorPolicy,
)
from deltawheel.executor.computation import (
    LatePolicy as LatePolicy,
)
from deltawheel.executor.computation import (
    Record as Record,
)
from deltawheel.executor.computation import (
    make_record as make_record,
)
from deltawheel.executor.context import (
    Context as Context,
)
from deltawheel.executor.drivers.engine import (
    Engine as Engine,
)
from deltawheel.executor.drivers.engine import (
    connect as connect,
)
from deltawheel.executor.drivers.pipeline import (
    Pipeline as Pipeline,
)
from deltawheel.executor.exceptions import (
    BatchFailedError as BatchFailedError,
)
from deltawheel.executor.exceptions import (
    UserCodeError as UserCodeError,
)
from deltawheel.executor.exceptions import (
    WindowingError as WindowingError,
)
from deltawheel.executor.session import (
    build_spark as build_spark,
)
from deltawheel.executor.session import (
    spark_session as spark_session,
)
from deltawheel.executor.sources.delta import (
    DeltaTableInjector as DeltaTableInjector,
)
from deltawheel.executor.sources.injector import (
    Injector as Injector,
)
from deltawheel.executor.sources.injector import (
    MaxSeenMinusBound as MaxSeenMinusBound,
)
from deltawheel.executor.sources.jsonl import (
    JsonLinesInjector as JsonLinesInjector,
)
from deltawheel.executor.sources.kafka import (
    KafkaInjector as KafkaInjector,
)
from deltawheel.executor.sources.kafka import (
    PerPartitionWatermark as PerPartitionWatermark,
)
from deltawheel.executor.sources.parquet import (
    ParquetInjector as ParquetInjector,
)
from deltawheel.executor.sources.schema import (
    to_stream_schema as to_stream_schema,
)
from deltawheel.executor.windowing.combiners import (
    CombineFn as CombineFn,
)
from deltawheel.executor.windowing.combiners import (
    Count as Count,
)
from deltawheel.executor.windowing.combiners import (
    Max as Max,
)
from deltawheel.executor.windowing.combiners import (
    Mean as Mean,
)
from deltawheel.executor.windowing.combiners import (
    Min as Min,
)
from deltawheel.executor.windowing.combiners import (
    Sum as Sum,
)
from deltawheel.executor.windowing.panes import (
    AccumulationMode as AccumulationMode,
)
from deltawheel.executor.windowing.panes import (
    Pane as Pane,
)
from deltawheel.executor.windowing.panes import (
    PaneInfo as PaneInfo,
)
from deltawheel.executor.windowing.panes import (
    Timing as Timing,
)
from deltawheel.executor.windowing.triggers import (
    AfterAll as AfterAll,
)
from deltawheel.executor.windowing.triggers import (
    AfterAny as AfterAny,
)
from deltawheel.executor.windowing.triggers import (
    AfterCount as AfterCount,
)
from deltawheel.executor.windowing.triggers import (
    AfterEach as AfterEach,
)
from deltawheel.executor.windowing.triggers import (
    AfterProcessingTime as AfterProcessingTime,
)
from deltawheel.executor.windowing.triggers import (
    AfterWatermark as AfterWatermark,
)
from deltawheel.executor.windowing.triggers import (
    Always as Always,
)
from deltawheel.executor.windowing.triggers import (
    DefaultTrigger as DefaultTrigger,
)
from deltawheel.executor.windowing.triggers import (
    Never as Never,
)
from deltawheel.executor.windowing.triggers import (
    OrFinally as OrFinally,
)
from deltawheel.executor.windowing.triggers import (
    Repeatedly as Repeatedly,
)
from deltawheel.executor.windowing.triggers import (
    Trigger as Trigger,
)
from deltawheel.executor.windowing.windowed import (
    WindowingStrategy as WindowingStrategy,
)
from deltawheel.executor.windowing.windowed import (
    windowed as windowed,
)
from deltawheel.executor.windowing.windows import (
    FixedWindows as FixedWindows,
)
from deltawheel.executor.windowing.windows import (
    GlobalWindows as GlobalWindows,
)
from deltawheel.executor.windowing.windows import (
    Sessions as Sessions,
)
from deltawheel.executor.windowing.windows import (
    SlidingWindows as SlidingWindows,
)
from deltawheel.executor.windowing.windows import (
    Window as Window,
)
from deltawheel.executor.windowing.windows import (
    WindowFn as WindowFn,
)
from deltawheel.statestore.config import (
    ZkConfig as ZkConfig,
)
from deltawheel.statestore.exceptions import (
    BadRecordError as BadRecordError,
)
from deltawheel.statestore.exceptions import (
    CodecError as CodecError,
)
from deltawheel.statestore.exceptions import (
    ConfigError as ConfigError,
)
from deltawheel.statestore.exceptions import (
    CoordinatorStateLostError as CoordinatorStateLostError,
)
from deltawheel.statestore.exceptions import (
    DeltaWheelError as DeltaWheelError,
)
from deltawheel.statestore.exceptions import (
    FatalError as FatalError,
)
from deltawheel.statestore.exceptions import (
    LeaseError as LeaseError,
)
from deltawheel.statestore.exceptions import (
    LeaseHeldError as LeaseHeldError,
)
from deltawheel.statestore.exceptions import (
    LeaseLostError as LeaseLostError,
)
from deltawheel.statestore.exceptions import (
    RetryableError as RetryableError,
)
from deltawheel.statestore.exceptions import (
    SessionConfigError as SessionConfigError,
)
from deltawheel.statestore.exceptions import (
    StateTooLargeError as StateTooLargeError,
)
from deltawheel.statestore.exceptions import (
    StoreDamagedError as StoreDamagedError,
)
from deltawheel.statestore.rowtable.rows import (
    TimeDomain as TimeDomain,
)
from deltawheel.statestore.session.sparkenv import (
    SparkSettings as SparkSettings,
)

__all__ = [
    'AccumulationMode',
    'AfterAll',
    'AfterAny',
    'AfterCount',
    'AfterEach',
    'AfterProcessingTime',
    'AfterWatermark',
    'Always',
    'BadRecordError',
    'BatchFailedError',
    'CodecError',
    'CombineFn',
    'Computation',
    'ConfigError',
    'Context',
    'CoordinatorStateLostError',
    'Count',
    'DefaultTrigger',
    'DeltaTableInjector',
    'DeltaWheelError',
    'Engine',
    'ErrorPolicy',
    'FatalError',
    'FixedWindows',
    'GlobalWindows',
    'Injector',
    'JsonLinesInjector',
    'KafkaInjector',
    'LatePolicy',
    'LeaseError',
    'LeaseHeldError',
    'LeaseLostError',
    'Max',
    'MaxSeenMinusBound',
    'Mean',
    'Min',
    'Never',
    'OrFinally',
    'Pane',
    'PaneInfo',
    'ParquetInjector',
    'PerPartitionWatermark',
    'Pipeline',
    'RECORD_KEY',
    'Record',
    'Repeatedly',
    'RetryableError',
    'SessionConfigError',
    'Sessions',
    'SlidingWindows',
    'SparkSettings',
    'StateTooLargeError',
    'StoreDamagedError',
    'Sum',
    'TimeDomain',
    'Timing',
    'Trigger',
    'UserCodeError',
    'Window',
    'WindowFn',
    'WindowingError',
    'WindowingStrategy',
    'ZkConfig',
    'build_spark',
    'connect',
    'make_record',
    'spark_session',
    'to_stream_schema',
    'windowed',
]
