"""What ``env.from_source`` and ``stream.sink_to`` take, and the checks every connector's options share.

Flink's connectors own their builders (``KafkaSource.builder()...build()``, ``KafkaSink.builder()``,
``JdbcSink.exactlyOnceSink(...)``) and the stream API only wires what they built
(``env.fromSource(source, ...)``, ``stream.sinkTo(sink)``). Weir does the same: a connector module of
the job API (``kafka_source``, ``kafka_sink``, ``postgres_sink``, ``generator_source``,
``local_sinks``) checks its options where they are given and builds a :class:`Source` or a
:class:`Sink`: the descriptor the JobManager reads (``weir.core.descriptors``) and what builds the
operator for each subtask. The stream classes never look at a connector's options.

A refused option is one :class:`OptionError` naming the connector, the option and the value; the
convenience forms (``env.from_kafka(topic, uid=...)``) name the operator's uid instead
(:meth:`OptionError.naming`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from weir.core.columnar import Schema
from weir.core.descriptors import SinkSpec, SourceSpec
from weir.core.errors import JobDefinitionError
from weir.core.rejections import OnRecordError
from weir.core.windows import to_millis
from weir.operators.base import SourceOperator, StreamOperator

Duration = int | timedelta
"""A duration: an int of milliseconds or a :class:`datetime.timedelta` (whole milliseconds)."""

T = TypeVar("T")


# How an operator is built ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WithOnError:
    """An operator that calls user functions on records, built with what to do with a record one of
    them raises on: the operator's own ``on_error``, else the job's (Kafka Streams' processing
    exception handler), decided when the task builds the operator."""

    build: Callable[[OnRecordError], StreamOperator]


@dataclass(frozen=True)
class WithoutOnError:
    """An operator that never rejects a record, so no ``on_error`` applies to it: a source (its
    malformed records go to its own ``dead_letter_topic``), the conversion of record batches, a union,
    the columnar window of built-in aggregates, print, a file or function sink (whose function fails
    the task as it raises)."""

    build: Callable[[], StreamOperator]


OperatorFactory = WithOnError | WithoutOnError
"""What builds a fresh operator for one subtask."""


# What from_source and sink_to take -------------------------------------------------------------------


class Source(abc.ABC):
    """A source ``env.from_source(source, uid=...)`` adds (Flink's ``Source``)."""

    @abc.abstractmethod
    def descriptor(self) -> SourceSpec:
        """What the JobManager and the reference run read of the source (``weir.core.descriptors``)."""

    @abc.abstractmethod
    def create_operator(self) -> SourceOperator:
        """A fresh source operator for one subtask."""

    @abc.abstractmethod
    def default_name(self) -> str:
        """The operator's name unless ``from_source`` is given one (``kafka:<topic>``)."""

    def columnar_schema(self) -> Schema | None:
        """The fields of the record batches the source emits; None: it emits one value per record."""
        return None

    def projected(self, fields: tuple[str, ...] | None) -> Source:
        """This columnar source decoding only ``fields`` of its schema (and its event time), the ones
        the job reads; None: every field. Asked of columnar sources only."""
        raise JobDefinitionError(f"{type(self).__name__} emits records, not batches: it has no fields to project")

    def default_parallelism(self) -> int | None:
        """The parallelism the source runs at unless ``from_source`` is given one (the CDC source:
        1, its replication slot's one reader); None: the job's."""
        return None


class Sink(abc.ABC):
    """A sink ``stream.sink_to(sink, uid=...)`` adds (Flink's ``Sink``)."""

    @abc.abstractmethod
    def descriptor(self) -> SinkSpec:
        """The system, target and delivery guarantee the JobManager checks (``weir.core.descriptors``)."""

    @abc.abstractmethod
    def operator(self) -> OperatorFactory:
        """What builds the sink operator for one subtask."""

    @abc.abstractmethod
    def default_name(self) -> str:
        """The operator's name unless ``sink_to`` is given one (``kafka-sink:<topic>``)."""


# Refusing an option ---------------------------------------------------------------------------------


class OptionError(JobDefinitionError):
    """A connector option refused when the job is defined: ``<connector>: <detail>``, the detail
    naming the option and the value (``kafka source: idle_timeout_ms must be ..., got -1``)."""

    def __init__(self, connector: str, detail: str) -> None:
        super().__init__(f"{connector}: {detail}")
        self.connector = connector
        self.detail = detail

    def naming(self, operator: str) -> OptionError:
        """The same refusal told of an operator (``kafka source 'events'``) rather than the connector."""
        return OptionError(operator, self.detail)


@dataclass(frozen=True)
class Options:
    """The checks of one connector's options, each returning the value it accepted (or a normalized
    one) and raising one :class:`OptionError` that names the option and the value."""

    connector: str  # how errors name it: "kafka source", "postgres sink"

    def refuse(self, option: str, must: str, value: object) -> OptionError:
        return OptionError(self.connector, f"{option} must be {must}, got {value!r}")

    def error(self, detail: str) -> OptionError:
        return OptionError(self.connector, detail)

    def text(self, option: str, value: object) -> str:
        if not isinstance(value, str) or not value:
            raise self.refuse(option, "a non-empty string", value)
        return value

    def optional_text(self, option: str, value: object) -> str | None:
        return None if value is None else self.text(option, value)

    def flag(self, option: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.refuse(option, "True or False", value)
        return value

    def function(self, option: str, value: T | None) -> T | None:
        """A callable, or None (the connector's default)."""
        if value is not None and not callable(value):
            raise self.refuse(option, "a function or None", value)
        return value

    def optional_positive_int(self, option: str, value: object) -> int | None:
        if value is None:
            return None
        if type(value) is not int or value <= 0:
            raise self.refuse(option, "a positive int or None", value)
        return value

    def millis(self, option: str, value: object, *, positive: bool) -> int:
        """An int of milliseconds or a timedelta of whole milliseconds: above 0, or at least 0."""
        if isinstance(value, int | timedelta) and not isinstance(value, bool):
            try:
                ms = to_millis(value, option)
            except ValueError:  # a timedelta with a fraction of a millisecond
                pass
            else:
                if ms > 0 or (ms == 0 and not positive):
                    return ms
        must = "a positive int" if positive else "an int of at least 0"
        raise self.refuse(option, f"{must} (milliseconds) or datetime.timedelta", value)

    def optional_positive_millis(self, option: str, value: object) -> int | None:
        if value is None:
            return None
        try:
            return self.millis(option, value, positive=True)
        except OptionError:
            raise self.refuse(option, "a positive int (milliseconds), a datetime.timedelta or None", value) from None

    def optional_rate(self, option: str, value: object) -> float | None:
        """A positive number of records per second, or None (no limit)."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise self.refuse(option, "a positive number (records per second) or None", value)
        return value


@contextmanager
def told_as(operator: str) -> Iterator[None]:
    """An :class:`OptionError` raised within told of ``operator`` (``kafka sink 'out'``): how the
    convenience forms (``env.from_kafka(topic, uid=...)``) name the operator they add."""
    try:
        yield
    except OptionError as exc:
        raise exc.naming(operator) from None


def checked(options: Options, option: str, check: Callable[[], T]) -> T:
    """``check()``, its JobDefinitionError (raised by a rule of ``weir.core``) told as ``option``'s."""
    try:
        return check()
    except OptionError:
        raise
    except JobDefinitionError as exc:
        raise options.error(f"{option}: {exc}") from None


def required(options: Options, option: str, value: T | None, how: str) -> T:
    """An option the builder cannot do without: ``how`` says how to give it."""
    if value is None:
        raise options.error(f"{option} is not set: {how}")
    return value


__all__ = [
    "Duration",
    "OperatorFactory",
    "OptionError",
    "Options",
    "Sink",
    "Source",
    "WithOnError",
    "WithoutOnError",
    "checked",
    "required",
    "told_as",
]
