"""The JobManager's per-job gauges, refreshed from a real JobMaster, and the latest checkpoint's
series, set from the coordinator's stats when a checkpoint completes (no gRPC, no cluster)."""

from __future__ import annotations

import textwrap
import uuid

from prometheus_client import REGISTRY

from tests.unit.jobmanager.conftest import Harness, MakeHarness
from weir.api import load_job_source
from weir.core.errors import ServiceUnavailableError
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.core.states import JobStatus
from weir.jobmanager import metrics
from weir.jobmanager.checkpointing.coordinator import (
    CheckpointCoordinator,
    PersistCheckpoint,
    TriggerBarriers,
    default_metadata_key,
)
from weir.jobmanager.checkpointing.pending import TaskAckMetrics, TaskStateHandle
from weir.jobmanager.checkpointing.store import InMemoryCompletedCheckpointStore
from weir.jobmanager.checkpointing.trigger import CheckpointConfig
from weir.jobmanager.jobs import JobMaster, JobSubmission
from weir.jobmanager.lifecycle import RESOLUTION_DEADLINE_S
from weir.jobmanager.messages import CheckpointAck

JOB = textwrap.dedent(
    """
    from weir.api import Environment


    def build(env: Environment) -> None:
        env.from_generator(lambda i: i, uid="gen", count=10).print(uid="out")
    """
).encode()


def master(parameters: dict[str, str]) -> JobMaster:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    loaded = load_job_source(JOB, "numbers.py", parameters, parallelism=1)
    submission = JobSubmission(job_id, "numbers", "numbers.py", JOB, parameters, 1, submitted_at=100.0)
    return JobMaster.create(submission, loaded, default_metadata_key)


def gauge(name: str, job_id: str, **labels: str) -> float | None:
    """The sample of ``job_id`` (named "numbers" unless ``job_name`` says otherwise)."""
    return REGISTRY.get_sample_value(name, {"job_id": job_id, "job_name": "numbers", **labels})


def test_job_status_exports_the_checkpoint_interval_status_and_restarts() -> None:
    job = master({"checkpointing.interval": "500ms"})
    metrics.job_status(job)
    assert gauge("weir_checkpoint_interval_seconds", job.job_id) == 0.5
    assert gauge("weir_job_status", job.job_id, status=job.status.value) == 1
    assert gauge("weir_job_restarts", job.job_id) == 0


def test_the_rescale_counters_exist_at_zero_before_the_first_rescale_and_count_one_after() -> None:
    """The dashboard's increase() and an alert over them need the series before any rescale ended."""
    job = master({})
    metrics.job_status(job)
    assert gauge("weir_job_parallelism", job.job_id) == 1
    assert gauge("weir_job_rescales_total", job.job_id, outcome="completed") == 0
    assert gauge("weir_job_rescales_total", job.job_id, outcome="failed") == 0
    metrics.rescale_ended(job, "completed")
    metrics.job_status(job)
    assert gauge("weir_job_rescales_total", job.job_id, outcome="completed") == 1


def test_no_interval_series_when_periodic_checkpoints_are_off() -> None:
    job = master({})
    metrics.job_status(job)
    assert gauge("weir_checkpoint_interval_seconds", job.job_id) is None


def unique_job_id() -> str:
    """Metrics live in the process-wide registry: a job id of its own keeps other tests' values out."""
    return f"job-{uuid.uuid4().hex[:8]}"


def counter(name: str, job_id: str, job_name: str = "numbers") -> float:
    value = REGISTRY.get_sample_value(name, {"job_id": job_id, "job_name": job_name})
    assert value is not None, f"{name} has no series for {job_id}"
    return value


def complete_one(coordinator: CheckpointCoordinator, now: float, acks: dict[TaskId, TaskAckMetrics]) -> CheckpointId:
    """Trigger a checkpoint, let every task acknowledge it with its metrics, persist it."""
    trigger = coordinator.trigger_now(now)
    assert trigger is not None
    persist: list[PersistCheckpoint] = []
    for task, ack in acks.items():
        outcome = coordinator.receive_ack(now + 1.0, trigger.checkpoint_id, task, TaskStateHandle(task), ack)
        persist += [a for a in outcome.actions if isinstance(a, PersistCheckpoint)]
    (action,) = persist
    coordinator.checkpoint_persisted(now + 2.0, action.completed.checkpoint_id)
    return action.completed.checkpoint_id


