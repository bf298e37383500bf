"""Type stub of the package root: generated from ``_EXPORTS`` by ``_stub_text``."""

from deltawheel.executor.computation import (
    Computation as Computation,
    ErrorPolicy as ErrorPolicy,
    LatePolicy as LatePolicy,
    RECORD_KEY as RECORD_KEY,
    Record as Record,
    make_record as make_record,
)
from deltawheel.executor.context import (
    Context as Context,
)
from deltawheel.executor.drivers.engine import (
    Engine as Engine,
    connect as connect,
)
from deltawheel.executor.drivers.pipeline import (
    Pipeline as Pipeline,
)
from deltawheel.executor.exceptions import (
    BatchFailedError as BatchFailedError,
    UserCodeError as UserCodeError,
    WindowingError as WindowingError,
)
from deltawheel.executor.session import (
    build_spark as build_spark,
    spark_session as spark_session,
)
from deltawheel.executor.sources.delta import (
    DeltaTableInjector as DeltaTableInjector,
)
from deltawheel.executor.sources.injector import (
    Injector as Injector,
    MaxSeenMinusBound as MaxSeenMinusBound,
)
from deltawheel.executor.sources.jsonl import (
    JsonLinesInjector as JsonLinesInjector,
)
from deltawheel.executor.sources.kafka import (
    KafkaInjector as KafkaInjector,
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
    Count as Count,
    Max as Max,
    Mean as Mean,
    Min as Min,
    Sum as Sum,
)
from deltawheel.executor.windowing.panes import (
    AccumulationMode as AccumulationMode,
    Pane as Pane,
    PaneInfo as PaneInfo,
    Timing as Timing,
)
from deltawheel.executor.windowing.triggers import (
    AfterAll as AfterAll,
    AfterAny as AfterAny,
    AfterCount as AfterCount,
    AfterEach as AfterEach,
    AfterProcessingTime as AfterProcessingTime,
    AfterWatermark as AfterWatermark,
    Always as Always,
    DefaultTrigger as DefaultTrigger,
    Never as Never,
    OrFinally as OrFinally,
    Repeatedly as Repeatedly,
    Trigger as Trigger,
)
from deltawheel.executor.windowing.windowed import (
    WindowingStrategy as WindowingStrategy,
    windowed as windowed,
)
from deltawheel.executor.windowing.windows import (
    FixedWindows as FixedWindows,
    GlobalWindows as GlobalWindows,
    Sessions as Sessions,
    SlidingWindows as SlidingWindows,
    Window as Window,
    WindowFn as WindowFn,
)
from deltawheel.statestore.config import (
    ZkConfig as ZkConfig,
)
from deltawheel.statestore.exceptions import (
    BadRecordError as BadRecordError,
    CodecError as CodecError,
    ConfigError as ConfigError,
    CoordinatorStateLostError as CoordinatorStateLostError,
    DeltaWheelError as DeltaWheelError,
    FatalError as FatalError,
    LeaseError as LeaseError,
    LeaseHeldError as LeaseHeldError,
    LeaseLostError as LeaseLostError,
    RetryableError as RetryableError,
    SessionConfigError as SessionConfigError,
    StateTooLargeError as StateTooLargeError,
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
