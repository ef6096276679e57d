"""Sinks whose effects stay with the job: a file per subtask, stdout, a function of the job's own
(Flink's row-format ``FileSink``, ``PrintSink`` and ``SinkFunction``). All are at least once, with no
transaction: for debugging, tests and side effects the job makes idempotent itself.

::

    results.sink_to(FileSink("/tmp/results"), uid="file-sink")
    results.sink_to(PrintSink(prefix="result: "), uid="print")

``stream.sink_to_file(path, ...)``, ``stream.print(...)`` and ``stream.sink(fn, ...)`` are these sinks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weir.api.connector import OperatorFactory, Options, Sink, WithoutOnError
from weir.core.descriptors import SinkDelivery, SinkSpec, SinkSystem
from weir.core.json_codec import encode as json_serializer
from weir.operators.base import StreamOperator


def _sink_operators() -> Any:
    """``weir.operators.sinks``, where the operators run: in the TaskManager (the client builds the job
    without the server install, which that module's Kafka and PostgreSQL sinks need)."""
    from weir.operators import sinks

    return sinks


@dataclass(frozen=True)
class FileSink(Sink):
    """Appends one line per value, ``serializer(value)`` (default JSON), to ``<path>.<subtask>``."""

    path: str | Path
    serializer: Callable[[Any], bytes] | None = None

    def __post_init__(self) -> None:
        options = Options("file sink")
        if not isinstance(self.path, str | Path) or not str(self.path):
            raise options.refuse("path", "a path", self.path)
        options.function("serializer", self.serializer)

    def descriptor(self) -> SinkSpec:
        return SinkSpec(SinkSystem.FILE, str(self.path), SinkDelivery.AT_LEAST_ONCE)

    def operator(self) -> OperatorFactory:
        path, serializer = str(self.path), self.serializer or json_serializer
        return WithoutOnError(lambda: _file_sink(path, serializer))

    def default_name(self) -> str:
        return f"file-sink:{self.path}"


@dataclass(frozen=True)
class PrintSink(Sink):
    """Prints each value to the TaskManager's stdout after ``prefix``."""

    prefix: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str):
            raise Options("print sink").refuse("prefix", "a string", self.prefix)

    def descriptor(self) -> SinkSpec:
        return SinkSpec(SinkSystem.PRINT, "", SinkDelivery.AT_LEAST_ONCE)

    def operator(self) -> OperatorFactory:
        prefix = self.prefix
        return WithoutOnError(lambda: _print_sink(prefix))

    def default_name(self) -> str:
        return "print"


@dataclass(frozen=True)
class FunctionSink(Sink):
    """Calls ``fn(value)`` for every value (Flink's ``SinkFunction``)."""

    fn: Callable[[Any], None]

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise Options("function sink").refuse("fn", "a function of the value", self.fn)

    def descriptor(self) -> SinkSpec:
        return SinkSpec(SinkSystem.FUNCTION, "", SinkDelivery.AT_LEAST_ONCE)

    def operator(self) -> OperatorFactory:
        fn = self.fn
        return WithoutOnError(lambda: _function_sink(fn))

    def default_name(self) -> str:
        return "sink"


def _file_sink(path: str, serializer: Callable[[Any], bytes]) -> StreamOperator:
    operator: StreamOperator = _sink_operators().FileSinkOperator(path, serializer)
    return operator


def _print_sink(prefix: str) -> StreamOperator:
    operator: StreamOperator = _sink_operators().PrintSinkOperator(prefix)
    return operator


def _function_sink(fn: Callable[[Any], None]) -> StreamOperator:
    operator: StreamOperator = _sink_operators().FunctionSinkOperator(fn)
    return operator


__all__ = ["FileSink", "FunctionSink", "PrintSink"]
