"""Stateless operators: map, filter, flat_map, the non-keyed process function and the two-input
co-process."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from weir.core.process_functions import OutputTag
from weir.core.rejections import FAIL, OnRecordError
from weir.operators.base import StreamOperator, check_output_tag

# Each operator calls its user function inside ``try``: free until it raises; ``reject`` then fails
# the task with the record named, or dead-letters the record (``on_error``) and the operator drops it.


class MapOperator(StreamOperator):
    def __init__(self, fn: Callable[[Any], Any], on_error: OnRecordError = FAIL) -> None:
        self._fn = fn
        self.on_error = on_error

    def process(self, value: Any, timestamp: int | None) -> None:
        try:
            result = self._fn(value)
        except Exception as exc:
            self.reject(self._fn, exc, value, timestamp)
            return
        self.output.emit(result, timestamp)


class FilterOperator(StreamOperator):
    def __init__(self, fn: Callable[[Any], bool], on_error: OnRecordError = FAIL) -> None:
        self._fn = fn
        self.on_error = on_error

    def process(self, value: Any, timestamp: int | None) -> None:
        try:
            keep = self._fn(value)
        except Exception as exc:
            self.reject(self._fn, exc, value, timestamp)
            return
        if keep:
            self.output.emit(value, timestamp)


class FlatMapOperator(StreamOperator):
    """What the function returns may be lazy (a generator): its items are emitted as it yields them,
    so an exception from emitting one (downstream) passes through here untouched (``reject``). Items
    emitted before the function raised stay emitted, as in Flink."""

    def __init__(self, fn: Callable[[Any], Iterable[Any]], on_error: OnRecordError = FAIL) -> None:
        self._fn = fn
        self.on_error = on_error

    def process(self, value: Any, timestamp: int | None) -> None:
        emit = self.output.emit
        try:
            for item in self._fn(value):
                emit(item, timestamp)
        except Exception as exc:
            self.reject(self._fn, exc, value, timestamp)


class _TimestampedCollector:
    """A Collector that stamps values with the current input's timestamp unless told otherwise."""

    __slots__ = ("_emit", "timestamp")

    def __init__(self, emit: Callable[[Any, int | None], None]) -> None:
        self._emit = emit
        self.timestamp: int | None = None

    def collect(self, value: Any, timestamp: int | None = None) -> None:
        self._emit(value, self.timestamp if timestamp is None else timestamp)


class ProcessContext:
    """What a ProcessFunction (or a CoProcessFunction) sees in ``process_element`` (and ``open``):
    the record's timestamp (``timestamp``, None for a record without one) and its side outputs
    (:meth:`output`)."""

    __slots__ = ("_op", "timestamp")

    def __init__(self, op: StreamOperator) -> None:
        self._op = op
        self.timestamp: int | None = None

    def output(self, tag: OutputTag, value: Any) -> None:
        """Emit ``value`` to side output ``tag``, with the record's timestamp (dropped when nothing
        takes that side output)."""
        op = self._op
        op.side_outputs.emit(check_output_tag(op.ctx.uid, tag), value, self.timestamp)


class ProcessOperator(StreamOperator):
    """Runs a ProcessFunction on a stream that is not keyed: ``process_element(value, ctx, out)``
    per record (no state, no timers: those need a key)."""

    def __init__(self, fn: Any, on_error: OnRecordError = FAIL) -> None:
        self._fn = fn
        self.on_error = on_error

    def open(self) -> None:
        self._ctx = ProcessContext(self)
        self._out = _TimestampedCollector(self.output.emit)
        self._process_element = self._fn.process_element
        open_fn = getattr(self._fn, "open", None)
        if callable(open_fn):
            open_fn(self._ctx)

    def process(self, value: Any, timestamp: int | None) -> None:
        self._ctx.timestamp = timestamp
        self._out.timestamp = timestamp
        try:
            self._process_element(value, self._ctx, self._out)
        except Exception as exc:
            self.reject(self._process_element, exc, value, timestamp)


class CoProcessOperator(StreamOperator):
    """Two inputs, one function object with ``process_element1(value, ctx, out)`` and
    ``process_element2``; ``ctx`` is a :class:`ProcessContext` (timestamp, side outputs)."""

    def __init__(self, fn: Any, on_error: OnRecordError = FAIL) -> None:
        self._fn = fn
        self.on_error = on_error

    def open(self) -> None:
        self._ctx = ProcessContext(self)
        self._out = _TimestampedCollector(self.output.emit)
        self._elements = (self._fn.process_element1, self._fn.process_element2)
        open_fn = getattr(self._fn, "open", None)
        if callable(open_fn):
            open_fn(self._ctx)

    def process_input(self, input_index: int, value: Any, timestamp: int | None) -> None:
        self._ctx.timestamp = timestamp
        self._out.timestamp = timestamp
        process_element = self._elements[input_index]
        try:
            process_element(value, self._ctx, self._out)
        except Exception as exc:
            self.reject(process_element, exc, value, timestamp)

    def process(self, value: Any, timestamp: int | None) -> None:
        self.process_input(0, value, timestamp)
