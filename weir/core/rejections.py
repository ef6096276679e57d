"""A record a user function rejected: the function raised on it. What a job does with such a record,
and how the rejection is told.

A job says per operator, or for all of them (``Environment.on_record_error``), what happens when
its function raises on a record (Kafka Streams' processing exception handler):

- :class:`FailOnError` (the default): the task fails with a :class:`UserFunctionError` that names the
  record; the restart strategy restarts the job from its last checkpoint, and once its attempts are
  spent the job is FAILED with that record named in its failure;
- :class:`DeadLetterOnError`: the record goes to a dead-letter Kafka topic in the envelope the Kafka
  source uses for malformed records (:meth:`RejectedRecord.envelope`), and the job goes on.

Everything here is a plain value: the runtime side (``weir.operators.rejections``) builds a
:class:`RejectedRecord` only on the exception path, so a record that passes costs nothing.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any, Final, assert_never

from weir.core.errors import Fault, WeirError
from weir.core.process_functions import TimeDomain

RECORD_REPR_CHARS: Final = 300
"""The longest repr of a record or a key a failure message carries (the dead letter carries it whole)."""

DEAD_LETTER_VALUE_BYTES: Final = 512 * 1024
"""The largest record text a dead letter carries (well below Kafka's default message size of 1 MiB);
a longer one is cut, and the envelope says so (``value_truncated``)."""


@dataclass(frozen=True)
class FailOnError:
    """A record the function raises on fails the task (and, once the restarts are spent, the job)."""


@dataclass(frozen=True)
class DeadLetterOnError:
    """A record the function raises on goes to Kafka topic ``topic`` with the reason; the job goes on."""

    topic: str

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise ValueError(f"a dead-letter topic is a non-empty string, not {self.topic!r}")


OnRecordError = FailOnError | DeadLetterOnError
"""What to do with a record a user function raises on."""

FAIL: Final = FailOnError()


@dataclass(frozen=True)
class SourcePosition:
    """Where a record was read: a Kafka topic's partition and offset."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


POSITION_NOT_KNOWN: Final = (
    "source position not known (the record did not come straight from a Kafka source in this task: "
    "it crossed a network exchange or came in a record batch)"
)


@dataclass(frozen=True)
class TimerFiring:
    """A timer that fired (``on_timer`` raised): not a record, so it has no source position."""

    time: int
    domain: TimeDomain

    def describe(self) -> str:
        match self.domain:
            case TimeDomain.EVENT_TIME:
                return f"the event-time timer at {self.time}"
            case TimeDomain.PROCESSING_TIME:
                return f"the processing-time timer at {self.time}"
            case _:
                assert_never(self.domain)

    def fields(self) -> dict[str, Any]:
        return {"kind": "timer", "time": self.time, "domain": self.domain.value}


@dataclass(frozen=True)
class WindowFiring:
    """A window that fired (its result or window function raised): not a record, no source position."""

    start: int
    end: int

    def describe(self) -> str:
        return f"the firing of window [{self.start}, {self.end})"

    def fields(self) -> dict[str, Any]:
        return {"kind": "window", "start": self.start, "end": self.end}


Firing = TimerFiring | WindowFiring
"""What a user function raised on that is not a record: a timer or a window firing."""

FIRING_HAS_NO_POSITION: Final = "no source position (a firing is not a record read from a source)"

NO_KEY: Final = object()
"""The key of a record rejected by an operator that is not keyed (or before its key was known)."""


@dataclass(frozen=True)
class RejectedRecord:
    """One record a user function raised on, as the failure and the dead letter name it.

    ``record`` and ``key`` are bounded reprs (``key`` None: the operator is not keyed);
    ``position`` is None when the task does not know where the record was read. ``firing`` is set
    when the function raised on a timer or window firing rather than on a record: then ``record`` is
    what the firing handed the function (a window's accumulator or elements; None for a timer), and
    there is no position and no record timestamp."""

    operator_uid: str
    subtask: int
    function: str
    error_type: str
    error: str
    record: str
    key: str | None
    timestamp: int | None
    position: SourcePosition | None
    firing: Firing | None = None

    def __post_init__(self) -> None:
        if self.firing is not None and (self.position is not None or self.timestamp is not None):
            raise ValueError("a firing is not a record: it has no source position and no record timestamp")

    @classmethod
    def of(
        cls,
        *,
        operator_uid: str,
        subtask: int,
        function: Any,
        exc: BaseException,
        value: Any,
        timestamp: int | None,
        key: Any = NO_KEY,
        position: SourcePosition | None,
        firing: Firing | None = None,
    ) -> RejectedRecord:
        return cls(
            operator_uid=operator_uid,
            subtask=subtask,
            function=function_name(function),
            error_type=type(exc).__name__,
            error=str(exc) or type(exc).__name__,
            record=bounded_repr(value),
            key=None if key is NO_KEY else bounded_repr(key),
            timestamp=timestamp,
            position=position,
            firing=firing,
        )

    @property
    def reason(self) -> str:
        """The exception, as a dead letter's ``reason`` (the source's envelopes say the same)."""
        return f"{self.error_type}: {self.error}"

    def describe(self) -> str:
        """One line for the failure: which operator and function, the exception, the record."""
        key = "" if self.key is None else f", key {self.key}"
        if self.firing is not None:
            match self.firing:
                case TimerFiring():
                    given = ""
                case WindowFiring():
                    given = f" (given {self.record})"
                case _:
                    assert_never(self.firing)
            return (
                f"operator {self.operator_uid!r} (subtask {self.subtask}): {self.function} raised {self.reason} "
                f"on {self.firing.describe()}{key}{given}, {FIRING_HAS_NO_POSITION}"
            )
        where = f"from {self.position}" if self.position is not None else POSITION_NOT_KNOWN
        return (
            f"operator {self.operator_uid!r} (subtask {self.subtask}): {self.function} raised {self.reason} "
            f"on record {self.record}{key}, timestamp {self.timestamp}, {where}"
        )

    def envelope(self, job_id: str, value: str | None) -> tuple[dict[str, Any], bool]:
        """The dead letter: the Kafka source's envelope for a malformed record (reason, topic,
        partition, offset, job_id, operator_uid, value; topic/partition/offset None when not known),
        with the function, subtask, key, timestamp and ``firing`` added (None for a record; for a timer
        ``{"kind": "timer", "time", "domain"}``, for a window ``{"kind": "window", "start", "end"}``).
        ``value`` is the record's text (a window's: what its function was given; a timer's: None), cut
        at :data:`DEAD_LETTER_VALUE_BYTES`; the second item says whether it was cut."""
        text, cut = (None, False) if value is None else truncate_utf8(value, DEAD_LETTER_VALUE_BYTES)
        position = self.position
        envelope: dict[str, Any] = {
            "reason": self.reason,
            "topic": None if position is None else position.topic,
            "partition": None if position is None else position.partition,
            "offset": None if position is None else position.offset,
            "job_id": job_id,
            "operator_uid": self.operator_uid,
            "value": text,
            "subtask": self.subtask,
            "function": self.function,
            "key": self.key,
            "timestamp": self.timestamp,
            "value_truncated": cut,
            "firing": None if self.firing is None else self.firing.fields(),
        }
        return envelope, cut


class UserFunctionError(WeirError):
    """A user function raised on a record (raised from the function's exception, its ``__cause__``).

    Whose fault and whether a retry can help are the cause's (``weir.core.failures``): a programming
    error in the function fails the job at once, any other exception restarts it as Flink would."""

    fault: Fault = Fault.USER

    def __init__(self, rejected: RejectedRecord) -> None:
        super().__init__(rejected.describe())
        self.rejected = rejected


_REPR = reprlib.Repr()
_REPR.maxstring = RECORD_REPR_CHARS
_REPR.maxother = RECORD_REPR_CHARS
_REPR.maxdict = 20
_REPR.maxlist = 20
_REPR.maxtuple = 20
_REPR.maxlevel = 4


def bounded_repr(value: Any, limit: int = RECORD_REPR_CHARS) -> str:
    """``repr(value)`` of at most ``limit`` characters (big containers and strings are abridged with
    ``...`` without building their whole repr; a repr that raises is named instead)."""
    try:
        text = _REPR.repr(value)
    except Exception as exc:  # a user type whose __repr__ raises still gets its record named
        return f"<{type(value).__name__}: repr raised {type(exc).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def truncate_utf8(text: str, max_bytes: int) -> tuple[str, bool]:
    """``text`` cut to at most ``max_bytes`` bytes of UTF-8 (at a character boundary), and whether it was cut."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= max_bytes:
        return text, False
    return data[:max_bytes].decode("utf-8", errors="ignore"), True


def function_name(fn: Any) -> str:
    """How a failure names a user function: its qualified name (a lambda says where it was written);
    a function object, by its class."""
    name = getattr(fn, "__qualname__", None)
    if isinstance(name, str):
        if name.endswith("<lambda>"):
            code = getattr(fn, "__code__", None)
            if code is not None:
                return f"{name} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"
        return name
    return type(fn).__qualname__
