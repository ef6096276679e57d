"""The edges of a job's life through the JobManager: where the end of input, a stop, a drain, a cancel
and a checkpoint being persisted meet. Each test drives the JobManager only through what its
servicer and monitor call (task reports, acks, declines, ticks, cancel, savepoints), so it shows the
defect it was written for on the code before the lifecycle (``weir.jobmanager.lifecycle``) too."""

from __future__ import annotations

from tests.unit.jobmanager.conftest import TM_A, Harness, MakeHarness
from weir.core.checkpointing import CheckpointKind
from weir.core.errors import ServiceUnavailableError
from weir.core.states import JobStatus, TaskState
from weir.jobmanager.checkpointing.metadata import encode_metadata
from weir.jobmanager.checkpointing.pending import TaskAckMetrics
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.messages import CheckpointAck, CheckpointDecline, TaskStateReport
from weir.jobmanager.recovery import needs_takeover

EVERY_SECOND = {"checkpointing.interval": "1s", "restart.strategy": "fixed-delay", "restart.delay": "1s"}


def running(h: Harness, parameters: dict[str, str] = EVERY_SECOND) -> JobMaster:
    """A job whose every task reports RUNNING: its periodic checkpoints start."""
    job = h.job(parameters)
    report(h, job, TaskState.RUNNING)
    return job


def report(h: Harness, job: JobMaster, state: TaskState, *, input_ended: bool = False) -> None:
    for vertex, subtask in list(job.tasks):
        h.jm.report_task_state(
            TaskStateReport(job.job_id, vertex, subtask, job.attempt, state, None, 0, 0, input_ended)
        )


def triggers(h: Harness) -> list[int]:
    return [call[3] for call in h.gateway.named("trigger")]


def periodic(h: Harness) -> int:
    """Let the interval pass and tick: the id of the checkpoint that triggers."""
    before = len(triggers(h))
    h.clock.advance(1.5)
    h.jm.tick()
    (checkpoint_id,) = triggers(h)[before:]
    return checkpoint_id


def ack(h: Harness, job: JobMaster, checkpoint_id: int) -> None:
    for vertex, subtask in list(job.tasks):
        h.jm.acknowledge_checkpoint(
            CheckpointAck(job.job_id, vertex, subtask, job.attempt, checkpoint_id, (), b"{}", TaskAckMetrics())
        )


def completed(job: JobMaster) -> list[int]:
    return [c.checkpoint_id for c in job.coordinator.store.all()]


def test_a_cancel_while_a_checkpoint_is_being_persisted_resolves_the_sinks_as_of_that_checkpoint(
    harness: Harness,
) -> None:
    """The end used to read the latest completed checkpoint at once: the one before. The persisting one
    then completed, the job's latest, although its sinks' pre-committed transactions had been rolled
    back (PostgreSQL rows of a completed checkpoint lost on restore)."""
    job = running(harness)
    first = periodic(harness)
    ack(harness, job, first)
    second = periodic(harness)
    harness.io.hold("_persist")  # the metadata PUT of the second one takes a while (S3)
    ack(harness, job, second)
    harness.jm.cancel(job.job_id)
    assert harness.resolver.as_of == [], "the end was resolved while a checkpoint was being persisted"
    harness.io.release()
    assert completed(job)[-1] == second
    assert harness.resolver.as_of == [second]
    assert job.status is JobStatus.CANCELED


def test_the_restart_strategy_giving_up_while_a_checkpoint_is_persisted_waits_for_it_too(harness: Harness) -> None:
    job = running(harness, {"checkpointing.interval": "1s", "restart.strategy": "none"})
    checkpoint = periodic(harness)
    harness.io.hold("_persist")
    ack(harness, job, checkpoint)
    harness.fail(job)
    assert job.status is JobStatus.FAILED and harness.resolver.as_of == []
    harness.io.release()
    assert harness.resolver.as_of == [checkpoint]


def test_a_failed_persist_under_a_cancel_resolves_as_of_the_checkpoint_before(harness: Harness) -> None:
    job = running(harness)
    first = periodic(harness)
    ack(harness, job, first)
    second = periodic(harness)
    harness.io.hold("_persist")
    ack(harness, job, second)
    harness.jm.cancel(job.job_id)
    put = harness.storage.put_bytes

    def refuse_metadata(key: str, data: bytes) -> None:
        if key.endswith("/_metadata"):
            raise ServiceUnavailableError(f"upload of {key} failed: the storage is down")
        put(key, data)

    harness.storage.put_bytes = refuse_metadata  # type: ignore[method-assign]
    harness.io.release()
    assert completed(job) == [first] and harness.resolver.as_of == [first]


def test_nothing_is_triggered_after_a_stop_s_savepoint(harness: Harness) -> None:
    """A periodic checkpoint could be triggered and complete between the stop's savepoint and the end
    (the end waited for the savepoint's completion notices): the sinks committed past the savepoint,
    and its restore wrote that output again."""
    job = running(harness)
    harness.clock.advance(0.5)
    savepoint = harness.jm.trigger_savepoint(job.job_id, "", stop=True, drain=False)
    harness.clock.advance(2.0)  # the periodic checkpoint is overdue
    harness.jm.tick()
    assert triggers(harness) == [savepoint], "a checkpoint was triggered while the stop's savepoint was in flight"
    harness.io.hold("send")  # the completion notices take a while (a slow TaskManager)
    ack(harness, job, savepoint)
    for _ in range(3):
        harness.clock.advance(1.5)
        harness.jm.tick()
    assert triggers(harness) == [savepoint], "a checkpoint was triggered after the stop's savepoint"
    harness.io.release()
    assert harness.resolver.as_of == [savepoint]
    assert job.status is JobStatus.FINISHED and completed(job)[-1] == savepoint


