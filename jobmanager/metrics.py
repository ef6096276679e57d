"""Prometheus metrics of the JobManager: checkpoints, restarts, job status, TaskManagers and slots
(Flink's names as a guide).

Every per-job series carries the job's name beside its id, as Flink's job scope has both
(``<job_id>`` and ``<job_name>``): a job submitted again gets a new id, and dashboards and alerts
that select it by name keep following it. Flink removes a job's metric group when the job reaches a
globally terminal state; so does :func:`job_status` here, once the job's end is resolved, except the
status of a FAILED job: it stays (``weir_job_status{status="FAILED"} 1``) so that the job-not-running
alert fires for a job nobody ended on purpose, until a job of the same name runs again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from weir.core.checkpointing import CheckpointStatus
from weir.core.states import JobStatus
from weir.jobmanager.checkpointing.coordinator import CheckpointSummary


@dataclass(frozen=True)
class JobLabels:
    """The labels every per-job series starts with."""

    job_id: str
    job_name: str

    @classmethod
    def of(cls, job: Any) -> JobLabels:
        """The labels of a JobMaster (its submission's effective name)."""
        return cls(job.job_id, job.submission.job_name)

    def values(self) -> tuple[str, str]:
        return (self.job_id, self.job_name)


JOB_LABELS = ("job_id", "job_name")

_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0)

CHECKPOINTS_TRIGGERED = Counter("weir_checkpoints_triggered_total", "Checkpoints triggered", JOB_LABELS)
CHECKPOINTS_COMPLETED = Counter("weir_checkpoints_completed_total", "Checkpoints completed", JOB_LABELS)
CHECKPOINTS_FAILED = Counter("weir_checkpoints_failed_total", "Checkpoints aborted or failed", JOB_LABELS)
CHECKPOINTS_IN_PROGRESS = Gauge("weir_checkpoints_in_progress", "Checkpoints triggered but not ended", JOB_LABELS)
CHECKPOINT_DURATION = Histogram(
    "weir_checkpoint_duration_seconds", "Trigger to completion of a checkpoint", JOB_LABELS, buckets=_DURATION_BUCKETS
)
LAST_CHECKPOINT_DURATION = Gauge(
    "weir_last_checkpoint_duration_seconds", "Duration of the latest completed checkpoint", JOB_LABELS
)
LAST_CHECKPOINT_SIZE = Gauge(
    "weir_last_checkpoint_size_bytes", "State size of the latest completed checkpoint", JOB_LABELS
)
LAST_CHECKPOINT_ID = Gauge("weir_last_completed_checkpoint_id", "Id of the latest completed checkpoint", JOB_LABELS)
LAST_CHECKPOINT_TIMESTAMP = Gauge(
    "weir_last_checkpoint_completion_timestamp_seconds", "When the latest checkpoint completed", JOB_LABELS
)
CHECKPOINT_INTERVAL = Gauge(
    "weir_checkpoint_interval_seconds",
    "The job's checkpointing.interval (absent when periodic checkpoints are off)",
    JOB_LABELS,
)
LAST_CHECKPOINT_UNALIGNED = Gauge(
    "weir_last_checkpoint_unaligned",
    "1 if a task persisted in-flight records in the latest completed checkpoint (unaligned), 0 if all aligned",
    JOB_LABELS,
)
LAST_CHECKPOINT_INFLIGHT = Gauge(
    "weir_last_checkpoint_inflight_bytes",
    "In-flight bytes the tasks persisted in the latest completed checkpoint, summed over its tasks",
    JOB_LABELS,
)
CHECKPOINTS_UNALIGNED = Counter(
    "weir_checkpoints_unaligned_total",
    "Completed checkpoints in which some task persisted in-flight records",
    JOB_LABELS,
)
_CHECKPOINT_TASK_LABELS = (*JOB_LABELS, "operator_uid", "subtask")
LAST_TASK_ALIGNMENT = Gauge(
    "weir_last_checkpoint_alignment_seconds",
    "Barrier alignment time of each task in the latest completed checkpoint",
    _CHECKPOINT_TASK_LABELS,
)
LAST_TASK_START_DELAY = Gauge(
    "weir_last_checkpoint_start_delay_seconds",
    "Trigger to first barrier at each task in the latest completed checkpoint",
    _CHECKPOINT_TASK_LABELS,
)
LAST_TASK_INFLIGHT = Gauge(
    "weir_last_checkpoint_task_inflight_bytes",
    "In-flight bytes each task persisted in the latest completed checkpoint (0: the task aligned)",
    _CHECKPOINT_TASK_LABELS,
)
ALIGNMENT = Histogram(
    "weir_checkpoint_alignment_duration_seconds",
    "Barrier alignment time per task",
    (*JOB_LABELS, "operator_uid"),
    buckets=_DURATION_BUCKETS,
)
START_DELAY = Histogram(
    "weir_checkpoint_start_delay_seconds",
    "Trigger to first barrier at a task",
    (*JOB_LABELS, "operator_uid"),
    buckets=_DURATION_BUCKETS,
)
RESTARTS = Gauge("weir_job_restarts", "Restarts of the job since it was submitted", JOB_LABELS)
RESTORES = Counter("weir_job_restores_total", "Restores of the job from a completed checkpoint", JOB_LABELS)
LAST_RESTORE_TIMESTAMP = Gauge("weir_job_last_restore_timestamp_seconds", "When the job was last restored", JOB_LABELS)
LAST_RESTART_TIMESTAMP = Gauge("weir_job_last_restart_timestamp_seconds", "When the job last restarted", JOB_LABELS)
RESCALES = Counter(
    "weir_job_rescales_total",
    "Rescales of the job (weir rescale) that ended, by outcome (completed, failed)",
    (*JOB_LABELS, "outcome"),
)
RESCALE_OUTCOMES = ("completed", "failed")
PARALLELISM = Gauge("weir_job_parallelism", "The job's parallelism (changed by weir rescale)", JOB_LABELS)
JOB_STATUS = Gauge("weir_job_status", "1 for the job's current status, 0 otherwise", (*JOB_LABELS, "status"))
END_UNRESOLVED = Gauge(
    "weir_job_end_unresolved",
    "1 while an ending or ended job's sink transactions are not resolved (retried; see weir status)",
    JOB_LABELS,
)
END_RESOLUTION_ATTEMPTS = Gauge(
    "weir_job_end_resolution_attempts", "End-of-job resolutions of the sinks' transactions tried", JOB_LABELS
)

