"""A Task's one loop, whatever its default action: processing-time timers fire while it polls its
source, while its outputs hold it back, while it waits for its final checkpoint, while it takes input
and while it waits for its last notifications; a backpressured source still flushes on its buffer
timeout and syncs its metrics. Real Tasks over fake channels, no network."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.unit.taskmanager.fakes import FakeChannel, Journal, ListSource, Recording
from weir.core.checkpointing import CheckpointKind
from weir.core.failures import Failure
from weir.core.ids import SubtaskIndex
from weir.core.metrics import TASK_LABELS
from weir.core.states import TaskState
from weir.graph import Edge, LogicalGraph, OperatorKind, Partitioning, Transformation
from weir.operators.base import SourceOperator, StreamOperator
from weir.plan import build_plan
from weir.taskmanager.network.codec import barrier_message, end_of_stream_message, read_buffer
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.writer import RecordWriter
from weir.taskmanager.partitioners import RebalancePartitioner
from weir.taskmanager.task import Task
from weir.taskmanager.task_types import CheckpointAck, TaskAddress, TaskCallbacks

TIMER_AT = 5_000


def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Poll ``condition`` (state outside the journal) until it holds, failing after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.01)  # poll interval of a wait with a deadline


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class TimerOp(StreamOperator):
    """Passes records on; one processing-time timer at ``TIMER_AT``, journalled when it fires."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.at: int | None = TIMER_AT

    def process(self, value: Any, timestamp: int | None) -> None:
        self.output.emit(value, timestamp)

    def next_processing_time(self) -> int | None:
        return self.at

    def on_processing_time(self, now_ms: int) -> None:
        self.journal.add("timer", "fired", now_ms)
        self.at = None


