"""The duties of a task's loop, each on its own: one comparison rule (due once ``now >= deadline``, at
the deadline itself included), a deadline that says when the loop must wake, and nothing done early."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
from prometheus_client import REGISTRY

from tests.unit.taskmanager.fakes import FakeChannel
from weir.core.checkpointing import CheckpointKind
from weir.core.ids import SubtaskIndex
from weir.core.metrics import TASK_LABELS, TaskMetrics
from weir.taskmanager.duties import AlignmentTimeout, OutputFlush, ProcessingTimers
from weir.taskmanager.network.codec import barrier_message, read_buffer
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.writer import RecordWriter, TaskOutputs
from weir.taskmanager.partitioners import RebalancePartitioner
from weir.taskmanager.task_metrics import METRICS_SYNC_S, MetricsSync, TimeAccount


@dataclass
class TimerChain:
    """What ProcessingTimers asks of a chain: its next timer, and the times it was told."""

    at: int | None
    told: list[int] = field(default_factory=list)

    def next_processing_time(self) -> int | None:
        return self.at

    def on_processing_time(self, now_ms: int) -> None:
        self.told.append(now_ms)
        self.at = None


@dataclass
class Clock:
    now: int

    def __call__(self) -> int:
        return self.now


@pytest.mark.parametrize(("clock_ms", "fires"), [(999, False), (1_000, False), (1_001, True), (1_002, True)])
def test_a_processing_time_timer_fires_once_the_clock_has_passed_its_millisecond(clock_ms: int, fires: bool) -> None:
    """A timer for t fires at t + 1 or later (Flink's rule), and the chain is told the last millisecond
    that passed: a record of the timer's own millisecond (a window's last) still joins its window."""
    chain = TimerChain(1_000)
    timers = ProcessingTimers(chain, Clock(clock_ms), quiesced=lambda: False)  # type: ignore[arg-type]
    deadline = timers.deadline()
    assert deadline is not None and abs(deadline - (time.monotonic() + (1_001 - clock_ms) / 1000)) < 0.5
    timers.run_due(time.monotonic())
    assert chain.told == ([clock_ms - 1] if fires else [])


def test_a_quiesced_timer_service_neither_wakes_the_loop_nor_fires() -> None:
    chain = TimerChain(1_000)
    timers = ProcessingTimers(chain, Clock(5_000), quiesced=lambda: True)  # type: ignore[arg-type]
    assert timers.deadline() is None
    timers.run_due(time.monotonic())
    assert chain.told == []


def _writer(channel: FakeChannel, interval_s: float) -> RecordWriter:
    """One channel's writer with the buffer timeout ``interval_s``."""
    return RecordWriter(
        [channel],  # type: ignore[list-item]
        RebalancePartitioner(SubtaskIndex(0), 1),
        None,
        lambda _key: 0,
        flush_interval_s=interval_s,
    )


def test_an_output_buffer_goes_out_at_its_timeout_and_not_before() -> None:
    channel = FakeChannel()
    outputs = TaskOutputs([_writer(channel, 10.0)])
    flush = OutputFlush(outputs)
    assert flush.deadline() is None  # nothing buffered: nothing to wake for
    outputs.edges[0].emit("r", None)
    deadline = flush.deadline()
    assert deadline is not None
    flush.run_due(deadline - 0.001)
    assert channel.sent == []
    flush.run_due(deadline)  # at the deadline itself
    assert [read_buffer(m).values for m in channel.sent] == [["r"]]
    assert flush.deadline() is None


def test_a_queued_barrier_turns_priority_once_its_aligned_timeout_passed() -> None:
    gate = InputGate([0, 0])
    gate.push(0, barrier_message(3, time.time() - 10.0, CheckpointKind.CHECKPOINT))  # triggered 10 s ago
    gate.push(1, barrier_message(4, time.time() + 3_600, CheckpointKind.CHECKPOINT))  # not due for an hour
    timeout = AlignmentTimeout(gate, timeout_s=5.0, log=_NoLog())
    deadline = timeout.deadline()
    assert deadline is not None and deadline <= time.monotonic()  # overdue: the loop must not wait
    timeout.run_due(time.monotonic())
    assert gate.queued_barrier_times().keys() == {4}
    (priority,) = gate.pending_priority()
    assert priority.message.checkpoint_id == 3 and priority.message.priority


class _NoLog:
    def info(self, *_args: object, **_kwargs: object) -> None:
        return None


def _sample(name: str, metrics: TaskMetrics) -> float | None:
    return REGISTRY.get_sample_value(name, dict(zip(TASK_LABELS, metrics.labels, strict=True)))


def test_the_metrics_sync_is_due_every_interval_at_its_deadline_included() -> None:
    metrics = TaskMetrics("job-duties", "duties", "op", 0, "tm-test")
    try:
        channel = FakeChannel()
        outputs = TaskOutputs([_writer(channel, 3_600.0)])
        records_in, source_read = [0], [0]
        sync = MetricsSync(
            metrics, TimeAccount(metrics), outputs, None, lambda: records_in[0], lambda: None, lambda: source_read[0]
        )
        records_in[0], source_read[0] = 7, 5
        deadline = sync.deadline()
        sync.run_due(deadline - 0.001)
        assert _sample("weir_records_in_total", metrics) == 0.0
        assert _sample("weir_source_records_read_total", metrics) == 0.0
        sync.run_due(deadline)
        assert _sample("weir_records_in_total", metrics) == 7.0
        assert _sample("weir_source_records_read_total", metrics) == 5.0
        assert sync.deadline() == pytest.approx(deadline + METRICS_SYNC_S)
    finally:
        metrics.remove()
