"""KeyedProcessOperator timers: event-time timers fire in order when the watermark passes them,
processing-time timers when the (injected) clock does; per key and time, deletable, carried by
keyed state through a snapshot, a restore and a restore at another parallelism."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from weir.api import Collector, KeyedProcessFunction, StateSchema, TimeDomain
from weir.core.errors import JobDefinitionError
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import key_group_for_key, key_group_range_for_subtask
from weir.core.watermarks import MIN_WATERMARK
from weir.operators.keyed import KeyedProcessOperator, OnTimerContext
from weir.operators.timers import EVENT_TIMERS, PROCESSING_TIMERS


class FakeClock:
    """A processing-time clock the test moves."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Timers(KeyedProcessFunction):
    """Each record ``(key, command, time)``: registers or deletes a timer; ``on_timer`` emits what it saw."""

    def __init__(self) -> None:
        self.fired: list[tuple[Any, int, TimeDomain, int | None]] = []

    def process_element(self, value: tuple[Any, str, Any], ctx: Any, out: Collector) -> None:
        _key, command, time = value
        timers = ctx.timer_service()
        match command:
            case "event":
                timers.register_event_time_timer(time)
            case "delete-event":
                timers.delete_event_time_timer(time)
            case "processing":
                timers.register_processing_time_timer(time)
            case "delete-processing":
                timers.delete_processing_time_timer(time)
            case _:
                raise AssertionError(command)

    def on_timer(self, timestamp: int, ctx: OnTimerContext, out: Collector) -> None:
        assert ctx.timestamp == timestamp
        self.fired.append((ctx.key, timestamp, ctx.time_domain(), ctx.timer_service().current_watermark()))
        out.collect((ctx.key, timestamp, ctx.time_domain()))


def key_of(value: tuple[Any, ...]) -> Any:
    return value[0]


def operator(fn: Any = None, clock: FakeClock | None = None) -> KeyedProcessOperator:
    return KeyedProcessOperator(Timers() if fn is None else fn, key_of, clock=clock or FakeClock())


E, P = TimeDomain.EVENT_TIME, TimeDomain.PROCESSING_TIME


# Event time ------------------------------------------------------------------------------------------


def test_event_time_timers_fire_in_time_order_before_the_watermark_goes_on(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="timers")
    op.process(("b", "event", 30), 1)
    op.process(("a", "event", 20), 2)
    op.process(("a", "event", 10), 3)
    op.process(("c", "event", 40), 4)
    op.process_watermark(30)
    assert out.events == [
        ("record", ("a", 10, E)),
        ("record", ("a", 20, E)),
        ("record", ("b", 30, E)),
        ("watermark", 30),
    ]
    assert out.take() == [(("a", 10, E), 10), (("a", 20, E), 20), (("b", 30, E), 30)]  # stamped with their time
    op.process_watermark(39)
    assert out.records == []
    op.process_watermark(40)
    assert out.take() == [(("c", 40, E), 40)]
    assert out.watermarks == [30, 39, 40]


def test_a_timer_sees_the_watermark_that_fired_it(start_operator: StartOperator) -> None:
    fn = Timers()
    op = operator(fn)
    start_operator(op, uid="timers")
    op.process(("a", "event", 5), None)
    op.process_watermark(7)
    assert fn.fired == [("a", 5, E, 7)]


def test_registering_a_timer_twice_fires_it_once_and_each_key_has_its_own(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="timers")
    for value in [("a", "event", 10), ("a", "event", 10), ("b", "event", 10), ("a", "event", 10)]:
        op.process(value, None)
    op.process_watermark(100)
    assert sorted(out.values) == [("a", 10, E), ("b", 10, E)]


def test_a_deleted_timer_does_not_fire_and_the_others_do(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="timers")
    op.process(("a", "event", 10), None)
    op.process(("a", "event", 20), None)
    op.process(("b", "event", 10), None)
    op.process(("a", "delete-event", 10), None)
    op.process(("b", "delete-event", 99), None)  # none at 99: nothing happens
    op.process_watermark(100)
    assert out.values == [("b", 10, E), ("a", 20, E)]


def test_a_timer_deleted_and_registered_again_fires_once(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="timers")
    for value in [("a", "event", 10), ("a", "delete-event", 10), ("a", "event", 10), ("a", "delete-event", 10)]:
        op.process(value, None)
    op.process(("a", "event", 10), None)
    assert len(op.event_timers) == 1  # one heap entry per key and time, however often it was re-registered
    op.process_watermark(10)
    op.process_watermark(20)
    assert out.values == [("a", 10, E)]


