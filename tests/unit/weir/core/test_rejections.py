"""A rejected record as values: how it is named (bounded reprs, the function, the position or its
absence), its dead-letter envelope (the Kafka source's format), and the Failure it becomes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from weir.core.errors import Fault, NonRetriableError
from weir.core.failures import Failure
from weir.core.process_functions import TimeDomain
from weir.core.rejections import (
    DEAD_LETTER_VALUE_BYTES,
    FIRING_HAS_NO_POSITION,
    POSITION_NOT_KNOWN,
    RECORD_REPR_CHARS,
    DeadLetterOnError,
    RejectedRecord,
    SourcePosition,
    TimerFiring,
    UserFunctionError,
    WindowFiring,
    bounded_repr,
    function_name,
    truncate_utf8,
)

SOURCE_ENVELOPE_KEYS = {"reason", "topic", "partition", "offset", "job_id", "operator_uid", "value"}
"""The keys of the Kafka source's dead letter for a malformed record (operators/sources.py)."""


def parse(event: dict[str, Any]) -> dict[str, Any]:
    return event


class Enrich:
    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        return None


def rejected(
    exc: BaseException, *, position: SourcePosition | None = None, key: Any = "k1", value: Any = None
) -> RejectedRecord:
    return RejectedRecord.of(
        operator_uid="parse",
        subtask=1,
        function=parse,
        exc=exc,
        value={"key": "k1", "seq": 7} if value is None else value,
        timestamp=1_700_000_000_123,
        key=key,
        position=position,
    )


def test_the_description_names_operator_function_exception_record_key_timestamp_and_position() -> None:
    r = rejected(ValueError("seq 7 is poison"), position=SourcePosition("events", 2, 41))
    assert r.describe() == (
        "operator 'parse' (subtask 1): parse raised ValueError: seq 7 is poison on record "
        "{'key': 'k1', 'seq': 7}, key 'k1', timestamp 1700000000123, from events[2]@41"
    )


def test_without_a_position_the_description_says_it_is_not_known_rather_than_inventing_one() -> None:
    r = rejected(KeyError("seq"), position=None)
    assert r.position is None and r.describe().endswith(POSITION_NOT_KNOWN)
    assert "@" not in r.describe()


def test_an_operator_that_is_not_keyed_names_no_key() -> None:
    from weir.core.rejections import NO_KEY

    r = rejected(ValueError("x"), key=NO_KEY)
    assert r.key is None and ", key" not in r.describe()


def test_an_exception_without_a_message_is_named_by_its_type() -> None:
    assert rejected(ZeroDivisionError()).reason == "ZeroDivisionError: ZeroDivisionError"


def test_a_huge_record_is_named_by_a_bounded_repr() -> None:
    huge = {"payload": "x" * 1_000_000, "items": list(range(100_000))}
    text = bounded_repr(huge)
    assert len(text) <= RECORD_REPR_CHARS and text.startswith("{'items': [0, 1, 2")
    assert len(rejected(ValueError("big"), value=huge).describe()) < 2 * RECORD_REPR_CHARS + 300


def test_a_record_whose_repr_raises_is_still_named() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert bounded_repr(Hostile()).startswith("<Hostile")  # reprlib names it by its type


def test_a_function_is_named_by_its_qualified_name_a_lambda_by_where_it_was_written() -> None:
    assert function_name(parse) == "parse"
    assert function_name(Enrich().process_element) == "Enrich.process_element"
    fn = lambda e: e  # noqa: E731
    name = function_name(fn)
    assert name.endswith(f".<locals>.<lambda> (test_rejections.py:{fn.__code__.co_firstlineno})"), name
    assert function_name(Enrich()) == "Enrich"


def test_the_envelope_is_the_source_s_with_the_function_subtask_key_and_timestamp_added() -> None:
    r = rejected(ValueError("seq 7 is poison"), position=SourcePosition("events", 2, 41))
    envelope, cut = r.envelope("job-1", '{"key":"k1","seq":7}')
    assert SOURCE_ENVELOPE_KEYS <= set(envelope) and not cut
    assert envelope == {
        "reason": "ValueError: seq 7 is poison",
        "topic": "events",
        "partition": 2,
        "offset": 41,
        "job_id": "job-1",
        "operator_uid": "parse",
        "value": '{"key":"k1","seq":7}',
        "subtask": 1,
        "function": "parse",
        "key": "'k1'",
        "timestamp": 1_700_000_000_123,
        "value_truncated": False,
        "firing": None,
    }


