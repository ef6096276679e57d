"""Sliced sliding windows (a mergeable aggregate: one slice of width gcd(size, slide) per value) emit
what the per-window operator emits: the same results at the same timestamps, the same late firings,
late drops and late-data side output, over random out-of-order streams with late values, also when
restored mid-stream from their own snapshot or from a per-window (format 1) one."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from typing import Any

import pytest

from tests.unit.conftest import CollectingOutput, MakeContext
from weir.core.errors import SerializationError
from weir.core.keygroups import key_group_for_key
from weir.core.process_functions import OutputTag
from weir.core.state_layout import window_bounds
from weir.core.watermarks import MAX_WATERMARK
from weir.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from weir.operators.base import InheritedState, SideOutputs
from weir.operators.windows import (
    WINDOW_STATE,
    ElementList,
    ReduceAggregate,
    WindowAggregateOperator,
    slice_width,
)

LATE = OutputTag("late")
Value = tuple[str, int]
Step = tuple[str, Any]  # ("value", (value, ts)) or ("watermark", wm)


class CountSum:
    """Per window: count and sum (no merge: one accumulator per window)."""

    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], value: Value) -> tuple[int, int]:
        return (acc[0] + 1, acc[1] + value[1])

    def result(self, key: str, start: int, end: int, acc: tuple[int, int]) -> tuple[str, int, int, int, int]:
        return (key, start, end, acc[0], acc[1])


class MergingCountSum(CountSum):
    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])


ASSIGNERS = {
    "multiple": (90, 30, 0),  # slices of the slide
    "uneven": (100, 30, 7),  # slices of 10 ms, 3 to a slide
    "negative-offset": (50, 20, -5),
    "two": (10, 5, 0),
}


def random_steps(rng: random.Random, n: int) -> list[Step]:
    """Values of 7 keys, out of order by up to 60 ms, some (5 %) up to 400 ms behind; a watermark
    every few values, 40 ms behind the largest timestamp (so some values are late)."""
    steps: list[Step] = []
    top = 0
    for i in range(n):
        ts = i + rng.randrange(-60, 10)
        if rng.random() < 0.05:
            ts -= rng.randrange(400)
        top = max(top, ts)
        steps.append(("value", ((f"k{rng.randrange(7)}", rng.randrange(-50, 100)), ts)))
        if rng.random() < 0.15:
            steps.append(("watermark", top - 40 - rng.randrange(30)))
    return steps


class Run:
    """One window operator fed steps: its results and late-data side output, as multisets of
    (value, timestamp), in all its incarnations."""

    def __init__(self, make_context: MakeContext) -> None:
        self.make_context = make_context
        self.main = CollectingOutput()
        self.late = CollectingOutput()
        self.dropped = 0

    def start(self, op: WindowAggregateOperator, uid: str, restore: bytes | None = None) -> WindowAggregateOperator:
        op.setup(self.make_context(uid), self.main, SideOutputs({"late": self.late}))
        if restore is not None:
            op.restore_state(restore)
        op.open()
        return op

    def feed(self, op: WindowAggregateOperator, steps: list[Step]) -> None:
        before = op.late_records_dropped
        for kind, item in steps:
            if kind == "value":
                op.process(*item)
            else:
                op.process_watermark(item)
        self.dropped += op.late_records_dropped - before

    def finish(self, op: WindowAggregateOperator) -> None:
        self.feed(op, [("watermark", MAX_WATERMARK)])
        op.end_input()

    def results(self) -> Counter[tuple[Any, int | None]]:
        return Counter(self.main.records)

    def late_values(self) -> Counter[tuple[Any, int | None]]:
        return Counter(self.late.records)


def window(fn: Any, assigner: str, lateness: int) -> WindowAggregateOperator:
    return WindowAggregateOperator(
        fn, lambda v: v[0], SlidingEventTimeWindows(*ASSIGNERS[assigner]), lateness, late_data=LATE
    )


def reference(make_context: MakeContext, steps: list[Step], assigner: str, lateness: int) -> Run:
    run = Run(make_context)
    op = run.start(window(CountSum(), assigner, lateness), "per-window")
    assert op._slice_ms == 0
    run.feed(op, steps)
    run.finish(op)
    return run


def stored(op: WindowAggregateOperator) -> dict[tuple[int, bytes], Any]:
    return {(kg, sk): v for kg in op.ctx.key_group_range for sk, v in op.store.items(WINDOW_STATE, kg)}


@pytest.mark.parametrize("lateness", [0, 45])
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("assigner", list(ASSIGNERS))
def test_sliced_windows_emit_what_per_window_ones_do(
    make_context: MakeContext, assigner: str, seed: int, lateness: int
) -> None:
    steps = random_steps(random.Random(seed), 2500)
    expected = reference(make_context, steps, assigner, lateness)
    run = Run(make_context)
    op = run.start(window(MergingCountSum(), assigner, lateness), "sliced")
    size, slide, _offset = ASSIGNERS[assigner]
    assert op._slice_ms == math.gcd(size, slide)
    run.feed(op, steps[: len(steps) // 2])
    op.snapshot_state(1)
    widths = {end - start for start, end in (window_bounds(sk) for _kg, sk in stored(op))}
    assert widths == {op._slice_ms}  # one entry per key and slice, no per-window entries
    run.feed(op, steps[len(steps) // 2 :])
    run.finish(op)
    assert run.results() == expected.results()
    assert run.late_values() == expected.late_values() != Counter()  # the stream has late data
    assert run.dropped == expected.dropped > 0
    if lateness:  # late firings: some window emitted more than once
        assert len({(v[0], v[1]) for v, _ts in expected.main.records}) < len(expected.main.records)
    assert stored(op) == {}  # every slice dropped after the last window


@pytest.mark.parametrize("lateness", [0, 45])
@pytest.mark.parametrize("seed", [4, 5])
@pytest.mark.parametrize("assigner", ["multiple", "uneven"])
def test_a_sliced_window_restored_mid_stream_goes_on_exactly(
    make_context: MakeContext, assigner: str, seed: int, lateness: int
) -> None:
    steps = random_steps(random.Random(seed), 2500)
    expected = reference(make_context, steps, assigner, lateness)
    for cut in (len(steps) // 3, 2 * len(steps) // 3):
        run = Run(make_context)
        uid = f"sliced-{cut}"
        before = run.start(window(MergingCountSum(), assigner, lateness), uid)
        run.feed(before, steps[:cut])
        snapshot = before.snapshot_state(1)
        assert snapshot is not None and json.loads(snapshot)["format"] == 2
        after = run.start(window(MergingCountSum(), assigner, lateness), uid, restore=snapshot)
        run.feed(after, steps[cut:])
        run.finish(after)
        assert run.results() == expected.results()
        assert run.late_values() == expected.late_values()
        assert run.dropped == expected.dropped


@pytest.mark.parametrize("lateness", [0, 45])
@pytest.mark.parametrize("assigner", ["multiple", "uneven"])
def test_a_per_window_state_restores_into_a_sliced_window(
    make_context: MakeContext, assigner: str, lateness: int
) -> None:
    """A savepoint of the per-window layout (format 1) restored where the aggregate now merges: its
    windows keep their accumulators, merged at firing with the slices opened since."""
    steps = random_steps(random.Random(9), 2500)
    expected = reference(make_context, steps, assigner, lateness)
    run = Run(make_context)
    cut = len(steps) // 2
    before = run.start(window(CountSum(), assigner, lateness), "migrated")
    run.feed(before, steps[:cut])
    snapshot = before.snapshot_state(1)
    assert snapshot is not None and json.loads(snapshot) == {"format": 1, "watermark": before._watermark}
    after = run.start(window(MergingCountSum(), assigner, lateness), "migrated", restore=snapshot)
    assert after._slice_ms > 0
    run.feed(after, steps[cut:])
    run.finish(after)
    assert run.results() == expected.results()
    assert run.late_values() == expected.late_values()
    assert run.dropped == expected.dropped
    assert stored(after) == {}


def test_a_sliced_state_is_refused_where_windows_keep_one_accumulator_each(make_context: MakeContext) -> None:
    run = Run(make_context)
    before = run.start(window(MergingCountSum(), "multiple", 0), "refused")
    run.feed(before, [("value", (("a", 1), 5))])
    snapshot = before.snapshot_state(1)
    assert snapshot is not None
    with pytest.raises(SerializationError, match="slices of 30 ms but this job's windows keep one accumulator"):
        run.start(window(CountSum(), "multiple", 0), "refused", restore=snapshot)
    with pytest.raises(SerializationError, match="slices of 30 ms but this job's windows keep slices of 10 ms"):
        run.start(window(MergingCountSum(), "uneven", 0), "refused", restore=snapshot)


def test_only_overlapping_sliding_windows_of_a_merging_aggregate_are_sliced() -> None:
    sliding = SlidingEventTimeWindows(100, 30)
    assert slice_width(sliding, MergingCountSum()) == 10
    assert slice_width(sliding, CountSum()) == 0  # no merge
    assert slice_width(sliding, ReduceAggregate(lambda a, b: a + b)) == 0  # values in arrival order
    assert slice_width(sliding, ElementList()) == 0
    assert slice_width(SlidingEventTimeWindows(30, 30), MergingCountSum()) == 0  # no overlap
    assert slice_width(TumblingEventTimeWindows(30), MergingCountSum()) == 0


def rescaled_run(make_context: MakeContext, fn: Any, steps: list[Step], lateness: int, uid: str) -> Run:
    """Two subtasks take the first half (each its keys' values; subtask 1's watermark lags 60 ms),
    then one subtask restored from both (``restore_inherited_state``) takes the rest."""
    run = Run(make_context)
    cut = len(steps) // 2
    old = []
    for s in range(2):
        op = window(fn(), "uneven", lateness)
        op.setup(make_context(uid, subtask=s, parallelism=2), run.main, SideOutputs({"late": run.late}))
        op.open()
        old.append(op)
    for kind, item in steps[:cut]:
        if kind == "value":
            (key, _n), _ts = item
            owner = old[0] if key_group_for_key(key, 128) in old[0].ctx.key_group_range else old[1]
            run.feed(owner, [(kind, item)])
        else:
            run.feed(old[0], [(kind, item)])
            run.feed(old[1], [(kind, item - 60)])
    states = []
    for s, op in enumerate(old):
        data = op.snapshot_state(1)
        assert data is not None
        states.append(InheritedState(s, 2, op.ctx.key_group_range, data))
    new = window(fn(), "uneven", lateness)
    new.setup(make_context(uid, subtask=0, parallelism=1), run.main, SideOutputs({"late": run.late}))
    new.restore_inherited_state(states)
    new.open()
    run.feed(new, steps[cut:])
    run.finish(new)
    return run


@pytest.mark.parametrize("lateness", [0, 45])
def test_a_sliced_window_restored_at_another_parallelism_emits_what_per_window_ones_do(
    make_context: MakeContext, lateness: int
) -> None:
    steps = random_steps(random.Random(11), 2500)
    expected = rescaled_run(make_context, CountSum, steps, lateness, "per-window")
    sliced = rescaled_run(make_context, MergingCountSum, steps, lateness, "sliced")
    assert sliced.results() == expected.results() != Counter()
    assert sliced.late_values() == expected.late_values()
    assert sliced.dropped == expected.dropped