def test_a_timer_at_or_behind_the_watermark_fires_at_the_next_watermark(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="timers")
    op.process_watermark(50)
    op.process(("a", "event", 50), None)
    op.process(("a", "event", 10), None)
    assert out.records == []
    op.process_watermark(50)  # not an advance: nothing fires, the watermark still goes on
    assert out.records == []
    op.process_watermark(51)
    assert out.values == [("a", 10, E), ("a", 50, E)]
    assert out.watermarks == [50, 50, 51]


class Chained(KeyedProcessFunction):
    """A timer registers one ``step`` later, up to ``until``."""

    def __init__(self, step: int, until: int) -> None:
        self.step, self.until = step, until

    def process_element(self, value: Any, ctx: Any, out: Collector) -> None:
        ctx.timer_service().register_event_time_timer(value[1])

    def on_timer(self, timestamp: int, ctx: Any, out: Collector) -> None:
        out.collect(timestamp)
        if timestamp + self.step <= self.until:
            ctx.timer_service().register_event_time_timer(timestamp + self.step)


def test_a_timer_registered_by_a_timer_fires_in_the_same_watermark_when_due(start_operator: StartOperator) -> None:
    op = KeyedProcessOperator(Chained(step=10, until=100), key_of)
    out = start_operator(op, uid="chained")
    op.process(("a", 0), None)
    op.process_watermark(35)
    assert out.events == [("record", 0), ("record", 10), ("record", 20), ("record", 30), ("watermark", 35)]
    op.process_watermark(1000)
    assert out.values[4:] == [40, 50, 60, 70, 80, 90, 100]


def test_timers_of_a_none_key_fire(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="timers")
    op.process((None, "event", 3), None)
    op.process_watermark(3)
    assert out.values == [(None, 3, E)]


def test_timer_times_may_be_timedeltas_since_the_epoch(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="timers")
    op.process(("a", "event", timedelta(seconds=2)), None)
    op.process(("a", "event", 2000), None)  # the same timer
    op.process(("b", "processing", timedelta(milliseconds=1500)), None)
    assert op.next_processing_time() == 1500
    op.process_watermark(2000)
    assert out.values == [("a", 2000, E)]


@pytest.mark.parametrize("time", [1.5, "10", True, None])
def test_a_timer_time_that_is_not_milliseconds_is_refused(start_operator: StartOperator, time: Any) -> None:
    op = operator()
    start_operator(op, uid="timers")
    with pytest.raises(JobDefinitionError, match="a timer's time must be an int of milliseconds or a datetime"):
        op.process(("a", "event", time), None)


def test_a_function_without_on_timer_lets_its_timers_pass(start_operator: StartOperator) -> None:
    class OnlyRegisters:
        def process_element(self, value: Any, ctx: Any, out: Collector) -> None:
            ctx.timer_service().register_event_time_timer(value[1])

    op = KeyedProcessOperator(OnlyRegisters(), key_of)
    out = start_operator(op, uid="silent")
    op.process(("a", 5), None)
    op.process_watermark(10)
    assert out.records == [] and out.watermarks == [10]
    assert op.event_timers.next_time() is None


def test_the_base_function_ignores_timers(start_operator: StartOperator) -> None:
    class Registers(KeyedProcessFunction):
        def process_element(self, value: Any, ctx: Any, out: Collector) -> None:
            ctx.timer_service().register_event_time_timer(value[1])

    op = KeyedProcessOperator(Registers(), key_of)
    out = start_operator(op, uid="base")
    op.process(("a", 5), None)
    op.process_watermark(10)
    assert out.records == []


# Processing time -------------------------------------------------------------------------------------


def test_processing_time_timers_fire_when_the_clock_passes_them(start_operator: StartOperator) -> None:
    clock = FakeClock(1_000)
    fn = Timers()
    op = operator(fn, clock)
    out = start_operator(op, uid="timers")
    assert op.next_processing_time() is None
    op.process(("a", "processing", 1_300), 7)
    op.process(("b", "processing", 1_100), 8)
    op.process(("a", "processing", 1_200), 9)
    assert op.next_processing_time() == 1_100
    op.on_processing_time(1_099)
    assert out.records == []
    op.on_processing_time(1_200)
    assert out.take() == [(("b", 1_100, P), None), (("a", 1_200, P), None)]  # no event timestamp
    assert op.next_processing_time() == 1_300
    op.on_processing_time(5_000)
    assert out.take() == [(("a", 1_300, P), None)]
    assert op.next_processing_time() is None
    assert out.watermarks == []


def test_event_and_processing_time_timers_are_apart(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="timers")
    op.process(("a", "event", 10), None)
    op.process(("a", "processing", 10), None)
    op.process_watermark(100)
    assert out.take() == [(("a", 10, E), 10)]
    op.process(("a", "delete-event", 10), None)  # already fired; the processing one stays
    op.on_processing_time(100)
    assert out.take() == [(("a", 10, P), None)]


