"""Values of the process-function API (Flink's ProcessFunction and KeyedProcessFunction): the time
domain a timer fires in, the time-to-live of a state, the tag of a side output, durations given as
milliseconds or ``timedelta``, and the processing-time clock.

Time is epoch milliseconds throughout: event time as the records' timestamps and the watermarks,
processing time as the wall clock (:func:`wall_clock_ms`, injectable as a :data:`Clock`).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from weir.core.errors import JobDefinitionError

Millis = int | timedelta
"""A time in milliseconds: an int, or a ``timedelta`` (a duration; as a timestamp, the time since the epoch)."""

IN = TypeVar("IN", contravariant=True)
ACC = TypeVar("ACC")
OUT = TypeVar("OUT", covariant=True)

Clock = Callable[[], int]
"""The processing-time clock: the current time in epoch milliseconds."""


def wall_clock_ms() -> int:
    """The wall clock in epoch milliseconds: the processing time of a running job."""
    return time.time_ns() // 1_000_000


def to_millis(value: Millis, what: str = "a time") -> int:
    """``value`` in whole milliseconds (a ``timedelta`` is truncated to the millisecond); raises
    JobDefinitionError for anything but an int or a timedelta (a bool or a float is refused)."""
    if isinstance(value, timedelta):
        return value // timedelta(milliseconds=1)
    if type(value) is int:
        return value
    raise JobDefinitionError(f"{what} must be an int of milliseconds or a datetime.timedelta, got {value!r}")


class TimeDomain(enum.Enum):
    """What a timer's time is: event time (fires when the watermark passes it) or processing time
    (fires when the wall clock passes it)."""

    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


@dataclass(frozen=True)
class OutputTag:
    """A side output of an operator (Flink's ``OutputTag``): a function emits to it with
    ``ctx.output(tag, value)``, a window sends its late elements to it (``side_output_late_data``),
    and ``stream.get_side_output(tag)`` is the stream of what the operator emitted to it.

    The name is the tag's identity: two tags of one name are equal, whatever their ``value_type``,
    as in Flink. ``value_type`` (optional) says what the side output carries; it is not checked per
    value, but one operator's side output of a name must be asked for with one ``value_type``."""

    name: str
    value_type: type | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise JobDefinitionError(f"an OutputTag's name must be a non-empty str, got {self.name!r}")
        if self.value_type is not None and not isinstance(self.value_type, type):
            raise JobDefinitionError(
                f"OutputTag {self.name!r}: value_type must be a type or None, got {self.value_type!r}"
            )


class TtlUpdateType(enum.Enum):
    """Which accesses restart a state value's time to live (Flink's ``StateTtlConfig.UpdateType``)."""

    ON_CREATE_AND_WRITE = "on_create_and_write"
    """Only writing the value (creating or updating it) restarts its time to live."""
    ON_READ_AND_WRITE = "on_read_and_write"
    """Reading the value restarts its time to live too."""


@dataclass(frozen=True)
class StateTtlConfig:
    """How long a keyed state's values live, in processing time, after the accesses ``update_type``
    names. An expired value is never returned: it reads as absent and is removed when it is accessed
    and when a snapshot is taken. The unit of expiry is one stored value: a ValueState's value, a
    ListState's whole list, one MapState entry, a Reducing/AggregatingState's accumulator."""

    ttl: Millis
    update_type: TtlUpdateType = TtlUpdateType.ON_CREATE_AND_WRITE

    def __post_init__(self) -> None:
        if to_millis(self.ttl, "a state's ttl") <= 0:
            raise JobDefinitionError(f"a state's ttl must be positive, got {self.ttl!r}")
        if not isinstance(self.update_type, TtlUpdateType):
            raise JobDefinitionError(f"update_type must be a TtlUpdateType, got {self.update_type!r}")

    @property
    def ttl_ms(self) -> int:
        return to_millis(self.ttl)


class StateAggregateFunction(Protocol[IN, ACC, OUT]):
    """What an AggregatingState aggregates with: a new accumulator, one value added to it, and the
    result the state reads as (Flink's ``AggregateFunction`` without ``merge``)."""

    def create(self) -> ACC: ...
    def add(self, acc: ACC, value: IN) -> ACC: ...
    def result(self, acc: ACC) -> OUT: ...


ReduceFunction = Callable[[Any, Any], Any]
"""``reduce(accumulated, value) -> accumulated``: what a ReducingState folds its values with."""
