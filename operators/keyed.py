"""Keyed operators: state per key in the subtask's ``KeyedStateBackend`` (``weir.core.state_backend``),
addressed by the key's key group and laid out by ``weir.core.state_layout``; the
KeyedProcessFunction's operator with its timers (``weir.operators.timers``) and state kinds
(``weir.operators.process_state``), and the KeyedCoProcessFunction's, the same over two keyed inputs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar, assert_never, runtime_checkable

from weir.core.errors import JobDefinitionError, WeirError
from weir.core.key_samples import (
    KEY_REPR_CHARS,
    KEY_SAMPLE_STATE,
    SAMPLES_AT_OPEN,
    SAMPLES_PER_INTERVAL,
    KeySample,
    key_function_fingerprint,
    sample_slot,
)
from weir.core.keygroups import KeyEncoder
from weir.core.process_functions import (
    Clock,
    Millis,
    OutputTag,
    ReduceFunction,
    StateAggregateFunction,
    StateTtlConfig,
    TimeDomain,
    to_millis,
    wall_clock_ms,
)
from weir.core.rejections import FAIL, OnRecordError, TimerFiring
from weir.core.state_backend import KeyedStateStore
from weir.core.state_layout import REDUCE_STATE, TIMER_STATES, dump_value, is_state_name
from weir.core.state_schema import StateSchema, StateSchemaError, StoredSchema, required_migrations
from weir.core.watermarks import MIN_WATERMARK
from weir.operators.base import StreamOperator, check_output_tag
from weir.operators.basic import _TimestampedCollector
from weir.operators.process_state import (
    AggregatingState,
    KeyedState,
    ListState,
    MapEntry,
    MapState,
    ReducingState,
    Ttl,
    TtlValue,
    ValueState,
    drop_expired,
)
from weir.operators.timers import TimerQueue

S = TypeVar("S", bound=KeyedState)


class KeyedOperator(StreamOperator):
    """Sets the current key (bytes, key group, length-prefixed bytes) for each record before the
    subclass sees it; a :class:`KeyEncoder` remembers the encodings of keys seen before.

    ``state_schemas``: the schema of each of its states (``weir.core.state_schema``); a state not
    named is version 1 pickle. They travel with every snapshot; a restore of older versions is told
    (:meth:`migrate_from`) and the restored values are migrated once, when the operator opens."""

    store: KeyedStateStore
    """This operator's state in the subtask, from :meth:`open` on."""

    def __init__(self, key_selector: Callable[[Any], Any], state_schemas: Iterable[StateSchema] = ()) -> None:
        self._key_selector = key_selector
        self._state_schemas = {s.name: s for s in state_schemas}
        self._migrations: dict[str, int] = {}  # state name -> stored version, set by migrate_from
        self.current_key: Any = None
        self.current_key_bytes = b""
        self.current_key_group = 0
        self.current_key_prefix = b""  # the key bytes, length-prefixed: the start of composite state keys
        self.samples_left = 0  # records still to sample (weir.core.key_samples) before the next checkpoint
        self._fingerprints: dict[int, str] = {}

    def open(self) -> None:
        backend = self.ctx.state
        if backend is None:
            raise WeirError(
                f"keyed operator {self.ctx.uid!r} (subtask {self.ctx.subtask}) was given no keyed state backend"
            )
        self.store = backend.keyed_store(self.ctx.uid, key_groups=self.ctx.key_group_range)
        self._keys = KeyEncoder(self.ctx.max_parallelism)
        self.samples_left = SAMPLES_AT_OPEN
        self._store_restored_state()
        if self._migrations:
            self._migrate_restored_state()

    def _store_restored_state(self) -> None:
        """Keyed state restored outside the store (in the operator's own state, read by
        ``restore_state``) written into it, before migrations read the store; none by default."""

    def state_schemas(self) -> tuple[StateSchema, ...]:
        """The declared schema of each state, by name order: what snapshots record."""
        return tuple(self._state_schemas[name] for name in sorted(self._state_schemas))

    def migrate_from(self, stored: Mapping[str, StoredSchema]) -> None:
        """The keyed state about to be restored was written with ``stored`` (by state name; one not
        named: version 1 pickle). Raises StateSchemaError when a state cannot be read; else the states
        of older versions are migrated when the operator opens, before the first record."""
        self._migrations = required_migrations(self.ctx.uid, stored, self.state_schemas())

    def migrate_value(self, schema: StateSchema, stored_version: int, value: Any) -> Any:
        """One restored value of state ``schema.name`` as the declared version's. An operator whose
        entries wrap the user's value (a window's ``(key, accumulator)``) overrides this."""
        assert schema.migrate is not None
        return schema.migrate(stored_version, value)

    def _migrate_restored_state(self) -> None:
        """Rewrite every restored entry of each state to migrate through ``migrate_value``, one key
        group at a time, so that no read at run time pays for it."""
        uid, store = self.ctx.uid, self.store
        for name, stored_version in sorted(self._migrations.items()):
            schema = self._state_schemas[name]
            what = f"operator {uid!r} state {name!r}"
            entries = 0
            for kg in self.ctx.key_group_range:
                try:
                    restored = list(store.items(name, kg))
                except Exception as exc:  # pickle.loads: a class the values name is gone or changed
                    raise StateSchemaError(
                        f"{what}: the {schema.serializer} serializer cannot read a value stored at version "
                        f"{stored_version}: {type(exc).__name__}: {exc}; restore it with the code that wrote it"
                    ) from exc
                for key, value in restored:
                    try:
                        migrated = self.migrate_value(schema, stored_version, value)
                    except Exception as exc:
                        raise StateSchemaError(
                            f"{what}: migrate from version {stored_version} to {schema.version} failed on a "
                            f"restored value: {type(exc).__name__}: {exc}; fix the migration"
                        ) from exc
                    store.put(name, kg, key, migrated)
                store.flush()
                entries += len(restored)
            self.ctx.log.info(
                "keyed_state_migrated",
                state=name,
                from_version=stored_version,
                to_version=schema.version,
                entries=entries,
            )
        self._migrations = {}

    def key_selector_of(self, input_index: int) -> Callable[[Any], Any]:
        """The key function of input ``input_index`` (a one-input operator has one)."""
        return self._key_selector

    def set_current_key(self, value: Any) -> None:
        """Make the key of record ``value`` the current key."""
        self.switch_to_key(self._key_selector(value))
        if self.samples_left:
            self.sample_key(0, value)

    def sample_key(self, input_index: int, value: Any) -> None:
        """Keep record ``value`` of input ``input_index``, keyed to the current key, as a key sample
        (``weir.core.key_samples``); called for the first records after each checkpoint only. A
        record that does not pickle is not sampled (its state would fail first, if it is kept)."""
        self.samples_left -= 1
        try:
            record = dump_value(value)
        except Exception:  # not picklable: nothing to sample
            return
        fingerprint = self._fingerprints.get(input_index)
        if fingerprint is None:
            fingerprint = self._fingerprints[input_index] = key_function_fingerprint(self.key_selector_of(input_index))
        kb = self.current_key_bytes
        sample = KeySample(input_index, fingerprint, kb, repr(self.current_key)[:KEY_REPR_CHARS], record)
        self.store.put(KEY_SAMPLE_STATE, self.current_key_group, sample_slot(kb), sample.to_stored())

    def switch_to_key(self, key: Any) -> None:
        """Make ``key`` the current key (a timer's key, when it fires)."""
        self.current_key = key
        self.current_key_bytes, self.current_key_group, self.current_key_prefix = self._keys.encode(key)

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self.store.flush()
        self.samples_left = SAMPLES_PER_INTERVAL
        return None

    def end_input(self) -> None:
        self.store.flush()


