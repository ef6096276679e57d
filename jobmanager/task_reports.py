"""What tasks report to the JobManager: their state (which may fail the job over, finish it, start
or stop periodic checkpoints, or trigger the final checkpoint), and checkpoint acknowledgements and
declines (handed to the coordinator, whose actions the executor carries out)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import structlog

from jobmanager import metrics
from jobmanager.checkpoint_actions import CheckpointActionExecutor
from jobmanager.checkpointing.pending import TaskStateHandle
from jobmanager.exception_history import ExceptionEntry
from jobmanager.failover import Failover
from jobmanager.jobs import JobMaster
from jobmanager.messages import CheckpointAck, CheckpointDecline, TaskStateReport
from jobmanager.record_store import JobRecordStore
from weir.core.ids import CheckpointId
from weir.core.states import TaskState

log = structlog.get_logger("weir.jobmanager")


class TaskReports:
    def __init__(
        self,
        jobs: Mapping[str, JobMaster],
        executor: CheckpointActionExecutor,
        failover: Failover,
        records: JobRecordStore,
        lock: threading.RLock,
        clock: Callable[[], float],
    ) -> None:
        self._jobs = jobs
        self._executor = executor
        self._failover = failover
        self._records = records
        self._lock = lock
        self._clock = clock

    def task_state(self, report: TaskStateReport) -> None:
        with self._lock:
            job = self._jobs.get(report.job_id)
            if job is None:
                return
            now = self._clock()
            before = job.status
            reason = job.on_task_state(
                report.vertex_uid,
                report.subtask,
                report.attempt,
                report.state,
                report.failure,
                report.records_in,
                report.records_out,
                now,
            )
            if reason is not None:
                failed = job.tasks[(report.vertex_uid, report.subtask)]
                cause = ExceptionEntry(
                    failed.failure or reason,
                    now,
                    report.attempt,
                    report.vertex_uid,
                    report.subtask,
                    failed.taskmanager_id or None,
                )
                self._failover.fail_over(job, reason, now, cause=cause)
                return
            if report.attempt != job.attempt:
                return
            coordinator = job.coordinator
            if report.input_ended:
                job.sources_ended.add((report.vertex_uid, report.subtask))
                self._executor.trigger_final_checkpoint(job, now)
                return
            if report.state is TaskState.RUNNING and job.all_running() and not coordinator.is_running:
                restored = job.restore_checkpoint_id > 0
                self._executor.execute(
                    job, coordinator.start(now, job.all_task_ids(), job.source_task_ids(), restored=restored)
                )
            elif report.state is TaskState.FINISHED and coordinator.is_running:
                # A finished task takes no part in later checkpoints: stop periodic checkpoints here.
                task = f"{report.vertex_uid}#{report.subtask}"
                self._executor.execute(job, coordinator.stop(now, f"task {task} finished"))
            if job.status is not before and job.status.terminal:
                self._records.save(job)
                metrics.job_status(job)

    def checkpoint_acknowledged(self, ack: CheckpointAck) -> None:
        with self._lock:
            job = self._jobs.get(ack.job_id)
            if job is None or ack.attempt != job.attempt:
                return
            task = job.task_id(ack.vertex_uid, ack.subtask)
            handle = TaskStateHandle(task_id=task, objects=ack.objects, inline_payload=ack.inline_payload)
            outcome = job.coordinator.receive_ack(
                self._clock(), CheckpointId(ack.checkpoint_id), task, handle, ack.metrics
            )
            metrics.ALIGNMENT.labels(job.job_id, ack.vertex_uid).observe(ack.metrics.alignment_duration_s)
            metrics.START_DELAY.labels(job.job_id, ack.vertex_uid).observe(ack.metrics.start_delay_s)
            self._executor.execute(job, outcome.actions)

    def checkpoint_declined(self, decline: CheckpointDecline) -> None:
        with self._lock:
            job = self._jobs.get(decline.job_id)
            if job is None or decline.attempt != job.attempt:
                return
            task = job.task_id(decline.vertex_uid, decline.subtask)
            log.warning(
                "checkpoint_declined",
                job_id=job.job_id,
                checkpoint_id=decline.checkpoint_id,
                task=str(task),
                reason=decline.reason,
            )
            self._executor.execute(
                job,
                job.coordinator.receive_decline(
                    self._clock(), CheckpointId(decline.checkpoint_id), task, decline.reason
                ),
            )
