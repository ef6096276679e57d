"""WindowAggregateOperator driven directly: firing, lateness, sliding windows, snapshot and restore."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.unit.conftest import CollectingOutput, MakeContext, StartOperator
from weir.core.errors import JobDefinitionError
from weir.core.metrics import TASK_LABELS, TaskMetrics
from weir.core.watermarks import MAX_WATERMARK
from weir.core.windows import SlidingEventTimeWindows, TumblingEventTimeWindows
from weir.operators.windows import WindowAggregateOperator

Result = tuple[str, int, int, int]  # key, window start, window end, sum


class Sum:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: tuple[str, int]) -> int:
        return acc + value[1]

    def result(self, key: str, window_start: int, window_end: int, acc: int) -> Result:
        return key, window_start, window_end, acc


def window_operator(assigner: Any, allowed_lateness_ms: int = 0) -> WindowAggregateOperator:
    return WindowAggregateOperator(Sum(), lambda v: v[0], assigner, allowed_lateness_ms)


def plain_window_sums(records: list[tuple[tuple[str, int], int]], assigner: Any) -> Counter[Result]:
    sums: dict[tuple[str, int, int], int] = defaultdict(int)
    for (key, n), ts in records:
        for w in assigner.assign(ts):
            sums[(key, w.start, w.end)] += n
    return Counter((k, s, e, total) for (k, s, e), total in sums.items())


def test_a_tumbling_window_fires_when_the_watermark_reaches_its_last_timestamp(start_operator: StartOperator) -> None:
    op = window_operator(TumblingEventTimeWindows(10))
    out = start_operator(op, uid="win")
    for ts in range(25):
        op.process(("a" if ts % 2 else "b", ts), ts)
    op.process_watermark(8)
    assert out.records == [] and out.watermarks == [8]
    op.process_watermark(9)
    assert sorted(out.take()) == [(("a", 0, 10, 25), 9), (("b", 0, 10, 20), 9)]
    op.process_watermark(9)  # not an advance: nothing fires, nothing is forwarded
    op.process_watermark(3)
    assert out.records == [] and out.watermarks == [8, 9]
    op.process_watermark(25)
    assert sorted(v for v, _ in out.take()) == [("a", 10, 20, 75), ("b", 10, 20, 70)]
    assert out.events[-1] == ("watermark", 25)  # results go out before the watermark that fired them
    op.process_watermark(MAX_WATERMARK)
    assert sorted(out.take()) == [(("a", 20, 30, 44), 29), (("b", 20, 30, 66), 29)]


def test_a_dropped_late_value_counts_in_the_task_metrics(make_context: MakeContext) -> None:
    op = window_operator(TumblingEventTimeWindows(10))
    ctx = make_context("win")
    ctx.metrics = TaskMetrics(ctx.job_id, ctx.job_name, "win", ctx.subtask, "taskmanager-test")
    op.setup(ctx, CollectingOutput())
    op.open()
    op.process_watermark(20)
    op.process(("a", 1), 5)
    op.process(("a", 1), 25)
    labels = dict(zip(TASK_LABELS, ctx.metrics.labels, strict=True))
    assert op.late_records_dropped == 1
    assert REGISTRY.get_sample_value("weir_late_records_dropped_total", labels) == 1
    ctx.metrics.remove()


def test_results_equal_a_plain_computation(start_operator: StartOperator) -> None:
    rng = random.Random(7)
    assigner = TumblingEventTimeWindows(100)
    op = window_operator(TumblingEventTimeWindows(100))
    out = start_operator(op, uid="win")
    bound, max_ts = 30, 0
    records: list[tuple[tuple[str, int], int]] = []
    for i in range(3000):
        ts = max(0, i - rng.randrange(bound))  # out of order by less than the bound
        value = (f"k{rng.randrange(13)}", rng.randrange(100))
        records.append((value, ts))
        op.process(value, ts)
        max_ts = max(max_ts, ts)
        if i % 50 == 0:
            op.process_watermark(max_ts - bound - 1)
    op.process_watermark(MAX_WATERMARK)
    assert op.late_records_dropped == 0
    assert Counter(out.values) == plain_window_sums(records, assigner)
    assert all(ts == end - 1 for (_, _, end, _), ts in out.records)


def test_a_late_value_within_the_allowed_lateness_fires_the_window_again(start_operator: StartOperator) -> None:
    op = window_operator(TumblingEventTimeWindows(10), allowed_lateness_ms=5)
    out = start_operator(op, uid="win")
    op.process(("a", 1), 1)
    op.process(("a", 2), 2)
    op.process_watermark(9)
    assert out.take() == [(("a", 0, 10, 3), 9)]
    op.process(("a", 4), 3)  # late, within lateness: fires at once with the updated aggregate
    assert out.take() == [(("a", 0, 10, 7), 9)]
    op.process_watermark(13)
    assert out.records == []
    op.process(("a", 1), 0)
    op.process(("b", 6), 5)  # a window that fired without this key: late for the key's first value too
    assert out.take() == [(("a", 0, 10, 8), 9), (("b", 0, 10, 6), 9)]
    op.process_watermark(14)  # end - 1 + lateness: the window's state is dropped
    op.process(("a", 100), 9)
    assert out.records == [] and op.late_records_dropped == 1


def test_a_value_beyond_the_allowed_lateness_is_dropped_and_counted(start_operator: StartOperator) -> None:
    op = window_operator(TumblingEventTimeWindows(10))
    out = start_operator(op, uid="win")
    op.process(("a", 1), 3)
    op.process_watermark(9)
    assert out.take() == [(("a", 0, 10, 1), 9)]
    op.process(("a", 5), 9)
    op.process(("b", 5), 0)
    op.process(("a", 7), 10)  # the next window is still open
    assert op.late_records_dropped == 2
    op.process_watermark(MAX_WATERMARK)
    assert out.take() == [(("a", 10, 20, 7), 19)]


def test_sliding_windows_fire_each_window_once(start_operator: StartOperator) -> None:
    op = window_operator(SlidingEventTimeWindows(10, 5))
    out = start_operator(op, uid="win")
    op.process(("a", 1), 7)  # in [0, 10) and [5, 15)
    op.process_watermark(9)
    assert out.take() == [(("a", 0, 10, 1), 9)]
    op.process(("a", 2), 12)  # in [5, 15) and [10, 20)
    op.process_watermark(14)
    assert out.take() == [(("a", 5, 15, 3), 14)]
    op.process_watermark(MAX_WATERMARK)
    assert out.take() == [(("a", 10, 20, 2), 19)]

    rng = random.Random(3)
    op2 = window_operator(SlidingEventTimeWindows(30, 10))
    out2 = start_operator(op2, uid="win2")
    records = [((f"k{rng.randrange(4)}", rng.randrange(10)), rng.randrange(200)) for _ in range(500)]
    for value, ts in sorted(records, key=lambda r: r[1]):
        op2.process(value, ts)
        op2.process_watermark(ts - 1)
    op2.process_watermark(MAX_WATERMARK)
    assert op2.late_records_dropped == 0
    assert Counter(out2.values) == plain_window_sums(records, SlidingEventTimeWindows(30, 10))


def test_after_a_restore_pending_windows_fire_exactly_once(start_operator: StartOperator) -> None:
    before = window_operator(TumblingEventTimeWindows(10))
    out = start_operator(before, uid="win")
    for ts in range(30):
        before.process((f"k{ts % 3}", 1), ts)
    before.process_watermark(9)
    fired_before = out.take()
    assert sorted(v for v, _ in fired_before) == [("k0", 0, 10, 4), ("k1", 0, 10, 3), ("k2", 0, 10, 3)]
    snapshot = before.snapshot_state(1)
    assert snapshot is not None

    after = window_operator(TumblingEventTimeWindows(10))
    restored = start_operator(after, uid="win", restore=snapshot)
    after.process(("k0", 50), 5)  # the restored watermark still makes this late
    assert after.late_records_dropped == 1
    after.process_watermark(19)
    assert sorted(v for v, _ in restored.take()) == [("k0", 10, 20, 3), ("k1", 10, 20, 4), ("k2", 10, 20, 3)]
    after.process_watermark(MAX_WATERMARK)
    assert sorted(v for v, _ in restored.take()) == [("k0", 20, 30, 3), ("k1", 20, 30, 3), ("k2", 20, 30, 4)]
    after.process_watermark(MAX_WATERMARK)
    assert restored.records == []


def test_after_a_restore_fired_windows_wait_for_cleanup_without_firing_again(start_operator: StartOperator) -> None:
    before = window_operator(TumblingEventTimeWindows(10), allowed_lateness_ms=100)
    out = start_operator(before, uid="win")
    before.process(("a", 1), 1)
    before.process(("a", 2), 15)
    before.process_watermark(10)
    assert out.take() == [(("a", 0, 10, 1), 9)]
    snapshot = before.snapshot_state(1)
    assert snapshot is not None

    after = window_operator(TumblingEventTimeWindows(10), allowed_lateness_ms=100)
    restored = start_operator(after, uid="win", restore=snapshot)
    after.process_watermark(18)
    assert restored.records == []
    after.process_watermark(19)
    assert restored.take() == [(("a", 10, 20, 2), 19)]
    after.process(("a", 5), 3)  # late within lateness: the restored accumulator is updated
    assert restored.take() == [(("a", 0, 10, 6), 9)]
    after.process_watermark(109)
    after.process(("a", 5), 3)
    assert restored.records == [] and after.late_records_dropped == 1


def test_a_record_without_timestamp_is_a_job_definition_error(start_operator: StartOperator) -> None:
    op = window_operator(TumblingEventTimeWindows(10))
    start_operator(op, uid="my-window")
    with pytest.raises(JobDefinitionError, match="window operator 'my-window' received a record without a timestamp"):
        op.process(("a", 1), None)