TASKMANAGERS = Gauge("weir_taskmanagers_registered", "TaskManagers registered and alive (heartbeating)")
TASKMANAGER_SLOTS = Gauge("weir_taskmanager_slots", "Task slots of the live TaskManagers")
TASKMANAGER_SLOTS_AVAILABLE = Gauge(
    "weir_taskmanager_slots_available", "Task slots of the live TaskManagers no job occupies"
)
LEADER = Gauge(
    "weir_jobmanager_leader",
    "1 while this JobManager leads (always, without high availability), 0 while it is a standby",
)
LEADER_TERM = Gauge(
    "weir_jobmanager_leader_term", "The lease term this JobManager leads in (0: a standby, or no high availability)"
)
TASKMANAGERS_LOST = Counter(
    "weir_taskmanagers_lost_total", "TaskManagers declared lost (heartbeat timeout, or a new process under the name)"
)

_STATUSES = tuple(status.value for status in JobStatus)

_JOB_METRICS: tuple[MetricWrapperBase, ...] = (
    CHECKPOINTS_TRIGGERED,
    CHECKPOINTS_COMPLETED,
    CHECKPOINTS_FAILED,
    CHECKPOINTS_IN_PROGRESS,
    CHECKPOINT_DURATION,
    LAST_CHECKPOINT_DURATION,
    LAST_CHECKPOINT_SIZE,
    LAST_CHECKPOINT_ID,
    LAST_CHECKPOINT_TIMESTAMP,
    CHECKPOINT_INTERVAL,
    LAST_CHECKPOINT_UNALIGNED,
    LAST_CHECKPOINT_INFLIGHT,
    CHECKPOINTS_UNALIGNED,
    RESTARTS,
    RESTORES,
    PARALLELISM,
    LAST_RESTORE_TIMESTAMP,
    LAST_RESTART_TIMESTAMP,
    END_UNRESOLVED,
    END_RESOLUTION_ATTEMPTS,
)
_TASK_METRICS: tuple[MetricWrapperBase, ...] = (LAST_TASK_ALIGNMENT, LAST_TASK_START_DELAY, LAST_TASK_INFLIGHT)
_OPERATOR_METRICS: tuple[MetricWrapperBase, ...] = (ALIGNMENT, START_DELAY)


def ended(job: Any) -> bool:
    """The job's series are gone (it ended, its end resolved): a late event of it (a checkpoint aborted
    by the end) must not bring one back."""
    return bool(job.status.terminal and not job.lifecycle.unresolved_end)


def _remove(metrics: Iterable[MetricWrapperBase], *labels: str) -> None:
    for metric in metrics:
        try:
            metric.remove(*labels)
        except KeyError:
            pass


def _remove_job(job: Any, labels: JobLabels) -> None:
    """Drop every series of an ended job (Flink closes the job's metric group); idempotent."""
    key = labels.values()
    _remove(_JOB_METRICS, *key)
    for outcome in RESCALE_OUTCOMES:
        _remove((RESCALES,), *key, outcome)
    keep_failed = job.status is JobStatus.FAILED
    for status in _STATUSES:
        if not (keep_failed and status == JobStatus.FAILED.value):
            _remove((JOB_STATUS,), *key, status)
    for uid, subtask in job.tasks:
        _remove(_TASK_METRICS, *key, uid, str(subtask))
    for vertex_uid in {uid for uid, _subtask in job.tasks}:
        _remove(_OPERATOR_METRICS, *key, vertex_uid)
    if keep_failed:
        JOB_STATUS.labels(*key, JobStatus.FAILED.value).set(1)


def checkpoint_triggered(job: Any) -> None:
    if not ended(job):
        CHECKPOINTS_TRIGGERED.labels(*JobLabels.of(job).values()).inc()


