"""The job API: a small DataStream-style API that builds a :class:`~weir.graph.LogicalGraph`.

A job file defines ``build(env)``::

    from weir.api import Count, Environment, KafkaSink, KafkaSource, TumblingEventTimeWindows

    def build(env: Environment) -> None:
        events = env.from_kafka("events", uid="events-source", timestamp=lambda e: e["ts"])
        counts = events.key_by("key").window(TumblingEventTimeWindows(1000)).aggregate({"n": Count()}, uid="counts")
        counts.sink_to_kafka("window-results", uid="kafka-sink")

or, with the connectors' builders (Flink's ``KafkaSource.builder()``, ``env.fromSource``, ``sinkTo``)::

        source = KafkaSource.builder().topic("events").timestamp(lambda e: e["ts"]).build()
        events = env.from_source(source, uid="events-source")
        ...
        counts.sink_to(KafkaSink.builder().topic("window-results").build(), uid="kafka-sink")

Every operator takes a stable, user-given ``uid``: it names the operator's state in checkpoints and
savepoints, so it must not change between versions of a job.

The modules: ``environment`` (the sources), ``streams``, ``stream_sinks`` and ``columnar`` (the
operators, each built by ``factories`` from arguments ``checks`` checked), one module per connector
that owns its builder and the checks of its options (``kafka_source``, ``kafka_sink``,
``postgres_sink``, ``generator_source``, ``local_sinks``), ``connector`` (what ``from_source`` and
``sink_to`` take), ``wiring`` (the one path by which everything enters the graph), ``functions`` (what
a job implements) and ``loading`` (job files). Everything a job uses is importable from ``weir.api``.
"""

from weir.api.checks import KeySelector
from weir.api.columnar import ColumnarKeyedStream, ColumnarStream
from weir.api.connector import Duration, OptionError, Sink, Source
from weir.api.environment import DEFAULT_MAX_PARALLELISM, Environment, Parameters
from weir.api.file_sink import PartFileSink, fixed_bucket
from weir.api.functions import (
    AggregateFunction,
    BroadcastProcessFunction,
    Collector,
    CoProcessFunction,
    JoinFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    ProcessFunction,
    ProcessJoinFunction,
    ProcessWindowFunction,
)
from weir.api.generator_source import GeneratorSource
from weir.api.kafka_sink import KafkaDelivery, KafkaSink, KafkaSinkBuilder
from weir.api.kafka_source import KafkaSource, KafkaSourceBuilder
from weir.api.loading import LoadedJob, load_job_file, load_job_source
from weir.api.local_sinks import FileSink, FunctionSink, PrintSink
from weir.api.postgres_cdc_source import PostgresCdcSource, PostgresCdcSourceBuilder
from weir.api.postgres_sink import ColumnValues, PostgresDelivery, PostgresSink, PostgresSinkBuilder
from weir.api.streams import (
    ConnectedStreams,
    DataStream,
    IntervalJoin,
    IntervalJoined,
    JoinedStreams,
    JoinEqualTo,
    JoinWhere,
    KeyedStream,
    WindowAssigner,
    WindowedJoin,
    WindowedStream,
)
from weir.core.cdc import ChangeEvent, ChangeOp, SlotRetention
from weir.core.changelog import Delete
from weir.core.columnar import Count, FieldKey, Max, Mean, Min, Schema, Sum
from weir.core.descriptors import (
    COMMITTED,
    EARLIEST,
    LATEST,
    Committed,
    GeneratorSourceSpec,
    KafkaRecord,
    KafkaSourceSpec,
    OffsetReset,
    PostgresCdcSourceSpec,
    StartingOffsets,
    Timestamp,
    TimestampType,
)
from weir.core.errors import JobDefinitionError, NonRetriableError
from weir.core.json_codec import decode as json_deserializer
from weir.core.json_codec import encode as json_serializer
from weir.core.process_functions import (
    OutputTag,
    StateAggregateFunction,
    StateTtlConfig,
    TimeDomain,
    TtlUpdateType,
)
from weir.core.rejections import FAIL, DeadLetterOnError, FailOnError, OnRecordError
from weir.core.state_schema import Migrate, StateSchema
from weir.core.windows import (
    CumulativeEventTimeWindows,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowContext,
)
from weir.operators.basic import ProcessContext
from weir.operators.joins import JoinContext
from weir.operators.keyed import KeyedProcessContext, OnTimerContext, TimerService
from weir.operators.process_state import AggregatingState, ListState, MapState, ReducingState, ValueState

__all__ = [
    "COMMITTED",
    "DEFAULT_MAX_PARALLELISM",
    "EARLIEST",
    "FAIL",
    "LATEST",
    "AggregateFunction",
    "AggregatingState",
    "BroadcastProcessFunction",
    "CoProcessFunction",
    "Collector",
    "ColumnValues",
    "ColumnarKeyedStream",
    "ColumnarStream",
    "Committed",
    "ConnectedStreams",
    "Count",
    "DataStream",
    "DeadLetterOnError",
    "Duration",
    "Environment",
    "CumulativeEventTimeWindows",
    "EventTimeSessionWindows",
    "FailOnError",
    "FieldKey",
    "FileSink",
    "PartFileSink",
    "fixed_bucket",
    "FunctionSink",
    "GeneratorSource",
    "GeneratorSourceSpec",
    "IntervalJoin",
    "IntervalJoined",
    "JobDefinitionError",
    "JoinContext",
    "JoinEqualTo",
    "JoinFunction",
    "JoinWhere",
    "JoinedStreams",
    "KafkaDelivery",
    "KafkaRecord",
    "KafkaSink",
    "KafkaSinkBuilder",
    "KafkaSource",
    "KafkaSourceBuilder",
    "KafkaSourceSpec",
    "KeySelector",
    "KeyedBroadcastProcessFunction",
    "KeyedCoProcessFunction",
    "KeyedProcessContext",
    "KeyedProcessFunction",
    "KeyedStream",
    "ListState",
    "LoadedJob",
    "MapState",
    "Max",
    "Mean",
    "Migrate",
    "Min",
    "NonRetriableError",
    "OffsetReset",
    "OnRecordError",
    "OnTimerContext",
    "OptionError",
    "OutputTag",
    "Parameters",
    "ChangeEvent",
    "ChangeOp",
    "Delete",
    "PostgresCdcSource",
    "PostgresCdcSourceBuilder",
    "PostgresCdcSourceSpec",
    "PostgresDelivery",
    "PostgresSink",
    "PostgresSinkBuilder",
    "PrintSink",
    "ProcessContext",
    "ProcessFunction",
    "ProcessJoinFunction",
    "ProcessWindowFunction",
    "ReducingState",
    "Schema",
    "Sink",
    "SlidingEventTimeWindows",
    "SlotRetention",
    "Source",
    "StartingOffsets",
    "StateAggregateFunction",
    "StateSchema",
    "StateTtlConfig",
    "Sum",
    "TimeDomain",
    "TimeWindow",
    "TimerService",
    "Timestamp",
    "TimestampType",
    "TtlUpdateType",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "ValueState",
    "WindowAssigner",
    "WindowContext",
    "WindowedJoin",
    "WindowedStream",
    "json_deserializer",
    "json_serializer",
    "load_job_file",
    "load_job_source",
]
