"""The checkpoint-action executor: id reservation before a barrier, triggers, metadata last, notifies."""

from __future__ import annotations

from tests.unit.jobmanager.conftest import TM_A, Harness
from weir.core.checkpointing import CheckpointKind
from weir.core.states import TaskState
from weir.jobmanager.checkpointing import coordinator as cc
from weir.jobmanager.checkpointing.metadata import decode_metadata
from weir.jobmanager.checkpointing.pending import TaskAckMetrics
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.lifecycle import Running
from weir.jobmanager.messages import CheckpointAck, CheckpointDecline, TaskStateReport


def started(harness: Harness) -> tuple[JobMaster, cc.TriggerBarriers]:
    job = harness.job({"checkpointing.interval": "1s"})
    with harness.jm.lock:
        harness.jm.executor.execute(
            job, job.lifecycle.tasks_running(harness.clock(), job.all_task_ids(), restored=False)
        )
        harness.clock.advance(1.5)
        actions = job.lifecycle.tick(harness.clock())
        (trigger,) = [a for a in actions if isinstance(a, cc.TriggerBarriers)]
        harness.jm.executor.execute(job, actions)
    return job, trigger


def ack(job: JobMaster, checkpoint_id: int) -> CheckpointAck:
    return CheckpointAck("job-1", "gen", 0, job.attempt, checkpoint_id, (), b"offsets", TaskAckMetrics())


def test_a_trigger_reserves_its_id_in_the_job_record_before_the_barrier(harness: Harness) -> None:
    job, trigger = started(harness)
    assert trigger.reserve_ids_through is not None
    record = harness.jm.records.load(harness.jm.paths.job_record(job.coordinator.job_id))
    assert record.checkpoint_ids_reserved_through >= trigger.checkpoint_id
    assert harness.gateway.named("trigger") == [
        (TM_A, "job-1/gen#0", 1, trigger.checkpoint_id, CheckpointKind.CHECKPOINT, False)
    ]


def test_an_acknowledged_checkpoint_is_persisted_then_the_tasks_are_told(harness: Harness) -> None:
    job, trigger = started(harness)
    harness.jm.acknowledge_checkpoint(ack(job, trigger.checkpoint_id))
    latest = job.coordinator.store.latest()
    assert latest is not None and latest.checkpoint_id == trigger.checkpoint_id
    stored = decode_metadata(harness.storage.get_bytes(latest.metadata_key), latest.metadata_key)
    assert stored.checkpoint_id == trigger.checkpoint_id
    assert harness.gateway.named("complete") == [(TM_A, "job-1", 1, trigger.checkpoint_id)]


def test_a_declined_checkpoint_is_aborted_on_the_tasks(harness: Harness) -> None:
    job, trigger = started(harness)
    harness.jm.decline_checkpoint(CheckpointDecline("job-1", "gen", 0, job.attempt, trigger.checkpoint_id, "busy"))
    assert harness.gateway.named("aborted") == [(TM_A, "job-1", 1, trigger.checkpoint_id)]
    assert job.coordinator.store.latest() is None


def test_a_trigger_the_source_does_not_accept_is_a_decline(harness: Harness) -> None:
    harness.gateway.accept_triggers = False
    job, trigger = started(harness)
    assert harness.gateway.named("aborted") == [(TM_A, "job-1", 1, trigger.checkpoint_id)]


def test_an_ack_of_an_older_attempt_is_ignored(harness: Harness) -> None:
    job, trigger = started(harness)
    stale = CheckpointAck("job-1", "gen", 0, job.attempt + 1, trigger.checkpoint_id, (), b"", TaskAckMetrics())
    harness.jm.acknowledge_checkpoint(stale)
    assert job.coordinator.store.latest() is None and harness.gateway.named("complete") == []


def test_delete_objects_removes_metadata_and_objects(harness: Harness) -> None:
    job = harness.job()
    harness.storage.put_bytes("job-1/checkpoints/chk-1/_metadata", b"m")
    harness.storage.put_bytes("job-1/shared/a.sst", b"s")
    with harness.jm.lock:
        harness.jm.executor.execute(
            job, (cc.DeleteObjects(("job-1/checkpoints/chk-1/_metadata",), ("job-1/shared/a.sst",)),)
        )
    assert [k for k, _ in harness.storage.list("job-1/checkpoints")] == []
    assert [k for k, _ in harness.storage.list("job-1/shared")] == []


def test_the_first_checkpoint_triggered_after_every_source_ended_is_their_final_one(harness: Harness) -> None:
    """A bounded source that read everything waits for a final checkpoint before it ends its stream.
    With a periodic checkpoint always in flight (an interval shorter than a checkpoint's duration),
    the extra final checkpoint could never be triggered (one at a time), the periodic ones went out
    with ``final=False``, and the job never finished (an unaligned restore of 150,000 events ran on
    for 1,490 checkpoints). The next checkpoint triggered after the sources ended is the final one."""
    job, in_flight = started(harness)
    harness.jm.report_task_state(TaskStateReport("job-1", "gen", 0, job.attempt, TaskState.RUNNING, None, 0, 0, True))
    state = job.lifecycle.state
    assert isinstance(state, Running) and state.final_checkpoint is None, "a final one went out beside another"
    harness.jm.acknowledge_checkpoint(ack(job, in_flight.checkpoint_id))
    harness.clock.advance(1.5)
    with harness.jm.lock:
        actions = job.lifecycle.tick(harness.clock())
        (periodic,) = [a for a in actions if isinstance(a, cc.TriggerBarriers)]
        harness.jm.executor.execute(job, actions)
    state = job.lifecycle.state
    assert isinstance(state, Running) and state.final_checkpoint == periodic.checkpoint_id and periodic.final
    assert harness.gateway.named("trigger")[-1] == (
        TM_A,
        "job-1/gen#0",
        1,
        periodic.checkpoint_id,
        CheckpointKind.CHECKPOINT,
        True,
    )
