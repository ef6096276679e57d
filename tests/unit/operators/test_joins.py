"""Window join and interval join operators against plain-Python references over random keyed
inputs (fixed seeds) that arrive out of order within the watermark's bound; late records dropped,
state dropped once the watermark passes what can still match, and restores mid-stream and at
another parallelism that give what an uninterrupted run gives."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from weir.api import Collector, SlidingEventTimeWindows, TumblingEventTimeWindows
from weir.core.errors import JobDefinitionError
from weir.core.ids import SubtaskIndex
from weir.core.keygroups import key_group_for_key, key_group_range_for_subtask
from weir.operators.joins import (
    LEFT_BUFFER,
    LEFT_TIMES,
    RIGHT_BUFFER,
    RIGHT_TIMES,
    IntervalJoinOperator,
    JoinContext,
    WindowJoinOperator,
)
from weir.operators.keyed import KeyedCoProcessOperator
from weir.operators.timers import EVENT_TIMERS

BOUND = 20
"""How far out of order the random inputs are: the watermark trails the newest timestamp by BOUND + 1."""


@dataclass(frozen=True)
class Rec:
    side: int
    key: str
    ts: int
    seq: int


Step = tuple[str, Any]  # ("record", Rec) or ("watermark", int)


def key_of(rec: Rec) -> str:
    return rec.key


KEYS = (key_of, key_of)


def random_steps(seed: int, n: int = 400, keys: int = 6) -> list[Step]:
    """Records of both sides interleaved, each at most BOUND ms behind the newest, and the
    watermark (newest - BOUND - 1) after some of them: no record is late."""
    rng = random.Random(seed)
    steps: list[Step] = []
    now = newest = 1_000
    for seq in range(n):
        now += rng.randint(0, 6)
        ts = now - rng.randint(0, BOUND)
        newest = max(newest, ts)
        steps.append(("record", Rec(rng.randint(0, 1), f"k{rng.randint(0, keys - 1)}", ts, seq)))
        if rng.random() < 0.2:
            steps.append(("watermark", newest - BOUND - 1))
    steps.append(("watermark", newest + 10_000))
    return steps


def records(steps: Sequence[Step]) -> list[Rec]:
    return [r for kind, r in steps if kind == "record"]


def feed(op: KeyedCoProcessOperator, steps: Sequence[Step]) -> None:
    for kind, item in steps:
        if kind == "record":
            op.process_input(item.side, item, item.ts)
        else:
            op.process_watermark(item)


def pair(x: Rec, y: Rec) -> tuple[int, int]:
    return (x.seq, y.seq)


def state_entries(op: KeyedCoProcessOperator, *names: str) -> int:
    op.store.flush()
    return sum(len(list(op.store.items(name, kg))) for name in names for kg in op.ctx.key_group_range)


def owner(key: str, parallelism: int) -> int:
    kg = key_group_for_key(key, 128)
    return next(s for s in range(parallelism) if kg in key_group_range_for_subtask(128, parallelism, SubtaskIndex(s)))


# Window join -------------------------------------------------------------------------------------


def window_join_reference(recs: Sequence[Rec], size: int, slide: int) -> list[tuple[tuple[int, int], int]]:
    """Every (x, y) pair of a key in a window ``[s, s + size)``, ``s`` a multiple of ``slide``,
    stamped with the window's last timestamp."""
    out = []
    for x in recs:
        for y in recs:
            if x.side != 0 or y.side != 1 or x.key != y.key:
                continue
            first = (max(x.ts, y.ts) - size) // slide + 1
            for k in range(first, min(x.ts, y.ts) // slide + 1):
                start = k * slide
                if start <= x.ts < start + size and start <= y.ts < start + size:
                    out.append(((x.seq, y.seq), start + size - 1))
    return sorted(out)


ASSIGNERS = [
    pytest.param(TumblingEventTimeWindows(50), 50, 50, id="tumbling"),
    pytest.param(SlidingEventTimeWindows(60, 20), 60, 20, id="sliding"),
]


@pytest.mark.parametrize(("assigner", "size", "slide"), ASSIGNERS)
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_window_join_pairs_each_windows_records_as_the_reference(
    start_operator: StartOperator, assigner: Any, size: int, slide: int, seed: int
) -> None:
    steps = random_steps(seed)
    op = WindowJoinOperator(pair, assigner, KEYS)
    out = start_operator(op, uid="wj")
    feed(op, steps)
    expected = window_join_reference(records(steps), size, slide)
    assert sorted(out.records) == expected
    assert expected
    assert op.late_records_dropped == 0


def test_window_join_emits_when_the_window_fires_first_side_outer(start_operator: StartOperator) -> None:
    op = WindowJoinOperator(pair, TumblingEventTimeWindows(10), KEYS)
    out = start_operator(op, uid="wj")
    for rec in [Rec(1, "a", 3, 0), Rec(0, "a", 5, 1), Rec(0, "a", 1, 2), Rec(1, "a", 9, 3), Rec(0, "b", 4, 4)]:
        op.process_input(rec.side, rec, rec.ts)
    assert out.records == []
    op.process_watermark(8)
    assert out.records == []
    op.process_watermark(9)
    assert out.events[-1] == ("watermark", 9)  # the window's pairs came first
    assert out.take() == [((1, 0), 9), ((1, 3), 9), ((2, 0), 9), ((2, 3), 9)]  # b has no second-side record


def test_window_join_drops_records_of_fired_windows_and_keeps_no_state(start_operator: StartOperator) -> None:
    op = WindowJoinOperator(pair, TumblingEventTimeWindows(10), KEYS)
    out = start_operator(op, uid="wj")
    op.process_input(0, Rec(0, "a", 5, 0), 5)
    op.process_watermark(9)
    op.process_input(1, Rec(1, "a", 7, 1), 7)  # its window fired
    assert op.late_records_dropped == 1
    op.process_watermark(100)
    assert out.records == []
    assert state_entries(op, LEFT_BUFFER, RIGHT_BUFFER, EVENT_TIMERS) == 0


@pytest.mark.parametrize(("assigner", "size", "slide"), ASSIGNERS)
def test_window_join_state_does_not_grow_behind_the_watermark(
    start_operator: StartOperator, assigner: Any, size: int, slide: int
) -> None:
    steps = random_steps(21, n=1500)
    op = WindowJoinOperator(pair, assigner, KEYS)
    start_operator(op, uid="wj")
    most = 0
    for kind, item in steps[:-1]:
        feed(op, [(kind, item)])
        if kind == "watermark":
            most = max(most, state_entries(op, LEFT_BUFFER, RIGHT_BUFFER))
    # Windows still open at a watermark span at most size + BOUND + a step of time: a few per key.
    assert most <= 6 * 2 * ((size + BOUND + 40) // slide + 1)
    feed(op, steps[-1:])
    assert state_entries(op, LEFT_BUFFER, RIGHT_BUFFER, EVENT_TIMERS) == 0


# Interval join -----------------------------------------------------------------------------------


def emit_pair(left: Rec, right: Rec, ctx: JoinContext, out: Collector) -> None:
    assert (ctx.left_timestamp, ctx.right_timestamp) == (left.ts, right.ts)
    out.collect((left.seq, right.seq))


def interval_join_reference(recs: Sequence[Rec], lower: int, upper: int) -> list[tuple[tuple[int, int], int]]:
    return sorted(
        ((x.seq, y.seq), max(x.ts, y.ts))
        for x in recs
        for y in recs
        if x.side == 0 and y.side == 1 and x.key == y.key and x.ts + lower <= y.ts <= x.ts + upper
    )


BOUNDS = [(-10, 10), (0, 25), (-30, -5), (5, 40), (0, 0), (-7, 0)]


@pytest.mark.parametrize(("lower", "upper"), BOUNDS)
@pytest.mark.parametrize("seed", [31, 32])
def test_interval_join_pairs_as_the_reference(start_operator: StartOperator, lower: int, upper: int, seed: int) -> None:
    steps = random_steps(seed)
    op = IntervalJoinOperator(emit_pair, lower, upper, KEYS)
    out = start_operator(op, uid="ij")
    feed(op, steps)
    expected = interval_join_reference(records(steps), lower, upper)
    assert sorted(out.records) == expected
    assert expected
    assert op.late_records_dropped == 0
    assert state_entries(op, LEFT_BUFFER, RIGHT_BUFFER, LEFT_TIMES, RIGHT_TIMES, EVENT_TIMERS) == 0


def test_interval_join_emits_a_pair_as_soon_as_the_later_record_arrives(start_operator: StartOperator) -> None:
    op = IntervalJoinOperator(emit_pair, -5, 5, KEYS)
    out = start_operator(op, uid="ij")
    op.process_input(1, Rec(1, "a", 12, 0), 12)
    op.process_input(1, Rec(1, "b", 10, 1), 10)
    assert out.records == []
    op.process_input(0, Rec(0, "a", 10, 2), 10)
    assert out.take() == [((2, 0), 12)]  # stamped with the later timestamp
    op.process_input(1, Rec(1, "a", 15, 3), 15)
    assert out.take() == [((2, 3), 15)]
    op.process_input(1, Rec(1, "a", 16, 4), 16)  # 16 > 10 + 5
    assert out.take() == []


def test_interval_join_bounds_are_inclusive(start_operator: StartOperator) -> None:
    op = IntervalJoinOperator(emit_pair, -2, 3, KEYS)
    out = start_operator(op, uid="ij")
    op.process_input(0, Rec(0, "a", 10, 0), 10)
    for seq, ts in enumerate([7, 8, 13, 14], start=1):
        op.process_input(1, Rec(1, "a", ts, seq), ts)
    assert out.values == [(0, 2), (0, 3)]


def test_interval_join_drops_late_records_and_state_the_watermark_passed(start_operator: StartOperator) -> None:
    op = IntervalJoinOperator(emit_pair, -5, 10, KEYS)
    out = start_operator(op, uid="ij")
    op.process_input(0, Rec(0, "a", 100, 0), 100)
    op.process_input(1, Rec(1, "a", 100, 1), 100)
    assert state_entries(op, LEFT_BUFFER, RIGHT_BUFFER) == 2
    op.process_watermark(105)  # no first-side record after 105 can meet the second side's at 100 (>= 100 - 5)
    assert state_entries(op, RIGHT_BUFFER, RIGHT_TIMES) == 0
    assert state_entries(op, LEFT_BUFFER) == 1  # second-side records up to 110 may still come
    op.process_input(1, Rec(1, "a", 105, 2), 105)  # at the watermark: late
    op.process_input(0, Rec(0, "a", 106, 3), 106)
    op.process_input(1, Rec(1, "a", 109, 4), 109)
    assert op.late_records_dropped == 1
    assert out.values == [(0, 1), (0, 4), (3, 4)]
    op.process_watermark(110)
    assert state_entries(op, LEFT_BUFFER) == 1  # 106's first-side record, kept until 116
    op.process_watermark(116)
    assert state_entries(op, LEFT_BUFFER, RIGHT_BUFFER, LEFT_TIMES, RIGHT_TIMES, EVENT_TIMERS) == 0


def test_interval_join_state_does_not_grow_behind_the_watermark(start_operator: StartOperator) -> None:
    steps = random_steps(41, n=1500)
    op = IntervalJoinOperator(emit_pair, -10, 15, KEYS)
    start_operator(op, uid="ij")
    most = 0
    for kind, item in steps[:-1]:
        feed(op, [(kind, item)])
        if kind == "watermark":
            most = max(most, state_entries(op, LEFT_BUFFER, RIGHT_BUFFER))
    assert most <= 2 * (15 + BOUND + 40)  # buckets of one timestamp each, within the last ~75 ms
    feed(op, steps[-1:])
    assert state_entries(op, LEFT_BUFFER, RIGHT_BUFFER, LEFT_TIMES, RIGHT_TIMES, EVENT_TIMERS) == 0


def test_a_join_record_without_a_timestamp_fails_with_the_operator_named(start_operator: StartOperator) -> None:
    for op in (
        IntervalJoinOperator(emit_pair, 0, 1, KEYS),
        WindowJoinOperator(pair, TumblingEventTimeWindows(5), KEYS),
    ):
        start_operator(op, uid="no-ts")
        with pytest.raises(JobDefinitionError, match="'no-ts' received a record without a timestamp"):
            op.process_input(0, Rec(0, "a", 1, 0), None)


def test_an_interval_with_the_lower_bound_above_the_upper_is_refused() -> None:
    with pytest.raises(JobDefinitionError, match="above its upper bound"):
        IntervalJoinOperator(emit_pair, 5, 4, KEYS)


# Restores ----------------------------------------------------------------------------------------


def joins() -> list[Any]:
    return [
        pytest.param(lambda: WindowJoinOperator(pair, SlidingEventTimeWindows(40, 20), KEYS), id="window"),
        pytest.param(lambda: IntervalJoinOperator(emit_pair, -10, 20, KEYS), id="interval"),
    ]


def cut_after_watermark(steps: Sequence[Step], near: int) -> int:
    """A cut just after a watermark: a restored operator has not seen one yet, and records right
    after the cut are not late for it either way."""
    return next(i + 1 for i in range(near, len(steps)) if steps[i][0] == "watermark")


@pytest.mark.parametrize("make", joins())
@pytest.mark.parametrize("seed", [51, 52])
def test_a_join_restored_mid_stream_gives_what_an_uninterrupted_run_gives(
    start_operator: StartOperator, make: Any, seed: int
) -> None:
    steps = random_steps(seed)
    whole = make()
    expected = start_operator(whole, uid="whole")
    feed(whole, steps)
    cut = cut_after_watermark(steps, len(steps) // 2)
    before, after = make(), make()
    out_before = start_operator(before, uid="cut")
    feed(before, steps[:cut])
    before.snapshot_state(1)
    out_after = start_operator(after, uid="cut")
    feed(after, steps[cut:])
    assert sorted(out_before.records + out_after.records) == sorted(expected.records)
    assert expected.records


@pytest.mark.parametrize("make", joins())
def test_a_join_restored_at_another_parallelism_gives_what_an_uninterrupted_run_gives(
    start_operator: StartOperator, make_context: MakeContext, make: Any
) -> None:
    steps = random_steps(61)
    whole = make()
    expected = start_operator(whole, uid="whole")
    feed(whole, steps)
    cut = cut_after_watermark(steps, len(steps) // 3)
    before = make()
    out_before = start_operator(before, uid="scaled")
    feed(before, steps[:cut])
    before.snapshot_state(1)
    ops, outs = [], []
    for subtask in range(2):
        op, out = make(), CollectingOutput()
        op.setup(make_context("scaled", subtask=subtask, parallelism=2), out)
        op.open()
        ops.append(op)
        outs.append(out)
    for kind, item in steps[cut:]:
        if kind == "record":
            ops[owner(item.key, 2)].process_input(item.side, item, item.ts)
        else:
            for op in ops:
                op.process_watermark(item)
    got = out_before.records + [r for out in outs for r in out.records]
    assert sorted(got) == sorted(expected.records)
