"""A Task's keyed state schemas: recorded in the layout of every snapshot, compared on restore with
what the new job declares; older state migrates before the first record, state the job cannot read
fails the task at once (the user's fault, not retriable) with one line."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.unit.taskmanager.fakes import Harness, make_task
from weir.connectors.object_storage import FileCheckpointStorage
from weir.core.checkpointing import CheckpointKind
from weir.core.ids import CheckpointId, TaskManagerId
from weir.core.paths import CheckpointPaths
from weir.core.state_schema import StateSchema, StoredSchema
from weir.core.states import TaskState
from weir.core.task_state import (
    InlineOperatorState,
    TaskStateDocument,
    decode_task_state,
    encode_task_state,
)
from weir.operators.keyed import KeyedOperator, ReduceOperator
from weir.taskmanager.network.codec import barrier_message, encode_records, end_of_stream_message
from weir.taskmanager.snapshots import TaskKeyedState, keyed_state_to_document
from weir.taskmanager.task_types import ChainRestore, InheritedRestore
from weir.wire import taskmanager_pb2

OpenState = Callable[[str], TaskKeyedState]


@pytest.fixture
def open_state(tmp_path: Path) -> Iterator[OpenState]:
    storage = FileCheckpointStorage(tmp_path / "storage")
    opened: list[TaskKeyedState] = []

    def open_(name: str) -> TaskKeyedState:
        opened.append(TaskKeyedState(tmp_path / "tm" / "jobs" / name, storage, CheckpointPaths(), TaskManagerId("tm")))
        return opened[-1]

    yield open_
    for state in opened:
        state.discard()


def data(*values: int) -> taskmanager_pb2.DataMessage:
    return taskmanager_pb2.DataMessage(
        records=encode_records(list(values), [None] * len(values)), record_count=len(values)
    )


def summing(schema: StateSchema | None = None) -> Callable[[], KeyedOperator]:
    """ "op": a reduce summing each key's values, its state declared as ``schema``."""
    return lambda: ReduceOperator(lambda a, b: a + b, lambda v: v, schema)


def checkpointed_version_1(open_state: OpenState) -> TaskStateDocument:
    """Run the keyed vertex at version 1 through checkpoint 1 (key 1 sums to 2, key 2 to 2) and end;
    returns its task-state document as the JobManager hands it to a new job."""
    h = make_task("op", channels=1, open_keyed_state=lambda: open_state("old/op-0-1"), keyed_operator=summing())
    gate = h.gate
    assert gate is not None
    gate.push(0, data(1, 2, 1))
    gate.push(0, barrier_message(1, time.time(), CheckpointKind.CHECKPOINT))
    gate.push(0, end_of_stream_message())
    h.task.start()
    h.journal.wait_for(lambda: ("ack", 1) in h.journal.of("task"))
    h.task.notify_checkpoint_complete(1)
    h.wait_for_state(TaskState.FINISHED)
    h.task.join(10)
    snapshot = h.acks[0].snapshot
    assert snapshot.layout.state_schemas == {"op": (StoredSchema("reduce", "pickle", 1),)}
    assert snapshot.keyed_state is not None
    document = TaskStateDocument(
        job_id=h.task.address.job_id,
        vertex_uid="op",
        subtask=0,
        attempt=1,
        checkpoint_id=CheckpointId(1),
        layout=snapshot.layout,
        operator_state=InlineOperatorState(snapshot.operator_states),
        keyed_state=keyed_state_to_document(snapshot.keyed_state),
    )
    return decode_task_state(encode_task_state(document), "in the test")


def sink_records(h: Harness) -> list[object]:
    return [e[1] for e in h.journal.of("sink") if e[0] == "record"]


def test_state_of_version_1_restored_by_a_job_declaring_version_2_is_migrated_before_the_first_record(
    open_state: OpenState,
) -> None:
    document = checkpointed_version_1(open_state)
    h = make_task(
        "op",
        channels=1,
        open_keyed_state=lambda: open_state("new/op-0-1"),
        keyed_operator=summing(StateSchema("reduce", version=2, migrate=lambda _version, total: total * 100)),
        restore=InheritedRestore(1, (document,)),
        restore_checkpoint_id=1,
    )
    assert h.task.layout.state_schemas == {"op": (StoredSchema("reduce", "pickle", 2),)}
    gate = h.gate
    assert gate is not None
    gate.push(0, data(1, 2, 3))
    h.task.start()
    h.journal.wait_for(lambda: len(sink_records(h)) == 3)
    assert sink_records(h) == [201, 202, 3]
    h.task.cancel()
    h.task.join(10)


def test_state_of_version_1_restored_without_a_migration_fails_the_task_at_once(open_state: OpenState) -> None:
    document = checkpointed_version_1(open_state)
    h = make_task(
        "op",
        channels=1,
        open_keyed_state=lambda: open_state("new/op-0-1"),
        keyed_operator=summing(StateSchema("reduce", version=2)),
        restore=InheritedRestore(1, (document,)),
        restore_checkpoint_id=1,
    )
    h.task.start()
    h.wait_for_state(TaskState.FAILED)
    h.task.join(10)
    failure = h.task.failure
    assert failure is not None
    assert (failure.type, failure.fault, failure.retriable) == ("StateSchemaError", "user", False)
    assert failure.message == (
        "operator 'op' state 'reduce': the restored snapshot holds version 1 (pickle), the job declares "
        "version 2 (pickle) and no migration: pass migrate=fn(stored_version, value) along with "
        "state_version=2, or declare state_version=1 to restore it as it is"
    )
    assert h.journal.of("sink") == []  # the chain never opened


def test_a_restart_of_the_job_checks_the_layout_its_own_checkpoint_recorded(open_state: OpenState) -> None:
    """The check runs before any keyed state is read: a newer stored version (a downgrade) fails."""
    document = checkpointed_version_1(open_state)
    newer = {"op": (StoredSchema("reduce", "pickle", 3),)}
    layout = dataclasses.replace(document.layout, state_schemas=newer)
    h = make_task(
        "op",
        channels=1,
        open_keyed_state=lambda: open_state("new/op-0-1"),
        keyed_operator=summing(),
        restore=ChainRestore(1, InlineOperatorState({}), None, layout),
        restore_checkpoint_id=1,
    )
    h.task.start()
    h.wait_for_state(TaskState.FAILED)
    h.task.join(10)
    assert h.task.failure is not None
    assert h.task.failure.message.startswith(
        "operator 'op' state 'reduce': the restored snapshot holds version 3 (pickle), the job declares "
        "version 1 (pickle): state is never migrated to an older version"
    )
