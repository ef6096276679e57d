"""A Task fires its chain's processing-time timers by its (injected) clock: a due timer fires without
more input, one not yet due waits, and the task's wait ends no later than the next timer."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.taskmanager.fakes import Harness, make_task
from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.checkpointing import BarrierAlignment, CheckpointKind
from weir.core.ids import TaskManagerId
from weir.core.paths import CheckpointPaths
from weir.core.states import TaskState
from weir.operators.base import StreamOperator
from weir.operators.keyed import KeyedProcessOperator
from weir.plan import Vertex
from weir.taskmanager.chain import OperatorChain
from weir.taskmanager.network.codec import barrier_message, encode_records
from weir.taskmanager.snapshots import TaskKeyedState
from weir.wire import taskmanager_pb2


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class TimerAt:
    """Record ``v`` registers a processing-time timer at ``v`` and emits ``("seen", v)``; a timer
    emits ``("timer", time)``."""

    def process_element(self, value: int, ctx: Any, out: Any) -> None:
        ctx.timer_service().register_processing_time_timer(value)
        out.collect(("seen", value))

    def on_timer(self, timestamp: int, ctx: Any, out: Any) -> None:
        out.collect(("timer", timestamp))


def data(*values: int) -> taskmanager_pb2.DataMessage:
    return taskmanager_pb2.DataMessage(
        records=encode_records(list(values), [None] * len(values)), record_count=len(values)
    )


@pytest.fixture
def timer_task(tmp_path: Path) -> Iterator[tuple[Harness, FakeClock]]:
    clock = FakeClock(1_000)
    storage = FileCheckpointStorage(tmp_path / "storage")
    state = TaskKeyedState(tmp_path / "tm" / "op", storage, CheckpointPaths(), TaskManagerId("tm-1"))
    h = make_task(
        "op",
        channels=1,
        open_keyed_state=lambda: state,
        keyed_operator=lambda: KeyedProcessOperator(TimerAt(), lambda v: v, clock=clock),
        clock=clock,
    )
    h.task.start()
    yield h, clock
    h.task.cancel()
    h.task.join(10)
    state.discard()


def sink_records(h: Harness) -> list[Any]:
    return [e[1] for e in h.journal.of("sink") if e[0] == "record"]


def test_a_due_processing_time_timer_fires_without_more_input(timer_task: tuple[Harness, FakeClock]) -> None:
    h, _clock = timer_task
    assert h.gate is not None
    h.gate.push(0, data(999))  # the clock (1,000) has passed it
    h.journal.wait_for(lambda: ("timer", 999) in sink_records(h))
    assert sink_records(h) == [("seen", 999), ("timer", 999)]


def test_a_timer_of_the_current_millisecond_waits_for_it_to_pass(timer_task: tuple[Harness, FakeClock]) -> None:
    """As in Flink (a timer for t fires at t + 1 at the earliest): a record of the same millisecond
    still reaches the operator before the timer fires (a processing-time window's last millisecond)."""
    h, clock = timer_task
    assert h.gate is not None
    h.gate.push(0, data(1_000))  # the clock reads 1,000
    h.gate.push(0, data(1_000))
    h.journal.wait_for(lambda: sink_records(h).count(("seen", 1_000)) == 2)
    assert ("timer", 1_000) not in sink_records(h)
    clock.now = 1_001
    h.gate.push(0, data(9_000))  # wakes the task; the timer's millisecond has passed
    h.journal.wait_for(lambda: ("timer", 1_000) in sink_records(h))
    assert sink_records(h) == [("seen", 1_000), ("seen", 1_000), ("seen", 9_000), ("timer", 1_000)]


def test_a_timer_not_yet_due_waits_for_the_clock(timer_task: tuple[Harness, FakeClock]) -> None:
    h, clock = timer_task
    assert h.gate is not None
    h.gate.push(0, data(5_000))
    h.journal.wait_for(lambda: ("seen", 5_000) in sink_records(h))
    # The wait of the task ends when the timer is due (4 s and 1 ms of the clock from now), not later.
    deadline = h.task.timers.deadline()
    assert deadline is not None and 3.5 < deadline - time.monotonic() <= 4.001
    clock.now = 5_001
    h.gate.push(0, data(9_000))  # wakes the task; the timer is due by now
    h.journal.wait_for(lambda: ("timer", 5_000) in sink_records(h))
    assert sink_records(h) == [("seen", 5_000), ("seen", 9_000), ("timer", 5_000)]


def test_no_processing_time_timer_fires_once_the_final_barrier_passed(timer_task: tuple[Harness, FakeClock]) -> None:
    """Flink quiesces the processing-time service when it finishes the operators, before the final
    checkpoint: a timer firing after the final barrier would send its output to the sinks after they
    pre-committed at it, outside every checkpoint. The timer due then never fires."""
    h, clock = timer_task
    assert h.gate is not None
    h.gate.push(0, data(5_000))
    h.journal.wait_for(lambda: ("seen", 5_000) in sink_records(h))
    h.gate.push(0, barrier_message(1, time.time(), CheckpointKind.CHECKPOINT, BarrierAlignment.FORCED_ALIGNED))
    h.journal.wait_for(lambda: ("ack", 1) in h.journal.of("task"))
    clock.now = 5_000
    assert h.task.timers.deadline() is None, "a quiesced timer service must not wake the task"
    h.task.notify_checkpoint_complete(1)
    h.gate.push(0, taskmanager_pb2.DataMessage(event=taskmanager_pb2.EVENT_KIND_END_OF_STREAM))
    h.wait_for_state(TaskState.FINISHED)
    assert sink_records(h) == [("seen", 5_000)]


class Due(StreamOperator):
    """A chained operator with one processing-time timer at ``at``; remembers the times it was told."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.told: list[int] = []

    def next_processing_time(self) -> int | None:
        return self.at

    def on_processing_time(self, now_ms: int) -> None:
        self.told.append(now_ms)
        self.at = None


def test_the_chain_tells_only_the_operators_whose_timer_is_due() -> None:
    ops = {"a": Due(30), "b": Due(10), "c": Due(None)}
    vertex = Vertex(uid="a", operator_uids=["a", "b", "c"], parallelism=1, chained={"a": ["b"], "b": ["c"]})
    chain = OperatorChain(vertex, ops.__getitem__, [], lambda uid: None)  # type: ignore[arg-type,return-value]
    assert chain.next_processing_time() == 10
    chain.on_processing_time(20)
    assert (ops["a"].told, ops["b"].told, ops["c"].told) == ([], [20], [])
    assert chain.next_processing_time() == 30
    chain.on_processing_time(30)
    assert ops["a"].told == [30]
    assert chain.next_processing_time() is None
