"""PendingCheckpoint: acknowledgement answers, abort and finalize."""

from __future__ import annotations

import pytest

from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.jobmanager.checkpointing.pending import (
    AbortReason,
    AckResult,
    CheckpointKind,
    FailureKind,
    PendingCheckpoint,
    PendingStatus,
    StateObject,
    TaskAckMetrics,
    TaskStateHandle,
    checkpoint_size_bytes,
)
from weir.jobmanager.errors import CheckpointProtocolError

SRC = TaskId(JobId("job"), OperatorUid("source"), SubtaskIndex(0))
SINK = TaskId(JobId("job"), OperatorUid("sink"), SubtaskIndex(0))
OTHER = TaskId(JobId("job"), OperatorUid("map"), SubtaskIndex(3))


def handle(task: TaskId, *keys: str, reused: tuple[str, ...] = ()) -> TaskStateHandle:
    objects = tuple(StateObject(k, 10) for k in keys) + tuple(StateObject(k, 10, reused=True) for k in reused)
    return TaskStateHandle(task, objects)


def pending(kind: CheckpointKind = CheckpointKind.CHECKPOINT) -> PendingCheckpoint:
    return PendingCheckpoint(CheckpointId(7), 100.0, [SRC, SINK], kind)


def test_acknowledging_every_task_makes_it_fully_acknowledged() -> None:
    p = pending()
    assert p.acknowledge(SRC, handle(SRC, "a")) is AckResult.SUCCESS
    assert not p.is_fully_acknowledged
    assert p.not_yet_acknowledged == {SINK}
    assert p.acknowledge(SINK, handle(SINK, "b")) is AckResult.SUCCESS
    assert p.is_fully_acknowledged
    assert p.acknowledged_count == 2
    assert p.referenced_keys() == {"a", "b"}


def test_duplicate_ack_is_reported_and_keeps_the_first_state() -> None:
    p = pending()
    first = handle(SRC, "a")
    assert p.acknowledge(SRC, first) is AckResult.SUCCESS
    assert p.acknowledge(SRC, handle(SRC, "other")) is AckResult.DUPLICATE
    assert p.states[SRC] is first


def test_ack_from_a_task_outside_the_checkpoint_is_unknown() -> None:
    p = pending()
    assert p.acknowledge(OTHER, handle(OTHER, "x")) is AckResult.UNKNOWN
    assert p.acknowledged_count == 0


def test_ack_after_abort_is_discarded() -> None:
    p = pending()
    assert p.abort(AbortReason(FailureKind.DECLINED, "no", SINK))
    assert p.status is PendingStatus.ABORTED
    assert p.is_discarded
    assert p.acknowledge(SRC, handle(SRC, "a")) is AckResult.DISCARDED
    assert p.abort_reason == AbortReason(FailureKind.DECLINED, "no", SINK)


def test_ack_after_finalize_is_discarded() -> None:
    p = pending()
    p.acknowledge(SRC, handle(SRC))
    p.acknowledge(SINK, handle(SINK))
    p.finalize()
    assert p.acknowledge(SRC, handle(SRC)) is AckResult.DISCARDED
    assert not p.is_fully_acknowledged


def test_abort_only_changes_an_in_progress_checkpoint() -> None:
    p = pending()
    assert p.abort(AbortReason(FailureKind.EXPIRED, "late"))
    assert not p.abort(AbortReason(FailureKind.DECLINED, "again"))
    assert p.abort_reason is not None and p.abort_reason.kind is FailureKind.EXPIRED

    done = pending()
    done.acknowledge(SRC, handle(SRC))
    done.acknowledge(SINK, handle(SINK))
    done.finalize()
    assert not done.abort(AbortReason(FailureKind.EXPIRED, "late"))
    assert done.status is PendingStatus.FINALIZED


def test_finalize_needs_every_ack_and_orders_states_by_task() -> None:
    p = pending()
    p.acknowledge(SRC, handle(SRC, "a"))
    with pytest.raises(CheckpointProtocolError, match="1 task"):
        p.finalize()
    p.acknowledge(SINK, handle(SINK, "b"))
    states = p.finalize()
    assert [s.task_id for s in states] == sorted([SRC, SINK])
    with pytest.raises(CheckpointProtocolError):
        p.finalize()


def test_finalize_of_aborted_checkpoint_fails() -> None:
    p = pending()
    p.acknowledge(SRC, handle(SRC))
    p.acknowledge(SINK, handle(SINK))
    p.abort(AbortReason(FailureKind.TASK_FAILURE, "boom", SRC))
    with pytest.raises(CheckpointProtocolError, match="aborted"):
        p.finalize()


def test_state_handle_of_another_task_is_a_protocol_error() -> None:
    p = pending()
    with pytest.raises(CheckpointProtocolError, match="state handle of"):
        p.acknowledge(SRC, handle(SINK))


def test_metrics_are_kept_per_task() -> None:
    p = pending()
    metrics = TaskAckMetrics(
        alignment_duration_s=0.25, start_delay_s=0.5, state_size_bytes=123, sync_duration_s=0.01, async_duration_s=2.0
    )
    p.acknowledge(SRC, handle(SRC), metrics, acked_at=101.5)
    p.acknowledge(SINK, handle(SINK))
    assert p.acks[SRC].metrics == metrics
    assert p.acks[SRC].acked_at == 101.5
    assert p.acks[SINK].metrics == TaskAckMetrics()
    assert p.acks[SINK].acked_at is None


def test_kind_and_deadline() -> None:
    p = pending(CheckpointKind.SAVEPOINT)
    assert p.is_savepoint
    assert p.deadline(30.0) == 130.0
    assert not pending().is_savepoint


def test_a_checkpoint_needs_tasks() -> None:
    with pytest.raises(CheckpointProtocolError, match="no task"):
        PendingCheckpoint(CheckpointId(1), 0.0, [])


def test_state_handle_sizes_and_keys() -> None:
    h = TaskStateHandle(
        SRC,
        (StateObject("sst/1", 100), StateObject("sst/0", 50, reused=True)),
        inline_payload=b"offsets!",
        sink_precommit=b"txn",
    )
    assert h.size_bytes == 100 + 50 + 8 + 3
    assert h.object_keys == {"sst/1", "sst/0"}
    assert h.reused_keys == {"sst/0"}


def test_state_handle_rejects_bad_objects() -> None:
    with pytest.raises(CheckpointProtocolError, match="twice"):
        TaskStateHandle(SRC, (StateObject("k", 1), StateObject("k", 2)))
    with pytest.raises(CheckpointProtocolError, match="negative"):
        StateObject("k", -1)
    with pytest.raises(CheckpointProtocolError, match="non-empty"):
        StateObject("", 1)


def test_a_checkpoints_size_counts_an_object_several_tasks_reference_once() -> None:
    """The subtasks with the same broadcast state reference one object: summed per task, the
    checkpoint's size counted it once per subtask."""
    rules = StateObject("job/checkpoints/chk-3/broadcast/enrich/ab", 10_000)
    states = [
        TaskStateHandle(TaskId(JobId("job"), OperatorUid("enrich"), SubtaskIndex(i)), (rules,), b"doc", b"")
        for i in range(3)
    ] + [TaskStateHandle(SINK, (StateObject("job/checkpoints/chk-3/tasks/sink/00000", 500),), b"d", b"txn")]
    assert checkpoint_size_bytes(states) == 10_000 + 500 + 3 * len(b"doc") + len(b"d") + len(b"txn")
