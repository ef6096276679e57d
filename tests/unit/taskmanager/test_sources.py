"""The generator source driven directly, and the Pacer's arithmetic with a fake clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from taskmanager.operators.sources import GeneratorSourceOperator, Pacer
from tests.unit.taskmanager.conftest import CollectingOutput, StartOperator
from weir.api import GeneratorSourceSpec
from weir.watermarks import MAX_WATERMARK


def spec(
    count: int | None,
    timestamp: Callable[[Any], int] | None = None,
    max_out_of_orderness_ms: int = 0,
) -> GeneratorSourceSpec:
    return GeneratorSourceSpec(
        generate=lambda i: {"i": i},
        count=count,
        timestamp=timestamp,
        max_out_of_orderness_ms=max_out_of_orderness_ms,
        records_per_second=None,
    )


def indices(out: CollectingOutput) -> list[int]:
    return [v["i"] for v in out.values]


def drain(source: GeneratorSourceOperator, max_records: int = 1000) -> int:
    polls = 1
    while source.poll(max_records):
        polls += 1
    return polls


@pytest.mark.parametrize(("subtask", "expected"), [(0, [0, 3, 6, 9]), (1, [1, 4, 7]), (2, [2, 5, 8])])
def test_subtask_s_of_p_emits_s_then_every_pth_index(
    start_operator: StartOperator, subtask: int, expected: list[int]
) -> None:
    source = GeneratorSourceOperator(spec(count=10))
    out = start_operator(source, uid="gen", subtask=subtask, parallelism=3)
    drain(source, max_records=2)
    assert indices(out) == expected
    assert out.records[0][1] is None  # no timestamp function: no timestamps


def test_a_bounded_source_ends_with_the_max_watermark(start_operator: StartOperator) -> None:
    source = GeneratorSourceOperator(spec(count=4))
    out = start_operator(source, uid="gen", subtask=0, parallelism=2)
    assert source.poll(2) is False  # indices 0 and 2: the end is known without another poll
    assert indices(out) == [0, 2]
    assert out.watermarks == [MAX_WATERMARK]
    assert source.poll(2) is False
    assert out.watermarks == [MAX_WATERMARK] and len(out.records) == 2


def test_the_end_found_mid_poll_emits_the_max_watermark_once(start_operator: StartOperator) -> None:
    source = GeneratorSourceOperator(spec(count=5))
    out = start_operator(source, uid="gen", subtask=1, parallelism=2)
    assert source.poll(10) is False
    assert indices(out) == [1, 3]
    assert out.watermarks == [MAX_WATERMARK]


def test_an_empty_subtask_finishes_at_once(start_operator: StartOperator) -> None:
    source = GeneratorSourceOperator(spec(count=2))
    out = start_operator(source, uid="gen", subtask=2, parallelism=3)
    assert source.poll(10) is False
    assert out.records == [] and out.watermarks == [MAX_WATERMARK]


def test_an_unbounded_source_keeps_going(start_operator: StartOperator) -> None:
    source = GeneratorSourceOperator(spec(count=None))
    out = start_operator(source, uid="gen")
    for _ in range(5):
        assert source.poll(100) is True
    assert indices(out) == list(range(500))
    assert out.watermarks == []


def test_restore_resumes_right_after_the_last_emitted_index(start_operator: StartOperator) -> None:
    before = GeneratorSourceOperator(spec(count=40))
    out_before = start_operator(before, uid="gen", subtask=1, parallelism=4)
    before.poll(3)
    snapshot = before.snapshot_state(1)
    assert snapshot is not None
    before.poll(2)  # emitted after the checkpoint: replayed after the restore
    assert indices(out_before) == [1, 5, 9, 13, 17]

    after = GeneratorSourceOperator(spec(count=40))
    out_after = start_operator(after, uid="gen", subtask=1, parallelism=4, restore=snapshot)
    drain(after)
    assert indices(out_after) == [13, 17, 21, 25, 29, 33, 37]
    assert indices(out_before)[:3] + indices(out_after) == list(range(1, 40, 4))
    assert out_after.watermarks == [MAX_WATERMARK]


def test_watermarks_follow_the_timestamps_minus_the_bound(start_operator: StartOperator) -> None:
    timestamps = spec(count=None, timestamp=lambda v: 1000 + 10 * v["i"], max_out_of_orderness_ms=5)
    source = GeneratorSourceOperator(timestamps)
    out = start_operator(source, uid="gen")
    source.poll(3)
    assert out.records[:3] == [({"i": 0}, 1000), ({"i": 1}, 1010), ({"i": 2}, 1020)]
    assert out.watermarks == [1020 - 5 - 1]
    source.poll(1)
    assert out.watermarks == [1014, 1024]


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_pacer_allows_the_subtasks_share_of_the_rate() -> None:
    clock = FakeClock()
    pacer = Pacer(records_per_second=10, parallelism=2, clock=clock)  # 5/s for this subtask: one per 0.2 s
    assert pacer.allowed(100) == 0
    assert pacer.wait_s() == pytest.approx(0.2)
    clock.now += 0.5
    assert pacer.allowed(100) == 2
    assert pacer.allowed(1) == 1
    pacer.consumed(2)
    assert pacer.allowed(100) == 0
    assert pacer.wait_s() == pytest.approx(0.1)
    clock.now += 1.0
    assert pacer.allowed(100) == 5  # 7 due in 1.5 s, 2 taken
    pacer.consumed(1)
    assert pacer.allowed(100) == 4
    assert pacer.wait_s() == 0.0  # behind schedule: no wait


def test_pacer_does_not_bank_more_than_was_due() -> None:
    clock = FakeClock()
    pacer = Pacer(records_per_second=8, parallelism=1, clock=clock)
    clock.now += 1.0
    assert pacer.allowed(1000) == 8
    pacer.consumed(8)
    assert pacer.allowed(1000) == 0
    clock.now += 0.25
    assert pacer.allowed(1000) == 2


def test_pacer_without_a_rate_allows_everything() -> None:
    pacer = Pacer(records_per_second=None, parallelism=3, clock=FakeClock())
    assert pacer.allowed(1234) == 1234
    pacer.consumed(1234)
    assert pacer.allowed(7) == 7
    assert pacer.wait_s() == 0.0