def test_the_envelope_of_a_record_from_across_an_exchange_has_no_position() -> None:
    envelope, _cut = rejected(ValueError("x")).envelope("job-1", "{}")
    assert (envelope["topic"], envelope["partition"], envelope["offset"]) == (None, None, None)


def test_an_oversized_record_is_cut_in_its_dead_letter_and_the_envelope_says_so() -> None:
    envelope, cut = rejected(ValueError("x")).envelope("job-1", "é" * DEAD_LETTER_VALUE_BYTES)
    assert cut and envelope["value_truncated"] is True
    assert len(envelope["value"].encode()) <= DEAD_LETTER_VALUE_BYTES
    assert truncate_utf8("abc", 3) == ("abc", False) and truncate_utf8("aé", 2) == ("a", True)


@pytest.mark.parametrize("topic", ["", None, 3])
def test_a_dead_letter_handling_needs_a_topic(topic: Any) -> None:
    with pytest.raises(ValueError, match="dead-letter topic"):
        DeadLetterOnError(topic)


def raised_from(cause: Exception) -> UserFunctionError:
    try:
        try:
            raise cause
        except Exception as exc:
            raise UserFunctionError(rejected(exc)) from exc
    except UserFunctionError as error:
        return error


def test_the_failure_of_a_rejected_record_keeps_the_cause_s_type_and_names_the_record() -> None:
    failure = Failure.from_exception(raised_from(ValueError("seq 7 is poison")))
    assert failure == Failure(
        "ValueError", rejected(ValueError("seq 7 is poison")).describe(), Fault.USER, retriable=True
    )


@pytest.mark.parametrize(
    ("cause", "retriable"),
    [
        (ValueError("bad input"), True),  # may be transient: restarted as Flink would, up to the attempts
        (TypeError("bad function"), False),  # a programming error fails the same way after every restart
        (AttributeError("no such field"), False),
        (NonRetriableError("the job says stop"), False),
    ],
)
def test_whether_a_rejected_record_restarts_the_job_is_the_cause_s(cause: Exception, retriable: bool) -> None:
    failure = Failure.from_exception(raised_from(cause))
    assert failure.fault is Fault.USER and failure.retriable is retriable
    assert failure.type == type(cause).__name__


def fired(exc: BaseException, firing: TimerFiring | WindowFiring, value: Any = None) -> RejectedRecord:
    return RejectedRecord.of(
        operator_uid="alarms",
        subtask=2,
        function=Enrich().process_element,
        exc=exc,
        value=value,
        timestamp=None,
        key="k1",
        position=None,
        firing=firing,
    )


def test_a_timer_firing_is_named_by_its_key_time_and_domain_and_says_it_has_no_position() -> None:
    r = fired(RuntimeError("boom"), TimerFiring(1_000, TimeDomain.PROCESSING_TIME))
    assert r.describe() == (
        "operator 'alarms' (subtask 2): Enrich.process_element raised RuntimeError: boom on the "
        f"processing-time timer at 1000, key 'k1', {FIRING_HAS_NO_POSITION}"
    )
    assert POSITION_NOT_KNOWN not in r.describe() and "@" not in r.describe()


def test_a_window_firing_is_named_by_its_bounds_and_what_its_function_was_given() -> None:
    r = fired(ValueError("bad"), WindowFiring(0, 60_000), value=[3, 4])
    assert "on the firing of window [0, 60000), key 'k1' (given [3, 4]), no source position" in r.describe()


def test_the_envelope_of_a_firing_says_which_firing_with_no_position_and_no_timestamp() -> None:
    timer, _cut = fired(RuntimeError("boom"), TimerFiring(1_000, TimeDomain.EVENT_TIME)).envelope("job-1", None)
    assert timer["firing"] == {"kind": "timer", "time": 1_000, "domain": "event_time"}
    assert (timer["topic"], timer["partition"], timer["offset"], timer["timestamp"], timer["value"]) == (None,) * 5
    assert SOURCE_ENVELOPE_KEYS <= set(timer)
    window, _cut = fired(ValueError("bad"), WindowFiring(0, 60_000), value=[3]).envelope("job-1", "[3]")
    assert window["firing"] == {"kind": "window", "start": 0, "end": 60_000} and window["value"] == "[3]"


def test_a_firing_cannot_be_given_a_source_position_or_a_record_timestamp() -> None:
    firing = TimerFiring(5, TimeDomain.EVENT_TIME)
    base = fired(ValueError("x"), firing)
    with pytest.raises(ValueError, match="a firing is not a record"):
        dataclasses.replace(base, position=SourcePosition("events", 0, 1))
    with pytest.raises(ValueError, match="a firing is not a record"):
        dataclasses.replace(base, timestamp=5)
