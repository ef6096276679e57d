"""The coordinator's work per acknowledgement does not grow with the checkpoint's tasks
(``bench/jm_scale.py`` measured a checkpoint of 1,000 tasks holding the JobManager's lock for seconds
when each ack built the set of every live object key)."""

from __future__ import annotations

from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.jobmanager.checkpointing.coordinator import (
    CheckpointCoordinator,
    NotifyAborted,
    PersistCheckpoint,
    TriggerBarriers,
)
from weir.jobmanager.checkpointing.pending import AckResult, FailureKind, StateObject, TaskStateHandle
from weir.jobmanager.checkpointing.store import InMemoryCompletedCheckpointStore
from weir.jobmanager.checkpointing.trigger import CheckpointConfig

JOB = JobId("job-scale")


class CountingStore(InMemoryCompletedCheckpointStore):
    """Counts how often the coordinator asks for every referenced key, and about one key."""

    def __init__(self, max_retained: int) -> None:
        super().__init__(max_retained)
        self.whole_set_reads = 0
        self.key_lookups = 0

    def referenced_keys(self) -> frozenset[str]:
        self.whole_set_reads += 1
        return super().referenced_keys()

    def is_referenced(self, key: str) -> bool:
        self.key_lookups += 1
        return super().is_referenced(key)


def _tasks(n: int) -> list[TaskId]:
    return [TaskId(JOB, OperatorUid("window" if i else "source"), SubtaskIndex(i)) for i in range(n)]


def _handle(task: TaskId, checkpoint_id: int, reused: tuple[str, ...] = ()) -> TaskStateHandle:
    own = StateObject(f"{task.subtask}/sst-{checkpoint_id}", 100)
    return TaskStateHandle(task, (own, *(StateObject(k, 100, reused=True) for k in reused)))


def _trigger(coord: CheckpointCoordinator, now: float) -> CheckpointId:
    (trigger,) = [a for a in coord.tick(now) if isinstance(a, TriggerBarriers)]
    return trigger.checkpoint_id


def test_an_acknowledgement_looks_up_its_own_reused_keys_only() -> None:
    tasks = _tasks(50)
    store = CountingStore(max_retained=2)
    coord = CheckpointCoordinator(JOB, CheckpointConfig(interval_s=1.0), store)
    coord.start(0.0, tasks, tasks[:1])
    first = _trigger(coord, 1.0)
    for t in tasks:
        outcome = coord.receive_ack(1.5, first, t, _handle(t, first))
    (persist,) = [a for a in outcome.actions if isinstance(a, PersistCheckpoint)]
    coord.checkpoint_persisted(2.0, persist.completed.checkpoint_id)

    second = _trigger(coord, 3.0)
    store.whole_set_reads = store.key_lookups = 0
    for t in tasks:
        result = coord.receive_ack(3.5, second, t, _handle(t, second, reused=(f"{t.subtask}/sst-{first}",)))
        assert result.result is AckResult.SUCCESS
    assert coord.pending(second) is None  # completed: every reused key was found live
    assert store.whole_set_reads == 0
    assert store.key_lookups == len(tasks)  # one per reused key


def test_a_reused_key_another_task_sent_for_the_same_checkpoint_is_live() -> None:
    tasks = _tasks(3)
    coord = CheckpointCoordinator(JOB, CheckpointConfig(interval_s=1.0), InMemoryCompletedCheckpointStore(1))
    coord.start(0.0, tasks, tasks[:1])
    checkpoint = _trigger(coord, 1.0)
    coord.receive_ack(1.1, checkpoint, tasks[0], TaskStateHandle(tasks[0], (StateObject("shared", 1),)))
    outcome = coord.receive_ack(
        1.2, checkpoint, tasks[1], TaskStateHandle(tasks[1], (StateObject("shared", 1, reused=True),))
    )
    assert outcome.result is AckResult.SUCCESS
    released = coord.receive_ack(
        1.3, checkpoint, tasks[2], TaskStateHandle(tasks[2], (StateObject("gone", 1, reused=True),))
    )
    assert released.result is AckResult.DISCARDED
    (aborted,) = [a for a in released.actions if isinstance(a, NotifyAborted)]
    assert aborted.reason.kind is FailureKind.RELEASED_STATE and "'gone'" in aborted.reason.message


def test_a_reused_key_of_a_checkpoint_still_persisting_is_live() -> None:
    tasks = _tasks(2)
    config = CheckpointConfig(interval_s=1.0, max_concurrent=2)
    coord = CheckpointCoordinator(JOB, config, InMemoryCompletedCheckpointStore(1))
    coord.start(0.0, tasks, tasks[:1])
    first = _trigger(coord, 1.0)
    second = _trigger(coord, 2.0)
    for t in tasks:
        coord.receive_ack(2.1, first, t, _handle(t, first))
    assert coord.persisting_ids == (first,)
    outcome = coord.receive_ack(2.2, second, tasks[0], _handle(tasks[0], second, reused=(f"0/sst-{first}",)))
    assert outcome.result is AckResult.SUCCESS
    assert coord.pending(second) is not None
