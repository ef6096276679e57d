"""CheckpointCoordinator: the protocol driven by hand, then by a seeded random simulation."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from weir.core.checkpointing import ChannelBarrierTime, SubtaskCheckpointTimeline
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.jobmanager.checkpointing.coordinator import (
    AckOutcome,
    Action,
    CheckpointCoordinator,
    CheckpointStatus,
    DeleteObjects,
    NotifyAborted,
    NotifyComplete,
    PersistCheckpoint,
    RestoreFrom,
    StartFresh,
    TriggerBarriers,
    WaitForPersist,
)
from weir.jobmanager.checkpointing.pending import (
    AckResult,
    CheckpointKind,
    FailureKind,
    StateObject,
    TaskAckMetrics,
    TaskStateHandle,
)
from weir.jobmanager.checkpointing.store import CompletedCheckpoint, InMemoryCompletedCheckpointStore
from weir.jobmanager.checkpointing.trigger import CheckpointConfig
from weir.jobmanager.errors import CheckpointProtocolError, SavepointRejectedError

JOB = JobId("job-1")


def task(op: str, index: int) -> TaskId:
    return TaskId(JOB, OperatorUid(op), SubtaskIndex(index))


SOURCES = (task("source", 0), task("source", 1))
OTHERS = (task("window", 0), task("sink", 0))
TASKS = SOURCES + OTHERS

A = TypeVar("A")


def of(kind: type[A], actions: Iterable[object]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


def handle(t: TaskId, *keys: str, reused: Sequence[str] = ()) -> TaskStateHandle:
    objects = tuple(StateObject(k, 100) for k in keys) + tuple(StateObject(k, 100, reused=True) for k in reused)
    return TaskStateHandle(t, objects, inline_payload=b"offsets")


def coordinator(
    *,
    interval_s: float | None = 10.0,
    timeout_s: float = 60.0,
    min_pause_s: float = 0.0,
    max_concurrent: int = 1,
    retained: int = 1,
    start_at: float | None = 0.0,
) -> CheckpointCoordinator:
    config = CheckpointConfig(interval_s, timeout_s, min_pause_s, max_concurrent)
    coord = CheckpointCoordinator(JOB, config, InMemoryCompletedCheckpointStore(retained))
    if start_at is not None:
        coord.start(start_at, TASKS, SOURCES)
    return coord


def trigger(coord: CheckpointCoordinator, now: float) -> CheckpointId:
    barriers = of(TriggerBarriers, coord.tick(now))
    assert len(barriers) == 1, f"expected a checkpoint at {now}"
    return barriers[0].checkpoint_id


def ack_all(
    coord: CheckpointCoordinator,
    now: float,
    checkpoint_id: CheckpointId,
    keys: dict[TaskId, tuple[str, ...]] | None = None,
    tasks: Sequence[TaskId] = TASKS,
) -> tuple[Action, ...]:
    """Acknowledge from every task; the actions of the last acknowledgement."""
    actions: tuple[Action, ...] = ()
    for t in tasks:
        outcome = coord.receive_ack(now, checkpoint_id, t, handle(t, *(keys or {}).get(t, ())))
        assert outcome.result is AckResult.SUCCESS
        actions = outcome.actions
    return actions


def complete(
    coord: CheckpointCoordinator,
    now: float,
    checkpoint_id: CheckpointId,
    keys: dict[TaskId, tuple[str, ...]] | None = None,
) -> tuple[Action, ...]:
    """Acknowledge from every task and persist; the actions of ``checkpoint_persisted``."""
    persist = of(PersistCheckpoint, ack_all(coord, now, checkpoint_id, keys))
    assert [p.completed.checkpoint_id for p in persist] == [checkpoint_id]
    return coord.checkpoint_persisted(now, checkpoint_id)


# ---------------------------------------------------------------------------------------------------
# Triggering


def test_first_checkpoint_triggers_after_one_interval_at_the_sources() -> None:
    coord = coordinator(start_at=5.0)
    assert coord.tick(14.9) == ()
    assert coord.next_tick_at(14.9) == 15.0
    (barriers,) = coord.tick(15.0)
    assert barriers == TriggerBarriers(
        CheckpointId(1), 15.0, tuple(sorted(SOURCES)), CheckpointKind.CHECKPOINT, reserve_ids_through=CheckpointId(100)
    )
    assert coord.pending_ids == (1,)


def test_nothing_triggers_before_start() -> None:
    coord = coordinator(start_at=None)
    assert coord.tick(1000.0) == ()
    assert coord.next_tick_at(1000.0) is None


def test_start_needs_sources_among_the_tasks() -> None:
    coord = coordinator(start_at=None)
    with pytest.raises(CheckpointProtocolError, match="source"):
        coord.start(0.0, TASKS, [])
    with pytest.raises(CheckpointProtocolError, match="one of the tasks"):
        coord.start(0.0, OTHERS, SOURCES)


def test_periodic_checkpoints_can_be_disabled() -> None:
    coord = coordinator(interval_s=None)
    assert coord.tick(1e6) == ()
    barriers = coord.trigger_savepoint(5.0)
    assert barriers.kind is CheckpointKind.SAVEPOINT


def test_max_concurrent_is_respected() -> None:
    coord = coordinator(max_concurrent=1)
    trigger(coord, 10.0)
    assert of(TriggerBarriers, coord.tick(20.0)) == []
    assert of(TriggerBarriers, coord.tick(35.0)) == []

    coord = coordinator(max_concurrent=2)
    assert trigger(coord, 10.0) == 1
    assert trigger(coord, 20.0) == 2
    assert of(TriggerBarriers, coord.tick(30.0)) == []
    assert coord.in_flight_count == 2


def test_a_persisting_checkpoint_counts_as_in_flight() -> None:
    coord = coordinator(max_concurrent=1)
    cid = trigger(coord, 10.0)
    ack_all(coord, 11.0, cid)
    assert coord.pending_ids == () and coord.persisting_ids == (cid,)
    assert of(TriggerBarriers, coord.tick(25.0)) == []
    coord.checkpoint_persisted(26.0, cid)
    assert trigger(coord, 26.0) == 2, "overdue: triggers as soon as the previous one ended"


def test_min_pause_is_respected() -> None:
    coord = coordinator(interval_s=10.0, min_pause_s=8.0)
    cid = trigger(coord, 10.0)
    complete(coord, 17.0, cid)
    assert of(TriggerBarriers, coord.tick(20.0)) == []
    assert coord.next_tick_at(20.0) == 25.0
    assert trigger(coord, 25.0) == 2


def test_min_pause_also_counts_from_an_aborted_checkpoint() -> None:
    coord = coordinator(interval_s=10.0, min_pause_s=5.0)
    cid = trigger(coord, 10.0)
    coord.receive_decline(18.0, cid, SOURCES[0], "busy")
    assert of(TriggerBarriers, coord.tick(20.0)) == []
    assert trigger(coord, 23.0) == 2


# ---------------------------------------------------------------------------------------------------
# Acknowledgements and completion


def test_full_acknowledgement_persists_then_notifies() -> None:
    coord = coordinator()
    cid = trigger(coord, 10.0)
    for t in TASKS[:-1]:
        assert coord.receive_ack(11.0, cid, t, handle(t, f"{t}/1")).actions == ()
    outcome = coord.receive_ack(12.0, cid, TASKS[-1], handle(TASKS[-1], "last/1"))
    assert outcome.result is AckResult.SUCCESS
    (persist,) = outcome.actions
    assert isinstance(persist, PersistCheckpoint)
    completed = persist.completed
    assert completed.checkpoint_id == cid and completed.job_id == JOB
    assert completed.trigger_timestamp == 10.0 and completed.completion_timestamp == 12.0
    assert completed.tasks == set(TASKS)
    assert completed.metadata_key == "job-1/checkpoints/chk-00000000000000000001/_metadata"
    assert coord.store.latest() is None, "not complete before the metadata is persisted"

    actions = coord.checkpoint_persisted(12.5, cid)
    assert actions == (NotifyComplete(cid, tuple(sorted(TASKS)), CheckpointKind.CHECKPOINT),)
    assert coord.store.latest() == completed
    assert coord.in_flight_count == 0


def test_ack_after_completion_is_discarded() -> None:
    coord = coordinator()
    cid = trigger(coord, 10.0)
    first = handle(SOURCES[0], "s0/1")
    coord.receive_ack(11.0, cid, SOURCES[0], first)
    ack_all(coord, 11.0, cid, tasks=TASKS[1:])
    # While persisting, and after.
    assert coord.receive_ack(12.0, cid, SOURCES[0], first).result is AckResult.DISCARDED
    coord.checkpoint_persisted(12.0, cid)
    late = coord.receive_ack(13.0, cid, SOURCES[0], first)
    assert late.result is AckResult.DISCARDED
    assert late.actions == (), "its keys belong to the retained checkpoint"


def test_ack_for_an_unknown_checkpoint_is_unknown() -> None:
    coord = coordinator()
    trigger(coord, 10.0)
    outcome = coord.receive_ack(11.0, CheckpointId(999), SOURCES[0], handle(SOURCES[0], "k"))
    assert outcome == AckOutcome(AckResult.UNKNOWN, ())
    stranger = task("other-job-op", 0)
    assert coord.receive_ack(11.0, CheckpointId(1), stranger, handle(stranger)).result is AckResult.UNKNOWN


def test_duplicate_ack() -> None:
    coord = coordinator()
    cid = trigger(coord, 10.0)
    assert coord.receive_ack(11.0, cid, SOURCES[0], handle(SOURCES[0])).result is AckResult.SUCCESS
    assert coord.receive_ack(11.5, cid, SOURCES[0], handle(SOURCES[0])).result is AckResult.DUPLICATE
    assert coord.pending_ids == (cid,)


def test_state_handle_of_another_task_is_rejected() -> None:
    coord = coordinator()
    cid = trigger(coord, 10.0)
    with pytest.raises(CheckpointProtocolError, match="state handle of"):
        coord.receive_ack(11.0, cid, SOURCES[0], handle(SOURCES[1]))


def test_a_newer_checkpoint_completing_subsumes_older_pending_ones() -> None:
    coord = coordinator(max_concurrent=2)
    first = trigger(coord, 10.0)
    coord.receive_ack(11.0, first, SOURCES[0], handle(SOURCES[0], "old-only"))
    second = trigger(coord, 20.0)
    actions = ack_all(coord, 21.0, second)
    (aborted,) = of(NotifyAborted, actions)
    assert aborted.checkpoint_id == first and aborted.reason.kind is FailureKind.SUBSUMED
    assert of(DeleteObjects, actions) == [DeleteObjects((), ("old-only",))]
    assert [p.completed.checkpoint_id for p in of(PersistCheckpoint, actions)] == [second]
    assert coord.receive_ack(22.0, first, SOURCES[1], handle(SOURCES[1])).result is AckResult.DISCARDED


def test_checkpoints_are_persisted_one_at_a_time_in_id_order() -> None:
    coord = coordinator(max_concurrent=2)
    first = trigger(coord, 10.0)
    second = trigger(coord, 20.0)
    assert [p.completed.checkpoint_id for p in of(PersistCheckpoint, ack_all(coord, 21.0, first))] == [first]
    assert of(PersistCheckpoint, ack_all(coord, 22.0, second)) == [], "waits for the first to be persisted"
    with pytest.raises(CheckpointProtocolError, match="not being persisted"):
        coord.checkpoint_persisted(23.0, second)
    actions = coord.checkpoint_persisted(23.0, first)
    assert [a.checkpoint_id for a in of(NotifyComplete, actions)] == [first]
    assert [p.completed.checkpoint_id for p in of(PersistCheckpoint, actions)] == [second]
    coord.checkpoint_persisted(24.0, second)
    assert [c.checkpoint_id for c in coord.store.all()] == [second]


def test_persist_failure_aborts_and_deletes_its_objects_and_metadata() -> None:
    coord = coordinator()
    first = trigger(coord, 10.0)
    complete(coord, 11.0, first, {SOURCES[0]: ("base",)})
    second = trigger(coord, 21.0)
    persist = of(PersistCheckpoint, ack_all(coord, 22.0, second, {SOURCES[0]: ("new",), SOURCES[1]: ("x",)}))
    actions = coord.checkpoint_persist_failed(23.0, second, "S3 answered 503 three times")
    (aborted,) = of(NotifyAborted, actions)
    assert aborted.checkpoint_id == second and aborted.reason.kind is FailureKind.PERSIST_FAILED
    assert aborted.tasks == tuple(sorted(TASKS))
    assert of(DeleteObjects, actions) == [DeleteObjects((persist[0].completed.metadata_key,), ("new", "x"))]
    assert [c.checkpoint_id for c in coord.store.all()] == [first]
    assert coord.stats().failed == 1


# ---------------------------------------------------------------------------------------------------
# Aborts


def test_decline_aborts_and_notifies_every_task() -> None:
    coord = coordinator()
    cid = trigger(coord, 10.0)
    coord.receive_ack(11.0, cid, SOURCES[0], handle(SOURCES[0], "uploaded"))
    actions = coord.receive_decline(12.0, cid, OTHERS[0], "snapshot failed: disk full")
    (aborted,) = of(NotifyAborted, actions)
    assert aborted.tasks == tuple(sorted(TASKS))
    assert aborted.reason.kind is FailureKind.DECLINED
    assert aborted.reason.task_id == OTHERS[0]
    assert "disk full" in str(aborted.reason)
    assert of(DeleteObjects, actions) == [DeleteObjects((), ("uploaded",))]
    assert coord.pending_ids == ()
    assert coord.receive_ack(13.0, cid, SOURCES[1], handle(SOURCES[1], "late")).result is AckResult.DISCARDED


def test_late_ack_of_an_aborted_checkpoint_deletes_its_objects() -> None:
    coord = coordinator()
    cid = trigger(coord, 10.0)
    coord.receive_decline(12.0, cid, OTHERS[0], "no")
    outcome = coord.receive_ack(13.0, cid, SOURCES[1], handle(SOURCES[1], "late-upload"))
    assert outcome.result is AckResult.DISCARDED
    assert outcome.actions == (DeleteObjects((), ("late-upload",)),)


def test_late_or_foreign_declines_are_ignored() -> None:
    coord = coordinator()
    cid = trigger(coord, 10.0)
    assert coord.receive_decline(11.0, CheckpointId(77), SOURCES[0], "?") == ()
    assert coord.receive_decline(11.0, cid, task("stranger", 0), "?") == ()
    assert coord.pending_ids == (cid,)
    coord.receive_decline(12.0, cid, SOURCES[0], "no")
    assert coord.receive_decline(13.0, cid, SOURCES[1], "no") == ()
    assert coord.stats().failed == 1


def test_timeout_aborts() -> None:
    coord = coordinator(timeout_s=30.0)
    cid = trigger(coord, 10.0)
    coord.receive_ack(11.0, cid, SOURCES[0], handle(SOURCES[0], "a"))
    assert coord.next_tick_at(11.0) == 40.0, "blocked by the pending one: the timeout is next"
    assert of(NotifyAborted, coord.tick(39.9)) == []
    actions = coord.tick(40.0)
    (aborted,) = of(NotifyAborted, actions)
    assert aborted.reason.kind is FailureKind.EXPIRED
    assert "3 task(s)" in aborted.reason.message
    assert of(DeleteObjects, actions) == [DeleteObjects((), ("a",))]
    # The same tick may trigger the next checkpoint: it is overdue.
    assert [b.checkpoint_id for b in of(TriggerBarriers, actions)] == [2]


def test_task_failure_aborts_every_pending_checkpoint_and_stops_triggering() -> None:
    coord = coordinator(max_concurrent=2)
    first = trigger(coord, 10.0)
    second = trigger(coord, 20.0)
    actions = coord.task_failed(21.0, OTHERS[1], "ValueError: bad record")
    aborted = of(NotifyAborted, actions)
    assert [a.checkpoint_id for a in aborted] == [first, second]
    assert all(a.reason.kind is FailureKind.TASK_FAILURE and a.reason.task_id == OTHERS[1] for a in aborted)
    assert not coord.is_running
    assert coord.tick(100.0) == ()
    with pytest.raises(SavepointRejectedError):
        coord.trigger_savepoint(100.0)
    assert coord.receive_ack(101.0, first, SOURCES[0], handle(SOURCES[0])).result is AckResult.DISCARDED


def test_task_failure_lets_a_persisting_checkpoint_finish() -> None:
    coord = coordinator()
    cid = trigger(coord, 10.0)
    ack_all(coord, 11.0, cid)
    assert coord.task_failed(12.0, SOURCES[0]) == ()
    assert coord.restore_latest(12.0) == WaitForPersist((cid,))
    coord.checkpoint_persisted(13.0, cid)
    decision = coord.restore_latest(13.0)
    assert isinstance(decision, RestoreFrom) and decision.checkpoint.checkpoint_id == cid


def test_stop_aborts_pending_checkpoints() -> None:
    coord = coordinator()
    cid = trigger(coord, 10.0)
    (aborted,) = coord.stop(11.0, "cancelled by the user")
    assert isinstance(aborted, NotifyAborted) and aborted.checkpoint_id == cid
    assert aborted.reason.kind is FailureKind.JOB_STOPPED
    assert coord.tick(100.0) == ()


def test_restarting_aborts_checkpoints_of_the_previous_deployment() -> None:
    coord = coordinator()
    cid = trigger(coord, 10.0)
    (aborted,) = coord.start(11.0, TASKS, SOURCES)
    assert isinstance(aborted, NotifyAborted) and aborted.checkpoint_id == cid


# ---------------------------------------------------------------------------------------------------
# Retention and object release


def test_retention_deletes_only_keys_no_retained_checkpoint_references() -> None:
    coord = coordinator(retained=1)
    s0 = SOURCES[0]
    first = trigger(coord, 10.0)
    complete(coord, 11.0, first, {s0: ("sst-1", "sst-shared"), OTHERS[0]: ("win-1",)})
    second = trigger(coord, 21.0)
    outcome = coord.receive_ack(22.0, second, s0, handle(s0, "sst-2", reused=["sst-shared"]))
    assert outcome.result is AckResult.SUCCESS
    persist = of(PersistCheckpoint, ack_all(coord, 22.0, second, {OTHERS[0]: ("win-2",)}, tasks=TASKS[1:]))
    assert persist
    actions = coord.checkpoint_persisted(23.0, second)
    first_meta = "job-1/checkpoints/chk-00000000000000000001/_metadata"
    assert of(DeleteObjects, actions) == [DeleteObjects((first_meta,), ("sst-1", "win-1"))]
    assert coord.store.is_referenced("sst-shared")


def test_released_keys_still_used_in_flight_wait_until_that_checkpoint_ends() -> None:
    coord = coordinator(retained=1, max_concurrent=2)
    s0 = SOURCES[0]
    first = trigger(coord, 10.0)
    complete(coord, 11.0, first, {s0: ("base",)})
    second = trigger(coord, 20.0)
    third = trigger(coord, 30.0)
    # The third checkpoint reuses "base"; the second one (which does not) completes and subsumes the first.
    coord.receive_ack(31.0, third, s0, handle(s0, "t3", reused=["base"]))
    ack_all(coord, 32.0, second, {s0: ("s2",)})
    actions = coord.checkpoint_persisted(33.0, second)
    assert of(DeleteObjects, actions) == [DeleteObjects(("job-1/checkpoints/chk-00000000000000000001/_metadata",), ())]
    assert coord.deferred_deletes == {"base"}
    # The third checkpoint is aborted: now nothing references "base".
    actions = coord.receive_decline(34.0, third, s0, "no")
    assert of(DeleteObjects, actions) == [DeleteObjects((), ("base", "t3"))]
    assert coord.deferred_deletes == frozenset()


def test_deferred_key_is_kept_when_the_checkpoint_using_it_completes() -> None:
    coord = coordinator(retained=1, max_concurrent=2)
    s0 = SOURCES[0]
    first = trigger(coord, 10.0)
    complete(coord, 11.0, first, {s0: ("base",)})
    second = trigger(coord, 20.0)
    third = trigger(coord, 30.0)
    coord.receive_ack(31.0, third, s0, handle(s0, reused=["base"]))
    ack_all(coord, 32.0, second)
    coord.checkpoint_persisted(33.0, second)
    assert coord.deferred_deletes == {"base"}
    ack_all(coord, 34.0, third, tasks=TASKS[1:])
    actions = coord.checkpoint_persisted(35.0, third)
    assert all("base" not in d.object_keys for d in of(DeleteObjects, actions))
    assert coord.store.is_referenced("base")
    assert coord.deferred_deletes == frozenset()


def test_reusing_an_already_released_key_aborts_the_checkpoint() -> None:
    coord = coordinator(retained=1)
    s0 = SOURCES[0]
    first = trigger(coord, 10.0)
    complete(coord, 11.0, first, {s0: ("old",)})
    second = trigger(coord, 20.0)
    complete(coord, 21.0, second, {s0: ("new",)})  # subsumes the first: "old" is deleted
    third = trigger(coord, 30.0)
    outcome = coord.receive_ack(31.0, third, s0, handle(s0, "fresh", reused=["old"]))
    assert outcome.result is AckResult.DISCARDED
    (aborted,) = of(NotifyAborted, outcome.actions)
    assert aborted.reason.kind is FailureKind.RELEASED_STATE and "'old'" in aborted.reason.message
    assert of(DeleteObjects, outcome.actions) == [DeleteObjects((), ("fresh", "old"))]


# ---------------------------------------------------------------------------------------------------
# Savepoints


def test_savepoint_is_triggered_at_once_and_its_objects_are_never_deleted() -> None:
    coord = coordinator(retained=1)
    sp = coord.trigger_savepoint(3.0)
    assert sp == TriggerBarriers(
        CheckpointId(1), 3.0, tuple(sorted(SOURCES)), CheckpointKind.SAVEPOINT, reserve_ids_through=CheckpointId(100)
    )
    persist = of(PersistCheckpoint, ack_all(coord, 4.0, sp.checkpoint_id, {SOURCES[0]: ("sp-key",)}))
    assert persist[0].completed.metadata_key == "job-1/savepoints/sp-00000000000000000001/_metadata"
    actions = coord.checkpoint_persisted(5.0, sp.checkpoint_id)
    assert actions == (NotifyComplete(sp.checkpoint_id, tuple(sorted(TASKS)), CheckpointKind.SAVEPOINT),)
    for now in (10.0, 20.0, 30.0):
        cid = trigger(coord, now)
        for delete in of(DeleteObjects, complete(coord, now + 1, cid, {SOURCES[0]: (f"k{cid}",)})):
            assert "sp-key" not in delete.object_keys
            assert all("savepoints" not in m for m in delete.metadata_keys)
    assert [c.checkpoint_id for c in coord.store.all()] == [4], "a newer checkpoint replaced it as the restore point"


def test_savepoint_ignores_max_concurrent_but_blocks_periodic_checkpoints() -> None:
    coord = coordinator(max_concurrent=1)
    cid = trigger(coord, 10.0)
    sp = coord.trigger_savepoint(11.0)
    assert sp.checkpoint_id == cid + 1
    assert coord.in_flight_count == 2
    with pytest.raises(SavepointRejectedError, match="still in progress"):
        coord.trigger_savepoint(12.0)
    # The savepoint completes first and subsumes the older checkpoint.
    actions = ack_all(coord, 13.0, sp.checkpoint_id)
    assert [a.checkpoint_id for a in of(NotifyAborted, actions)] == [cid]
    assert of(TriggerBarriers, coord.tick(25.0)) == [], "blocked while the savepoint persists"
    coord.checkpoint_persisted(26.0, sp.checkpoint_id)
    assert trigger(coord, 26.0) == sp.checkpoint_id + 1


def test_savepoint_needs_a_running_job() -> None:
    coord = coordinator(start_at=None)
    with pytest.raises(SavepointRejectedError, match="not running") as raised:
        coord.trigger_savepoint(1.0)
    assert raised.value.retriable


# ---------------------------------------------------------------------------------------------------
# Recovery


def test_restore_latest_and_the_counter_after_recovery() -> None:
    coord = coordinator(max_concurrent=2)
    first = trigger(coord, 10.0)
    complete(coord, 11.0, first)
    second = trigger(coord, 20.0)
    coord.task_failed(21.0, SOURCES[1])
    decision = coord.restore_latest(22.0)
    assert isinstance(decision, RestoreFrom) and decision.checkpoint.checkpoint_id == first
    coord.start(23.0, TASKS, SOURCES)
    assert trigger(coord, 33.0) == second + 1, "the id of the aborted checkpoint is not reused"
    assert coord.stats().restored_from == first
    assert coord.stats().restored_at == 22.0


def test_restore_without_a_checkpoint_starts_fresh() -> None:
    coord = coordinator()
    coord.task_failed(1.0, SOURCES[0])
    assert coord.restore_latest(2.0) == StartFresh()


def test_restore_needs_the_job_stopped() -> None:
    coord = coordinator()
    with pytest.raises(CheckpointProtocolError, match="task_failed or stop"):
        coord.restore_latest(1.0)


def stored(checkpoint_id: int, *keys: str) -> CompletedCheckpoint:
    return CompletedCheckpoint(
        CheckpointId(checkpoint_id),
        JOB,
        float(checkpoint_id),
        checkpoint_id + 0.5,
        (handle(SOURCES[0], *keys),),
        f"meta/{checkpoint_id}",
    )


def test_a_new_jobmanager_loads_checkpoints_and_continues_their_ids() -> None:
    coord = coordinator(start_at=None, retained=1)
    actions = coord.load_completed([stored(7, "b", "shared"), stored(5, "a", "shared")])
    assert actions == (DeleteObjects(("meta/5",), ("a",)),)
    decision = coord.restore_latest(50.0)
    assert isinstance(decision, RestoreFrom) and decision.checkpoint.checkpoint_id == 7
    coord.start(51.0, TASKS, SOURCES)
    assert trigger(coord, 61.0) == 8
    late = coord.receive_ack(62.0, CheckpointId(7), SOURCES[0], handle(SOURCES[0], "b"))
    assert late.result is AckResult.DISCARDED and late.actions == ()


def test_load_completed_respects_the_highest_id_seen() -> None:
    coord = coordinator(start_at=None)
    coord.load_completed([stored(3)], highest_seen_id=CheckpointId(9))
    coord.restore_latest(0.0)
    coord.start(0.0, TASKS, SOURCES)
    assert trigger(coord, 10.0) == 10


def test_load_completed_needs_a_fresh_coordinator_and_the_same_job() -> None:
    coord = coordinator(start_at=None)
    other = CompletedCheckpoint(CheckpointId(1), JobId("other"), 0.0, 1.0, (), "m")
    with pytest.raises(CheckpointProtocolError, match="belongs to job"):
        coord.load_completed([other])
    coord.load_completed([stored(1)])
    with pytest.raises(CheckpointProtocolError, match="fresh"):
        coord.load_completed([stored(2)])


# ---------------------------------------------------------------------------------------------------
# Statistics


def test_stats_count_and_describe_checkpoints() -> None:
    coord = coordinator(max_concurrent=2)
    first = trigger(coord, 10.0)
    metrics = TaskAckMetrics(alignment_duration_s=0.2, start_delay_s=0.05, state_size_bytes=1234)
    for t in TASKS:
        coord.receive_ack(12.0, first, t, handle(t, f"{t}/k"), metrics if t == OTHERS[0] else None)
    coord.checkpoint_persisted(13.0, first)
    second = trigger(coord, 20.0)
    coord.receive_decline(21.0, second, SOURCES[0], "nope")
    third = trigger(coord, 30.0)
    coord.receive_ack(31.0, third, SOURCES[0], handle(SOURCES[0]))

    stats = coord.stats()
    assert (stats.triggered, stats.completed, stats.failed, stats.in_progress) == (3, 1, 1, 1)
    assert [(s.checkpoint_id, s.status) for s in stats.history] == [
        (third, CheckpointStatus.IN_PROGRESS),
        (second, CheckpointStatus.FAILED),
        (first, CheckpointStatus.COMPLETED),
    ]
    assert stats.history[0].acknowledged == 1 and stats.history[0].total_tasks == 4
    assert stats.history[0].duration_s is None

    latest = stats.latest_completed
    assert latest is not None and latest.checkpoint_id == first
    assert latest.duration_s == 3.0
    assert latest.state_size_bytes == sum(100 + len(b"offsets") for _ in TASKS)
    per_task = {t.task_id: t for t in latest.tasks}
    assert per_task[OTHERS[0]].alignment_duration_s == 0.2
    assert per_task[OTHERS[0]].start_delay_s == 0.05
    assert per_task[OTHERS[0]].state_size_bytes == 1234
    assert per_task[OTHERS[0]].acked_at == 12.0
    assert per_task[SOURCES[0]].alignment_duration_s == 0.0

    failed = stats.latest_failed
    assert failed is not None and failed.checkpoint_id == second
    assert failed.failure is not None and failed.failure.kind is FailureKind.DECLINED


# ---------------------------------------------------------------------------------------------------
# Randomized: tasks with incremental state, a slow network and failures


@dataclass
class SimTask:
    """A task with an LSM-like set of files; it reuses the keys of the last checkpoint it was told completed."""

    task_id: TaskId
    attempt: int
    files: set[str] = field(default_factory=set)
    confirmed: dict[str, str] = field(default_factory=dict)  # file -> key of a completed checkpoint
    confirmed_id: int = 0
    snapshots: dict[int, dict[str, str]] = field(default_factory=dict)  # checkpoint id -> file -> key
    next_file: int = 0

    @classmethod
    def restored(cls, task_id: TaskId, attempt: int, state: TaskStateHandle | None, cid: int) -> SimTask:
        t = cls(task_id, attempt)
        if state is not None:
            for obj in state.objects:
                file = obj.key.split("@")[0]
                t.files.add(file)
                t.confirmed[file] = obj.key
            t.confirmed_id = cid
        return t

    def snapshot(self, cid: int, rng: random.Random, storage: set[str], savepoint: bool = False) -> TaskStateHandle:
        """A savepoint uploads every file under its own keys, and its files are never reused."""
        self.files = {f for f in self.files if rng.random() > 0.3}  # compaction drops files for good
        self.next_file += 1
        self.files.add(f"{self.task_id}/a{self.attempt}/f{self.next_file}")
        keys: dict[str, str] = {}
        objects = []
        for file in sorted(self.files):
            if file in self.confirmed and not savepoint:
                keys[file] = self.confirmed[file]
                objects.append(StateObject(keys[file], 1, reused=True))
            else:
                keys[file] = f"{file}@{cid}"
                storage.add(keys[file])
                objects.append(StateObject(keys[file], 1))
        if not savepoint:
            self.snapshots[cid] = keys
        return TaskStateHandle(self.task_id, tuple(objects), inline_payload=b"offset")

    def notify_complete(self, cid: int) -> None:
        if cid > self.confirmed_id and cid in self.snapshots:
            self.confirmed = {f: k for f, k in self.snapshots[cid].items() if f in self.files}
            self.confirmed_id = cid


class Simulation:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.max_concurrent = self.rng.choice([1, 2, 3])
        config = CheckpointConfig(
            interval_s=1.0,
            timeout_s=self.rng.choice([2.0, 4.0]),
            min_pause_s=self.rng.choice([0.0, 0.0, 0.5]),
            max_concurrent=self.max_concurrent,
        )
        self.coord = CheckpointCoordinator(JOB, config, InMemoryCompletedCheckpointStore(self.rng.choice([1, 2, 3])))
        self.now = 0.0
        self.attempt = 0
        self.tasks = {t: SimTask(t, 0) for t in TASKS}
        self.events: list[tuple[float, int, str, tuple[object, ...]]] = []
        self.seq = 0
        self.objects: set[str] = set()
        self.metadata: set[str] = set()
        self.savepoints: list[CompletedCheckpoint] = []  # completed ones
        self.persisting: dict[CheckpointId, CompletedCheckpoint] = {}
        self.triggered: dict[CheckpointId, CheckpointKind] = {}
        self.ended: list[CheckpointId] = []
        self.completed_order: list[CheckpointId] = []
        self.results: dict[AckResult, int] = {r: 0 for r in AckResult}
        self.coord.start(self.now, TASKS, SOURCES)

    def schedule(self, delay: float, kind: str, *payload: object) -> None:
        self.seq += 1
        self.events.append((self.now + delay, self.seq, kind, payload))

    def execute(self, actions: Iterable[Action]) -> None:
        for action in actions:
            if isinstance(action, TriggerBarriers):
                assert action.checkpoint_id not in self.triggered
                assert action.source_tasks == tuple(sorted(SOURCES))
                self.triggered[action.checkpoint_id] = action.kind
                for t in TASKS:
                    self.schedule(self.rng.uniform(0.0, 2.0), "snapshot", t, self.attempt, action.checkpoint_id)
            elif isinstance(action, PersistCheckpoint):
                cid = action.completed.checkpoint_id
                assert not self.persisting, "one persist at a time"
                self.persisting[cid] = action.completed
                self.schedule(self.rng.uniform(0.0, 0.5), "persisted", cid)
            elif isinstance(action, NotifyComplete):
                self.end(action.checkpoint_id)
                assert not self.completed_order or action.checkpoint_id > self.completed_order[-1]
                self.completed_order.append(action.checkpoint_id)
                for t in action.tasks:
                    self.schedule(self.rng.uniform(0.0, 1.0), "notify", t, self.attempt, action.checkpoint_id)
            elif isinstance(action, NotifyAborted):
                self.end(action.checkpoint_id)
                assert action.tasks == tuple(sorted(TASKS))
            elif isinstance(action, DeleteObjects):
                referenced = self.referenced_keys()
                assert not referenced & set(action.object_keys), "deleted a key that is still referenced"
                retained_meta = {c.metadata_key for c in self.coord.store.all()}
                assert not retained_meta & set(action.metadata_keys)
                for sp in self.savepoints:
                    assert not sp.object_keys & set(action.object_keys), "deleted a completed savepoint's object"
                    assert sp.metadata_key not in action.metadata_keys
                self.objects -= set(action.object_keys)
                self.metadata -= set(action.metadata_keys)
        self.check()

    def end(self, cid: CheckpointId) -> None:
        assert cid in self.triggered, f"checkpoint {cid} ended but was never triggered"
        assert cid not in self.ended, f"checkpoint {cid} ended twice"
        self.ended.append(cid)

    def referenced_keys(self) -> set[str]:
        keys = set(self.coord.store.referenced_keys())
        for cid in self.coord.pending_ids:
            pending = self.coord.pending(cid)
            assert pending is not None
            keys |= pending.referenced_keys()
        for completed in self.persisting.values():
            keys |= completed.object_keys
        return keys

    def check(self) -> None:
        coord = self.coord
        periodic = [cid for cid in (*coord.pending_ids, *coord.persisting_ids) if not self.is_savepoint(cid)]
        assert len(periodic) <= self.max_concurrent
        assert coord.in_flight_count <= self.max_concurrent + 1
        assert self.referenced_keys() <= self.objects, "a referenced object was deleted"
        for c in coord.store.all():
            assert c.metadata_key in self.metadata
        assert len([c for c in coord.store.all() if not c.is_savepoint]) <= 3

    def is_savepoint(self, cid: CheckpointId) -> bool:
        return self.triggered[cid] is CheckpointKind.SAVEPOINT

    def deliver(self, kind: str, payload: tuple[object, ...]) -> None:
        if kind == "snapshot":
            t, attempt, cid = payload
            assert isinstance(t, TaskId) and isinstance(cid, int)
            if attempt != self.attempt:
                return  # that task was cancelled before the barrier reached it
            if self.rng.random() < 0.03:
                self.execute(self.coord.receive_decline(self.now, CheckpointId(cid), t, "could not snapshot"))
                return
            state = self.tasks[t].snapshot(cid, self.rng, self.objects, savepoint=self.is_savepoint(CheckpointId(cid)))
            self.schedule(self.rng.uniform(0.0, 0.5), "ack", t, cid, state)
            if self.rng.random() < 0.05:
                self.schedule(self.rng.uniform(0.5, 3.0), "ack", t, cid, state)  # a resent ack
        elif kind == "ack":
            t, cid, sent = payload
            assert isinstance(t, TaskId) and isinstance(cid, int) and isinstance(sent, TaskStateHandle)
            outcome = self.coord.receive_ack(self.now, CheckpointId(cid), t, sent)
            assert outcome.result is not AckResult.UNKNOWN, "every acked checkpoint was triggered"
            self.results[outcome.result] += 1
            self.execute(outcome.actions)
        elif kind == "persisted":
            (cid,) = payload
            assert isinstance(cid, int)
            completed = self.persisting[CheckpointId(cid)]
            if self.rng.random() < 0.05:
                del self.persisting[CheckpointId(cid)]
                self.execute(self.coord.checkpoint_persist_failed(self.now, CheckpointId(cid), "write failed"))
            else:
                self.metadata.add(completed.metadata_key)
                if completed.is_savepoint:
                    self.savepoints.append(completed)
                del self.persisting[CheckpointId(cid)]
                self.execute(self.coord.checkpoint_persisted(self.now, CheckpointId(cid)))
        elif kind == "notify":
            t, attempt, cid = payload
            assert isinstance(t, TaskId) and isinstance(cid, int)
            if attempt == self.attempt:
                self.tasks[t].notify_complete(cid)

    def run_due_events(self) -> None:
        while True:
            due = [e for e in self.events if e[0] <= self.now]
            if not due:
                return
            event = min(due)
            self.events.remove(event)
            self.deliver(event[2], event[3])

    def fail_and_recover(self) -> None:
        failed = self.rng.choice(TASKS)
        self.execute(self.coord.task_failed(self.now, failed, "injected"))
        self.attempt += 1
        while isinstance(decision := self.coord.restore_latest(self.now), WaitForPersist):
            for event in sorted(e for e in self.events if e[2] == "persisted"):
                self.events.remove(event)
                self.deliver(event[2], event[3])
        restored = decision.checkpoint if isinstance(decision, RestoreFrom) else None
        if restored is not None:
            assert restored == self.coord.store.latest()
        cid = restored.checkpoint_id if restored is not None else 0
        adopted = restored if restored is not None and not restored.is_savepoint else None  # a new database
        self.tasks = {
            t: SimTask.restored(t, self.attempt, adopted.state_of(t) if adopted else None, cid) for t in TASKS
        }
        self.execute(self.coord.start(self.now, TASKS, SOURCES))

    def step(self) -> None:
        self.now += self.rng.uniform(0.05, 0.6)
        self.run_due_events()
        roll = self.rng.random()
        if roll < 0.01:
            self.fail_and_recover()
        elif roll < 0.03 and self.coord.is_running:
            try:
                self.execute([self.coord.trigger_savepoint(self.now)])
            except SavepointRejectedError:
                assert any(self.is_savepoint(c) for c in (*self.coord.pending_ids, *self.coord.persisting_ids))
        elif roll < 0.04:
            bogus = CheckpointId(10_000 + self.rng.randrange(100))
            t = self.rng.choice(TASKS)
            assert self.coord.receive_ack(self.now, bogus, t, TaskStateHandle(t)).result is AckResult.UNKNOWN
        self.execute(self.coord.tick(self.now))

    def drain(self) -> None:
        self.execute(self.coord.stop(self.now, "end of simulation"))
        while self.events:
            self.now = max(self.now, min(self.events)[0])
            self.run_due_events()


@pytest.mark.parametrize("seed", range(40))
def test_random_protocol_runs_keep_the_invariants(seed: int) -> None:
    sim = Simulation(seed)
    for _ in range(500):
        sim.step()
    sim.drain()

    assert sorted(sim.ended) == sorted(sim.triggered), "every checkpoint ends exactly once"
    assert sim.coord.in_flight_count == 0
    assert sim.coord.deferred_deletes == frozenset()
    assert sim.completed_order, "some checkpoints completed"
    assert sim.results[AckResult.SUCCESS] > 0
    # Nothing leaks: every object and metadata key left belongs to a retained checkpoint or to a
    # completed savepoint (the user's, never deleted).
    savepoint_objects = {k for sp in sim.savepoints for k in sp.object_keys}
    assert sim.objects == sim.coord.store.referenced_keys() | savepoint_objects
    assert sim.metadata == {c.metadata_key for c in sim.coord.store.all()} | {sp.metadata_key for sp in sim.savepoints}
    stats = sim.coord.stats()
    assert stats.triggered == len(sim.triggered)
    assert stats.completed == len(sim.completed_order)
    assert stats.completed + stats.failed == len(sim.ended)


def test_after_a_restore_the_first_checkpoint_is_triggered_as_soon_as_every_task_runs() -> None:
    coord = coordinator(start_at=None)
    coord.load_completed([stored(3)])
    coord.restore_latest(0.0)
    coord.start(50.0, TASKS, SOURCES, restored=True)
    assert trigger(coord, 50.0) == 4, "the restored run's output waits for this checkpoint"
    fresh = coordinator(start_at=None)
    fresh.start(50.0, TASKS, SOURCES)
    assert of(TriggerBarriers, fresh.tick(50.0)) == [], "a fresh start waits one interval"


# ---------------------------------------------------------------------------------------------------
# The checkpoint timeline in the stats


def _timeline(at: float) -> SubtaskCheckpointTimeline:
    return SubtaskCheckpointTimeline(at, (ChannelBarrierTime(0, "source", 0, at),), at, at + 0.1, at + 0.2)


def test_the_stats_keep_each_tasks_timeline_with_its_ack_time_through_completion_and_failure() -> None:
    coord = coordinator()
    cid = trigger(coord, 10.0)
    timelines = {t: _timeline(10.0 + i) for i, t in enumerate(TASKS)}
    for i, t in enumerate(TASKS[:-1]):
        coord.receive_ack(11.0 + i, cid, t, handle(t), TaskAckMetrics(timeline=timelines[t]))
    (in_progress,) = coord.stats().history
    assert in_progress.pending_tasks == (TASKS[-1],)
    assert {s.task_id: (s.timeline, s.acked_at) for s in in_progress.tasks} == {
        t: (timelines[t], 11.0 + i) for i, t in enumerate(TASKS[:-1])
    }
    last = TASKS[-1]
    coord.receive_ack(20.0, cid, last, handle(last), TaskAckMetrics(timeline=timelines[last]))
    coord.checkpoint_persisted(21.0, cid)
    (completed,) = coord.stats().history
    assert completed.status is CheckpointStatus.COMPLETED and completed.pending_tasks == ()
    assert {s.task_id: s.timeline for s in completed.tasks} == timelines

    failing = trigger(coord, 40.0)
    coord.receive_ack(41.0, failing, SOURCES[0], handle(SOURCES[0]), TaskAckMetrics(timeline=_timeline(40.5)))
    coord.receive_decline(42.0, failing, SOURCES[1], "busy")
    failed = coord.stats().history[0]
    assert failed.status is CheckpointStatus.FAILED
    assert [(s.task_id, s.timeline) for s in failed.tasks] == [(SOURCES[0], _timeline(40.5))]
    assert set(failed.pending_tasks) == set(TASKS) - {SOURCES[0]}
