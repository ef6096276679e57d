"""Prometheus metrics of the JobManager: checkpoints, restarts and job status (Flink's names as a guide)."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from weir.core.checkpointing import CheckpointStatus
from weir.jobmanager.checkpointing.coordinator import CheckpointSummary

_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0)

CHECKPOINTS_TRIGGERED = Counter("weir_checkpoints_triggered_total", "Checkpoints triggered", ("job_id",))
CHECKPOINTS_COMPLETED = Counter("weir_checkpoints_completed_total", "Checkpoints completed", ("job_id",))
CHECKPOINTS_FAILED = Counter("weir_checkpoints_failed_total", "Checkpoints aborted or failed", ("job_id",))
CHECKPOINTS_IN_PROGRESS = Gauge("weir_checkpoints_in_progress", "Checkpoints triggered but not ended", ("job_id",))
CHECKPOINT_DURATION = Histogram(
    "weir_checkpoint_duration_seconds", "Trigger to completion of a checkpoint", ("job_id",), buckets=_DURATION_BUCKETS
)
LAST_CHECKPOINT_DURATION = Gauge(
    "weir_last_checkpoint_duration_seconds", "Duration of the latest completed checkpoint", ("job_id",)
)
LAST_CHECKPOINT_SIZE = Gauge(
    "weir_last_checkpoint_size_bytes", "State size of the latest completed checkpoint", ("job_id",)
)
LAST_CHECKPOINT_ID = Gauge("weir_last_completed_checkpoint_id", "Id of the latest completed checkpoint", ("job_id",))
LAST_CHECKPOINT_TIMESTAMP = Gauge(
    "weir_last_checkpoint_completion_timestamp_seconds", "When the latest checkpoint completed", ("job_id",)
)
CHECKPOINT_INTERVAL = Gauge(
    "weir_checkpoint_interval_seconds",
    "The job's checkpointing.interval (absent when periodic checkpoints are off)",
    ("job_id",),
)
LAST_CHECKPOINT_UNALIGNED = Gauge(
    "weir_last_checkpoint_unaligned",
    "1 if a task persisted in-flight records in the latest completed checkpoint (unaligned), 0 if all aligned",
    ("job_id",),
)
LAST_CHECKPOINT_INFLIGHT = Gauge(
    "weir_last_checkpoint_inflight_bytes",
    "In-flight bytes the tasks persisted in the latest completed checkpoint, summed over its tasks",
    ("job_id",),
)
CHECKPOINTS_UNALIGNED = Counter(
    "weir_checkpoints_unaligned_total",
    "Completed checkpoints in which some task persisted in-flight records",
    ("job_id",),
)
_CHECKPOINT_TASK_LABELS = ("job_id", "operator_uid", "subtask")
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
    ("job_id", "operator_uid"),
    buckets=_DURATION_BUCKETS,
)
START_DELAY = Histogram(
    "weir_checkpoint_start_delay_seconds",
    "Trigger to first barrier at a task",
    ("job_id", "operator_uid"),
    buckets=_DURATION_BUCKETS,
)
RESTARTS = Gauge("weir_job_restarts", "Restarts of the job since it was submitted", ("job_id",))
RESTORES = Counter("weir_job_restores_total", "Restores of the job from a completed checkpoint", ("job_id",))
LAST_RESTORE_TIMESTAMP = Gauge("weir_job_last_restore_timestamp_seconds", "When the job was last restored", ("job_id",))
LAST_RESTART_TIMESTAMP = Gauge("weir_job_last_restart_timestamp_seconds", "When the job last restarted", ("job_id",))
JOB_STATUS = Gauge("weir_job_status", "1 for the job's current status, 0 otherwise", ("job_id", "status"))
END_UNRESOLVED = Gauge(
    "weir_job_end_unresolved",
    "1 while an ending or ended job's sink transactions are not resolved (retried; see weir status)",
    ("job_id",),
)
END_RESOLUTION_ATTEMPTS = Gauge(
    "weir_job_end_resolution_attempts", "End-of-job resolutions of the sinks' transactions tried", ("job_id",)
)

_STATUSES = ("CREATED", "RUNNING", "RESTARTING", "FINISHED", "FAILED", "CANCELLING", "CANCELED")


def checkpoint_completed(job_id: str, summary: CheckpointSummary) -> None:
    """Set the latest-checkpoint series from a completed checkpoint's stats (its tasks' acks)."""
    if summary.status is not CheckpointStatus.COMPLETED or summary.end_timestamp is None:
        raise ValueError(f"checkpoint {summary.checkpoint_id} is {summary.status.value}, not completed")
    now = summary.end_timestamp
    duration = max(0.0, now - summary.trigger_timestamp)
    CHECKPOINTS_COMPLETED.labels(job_id).inc()
    CHECKPOINT_DURATION.labels(job_id).observe(duration)
    LAST_CHECKPOINT_DURATION.labels(job_id).set(duration)
    LAST_CHECKPOINT_SIZE.labels(job_id).set(summary.state_size_bytes)
    LAST_CHECKPOINT_ID.labels(job_id).set(summary.checkpoint_id)
    LAST_CHECKPOINT_TIMESTAMP.labels(job_id).set(now)
    unaligned = any(t.unaligned for t in summary.tasks)
    LAST_CHECKPOINT_UNALIGNED.labels(job_id).set(1 if unaligned else 0)
    LAST_CHECKPOINT_INFLIGHT.labels(job_id).set(sum(t.inflight_bytes for t in summary.tasks))
    unaligned_total = CHECKPOINTS_UNALIGNED.labels(job_id)  # 0 until the first unaligned one, not absent
    if unaligned:
        unaligned_total.inc()
    for task in summary.tasks:
        labels = (job_id, task.task_id.operator_uid, str(task.task_id.subtask))
        LAST_TASK_ALIGNMENT.labels(*labels).set(task.alignment_duration_s)
        LAST_TASK_START_DELAY.labels(*labels).set(task.start_delay_s)
        LAST_TASK_INFLIGHT.labels(*labels).set(task.inflight_bytes)


def job_status(job: Any) -> None:
    """Refresh the per-job gauges from the JobMaster (called on every monitor tick)."""
    job_id = job.job_id
    for status in _STATUSES:
        JOB_STATUS.labels(job_id, status).set(1 if job.status.value == status else 0)
    RESTARTS.labels(job_id).set(job.restarts)
    stats = job.restart_strategy.stats()
    if stats.last_restart_at is not None:
        LAST_RESTART_TIMESTAMP.labels(job_id).set(stats.last_restart_at)
    if job.last_restore_at:
        LAST_RESTORE_TIMESTAMP.labels(job_id).set(job.last_restore_at)
    CHECKPOINTS_IN_PROGRESS.labels(job_id).set(job.coordinator.in_flight_count)
    END_UNRESOLVED.labels(job_id).set(1 if job.lifecycle.unresolved_end else 0)
    resolution = job.lifecycle.resolution
    END_RESOLUTION_ATTEMPTS.labels(job_id).set(resolution.attempts if resolution is not None else 0)
    interval_s = job.checkpoint_settings.trigger.interval_s
    if interval_s is not None:
        CHECKPOINT_INTERVAL.labels(job_id).set(interval_s)
