"""Fakes for driving a Task and an OperatorChain without a network: operators that record what they
see, output channels that keep what is sent, a small graph, and a waiter with a deadline."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from weir.core.checkpointing import CheckpointingMode
from weir.core.failures import Failure
from weir.core.ids import SubtaskIndex
from weir.core.process_functions import Clock, wall_clock_ms
from weir.core.states import TaskState
from weir.core.watermarks import MAX_WATERMARK
from weir.graph import Edge, LogicalGraph, OperatorKind, Partitioning, Transformation
from weir.operators.base import SourceOperator, StreamOperator
from weir.operators.keyed import KeyedOperator, ReduceOperator
from weir.plan import build_plan
from weir.taskmanager.network.codec import read_buffer
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.writer import RecordWriter
from weir.taskmanager.partitioners import RebalancePartitioner
from weir.taskmanager.snapshots import TaskKeyedState
from weir.taskmanager.task import Task
from weir.taskmanager.task_types import CheckpointAck, Restore, TaskAddress, TaskCallbacks
from weir.wire import taskmanager_pb2

Event = taskmanager_pb2.EventKind


class Journal:
    """What operators and callbacks saw, in order; ``wait_for`` blocks on a condition with a deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.entries: list[tuple[Any, ...]] = []

    def add(self, *entry: Any) -> None:
        with self._cond:
            self.entries.append(entry)
            self._cond.notify_all()

    def of(self, name: str) -> list[tuple[Any, ...]]:
        return [e[1:] for e in self.entries if e[0] == name]

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
        with self._cond:
            if not self._cond.wait_for(predicate, timeout_s):
                raise AssertionError(f"not reached within {timeout_s}s; journal: {self.entries}")


class Recording(StreamOperator):
    """Passes records on (``fn`` applied) and writes each hook call into the journal under ``name``."""

    def __init__(self, journal: Journal, name: str, fn: Callable[[Any], Any] = lambda v: v) -> None:
        self.journal, self.name, self._fn = journal, name, fn

    def process(self, value: Any, timestamp: int | None) -> None:
        self.journal.add(self.name, "record", value)
        self.output.emit(self._fn(value), timestamp)

    def process_input(self, input_index: int, value: Any, timestamp: int | None) -> None:
        self.journal.add(self.name, "input", input_index, value)
        self.output.emit(self._fn(value), timestamp)

    def process_watermark(self, watermark: int) -> None:
        self.journal.add(self.name, "watermark", watermark)
        self.output.emit_watermark(watermark)

    def open(self) -> None:
        self.journal.add(self.name, "open")

    def end_input(self) -> None:
        self.journal.add(self.name, "end_input")

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self.journal.add(self.name, "snapshot", checkpoint_id)
        return f"{self.name}@{checkpoint_id}".encode()

    def restore_state(self, data: bytes) -> None:
        self.journal.add(self.name, "restore", data)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.journal.add(self.name, "complete", checkpoint_id)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self.journal.add(self.name, "aborted", checkpoint_id)


class ListSource(SourceOperator):
    """A bounded source: emits its values in order, then MAX_WATERMARK, and ends."""

    def __init__(self, journal: Journal, values: list[Any]) -> None:
        self.journal, self._values = journal, list(values)

    def poll(self, max_records: int) -> bool:
        batch, self._values = self._values[:max_records], self._values[max_records:]
        for value in batch:
            self.output.emit(value, None)
        self.records_polled += len(batch)
        if self._values:
            return True
        self.output.emit_watermark(MAX_WATERMARK)
        return False

    def end_input(self) -> None:
        self.journal.add("source", "end_input")


class FakeChannel:
    """What a RecordWriter needs of a RemoteOutputChannel; keeps every buffer sent."""

    def __init__(self) -> None:
        self.sent: list[taskmanager_pb2.DataMessage] = []
        self.credits = 4
        self.bytes_sent = 0
        self.closed = False
        self.overtake: list[taskmanager_pb2.DataMessage] = []  # what a priority event finds queued
        self.backpressured = False  # True: the consumer grants no credit, the channel is never available
        self.availability_checks = 0

    def send(self, msg: taskmanager_pb2.DataMessage) -> None:
        self.sent.append(msg)

    def send_priority(self, msg: taskmanager_pb2.DataMessage) -> list[taskmanager_pb2.DataMessage]:
        """A priority event: recorded in send order; answers ``overtake`` as the buffers it overtook."""
        self.sent.append(msg)
        return list(self.overtake)

    def available(self) -> bool:
        self.availability_checks += 1
        return not self.backpressured

    def set_wakeup(self, wake: Any) -> None:
        self.wake = wake

    def close(self, *, drain: bool = False) -> None:
        self.closed = True

    def stream(self) -> list[str]:
        """What was sent, readably: ``r:<value>`` per record, then the event of each buffer."""
        out: list[str] = []
        for msg in self.sent:
            buffer = read_buffer(msg)
            out += [f"r:{v}" for v in buffer.values]
            event = buffer.event
            if event is not None:
                out.append(type(event).__name__ + "".join(f":{v}" for v in vars(event).values()))
        return out