def test_a_deleted_processing_time_timer_does_not_fire(start_operator: StartOperator) -> None:
    op = operator()
    out = start_operator(op, uid="timers")
    op.process(("a", "processing", 10), None)
    op.process(("a", "processing", 20), None)
    op.process(("a", "delete-processing", 10), None)
    op.on_processing_time(30)
    assert out.values == [("a", 20, P)]


def test_the_timer_service_tells_the_watermark_and_the_processing_time(start_operator: StartOperator) -> None:
    seen: list[tuple[int, int]] = []

    class Tells(KeyedProcessFunction):
        def process_element(self, value: Any, ctx: Any, out: Collector) -> None:
            timers = ctx.timer_service()
            seen.append((timers.current_watermark(), timers.current_processing_time()))

    clock = FakeClock(123)
    op = KeyedProcessOperator(Tells(), key_of, clock=clock)
    start_operator(op, uid="tells")
    op.process(("a",), None)
    op.process_watermark(40)
    clock.now = 456
    op.process(("a",), None)
    assert seen == [(MIN_WATERMARK, 123), (40, 456)]


def test_the_process_context_has_no_time_domain_but_the_timer_context_does(start_operator: StartOperator) -> None:
    op = operator()
    start_operator(op, uid="timers")
    assert not hasattr(op._process_ctx, "time_domain")
    assert op._timer_ctx.time_domain() is E


# Snapshot, restore, rescale -----------------------------------------------------------------------


def test_timers_survive_a_snapshot_and_fire_after_the_restore(start_operator: StartOperator) -> None:
    before = operator()
    start_operator(before, uid="timers")
    before.process(("a", "event", 20), None)
    before.process(("b", "event", 10), None)
    before.process(("a", "event", 30), None)
    before.process(("a", "delete-event", 30), None)
    before.process(("a", "processing", 500), None)
    before.snapshot_state(1)

    after = operator()
    out = start_operator(after, uid="timers")
    assert after.next_processing_time() == 500
    after.process_watermark(25)
    assert out.take() == [(("b", 10, E), 10), (("a", 20, E), 20)]
    after.process_watermark(100)
    assert out.records == []  # the deleted one stays deleted
    after.on_processing_time(10_000)  # overdue after the restore: fires at once
    assert out.values == [("a", 500, P)]


def test_a_timer_that_fired_before_the_snapshot_does_not_fire_again(start_operator: StartOperator) -> None:
    before = operator()
    start_operator(before, uid="timers")
    before.process(("a", "event", 10), None)
    before.process(("a", "event", 20), None)
    before.process_watermark(15)
    before.snapshot_state(1)
    after = operator()
    out = start_operator(after, uid="timers")
    after.process_watermark(100)
    assert out.values == [("a", 20, E)]


def test_timers_are_keyed_state_under_the_reserved_names(start_operator: StartOperator) -> None:
    op = operator()
    start_operator(op, uid="timers")
    op.process(("a", "event", 7), None)
    op.process(("a", "processing", 8), None)
    op.store.flush()
    kg = key_group_for_key("a", 128)
    assert [v for _k, v in op.store.items(EVENT_TIMERS, kg)] == [("a",)]
    assert [v for _k, v in op.store.items(PROCESSING_TIMERS, kg)] == [("a",)]


def key_in(subtask: int, parallelism: int, max_parallelism: int = 128) -> str:
    owned = key_group_range_for_subtask(max_parallelism, parallelism, SubtaskIndex(subtask))
    return next(k for i in range(1000) if key_group_for_key(k := f"key-{i}", max_parallelism) in owned)


def test_a_restore_at_another_parallelism_takes_only_the_timers_of_its_key_groups(
    start_operator: StartOperator, make_context: MakeContext
) -> None:
    first, second = key_in(0, 2), key_in(1, 2)
    old = operator()
    start_operator(old, uid="timers", subtask=0, parallelism=1)
    for key in (first, second):
        old.process((key, "event", 10), None)
        old.process((key, "processing", 20), None)
    old.snapshot_state(1)

    fired: list[list[Any]] = []
    for subtask in (0, 1):
        new = operator()
        out = CollectingOutput()
        new.setup(make_context("timers", subtask=subtask, parallelism=2), out)
        new.open()
        new.process_watermark(100)
        new.on_processing_time(100)
        fired.append(out.values)
    assert fired == [[(first, 10, E), (first, 20, P)], [(second, 10, E), (second, 20, P)]]


def test_timer_state_names_are_reserved() -> None:
    with pytest.raises(JobDefinitionError, match="reserved for timers"):
        KeyedProcessOperator(Timers(), key_of, [StateSchema(EVENT_TIMERS)])