class ReduceOperator(KeyedOperator):
    def __init__(
        self,
        fn: Callable[[Any, Any], Any],
        key_selector: Callable[[Any], Any],
        state_schema: StateSchema | None = None,
        *,
        on_error: OnRecordError = FAIL,
    ) -> None:
        super().__init__(key_selector, [state_schema or StateSchema(REDUCE_STATE)])
        self.on_error = on_error
        if self.state_schemas()[0].name != REDUCE_STATE:
            raise ValueError(f"a reduce's state is named {REDUCE_STATE!r}, not {self.state_schemas()[0].name!r}")
        self._fn = fn

    def process(self, value: Any, timestamp: int | None) -> None:
        try:
            self.set_current_key(value)
        except Exception as exc:
            self.reject(self._key_selector, exc, value, timestamp)
            return
        kg, kb = self.current_key_group, self.current_key_bytes
        previous = self.store.get(REDUCE_STATE, kg, kb)
        if previous is None:
            result = value
        else:
            try:
                result = self._fn(previous, value)
            except Exception as exc:
                self.reject(self._fn, exc, value, timestamp, self.current_key)
                return
        self.store.put(REDUCE_STATE, kg, kb, result)
        self.output.emit(result, timestamp)


class TimerService:
    """``ctx.timer_service()``: the timers of the current key, the watermark and the processing time.

    A timer is one per key, time and domain: registering it again changes nothing, deleting one that
    does not exist does nothing. Times are epoch milliseconds (an int, or a ``timedelta`` since the
    epoch). An event-time timer fires once the watermark reaches its time, a processing-time timer
    once the wall clock does; one whose time has passed already fires at the next watermark (event
    time) or as soon as the task gets to it (processing time)."""

    __slots__ = ("_op",)

    def __init__(self, op: KeyedProcessOperator) -> None:
        self._op = op

    def register_event_time_timer(self, time: Millis) -> None:
        op = self._op
        op.event_timers.register(
            op.current_key, op.current_key_group, op.current_key_prefix, to_millis(time, "a timer's time")
        )

    def delete_event_time_timer(self, time: Millis) -> None:
        op = self._op
        op.event_timers.delete(op.current_key_group, op.current_key_prefix, to_millis(time, "a timer's time"))

    def register_processing_time_timer(self, time: Millis) -> None:
        op = self._op
        op.processing_timers.register(
            op.current_key, op.current_key_group, op.current_key_prefix, to_millis(time, "a timer's time")
        )

    def delete_processing_time_timer(self, time: Millis) -> None:
        op = self._op
        op.processing_timers.delete(op.current_key_group, op.current_key_prefix, to_millis(time, "a timer's time"))

    def current_watermark(self) -> int:
        """The last watermark the operator received (MIN_WATERMARK before the first)."""
        return self._op.watermark

    def current_processing_time(self) -> int:
        """The processing time now, in epoch ms (the operator's clock)."""
        return self._op.clock()


