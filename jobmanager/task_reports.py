"""What tasks report to the JobManager: their state (which may fail the job over, finish it, start
or stop periodic checkpoints, or trigger the final checkpoint), and checkpoint acknowledgements and
declines (handed to the coordinator, whose actions the executor carries out)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import assert_never

import structlog

from weir.core.failures import Failure
from weir.core.ids import CheckpointId
from weir.core.states import JobStatus, TaskState
from weir.jobmanager import metrics
from weir.jobmanager.checkpointing.pending import TaskStateHandle
from weir.jobmanager.exception_history import ExceptionEntry
from weir.jobmanager.failover import Failover
from weir.jobmanager.job_actions import JobActionExecutor
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.messages import CheckpointAck, CheckpointDecline, TaskStateReport

log = structlog.get_logger("weir.jobmanager")


class TaskReports:
    def __init__(
        self,
        jobs: Mapping[str, JobMaster],
        executor: JobActionExecutor,
        failover: Failover,
        lock: threading.RLock,
        clock: Callable[[], float],
    ) -> None:
        self._jobs = jobs
        self._executor = executor
        self._failover = failover
        self._lock = lock
        self._clock = clock

    def task_state(self, report: TaskStateReport) -> None:
        """A task's report of the current attempt: it failed (or was cancelled while the job runs:
        nobody asked it to stop, so its part of the job is missing and no checkpoint could complete
        again), it runs, its bounded input ended, or it finished; the lifecycle decides what follows."""
        with self._lock:
            job = self._jobs.get(report.job_id)
            if job is None:
                return
            now = self._clock()
            running = job.status is JobStatus.RUNNING
            record = job.record_task_state(
                report.vertex_uid,
                report.subtask,
                report.attempt,
                report.state,
                report.failure,
                report.records_in,
                report.records_out,
            )
            if record is None or not running:
                return  # another attempt's, or the job is not running: its tasks end because they were told to
            task = job.task_id(report.vertex_uid, report.subtask)
            name = f"{report.vertex_uid}#{report.subtask}"
            match report.state:
                case TaskState.FAILED | TaskState.CANCELED:
                    cause_failure = record.failure or Failure.internal(f"task {name} reported {report.state.value}")
                    failed = report.state is TaskState.FAILED
                    failure = Failure(
                        cause_failure.type,
                        f"task {name} failed: {cause_failure.message}"
                        if failed
                        else f"task {name} was cancelled while the job was running",
                        cause_failure.fault,
                        cause_failure.retriable,
                        # the job's failure keeps the task's traceback (its execution result shows it)
                        stacktrace=cause_failure.stacktrace if failed else "",
                    )
                    placed_on = record.taskmanager_id or None
                    cause = ExceptionEntry(
                        cause_failure, now, report.attempt, report.vertex_uid, report.subtask, placed_on
                    )
                    self._failover.fail_over(job, failure, now, cause=cause, task=task)
                case TaskState.RUNNING if report.input_ended:
                    self._executor.execute(job, job.lifecycle.source_ended(now, task))
                case TaskState.RUNNING:
                    if job.all_running():
                        restored = job.restore_checkpoint_id > 0
                        actions = job.lifecycle.tasks_running(now, job.all_task_ids(), restored=restored)
                        self._executor.execute(job, actions)
                case TaskState.FINISHED:
                    actions = job.lifecycle.task_finished(now, task, all_finished=job.all_finished())
                    self._executor.execute(job, actions)
                case TaskState.DEPLOYING:
                    pass
                case _:
                    assert_never(report.state)

    def checkpoint_acknowledged(self, ack: CheckpointAck) -> None:
        with self._lock:
            job = self._jobs.get(ack.job_id)
            if job is None or ack.attempt != job.attempt:
                return
            task = job.task_id(ack.vertex_uid, ack.subtask)
            handle = TaskStateHandle(task_id=task, objects=ack.objects, inline_payload=ack.inline_payload)
            outcome = job.lifecycle.receive_ack(
                self._clock(), CheckpointId(ack.checkpoint_id), task, handle, ack.metrics
            )
            metrics.task_acknowledged(job, ack.vertex_uid, ack.metrics.alignment_duration_s, ack.metrics.start_delay_s)
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
                job.lifecycle.receive_decline(self._clock(), CheckpointId(decline.checkpoint_id), task, decline.reason),
            )
