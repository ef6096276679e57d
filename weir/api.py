"""The job API: a small DataStream-style API that builds a :class:`~weir.graph.LogicalGraph`.

A job file defines ``build(env)``::

    from weir.api import Environment

    def build(env: Environment) -> None:
        events = env.from_kafka("events", uid="events-source", timestamp=lambda e: e["ts"])
        events.key_by(lambda e: e["key"]).window(TumblingEventTimeWindows(1000)).aggregate(
            Count(), uid="window-count").sink_to_kafka("window-results", uid="kafka-sink")

Every operator takes a stable, user-given ``uid``: it names the operator's state in checkpoints and
savepoints, so it must not change between versions of a job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Protocol, TypeVar

from weir.core.columnar import Aggregate, BuiltinAggregates, Count, FieldKey, Max, Mean, Min, Schema, Sum
from weir.core.descriptors import (
    COMMITTED,
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    EARLIEST,
    LATEST,
    Committed,
    GeneratorSourceSpec,
    KafkaRecord,
    KafkaSourceSpec,
    OffsetReset,
    SinkDelivery,
    SinkSpec,
    SinkSystem,
    StartingOffsets,
    Timestamp,
    TimestampType,
    validate_consumer_properties,
)
from weir.core.errors import JobDefinitionError, NonRetriableError
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
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowContext,
    to_millis,
)
from weir.graph import Edge, LogicalGraph, OperatorKind, Partitioning, Transformation
from weir.operators.basic import (
    CoProcessOperator,
    FilterOperator,
    FlatMapOperator,
    MapOperator,
    ProcessContext,
    ProcessOperator,
)
from weir.operators.columnar import ColumnarWindowAggregateOperator, ToRecordsOperator
from weir.operators.epoch_spill import DEFAULT_EPOCH_MEMORY_BYTES
from weir.operators.joins import EmitJoined, IntervalJoinOperator, JoinContext, ProcessJoin, WindowJoinOperator
from weir.operators.keyed import (
    REDUCE_STATE,
    KeyedCoProcessOperator,
    KeyedProcessContext,
    KeyedProcessOperator,
    OnTimerContext,
    ReduceOperator,
    TimerService,
)
from weir.operators.process_state import AggregatingState, ListState, MapState, ReducingState, ValueState
from weir.operators.sinks import (
    FileSinkOperator,
    FunctionSinkOperator,
    KafkaSinkOperator,
    PostgresUpsertSinkOperator,
    PrintSinkOperator,
    json_serializer,
)
from weir.operators.sources import GeneratorSourceOperator, KafkaSourceOperator, json_deserializer
from weir.operators.transactional_sinks import (
    TransactionalKafkaSinkOperator,
    TwoPhasePostgresSinkOperator,
    row_key_indexes,
)
from weir.operators.windows import (
    WINDOW_STATE,
    ElementList,
    ProcessElements,
    ProcessResult,
    ReduceAggregate,
    WindowAggregateOperator,
)

T = TypeVar("T")
ACC = TypeVar("ACC")

DEFAULT_MAX_PARALLELISM = 128


WindowAssigner = (
    TumblingEventTimeWindows | SlidingEventTimeWindows | EventTimeSessionWindows | TumblingProcessingTimeWindows
)
Duration = int | timedelta
"""A window duration: an int of milliseconds or a :class:`datetime.timedelta` (whole milliseconds)."""
KeySelector = Callable[[Any], Any] | str
"""A key: a function of the record, or a field name (``record[name]``; on a columnar stream, its column)."""
KafkaDelivery = Literal["exactly_once", "at_least_once"]
PostgresDelivery = Literal["two_phase", "upsert"]


class Parameters(Mapping[str, str]):
    """The job's ``-D key=value`` parameters with typed getters."""

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = dict(values or {})

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def get_str(self, key: str, default: str) -> str:
        return self._values.get(key, default)

    def get_int(self, key: str, default: int) -> int:
        raw = self._values.get(key)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise JobDefinitionError(f"parameter {key}={raw!r} is not an integer") from None

    def get_bool(self, key: str, default: bool) -> bool:
        raw = self._values.get(key)
        if raw is None:
            return default
        lowered = raw.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise JobDefinitionError(f"parameter {key}={raw!r} is not a boolean (true/false)")


class AggregateFunction(Protocol[T, ACC]):
    """Incremental window aggregation, as Flink's AggregateFunction."""

    def create(self) -> ACC: ...
    def add(self, acc: ACC, value: T) -> ACC: ...
    def result(self, key: Any, window_start: int, window_end: int, acc: ACC) -> Any: ...

    # Optional: ``merge(a, b) -> acc``, the accumulator of two windows' values (session windows need it).
    # Optional: the accumulator's version (default 1) and ``migrate(stored_version, acc) -> acc``,
    # read when ``.aggregate`` is given neither ``state_version`` nor ``migrate``.


