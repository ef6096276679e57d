"""A bounded job's final checkpoint in unaligned mode, on real Tasks joined by an in-process channel
(no network): a source into a slow two-phase sink, whose input queue and the source's output queue
are full when every source has ended. The final barrier is forced aligned (FLIP-147): it waits behind
those records, so the sink pre-commits every record at the final checkpoint, the checkpoint holds
nothing in flight, the sink's end of input finds nothing left to commit, and a restart from the final
checkpoint commits nothing a second time. Here the test plays the JobManager (triggers, acks,
notifications, restore)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from weir.core.checkpointing import CheckpointingMode, CheckpointKind
from weir.core.descriptors import GeneratorSourceSpec
from weir.core.failures import Failure
from weir.core.ids import CheckpointId, SubtaskIndex
from weir.core.states import TaskState
from weir.core.task_state import InlineOperatorState
from weir.graph import Edge, LogicalGraph, OperatorKind, Partitioning, Transformation
from weir.operators.base import StreamOperator
from weir.operators.sources import GeneratorSourceOperator
from weir.plan import JobPlan, build_plan
from weir.taskmanager.inflight import INFLIGHT_STATE_NAME, decode_inflight
from weir.taskmanager.mailbox import CheckpointRequest
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.output_channels import LocalOutputChannel
from weir.taskmanager.network.writer import RECORDS_PER_BUFFER, RecordWriter
from weir.taskmanager.partitioners import RebalancePartitioner
from weir.taskmanager.task import Task
from weir.taskmanager.task_types import ChainRestore, CheckpointAck, TaskAddress, TaskCallbacks
from weir.wire import common_pb2, taskmanager_pb2

RECORDS = 5 * RECORDS_PER_BUFFER + RECORDS_PER_BUFFER // 2
"""Six buffers: four fill the sink's input queue (its credits), two wait in the source's output."""


@dataclass
class SinkSystem:
    """The external system behind the two-phase sink, shared by every attempt of the job."""

    precommitted: dict[int, int] = field(default_factory=dict)  # checkpoint id -> records pre-committed at it
    committed: list[tuple[int, int]] = field(default_factory=list)  # (checkpoint id, record), in commit order
    left_at_end: list[list[int]] = field(default_factory=list)  # per end of input: records not pre-committed


class TwoPhaseSink(StreamOperator):
    """A transactional sink's protocol over :class:`SinkSystem`: the records since the last barrier
    are the open epoch, a barrier pre-commits it, a completion notice commits every epoch pre-committed
    at or before it, a restore commits what its checkpoint lists and the system has not committed (as
    the Kafka and PostgreSQL sinks' recoveries do). ``end_input`` commits nothing: it records what it
    found still open, which a sink could only commit outside every checkpoint."""

    def __init__(self, system: SinkSystem) -> None:
        self.system = system
        self.open_epoch: list[int] = []
        self.pending: dict[int, list[int]] = {}

    def process(self, value: Any, timestamp: int | None) -> None:
        self.open_epoch.append(value)

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        self.pending[checkpoint_id] = self.open_epoch
        self.system.precommitted[checkpoint_id] = len(self.open_epoch)
        self.open_epoch = []
        return json.dumps(sorted(self.pending.items())).encode()

    def restore_state(self, data: bytes) -> None:
        done = {checkpoint_id for checkpoint_id, _ in self.system.committed}
        for checkpoint_id, records in json.loads(data):
            if checkpoint_id not in done:
                self.system.committed += [(checkpoint_id, r) for r in records]

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        for pending in sorted(c for c in self.pending if c <= checkpoint_id):
            self.system.committed += [(pending, r) for r in self.pending.pop(pending)]

    def end_input(self) -> None:
        self.system.left_at_end.append(self.open_epoch + [r for records in self.pending.values() for r in records])


def identity(i: int) -> int:
    return i


def source_into_sink(system: SinkSystem) -> JobPlan:
    """A bounded generator of ``0 .. RECORDS - 1`` (its position is in its snapshot) into the sink."""
    numbers = GeneratorSourceSpec(
        generate=identity, count=RECORDS, timestamp=None, max_out_of_orderness_ms=0, records_per_second=None
    )
    graph = LogicalGraph("bounded-job", 1, 128)
    graph.add(Transformation("src", "src", OperatorKind.SOURCE, lambda: GeneratorSourceOperator(numbers)))
    graph.add(Transformation("sink", "sink", OperatorKind.SINK, lambda: TwoPhaseSink(system)))
    graph.connect(Edge("src", "sink", Partitioning.REBALANCE))
    return build_plan(graph)


class PlaysJobManager:
    """What the JobManager sees of the two tasks: states, acks, the sources' end of input."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.states: dict[str, TaskState] = {}
        self.acks: dict[tuple[str, int], CheckpointAck] = {}
        self.failures: list[Failure] = []
        self.input_ended = False

    def callbacks(self, vertex: str) -> TaskCallbacks:
        def on_state(_a: TaskAddress, state: TaskState, failure: Failure | None) -> None:
            with self._cond:
                self.states[vertex] = state
                if failure is not None:
                    self.failures.append(failure)
                self._cond.notify_all()

        def on_checkpoint(_a: TaskAddress, ack: CheckpointAck) -> None:
            with self._cond:
                self.acks[vertex, ack.snapshot.checkpoint_id] = ack
                self._cond.notify_all()

        def on_decline(_a: TaskAddress, checkpoint_id: int, reason: str) -> None:
            raise AssertionError(f"{vertex} declined checkpoint {checkpoint_id}: {reason}")

        def on_input_ended(_a: TaskAddress) -> None:
            with self._cond:
                self.input_ended = True
                self._cond.notify_all()

        return TaskCallbacks(on_state, on_checkpoint, on_decline, on_input_ended)

    def wait_for(self, predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate() or bool(self.failures), timeout_s):
                raise AssertionError(f"no {what} within {timeout_s:g} s; states {self.states}")
            assert not self.failures, self.failures


def deploy(
    plan: JobPlan, jm: PlaysJobManager, attempt: int, restore: dict[str, ChainRestore] | None
) -> dict[str, Task]:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    gate = InputGate([0])  # the default credits: a queue of four buffers
    cancelled = threading.Event()
    consumer = common_pb2.TaskRef(job_id=job_id, vertex_uid="sink", subtask=0)
    header = taskmanager_pb2.ChannelHeader(consumer=consumer, consumer_channel=0, attempt=attempt)
    channel = LocalOutputChannel(header, cancelled, lambda _channel: None)
    writer = RecordWriter(
        [channel], RebalancePartitioner(SubtaskIndex(0), 1), None, lambda _key: 0, flush_interval_s=3600.0
    )
    tasks = {
        vertex: Task(
            address=TaskAddress(job_id, vertex, 0, attempt),
            plan=plan,
            vertex=plan.vertices[vertex],
            job_name="bounded-job",
            parameters={},
            writers=writers,
            gate=vertex_gate,
            callbacks=jm.callbacks(vertex),
            taskmanager_id="tm-test",
            restore=restore[vertex] if restore else None,
            restore_checkpoint_id=restore[vertex].checkpoint_id if restore else 0,
            mode=CheckpointingMode.UNALIGNED,
            cancelled=cancelled if vertex == "src" else None,
        )
        for vertex, writers, vertex_gate in (("src", [writer], None), ("sink", [], gate))
    }
    channel.open()
    channel.connect(gate)
    return tasks


def run_to_the_end(
    plan: JobPlan, attempt: int, final: int, restore: dict[str, ChainRestore] | None, *, slow_sink: bool
) -> dict[str, CheckpointAck]:
    """One attempt: the source reads its input; the final checkpoint is triggered at it; with
    ``slow_sink`` the sink starts only once the source acknowledged it (its queues full until then);
    the checkpoint completes; both tasks finish. Answers each task's ack of the final checkpoint."""
    jm = PlaysJobManager()
    tasks = deploy(plan, jm, attempt, restore)
    try:
        tasks["src"].start()
        if not slow_sink:
            tasks["sink"].start()
        jm.wait_for(lambda: jm.input_ended, "end of the source's input")
        tasks["src"].trigger_checkpoint(
            CheckpointRequest(CheckpointId(final), time.time(), CheckpointKind.CHECKPOINT, final=True)
        )
        jm.wait_for(lambda: ("src", final) in jm.acks, "ack of the source")
        if slow_sink:
            tasks["sink"].start()
        jm.wait_for(lambda: ("sink", final) in jm.acks, "ack of the sink")
        for task in tasks.values():
            task.notify_checkpoint_complete(final)
        jm.wait_for(lambda: all(jm.states.get(v) is TaskState.FINISHED for v in tasks), "both tasks FINISHED")
    finally:
        for task in tasks.values():
            task.cancel()
            task.join(10)
    return {vertex: jm.acks[vertex, final] for vertex in tasks}


def buffers_in_flight(ack: CheckpointAck) -> int:
    state = ack.snapshot.operator_states.get(INFLIGHT_STATE_NAME)
    return 0 if state is None else decode_inflight(state, ack.snapshot.task.vertex_uid).buffer_count


def restore_from(acks: dict[str, CheckpointAck]) -> dict[str, ChainRestore]:
    return {
        vertex: ChainRestore(
            ack.snapshot.checkpoint_id,
            InlineOperatorState(dict(ack.snapshot.operator_states)),
            None,
            ack.snapshot.layout,
        )
        for vertex, ack in acks.items()
    }


def test_the_final_checkpoint_holds_every_record_and_a_restart_from_it_commits_none_twice() -> None:
    system = SinkSystem()
    plan = source_into_sink(system)

    acks = run_to_the_end(plan, attempt=1, final=1, restore=None, slow_sink=True)
    assert {vertex: buffers_in_flight(ack) for vertex, ack in acks.items()} == {"src": 0, "sink": 0}
    assert all(ack.inflight_bytes == 0 for ack in acks.values())
    assert system.precommitted == {1: RECORDS}, "the sink pre-committed before every record reached it"
    assert system.left_at_end == [[]], "end of input found records no checkpoint covers"
    assert Counter(system.committed) == Counter((1, r) for r in range(RECORDS))

    # The job fails over after its final checkpoint completed (another subtask failing at its end, a
    # TaskManager lost): the next attempt restores the final checkpoint and ends at once.
    run_to_the_end(plan, attempt=2, final=2, restore=restore_from(acks), slow_sink=False)
    assert system.left_at_end == [[], []]
    assert Counter(record for _checkpoint, record in system.committed) == Counter(range(RECORDS))
