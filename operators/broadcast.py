"""Broadcast state: rules or configuration that every subtask holds the same, after Flink's
``BroadcastProcessFunction`` / ``KeyedBroadcastProcessFunction`` (the broadcast state pattern).

``events.connect(rules.broadcast()).process(fn)``: every subtask of the operator gets every record of
the broadcast input (``process_broadcast_element(value, ctx, out)``, where ``ctx.broadcast_state(name)``
is a map it may write) and its own share of the other input (``process_element(value, ctx, out)``,
where the broadcast state is read only: a write raises). Since only the broadcast side writes, and
every subtask sees the same broadcast records (in the same order when the broadcast input has one
channel), every subtask's broadcast state is the same once they have all processed the same records.

Checkpoints: the operators declare ``holds_broadcast_state``, so the TaskManager stores each
subtask's copy as a content-addressed object (``weir.core.broadcast_state``): subtasks whose copies
are the same share one object, so an aligned checkpoint stores the state once; a restart restores
each subtask from the copy it wrote. One copy for all would not do: an unaligned barrier overtakes the
records queued before it, so at a checkpoint subtask 0 may have applied a rule still queued at subtask
1 (in its channel state, replayed to it alone after a restore); there the distinct copies are stored
once each. Restored at another parallelism, new subtask ``i`` takes old subtask ``i mod old
parallelism``'s copy: the restore refuses in-flight records of a broadcast edge, so each copy it
accepts holds every rule before the barrier.

Keyed (``events.key_by(k).connect(rules.broadcast()).process(KeyedBroadcastProcessFunction)``): the
element side has its key's state and timers (``on_timer`` reads the broadcast state too); the
broadcast side has no key (Flink's ``applyToKeyedState`` is not offered).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

from weir.core.broadcast_state import inherited_copy
from weir.core.errors import JobDefinitionError, SerializationError
from weir.core.process_functions import OutputTag
from weir.core.rejections import FAIL, OnRecordError
from weir.core.serde import dumps_value, loads_value
from weir.core.state_schema import StateSchema
from weir.operators.base import InheritedState, StreamOperator, check_output_tag
from weir.operators.basic import _TimestampedCollector
from weir.operators.keyed import KeyedProcessContext, KeyedProcessOperator, OnTimerContext

STATE_FORMAT: Final = 1
"""Version of the operator state: ``(1, {name: {key: value}})``, pickled."""

BROADCAST_INPUT: Final = 1
"""The broadcast stream is the operator's second input (``connect``'s argument)."""


class BroadcastStateWriteError(JobDefinitionError):
    """A write to broadcast state outside ``process_broadcast_element``: every subtask would then
    hold another state."""


class BroadcastState:
    """One named broadcast map state: ``get``, ``put``, ``put_all``, ``contains``, ``remove``,
    ``items``, ``keys``, ``values``, ``is_empty``, ``clear`` (the API of a keyed ``MapState``)."""

    def __init__(self, name: str, entries: dict[Any, Any], writable: Callable[[], bool]) -> None:
        self._name = name
        self._entries = entries
        self._writable = writable

    def _check_writable(self) -> None:
        if not self._writable():
            raise BroadcastStateWriteError(
                f"broadcast state {self._name!r} is read only in process_element and on_timer: write it in "
                "process_broadcast_element, so that every subtask holds the same"
            )

    def get(self, key: Any) -> Any:
        return self._entries.get(key)

    def contains(self, key: Any) -> bool:
        return key in self._entries

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._entries.items())

    def keys(self) -> list[Any]:
        return list(self._entries)

    def values(self) -> list[Any]:
        return list(self._entries.values())

    def is_empty(self) -> bool:
        return not self._entries

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: Any, value: Any) -> None:
        self._check_writable()
        self._entries[key] = value

    def put_all(self, entries: Iterable[tuple[Any, Any]]) -> None:
        self._check_writable()
        self._entries.update(entries)

    def remove(self, key: Any) -> None:
        self._check_writable()
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._check_writable()
        self._entries.clear()


class BroadcastStates:
    """The operator's broadcast states by name, writable only while a broadcast record is processed."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[Any, Any]] = {}
        self.writing = False

    def state(self, name: str) -> BroadcastState:
        if not isinstance(name, str) or not name:
            raise JobDefinitionError(f"a broadcast state name must be a non-empty string, got {name!r}")
        return BroadcastState(name, self.entries.setdefault(name, {}), lambda: self.writing)

    def snapshot(self) -> bytes | None:
        states = {name: dict(entries) for name, entries in self.entries.items() if entries}
        return dumps_value((STATE_FORMAT, states)) if states else None

    def restore(self, uid: str, data: bytes) -> None:
        match loads_value(data):
            case (1, dict() as states):
                self.entries = {name: dict(entries) for name, entries in states.items()}
            case _:
                raise SerializationError(f"operator {uid!r}: broadcast state of an unknown format")

    def restore_inherited(self, uid: str, subtask: int, states: Sequence[InheritedState]) -> None:
        """Old subtask ``subtask mod old parallelism``'s copy (``weir.core.broadcast_state.inherited_copy``:
        every copy the restore accepts is the whole broadcast prefix)."""
        if not states:
            return
        old = inherited_copy(subtask, states[0].parallelism)
        for state in states:
            if state.subtask == old:
                self.restore(uid, state.data)


