"""The window operator's other window kinds and window functions, driven directly: session windows
(merging, lateness, snapshots, restores at another parallelism), reduce, process and aggregate with a
process function against plain-Python references, and processing-time windows on an injected clock."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from weir.core.errors import JobDefinitionError
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import key_group_for_key, key_group_range_for_subtask
from weir.core.watermarks import MAX_WATERMARK
from weir.core.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TimeWindow,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
    WindowContext,
)
from weir.operators.base import InheritedState, StreamOperator
from weir.operators.windows import ElementList, ProcessElements, ProcessResult, ReduceAggregate, WindowAggregateOperator

Value = tuple[str, int]
Event = tuple[str, Any, int]  # ("record", value, ts) or ("watermark", None, watermark)


class Sum:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Value) -> int:
        return acc + value[1]

    def merge(self, a: int, b: int) -> int:
        return a + b

    def result(self, key: str, window_start: int, window_end: int, acc: int) -> tuple[str, int, int, int]:
        return key, window_start, window_end, acc


class SumWithoutMerge:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Value) -> int:
        return acc + value[1]

    def result(self, key: str, window_start: int, window_end: int, acc: int) -> int:
        return acc


class Describe:
    """A process function: the window, the watermark and the elements it saw (sorted, as a tuple)."""

    def process(self, key: str, context: WindowContext, elements: Sequence[Any], out: Any) -> None:
        out.collect((key, context.window.start, context.window.end, tuple(sorted(elements))))


class WithWatermark:
    def process(self, key: str, context: WindowContext, elements: Sequence[Any], out: Any) -> None:
        out.collect((key, context.window, context.current_watermark, context.current_processing_time, list(elements)))
        out.collect("again", 7)  # an explicit timestamp


def sessions(allowed_lateness_ms: int = 0, gap: int = 10) -> WindowAggregateOperator:
    return WindowAggregateOperator(Sum(), lambda v: v[0], EventTimeSessionWindows(gap), allowed_lateness_ms)


# Session windows --------------------------------------------------------------------------------


def test_an_element_bridging_two_sessions_merges_three_windows(start_operator: StartOperator) -> None:
    op = sessions()
    out = start_operator(op, uid="win")
    op.process(("a", 1), 0)  # [0, 10)
    op.process(("a", 2), 20)  # [20, 30)
    op.process(("b", 100), 12)  # another key: its own session [12, 22)
    op.process(("a", 4), 10)  # [10, 20) touches both: [0, 30)
    op.process_watermark(21)
    assert out.take() == [(("b", 12, 22, 100), 21)]
    op.process_watermark(28)
    assert out.records == []
    op.process_watermark(29)
    assert out.take() == [(("a", 0, 30, 7), 29)]
    op.process_watermark(MAX_WATERMARK)
    assert out.records == [] and op.late_records_dropped == 0
    assert list(op.store.items("win", key_group_for_key("a", 128))) == []


def test_out_of_order_elements_grow_a_session_at_both_ends(start_operator: StartOperator) -> None:
    op = sessions()
    out = start_operator(op, uid="win")
    op.process(("a", 1), 50)  # [50, 60)
    op.process(("a", 1), 45)  # [45, 55): [45, 60)
    op.process(("a", 1), 58)  # [58, 68): [45, 68)
    op.process(("a", 1), 30)  # [30, 40): a session of its own, 5 ms short of the other
    op.process(("a", 1), 47)  # inside: [45, 68) as it was
    op.process_watermark(39)
    assert out.take() == [(("a", 30, 40, 1), 39)]
    op.process(("a", 1), 40)  # its window [40, 50) is not late: it joins the open session
    op.process_watermark(66)
    assert out.records == []
    op.process_watermark(67)
    assert out.take() == [(("a", 40, 68, 5), 67)]
    assert op.late_records_dropped == 0


def test_an_element_late_on_its_own_joins_a_session_that_is_still_open(start_operator: StartOperator) -> None:
    op = sessions()
    out = start_operator(op, uid="win")
    op.process(("a", 1), 100)  # [100, 110)
    op.process(("a", 2), 105)  # [100, 115)
    op.process_watermark(112)
    op.process(("a", 4), 95)  # [95, 105) would be late alone, but [95, 115) is not (as in Flink)
    op.process(("a", 8), 50)  # [50, 60) meets no session: late, dropped
    assert op.late_records_dropped == 1
    op.process_watermark(114)
    assert out.take() == [(("a", 95, 115, 7), 114)]


def test_a_late_element_refires_a_fired_session_and_can_merge_it_with_the_next(start_operator: StartOperator) -> None:
    op = sessions(allowed_lateness_ms=20)
    out = start_operator(op, uid="win")
    op.process(("a", 1), 5)  # [5, 15)
    op.process(("a", 2), 40)  # [40, 50)
    op.process_watermark(14)
    assert out.take() == [(("a", 5, 15, 1), 14)]
    op.process(("a", 4), 5)  # fired, not cleaned up: fires again at once
    assert out.take() == [(("a", 5, 15, 5), 14)]
    op.process(("a", 8), 2)  # [2, 12) extends its start: [2, 15) fires at once
    assert out.take() == [(("a", 2, 15, 13), 14)]
    op.process(("a", 16), 20)  # [20, 30): a session of its own, not fired yet
    assert out.records == []
    op.process_watermark(29)
    assert out.take() == [(("a", 20, 30, 16), 29)]
    op.process(("a", 32), 14)  # [14, 24) bridges the two fired sessions: [2, 30) fires at once
    assert out.take() == [(("a", 2, 30, 61), 29)]
    op.process(("a", 64), 30)  # [30, 40) bridges [2, 30) and [40, 50): [2, 50) has not fired yet
    assert out.records == []
    op.process_watermark(48)
    assert out.records == []
    op.process_watermark(49)
    assert out.take() == [(("a", 2, 50, 127), 49)]
    op.process_watermark(68)
    op.process(("a", 128), 1)  # [1, 11) into [2, 50), whose cleanup is at 69: [1, 50) fires again
    assert out.take() == [(("a", 1, 50, 255), 49)]
    op.process_watermark(69)
    op.process(("a", 256), 1)
    assert out.records == [] and op.late_records_dropped == 1
    op.process_watermark(MAX_WATERMARK)  # the timers of the absorbed windows find nothing
    assert out.records == [] and op._sessions == {}


def test_a_session_that_absorbs_an_element_keeps_one_timer_and_fires_once(start_operator: StartOperator) -> None:
    op = sessions(allowed_lateness_ms=5)
    out = start_operator(op, uid="win")
    op.process(("a", 1), 10)  # [10, 20)
    op.process(("a", 2), 8)  # [8, 18): [8, 20), new bounds
    op.process(("a", 4), 9)  # [9, 19): inside [8, 20)
    op.process(("a", 8), 10)  # [10, 20): inside too
    op.process_watermark(19)
    assert out.take() == [(("a", 8, 20, 15), 19)]
    op.process_watermark(24)  # cleanup: nothing fires again
    op.process_watermark(MAX_WATERMARK)
    assert out.records == [] and op._sessions == {}


def test_a_session_with_an_aggregate_that_cannot_merge_is_a_job_definition_error() -> None:
    with pytest.raises(JobDefinitionError, match="SumWithoutMerge needs a merge"):
        WindowAggregateOperator(SumWithoutMerge(), lambda v: v[0], EventTimeSessionWindows(10), 0)
    WindowAggregateOperator(SumWithoutMerge(), lambda v: v[0], TumblingEventTimeWindows(10), 0)  # no merge needed


def plain_sessions(records: list[tuple[Value, int]], gap: int) -> Counter[tuple[str, int, int, int]]:
    """Sessions by sorting each key's timestamps: a gap of more than ``gap`` after a session's last
    element (its window's end is before the next element) starts the next."""
    by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (key, n), ts in records:
        by_key[key].append((ts, n))
    result: Counter[tuple[str, int, int, int]] = Counter()
    for key, items in by_key.items():
        items.sort()
        start, end, total = items[0][0], items[0][0] + gap, 0
        for ts, n in items:
            if ts > end:
                result[(key, start, end, total)] += 1
                start, total = ts, 0
            end = max(end, ts + gap)
            total += n
        result[(key, start, end, total)] += 1
    return result


def random_events(seed: int, count: int, bound: int, keys: int, spread: int = 3) -> list[Event]:
    """Records out of order by less than ``bound``, a watermark every few records that none is late to."""
    rng = random.Random(seed)
    events: list[Event] = []
    ts, max_ts = 0, 0
    for i in range(count):
        ts += rng.randrange(spread)
        stamp = max(0, ts - rng.randrange(bound))
        events.append(("record", (f"k{rng.randrange(keys)}", rng.randrange(100)), stamp))
        max_ts = max(max_ts, stamp)
        if i % 7 == 0:
            events.append(("watermark", None, max_ts - bound))
    events.append(("watermark", None, MAX_WATERMARK))
    return events


def records_of(events: list[Event]) -> list[tuple[Value, int]]:
    return [(value, ts) for kind, value, ts in events if kind == "record"]


def feed(op: StreamOperator, events: list[Event]) -> None:
    for kind, value, ts in events:
        if kind == "record":
            op.process(value, ts)
        else:
            op.process_watermark(ts)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("gap", [1, 5, 20])
def test_sessions_equal_a_plain_computation(start_operator: StartOperator, seed: int, gap: int) -> None:
    events = random_events(seed, 1500, bound=12, keys=7, spread=4)
    op = sessions(gap=gap)
    out = start_operator(op, uid="win")
    feed(op, events)
    assert op.late_records_dropped == 0
    assert Counter(out.values) == plain_sessions(records_of(events), gap)
    assert all(ts == end - 1 for (_, _, end, _), ts in out.records)
    assert op._sessions == {}  # every session dropped when it fired


# Reduce, process, aggregate with a process function ---------------------------------------------


def plain_windows(records: list[tuple[Value, int]], assigner: Any) -> dict[tuple[str, int, int], list[int]]:
    """The values of each (key, window), in arrival order; sessions as in :func:`plain_sessions`."""
    contents: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    if isinstance(assigner, EventTimeSessionWindows):
        for key, start, end, _total in plain_sessions(records, assigner.gap_ms):
            contents[(key, start, end)] = sorted(
                n for (k, n), ts in records if k == key and start <= ts < end - assigner.gap_ms + 1
            )
        return contents
    for (key, n), ts in records:
        for w in assigner.assign(ts):
            contents[(key, w.start, w.end)].append(n)
    return contents


ASSIGNERS = [TumblingEventTimeWindows(50), SlidingEventTimeWindows(60, 20), EventTimeSessionWindows(6)]


@pytest.mark.parametrize("assigner", ASSIGNERS, ids=repr)
def test_reduce_process_and_aggregate_with_a_process_function_equal_plain_computations(
    start_operator: StartOperator, assigner: Any
) -> None:
    events = random_events(11, 1200, bound=15, keys=5)
    expected = plain_windows(records_of(events), assigner)

    def key(v: Value) -> str:
        return v[0]

    def max_of(a: Value, b: Value) -> Value:
        return a if a[1] >= b[1] else b

    reduce_op = WindowAggregateOperator(ReduceAggregate(max_of), key, assigner, 0)
    process_op = WindowAggregateOperator(
        ElementList(), key, assigner, 0, window_function=ProcessElements(Describe()), clock=lambda: 0
    )
    with_fn_op = WindowAggregateOperator(
        Sum(), key, assigner, 0, window_function=ProcessResult(Describe()), clock=lambda: 0
    )
    reduce_fn_op = WindowAggregateOperator(
        ReduceAggregate(max_of), key, assigner, 0, window_function=ProcessResult(Describe()), clock=lambda: 0
    )
    outs = [
        start_operator(op, uid=f"win-{i}") for i, op in enumerate((reduce_op, process_op, with_fn_op, reduce_fn_op))
    ]
    for op in (reduce_op, process_op, with_fn_op, reduce_fn_op):
        feed(op, events)

    assert sorted(v for v, _ in outs[0].records) == sorted((k, max(ns)) for (k, _s, _e), ns in expected.items())
    assert Counter(outs[1].values) == Counter(
        (k, s, e, tuple(sorted((k, n) for n in ns))) for (k, s, e), ns in expected.items()
    )
    assert Counter(outs[2].values) == Counter((k, s, e, ((k, s, e, sum(ns)),)) for (k, s, e), ns in expected.items())
    assert Counter(outs[3].values) == Counter((k, s, e, ((k, max(ns)),)) for (k, s, e), ns in expected.items())
    for out in outs[1:]:
        assert all(ts == end - 1 for (_, _, end, _), ts in out.records)


def test_a_process_function_sees_the_window_and_the_elements_in_arrival_order(start_operator: StartOperator) -> None:
    now = [1234]
    op = WindowAggregateOperator(
        ElementList(),
        lambda v: v[0],
        TumblingEventTimeWindows(10),
        5,
        window_function=ProcessElements(WithWatermark()),
        clock=lambda: now[0],
    )
    out = start_operator(op, uid="win")
    for n, ts in ((3, 4), (1, 2), (2, 8)):
        op.process(("a", n), ts)
    op.process_watermark(11)
    assert out.take() == [
        (("a", TimeWindow(0, 10), 11, 1234, [("a", 3), ("a", 1), ("a", 2)]), 9),
        ("again", 7),
    ]
    now[0] = 2000
    op.process(("a", 0), 1)  # a late firing: the list grew, the context tells the watermark now
    assert out.take() == [
        (("a", TimeWindow(0, 10), 11, 2000, [("a", 3), ("a", 1), ("a", 2), ("a", 0)]), 9),
        ("again", 7),
    ]


def test_a_process_function_may_sort_its_elements_without_touching_state(start_operator: StartOperator) -> None:
    class SortInPlace:
        def process(self, key: str, context: WindowContext, elements: Sequence[Any], out: Any) -> None:
            out.collect(sorted(elements))

    op = WindowAggregateOperator(
        ElementList(), lambda v: v[0], TumblingEventTimeWindows(10), 10, window_function=ProcessElements(SortInPlace())
    )
    out = start_operator(op, uid="win")
    op.process(("a", 2), 1)
    op.process(("a", 1), 2)
    op.process_watermark(9)
    op.process(("a", 0), 3)
    assert out.values == [[("a", 1), ("a", 2)], [("a", 0), ("a", 1), ("a", 2)]]
    ((_sk, (_key, elements)),) = op.store.items("win", key_group_for_key("a", 128))
    assert elements == [("a", 2), ("a", 1), ("a", 0)]


def test_process_elements_needs_the_element_list() -> None:
    with pytest.raises(ValueError, match="needs the ElementList aggregate"):
        WindowAggregateOperator(
            Sum(), lambda v: v[0], TumblingEventTimeWindows(10), 0, window_function=ProcessElements(Describe())
        )


# Snapshots and restores -------------------------------------------------------------------------


def late_events(seed: int) -> list[Event]:
    """Records with some late ones (within and beyond a lateness of 15) and watermarks."""
    rng = random.Random(seed)
    events: list[Event] = []
    ts = 0
    for i in range(800):
        ts += rng.randrange(4)
        stamp = max(0, ts - rng.randrange(40))
        events.append(("record", (f"k{rng.randrange(6)}", rng.randrange(100)), stamp))
        if i % 5 == 0:
            events.append(("watermark", None, ts - 10))
    events.append(("watermark", None, MAX_WATERMARK))
    return events


def window_ops(kind: str) -> WindowAggregateOperator:
    match kind:
        case "session-sum":
            return WindowAggregateOperator(Sum(), lambda v: v[0], EventTimeSessionWindows(5), 15)
        case "session-process":
            return WindowAggregateOperator(
                ElementList(),
                lambda v: v[0],
                EventTimeSessionWindows(5),
                15,
                window_function=ProcessElements(Describe()),
            )
        case "sliding-reduce":
            return WindowAggregateOperator(
                ReduceAggregate(lambda a, b: (a[0], a[1] + b[1])), lambda v: v[0], SlidingEventTimeWindows(30, 10), 15
            )
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["session-sum", "session-process", "sliding-reduce"])
@pytest.mark.parametrize("cut", [1, 250, 611])
def test_a_snapshot_and_restore_mid_stream_equals_an_uninterrupted_run(
    start_operator: StartOperator, kind: str, cut: int
) -> None:
    events = late_events(5)
    whole = window_ops(kind)
    whole_out = start_operator(whole, uid="whole")
    feed(whole, events)
    assert whole.late_records_dropped > 0  # the run exercises lateness
    assert any(ts <= prev for (_, ts), (_, prev) in zip(whole_out.records[1:], whole_out.records, strict=False))

    first = window_ops(kind)
    out = start_operator(first, uid="cut")
    feed(first, events[:cut])
    snapshot = first.snapshot_state(1)
    assert snapshot is not None
    second = window_ops(kind)
    restored = start_operator(second, uid="cut", restore=snapshot)
    feed(second, events[cut:])
    assert out.records + restored.records == whole_out.records
    assert first.late_records_dropped + second.late_records_dropped == whole.late_records_dropped


