"""The streams of a job (Flink's DataStream, KeyedStream, WindowedStream, ConnectedStreams and the
join builders): what it does with its records.

Every public method checks its own arguments and then adds its operator through one path,
:meth:`DataStream._add`, which hands :meth:`weir.api.wiring.GraphBuilder.add_operator` the operator
factory, its kind, uid, name, parallelism, ``on_error`` and inputs. The sink methods are in
``weir.api.stream_sinks``: a sink is built by its connector and added by ``sink_to``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from weir.api import factories
from weir.api.checks import (
    KeySelector,
    key_selector,
    millis,
    process_state_schemas,
    process_window_function,
    state_schema,
)
from weir.api.connector import Duration, OperatorFactory, Sink
from weir.api.functions import (
    AggregateFunction,
    BroadcastProcessFunction,
    CoProcessFunction,
    JoinFunction,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    ProcessFunction,
    ProcessJoinFunction,
    ProcessWindowFunction,
)
from weir.api.stream_sinks import StreamSinks
from weir.api.wiring import GraphBuilder, StreamInput
from weir.core.columnar import Aggregate, BuiltinAggregates, FieldKey
from weir.core.descriptors import SinkSpec
from weir.core.errors import JobDefinitionError
from weir.core.process_functions import OutputTag
from weir.core.rejections import OnRecordError
from weir.core.state_schema import Migrate, StateSchema
from weir.core.windows import (
    CumulativeEventTimeWindows,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)
from weir.graph import OperatorKind, Partitioning, Transformation
from weir.operators.keyed import REDUCE_STATE
from weir.operators.windows import WINDOW_STATE, ElementList, ProcessElements, ProcessResult, ReduceAggregate

WindowAssigner = (
    TumblingEventTimeWindows
    | SlidingEventTimeWindows
    | CumulativeEventTimeWindows
    | EventTimeSessionWindows
    | TumblingProcessingTimeWindows
)


class DataStream(StreamSinks):
    """A stream of values produced by one operator: its main output, or one of its side outputs
    (``side_output``, see :meth:`get_side_output`)."""

    def __init__(
        self,
        graph: GraphBuilder,
        transformation: Transformation,
        partitioning: Partitioning = Partitioning.FORWARD,
        key_selector: Callable[[Any], Any] | None = None,
        side_output: OutputTag | None = None,
    ) -> None:
        self._graph = graph
        self._t = transformation
        self._partitioning = partitioning
        self._key_selector = key_selector
        self._side_output = side_output

    @property
    def uid(self) -> str:
        return self._t.uid

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
        self._graph.graph.check_side_output(self.uid, tag)
        return DataStream(self._graph, self._t, side_output=tag)

    def _input(self) -> StreamInput:
        """This stream as an operator's input."""
        t = self._t
        return StreamInput(t.uid, t.parallelism, self._partitioning, self._key_selector, self._side_output)

    def _add(
        self,
        factory: OperatorFactory,
        *,
        kind: OperatorKind = OperatorKind.ONE_INPUT,
        uid: str,
        name: str,
        parallelism: int | None,
        on_error: OnRecordError | None = None,
        inputs: tuple[DataStream, ...] = (),
        key_selector: Callable[[Any], Any] | None = None,
        sink_spec: SinkSpec | None = None,
        side_outputs: tuple[OutputTag, ...] = (),
        columnar_input: bool = False,
    ) -> DataStream:
        """The one path every stream method adds its operator by: fed by ``inputs`` (default: this
        stream); unless it takes record batches (``columnar_input``), a columnar input reaches it as
        records (:meth:`weir.api.columnar.ColumnarStream.records`)."""
        upstreams = tuple(u if columnar_input else u._as_records() for u in (inputs or (self,)))
        t = self._graph.add_operator(
            factory,
            kind=kind,
            uid=uid,
            name=name,
            parallelism=parallelism,
            on_error=on_error,
            inputs=tuple(u._input() for u in upstreams),
            key_selector=key_selector,
            sink_spec=sink_spec,
            side_outputs=side_outputs,
        )
        return DataStream(self._graph, t)

    def _as_records(self) -> DataStream:
        """This stream as one of records (a columnar stream converts its batches)."""
        return self

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
        operator = factories.map_operator(fn)
        return self._add(operator, uid=uid, name=name or "map", parallelism=parallelism, on_error=on_error)

    def async_map(
        self,
        fn: Callable[[Any], Any],
        *,
        uid: str,
        capacity: int = 100,
        timeout_ms: int | None = None,
        ordered: bool = True,
        name: str | None = None,
        parallelism: int | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        """Flink's async I/O: ``await fn(value)`` per record (``fn`` an ``async def``: a lookup in a
        service), up to ``capacity`` calls in flight per subtask, each given ``timeout_ms`` (None: no
        limit). ``ordered``: results in input order; else as they complete, but never across a
        watermark. Calls in flight are part of the checkpoint and issued again after a restore (so
        ``fn`` runs at least once per record, its result reaches the sinks exactly once). A call that
        raises or times out goes to ``on_error``."""
        operator = factories.async_map_operator(uid, fn, capacity, timeout_ms, ordered)
        return self._add(operator, uid=uid, name=name or "async_map", parallelism=parallelism, on_error=on_error)

    def filter(
        self,
        fn: Callable[[Any], bool],
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        operator = factories.filter_operator(fn)
        return self._add(operator, uid=uid, name=name or "filter", parallelism=parallelism, on_error=on_error)

    def flat_map(
        self,
        fn: Callable[[Any], Iterable[Any]],
        *,
        uid: str,
        name: str | None = None,
        parallelism: int | None = None,
        on_error: OnRecordError | None = None,
    ) -> DataStream:
        operator = factories.flat_map_operator(fn)
        return self._add(operator, uid=uid, name=name or "flat_map", parallelism=parallelism, on_error=on_error)

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
        operator = factories.process_operator(uid, fn)
        return self._add(operator, uid=uid, name=name or "process", parallelism=parallelism, on_error=on_error)

    def key_by(self, key: KeySelector) -> KeyedStream:
        """Partition by key: a function of the record, or a field name (``record[name]``)."""
        return KeyedStream(self._graph, self._t, key_selector(key), self._side_output)

    def rebalance(self) -> DataStream:
        return DataStream(self._graph, self._t, Partitioning.REBALANCE, side_output=self._side_output)

    def broadcast(self) -> DataStream:
        return DataStream(self._graph, self._t, Partitioning.BROADCAST, side_output=self._side_output)

    def union(self, *others: DataStream, uid: str, parallelism: int | None = None) -> DataStream:
        """Merge streams of the same type into one (an identity operator with several inputs)."""
        operator = factories.union_operator()
        return self._add(operator, uid=uid, name="union", parallelism=parallelism, inputs=(self, *others))

    def connect(self, other: DataStream) -> ConnectedStreams:
        return ConnectedStreams(self, other)

    def join(self, other: DataStream) -> JoinedStreams:
        """A window join with ``other``: ``.where(key).equal_to(other_key).window(assigner).apply(fn)``."""
        return JoinedStreams(self, other)

    def _add_sink(
        self, sink: Sink, *, uid: str, name: str | None, parallelism: int | None, on_error: OnRecordError | None
    ) -> None:
        self._add(
            sink.operator(),
            kind=OperatorKind.SINK,
            uid=uid,
            name=name or sink.default_name(),
            parallelism=parallelism,
            on_error=on_error,
            sink_spec=sink.descriptor(),
        )


class KeyedStream(DataStream):
    """A stream partitioned by key: each key's values reach one subtask, in order per input."""

    def __init__(
        self,
        graph: GraphBuilder,
        transformation: Transformation,
        key: Callable[[Any], Any],
        side_output: OutputTag | None = None,
    ) -> None:
        super().__init__(graph, transformation, Partitioning.HASH, key, side_output)

    @property
    def _key(self) -> Callable[[Any], Any]:
        assert self._key_selector is not None  # a keyed stream always has one
        return self._key_selector

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
        ks, schema = self._key, state_schema(uid, REDUCE_STATE, fn, state_version, migrate)
        operator = factories.reduce_operator(fn, ks, schema)
        return self._add(
            operator, uid=uid, name=name or "reduce", parallelism=parallelism, on_error=on_error, key_selector=ks
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
        ks, schemas = self._key, process_state_schemas(uid, fn, state_schemas)
        operator = factories.keyed_process_operator(fn, ks, schemas)
        return self._add(
            operator, uid=uid, name=name or "process", parallelism=parallelism, on_error=on_error, key_selector=ks
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

    def _records_for_window(self) -> KeyedStream:
        """The keyed stream of records a (non-vectorized) window operator reads."""
        return self

    def _vectorized_window(
        self,
        fn: BuiltinAggregates,
        schema: StateSchema,
        assigner: TumblingEventTimeWindows | SlidingEventTimeWindows,
        lateness: int,
        late_data: OutputTag | None,
        *,
        uid: str,
        name: str,
        parallelism: int | None,
        on_error: OnRecordError | None,
    ) -> DataStream | None:
        """The window of built-in aggregates computed on record batches (``weir.api.columnar``);
        None: this stream is not columnar."""
        return None


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
        lateness = millis("allowed_lateness_ms", allowed_lateness_ms)
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

        Built-in aggregates by result name (``{"n": Count(), "total": Sum("amount")}``) over event-time
        windows that do not merge are computed on record batches on a columnar stream (no user
        function there, so no ``on_error``). Session windows merge accumulators: ``fn`` needs ``merge(a, b) -> acc``."""
        builtin = isinstance(fn, Mapping)
        if isinstance(fn, Mapping):  # built-in aggregates by result name
            ks = self._keyed._key
            fn = BuiltinAggregates(fn, ks.field if isinstance(ks, FieldKey) else "key")
        schema = state_schema(uid, WINDOW_STATE, fn, state_version, migrate)
        name = name or "window-aggregate"
        if (
            isinstance(fn, BuiltinAggregates)
            and builtin
            and window_function is None
            and isinstance(self._assigner, TumblingEventTimeWindows | SlidingEventTimeWindows)
        ):
            vectorized = self._keyed._vectorized_window(
                fn,
                schema,
                self._assigner,
                self._lateness,
                self._late_data,
                uid=uid,
                name=name,
                parallelism=parallelism,
                on_error=on_error,
            )
            if vectorized is not None:
                return vectorized
        wrapped = None if window_function is None else ProcessResult(process_window_function(uid, window_function))
        return self._window(fn, schema, wrapped, uid=uid, name=name, parallelism=parallelism, on_error=on_error)

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
        wrapped = None if window_function is None else ProcessResult(process_window_function(uid, window_function))
        schema = state_schema(uid, WINDOW_STATE, fn, state_version, migrate)
        return self._window(
            ReduceAggregate(fn),
            schema,
            wrapped,
            uid=uid,
            name=name or "window-reduce",
            parallelism=parallelism,
            on_error=on_error,
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
        wrapped = ProcessElements(process_window_function(uid, fn))
        schema = state_schema(uid, WINDOW_STATE, fn, state_version, migrate)
        return self._window(
            ElementList(),
            schema,
            wrapped,
            uid=uid,
            name=name or "window-process",
            parallelism=parallelism,
            on_error=on_error,
        )

    def _window(
        self,
        fn: Any,
        schema: StateSchema,
        wrapped: ProcessResult | ProcessElements | None,
        *,
        uid: str,
        name: str,
        parallelism: int | None,
        on_error: OnRecordError | None,
    ) -> DataStream:
        """The window operator over records (a columnar keyed stream's converted first)."""
        keyed = self._keyed._records_for_window()
        late_data = self._late_data
        operator = factories.window_operator(
            uid, fn, keyed._key, self._assigner, self._lateness, schema, wrapped, late_data
        )
        return keyed._add(
            operator,
            uid=uid,
            name=name,
            parallelism=parallelism,
            on_error=on_error,
            key_selector=keyed._key,
            side_outputs=() if late_data is None else (late_data,),
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
        fn: CoProcessFunction | KeyedCoProcessFunction | BroadcastProcessFunction | KeyedBroadcastProcessFunction,
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
        first, second = self._first, self._second
        if isinstance(fn, BroadcastProcessFunction | KeyedBroadcastProcessFunction):
            return _broadcast_process(first, second, fn, uid, name, parallelism, state_schemas, on_error)
        if isinstance(fn, KeyedCoProcessFunction):
            keys = _two_keys(uid, first, second)
            schemas = process_state_schemas(uid, fn, state_schemas)
            operator = factories.keyed_co_process_operator(fn, keys, schemas)
            return _keyed_two_input(first, second, operator, uid, name or "keyed-co-process", parallelism, on_error)
        if state_schemas is not None:
            raise JobDefinitionError(f"operator {uid!r}: state_schemas needs a KeyedCoProcessFunction")
        return first._add(
            factories.co_process_operator(fn),
            kind=OperatorKind.TWO_INPUT,
            uid=uid,
            name=name or "co-process",
            parallelism=parallelism,
            on_error=on_error,
            inputs=(first, second),
            key_selector=first._key_selector if first._partitioning is Partitioning.HASH else None,
        )


# Joins ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JoinedStreams:
    """``a.join(b)``: say each stream's key (``where``, ``equal_to``), then the windows (Flink's JoinedStreams)."""

    first: DataStream
    second: DataStream

    def where(self, key: KeySelector) -> JoinWhere:
        """The first stream's key."""
        return JoinWhere(self.first, self.second, key_selector(key))


@dataclass(frozen=True)
class JoinWhere:
    """``a.join(b).where(key)``: the second stream's key next."""

    first: DataStream
    second: DataStream
    first_key: Callable[[Any], Any]

    def equal_to(self, key: KeySelector) -> JoinEqualTo:
        """The second stream's key: records join where the two keys are equal values."""
        return JoinEqualTo(self.first, self.second, self.first_key, key_selector(key))


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
        operator = factories.window_join_operator(uid, fn, self.assigner, (self.first_key, self.second_key))
        first, second = self.first.key_by(self.first_key), self.second.key_by(self.second_key)
        return _keyed_two_input(first, second, operator, uid, name or "window-join", parallelism, on_error)


@dataclass(frozen=True)
class IntervalJoin:
    """``a.key_by(ka).interval_join(b.key_by(kb))``: the interval next (``between``)."""

    first: KeyedStream
    second: KeyedStream

    def between(self, lower: Duration, upper: Duration) -> IntervalJoined:
        """Pair a first-stream record at ``t`` with the second stream's at ``[t + lower, t + upper]``
        (ms or timedelta, negative allowed; both bounds inclusive unless made exclusive)."""
        return IntervalJoined(self.first, self.second, *factories.interval_bounds(lower, upper))


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
        bounds, exclusive = (self.lower_ms, self.upper_ms), (self.lower_is_exclusive, self.upper_is_exclusive)
        keys = _two_keys(uid, self.first, self.second)
        operator = factories.interval_join_operator(uid, fn, bounds, exclusive, keys)
        return _keyed_two_input(self.first, self.second, operator, uid, name or "interval-join", parallelism, on_error)


def _two_keys(uid: str, first: DataStream, second: DataStream) -> factories.Keys:
    """The keys of two keyed streams, or a JobDefinitionError naming the operator."""
    if not isinstance(first, KeyedStream) or not isinstance(second, KeyedStream):
        raise JobDefinitionError(
            f"operator {uid!r}: a keyed two-input operator needs both streams keyed: "
            "a.connect(b).key_by(key_a, key_b) or a.key_by(key_a).connect(b.key_by(key_b))"
        )
    return first._key, second._key


def _broadcast_process(
    first: DataStream,
    second: DataStream,
    fn: BroadcastProcessFunction | KeyedBroadcastProcessFunction,
    uid: str,
    name: str | None,
    parallelism: int | None,
    state_schemas: Iterable[StateSchema] | None,
    on_error: OnRecordError | None,
) -> DataStream:
    """The broadcast state pattern: ``second`` must be a ``broadcast()`` stream; with a
    KeyedBroadcastProcessFunction ``first`` must be keyed."""
    if second._partitioning is not Partitioning.BROADCAST:
        raise JobDefinitionError(
            f"operator {uid!r}: a {type(fn).__name__} takes a broadcast stream as connect's argument: "
            "a.connect(rules.broadcast())"
        )
    if isinstance(fn, KeyedBroadcastProcessFunction):
        if first._partitioning is not Partitioning.HASH or first._key_selector is None:
            raise JobDefinitionError(
                f"operator {uid!r}: a KeyedBroadcastProcessFunction needs a keyed stream: "
                "a.key_by(k).connect(b.broadcast())"
            )
        schemas = process_state_schemas(uid, fn, state_schemas)
        operator = factories.keyed_broadcast_process_operator(fn, first._key_selector, schemas)
        return _keyed_two_input(first, second, operator, uid, name or "keyed-broadcast-process", parallelism, on_error)
    if state_schemas is not None:
        raise JobDefinitionError(f"operator {uid!r}: state_schemas needs a KeyedBroadcastProcessFunction")
    return first._add(
        factories.broadcast_process_operator(fn),
        kind=OperatorKind.TWO_INPUT,
        uid=uid,
        name=name or "broadcast-process",
        parallelism=parallelism,
        on_error=on_error,
        inputs=(first, second),
    )


def _keyed_two_input(
    first: DataStream,
    second: DataStream,
    operator: OperatorFactory,
    uid: str,
    name: str,
    parallelism: int | None,
    on_error: OnRecordError | None,
) -> DataStream:
    """A keyed two-input operator fed by both streams, each hash-partitioned by its own key; a record
    either key selector raises on where the key is taken is handled by ``on_error`` (else the job's)."""
    return first._add(
        operator,
        kind=OperatorKind.TWO_INPUT,
        uid=uid,
        name=name,
        parallelism=parallelism,
        on_error=on_error,
        inputs=(first, second),
        key_selector=first._key_selector,
    )


__all__ = [
    "ConnectedStreams",
    "DataStream",
    "IntervalJoin",
    "IntervalJoined",
    "JoinEqualTo",
    "JoinWhere",
    "JoinedStreams",
    "KeyedStream",
    "WindowAssigner",
    "WindowedJoin",
    "WindowedStream",
]
