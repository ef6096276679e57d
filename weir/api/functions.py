"""The functions a job implements (Flink's ``ProcessFunction``, ``KeyedProcessFunction``,
``ProcessWindowFunction``, ``AggregateFunction``, ``CoProcessFunction``, ``KeyedCoProcessFunction``,
``ProcessJoinFunction``): base classes to override, and the protocols the stream methods take."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from weir.core.windows import WindowContext
from weir.operators.basic import ProcessContext
from weir.operators.broadcast import BroadcastContext, KeyedReadOnlyContext, KeyedReadOnlyTimerContext, ReadOnlyContext
from weir.operators.joins import JoinContext
from weir.operators.keyed import KeyedProcessContext, OnTimerContext

T = TypeVar("T", contravariant=True)  # an aggregate only takes values in
ACC = TypeVar("ACC")


class AggregateFunction(Protocol[T, ACC]):
    """Incremental window aggregation, as Flink's AggregateFunction."""

    def create(self) -> ACC: ...
    def add(self, acc: ACC, value: T) -> ACC: ...
    def result(self, key: Any, window_start: int, window_end: int, acc: ACC) -> Any: ...

    # Optional: ``merge(a, b) -> acc``, the accumulator of two windows' values (session windows need it).
    # Optional: the accumulator's version (default 1) and ``migrate(stored_version, acc) -> acc``,
    # read when ``.aggregate`` is given neither ``state_version`` nor ``migrate``.


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


class BroadcastProcessFunction:
    """A stream and a broadcast stream (Flink's BroadcastProcessFunction, the broadcast state
    pattern): ``a.connect(rules.broadcast()).process(fn, uid=...)``. Every subtask gets every record
    of the broadcast stream in ``process_broadcast_element(value, ctx, out)``, where
    ``ctx.broadcast_state(name)`` is a map (``get``, ``put``, ``remove``, ``items``, ...) it writes;
    ``process_element(value, ctx, out)`` gets its share of the other stream and reads the broadcast
    state (a write raises there: every subtask must hold the same). Each subtask checkpoints its
    own copy of the broadcast state; it is restored at any parallelism (docs/api.md). With a
    broadcast input of parallelism above 1 the subtasks get the rules in different orders: the
    function must not depend on their order then."""

    def process_element(self, value: Any, ctx: ReadOnlyContext, out: Collector) -> None:
        raise NotImplementedError("a BroadcastProcessFunction must override process_element")

    def process_broadcast_element(self, value: Any, ctx: BroadcastContext, out: Collector) -> None:
        raise NotImplementedError("a BroadcastProcessFunction must override process_broadcast_element")


class KeyedBroadcastProcessFunction:
    """A keyed stream and a broadcast stream (Flink's KeyedBroadcastProcessFunction):
    ``a.key_by(k).connect(rules.broadcast()).process(fn, uid=...)``. ``process_element`` has the
    key's state and timers as a :class:`KeyedProcessFunction`'s, and reads
    ``ctx.broadcast_state(name)``; ``on_timer`` too; ``process_broadcast_element(value, ctx, out)``
    writes the broadcast state (it has no key)."""

    def process_element(self, value: Any, ctx: KeyedReadOnlyContext, out: Collector) -> None:
        raise NotImplementedError("a KeyedBroadcastProcessFunction must override process_element")

    def process_broadcast_element(self, value: Any, ctx: BroadcastContext, out: Collector) -> None:
        raise NotImplementedError("a KeyedBroadcastProcessFunction must override process_broadcast_element")

    def on_timer(self, timestamp: int, ctx: KeyedReadOnlyTimerContext, out: Collector) -> None:
        """A timer of ``ctx.key`` fired (see :meth:`KeyedProcessFunction.on_timer`)."""


class ProcessJoinFunction:
    """What an interval join emits for one pair (Flink's ProcessJoinFunction): override
    ``process_element``. ``ctx`` (a :class:`JoinContext`) has ``left_timestamp``,
    ``right_timestamp`` and ``timestamp`` (the later one, what ``out.collect`` stamps by default)."""

    def process_element(self, left: Any, right: Any, ctx: JoinContext, out: Collector) -> None:
        raise NotImplementedError("a ProcessJoinFunction must override process_element")


JoinFunction = Callable[[Any, Any], Any]
"""A window join's ``fn(first, second) -> value`` (or an object with such a ``join`` method)."""


__all__ = [
    "AggregateFunction",
    "CoProcessFunction",
    "Collector",
    "JoinFunction",
    "KeyedCoProcessFunction",
    "KeyedProcessFunction",
    "ProcessFunction",
    "ProcessJoinFunction",
    "ProcessWindowFunction",
]