MAX_PARALLELISM = 128


def route(ops: list[WindowAggregateOperator], event: Event, lagging: int | None = None) -> None:
    """One event to the subtasks of ``ops``: a record to its key's owner, a watermark to all (but
    subtask ``lagging``, which is behind)."""
    parallelism = len(ops)
    if event[0] == "watermark":
        for s, op in enumerate(ops):
            if s != lagging:
                op.process_watermark(event[2])
        return
    kg = key_group_for_key(event[1][0], MAX_PARALLELISM)
    owner = next(
        s
        for s in range(parallelism)
        if kg in key_group_range_for_subtask(MAX_PARALLELISM, parallelism, SubtaskIndex(s))
    )
    ops[owner].process(event[1], event[2])


def start_parallel(
    make_context: MakeContext, kind: str, parallelism: int, uid: str, inherited: list[InheritedState] | None = None
) -> tuple[list[WindowAggregateOperator], list[CollectingOutput]]:
    ops = [window_ops(kind) for _ in range(parallelism)]
    outs = [CollectingOutput() for _ in range(parallelism)]
    for s, (op, out) in enumerate(zip(ops, outs, strict=True)):
        op.setup(make_context(uid, subtask=s, parallelism=parallelism), out)
        if inherited is not None:
            op.restore_inherited_state(inherited)
        op.open()
    return ops, outs