class BroadcastContext:
    """What ``process_broadcast_element`` sees: the record's ``timestamp``, every broadcast state to
    read and write (:meth:`broadcast_state`), side outputs (:meth:`output`)."""

    __slots__ = ("_op", "_states", "timestamp")

    def __init__(self, op: StreamOperator, states: BroadcastStates) -> None:
        self._op = op
        self._states = states
        self.timestamp: int | None = None

    def broadcast_state(self, name: str) -> BroadcastState:
        return self._states.state(name)

    def output(self, tag: OutputTag, value: Any) -> None:
        op = self._op
        op.side_outputs.emit(check_output_tag(op.ctx.uid, tag), value, self.timestamp)


class ReadOnlyContext(BroadcastContext):
    """What ``process_element`` of a :class:`BroadcastProcessFunction` sees: the same, but the
    broadcast state is read only."""

    __slots__ = ()


class BroadcastProcessOperator(StreamOperator):
    """A non-keyed stream and a broadcast one: see the module."""

    holds_broadcast_state = True

    def __init__(self, fn: Any, on_error: OnRecordError = FAIL) -> None:
        self._fn = fn
        self.on_error = on_error
        self.broadcast = BroadcastStates()

    def open(self) -> None:
        self._read_ctx = ReadOnlyContext(self, self.broadcast)
        self._write_ctx = BroadcastContext(self, self.broadcast)
        self._out = _TimestampedCollector(self.output.emit)
        open_fn = getattr(self._fn, "open", None)
        if callable(open_fn):
            open_fn(self._read_ctx)

    def process_input(self, input_index: int, value: Any, timestamp: int | None) -> None:
        self._out.timestamp = timestamp
        if input_index == BROADCAST_INPUT:
            ctx: BroadcastContext = self._write_ctx
            element = self._fn.process_broadcast_element
        else:
            ctx = self._read_ctx
            element = self._fn.process_element
        ctx.timestamp = timestamp
        self.broadcast.writing = input_index == BROADCAST_INPUT
        try:
            element(value, ctx, self._out)
        except Exception as exc:
            self.reject(element, exc, value, timestamp)
        finally:
            self.broadcast.writing = False

    def process(self, value: Any, timestamp: int | None) -> None:
        self.process_input(0, value, timestamp)

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        return self.broadcast.snapshot()

    def restore_state(self, data: bytes) -> None:
        self.broadcast.restore(self.ctx.uid, data)

    def restore_inherited_state(self, states: Sequence[InheritedState]) -> None:
        self.broadcast.restore_inherited(self.ctx.uid, self.ctx.subtask, states)


class KeyedReadOnlyContext(KeyedProcessContext):
    """``process_element`` of a :class:`KeyedBroadcastProcessFunction`: the key's state and timers,
    and the broadcast state read only."""

    def broadcast_state(self, name: str) -> BroadcastState:
        op = self._op
        assert isinstance(op, KeyedBroadcastProcessOperator)
        return op.broadcast.state(name)


class KeyedReadOnlyTimerContext(OnTimerContext):
    """``on_timer`` of a :class:`KeyedBroadcastProcessFunction`: the timer's key, and the broadcast
    state read only."""

    def broadcast_state(self, name: str) -> BroadcastState:
        op = self._op
        assert isinstance(op, KeyedBroadcastProcessOperator)
        return op.broadcast.state(name)


class KeyedBroadcastProcessOperator(KeyedProcessOperator):
    """A keyed stream and a broadcast one: see the module. The keyed side is a
    :class:`KeyedProcessOperator`'s (state, timers, key selector); the broadcast side has no key."""

    holds_broadcast_state = True

    def __init__(
        self,
        fn: Any,
        key_selector: Callable[[Any], Any],
        state_schemas: Iterable[StateSchema] = (),
        *,
        on_error: OnRecordError = FAIL,
    ) -> None:
        super().__init__(fn, key_selector, state_schemas, on_error=on_error)
        self.broadcast = BroadcastStates()

    def open(self) -> None:
        super().open()
        self._process_ctx = KeyedReadOnlyContext(self)
        self._timer_ctx = KeyedReadOnlyTimerContext(self)
        self._write_ctx = BroadcastContext(self, self.broadcast)

    def process_input(self, input_index: int, value: Any, timestamp: int | None) -> None:
        if input_index != BROADCAST_INPUT:
            self.process(value, timestamp)
            return
        self._out.timestamp = timestamp
        self._write_ctx.timestamp = timestamp
        element = self._fn.process_broadcast_element
        self.broadcast.writing = True
        try:
            element(value, self._write_ctx, self._out)
        except Exception as exc:
            self.reject(element, exc, value, timestamp)
        finally:
            self.broadcast.writing = False

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        super().snapshot_state(checkpoint_id)  # the keyed side's store flushed
        return self.broadcast.snapshot()

    def restore_state(self, data: bytes) -> None:
        self.broadcast.restore(self.ctx.uid, data)

    def restore_inherited_state(self, states: Sequence[InheritedState]) -> None:
        self.broadcast.restore_inherited(self.ctx.uid, self.ctx.subtask, states)
