"""An ended job's sink finds its state through the task-state document, inline or stored."""

from __future__ import annotations

from weir.core.ids import CheckpointId, JobId, KeyGroup, OperatorUid, SubtaskIndex, TaskId
from weir.core.keygroups import KeyGroupRange
from weir.core.task_state import (
    InlineOperatorState,
    OperatorStateHandle,
    SubtaskLayout,
    TaskStateDocument,
    encode_task_state,
    pack_operator_states,
)
from weir.jobmanager.checkpointing.pending import TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.ending import sink_state

JOB = JobId("job-1")


def checkpoint_with(operator_state: OperatorStateHandle) -> CompletedCheckpoint:
    document = TaskStateDocument(
        "job-1",
        "sink",
        1,
        1,
        CheckpointId(3),
        SubtaskLayout(2, 128, KeyGroupRange(KeyGroup(64), KeyGroup(127)), ("sink",), ()),
        operator_state,
    )
    handle = TaskStateHandle(
        TaskId(JOB, OperatorUid("sink"), SubtaskIndex(1)), inline_payload=encode_task_state(document)
    )
    return CompletedCheckpoint(CheckpointId(3), JOB, 1.0, 2.0, (handle,), "job-1/checkpoints/chk-3/_metadata")


def test_a_sink_state_stored_as_an_object_is_read_through_its_handle() -> None:
    pending = b"pending-output" * 5_000
    stored, blob = pack_operator_states({"sink": pending, "map": b"m"}, "job-1/checkpoints/chk-3/tasks/sink/00001")
    checkpoint = checkpoint_with(stored)
    assert sink_state(checkpoint, "sink", 1, "sink", {stored.key: blob}.__getitem__) == pending
    assert sink_state(checkpoint, "sink", 0, "sink", {stored.key: blob}.__getitem__) is None


def test_an_inline_sink_state_needs_no_storage() -> None:
    def no_storage(key: str) -> bytes:
        raise AssertionError(f"read {key}")

    checkpoint = checkpoint_with(InlineOperatorState({"sink": b"txn-7"}))
    assert sink_state(checkpoint, "sink", 1, "sink", no_storage) == b"txn-7"
    assert sink_state(None, "sink", 1, "sink", no_storage) is None