@pytest.mark.parametrize("kind", ["session-sum", "session-process"])
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 3), (3, 2)])
def test_sessions_restored_at_another_parallelism_equal_an_uninterrupted_run(
    make_context: MakeContext, kind: str, before: int, after: int
) -> None:
    """Two copies of one job at parallelism ``before``; subtask 0 lags behind the others' watermark
    when the second copy is snapshotted and restored at ``after``: from there on, it emits what the
    copy that went on emits (nothing fires twice, what was kept for lateness refires)."""
    events = late_events(9)
    cut = 400
    lag_from = 300
    going_on, going_on_outs = start_parallel(make_context, kind, before, "going-on")
    old, _old_outs = start_parallel(make_context, kind, before, "cut")
    for i, event in enumerate(events[:cut]):
        lagging = 0 if i >= lag_from else None
        route(going_on, event, lagging)
        route(old, event, lagging)
    emitted_before = [len(out.records) for out in going_on_outs]
    states = [
        InheritedState(s, before, op.ctx.key_group_range, op.snapshot_state(1) or b"") for s, op in enumerate(old)
    ]
    new, new_outs = start_parallel(make_context, kind, after, "cut", inherited=states)
    for event in events[cut:]:
        route(going_on, event)
        route(new, event)
    after_cut = Counter(v for out, n in zip(going_on_outs, emitted_before, strict=True) for v, _ in out.records[n:])
    assert sum(after_cut.values()) > 50
    assert Counter(v for out in new_outs for v, _ in out.records) == after_cut
    assert sum(op.late_records_dropped for op in new) + sum(op.late_records_dropped for op in old) == sum(
        op.late_records_dropped for op in going_on
    )


