"""Completed checkpoints and retention with shared object keys."""

from __future__ import annotations

import pytest

from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.jobmanager.checkpointing.pending import CheckpointKind, StateObject, TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint, InMemoryCompletedCheckpointStore
from weir.jobmanager.errors import CheckpointProtocolError, ConfigError

JOB = JobId("job")
T0 = TaskId(JOB, OperatorUid("op"), SubtaskIndex(0))
T1 = TaskId(JOB, OperatorUid("op"), SubtaskIndex(1))


def checkpoint(
    checkpoint_id: int, keys0: tuple[str, ...] = (), keys1: tuple[str, ...] = (), savepoint: bool = False
) -> CompletedCheckpoint:
    kind = CheckpointKind.SAVEPOINT if savepoint else CheckpointKind.CHECKPOINT
    return CompletedCheckpoint(
        checkpoint_id=CheckpointId(checkpoint_id),
        job_id=JOB,
        trigger_timestamp=float(checkpoint_id),
        completion_timestamp=checkpoint_id + 0.5,
        task_states=(
            TaskStateHandle(T0, tuple(StateObject(k, 100) for k in keys0), inline_payload=b"off"),
            TaskStateHandle(T1, tuple(StateObject(k, 10) for k in keys1)),
        ),
        metadata_key=f"meta/{checkpoint_id}",
        kind=kind,
    )


def test_an_empty_store() -> None:
    store = InMemoryCompletedCheckpointStore(max_retained=2)
    assert store.latest() is None
    assert store.all() == ()
    assert store.referenced_keys() == frozenset()


def test_adding_within_the_retention_subsumes_nothing() -> None:
    store = InMemoryCompletedCheckpointStore(max_retained=2)
    assert store.add(checkpoint(1, ("a",))).subsumed == ()
    result = store.add(checkpoint(2, ("b",)))
    assert result.subsumed == ()
    assert result.unreferenced_keys == frozenset()
    assert [c.checkpoint_id for c in store.all()] == [1, 2]
    assert store.latest() == checkpoint(2, ("b",))


def test_adding_beyond_the_retention_releases_only_unshared_keys() -> None:
    store = InMemoryCompletedCheckpointStore(max_retained=2)
    store.add(checkpoint(1, ("sst-1", "shared"), ("own-1",)))
    store.add(checkpoint(2, ("sst-2", "shared"), ("own-2",)))
    result = store.add(checkpoint(3, ("sst-3",), ("own-3",)))
    assert [c.checkpoint_id for c in result.subsumed] == [1]
    assert result.unreferenced_keys == {"sst-1", "own-1"}
    assert store.is_referenced("shared")
    result = store.add(checkpoint(4, ("sst-4",)))
    assert result.unreferenced_keys == {"sst-2", "shared", "own-2"}
    assert not store.is_referenced("shared")


def test_a_key_shared_by_many_checkpoints_is_released_with_the_last_one() -> None:
    store = InMemoryCompletedCheckpointStore(max_retained=1)
    store.add(checkpoint(1, ("base", "x1")))
    assert store.add(checkpoint(2, ("base", "x2"))).unreferenced_keys == {"x1"}
    assert store.add(checkpoint(3, ("base", "x3"))).unreferenced_keys == {"x2"}
    assert store.add(checkpoint(4, ("x4",))).unreferenced_keys == {"base", "x3"}
    assert store.referenced_keys() == {"x4"}


def test_a_savepoint_is_the_restore_point_until_a_newer_checkpoint_and_its_keys_are_never_released() -> None:
    store = InMemoryCompletedCheckpointStore(max_retained=1)
    store.add(checkpoint(1, ("c1",)))
    result = store.add(checkpoint(2, ("sp-a", "sp-b"), savepoint=True))
    assert result.subsumed == () and result.unreferenced_keys == frozenset()
    assert [c.checkpoint_id for c in store.all()] == [1, 2]
    assert store.is_referenced("sp-a"), "a savepoint's objects are never released"
    result = store.add(checkpoint(3, ("c3", "sp-a")))  # even a checkpoint that lists a savepoint's file
    assert [c.checkpoint_id for c in result.subsumed] == [1]
    assert result.unreferenced_keys == {"c1"}
    assert [c.checkpoint_id for c in store.all()] == [3], "the savepoint left the store"
    result = store.add(checkpoint(4, ("c4",)))
    assert result.unreferenced_keys == {"c3"}, "sp-a is a savepoint's file: never released"


def test_latest_may_be_a_savepoint() -> None:
    store = InMemoryCompletedCheckpointStore()
    store.add(checkpoint(1))
    store.add(checkpoint(2, savepoint=True))
    latest = store.latest()
    assert latest is not None and latest.checkpoint_id == 2 and latest.is_savepoint


def test_ids_must_increase() -> None:
    store = InMemoryCompletedCheckpointStore(max_retained=3)
    store.add(checkpoint(5))
    with pytest.raises(CheckpointProtocolError, match="not newer"):
        store.add(checkpoint(5))
    with pytest.raises(CheckpointProtocolError, match="not newer"):
        store.add(checkpoint(4))


def test_add_all_adds_in_id_order_and_reports_all_releases() -> None:
    store = InMemoryCompletedCheckpointStore(max_retained=1)
    result = store.add_all([checkpoint(3, ("k3", "s")), checkpoint(1, ("k1", "s")), checkpoint(2, ("k2",))])
    assert [c.checkpoint_id for c in result.subsumed] == [1, 2]
    assert result.unreferenced_keys == {"k1", "k2"}
    assert [c.checkpoint_id for c in store.all()] == [3]


def test_retention_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="checkpointing.retained"):
        InMemoryCompletedCheckpointStore(max_retained=0)


def test_completed_checkpoint_values() -> None:
    c = checkpoint(7, ("a", "b"), ("c",))
    assert c.total_size_bytes == 100 + 100 + 3 + 10
    assert c.object_keys == {"a", "b", "c"}
    assert c.tasks == {T0, T1}
    assert c.duration_s == 0.5
    assert c.state_of(T1) == TaskStateHandle(T1, (StateObject("c", 10),))
    assert c.state_of(TaskId(JOB, OperatorUid("x"), SubtaskIndex(0))) is None
    assert not c.is_savepoint


def test_completed_checkpoint_holds_one_state_per_task() -> None:
    with pytest.raises(CheckpointProtocolError, match="two states"):
        CompletedCheckpoint(CheckpointId(1), JOB, 0.0, 1.0, (TaskStateHandle(T0), TaskStateHandle(T0)), "m")