def test_a_completed_checkpoint_exports_unaligned_inflight_bytes_and_per_task_alignment_and_start_delay() -> None:
    job_id = JobId(unique_job_id())
    source = TaskId(job_id, OperatorUid("source"), SubtaskIndex(0))
    window = TaskId(job_id, OperatorUid("window"), SubtaskIndex(1))
    coordinator = CheckpointCoordinator(job_id, CheckpointConfig(interval_s=None), InMemoryCompletedCheckpointStore(3))
    coordinator.start(100.0, (source, window), (source,))
    acks = {
        source: TaskAckMetrics(alignment_duration_s=0.0, start_delay_s=0.125),
        window: TaskAckMetrics(alignment_duration_s=0.75, start_delay_s=0.5, unaligned=True, inflight_bytes=1792),
    }
    checkpoint_id = complete_one(coordinator, 100.0, acks)
    summary = coordinator.latest_completed
    assert summary is not None and summary.checkpoint_id == checkpoint_id

    metrics.checkpoint_completed(metrics.JobLabels(job_id, "numbers"), summary)

    assert gauge("weir_last_completed_checkpoint_id", job_id) == checkpoint_id
    assert gauge("weir_last_checkpoint_unaligned", job_id) == 1
    assert gauge("weir_last_checkpoint_inflight_bytes", job_id) == 1792
    assert counter("weir_checkpoints_unaligned_total", job_id) == 1
    per_task = {
        (uid, sub): (
            gauge("weir_last_checkpoint_alignment_seconds", job_id, operator_uid=uid, subtask=sub),
            gauge("weir_last_checkpoint_start_delay_seconds", job_id, operator_uid=uid, subtask=sub),
            gauge("weir_last_checkpoint_task_inflight_bytes", job_id, operator_uid=uid, subtask=sub),
        )
        for uid, sub in (("source", "0"), ("window", "1"))
    }
    assert per_task == {("source", "0"): (0.0, 0.125, 0.0), ("window", "1"): (0.75, 0.5, 1792.0)}


def test_an_aligned_checkpoint_resets_the_latest_series_and_does_not_count_as_unaligned() -> None:
    job_id = JobId(unique_job_id())
    source = TaskId(job_id, OperatorUid("source"), SubtaskIndex(0))
    coordinator = CheckpointCoordinator(job_id, CheckpointConfig(interval_s=None), InMemoryCompletedCheckpointStore(3))
    coordinator.start(100.0, (source,), (source,))
    for now, ack in (
        (100.0, TaskAckMetrics(alignment_duration_s=0.5, unaligned=True, inflight_bytes=64)),
        (110.0, TaskAckMetrics(alignment_duration_s=0.25, start_delay_s=0.0625)),
    ):
        complete_one(coordinator, now, {source: ack})
        summary = coordinator.latest_completed
        assert summary is not None
        metrics.checkpoint_completed(metrics.JobLabels(job_id, "numbers"), summary)

    assert gauge("weir_last_checkpoint_unaligned", job_id) == 0
    assert gauge("weir_last_checkpoint_inflight_bytes", job_id) == 0
    assert counter("weir_checkpoints_unaligned_total", job_id) == 1
    assert counter("weir_checkpoints_completed_total", job_id) == 2
    labels = {"operator_uid": "source", "subtask": "0"}
    assert gauge("weir_last_checkpoint_alignment_seconds", job_id, **labels) == 0.25
    assert gauge("weir_last_checkpoint_start_delay_seconds", job_id, **labels) == 0.0625


def test_the_unaligned_counter_is_zero_not_absent_after_aligned_checkpoints_only() -> None:
    job_id = JobId(unique_job_id())
    source = TaskId(job_id, OperatorUid("source"), SubtaskIndex(0))
    coordinator = CheckpointCoordinator(job_id, CheckpointConfig(interval_s=None), InMemoryCompletedCheckpointStore(3))
    coordinator.start(100.0, (source,), (source,))
    complete_one(coordinator, 100.0, {source: TaskAckMetrics()})
    summary = coordinator.latest_completed
    assert summary is not None
    metrics.checkpoint_completed(metrics.JobLabels(job_id, "numbers"), summary)
    assert counter("weir_checkpoints_unaligned_total", job_id) == 0
    assert gauge("weir_last_checkpoint_unaligned", job_id) == 0


def test_the_jobmanager_sets_the_series_from_the_acks_when_a_checkpoint_completes(harness: Harness) -> None:
    """Through the JobManager: a task's ack says unaligned, with bytes and timings; once the metadata
    is written the series show them."""
    job = harness.job({"checkpointing.interval": "1s"}, job_id=unique_job_id())
    with harness.jm.lock:
        harness.jm.executor.execute(
            job, job.lifecycle.tasks_running(harness.clock(), job.all_task_ids(), restored=False)
        )
        harness.clock.advance(1.5)
        actions = job.lifecycle.tick(harness.clock())
        (trigger,) = [a for a in actions if isinstance(a, TriggerBarriers)]
        harness.jm.executor.execute(job, actions)
    (task,) = job.all_task_ids()
    ack_metrics = TaskAckMetrics(alignment_duration_s=0.375, start_delay_s=0.25, unaligned=True, inflight_bytes=4096)
    harness.jm.acknowledge_checkpoint(
        CheckpointAck(
            job.job_id, task.operator_uid, task.subtask, job.attempt, trigger.checkpoint_id, (), b"", ack_metrics
        )
    )
    assert gauge("weir_last_completed_checkpoint_id", job.job_id, job_name="j") == trigger.checkpoint_id
    assert gauge("weir_last_checkpoint_unaligned", job.job_id, job_name="j") == 1
    assert gauge("weir_last_checkpoint_inflight_bytes", job.job_id, job_name="j") == 4096
    assert counter("weir_checkpoints_unaligned_total", job.job_id, job_name="j") == 1
    labels = {"operator_uid": str(task.operator_uid), "subtask": str(task.subtask)}
    assert gauge("weir_last_checkpoint_alignment_seconds", job.job_id, job_name="j", **labels) == 0.375
    assert gauge("weir_last_checkpoint_start_delay_seconds", job.job_id, job_name="j", **labels) == 0.25
    assert gauge("weir_last_checkpoint_task_inflight_bytes", job.job_id, job_name="j", **labels) == 4096