class KeyedProcessContext:
    """What a KeyedProcessFunction sees in ``process_element`` (and ``open``): the current key, the
    record's timestamp (``timestamp``, None for a record without one), the timer service, the key's
    state of every kind and the operator's side outputs (:meth:`output`).

    A state is named once per kind: asking for a name as another kind, or with another TTL, raises
    JobDefinitionError. ``ttl`` (a :class:`StateTtlConfig`) makes the state's values expire."""

    def __init__(self, op: KeyedProcessOperator) -> None:
        self._op = op
        self._timers = TimerService(op)
        self.timestamp: int | None = None

    @property
    def key(self) -> Any:
        return self._op.current_key

    def timer_service(self) -> TimerService:
        return self._timers

    def output(self, tag: OutputTag, value: Any) -> None:
        """Emit ``value`` to side output ``tag``, stamped as ``out.collect`` stamps (the record's
        timestamp; in ``on_timer`` an event-time timer's time, none for a processing-time timer);
        dropped when nothing takes that side output."""
        op = self._op
        op.side_outputs.emit(check_output_tag(op.ctx.uid, tag), value, op.current_timestamp)

    def value_state(self, name: str, ttl: StateTtlConfig | None = None) -> ValueState:
        return self._op.state(name, ValueState, ttl, lambda t: ValueState(self._op, name, t))

    def list_state(self, name: str, ttl: StateTtlConfig | None = None) -> ListState:
        return self._op.state(name, ListState, ttl, lambda t: ListState(self._op, name, t))

    def map_state(self, name: str, ttl: StateTtlConfig | None = None) -> MapState:
        return self._op.state(name, MapState, ttl, lambda t: MapState(self._op, name, t))

    def reducing_state(self, name: str, reduce: ReduceFunction, ttl: StateTtlConfig | None = None) -> ReducingState:
        """Values folded with ``reduce(accumulated, value)``; the first function given for a name is kept."""
        return self._op.state(name, ReducingState, ttl, lambda t: ReducingState(self._op, name, t, reduce))

    def aggregating_state(
        self, name: str, aggregate: StateAggregateFunction, ttl: StateTtlConfig | None = None
    ) -> AggregatingState:
        """Values added into ``aggregate``'s accumulator; the first function given for a name is kept."""
        return self._op.state(name, AggregatingState, ttl, lambda t: AggregatingState(self._op, name, t, aggregate))


class OnTimerContext(KeyedProcessContext):
    """What a KeyedProcessFunction sees in ``on_timer``: the timer's key as the current key, its
    time as ``timestamp``, and which kind of timer fired (:meth:`time_domain`)."""

    def __init__(self, op: KeyedProcessOperator) -> None:
        super().__init__(op)
        self.domain = TimeDomain.EVENT_TIME

    def time_domain(self) -> TimeDomain:
        return self.domain


