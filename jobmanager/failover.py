"""Failing a job over, and ending it: a lost TaskManager or a failed task restarts the job (or fails
it for good), ``weir cancel`` cancels it; an ended job's tasks are stopped and its sinks'
transactions resolved (``jobmanager.ending``) before it is CANCELED.

``fail_over``, ``taskmanager_lost`` and ``cancel`` are called with the JobManager's lock held (or
take it); ``end_job`` and ``cancel_tasks`` run on a worker thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Final

import structlog

from jobmanager import metrics
from jobmanager.checkpoint_actions import CheckpointActionExecutor
from jobmanager.checkpointing.store import CompletedCheckpoint
from jobmanager.ending import ResolutionReport, resolve_sink_transactions
from jobmanager.errors import TaskManagerCallError
from jobmanager.exception_history import ExceptionEntry
from jobmanager.gateway import TaskManagerGateway
from jobmanager.jobs import JobMaster
from jobmanager.record_store import JobRecordStore
from jobmanager.registry import RegisteredTaskManager, TaskManagerRegistry
from weir.core.errors import UnknownJobError, WeirError
from weir.core.failures import Failure
from weir.core.states import JobStatus

log = structlog.get_logger("weir.jobmanager")

RESOLUTION_DEADLINE_S: Final = 300.0  # how long an ended job's transaction resolution is retried
RESOLUTION_FIRST_DELAY_S: Final = 1.0
RESOLUTION_MAX_DELAY_S: Final = 30.0

ResolveTransactions = Callable[[JobMaster, int, CompletedCheckpoint | None], ResolutionReport]


def resolve_job_transactions(job: JobMaster, attempt: int, latest: CompletedCheckpoint | None) -> ResolutionReport:
    return resolve_sink_transactions(job.loaded.graph, job.plan, job.submission, attempt, latest)


class Failover:
    def __init__(
        self,
        jobs: Mapping[str, JobMaster],
        registry: TaskManagerRegistry,
        gateway: TaskManagerGateway,
        executor: CheckpointActionExecutor,
        records: JobRecordStore,
        io: Executor,
        lock: threading.RLock,
        stopping: threading.Event,
        clock: Callable[[], float],
        *,
        resolve: ResolveTransactions = resolve_job_transactions,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._jobs = jobs
        self._registry = registry
        self._gateway = gateway
        self._executor = executor
        self._records = records
        self._io = io
        self._lock = lock
        self._stopping = stopping
        self._clock = clock
        self._resolve = resolve
        self._monotonic = monotonic

    def taskmanager_lost(self, tm: RegisteredTaskManager, why: str) -> None:
        """Declare the TaskManager lost; every running job with a task on it fails over."""
        self._registry.mark_lost(tm, why)
        now = self._clock()
        for job in self._jobs.values():
            if job.status is JobStatus.RUNNING and tm.taskmanager_id in job.taskmanagers_in_use():
                failure = Failure.internal(f"TaskManager {tm.taskmanager_id} lost ({why})")
                cause = ExceptionEntry(failure, now, job.attempt, taskmanager_id=tm.taskmanager_id)
                self.fail_over(job, failure, now, cause=cause)

    def taskmanagers_lost_at(self, address: str, why: str) -> None:
        for tm in self._registry.alive_at(address):
            self.taskmanager_lost(tm, why)

    def fail_over(self, job: JobMaster, failure: Failure, now: float, *, cause: ExceptionEntry | None = None) -> None:
        """Restart the job or fail it for good; ``cause`` is what the exception history keeps of the
        failure (the failed task's own failure, the lost TaskManager), else ``failure`` alone. The
        record is saved at once, so a JobManager that takes over keeps the history too."""
        if job.status is not JobStatus.RUNNING:
            return
        attempt = job.attempt
        sources = job.source_task_ids()
        self._executor.execute(job, job.coordinator.task_failed(now, sources[0], failure.message))
        job.fail_over(failure, now, cause=cause)
        metrics.job_status(job)
        self._records.save(job)
        if job.status.terminal:  # FAILED: the restart strategy gave up
            self._io.submit(self.end_job, job, attempt)
        else:
            self._io.submit(self.cancel_tasks, job, attempt)

    def cancel(self, job_id: str) -> JobStatus:
        """Start cancelling the job (``end_job`` finishes it); answers its status after the request."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownJobError(job_id)
            self._executor.execute(job, job.coordinator.stop(self._clock(), "job cancelled"))
            started = job.cancel(self._clock())
            attempt = job.attempt
            status = job.status
            if started:
                self._records.save(job)
                metrics.job_status(job)
        if started:
            self._io.submit(self.end_job, job, attempt)
        return status

    def cancel_tasks(self, job: JobMaster, attempt: int, *, job_ended: bool = False) -> None:
        with self._lock:
            targets = [
                tm
                for tm in self._registry.taskmanagers.values()
                if tm.alive and (job_ended or tm.taskmanager_id in job.slots)
            ]
        for tm in targets:
            try:
                self._gateway.cancel_job_tasks(tm.address, job.job_id, attempt, job_ended=job_ended)
            except TaskManagerCallError as exc:
                log.warning("cancel_failed", job_id=job.job_id, taskmanager_id=tm.taskmanager_id, code=exc.code)

    def end_job(self, job: JobMaster, attempt: int) -> None:
        """A job that is cancelled, or FAILED for good: stop its tasks, then resolve its sinks'
        transactions from the latest completed checkpoint (commit what it covers, roll back or abort
        the rest), then record that; a cancelled job becomes CANCELED only then."""
        self.cancel_tasks(job, attempt, job_ended=True)
        deadline = self._monotonic() + RESOLUTION_DEADLINE_S
        delay = RESOLUTION_FIRST_DELAY_S
        while True:
            with self._lock:
                resolution_attempt = job.next_attempt_for_resolution()
                latest = job.coordinator.store.latest()
                saved = self._records.save(job)  # the resolution's attempt fences every earlier one
            if not saved.result():
                error = "the job record with the resolution's attempt could not be written"
            else:
                try:
                    report = self._resolve(job, resolution_attempt, latest)
                except WeirError as exc:
                    error = str(exc)
                else:
                    log.info(
                        "job_transactions_resolved",
                        job_id=job.job_id,
                        attempt=resolution_attempt,
                        checkpoint_id=latest.checkpoint_id if latest is not None else None,
                        sink_subtasks=report.sink_subtasks,
                    )
                    break
            if self._monotonic() + delay > deadline or self._stopping.is_set():
                log.error("job_transactions_not_resolved", job_id=job.job_id, error=error)
                with self._lock:
                    job.resolution_error = error
                    job.cancelled(self._clock())
                    self._records.save(job)
                    metrics.job_status(job)
                return
            log.warning("job_transactions_resolution_retrying", job_id=job.job_id, error=error, delay_s=delay)
            self._stopping.wait(delay)
            delay = min(delay * 2, RESOLUTION_MAX_DELAY_S)
        with self._lock:
            job.transactions_resolved = True
            job.cancelled(self._clock())
            self._records.save(job)
            metrics.job_status(job)