def job_series(job_id: str) -> dict[str, dict[str, str]]:
    """Every sample the registry exports for ``job_id``, by name with its labels (status by value)."""
    found: dict[str, dict[str, str]] = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.labels.get("job_id") == job_id:
                key = sample.name + (f"{{{sample.labels['status']}}}" if "status" in sample.labels else "")
                found[key] = dict(sample.labels)
    return found


def test_every_series_of_a_job_carries_its_name_beside_its_id(harness: Harness) -> None:
    """A resubmitted job gets a new id: dashboards and alerts select it by name."""
    job = harness.job({"checkpointing.interval": "1s"}, job_id=unique_job_id())
    metrics.job_status(job)
    series = job_series(job.job_id)
    assert "weir_job_status{RUNNING}" in series and "weir_checkpoint_interval_seconds" in series
    assert {name: labels.get("job_name") for name, labels in series.items()} == dict.fromkeys(series, "j")


def test_a_finished_or_canceled_job_leaves_no_series(harness: Harness) -> None:
    finished = harness.job({"checkpointing.interval": "1s"}, job_id=unique_job_id())
    harness.finish(finished)
    harness.jm.tick()
    assert finished.status is JobStatus.FINISHED
    assert job_series(finished.job_id) == {}
    canceled = harness.job({"checkpointing.interval": "1s"}, job_id=unique_job_id())
    harness.jm.cancel(canceled.job_id)
    harness.jm.tick()
    assert canceled.status is JobStatus.CANCELED
    assert job_series(canceled.job_id) == {}


def test_a_failed_job_keeps_only_its_failed_status_for_the_not_running_alert(harness: Harness) -> None:
    job = harness.job({"checkpointing.interval": "1s"}, job_id=unique_job_id())
    metrics.job_status(job)
    harness.fail(job)
    harness.jm.tick()
    assert job.status is JobStatus.FAILED
    assert job_series(job.job_id) == {
        "weir_job_status{FAILED}": {"job_id": job.job_id, "job_name": "j", "status": "FAILED"}
    }
    assert gauge("weir_job_status", job.job_id, job_name="j", status="FAILED") == 1


def test_an_unresolved_end_keeps_its_series_until_it_is_resolved(harness: Harness) -> None:
    job = harness.job({"checkpointing.interval": "1s"}, job_id=unique_job_id())
    harness.resolver.error = ServiceUnavailableError("postgres is down")
    harness.jm.cancel(job.job_id)
    harness.clock.advance(RESOLUTION_DEADLINE_S + 1.0)
    harness.jm.tick()
    assert job.status is JobStatus.CANCELED and job.lifecycle.unresolved_end
    assert gauge("weir_job_end_unresolved", job.job_id, job_name="j") == 1
    harness.resolver.error = None
    harness.clock.advance(60.0)
    harness.jm.tick()
    assert not job.lifecycle.unresolved_end
    assert job_series(job.job_id) == {}


def test_the_taskmanagers_and_their_slots_are_counted(make_harness: MakeHarness) -> None:
    harness = make_harness(taskmanagers=("tm-a", "tm-b"))
    harness.jm.tick()
    assert REGISTRY.get_sample_value("weir_taskmanagers_registered") == 2
    assert REGISTRY.get_sample_value("weir_taskmanager_slots") == 8
    harness.job(job_id=unique_job_id())
    harness.jm.tick()
    assert REGISTRY.get_sample_value("weir_taskmanager_slots_available") == 7
    harness.clock.advance(60.0)  # no heartbeats: both are lost
    harness.jm.tick()
    assert REGISTRY.get_sample_value("weir_taskmanagers_registered") == 0
    assert REGISTRY.get_sample_value("weir_taskmanager_slots") == 0


def test_the_leader_gauge_follows_the_term_at_each_scrape_and_is_1_without_high_availability() -> None:
    """`weir_jobmanager_leader`: 1 while this JobManager may act under a term, 0 while a standby (read
    at each scrape, so a takeover or a lost lease shows at the next one); without high availability the
    JobManager always leads, term 0."""
    term: list[int | None] = [None]
    metrics.leadership(lambda: term[0])

    def scraped() -> tuple[float | None, float | None]:
        return (
            REGISTRY.get_sample_value("weir_jobmanager_leader"),
            REGISTRY.get_sample_value("weir_jobmanager_leader_term"),
        )

    assert scraped() == (0.0, 0.0)
    term[0] = 3
    assert scraped() == (1.0, 3.0)
    term[0] = None  # the lease is lost: a standby again
    assert scraped() == (0.0, 0.0)
    metrics.leadership(None)
    assert scraped() == (1.0, 0.0)
