"""Stateless operators: map, filter, flat_map, the non-keyed process function and the two-input
co-process."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from operators.base import StreamOperator, check_output_tag
from weir.core.process_functions import OutputTag


class MapOperator(StreamOperator):
    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self._fn = fn

    def process(self, value: Any, timestamp: int | None) -> None:
        self.output.emit(self._fn(value), timestamp)


class FilterOperator(StreamOperator):
    def __init__(self, fn: Callable[[Any], bool]) -> None:
        self._fn = fn

    def process(self, value: Any, timestamp: int | None) -> None:
        if self._fn(value):
            self.output.emit(value, timestamp)


class FlatMapOperator(StreamOperator):
    def __init__(self, fn: Callable[[Any], Iterable[Any]]) -> None:
        self._fn = fn

    def process(self, value: Any, timestamp: int | None) -> None:
        emit = self.output.emit
        for item in self._fn(value):
            emit(item, timestamp)


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

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def open(self) -> None:
        self._ctx = ProcessContext(self)
        self._out = _TimestampedCollector(self.output.emit)
        open_fn = getattr(self._fn, "open", None)
        if callable(open_fn):
            open_fn(self._ctx)

    def process(self, value: Any, timestamp: int | None) -> None:
        self._ctx.timestamp = timestamp
        self._out.timestamp = timestamp
        self._fn.process_element(value, self._ctx, self._out)


class CoProcessOperator(StreamOperator):
    """Two inputs, one function object with ``process_element1(value, ctx, out)`` and
    ``process_element2``; ``ctx`` is a :class:`ProcessContext` (timestamp, side outputs)."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

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
        self._elements[input_index](value, self._ctx, self._out)

    def process(self, value: Any, timestamp: int | None) -> None:
        self.process_input(0, value, timestamp)