def test_a_stop_whose_resolution_fails_stays_to_be_resolved_by_whoever_runs_the_job(
    make_harness: MakeHarness,
) -> None:
    """It ended FINISHED with its transactions unresolved and was never resolved again: a JobManager
    never takes a FINISHED job over, so prepared transactions held their row locks for ever."""
    first = make_harness()
    job = running(first)
    first.resolver.error = ServiceUnavailableError("postgres is down")
    savepoint = first.jm.trigger_savepoint(job.job_id, "", stop=True, drain=False)
    first.jm.stop()  # the JobManager is being shut down meanwhile (or the retries run out)
    ack(first, job, savepoint)
    first.jm.records.flush()
    record = first.jm.records.load(first.jm.paths.job_record(job.coordinator.job_id))
    assert needs_takeover(record), f"{record.status.value} job with its end unresolved is left alone"
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    assert second.resolver.as_of == [savepoint]
    assert second.jm.jobs[job.job_id].status is JobStatus.FINISHED


def test_a_drained_stop_whose_savepoint_fails_restarts_the_job_from_its_latest_checkpoint(harness: Harness) -> None:
    """With --drain the sources emitted the end of event time (every window fired) and stopped reading;
    when the savepoint then failed the job stayed RUNNING, reading nothing, for ever."""
    job = running(harness)
    checkpoint = periodic(harness)
    ack(harness, job, checkpoint)
    savepoint = harness.jm.trigger_savepoint(job.job_id, "", stop=True, drain=True)
    harness.jm.decline_checkpoint(CheckpointDecline(job.job_id, "gen", 0, job.attempt, savepoint, "disk full"))
    assert job.status is JobStatus.RESTARTING
    assert (TM_A, job.job_id, 1, False) in harness.gateway.named("cancel")
    harness.jm.tick()
    assert job.status is JobStatus.RUNNING and job.attempt == 2 and job.restore_checkpoint_id == checkpoint
    assert {attempt for *_, attempt in harness.gateway.named("deploy")} == {2}
    assert job.restarts == 0, "a failed stop is no failure of the job's own"


def test_a_stop_without_drain_whose_savepoint_fails_leaves_the_job_running_and_checkpointing(
    harness: Harness,
) -> None:
    job = running(harness)
    savepoint = harness.jm.trigger_savepoint(job.job_id, "", stop=True, drain=False)
    harness.jm.decline_checkpoint(CheckpointDecline(job.job_id, "gen", 0, job.attempt, savepoint, "disk full"))
    assert job.status is JobStatus.RUNNING and job.attempt == 1
    after = periodic(harness)
    assert after > savepoint, "periodic checkpoints resume"
    again = harness.jm.trigger_savepoint(job.job_id, "", stop=True, drain=False)
    assert again > after, "the job can be stopped again"


def test_once_the_final_checkpoint_completed_nothing_more_is_triggered(harness: Harness) -> None:
    job = running(harness)
    report(harness, job, TaskState.RUNNING, input_ended=True)
    (final,) = triggers(harness)
    assert harness.gateway.named("trigger")[-1][4:] == (CheckpointKind.CHECKPOINT, True)
    ack(harness, job, final)
    for _ in range(3):
        harness.clock.advance(1.5)
        harness.jm.tick()
    assert triggers(harness) == [final]
    report(harness, job, TaskState.FINISHED)
    assert job.status is JobStatus.FINISHED and harness.resolver.as_of == []  # nothing to resolve


def test_a_jobmanager_taking_over_after_a_stop_s_savepoint_was_written_ends_the_job_at_it(
    make_harness: MakeHarness,
) -> None:
    """The JobManager died between writing the stop's savepoint and ending the job: the one taking over
    restarted it from that savepoint, which --drain had taken after every window fired early."""
    first = make_harness()
    job = running(first)
    savepoint = first.jm.trigger_savepoint(job.job_id, "", stop=True, drain=True)
    first.io.hold("_persist")
    ack(first, job, savepoint)
    ((_job, completed),) = first.io.held
    first.storage.put_bytes(completed.metadata_key, encode_metadata(completed))  # then the JobManager dies
    first.jm.records.flush()
    second = make_harness(first.storage)
    assert second.jm.recover_jobs() == 1
    recovered = second.jm.jobs[job.job_id]
    assert recovered.status is JobStatus.FINISHED, f"{recovered.status.value} after taking the stop over"
    assert second.resolver.as_of == [savepoint]


def test_a_stop_s_savepoint_is_announced_to_the_tasks_as_they_run_before_the_end_fences_them(
    harness: Harness,
) -> None:
    """The end's resolution takes an attempt above the tasks' at once; the savepoint's completion
    notice must still go to the tasks' attempt, or its sources never commit their positions to the
    consumer group (found by the three-generation restore test)."""
    job = running(harness)
    savepoint = harness.jm.trigger_savepoint(job.job_id, "", stop=True, drain=False)
    ack(harness, job, savepoint)
    assert job.attempt == 2, "the resolution ran as a newer attempt"
    assert harness.gateway.named("complete") == [(TM_A, job.job_id, 1, savepoint)]