class Environment:
    """What a job file's ``build(env)`` receives: parameters and the source factories."""

    def __init__(
        self,
        job_name: str,
        parameters: Mapping[str, str] | None = None,
        parallelism: int = 1,
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
    ) -> None:
        self.params = Parameters(parameters)
        self.records_operators: dict[str, Transformation] = {}  # <uid>-records of each columnar operator
        self._on_record_error: OnRecordError = FAIL
        self.graph = LogicalGraph(job_name=job_name, default_parallelism=parallelism, max_parallelism=max_parallelism)

    def set_max_parallelism(self, max_parallelism: int) -> None:
        self.graph.max_parallelism = max_parallelism

    def on_record_error(self, handling: OnRecordError) -> None:
        """What every operator does with a record its user function raises on, unless the operator
        is given its own ``on_error`` (Kafka Streams' ``processing.exception.handler``):

        - ``FailOnError()`` (the default): the task fails with the record named (operator, function,
          exception, record, key, timestamp, and its topic/partition/offset when the operator is
          chained to its Kafka source); the restart strategy restarts the job from its last
          checkpoint, so the record is tried again; once the restarts are spent the job is FAILED;
        - ``DeadLetterOnError(topic)``: the record goes to Kafka topic ``topic`` as a JSON envelope
          (the Kafka source's for malformed records, with the reason, operator, function and
          position), counted in ``weir_rejected_records_total``, and the job goes on without it."""
        if not isinstance(handling, FailOnError | DeadLetterOnError):
            raise JobDefinitionError(
                f"on_record_error takes FailOnError() or DeadLetterOnError(topic), not {handling!r}"
            )
        self._on_record_error = handling

    def record_error_handling(self, given: OnRecordError | None) -> OnRecordError:
        """An operator's handling of rejected records: its own, else the job's (:meth:`on_record_error`)."""
        return self._on_record_error if given is None else given

    def from_kafka(
        self,
        topic: str,
        *,
        uid: str,
        bounded: bool = False,
        deserializer: Callable[[bytes], Any] | None = None,
        timestamp: Callable[[Any], int] | None = None,
        max_out_of_orderness_ms: int = 0,
        dead_letter_topic: str | None = None,
        records_per_second: float | None = None,
        idle_timeout_ms: int | None = None,
        parallelism: int | None = None,
        name: str | None = None,
        schema: Schema | Mapping[str, type] | None = None,
        timestamp_field: str | None = None,
        starting_offsets: StartingOffsets = EARLIEST,
        properties: Mapping[str, str] | None = None,
        record_deserializer: Callable[[KafkaRecord], Any] | None = None,
        partition_discovery_interval_ms: int | None = None,
        commit_offsets_on_checkpoint: bool = True,
        group_id: str | None = None,
        max_record_bytes: int | None = None,
    ) -> DataStream:
        """A replayable Kafka source: partitions spread over subtasks, offsets kept in checkpoints.

        The Kafka options (docs/kafka-source.md): ``starting_offsets`` (EARLIEST, LATEST,
        ``Timestamp(ms)``, COMMITTED or ``Committed(OffsetReset.LATEST)``) for partitions without a
        restored position, fixed once at submit; ``properties`` passed through to the consumer
        (security, client.id, fetch settings; not those Weir sets itself); ``record_deserializer``
        taking the whole :class:`KafkaRecord` instead of ``deserializer``'s value bytes;
        ``partition_discovery_interval_ms`` (unbounded only) to read partitions added while the job
        runs; ``commit_offsets_on_checkpoint`` to commit a completed checkpoint's positions to the
        consumer group ``group_id`` (default ``weir-<job name>-<uid>``), never read back for recovery.

        With ``schema`` (field name -> str, int, float or bool) and ``timestamp_field`` (an int field,
        epoch ms), the source is columnar: each poll's JSON records are decoded in one call into an
        Arrow record batch (``weir.core.columnar``), and the stream is a :class:`ColumnarStream`.

        A record the deserializer or the timestamp function rejects goes to ``dead_letter_topic``
        with the reason (or fails the job when no dead-letter topic is given); so does, with
        ``max_record_bytes``, a record whose value is longer than that (its dead letter carries the
        value's first 512 KiB, ``value_truncated`` true).

        ``idle_timeout_ms`` (Flink's ``withIdleness``): a partition without records for that long
        (wall time) no longer holds the watermark back, until its next record; a subtask whose
        partitions are all idle (or that has none) is idle downstream. None (default): never idle.
        """

        if idle_timeout_ms is not None and (type(idle_timeout_ms) is not int or idle_timeout_ms <= 0):
            raise JobDefinitionError(
                f"kafka source {uid!r}: idle_timeout_ms must be a positive int (milliseconds) or None, "
                f"got {idle_timeout_ms!r}"
            )

        if not isinstance(starting_offsets, OffsetReset | Timestamp | Committed):
            raise JobDefinitionError(
                f"kafka source {uid!r}: starting_offsets must be EARLIEST, LATEST, Timestamp(ms) or Committed(...), "
                f"got {starting_offsets!r}"
            )
        if isinstance(starting_offsets, Timestamp) and (
            type(starting_offsets.ms) is not int or starting_offsets.ms < 0
        ):
            raise JobDefinitionError(
                f"kafka source {uid!r}: Timestamp(ms) takes epoch milliseconds (an int >= 0), "
                f"got {starting_offsets.ms!r}"
            )
        if partition_discovery_interval_ms is not None:
            if type(partition_discovery_interval_ms) is not int or partition_discovery_interval_ms <= 0:
                raise JobDefinitionError(
                    f"kafka source {uid!r}: partition_discovery_interval_ms must be a positive int (milliseconds) "
                    f"or None, got {partition_discovery_interval_ms!r}"
                )
            if bounded:
                raise JobDefinitionError(
                    f"kafka source {uid!r}: a bounded source reads the partitions present at submit; leave "
                    "partition_discovery_interval_ms out"
                )
        if max_record_bytes is not None and (type(max_record_bytes) is not int or max_record_bytes <= 0):
            raise JobDefinitionError(
                f"kafka source {uid!r}: max_record_bytes must be a positive int or None, got {max_record_bytes!r}"
            )
        if group_id is not None and (not isinstance(group_id, str) or not group_id):
            raise JobDefinitionError(f"kafka source {uid!r}: group_id must be a non-empty string, got {group_id!r}")
        try:
            consumer_properties = validate_consumer_properties(properties or {})
        except JobDefinitionError as exc:
            raise JobDefinitionError(f"kafka source {uid!r}: {exc}") from exc
        if record_deserializer is not None and deserializer is not None:
            raise JobDefinitionError(
                f"kafka source {uid!r}: give deserializer (value bytes) or record_deserializer (the whole record), "
                "not both"
            )
        columns: Schema | None = None
        if schema is not None:
            columns = schema if isinstance(schema, Schema) else Schema.of(schema)
            if deserializer is not None or timestamp is not None or record_deserializer is not None:
                raise JobDefinitionError(
                    f"kafka source {uid!r}: a columnar source (schema=) decodes JSON by its schema and takes "
                    "its event time from timestamp_field; leave deserializer, record_deserializer and timestamp out"
                )
            if timestamp_field is None:
                raise JobDefinitionError(f"kafka source {uid!r}: a columnar source needs timestamp_field")
            columns.decoder(timestamp_field)  # an unknown or non-int timestamp field fails here
        elif timestamp_field is not None:
            raise JobDefinitionError(f"kafka source {uid!r}: timestamp_field needs a schema (the columnar source)")
        spec = KafkaSourceSpec(
            topic=topic,
            bounded=bounded,
            deserializer=deserializer or json_deserializer,
            timestamp=timestamp,
            max_out_of_orderness_ms=max_out_of_orderness_ms,
            dead_letter_topic=dead_letter_topic,
            records_per_second=records_per_second,
            idle_timeout_ms=idle_timeout_ms,
            schema=columns,
            timestamp_field=timestamp_field,
            starting_offsets=starting_offsets,
            properties=consumer_properties,
            record_deserializer=record_deserializer,
            partition_discovery_interval_ms=partition_discovery_interval_ms,
            commit_offsets_on_checkpoint=commit_offsets_on_checkpoint,
            group_id=group_id,
            max_record_bytes=max_record_bytes,
        )
        stream = self._source(
            uid,
            name or f"kafka:{topic}",
            lambda: KafkaSourceOperator(spec),
            parallelism,
            spec,
            columnar=columns is not None,
        )
        return ColumnarStream(self, stream._t, columns) if columns is not None else stream

    def from_generator(
        self,
        generate: Callable[[int], Any],
        *,
        uid: str,
        count: int | None = None,
        timestamp: Callable[[Any], int] | None = None,
        max_out_of_orderness_ms: int = 0,
        records_per_second: float | None = None,
        parallelism: int | None = None,
        name: str | None = None,
    ) -> DataStream:
        """A deterministic, replayable source: record i is ``generate(i)`` for i in 0..count-1
        (unbounded when ``count`` is None); subtask s produces the indices s, s+p, s+2p, ..."""

        spec = GeneratorSourceSpec(
            generate=generate,
            count=count,
            timestamp=timestamp,
            max_out_of_orderness_ms=max_out_of_orderness_ms,
            records_per_second=records_per_second,
        )
        return self._source(uid, name or "generator", lambda: GeneratorSourceOperator(spec), parallelism, spec)

    def from_collection(self, items: Iterable[Any], *, uid: str, **kwargs: Any) -> DataStream:
        values = list(items)
        return self.from_generator(values.__getitem__, uid=uid, count=len(values), **kwargs)

    def _source(
        self,
        uid: str,
        name: str,
        factory: Callable[[], Any],
        parallelism: int | None,
        spec: Any = None,
        *,
        columnar: bool = False,
    ) -> DataStream:
        t = self.graph.add(
            Transformation(
                uid=uid,
                name=name,
                kind=OperatorKind.SOURCE,
                factory=factory,
                parallelism=parallelism,
                source_spec=spec,
                columnar=columnar,
            )
        )
        return DataStream(self, t)