def writer_to(channel: FakeChannel) -> RecordWriter:
    return RecordWriter(
        [channel],  # type: ignore[list-item]
        RebalancePartitioner(SubtaskIndex(0), 1),
        None,
        lambda _key: 0,
        flush_interval_s=3600.0,  # flushes come from events only
    )


def three_vertex_graph(
    journal: Journal,
    source_values: list[Any] | None = None,
    *,
    keyed: bool = False,
    keyed_operator: Callable[[], KeyedOperator] | None = None,
) -> LogicalGraph:
    """``src -> map`` (chained) ``-hash-> op -> sink`` (chained) ``-hash-> down``; ``keyed``: "op" is
    ``keyed_operator`` (default: a reduce summing each key's values)."""
    graph = LogicalGraph("test-job", 1, 128)

    def add(uid: str, kind: OperatorKind, factory: Callable[[], Any]) -> None:
        graph.add(Transformation(uid, uid, kind, factory))

    add("src", OperatorKind.SOURCE, lambda: ListSource(journal, source_values or []))
    add("map", OperatorKind.ONE_INPUT, lambda: Recording(journal, "map", lambda v: v * 10))
    if keyed:
        add("op", OperatorKind.ONE_INPUT, keyed_operator or (lambda: ReduceOperator(lambda a, b: a + b, lambda v: v)))
    else:
        add("op", OperatorKind.ONE_INPUT, lambda: Recording(journal, "op"))
    add("sink", OperatorKind.SINK, lambda: Recording(journal, "sink"))
    add("down", OperatorKind.SINK, lambda: Recording(journal, "down"))
    graph.connect(Edge("src", "map", Partitioning.FORWARD))
    graph.connect(Edge("map", "op", Partitioning.HASH, key_selector=lambda v: v))
    graph.connect(Edge("op", "sink", Partitioning.FORWARD))
    graph.connect(Edge("op", "down", Partitioning.HASH, key_selector=lambda v: v))
    return graph


@dataclass
class Harness:
    """A Task of one vertex of :func:`three_vertex_graph`, its gate (None for the source vertex) and
    the one channel of its output edge."""

    journal: Journal
    task: Task
    gate: InputGate | None
    out: FakeChannel
    acks: list[CheckpointAck] = field(default_factory=list)

    def wait_for_state(self, state: TaskState) -> None:
        self.journal.wait_for(lambda: self.task.state is state)


def make_task(
    vertex_uid: str,
    channels: int = 2,
    source_values: list[Any] | None = None,
    *,
    open_keyed_state: Callable[[], TaskKeyedState] | None = None,
    keyed_operator: Callable[[], KeyedOperator] | None = None,
    restore: Restore | None = None,
    restore_checkpoint_id: int = 0,
    mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE,
    aligned_checkpoint_timeout_s: float = 0.0,
    clock: Clock = wall_clock_ms,
) -> Harness:
    """``open_keyed_state``: "op" is a keyed operator (``keyed_operator``, default a reduce) with that
    state backend; ``restore``: what the task restores before it opens its chain; ``clock``: the
    task's processing time."""
    journal = Journal()
    graph = three_vertex_graph(
        journal, source_values, keyed=open_keyed_state is not None, keyed_operator=keyed_operator
    )
    plan = build_plan(graph)
    vertex = plan.vertices[vertex_uid]
    gate = InputGate([0] * channels, initial_credits=100) if vertex.inputs else None
    out = FakeChannel()
    acks: list[CheckpointAck] = []

    def on_state(_addr: TaskAddress, state: TaskState, failure: Failure | None) -> None:
        journal.add("task", "state", state, failure)

    def on_checkpoint(_addr: TaskAddress, ack: CheckpointAck) -> None:
        acks.append(ack)
        journal.add("task", "ack", ack.snapshot.checkpoint_id)

    def on_decline(_addr: TaskAddress, checkpoint_id: int, reason: str) -> None:
        journal.add("task", "decline", checkpoint_id, reason)

    def on_input_ended(_addr: TaskAddress) -> None:
        journal.add("task", "input_ended")

    task = Task(
        address=TaskAddress(f"job-{uuid.uuid4().hex[:8]}", vertex_uid, 0, 1),
        plan=plan,
        vertex=vertex,
        job_name="test-job",
        parameters={},
        writers=[writer_to(out)],
        gate=gate,
        callbacks=TaskCallbacks(on_state, on_checkpoint, on_decline, on_input_ended),
        taskmanager_id="tm-test",
        restore=restore,
        restore_checkpoint_id=restore_checkpoint_id,
        mode=mode,
        aligned_checkpoint_timeout_s=aligned_checkpoint_timeout_s,
        open_keyed_state=open_keyed_state,
        clock=clock,
    )
    return Harness(journal, task, gate, out, acks)
