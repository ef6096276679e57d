"""User functions that raise outside a one-input record: the two-input keyed operators (their key
selectors, ``process_element1/2``, the joins' functions), ``on_timer`` and a window's result and
window function. A record is rejected as a record; a timer or a window firing as that firing: its
key, time or bounds, and never a source position (the record the source read last is not what the
function raised on)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from tests.unit.operators.test_rejections import DLQ, start_with_letters
from weir.api import (
    CoProcessFunction,
    Environment,
    EventTimeSessionWindows,
    KeyedCoProcessFunction,
    TumblingEventTimeWindows,
)
from weir.core.process_functions import TimeDomain
from weir.core.rejections import (
    FAIL,
    FIRING_HAS_NO_POSITION,
    DeadLetterOnError,
    SourcePosition,
    TimerFiring,
    UserFunctionError,
    WindowFiring,
)
from weir.core.windows import TumblingProcessingTimeWindows
from weir.operators.joins import IntervalJoinOperator, JoinContext, WindowJoinOperator
from weir.operators.keyed import KeyedCoProcessOperator, KeyedProcessOperator
from weir.operators.rejections import CapturedDeadLetters, RecordRejections
from weir.operators.windows import ElementList, ProcessElements, ProcessResult, WindowAggregateOperator

LAST_READ = SourcePosition("events", 0, 99)
"""Where the source says its last record was read: a firing must not claim it."""


def by_key(v: dict[str, Any]) -> str:
    return v["k"]


def start_located(op: Any, make_context: MakeContext, uid: str) -> tuple[CollectingOutput, CapturedDeadLetters]:
    """Like ``start_with_letters``, with a source that always names LAST_READ as the record in flight."""
    letters = CapturedDeadLetters()
    ctx = make_context(uid)
    ctx.rejections = RecordRejections(ctx.job_id, ctx.subtask, letters, ctx.log, position_in_flight=lambda: LAST_READ)
    out = CollectingOutput()
    op.setup(ctx, out)
    op.open()
    return out, letters


# Two inputs ---------------------------------------------------------------------------------------


class Pairing(KeyedCoProcessFunction):
    def process_element1(self, value: Any, ctx: Any, out: Any) -> None:
        if value["v"] == "poison":
            raise ValueError("first input poison")
        ctx.value_state("last").update(value["v"])
        out.collect(("1", value["v"]))

    def process_element2(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect(("2", value["v"], ctx.value_state("last").value()))


def test_a_keyed_co_process_function_raising_is_rejected_with_its_key(make_context: MakeContext) -> None:
    op = KeyedCoProcessOperator(Pairing(), (by_key, by_key), on_error=DLQ)
    out, letters = start_with_letters(op, make_context, "pair")
    op.process_input(0, {"k": "a", "v": 1}, 10)
    op.process_input(0, {"k": "a", "v": "poison"}, 11)
    op.process_input(1, {"k": "a", "v": 2}, 12)
    assert out.values == [("1", 1), ("2", 2, 1)]
    ((topic, key, envelope),) = letters.letters
    assert (topic, key, envelope["key"], envelope["timestamp"]) == ("events-dlq", b"'a'", "'a'", 11)
    assert envelope["function"] == "Pairing.process_element1" and envelope["firing"] is None


def test_either_key_selector_raising_is_rejected_and_fails_by_default(start_operator: StartOperator) -> None:
    def second_key(v: dict[str, Any]) -> str:
        return v["id"]

    op = KeyedCoProcessOperator(Pairing(), (by_key, second_key))
    start_operator(op, uid="pair")
    with pytest.raises(UserFunctionError) as raised:
        op.process_input(1, {"k": "a", "v": 2}, 5)
    rejected = raised.value.rejected
    assert (rejected.operator_uid, rejected.reason) == ("pair", "KeyError: 'id'")
    assert rejected.function.endswith("<locals>.second_key")
    assert rejected.key is None and rejected.record == "{'k': 'a', 'v': 2}"


def test_a_dead_lettered_key_of_the_first_input_is_dropped(make_context: MakeContext) -> None:
    op = KeyedCoProcessOperator(Pairing(), (by_key, by_key), on_error=DLQ)
    out, letters = start_with_letters(op, make_context, "pair")
    op.process_input(0, {"v": 1}, 1)
    op.process_input(0, {"k": "b", "v": 3}, 2)
    assert out.values == [("1", 3)] and letters.letters[0][2]["function"] == "by_key"


def test_a_window_join_function_raising_rejects_that_pair_with_its_window(make_context: MakeContext) -> None:
    def join(x: dict[str, Any], y: dict[str, Any]) -> tuple[Any, Any]:
        if y["v"] == 0:
            raise ZeroDivisionError("no zero")
        return (x["v"], y["v"])

    op = WindowJoinOperator(join, TumblingEventTimeWindows(100), (by_key, by_key), on_error=DLQ)
    out, letters = start_located(op, make_context, "wjoin")
    op.process_input(0, {"k": "a", "v": 1}, 110)
    op.process_input(1, {"k": "a", "v": 0}, 120)
    op.process_input(1, {"k": "a", "v": 5}, 130)
    op.process_watermark(250)
    assert out.values == [(1, 5)]  # the window's other pair is joined
    ((_topic, _key, envelope),) = letters.letters
    assert envelope["firing"] == {"kind": "window", "start": 100, "end": 200}
    assert envelope["function"].endswith("<locals>.join") and envelope["key"] == "'a'"
    assert envelope["value"] == '[{"k":"a","v":1},{"k":"a","v":0}]'
    assert (envelope["topic"], envelope["offset"], envelope["timestamp"]) == (None, None, None)


def test_a_window_join_function_failing_names_the_window_not_a_source_position(make_context: MakeContext) -> None:
    op = WindowJoinOperator(lambda x, y: 1 // 0, TumblingEventTimeWindows(100), (by_key, by_key))
    start_located(op, make_context, "wjoin")
    op.process_input(0, {"k": "a", "v": 1}, 110)
    op.process_input(1, {"k": "a", "v": 2}, 120)
    with pytest.raises(UserFunctionError) as raised:
        op.process_watermark(250)
    rejected = raised.value.rejected
    assert rejected.firing == WindowFiring(100, 200) and rejected.position is None
    assert "the firing of window [100, 200), key 'a'" in str(raised.value)
    assert str(LAST_READ) not in str(raised.value) and FIRING_HAS_NO_POSITION in str(raised.value)


class Ratio:
    def process_element(self, left: Any, right: Any, ctx: JoinContext, out: Any) -> None:
        out.collect(left["v"] / right["v"])


def test_an_interval_join_function_raising_rejects_the_arriving_record_and_does_not_keep_it(
    make_context: MakeContext,
) -> None:
    op = IntervalJoinOperator(Ratio().process_element, -50, 50, (by_key, by_key), on_error=DLQ)
    out, letters = start_located(op, make_context, "ijoin")
    op.process_input(0, {"k": "a", "v": 6}, 100)
    op.process_input(1, {"k": "a", "v": 0}, 110)  # 6 / 0: rejected
    op.process_input(1, {"k": "a", "v": 3}, 120)
    op.process_input(0, {"k": "a", "v": 9}, 130)  # pairs with v=3 only: v=0 was not kept
    assert out.values == [2.0, 3.0]
    ((_topic, _key, envelope),) = letters.letters
    assert envelope["function"] == "Ratio.process_element" and envelope["value"] == '{"k":"a","v":0}'
    assert envelope["timestamp"] == 110 and envelope["offset"] == 99 and envelope["firing"] is None


def test_an_interval_join_of_a_plain_function_names_that_function(start_operator: StartOperator) -> None:
    env = Environment("job")
    left = env.from_collection([], uid="left").key_by(by_key)
    right = env.from_collection([], uid="right").key_by(by_key)

    def ratio(x: dict[str, Any], y: dict[str, Any]) -> float:
        return x["v"] / y["v"]

    left.interval_join(right).between(-50, 50).process(ratio, uid="ijoin").print(uid="out")
    op = env.graph.transformations["ijoin"].factory()
    start_operator(op, uid="ijoin")
    op.process_input(0, {"k": "a", "v": 6}, 100)
    with pytest.raises(UserFunctionError) as raised:
        op.process_input(1, {"k": "a", "v": 0}, 110)
    assert raised.value.rejected.function.endswith("<locals>.ratio")


class Plain(CoProcessFunction):
    def process_element1(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect(value)

    def process_element2(self, value: Any, ctx: Any, out: Any) -> None:
        out.collect(value)


def test_the_two_input_builders_take_on_error_and_default_to_the_job_s() -> None:
    env = Environment("job")
    a = env.from_collection([], uid="a")
    b = env.from_collection([], uid="b")
    own = DeadLetterOnError("own-dlq")
    a.connect(b).key_by(by_key, by_key).process(Pairing(), uid="co").print(uid="o1")
    a.connect(b).key_by(by_key, by_key).process(Pairing(), uid="co-own", on_error=own).print(uid="o2")
    a.join(b).where(by_key).equal_to(by_key).window(TumblingEventTimeWindows(10)).apply(
        lambda x, y: x, uid="wjoin"
    ).print(uid="o3")
    a.key_by(by_key).interval_join(b.key_by(by_key)).between(-1, 1).process(lambda x, y: x, uid="ijoin").print(uid="o4")
    a.connect(b).process(Plain(), uid="co-plain", on_error=own).print(uid="o5")
    env.on_record_error(DLQ)
    graph = env.graph.transformations
    uids = ("co", "co-own", "wjoin", "ijoin", "co-plain")
    handling = {uid: graph[uid].factory().on_error for uid in uids}
    assert handling == {"co": DLQ, "co-own": own, "wjoin": DLQ, "ijoin": DLQ, "co-plain": own}
    edge_handling = {uid: graph[uid].on_error() for uid in uids}  # type: ignore[misc]
    assert edge_handling == handling  # where the record writers take the keys


# Timers -------------------------------------------------------------------------------------------


class Alarm:
    """Registers a timer per record at its value; a timer at 300 raises."""

    def process_element(self, value: Any, ctx: Any, out: Any) -> None:
        ctx.timer_service().register_event_time_timer(value["at"])

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        if timestamp == 300:
            raise RuntimeError("alarm at 300 broke")
        out.collect((ctx.key, timestamp))


def test_a_raising_on_timer_fails_naming_the_operator_key_and_timer_without_a_position(
    make_context: MakeContext,
) -> None:
    op = KeyedProcessOperator(Alarm(), by_key)
    start_located(op, make_context, "alarms")
    op.process({"k": "a", "at": 300}, 1)
    with pytest.raises(UserFunctionError) as raised:
        op.process_watermark(400)
    rejected = raised.value.rejected
    assert rejected.firing == TimerFiring(300, TimeDomain.EVENT_TIME)
    assert (rejected.position, rejected.timestamp, rejected.key) == (None, None, "'a'")
    assert str(raised.value) == (
        "operator 'alarms' (subtask 0): Alarm.on_timer raised RuntimeError: alarm at 300 broke on the "
        f"event-time timer at 300, key 'a', {FIRING_HAS_NO_POSITION}"
    )


def test_a_dead_lettered_timer_is_the_firing_and_the_other_timers_fire(make_context: MakeContext) -> None:
    op = KeyedProcessOperator(Alarm(), by_key, on_error=DLQ)
    out, letters = start_located(op, make_context, "alarms")
    for key, at in [("a", 200), ("b", 300), ("c", 350)]:
        op.process({"k": key, "at": at}, 1)
    op.process_watermark(400)
    assert out.values == [("a", 200), ("c", 350)] and out.watermarks == [400]
    ((topic, key, envelope),) = letters.letters
    assert (topic, key) == ("events-dlq", b"'b'")
    assert envelope["firing"] == {"kind": "timer", "time": 300, "domain": "event_time"}
    assert (envelope["value"], envelope["timestamp"]) == (None, None)
    assert (envelope["topic"], envelope["partition"], envelope["offset"]) == (None, None, None)
    assert envelope["reason"] == "RuntimeError: alarm at 300 broke" and envelope["function"] == "Alarm.on_timer"


def test_a_processing_time_timer_is_named_by_its_domain(make_context: MakeContext) -> None:
    class Late:
        def process_element(self, value: Any, ctx: Any, out: Any) -> None:
            ctx.timer_service().register_processing_time_timer(5_000)

        def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
            raise ValueError("late")

    op = KeyedProcessOperator(Late(), by_key, clock=lambda: 1_000)
    start_operator_ctx = make_context("late")
    op.setup(start_operator_ctx, CollectingOutput())
    op.open()
    op.process({"k": "a"}, None)
    with pytest.raises(UserFunctionError, match="on the processing-time timer at 5000, key 'a'"):
        op.on_processing_time(6_000)


def test_a_keyed_co_process_function_s_timer_is_rejected_like_a_one_input_one(make_context: MakeContext) -> None:
    class CoAlarm(Pairing):
        def process_element2(self, value: Any, ctx: Any, out: Any) -> None:
            ctx.timer_service().register_event_time_timer(50)

        def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
            raise KeyError("gone")

    op = KeyedCoProcessOperator(CoAlarm(), (by_key, by_key), on_error=DLQ)
    out, letters = start_with_letters(op, make_context, "co")
    op.process_input(1, {"k": "z", "v": 0}, 1)
    op.process_watermark(60)
    assert out.watermarks == [60] and letters.letters[0][2]["firing"]["time"] == 50


# Window results -----------------------------------------------------------------------------------


class Mean:
    def create(self) -> list[int]:
        return [0, 0]

    def add(self, acc: list[int], v: dict[str, Any]) -> list[int]:
        return [acc[0] + v["v"], acc[1] + 1]

    def result(self, key: str, start: int, end: int, acc: list[int]) -> tuple[str, float]:
        return (key, acc[0] / acc[1] if key != "zero" else acc[0] / 0)

    def merge(self, a: list[int], b: list[int]) -> list[int]:
        return [a[0] + b[0], a[1] + b[1]]


def test_a_raising_window_result_is_the_window_s_firing_and_the_other_windows_fire(
    make_context: MakeContext,
) -> None:
    op = WindowAggregateOperator(Mean(), by_key, TumblingEventTimeWindows(1000), 0, on_error=DLQ)
    out, letters = start_located(op, make_context, "mean")
    for key, v in [("a", 2), ("zero", 5), ("a", 4), ("b", 1)]:
        op.process({"k": key, "v": v}, 10)
    op.process_watermark(1000)
    assert sorted(out.values) == [("a", 3.0), ("b", 1.0)]
    ((_topic, key, envelope),) = letters.letters
    assert key == b"'zero'" and envelope["firing"] == {"kind": "window", "start": 0, "end": 1000}
    assert envelope["function"] == "Mean.result" and envelope["value"] == "[5,1]"
    assert (envelope["offset"], envelope["timestamp"]) == (None, None)


def test_a_raising_window_result_fails_naming_the_window(make_context: MakeContext) -> None:
    op = WindowAggregateOperator(Mean(), by_key, TumblingEventTimeWindows(1000), 0, on_error=FAIL)
    start_located(op, make_context, "mean")
    op.process({"k": "zero", "v": 5}, 10)
    with pytest.raises(UserFunctionError) as raised:
        op.process_watermark(1000)
    assert raised.value.rejected.firing == WindowFiring(0, 1000) and raised.value.rejected.position is None
    assert "Mean.result raised ZeroDivisionError: division by zero on the firing of window [0, 1000)" in str(
        raised.value
    )
    assert "key 'zero' (given [5, 1])" in str(raised.value)


class Describe:
    def process(self, key: str, context: Any, elements: Any, out: Any) -> None:
        out.collect((key, len(elements)))
        if key == "bad":
            raise ValueError("cannot describe")


@pytest.mark.parametrize(
    ("fn", "window_function", "given"),
    [
        (ElementList(), ProcessElements(Describe()), '[{"k":"bad","v":1},{"k":"bad","v":2}]'),
        (Mean(), ProcessResult(Describe()), '[["bad",1.5]]'),
    ],
)
def test_a_raising_process_window_function_is_the_window_s_firing(
    make_context: MakeContext, fn: Any, window_function: Any, given: str
) -> None:
    op = WindowAggregateOperator(
        fn, by_key, TumblingEventTimeWindows(1000), 0, window_function=window_function, on_error=DLQ
    )
    out, letters = start_located(op, make_context, "describe")
    for key, v in [("bad", 1), ("ok", 3), ("bad", 2)]:
        op.process({"k": key, "v": v}, 10)
    op.process_watermark(1000)
    assert sorted(out.values) == [("bad", 2 if isinstance(fn, ElementList) else 1), ("ok", 1)]  # emitted stays
    ((_topic, _key, envelope),) = letters.letters
    assert envelope["function"] == "Describe.process" and envelope["value"] == given
    assert envelope["firing"] == {"kind": "window", "start": 0, "end": 1000}


def test_a_processing_time_window_s_result_raising_is_its_firing(make_context: MakeContext) -> None:
    op = WindowAggregateOperator(Mean(), by_key, TumblingProcessingTimeWindows(1000), 0, clock=lambda: 500)
    start_located(op, make_context, "mean")
    op.process({"k": "zero", "v": 1}, None)
    with pytest.raises(UserFunctionError, match=r"on the firing of window \[0, 1000\), key 'zero'"):
        op.on_processing_time(2_000)


def test_a_session_window_s_merge_raising_rejects_the_record_and_keeps_the_sessions(
    make_context: MakeContext,
) -> None:
    class BadMerge(Mean):
        def merge(self, a: list[int], b: list[int]) -> list[int]:
            raise ValueError("cannot merge")

    op = WindowAggregateOperator(BadMerge(), by_key, EventTimeSessionWindows(100), 0, on_error=DLQ)
    out, letters = start_with_letters(op, make_context, "sessions")
    op.process({"k": "a", "v": 2}, 10)
    op.process({"k": "a", "v": 4}, 200)
    op.process({"k": "a", "v": 6}, 105)  # would merge [10, 110) and [200, 300): rejected
    op.process_watermark(1000)
    assert sorted(out.values) == [("a", 2.0), ("a", 4.0)]
    ((_topic, _key, envelope),) = letters.letters
    assert (
        envelope["function"].endswith("<locals>.BadMerge.merge")
        and envelope["timestamp"] == 105
        and envelope["firing"] is None
    )