@runtime_checkable
class ReadsProcessingTime(Protocol):
    """An operator whose processing time (epoch ms: timers, state TTL, a mini-batch's deadline) is its
    ``clock``; a harness that drives time itself (``weir test``) replaces it. Structural, so that the
    harness need not import every such operator's module (the SQL one's imports the SQL parser)."""

    clock: Clock


class KeyedProcessOperator(KeyedOperator):
    """Runs a KeyedProcessFunction: ``process_element(value, ctx, out)`` per record and
    ``on_timer(timestamp, ctx, out)`` per timer that fires.

    Event-time timers due at a watermark fire in time order before the watermark is forwarded, their
    output stamped with the timer's time; processing-time timers fire when the task calls
    :meth:`on_processing_time`, their output without a timestamp (as in Flink). ``clock`` is the
    processing time (epoch ms) the timer service and the states' TTL read."""

    def __init__(
        self,
        fn: Any,
        key_selector: Callable[[Any], Any],
        state_schemas: Iterable[StateSchema] = (),
        clock: Clock = wall_clock_ms,
        *,
        on_error: OnRecordError = FAIL,
    ) -> None:
        super().__init__(key_selector, state_schemas)
        self.on_error = on_error
        reserved = TIMER_STATES & set(self._state_schemas)
        if reserved:
            raise JobDefinitionError(f"state names {sorted(reserved)} are reserved for timers")
        self._fn = fn
        self.clock = clock
        self.watermark = MIN_WATERMARK
        self._states: dict[str, KeyedState] = {}

    def open(self) -> None:
        super().open()
        self.event_timers = TimerQueue(self.store, TimeDomain.EVENT_TIME)
        self.processing_timers = TimerQueue(self.store, TimeDomain.PROCESSING_TIME)
        self.event_timers.rebuild(self.ctx.key_group_range)
        self.processing_timers.rebuild(self.ctx.key_group_range)
        self._process_ctx = KeyedProcessContext(self)
        self._timer_ctx = OnTimerContext(self)
        self._out = _TimestampedCollector(self.output.emit)
        self._on_timer = getattr(self._fn, "on_timer", None)
        open_fn = getattr(self._fn, "open", None)
        if callable(open_fn):
            open_fn(self._process_ctx)

    def state(
        self,
        name: str,
        kind: type[S],
        ttl: StateTtlConfig | None,
        build: Callable[[Ttl | None], S],
    ) -> S:
        """State ``name`` as ``kind``, built on first use; the same name asked as another kind or
        with another TTL is a JobDefinitionError."""
        known = self._states.get(name)
        if known is None:
            if not is_state_name(name):
                raise JobDefinitionError(f"a state name must be a non-empty string without NUL, got {name!r}")
            if name in TIMER_STATES:
                raise JobDefinitionError(f"state name {name!r} is reserved for timers")
            if ttl is not None and not isinstance(ttl, StateTtlConfig):
                raise JobDefinitionError(f"state {name!r}: ttl must be a StateTtlConfig, got {ttl!r}")
            built = build(None if ttl is None else Ttl(ttl, self.clock))
            self._states[name] = built
            return built
        known_ttl = None if known.ttl is None else known.ttl.config
        if type(known) is not kind or known_ttl != ttl:
            raise JobDefinitionError(
                f"operator {self.ctx.uid!r}: state {name!r} is a {type(known).__name__} with ttl {known_ttl}, "
                f"asked for as a {kind.__name__} with ttl {ttl}: give each state one kind and one ttl"
            )
        assert isinstance(known, kind)
        return known

    def migrate_value(self, schema: StateSchema, stored_version: int, value: Any) -> Any:
        """The user's value is migrated inside its TTL wrapper and its map entry."""
        match value:
            case TtlValue(value=inner, last_access_ms=last_access):
                return TtlValue(self.migrate_value(schema, stored_version, inner), last_access)
            case MapEntry(key=user_key, value=inner):
                return MapEntry(user_key, super().migrate_value(schema, stored_version, inner))
            case _:
                return super().migrate_value(schema, stored_version, value)

    @property
    def current_timestamp(self) -> int | None:
        """What the function's output is stamped with now (the record's or the timer's timestamp)."""
        return self._out.timestamp

    def process(self, value: Any, timestamp: int | None) -> None:
        try:
            self.set_current_key(value)
        except Exception as exc:
            self.reject(self._key_selector, exc, value, timestamp)
            return
        self._process_ctx.timestamp = timestamp
        self._out.timestamp = timestamp
        try:
            self._fn.process_element(value, self._process_ctx, self._out)
        except Exception as exc:  # state it wrote before raising stays written, as in Flink
            self.reject(self._fn.process_element, exc, value, timestamp, self.current_key)

    def process_watermark(self, watermark: int) -> None:
        if watermark > self.watermark:
            self.watermark = watermark
            self._fire(self.event_timers, watermark)
        self.output.emit_watermark(watermark)

    def next_processing_time(self) -> int | None:
        return self.processing_timers.next_time()

    def on_processing_time(self, now_ms: int) -> None:
        self._fire(self.processing_timers, now_ms)

    def _fire(self, timers: TimerQueue, time: int) -> None:
        """Fire the timers of ``timers`` due at ``time``, in time order. A timer whose ``on_timer``
        raises is handled by :attr:`on_error` as a :class:`TimerFiring` (its key, time and domain;
        no source position): dead-lettered, the next timers fire."""
        ctx, out, on_timer = self._timer_ctx, self._out, self._on_timer
        ctx.domain = timers.domain
        for when, key in timers.pop_due(time):
            self.switch_to_key(key)
            ctx.timestamp = when
            match timers.domain:
                case TimeDomain.EVENT_TIME:
                    out.timestamp = when
                case TimeDomain.PROCESSING_TIME:
                    out.timestamp = None
                case _:
                    assert_never(timers.domain)
            if on_timer is not None:
                try:
                    on_timer(when, ctx, out)
                except Exception as exc:  # state it wrote before raising stays written, as in Flink
                    self.reject(on_timer, exc, None, None, key, firing=TimerFiring(when, timers.domain))

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        """Remove the expired values of every state with a TTL, then flush the store."""
        for name, state in self._states.items():
            if state.ttl is not None:
                drop_expired(self.store, name, self.ctx.key_group_range, state.ttl)
        return super().snapshot_state(checkpoint_id)