# Processing-time windows --------------------------------------------------------------------------


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def processing(clock: Clock, window_function: Any = None) -> WindowAggregateOperator:
    return WindowAggregateOperator(
        Sum(), lambda v: v[0], TumblingProcessingTimeWindows(100), 50, window_function=window_function, clock=clock
    )


def test_processing_time_windows_assign_by_the_clock_and_fire_when_it_passes_their_end(
    start_operator: StartOperator,
) -> None:
    clock = Clock(1_000_050)
    op = processing(clock)
    out = start_operator(op, uid="win")
    assert op.next_processing_time() is None
    op.process(("a", 1), None)  # no timestamp needed
    op.process(("a", 2), 5)  # the event time is not what counts
    op.process(("b", 4), 999_999_999)
    assert op.next_processing_time() == 1_000_099
    op.process_watermark(MAX_WATERMARK)  # a watermark fires nothing
    assert out.records == [] and out.watermarks == [MAX_WATERMARK]
    clock.now = 1_000_120
    op.process(("a", 8), 0)  # wall time is in the next window, though the last has not fired yet
    op.on_processing_time(1_000_098)
    assert out.records == []
    op.on_processing_time(1_000_099)
    assert sorted(out.take()) == [
        (("a", 1_000_000, 1_000_100, 3), 1_000_099),
        (("b", 1_000_000, 1_000_100, 4), 1_000_099),
    ]
    assert op.next_processing_time() == 1_000_199
    op.on_processing_time(1_000_099)
    assert out.records == []
    op.on_processing_time(5_000_000)
    assert out.take() == [(("a", 1_000_100, 1_000_200, 8), 1_000_199)]
    assert op.next_processing_time() is None and op.late_records_dropped == 0
    assert list(op.store.items("win", key_group_for_key("a", 128))) == []


