"""Side outputs of the operators: ``ctx.output(tag, value)`` of a (keyed) process function, in
``process_element`` and in ``on_timer``, and the late data of both window operators
(``side_output_late_data``), each value stamped as the brief of its operator says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from tests.unit.conftest import CollectingOutput, MakeContext
from weir.api import Collector, KeyedProcessFunction, OutputTag, ProcessFunction
from weir.core.columnar import BuiltinAggregates, Count, Schema, Sum
from weir.core.errors import JobDefinitionError
from weir.core.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from weir.operators.base import SideOutputs, StreamOperator
from weir.operators.basic import ProcessOperator
from weir.operators.columnar import ColumnarWindowAggregateOperator
from weir.operators.keyed import KeyedProcessOperator
from weir.operators.windows import WindowAggregateOperator

LATE = OutputTag("late")
SIDE = OutputTag("side")
UNTAKEN = OutputTag("untaken")

StartWithSides = Callable[..., tuple[CollectingOutput, dict[str, CollectingOutput]]]


@pytest.fixture
def start_with_sides(make_context: MakeContext) -> StartWithSides:
    """Set an operator up with a collecting output per side output name given, then open it."""

    def start(op: StreamOperator, *names: str) -> tuple[CollectingOutput, dict[str, CollectingOutput]]:
        main, sides = CollectingOutput(), {name: CollectingOutput() for name in names}
        op.setup(make_context("op"), main, SideOutputs(sides))
        op.open()
        return main, sides

    return start


# Process functions ---------------------------------------------------------------------------------


class Router(ProcessFunction):
    """Negative values to SIDE (and UNTAKEN), the rest to the main output."""

    def process_element(self, value: int, ctx: Any, out: Collector) -> None:
        if value < 0:
            ctx.output(SIDE, -value)
            ctx.output(UNTAKEN, value)
        else:
            out.collect(value)


def test_a_process_function_emits_to_a_side_output_with_the_records_timestamp(
    start_with_sides: StartWithSides,
) -> None:
    op = ProcessOperator(Router())
    main, sides = start_with_sides(op, "side")
    for value, ts in ((1, 10), (-2, 20), (3, None), (-4, None)):
        op.process(value, ts)
    assert main.records == [(1, 10), (3, None)]
    assert sides["side"].records == [(2, 20), (4, None)]  # UNTAKEN is taken by nothing: dropped


def test_ctx_output_refuses_what_is_not_an_output_tag(start_with_sides: StartWithSides) -> None:
    class ByName(ProcessFunction):
        def process_element(self, value: Any, ctx: Any, out: Collector) -> None:
            ctx.output("side", value)

    op = ProcessOperator(ByName())
    start_with_sides(op, "side")
    with pytest.raises(JobDefinitionError, match="takes an OutputTag"):
        op.process(1, 1)


class Alarms(KeyedProcessFunction):
    """Each ``(key, value, timer)`` registers a timer (event time if ``timer > 0``, processing time
    at ``-timer`` otherwise) and sends ``value`` to SIDE; each timer sends what fired to SIDE."""

    def process_element(self, value: tuple[str, int, int], ctx: Any, out: Collector) -> None:
        key, amount, timer = value
        if timer > 0:
            ctx.timer_service().register_event_time_timer(timer)
        else:
            ctx.timer_service().register_processing_time_timer(-timer)
        ctx.output(SIDE, (key, amount))
        out.collect(amount)

    def on_timer(self, timestamp: int, ctx: Any, out: Collector) -> None:
        ctx.output(SIDE, (ctx.key, "timer", timestamp, ctx.time_domain().value))


def test_a_keyed_process_function_emits_to_a_side_output_in_process_element_and_on_timer(
    start_with_sides: StartWithSides,
) -> None:
    now = [0]
    op = KeyedProcessOperator(Alarms(), lambda v: v[0], clock=lambda: now[0])
    main, sides = start_with_sides(op, "side")
    op.process(("a", 1, 100), 5)
    op.process(("b", 2, -50), 6)
    assert main.records == [(1, 5), (2, 6)]
    assert sides["side"].take() == [(("a", 1), 5), (("b", 2), 6)]
    op.process_watermark(100)  # the event-time timer: its output is stamped with its time
    assert sides["side"].take() == [(("a", "timer", 100, "event_time"), 100)]
    now[0] = 50
    op.on_processing_time(50)  # a processing-time timer: no timestamp, as its main output
    assert sides["side"].take() == [(("b", "timer", 50, "processing_time"), None)]
    assert main.watermarks == [100] and sides["side"].watermarks == []  # the chain fans watermarks out


# Windows -------------------------------------------------------------------------------------------


class Sum2:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: tuple[str, int]) -> int:
        return acc + value[1]

    def merge(self, a: int, b: int) -> int:
        return a + b

    def result(self, key: str, start: int, end: int, acc: int) -> tuple[str, int, int]:
        return (key, start, acc)


def window(assigner: Any, lateness: int = 0, late_data: OutputTag | None = LATE) -> WindowAggregateOperator:
    return WindowAggregateOperator(Sum2(), lambda v: v[0], assigner, lateness, late_data=late_data)


def test_a_late_element_goes_to_the_late_data_side_output_with_its_own_timestamp(
    start_with_sides: StartWithSides,
) -> None:
    op = window(TumblingEventTimeWindows(10), lateness=5)
    main, sides = start_with_sides(op, "late")
    op.process(("a", 1), 3)
    op.process_watermark(12)  # [0, 10) fires, kept until 9 + 5
    op.process(("a", 2), 4)  # within the lateness: a late firing, not late data
    op.process_watermark(14)  # [0, 10) is cleaned up
    op.process(("a", 4), 7)  # late
    op.process(("a", 8), 15)  # on time
    assert main.values == [("a", 0, 1), ("a", 0, 3)]
    assert sides["late"].records == [(("a", 4), 7)]
    assert op.late_records_dropped == 1


def test_an_element_late_for_some_of_its_sliding_windows_only_is_not_late_data(
    start_with_sides: StartWithSides,
) -> None:
    op = window(SlidingEventTimeWindows(20, 10))
    main, sides = start_with_sides(op, "late")
    op.process_watermark(19)  # [0, 20) fired: an element at 15 is late for it, not for [10, 30)
    op.process(("a", 1), 15)
    assert sides["late"].records == [] and op.late_records_dropped == 1
    op.process_watermark(29)
    op.process(("a", 2), 25)  # late for [10, 30), not for [20, 40)
    op.process(("a", 3), 9)  # late for both [-10, 10) and [0, 20): once to the side output
    assert sides["late"].records == [(("a", 3), 9)]
    assert op.late_records_dropped == 4
    assert main.values == [("a", 10, 1)]


def test_a_session_too_late_to_merge_goes_to_the_late_data_side_output(start_with_sides: StartWithSides) -> None:
    op = window(EventTimeSessionWindows(10))
    main, sides = start_with_sides(op, "late")
    op.process(("a", 1), 0)
    op.process_watermark(30)
    op.process(("a", 2), 5)
    assert main.values == [("a", 0, 1)] and sides["late"].records == [(("a", 2), 5)]


def test_without_a_late_data_tag_late_elements_are_only_dropped(start_with_sides: StartWithSides) -> None:
    op = window(TumblingEventTimeWindows(10), late_data=None)
    _main, sides = start_with_sides(op, "late")
    op.process_watermark(20)
    op.process(("a", 1), 3)
    assert sides["late"].records == [] and op.late_records_dropped == 1


SCHEMA = Schema.of({"key": str, "value": int, "ts": int})


def batch(*events: tuple[str, int, int]) -> pa.RecordBatch:
    return SCHEMA.decoder("ts").batch([[e[0] for e in events], [e[1] for e in events], [e[2] for e in events]])


def columnar_window(assigner: Any, lateness: int = 0) -> ColumnarWindowAggregateOperator:
    aggregates = BuiltinAggregates({"count": Count(), "sum": Sum("value")}, "key")
    return ColumnarWindowAggregateOperator(aggregates, "key", assigner, lateness, late_data=LATE)


def test_the_columnar_window_sends_its_late_rows_as_records_to_the_late_data_side_output(
    start_with_sides: StartWithSides,
) -> None:
    op = columnar_window(TumblingEventTimeWindows(10), lateness=5)
    main, sides = start_with_sides(op, "late")
    op.process(batch(("a", 1, 3), ("b", 2, 12)), None)
    op.process_watermark(19)  # [0, 10) fired and cleaned up; [10, 20) fired, kept until 24
    op.process(batch(("a", 4, 7), ("b", 8, 13), ("c", 16, 2), ("a", 32, 21)), None)
    assert sides["late"].records == [
        ({"key": "a", "value": 4, "ts": 7}, 7),
        ({"key": "c", "value": 16, "ts": 2}, 2),
    ]
    assert op.late_records_dropped == 2
    assert [(r["key"], r["window_start"], r["sum"]) for r in main.values] == [
        ("a", 0, 1),
        ("b", 10, 2),
        ("b", 10, 10),  # the late firing of the row within the lateness
    ]


def test_the_columnar_sliding_window_sends_a_row_once_when_it_is_late_for_all_its_windows(
    start_with_sides: StartWithSides,
) -> None:
    op = columnar_window(SlidingEventTimeWindows(20, 10))
    _main, sides = start_with_sides(op, "late")
    op.process_watermark(29)
    op.process(batch(("a", 1, 25), ("a", 2, 9), ("a", 4, 15)), None)
    assert sides["late"].records == [  # 25 is on time in [20, 40)
        ({"key": "a", "value": 2, "ts": 9}, 9),
        ({"key": "a", "value": 4, "ts": 15}, 15),
    ]
    assert op.late_records_dropped == 5  # counted per window: 25 in [10, 30), 9 and 15 in two each