class Endless(SourceOperator):
    """A source with nothing to read, ever (it rests between polls)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def poll(self, max_records: int) -> bool:
        self.journal.add("source", "poll")
        return True

    def idle_wait_s(self) -> float:
        return 0.01


class EmitsOnceThenBackpressures(SourceOperator):
    """Emits three records on its first poll, after which its consumer grants no more credit."""

    def __init__(self, journal: Journal, channel: FakeChannel) -> None:
        self.journal, self.channel = journal, channel

    def poll(self, max_records: int) -> bool:
        self.journal.add("source", "poll")
        for value in (1, 2, 3):
            self.output.emit(value, None)
        self.records_polled += 3
        self.channel.backpressured = True
        return True


@dataclass
class Run:
    task: Task
    journal: Journal
    clock: FakeClock
    channel: FakeChannel
    gate: InputGate | None

    def timer_fired(self) -> bool:
        return ("fired", TIMER_AT) in self.journal.of("timer")

    def polls(self) -> int:
        return len(self.journal.of("source"))


def run_of(
    source: Callable[[Journal, FakeChannel], SourceOperator] | None, *, buffer_timeout_s: float = 3_600.0
) -> Run:
    """A task of ``source -> timer`` (chained) ``-rebalance-> down`` (the source vertex, its output a
    fake channel), or with ``source`` None, of ``timer -> sink`` (chained) fed by one input channel."""
    journal, channel, clock = Journal(), FakeChannel(), FakeClock(0)
    graph = LogicalGraph("loop-test", 1, 128)

    def add(uid: str, kind: OperatorKind, factory: Callable[[], Any]) -> None:
        graph.add(Transformation(uid, uid, kind, factory))

    if source is not None:
        add("src", OperatorKind.SOURCE, lambda: source(journal, channel))
        add("timer", OperatorKind.ONE_INPUT, lambda: TimerOp(journal))
        add("down", OperatorKind.SINK, lambda: Recording(journal, "down"))
        graph.connect(Edge("src", "timer", Partitioning.FORWARD))
        graph.connect(Edge("timer", "down", Partitioning.REBALANCE))
        vertex_uid = "src"
    else:
        add("src", OperatorKind.SOURCE, lambda: ListSource(journal, []))
        add("timer", OperatorKind.ONE_INPUT, lambda: TimerOp(journal))
        add("sink", OperatorKind.SINK, lambda: Recording(journal, "sink"))
        graph.connect(Edge("src", "timer", Partitioning.REBALANCE))
        graph.connect(Edge("timer", "sink", Partitioning.FORWARD))
        vertex_uid = "timer"
    plan = build_plan(graph)
    vertex = plan.vertices[vertex_uid]
    writers = [
        RecordWriter(
            [channel],  # type: ignore[list-item]
            RebalancePartitioner(SubtaskIndex(0), 1),
            None,
            lambda _key: 0,
            flush_interval_s=buffer_timeout_s,
        )
        for _ in vertex.outputs
    ]
    gate = InputGate([0], initial_credits=100) if vertex.inputs else None

    def on_state(_a: TaskAddress, state: TaskState, failure: Failure | None) -> None:
        journal.add("task", "state", state, failure)

    def on_checkpoint(_a: TaskAddress, ack: CheckpointAck) -> None:
        journal.add("task", "ack", ack.snapshot.checkpoint_id)

    task = Task(
        address=TaskAddress(f"loop-{uuid.uuid4().hex[:8]}", vertex_uid, 0, 1),
        plan=plan,
        vertex=vertex,
        job_name="loop-test",
        parameters={},
        writers=writers,
        gate=gate,
        callbacks=TaskCallbacks(
            on_state,
            on_checkpoint,
            lambda _a, cid, reason: journal.add("task", "decline", cid, reason),
            lambda _a: journal.add("task", "input_ended"),
        ),
        taskmanager_id="tm-test",
        restore=None,
        restore_checkpoint_id=0,
        clock=clock,
    )
    return Run(task, journal, clock, channel, gate)


def _polling(run: Run) -> None:
    run.journal.wait_for(lambda: run.polls() >= 1)


def _held_back(run: Run) -> None:
    run.journal.wait_for(lambda: run.task.state is TaskState.RUNNING)
    assert run.polls() == 0


def _awaiting_final_checkpoint(run: Run) -> None:
    run.journal.wait_for(lambda: ("input_ended",) in run.journal.of("task"))


def _taking_input(run: Run) -> None:
    run.journal.wait_for(lambda: run.task.state is TaskState.RUNNING)


def _awaiting_notifications(run: Run) -> None:
    assert run.gate is not None
    run.gate.push(0, barrier_message(1, 0.0, CheckpointKind.CHECKPOINT))  # a checkpoint, not a final one
    run.gate.push(0, end_of_stream_message())
    run.journal.wait_for(lambda: ("ack", 1) in run.journal.of("task"))
    eventually(lambda: run.task.input is not None and run.task.input.ended, "the end of its input")
    assert run.task.state is TaskState.RUNNING  # checkpoint 1 is not confirmed yet


def _backpressured(journal: Journal, channel: FakeChannel) -> SourceOperator:
    channel.backpressured = True
    return Endless(journal)


PHASES: list[tuple[str, Callable[[Journal, FakeChannel], SourceOperator] | None, Callable[[Run], None]]] = [
    ("polling its source", lambda journal, _channel: Endless(journal), _polling),
    ("held back by its outputs", _backpressured, _held_back),
    ("awaiting its final checkpoint", lambda journal, _channel: ListSource(journal, []), _awaiting_final_checkpoint),
    ("taking input", None, _taking_input),
    ("awaiting its last notifications", None, _awaiting_notifications),
]


@pytest.mark.parametrize(("source", "reach"), [(s, r) for _, s, r in PHASES], ids=[name for name, _, _ in PHASES])
def test_a_due_processing_time_timer_fires_in_every_default_action(
    source: Callable[[Journal, FakeChannel], SourceOperator] | None, reach: Callable[[Run], None]
) -> None:
    """The old loops fired timers only after a poll or a buffer: a backpressured source and a source
    waiting for its final checkpoint never fired one."""
    run = run_of(source)
    run.task.start()
    try:
        reach(run)
        assert not run.timer_fired()
        run.clock.now = TIMER_AT + 1  # passed: the loop wakes by its metrics sync at the latest and fires it
        run.journal.wait_for(run.timer_fired)
    finally:
        run.task.cancel()
        run.task.join(10)


def test_a_backpressured_source_task_still_flushes_on_its_buffer_timeout_and_syncs_its_metrics() -> None:
    run = run_of(EmitsOnceThenBackpressures, buffer_timeout_s=0.1)
    run.task.start()
    try:
        eventually(lambda: bool(run.channel.sent), "the buffer timeout")  # it sends what the poll emitted
        assert [v for m in run.channel.sent for v in read_buffer(m).values] == [1, 2, 3]
        labels = dict(zip(TASK_LABELS, run.task.metrics.labels, strict=True))
        eventually(lambda: REGISTRY.get_sample_value("weir_records_out_total", labels) == 3.0, "a metrics sync")
        eventually(lambda: (r := run.task.time_ratios()) is not None and r.backpressured > 0.5, "backpressured time")
        assert run.polls() == 1, "a backpressured source must not poll"
    finally:
        run.task.cancel()
        run.task.join(10)