def rescale_ended(job: Any, outcome: str) -> None:
    if not ended(job):
        RESCALES.labels(*JobLabels.of(job).values(), outcome).inc()


def checkpoint_failed(job: Any) -> None:
    if not ended(job):
        CHECKPOINTS_FAILED.labels(*JobLabels.of(job).values()).inc()


def restored(job: Any) -> None:
    if not ended(job):
        RESTORES.labels(*JobLabels.of(job).values()).inc()


def task_acknowledged(job: Any, vertex_uid: str, alignment_s: float, start_delay_s: float) -> None:
    if not ended(job):
        key = JobLabels.of(job).values()
        ALIGNMENT.labels(*key, vertex_uid).observe(alignment_s)
        START_DELAY.labels(*key, vertex_uid).observe(start_delay_s)


def taskmanagers(alive: Iterable[tuple[int, int]]) -> None:
    """Set the cluster's gauges from the live TaskManagers' (slots, slots available)."""
    slots = list(alive)
    TASKMANAGERS.set(len(slots))
    TASKMANAGER_SLOTS.set(sum(total for total, _free in slots))
    TASKMANAGER_SLOTS_AVAILABLE.set(sum(max(0, free) for _total, free in slots))


def checkpoint_completed(labels: JobLabels, summary: CheckpointSummary) -> None:
    """Set the latest-checkpoint series from a completed checkpoint's stats (its tasks' acks)."""
    key = labels.values()
    if summary.status is not CheckpointStatus.COMPLETED or summary.end_timestamp is None:
        raise ValueError(f"checkpoint {summary.checkpoint_id} is {summary.status.value}, not completed")
    now = summary.end_timestamp
    duration = max(0.0, now - summary.trigger_timestamp)
    CHECKPOINTS_COMPLETED.labels(*key).inc()
    CHECKPOINT_DURATION.labels(*key).observe(duration)
    LAST_CHECKPOINT_DURATION.labels(*key).set(duration)
    LAST_CHECKPOINT_SIZE.labels(*key).set(summary.state_size_bytes)
    LAST_CHECKPOINT_ID.labels(*key).set(summary.checkpoint_id)
    LAST_CHECKPOINT_TIMESTAMP.labels(*key).set(now)
    unaligned = any(t.unaligned for t in summary.tasks)
    LAST_CHECKPOINT_UNALIGNED.labels(*key).set(1 if unaligned else 0)
    LAST_CHECKPOINT_INFLIGHT.labels(*key).set(sum(t.inflight_bytes for t in summary.tasks))
    unaligned_total = CHECKPOINTS_UNALIGNED.labels(*key)  # 0 until the first unaligned one, not absent
    if unaligned:
        unaligned_total.inc()
    for task in summary.tasks:
        task_labels = (*key, task.task_id.operator_uid, str(task.task_id.subtask))
        LAST_TASK_ALIGNMENT.labels(*task_labels).set(task.alignment_duration_s)
        LAST_TASK_START_DELAY.labels(*task_labels).set(task.start_delay_s)
        LAST_TASK_INFLIGHT.labels(*task_labels).set(task.inflight_bytes)


def job_status(job: Any) -> None:
    """Refresh the per-job gauges from the JobMaster (called on every monitor tick); remove them
    once the job has ended and its end is resolved."""
    labels = JobLabels.of(job)
    if ended(job):
        _remove_job(job, labels)
        return
    key = labels.values()
    for status in _STATUSES:
        JOB_STATUS.labels(*key, status).set(1 if job.status.value == status else 0)
    RESTARTS.labels(*key).set(job.restarts)
    PARALLELISM.labels(*key).set(job.submission.parallelism)
    for outcome in RESCALE_OUTCOMES:  # each outcome's series exists at 0 before its first rescale (increase() sees it)
        RESCALES.labels(*key, outcome).inc(0)
    stats = job.restart_strategy.stats()
    if stats.last_restart_at is not None:
        LAST_RESTART_TIMESTAMP.labels(*key).set(stats.last_restart_at)
    if job.last_restore_at:
        LAST_RESTORE_TIMESTAMP.labels(*key).set(job.last_restore_at)
    CHECKPOINTS_IN_PROGRESS.labels(*key).set(job.coordinator.in_flight_count)
    END_UNRESOLVED.labels(*key).set(1 if job.lifecycle.unresolved_end else 0)
    resolution = job.lifecycle.resolution
    END_RESOLUTION_ATTEMPTS.labels(*key).set(resolution.attempts if resolution is not None else 0)
    interval_s = job.checkpoint_settings.trigger.interval_s
    if interval_s is not None:
        CHECKPOINT_INTERVAL.labels(*key).set(interval_s)


def leadership(term: Callable[[], int | None] | None) -> None:
    """Export whether this JobManager leads, read at each scrape: ``term`` is the lease term it may act
    under now (None: a standby); without high availability (``term`` None) it always leads, term 0."""
    now: Callable[[], int | None] = term if term is not None else lambda: 0
    LEADER.set_function(lambda: 0 if now() is None else 1)
    LEADER_TERM.set_function(lambda: now() or 0)