def test_processing_time_windows_equal_a_plain_computation_and_survive_a_restore(start_operator: StartOperator) -> None:
    rng = random.Random(21)
    clock = Clock(0)
    op = processing(clock)
    out = start_operator(op, uid="win")
    expected: Counter[tuple[str, int, int, int]] = Counter()
    sums: dict[tuple[str, int], int] = defaultdict(int)
    snapshot_at = 700
    for i in range(1500):
        clock.now += rng.randrange(5)
        value = (f"k{rng.randrange(4)}", rng.randrange(10))
        sums[(value[0], clock.now - clock.now % 100)] += value[1]
        op.process(value, None)
        if rng.random() < 0.05:
            op.on_processing_time(clock.now)
        if i == snapshot_at:
            snapshot = op.snapshot_state(1)
            assert snapshot is not None
            emitted = len(out.records)
            op = processing(clock)
            restored = start_operator(op, uid="win", restore=snapshot)
            restored.records = out.records[:emitted]
            out = restored
    op.on_processing_time(clock.now + 1000)
    for (key, start), total in sums.items():
        expected[(key, start, start + 100, total)] += 1
    assert Counter(out.values) == expected
    assert op.next_processing_time() is None


def test_a_processing_time_window_with_a_process_function_is_told_the_wall_time(start_operator: StartOperator) -> None:
    clock = Clock(10)
    op = processing(clock, ProcessResult(WithWatermark()))
    out = start_operator(op, uid="win")
    op.process(("a", 1), None)
    op.process_watermark(3)
    clock.now = 150
    op.on_processing_time(150)
    assert out.take() == [(("a", TimeWindow(0, 100), 3, 150, [("a", 0, 100, 1)]), 99), ("again", 7)]
