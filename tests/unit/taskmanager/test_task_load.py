"""What a task's heartbeat entry reports of it: the shares of its time (busy, backpressured, idle)
since the previous heartbeat, the running totals behind them, and its current input watermark."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from tests.unit.taskmanager.fakes import make_task
from weir.core.states import TaskState
from weir.core.task_time import TimeRatios, TimeTotals
from weir.taskmanager.network.codec import end_of_stream_message, watermark_message
from weir.taskmanager.task import Task

T = TypeVar("T")


def eventually(condition: Callable[[], T | None], what: str, timeout_s: float = 10.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.02)  # poll interval of a wait with a deadline


def shares(task: Task, accept: Callable[[TimeRatios], bool]) -> Callable[[], TimeRatios | None]:
    def measured() -> TimeRatios | None:
        ratios = task.time_ratios()  # as the heartbeat asks: the shares since the previous call
        return ratios if ratios is not None and accept(ratios) else None

    return measured


def test_a_task_waiting_for_input_is_idle_and_reports_its_input_watermark() -> None:
    h = make_task("op", 2)
    assert h.task.time_ratios() is None and h.task.input_watermark() is None  # nothing measured yet
    h.gate.push(0, watermark_message(10))
    h.gate.push(1, watermark_message(20))
    h.task.start()
    try:
        h.wait_for_state(TaskState.RUNNING)
        eventually(lambda: h.task.input_watermark() == 10, "the minimum over the channels")
        ratios = eventually(shares(h.task, lambda r: r.idle > 0.9), "an idle interval")
        assert abs(ratios.busy + ratios.backpressured + ratios.idle - 1.0) < 1e-9
        assert ratios.backpressured == 0.0
        h.gate.push(0, end_of_stream_message())
        h.gate.push(1, end_of_stream_message())
        h.wait_for_state(TaskState.FINISHED)
        assert h.task.input_watermark() is None  # the end of input (MAX_WATERMARK) is no time
    finally:
        h.task.cancel()
        h.task.join(10)


def test_a_source_whose_output_is_unavailable_is_backpressured() -> None:
    h = make_task("src", source_values=list(range(100_000)))
    h.out.backpressured = True
    h.task.start()
    try:
        h.wait_for_state(TaskState.RUNNING)
        ratios = eventually(shares(h.task, lambda r: r.backpressured > 0.9), "a backpressured interval")
        assert ratios.idle < 0.1
        h.out.backpressured = False  # credit again: it reads and sends, so busy time shows
        eventually(shares(h.task, lambda r: r.busy > 0.0 and r.backpressured < 0.9), "an interval with work")
    finally:
        h.task.cancel()
        h.task.join(10)


def test_without_a_sync_in_between_a_heartbeat_gets_the_previous_shares() -> None:
    h = make_task("op", 1)
    h.task.start()
    try:
        h.wait_for_state(TaskState.RUNNING)
        eventually(h.task.time_ratios, "a first interval")
    finally:
        h.task.cancel()
        h.task.join(10)
    last = h.task.time_ratios()  # the task ended: it syncs no more
    assert last is not None and h.task.time_ratios() == last


def test_the_heartbeat_s_time_totals_grow_with_the_time_the_task_spends() -> None:
    """Flink's accumulated busy/backpressured/idle times: a task without output credit accounts
    backpressured time, once it has credit busy time too, and no total ever shrinks."""
    h = make_task("src", source_values=list(range(100_000)))
    h.out.backpressured = True
    assert h.task.time_totals() == TimeTotals()  # nothing accounted yet
    h.task.start()
    try:
        h.wait_for_state(TaskState.RUNNING)
        eventually(lambda: h.task.time_totals().backpressured_s > 0.05, "backpressured time accounted")
        h.task.time_ratios()  # a heartbeat: the next shares are measured from here
        before = h.task.time_totals()
        h.out.backpressured = False
        later = eventually(
            lambda: (t := h.task.time_totals()).busy_s > before.busy_s and t.total_s > before.total_s + 0.05 and t,
            "busy time accounted",
        )
        assert later.backpressured_s >= before.backpressured_s and later.idle_s >= before.idle_s
    finally:
        h.task.cancel()
        h.task.join(10)