class DataStream:
    """A stream of values produced by one operator: its main output, or one of its side outputs
    (``side_output``, see :meth:`get_side_output`)."""

    def __init__(
        self,
        env: Environment,
        transformation: Transformation,
        partitioning: Partitioning = Partitioning.FORWARD,
        key_selector: Callable[[Any], Any] | None = None,
        side_output: OutputTag | None = None,
    ) -> None:
        self._env = env
        self._t = transformation
        self._partitioning = partitioning
        self._key_selector = key_selector
        self._side_output = side_output

    def get_side_output(self, tag: OutputTag) -> DataStream:
        """The stream of what this stream's operator emits to side output ``tag`` (``ctx.output(tag,
        value)`` of a process function, a window's late data): operators connect to it as to any
        stream (chained when forward at the same parallelism). A tag the operator never emits is
        allowed (the stream stays empty); one name taken with two ``value_type``s is a
        JobDefinitionError."""
        if not isinstance(tag, OutputTag):
            raise JobDefinitionError(f"operator {self.uid!r}: get_side_output takes an OutputTag, got {tag!r}")
        if self._side_output is not None:
            raise JobDefinitionError(
                f"operator {self.uid!r}: side output {self._side_output.name!r} has no side outputs of its own: "
                "ask the operator's main stream for its side outputs"
            )
        if self._t.kind is OperatorKind.SINK:
            raise JobDefinitionError(f"operator {self.uid!r} is a sink: it has no side outputs")
        self._env.graph.check_side_output(self.uid, tag)
        return DataStream(self._env, self._t, side_output=tag)

    @property
    def uid(self) -> str:
        return self._t.uid

    def _add(
        self,
        uid: str,
        name: str,
        kind: OperatorKind,
        factory: Callable[[], Any],
        parallelism: int | None,
        key_selector: Callable[[Any], Any] | None = None,
        inputs: tuple[DataStream, ...] = (),
        sink_spec: SinkSpec | None = None,
        *,
        columnar_input: bool = False,
        side_outputs: tuple[OutputTag, ...] = (),
        on_error: Callable[[], OnRecordError] | None = None,
    ) -> Transformation:
        """Add an operator fed by ``inputs`` (default: this stream). Unless it takes record batches
        (``columnar_input``), a columnar input reaches it as records (:meth:`ColumnarStream.records`)."""
        upstreams = tuple(u if columnar_input else u._as_records() for u in (inputs or (self,)))
        t = self._env.graph.add(
            Transformation(
                uid=uid,
                name=name,
                kind=kind,
                factory=factory,
                parallelism=parallelism,
                key_selector=key_selector,
                sink_spec=sink_spec,
                side_outputs=side_outputs,
                on_error=on_error,
            )
        )
        for index, upstream in enumerate(upstreams):
            partitioning = upstream._partitioning
            if partitioning is Partitioning.FORWARD and (
                (parallelism or self._env.graph.default_parallelism)
                != (upstream._t.parallelism or self._env.graph.default_parallelism)
            ):
                partitioning = Partitioning.REBALANCE
            self._env.graph.connect(
                Edge(
                    source_uid=upstream._t.uid,
                    target_uid=uid,
                    partitioning=partitioning,
                    input_index=index if kind is OperatorKind.TWO_INPUT else 0,
                    key_selector=upstream._key_selector,
                    side_output=upstream._side_output,
                )
            )
        return t

    def map(
        self,
        fn: Callable[[Any], Any],
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        """``fn(value)`` per record. ``on_error`` (here and on every operator with a user function):
        what to do with a record ``fn`` raises on, ``FailOnError()`` or ``DeadLetterOnError(topic)``;
        None: the job's (:meth:`Environment.on_record_error`)."""
        env, on_error = self._env, _record_error_handling(uid, on_error)
        return DataStream(
            env,
            self._add(
                uid,
                name or "map",
                OperatorKind.ONE_INPUT,
                lambda: MapOperator(fn, env.record_error_handling(on_error)),
                parallelism,
                on_error=partial(env.record_error_handling, on_error),
            ),
        )

    def filter(
        self,
        fn: Callable[[Any], bool],
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        env, on_error = self._env, _record_error_handling(uid, on_error)
        return DataStream(
            env,
            self._add(
                uid,
                name or "filter",
                OperatorKind.ONE_INPUT,
                lambda: FilterOperator(fn, env.record_error_handling(on_error)),
                parallelism,
                on_error=partial(env.record_error_handling, on_error),
            ),
        )

    def flat_map(
        self,
        fn: Callable[[Any], Iterable[Any]],
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        env, on_error = self._env, _record_error_handling(uid, on_error)
        return DataStream(
            env,
            self._add(
                uid,
                name or "flat_map",
                OperatorKind.ONE_INPUT,
                lambda: FlatMapOperator(fn, env.record_error_handling(on_error)),
                parallelism,
                on_error=partial(env.record_error_handling, on_error),
            ),
        )

    def process(
        self,
        fn: ProcessFunction,
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        """Run ``fn`` (a :class:`ProcessFunction`) per record: ``process_element(value, ctx, out)``
        with the record's timestamp (``ctx.timestamp``) and side outputs (``ctx.output(tag, value)``).
        State and timers need a key: ``key_by(...).process(KeyedProcessFunction)``."""

        if not callable(getattr(fn, "process_element", None)):
            raise JobDefinitionError(
                f"operator {uid!r}: process takes a ProcessFunction with process_element(value, ctx, out), not {fn!r}"
            )
        env, on_error = self._env, _record_error_handling(uid, on_error)
        return DataStream(
            env,
            self._add(
                uid,
                name or "process",
                OperatorKind.ONE_INPUT,
                lambda: ProcessOperator(fn, env.record_error_handling(on_error)),
                parallelism,
                on_error=partial(env.record_error_handling, on_error),
            ),
        )

    def _as_records(self) -> DataStream:
        """This stream as one of records (a columnar stream converts its batches)."""
        return self

    def key_by(self, key_selector: KeySelector) -> KeyedStream:
        """Partition by key: a function of the record, or a field name (``record[name]``)."""
        return KeyedStream(self._env, self._t, _key_selector(key_selector), self._side_output)

    def rebalance(self) -> DataStream:
        return DataStream(self._env, self._t, Partitioning.REBALANCE, side_output=self._side_output)

    def broadcast(self) -> DataStream:
        return DataStream(self._env, self._t, Partitioning.BROADCAST, side_output=self._side_output)

    def union(self, *others: DataStream, uid: str, parallelism: int | None = None) -> DataStream:
        """Merge streams of the same type into one (an identity operator with several inputs)."""

        return DataStream(
            self._env,
            self._add(
                uid,
                "union",
                OperatorKind.ONE_INPUT,
                lambda: MapOperator(_identity),
                parallelism,
                inputs=(self, *others),
            ),
        )

    def connect(self, other: DataStream) -> ConnectedStreams:
        return ConnectedStreams(self, other)

    def join(self, other: DataStream) -> JoinedStreams:
        """A window join with ``other``: ``.where(key).equal_to(other_key).window(assigner).apply(fn)``."""
        return JoinedStreams(self, other)

    # Sinks -----------------------------------------------------------------------------------------

    def sink_to_kafka(
        self,
        topic: str,
        *,
        uid: str,
        serializer: Callable[[Any], bytes] | None = None,
        key: Callable[[Any], bytes | str | None] | None = None,
        parallelism: int | None = None,
        delivery: KafkaDelivery = "exactly_once",
        transaction_timeout_ms: int | None = None,
        marker_replication_factor: int | None = None,
        epoch_memory_bytes: int | None = None,
        spill_directory: str | Path | None = None,
        on_error: OnRecordError | None = None,
    ) -> None:
        """Write each value to ``topic``. ``exactly_once`` (the default): one Kafka transaction per
        checkpoint, committed when the checkpoint completes, so read_committed consumers see each value
        once, after the checkpoint; ``transaction_timeout_ms`` (default 15 min, at most the broker's
        ``transaction.max.timeout.ms``) must cover a checkpoint interval plus a restart;
        ``marker_replication_factor`` is that of the sink's commit marker topic when it creates it
        (default min(3, brokers)). ``epoch_memory_bytes`` (default 64 MiB; 0: every record on disk)
        bounds the not yet committed records a sink subtask holds in memory, all its epochs together;
        past it an epoch's records go to a file of its own under ``spill_directory`` (an absolute path
        on each TaskManager; default ``epoch-spill/`` in the run directory), removed once it commits.
        ``at_least_once``: flushed at every checkpoint, duplicates after a failure. See docs/sinks.md.
        ``on_error`` as for :meth:`map`: a record ``serializer`` or ``key`` raises on (Kafka's own
        errors are never the record's: they fail the task as they are)."""

        ser = serializer or json_serializer
        env, on_error = self._env, _record_error_handling(uid, on_error)
        build: Callable[..., Any]
        spec: SinkSpec
        if delivery == "exactly_once":
            timeout_ms = DEFAULT_TRANSACTION_TIMEOUT_MS if transaction_timeout_ms is None else transaction_timeout_ms
            if timeout_ms <= 0:
                raise JobDefinitionError(f"kafka sink {uid!r}: transaction_timeout_ms must be positive: {timeout_ms}")
            if marker_replication_factor is not None and marker_replication_factor < 1:
                raise JobDefinitionError(
                    f"kafka sink {uid!r}: marker_replication_factor must be at least 1, got "
                    f"{marker_replication_factor}; leave it unset for min(3, brokers)"
                )
            memory_bytes = _epoch_memory_bytes(uid, epoch_memory_bytes)
            build = partial(
                TransactionalKafkaSinkOperator,
                topic,
                ser,
                key,
                transaction_timeout_ms=timeout_ms,
                marker_replication_factor=marker_replication_factor,
                epoch_memory_bytes=memory_bytes,
                spill_directory=_spill_directory(uid, spill_directory),
            )
            spec = SinkSpec(
                SinkSystem.KAFKA,
                topic,
                SinkDelivery.EXACTLY_ONCE,
                transaction_timeout_ms=timeout_ms,
                epoch_memory_bytes=memory_bytes,
            )
        elif delivery == "at_least_once":
            for name, given in (
                ("transaction_timeout_ms", transaction_timeout_ms),
                ("marker_replication_factor", marker_replication_factor),
                ("epoch_memory_bytes", epoch_memory_bytes),
                ("spill_directory", spill_directory),
            ):
                if given is not None:
                    raise JobDefinitionError(f"kafka sink {uid!r}: {name} applies to delivery='exactly_once' only")
            build = partial(KafkaSinkOperator, topic, ser, key)
            spec = SinkSpec(SinkSystem.KAFKA, topic, SinkDelivery.AT_LEAST_ONCE)
        else:
            raise JobDefinitionError(
                f"kafka sink {uid!r}: delivery must be 'exactly_once' or 'at_least_once', got {delivery!r}"
            )
        self._add(
            uid,
            f"kafka-sink:{topic}",
            OperatorKind.SINK,
            lambda: build(on_error=env.record_error_handling(on_error)),
            parallelism,
            sink_spec=spec,
            on_error=partial(env.record_error_handling, on_error),
        )

    def sink_to_postgres(
        self,
        table: str,
        *,
        uid: str,
        columns: tuple[str, ...],
        key_columns: tuple[str, ...],
        row: Callable[[Any], tuple[Any, ...]] | None = None,
        parallelism: int | None = None,
        delivery: PostgresDelivery = "two_phase",
        version_column: str | None = None,
        on_error: OnRecordError | None = None,
    ) -> None:
        """Upsert each value into ``table`` by its key columns. ``two_phase`` (the default): one
        prepared transaction per checkpoint, committed when the checkpoint completes (exactly once; the
        server needs ``max_prepared_transactions`` > 0, and rows of one key must always reach the same
        sink subtask: key the stream by the table's key, or use parallelism 1). ``upsert``: batches
        committed as they fill, replays rewrite the same rows (idempotent, at-least-once). With
        ``version_column`` a row never overwrites a stored row of a higher version. See docs/sinks.md.
        ``on_error`` as for :meth:`map`: a record ``row`` raises on, or turns into another number of
        values than ``columns`` (PostgreSQL's own errors are never the record's)."""

        to_row = row or ColumnValues(columns)
        row_key_indexes(table, columns, key_columns, version_column)  # fail at build time, not at deploy
        env, on_error = self._env, _record_error_handling(uid, on_error)
        build: Callable[..., Any]
        if delivery == "two_phase":
            build = partial(
                TwoPhasePostgresSinkOperator, table, columns, key_columns, to_row, version_column=version_column
            )
            spec = SinkSpec(SinkSystem.POSTGRES, table, SinkDelivery.EXACTLY_ONCE)
        elif delivery == "upsert":
            build = partial(
                PostgresUpsertSinkOperator, table, columns, key_columns, to_row, version_column=version_column
            )
            spec = SinkSpec(SinkSystem.POSTGRES, table, SinkDelivery.AT_LEAST_ONCE)
        else:
            raise JobDefinitionError(
                f"postgres sink {uid!r}: delivery must be 'two_phase' or 'upsert', got {delivery!r}"
            )
        self._add(
            uid,
            f"postgres-sink:{table}",
            OperatorKind.SINK,
            lambda: build(on_error=env.record_error_handling(on_error)),
            parallelism,
            sink_spec=spec,
            on_error=partial(env.record_error_handling, on_error),
        )

    def sink(self, fn: Callable[[Any], None], *, uid: str, parallelism: int | None = None) -> None:
        """Call ``fn(value)`` for every value (Flink's SinkFunction): at-least-once, no transaction."""

        spec = SinkSpec(SinkSystem.FUNCTION, "", SinkDelivery.AT_LEAST_ONCE)
        self._add(uid, "sink", OperatorKind.SINK, lambda: FunctionSinkOperator(fn), parallelism, sink_spec=spec)

    def print(self, *, uid: str, prefix: str = "") -> None:

        spec = SinkSpec(SinkSystem.PRINT, "", SinkDelivery.AT_LEAST_ONCE)
        self._add(uid, "print", OperatorKind.SINK, lambda: PrintSinkOperator(prefix), None, sink_spec=spec)

    def sink_to_file(self, path: str, *, uid: str, serializer: Callable[[Any], bytes] | None = None) -> None:
        """Append one line per value to ``path``.<subtask> (a debugging sink, at-least-once)."""

        ser = serializer or json_serializer
        spec = SinkSpec(SinkSystem.FILE, path, SinkDelivery.AT_LEAST_ONCE)
        self._add(
            uid, f"file-sink:{path}", OperatorKind.SINK, lambda: FileSinkOperator(path, ser), None, sink_spec=spec
        )


class KeyedStream(DataStream):
    """A stream partitioned by key: each key's values reach one subtask, in order per input."""

    def __init__(
        self,
        env: Environment,
        transformation: Transformation,
        key_selector: Callable[[Any], Any],
        side_output: OutputTag | None = None,
    ) -> None:
        super().__init__(env, transformation, Partitioning.HASH, key_selector, side_output)

    def reduce(
        self,
        fn: Callable[[Any, Any], Any],
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        state_version: int | None = None,
        migrate: Migrate | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        """Emit the running reduction of each key after every value (state kept in RocksDB).

        ``state_version`` (default 1) versions the reduced value in snapshots; restoring state of an
        older version needs ``migrate(stored_version, value) -> value`` (see :meth:`WindowedStream.aggregate`)."""

        assert self._key_selector is not None
        ks = self._key_selector
        schema = _state_schema(uid, REDUCE_STATE, fn, state_version, migrate)
        env, on_error = self._env, _record_error_handling(uid, on_error)
        return DataStream(
            env,
            self._add(
                uid,
                name or "reduce",
                OperatorKind.ONE_INPUT,
                lambda: ReduceOperator(fn, ks, schema, on_error=env.record_error_handling(on_error)),
                parallelism,
                key_selector=ks,
                on_error=partial(env.record_error_handling, on_error),
            ),
        )

    def process(  # type: ignore[override]  # a keyed stream runs a KeyedProcessFunction
        self,
        fn: KeyedProcessFunction,
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        state_schemas: Iterable[StateSchema] | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        """Run ``fn`` (a :class:`KeyedProcessFunction`) per record with its key's state and timers.
        ``state_schemas`` (or ``fn.state_schemas``): a :class:`StateSchema` per state name the
        function versions; ``migrate`` is given what one key's state holds (a ValueState's value, a
        ListState's list, each MapState entry's value, a Reducing/AggregatingState's accumulator). A
        state not declared is version 1."""

        assert self._key_selector is not None
        ks = self._key_selector
        schemas = _process_state_schemas(uid, fn, state_schemas)
        env, on_error = self._env, _record_error_handling(uid, on_error)
        return DataStream(
            env,
            self._add(
                uid,
                name or "process",
                OperatorKind.ONE_INPUT,
                lambda: KeyedProcessOperator(fn, ks, schemas, on_error=env.record_error_handling(on_error)),
                parallelism,
                key_selector=ks,
                on_error=partial(env.record_error_handling, on_error),
            ),
        )

    def window(self, assigner: WindowAssigner, *, allowed_lateness_ms: Duration = 0) -> WindowedStream:
        """Group each key's values into the windows of ``assigner``; ``allowed_lateness_ms`` (int ms
        or timedelta) keeps an event-time window's state that long after it fired, for late values."""
        return WindowedStream(self, assigner, allowed_lateness_ms)

    def interval_join(self, other: KeyedStream) -> IntervalJoin:
        """An interval join with keyed stream ``other``: ``.between(lower, upper).process(fn)``
        pairs each record at ``t`` with ``other``'s records of the same key at ``[t + lower, t + upper]``."""
        if not isinstance(other, KeyedStream):
            raise JobDefinitionError(f"interval_join takes a keyed stream (key_by), not {other!r}")
        return IntervalJoin(self, other)


class WindowedStream:
    """A keyed stream grouped into windows; ``aggregate``, ``reduce`` or ``process`` says what each
    window emits when it fires (Flink's WindowedStream)."""

    def __init__(
        self,
        keyed: KeyedStream,
        assigner: WindowAssigner,
        allowed_lateness_ms: Duration,
        late_data: OutputTag | None = None,
    ) -> None:
        try:
            lateness = to_millis(allowed_lateness_ms, "allowed_lateness_ms")
        except (TypeError, ValueError) as exc:
            raise JobDefinitionError(str(exc)) from None
        if lateness < 0:
            raise JobDefinitionError("allowed_lateness_ms must be >= 0")
        if late_data is not None and not isinstance(late_data, OutputTag):
            raise JobDefinitionError(f"side_output_late_data takes an OutputTag, got {late_data!r}")
        self._keyed = keyed
        self._assigner = assigner
        self._lateness = lateness
        self._late_data = late_data

    def allowed_lateness(self, lateness: Duration) -> WindowedStream:
        """The same windows with ``lateness`` (int ms or timedelta) allowed (Flink's ``allowedLateness``)."""
        return WindowedStream(self._keyed, self._assigner, lateness, self._late_data)

    def side_output_late_data(self, tag: OutputTag) -> WindowedStream:
        """The same windows, with the elements dropped as late (past the allowed lateness of every
        window they belong to) sent to side output ``tag`` with their own timestamps (Flink's
        ``sideOutputLateData``): ``.get_side_output(tag)`` on the window's result stream reads them.
        They are still counted as dropped late records."""
        return WindowedStream(self._keyed, self._assigner, self._lateness, tag)

    def _of_records(self) -> WindowedStream:
        """The same windows over the records of a columnar keyed stream."""
        keyed = self._keyed
        assert isinstance(keyed, ColumnarKeyedStream)
        return WindowedStream(keyed._records_keyed(), self._assigner, self._lateness, self._late_data)

    def aggregate(
        self,
        fn: AggregateFunction[Any, Any] | Mapping[str, Aggregate],
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        state_version: int | None = None,
        migrate: Migrate | None = None,
        window_function: ProcessWindowFunction | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        """Aggregate each key's window incrementally; emit ``fn.result`` when the watermark passes
        the window's end (and again for each late value within the allowed lateness). With
        ``window_function``, its ``process(key, context, (result,), out)`` emits instead (Flink's
        ``aggregate(agg, windowFunction)``): the one result and the window's metadata.

        ``state_version`` (default 1; or ``fn.state_version``) versions the accumulators in snapshots.
        Raise it when the accumulator's shape changes, and give ``migrate(stored_version, acc) -> acc``
        (or ``fn.migrate``): a restore of an older version rewrites every accumulator through it once;
        without it, or restoring a newer version than declared, the job fails at restore.

        Session windows merge accumulators: ``fn`` needs ``merge(a, b) -> acc``."""

        keyed = self._keyed
        ks = keyed._key_selector
        assert ks is not None
        assigner, lateness = self._assigner, self._lateness
        if isinstance(fn, Mapping):  # built-in aggregates by result name
            fn = BuiltinAggregates(fn, ks.field if isinstance(ks, FieldKey) else "key")
            if (
                isinstance(keyed, ColumnarKeyedStream)
                and window_function is None
                and isinstance(assigner, TumblingEventTimeWindows | SlidingEventTimeWindows)
            ):  # vectorized: event-time windows that do not merge
                return keyed._columnar_window(
                    fn, assigner, lateness, uid, name, parallelism, state_version, migrate, self._late_data
                )
        if isinstance(keyed, ColumnarKeyedStream):  # anything else is the records' window
            return self._of_records().aggregate(
                fn,
                uid=uid,
                name=name,
                parallelism=parallelism,
                state_version=state_version,
                migrate=migrate,
                window_function=window_function,
                on_error=on_error,
            )
        return self._window(
            uid,
            name or "window-aggregate",
            parallelism,
            fn,
            _state_schema(uid, WINDOW_STATE, fn, state_version, migrate),
            None if window_function is None else ProcessResult(_window_function(uid, window_function)),
            on_error,
        )

    def reduce(
        self,
        fn: Callable[[Any, Any], Any],
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        state_version: int | None = None,
        migrate: Migrate | None = None,
        window_function: ProcessWindowFunction | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        """Reduce each key's window incrementally with ``fn(a, b) -> value`` (of the values' type); emit
        the reduced value when the window fires, or what ``window_function`` makes of it
        (``process(key, context, (reduced,), out)``). The state is the reduced value (what
        ``state_version``/``migrate`` version); session windows merge two by ``fn`` too."""

        if not callable(fn):
            raise JobDefinitionError(f"operator {uid!r}: reduce takes a function of two values, not {fn!r}")
        if isinstance(self._keyed, ColumnarKeyedStream):
            return self._of_records().reduce(
                fn,
                uid=uid,
                name=name,
                parallelism=parallelism,
                state_version=state_version,
                migrate=migrate,
                window_function=window_function,
                on_error=on_error,
            )
        return self._window(
            uid,
            name or "window-reduce",
            parallelism,
            ReduceAggregate(fn),
            _state_schema(uid, WINDOW_STATE, fn, state_version, migrate),
            None if window_function is None else ProcessResult(_window_function(uid, window_function)),
            on_error,
        )

    def process(
        self,
        fn: ProcessWindowFunction,
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        state_version: int | None = None,
        migrate: Migrate | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        """Keep every value of each key's window (a list in state) and call
        ``fn.process(key, context, elements, out)`` when it fires: ``elements`` in arrival order,
        ``context.window`` and ``context.current_watermark``; ``out.collect(value)`` emits (stamped with
        the window's last timestamp). ``state_version``/``migrate`` version the list of a window."""

        if isinstance(self._keyed, ColumnarKeyedStream):
            return self._of_records().process(
                fn,
                uid=uid,
                name=name,
                parallelism=parallelism,
                state_version=state_version,
                migrate=migrate,
                on_error=on_error,
            )
        return self._window(
            uid,
            name or "window-process",
            parallelism,
            ElementList(),
            _state_schema(uid, WINDOW_STATE, fn, state_version, migrate),
            ProcessElements(_window_function(uid, fn)),
            on_error,
        )

    def _window(
        self,
        uid: str,
        name: str,
        parallelism: int | None,
        fn: Any,
        schema: StateSchema,
        window_function: ProcessResult | ProcessElements | None,
        on_error: OnRecordError | None,
    ) -> DataStream:
        """The window operator over records, checked at build time."""
        keyed = self._keyed
        ks = keyed._key_selector
        assert ks is not None
        assigner, lateness, late_data = self._assigner, self._lateness, self._late_data
        if isinstance(assigner, EventTimeSessionWindows) and not callable(getattr(fn, "merge", None)):
            raise JobDefinitionError(
                f"operator {uid!r}: session windows ({assigner!r}) merge the accumulators of the windows they "
                f"join, and {type(fn).__name__} has no merge(a, b) method: give it one"
            )
        env, on_error = keyed._env, _record_error_handling(uid, on_error)
        return DataStream(
            env,
            keyed._add(
                uid,
                name,
                OperatorKind.ONE_INPUT,
                lambda: WindowAggregateOperator(
                    fn,
                    ks,
                    assigner,
                    lateness,
                    schema,
                    window_function=window_function,
                    late_data=late_data,
                    on_error=env.record_error_handling(on_error),
                ),
                parallelism,
                key_selector=ks,
                side_outputs=() if late_data is None else (late_data,),
                on_error=partial(env.record_error_handling, on_error),
            ),
        )


class ColumnarStream(DataStream):
    """A stream of Arrow record batches with declared fields (a columnar source's output).

    ``key_by("field")`` and a window ``.aggregate`` of built-in aggregates (``{"count": Count(),
    "sum": Sum("value")}``) stay columnar: batches are hash-partitioned on arrays, exchanged as Arrow
    IPC and aggregated vectorized. Everything else (``map``, ``filter``, sinks, a key function, an
    AggregateFunction, ``process``) takes records: the batches are turned into dicts (one per row,
    stamped with the event time) by an operator chained to this one, ``<uid>-records``."""

    def __init__(
        self,
        env: Environment,
        transformation: Transformation,
        schema: Schema,
        partitioning: Partitioning = Partitioning.FORWARD,
        key_selector: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__(env, transformation, partitioning, key_selector)
        self.schema = schema

    def records(self) -> DataStream:
        """The stream as records (dicts), converted once per columnar operator."""
        records_uid = f"{self.uid}-records"
        graph = self._env.graph
        made = self._env.records_operators
        if records_uid not in made:
            if records_uid in graph.transformations:
                raise JobDefinitionError(
                    f"operator uid {records_uid!r} is taken: it names the operator that turns the batches of "
                    f"columnar operator {self.uid!r} into records; give the other operator another uid"
                )
            made[records_uid] = DataStream._add(
                self,
                records_uid,
                "to-records",
                OperatorKind.ONE_INPUT,
                ToRecordsOperator,
                self._t.parallelism,
                columnar_input=True,
            )
        return DataStream(self._env, made[records_uid])

    def _as_records(self) -> DataStream:
        return self.records()

    def rebalance(self) -> DataStream:
        return self.records().rebalance()

    def broadcast(self) -> DataStream:
        return self.records().broadcast()

    def key_by(self, key_selector: KeySelector) -> KeyedStream:
        if isinstance(key_selector, str):
            self.schema.kind_of(key_selector)  # an unknown field fails at build time
            return ColumnarKeyedStream(self._env, self._t, self.schema, FieldKey(key_selector))
        return self.records().key_by(key_selector)


class ColumnarKeyedStream(KeyedStream):
    """A columnar stream keyed by a field: batches are hash-partitioned by key group on arrays."""

    def __init__(self, env: Environment, transformation: Transformation, schema: Schema, key: FieldKey) -> None:
        super().__init__(env, transformation, key)
        self.schema = schema
        self._field_key = key

    def _columnar(self) -> ColumnarStream:
        return ColumnarStream(self._env, self._t, self.schema)

    def _records_keyed(self) -> KeyedStream:
        """The same partitioning over records: converted before the exchange, keyed by the field."""
        return self._columnar().records().key_by(self._field_key)

    def _as_records(self) -> DataStream:
        return self._records_keyed()

    def key_by(self, key_selector: KeySelector) -> KeyedStream:
        return self._columnar().key_by(key_selector)

    def rebalance(self) -> DataStream:
        return self._columnar().rebalance()

    def broadcast(self) -> DataStream:
        return self._columnar().broadcast()

    def reduce(self, fn: Callable[[Any, Any], Any], **kwargs: Any) -> DataStream:
        return self._records_keyed().reduce(fn, **kwargs)

    def process(self, fn: KeyedProcessFunction, **kwargs: Any) -> DataStream:
        return self._records_keyed().process(fn, **kwargs)

    def _columnar_window(
        self,
        fn: BuiltinAggregates,
        assigner: TumblingEventTimeWindows | SlidingEventTimeWindows,
        lateness: int,
        uid: str,
        name: str | None,
        parallelism: int | None,
        state_version: int | None,
        migrate: Migrate | None,
        late_data: OutputTag | None = None,
    ) -> DataStream:
        for field in fn.fields():
            self.schema.kind_of(field)  # an unknown field fails at build time
        schema = _state_schema(uid, WINDOW_STATE, fn, state_version, migrate)
        key_field = self._field_key.field
        return DataStream(
            self._env,
            self._add(
                uid,
                name or "window-aggregate",
                OperatorKind.ONE_INPUT,
                lambda: ColumnarWindowAggregateOperator(fn, key_field, assigner, lateness, schema, late_data=late_data),
                parallelism,
                key_selector=self._field_key,
                columnar_input=True,
                side_outputs=() if late_data is None else (late_data,),
            ),
        )


class ConnectedStreams:
    """Two streams into one two-input operator (Flink's connect / CoProcessFunction)."""

    def __init__(self, first: DataStream, second: DataStream) -> None:
        self._first = first
        self._second = second

    def key_by(self, first_key: KeySelector, second_key: KeySelector) -> ConnectedStreams:
        """Both streams keyed, the first by ``first_key``, the second by ``second_key``: records whose
        keys are equal values reach the same subtask and share their key's state and timers."""
        return ConnectedStreams(self._first.key_by(first_key), self._second.key_by(second_key))

    def process(
        self,
        fn: CoProcessFunction | KeyedCoProcessFunction,
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        state_schemas: Iterable[StateSchema] | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        """Run ``fn`` over both streams: a :class:`CoProcessFunction` without state, or (both
        streams keyed) a :class:`KeyedCoProcessFunction` with its key's state and timers;
        ``state_schemas`` as for :meth:`KeyedStream.process`; ``on_error`` as for :meth:`DataStream.map`
        (``process_element1/2``, ``on_timer`` and the key selectors)."""

        env, on_error = self._first._env, _record_error_handling(uid, on_error)
        if isinstance(fn, KeyedCoProcessFunction):
            return self._keyed_process(fn, uid, name, parallelism, state_schemas, on_error)
        if state_schemas is not None:
            raise JobDefinitionError(f"operator {uid!r}: state_schemas needs a KeyedCoProcessFunction")
        first = self._first
        key_selector = first._key_selector if first._partitioning is Partitioning.HASH else None
        return DataStream(
            env,
            first._add(
                uid,
                name or "co-process",
                OperatorKind.TWO_INPUT,
                lambda: CoProcessOperator(fn, env.record_error_handling(on_error)),
                parallelism,
                key_selector=key_selector,
                inputs=(first, self._second),
                on_error=partial(env.record_error_handling, on_error),
            ),
        )

    def _keyed_process(
        self,
        fn: KeyedCoProcessFunction,
        uid: str,
        name: str | None,
        parallelism: int | None,
        state_schemas: Iterable[StateSchema] | None,
        on_error: OnRecordError | None,
    ) -> DataStream:
        keys = _two_keys(uid, self._first, self._second)
        schemas = _process_state_schemas(uid, fn, state_schemas)
        env = self._first._env
        return _keyed_two_input(
            self._first,
            self._second,
            uid,
            name or "keyed-co-process",
            parallelism,
            keys,
            lambda: KeyedCoProcessOperator(fn, keys, schemas, on_error=env.record_error_handling(on_error)),
            on_error,
        )


class Collector(Protocol):
    def collect(self, value: Any, timestamp: int | None = None) -> None: ...


class KeyedProcessFunction:
    """Per-key processing with state and timers (Flink's KeyedProcessFunction): override
    ``process_element``, and ``on_timer`` to act when a timer fires.

    ``ctx`` (a :class:`KeyedProcessContext`) has the current key (``ctx.key``), the record's
    timestamp (``ctx.timestamp``), the key's state of each kind (``ctx.value_state(name)``,
    ``list_state``, ``map_state``, ``reducing_state(name, fn)``, ``aggregating_state(name, agg)``
    with a :class:`StateAggregateFunction`), each with an optional ``ttl=StateTtlConfig(...)``, and
    ``ctx.timer_service()`` (a :class:`TimerService`) to register and delete event-time and
    processing-time timers, in epoch ms or as a ``timedelta`` since the epoch; ``ctx.output(tag,
    value)`` emits to side output ``tag`` (an :class:`OutputTag`, read with
    ``stream.get_side_output(tag)``), stamped as ``out.collect`` stamps.

    ``state_schemas`` (optional, or ``.process(..., state_schemas=...)``): a :class:`StateSchema` per
    state whose values are versioned, e.g. ``StateSchema("count", version=2, migrate=fn)``."""

    def process_element(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        raise NotImplementedError("a KeyedProcessFunction must override process_element")

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector) -> None:
        """A timer of ``ctx.key`` at ``timestamp`` fired, of domain ``ctx.time_domain()``
        (:class:`TimeDomain`). What ``out`` collects is stamped with ``timestamp`` for an event-time
        timer and has no timestamp for a processing-time one (unless given)."""


class ProcessFunction:
    """Per-record processing on a stream that is not keyed (Flink's ProcessFunction): override
    ``process_element``. ``ctx`` (a :class:`ProcessContext`) has the record's timestamp
    (``ctx.timestamp``) and ``ctx.output(tag, value)`` to emit to side output ``tag`` (an
    :class:`OutputTag`; read with ``stream.get_side_output(tag)``), stamped with that timestamp."""

    def process_element(self, value: Any, ctx: ProcessContext, out: Collector) -> None:
        raise NotImplementedError("a ProcessFunction must override process_element")


class ProcessWindowFunction:
    """What a window emits when it fires, from all of it: override ``process``.

    ``elements`` is every value of the window (``.process``), or the one aggregate or reduced value
    (``.aggregate(..., window_function=)``, ``.reduce(..., window_function=)``); ``context`` is a
    :class:`WindowContext` (``window.start``, ``window.end``, ``current_watermark``,
    ``current_processing_time``); ``out.collect(value)`` emits, stamped with the window's last
    timestamp unless given another."""

    def process(self, key: Any, context: WindowContext, elements: Sequence[Any], out: Collector) -> None:
        raise NotImplementedError("a ProcessWindowFunction must override process")


class CoProcessFunction:
    """Two inputs without state: ``process_element1(value, ctx, out)`` for the first stream,
    ``process_element2`` for the second (Flink's CoProcessFunction). ``ctx`` is a
    :class:`ProcessContext`: the record's ``timestamp`` and ``ctx.output(tag, value)`` for side
    outputs. Both pass records through unless overridden."""

    def process_element1(self, value: Any, ctx: ProcessContext, out: Collector) -> None:
        out.collect(value)

    def process_element2(self, value: Any, ctx: ProcessContext, out: Collector) -> None:
        out.collect(value)


def _record_error_handling(uid: str, given: OnRecordError | None) -> OnRecordError | None:
    """An operator's ``on_error`` as given: None, ``FailOnError()`` or ``DeadLetterOnError(topic)``."""
    if given is None or isinstance(given, FailOnError | DeadLetterOnError):
        return given
    raise JobDefinitionError(
        f"operator {uid!r}: on_error takes FailOnError() or DeadLetterOnError(topic), not {given!r}"
    )


class ColumnValues:
    """A PostgreSQL sink's default ``row``: the value's items named by the columns, in their order."""

    __slots__ = ("columns",)

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = tuple(columns)

    def __call__(self, value: Any) -> tuple[Any, ...]:
        return tuple(value[c] for c in self.columns)


def _identity(value: Any) -> Any:
    return value


def _window_function(uid: str, fn: Any) -> Any:
    """A ProcessWindowFunction, checked at build time: an object with a ``process`` method."""
    if not callable(getattr(fn, "process", None)):
        raise JobDefinitionError(
            f"operator {uid!r}: a window function is a ProcessWindowFunction with process(key, context, elements, "
            f"out), not {fn!r}"
        )
    return fn


def _key_selector(key: KeySelector) -> Callable[[Any], Any]:
    if isinstance(key, str):
        return FieldKey(key)
    if not callable(key):
        raise JobDefinitionError(f"key_by takes a function of the record or a field name, not {key!r}")
    return key


def _state_schema(uid: str, name: str, fn: Any, version: int | None, migrate: Migrate | None) -> StateSchema:
    """The schema of a keyed operator's one state, checked at build time: the explicit
    ``state_version``/``migrate``, else the function's own attributes of those names, else version 1."""
    if version is None:
        version = getattr(fn, "state_version", None)
    if migrate is None:
        migrate = getattr(fn, "migrate", None)
    try:
        return StateSchema(name, version=1 if version is None else version, migrate=migrate)
    except JobDefinitionError as exc:
        raise JobDefinitionError(f"operator {uid!r}: {exc}") from None


def _process_state_schemas(uid: str, fn: Any, given: Iterable[StateSchema] | None) -> tuple[StateSchema, ...]:
    """A KeyedProcessFunction's declared states: ``state_schemas``, else ``fn.state_schemas``."""
    schemas = tuple(getattr(fn, "state_schemas", ()) if given is None else given)
    names: set[str] = set()
    for schema in schemas:
        if not isinstance(schema, StateSchema):
            raise JobDefinitionError(f"operator {uid!r}: state_schemas holds {schema!r}, not a StateSchema")
        if schema.name in names:
            raise JobDefinitionError(f"operator {uid!r}: state {schema.name!r} is declared twice in state_schemas")
        names.add(schema.name)
    return schemas


def _epoch_memory_bytes(uid: str, given: int | None) -> int:
    """A Kafka sink's ``epoch_memory_bytes``, checked at build time: an int of at least 0 (None: default)."""
    if given is None:
        return DEFAULT_EPOCH_MEMORY_BYTES
    if type(given) is not int or given < 0:
        raise JobDefinitionError(
            f"kafka sink {uid!r}: epoch_memory_bytes must be an int of at least 0 (0: every record on disk), got "
            f"{given!r}; leave it unset for {DEFAULT_EPOCH_MEMORY_BYTES} bytes (64 MiB)"
        )
    return given


def _spill_directory(uid: str, given: str | Path | None) -> Path | None:
    """A Kafka sink's ``spill_directory``, checked at build time: absolute, since every TaskManager
    loads the job file in its own working directory (None: ``epoch-spill/`` in the run directory)."""
    if given is None:
        return None
    if not isinstance(given, str | Path) or not str(given):
        raise JobDefinitionError(f"kafka sink {uid!r}: spill_directory must be a path, got {given!r}")
    path = Path(given).expanduser()
    if not path.is_absolute():
        raise JobDefinitionError(
            f"kafka sink {uid!r}: spill_directory {str(given)!r} must be an absolute path: each TaskManager "
            "would resolve a relative one against its own working directory"
        )
    return path


# Keyed two-input functions and joins ----------------------------------------------------------------


class KeyedCoProcessFunction:
    """Two keyed inputs with state and timers (Flink's KeyedCoProcessFunction): override
    ``process_element1`` (a record of the first stream) and ``process_element2`` (of the second),
    and ``on_timer`` to act when a timer fires.

    ``ctx`` is the :class:`KeyedProcessContext` of a :class:`KeyedProcessFunction`: the current key
    (``ctx.key``, the same value for both streams' records of a key), the record's timestamp, the
    key's state of every kind (shared by both inputs) and ``ctx.timer_service()``. Built by
    ``a.connect(b).key_by(key_a, key_b).process(fn, uid=...)`` or
    ``a.key_by(key_a).connect(b.key_by(key_b)).process(fn, uid=...)``; ``state_schemas`` as there."""

    def process_element1(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        raise NotImplementedError("a KeyedCoProcessFunction must override process_element1")

    def process_element2(self, value: Any, ctx: KeyedProcessContext, out: Collector) -> None:
        raise NotImplementedError("a KeyedCoProcessFunction must override process_element2")

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector) -> None:
        """A timer of ``ctx.key`` fired (see :meth:`KeyedProcessFunction.on_timer`)."""


class ProcessJoinFunction:
    """What an interval join emits for one pair (Flink's ProcessJoinFunction): override
    ``process_element``. ``ctx`` (a :class:`JoinContext`) has ``left_timestamp``,
    ``right_timestamp`` and ``timestamp`` (the later one, what ``out.collect`` stamps by default)."""

    def process_element(self, left: Any, right: Any, ctx: JoinContext, out: Collector) -> None:
        raise NotImplementedError("a ProcessJoinFunction must override process_element")


JoinFunction = Callable[[Any, Any], Any]
"""A window join's ``fn(first, second) -> value`` (or an object with such a ``join`` method)."""


@dataclass(frozen=True)
class JoinedStreams:
    """``a.join(b)``: say each stream's key (``where``, ``equal_to``), then the windows (Flink's JoinedStreams)."""

    first: DataStream
    second: DataStream

    def where(self, key: KeySelector) -> JoinWhere:
        """The first stream's key."""
        return JoinWhere(self.first, self.second, _key_selector(key))


@dataclass(frozen=True)
class JoinWhere:
    """``a.join(b).where(key)``: the second stream's key next."""

    first: DataStream
    second: DataStream
    first_key: Callable[[Any], Any]

    def equal_to(self, key: KeySelector) -> JoinEqualTo:
        """The second stream's key: records join where the two keys are equal values."""
        return JoinEqualTo(self.first, self.second, self.first_key, _key_selector(key))


@dataclass(frozen=True)
class JoinEqualTo:
    """Both keys said: the event-time windows the join pairs records in."""

    first: DataStream
    second: DataStream
    first_key: Callable[[Any], Any]
    second_key: Callable[[Any], Any]

    def window(self, assigner: TumblingEventTimeWindows | SlidingEventTimeWindows) -> WindowedJoin:
        if not isinstance(assigner, TumblingEventTimeWindows | SlidingEventTimeWindows):
            raise JobDefinitionError(f"a window join takes tumbling or sliding event-time windows, not {assigner!r}")
        return WindowedJoin(self.first, self.second, self.first_key, self.second_key, assigner)


@dataclass(frozen=True)
class WindowedJoin:
    """A window join ready to run: ``apply(fn, uid=...)``."""

    first: DataStream
    second: DataStream
    first_key: Callable[[Any], Any]
    second_key: Callable[[Any], Any]
    assigner: TumblingEventTimeWindows | SlidingEventTimeWindows

    def apply(
        self,
        fn: JoinFunction,
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        """For each window and key, ``fn(x, y)`` for every pair of an ``x`` of the first stream and a
        ``y`` of the second in it (first stream outer, each in arrival order), emitted when the
        watermark reaches the window's last timestamp, stamped with it. A record whose windows have
        all fired is dropped (late). ``on_error`` as for :meth:`DataStream.map`: a pair ``fn`` raises
        on is rejected with its window (dead-lettered: the window's other pairs are joined), a record
        a key selector raises on as a record."""
        join = getattr(fn, "join", None)
        join = join if callable(join) else fn
        if not callable(join):
            raise JobDefinitionError(f"operator {uid!r}: a window join takes fn(first, second), not {fn!r}")
        keys = (self.first_key, self.second_key)
        assigner = self.assigner
        env, on_error = self.first._env, _record_error_handling(uid, on_error)
        return _keyed_two_input(
            self.first.key_by(self.first_key),
            self.second.key_by(self.second_key),
            uid,
            name or "window-join",
            parallelism,
            keys,
            lambda: WindowJoinOperator(join, assigner, keys, on_error=env.record_error_handling(on_error)),
            on_error,
        )


@dataclass(frozen=True)
class IntervalJoin:
    """``a.key_by(ka).interval_join(b.key_by(kb))``: the interval next (``between``)."""

    first: KeyedStream
    second: KeyedStream

    def between(self, lower: Duration, upper: Duration) -> IntervalJoined:
        """Pair a first-stream record at ``t`` with the second stream's at ``[t + lower, t + upper]``
        (ms or timedelta, negative allowed; both bounds inclusive unless made exclusive)."""
        lower_ms, upper_ms = (
            _millis("an interval join's lower bound", lower),
            _millis("an interval join's upper bound", upper),
        )
        if lower_ms > upper_ms:
            raise JobDefinitionError(
                f"an interval join's lower bound {lower_ms} ms is above its upper bound {upper_ms} ms"
            )
        return IntervalJoined(self.first, self.second, lower_ms, upper_ms)


@dataclass(frozen=True)
class IntervalJoined:
    """An interval join ready to run: ``process(fn, uid=...)``, bounds optionally exclusive."""

    first: KeyedStream
    second: KeyedStream
    lower_ms: int
    upper_ms: int
    lower_is_exclusive: bool = False
    upper_is_exclusive: bool = False

    def lower_exclusive(self) -> IntervalJoined:
        """The lower bound excluded: ``t + lower < t2``."""
        return dataclasses.replace(self, lower_is_exclusive=True)

    def upper_exclusive(self) -> IntervalJoined:
        """The upper bound excluded: ``t2 < t + upper``."""
        return dataclasses.replace(self, upper_is_exclusive=True)

    def process(
        self,
        fn: ProcessJoinFunction | JoinFunction,
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        """``fn.process_element(left, right, ctx, out)`` (a :class:`ProcessJoinFunction`), or
        ``fn(left, right) -> value`` emitted as is, for every pair, as soon as the later of the two
        arrives, stamped with the later timestamp. A record at or behind the watermark is dropped
        (late); each record's state is dropped once the watermark passes what could still match it.
        ``on_error`` as for :meth:`DataStream.map`: the arriving record ``fn`` (or a key selector)
        raises on is rejected; dead-lettered, it is not kept to pair with later records."""
        lower = self.lower_ms + (1 if self.lower_is_exclusive else 0)
        upper = self.upper_ms - (1 if self.upper_is_exclusive else 0)
        if lower > upper:
            raise JobDefinitionError(
                f"operator {uid!r}: the interval join's bounds {self.lower_ms}..{self.upper_ms} ms with the exclusive "
                "bound(s) left out match nothing"
            )
        process_element = getattr(fn, "process_element", None)
        if callable(process_element):
            process: ProcessJoin = process_element
        elif callable(fn):
            process = EmitJoined(fn)
        else:
            raise JobDefinitionError(
                f"operator {uid!r}: an interval join takes a ProcessJoinFunction or fn(left, right), not {fn!r}"
            )
        keys = _two_keys(uid, self.first, self.second)
        env, on_error = self.first._env, _record_error_handling(uid, on_error)
        return _keyed_two_input(
            self.first,
            self.second,
            uid,
            name or "interval-join",
            parallelism,
            keys,
            lambda: IntervalJoinOperator(process, lower, upper, keys, on_error=env.record_error_handling(on_error)),
            on_error,
        )


def _millis(what: str, value: Duration) -> int:
    try:
        return to_millis(value, what)
    except (TypeError, ValueError) as exc:
        raise JobDefinitionError(str(exc)) from None


def _two_keys(uid: str, first: DataStream, second: DataStream) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """The keys of two keyed streams, or a JobDefinitionError naming the operator."""
    if not isinstance(first, KeyedStream) or not isinstance(second, KeyedStream):
        raise JobDefinitionError(
            f"operator {uid!r}: a keyed two-input operator needs both streams keyed: "
            "a.connect(b).key_by(key_a, key_b) or a.key_by(key_a).connect(b.key_by(key_b))"
        )
    assert first._key_selector is not None and second._key_selector is not None
    return first._key_selector, second._key_selector


def _keyed_two_input(
    first: DataStream,
    second: DataStream,
    uid: str,
    name: str,
    parallelism: int | None,
    keys: tuple[Callable[[Any], Any], Callable[[Any], Any]],
    factory: Callable[[], Any],
    on_error: OnRecordError | None,
) -> DataStream:
    """A keyed two-input operator fed by both streams, each hash-partitioned by its own key; a record
    either key selector raises on where the key is taken is handled by ``on_error`` (else the job's)."""
    env = first._env
    return DataStream(
        env,
        first._add(
            uid,
            name,
            OperatorKind.TWO_INPUT,
            factory,
            parallelism,
            key_selector=keys[0],
            inputs=(first, second),
            on_error=partial(env.record_error_handling, on_error),
        ),
    )


# Loading job files ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedJob:
    graph: LogicalGraph
    module: ModuleType


def load_job_source(
    source: bytes | str,
    file_name: str,
    parameters: Mapping[str, str] | None = None,
    parallelism: int = 1,
    job_name: str | None = None,
) -> LoadedJob:
    """Import a job file's source and run its ``build(env)``; any failure is a JobDefinitionError."""
    text = source.decode("utf-8") if isinstance(source, bytes) else source
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]
    module_name = f"weir_job_{Path(file_name).stem.replace('-', '_')}_{digest}"
    module = ModuleType(module_name)
    module.__file__ = file_name
    try:
        code = compile(text, file_name, "exec")
    except SyntaxError as exc:
        raise JobDefinitionError(f"job file {file_name} does not compile: {exc.msg} (line {exc.lineno})") from exc
    sys.modules[module_name] = module  # so that pickle and dataclasses can find the job's classes
    try:
        exec(code, module.__dict__)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise JobDefinitionError(f"job file {file_name} does not import: {type(exc).__name__}: {exc}") from exc
    build = getattr(module, "build", None)
    if not callable(build):
        raise JobDefinitionError(f"job file {file_name} defines no build(env) function")
    env = Environment(job_name or Path(file_name).stem, parameters, parallelism)
    try:
        build(env)
    except JobDefinitionError:
        raise
    except Exception as exc:
        raise JobDefinitionError(f"job file {file_name}: build(env) failed: {type(exc).__name__}: {exc}") from exc
    env.graph.validate()
    return LoadedJob(graph=env.graph, module=module)


def load_job_file(path: str | Path, parameters: Mapping[str, str] | None = None, parallelism: int = 1) -> LoadedJob:
    p = Path(path)
    if not p.is_file():
        raise JobDefinitionError(f"job file {p} does not exist")
    return load_job_source(p.read_bytes(), str(p), parameters, parallelism)


__all__ = [
    "COMMITTED",
    "DeadLetterOnError",
    "FailOnError",
    "OnRecordError",
    "EARLIEST",
    "LATEST",
    "Committed",
    "KafkaRecord",
    "OffsetReset",
    "Timestamp",
    "TimestampType",
    "AggregateFunction",
    "AggregatingState",
    "CoProcessFunction",
    "Collector",
    "ColumnarKeyedStream",
    "ColumnarStream",
    "ConnectedStreams",
    "Count",
    "DataStream",
    "Duration",
    "Environment",
    "EventTimeSessionWindows",
    "FieldKey",
    "IntervalJoin",
    "IntervalJoined",
    "JoinContext",
    "JoinEqualTo",
    "JoinFunction",
    "JoinWhere",
    "JoinedStreams",
    "KeyedCoProcessFunction",
    "KeyedProcessContext",
    "KeyedProcessFunction",
    "KeyedStream",
    "ListState",
    "LoadedJob",
    "MapState",
    "Max",
    "Mean",
    "Min",
    "NonRetriableError",
    "OnTimerContext",
    "OutputTag",
    "Parameters",
    "ProcessContext",
    "ProcessFunction",
    "ProcessJoinFunction",
    "ProcessWindowFunction",
    "ReducingState",
    "Schema",
    "SlidingEventTimeWindows",
    "StateAggregateFunction",
    "StateSchema",
    "StateTtlConfig",
    "Sum",
    "TimeDomain",
    "TimeWindow",
    "TimerService",
    "TtlUpdateType",
    "TumblingEventTimeWindows",
    "TumblingProcessingTimeWindows",
    "ValueState",
    "WindowContext",
    "WindowedJoin",
    "WindowedStream",
    "json_deserializer",
    "json_serializer",
    "load_job_file",
    "load_job_source",
]