class KeyedCoProcessOperator(KeyedProcessOperator):
    """Runs a KeyedCoProcessFunction over two keyed inputs (Flink's KeyedCoProcessOperator):
    ``process_element1(value, ctx, out)`` per record of the first input, ``process_element2`` per
    record of the second, ``on_timer(timestamp, ctx, out)`` per timer that fires.

    ``key_selectors`` are the keys of the first and the second input; a record either key selector
    or ``process_element1/2`` raises on is handled by ``on_error`` (as a one-input operator's). Both
    inputs share the state, the timers and the key encoding of :class:`KeyedProcessOperator`: a key
    is one key whichever input it comes from, so equal keys of both inputs reach the same key group
    (and subtask), and one input's record sees what the other input's records of its key stored. The
    watermark is the minimum of both inputs' (the task's input valve combines them before
    :meth:`process_watermark`)."""

    def __init__(
        self,
        fn: Any,
        key_selectors: tuple[Callable[[Any], Any], Callable[[Any], Any]],
        state_schemas: Iterable[StateSchema] = (),
        clock: Clock = wall_clock_ms,
        *,
        on_error: OnRecordError = FAIL,
    ) -> None:
        first, second = key_selectors
        super().__init__(fn, first, state_schemas, clock, on_error=on_error)
        self._key_selectors = (first, second)

    def key_selector_of(self, input_index: int) -> Callable[[Any], Any]:
        return self._key_selectors[input_index]

    def open(self) -> None:
        super().open()
        self._elements = (self._fn.process_element1, self._fn.process_element2)

    def process_input(self, input_index: int, value: Any, timestamp: int | None) -> None:
        if input_index not in (0, 1):
            raise ValueError(f"a two-input operator has inputs 0 and 1, not {input_index}")
        key_selector = self._key_selectors[input_index]
        try:
            self.switch_to_key(key_selector(value))
        except Exception as exc:
            self.reject(key_selector, exc, value, timestamp)
            return
        if self.samples_left:
            self.sample_key(input_index, value)
        self._process_ctx.timestamp = timestamp
        self._out.timestamp = timestamp
        process_element = self._elements[input_index]
        try:
            process_element(value, self._process_ctx, self._out)
        except Exception as exc:  # state it wrote before raising stays written, as in Flink
            self.reject(process_element, exc, value, timestamp, self.current_key)

    def process(self, value: Any, timestamp: int | None) -> None:
        self.process_input(0, value, timestamp)
