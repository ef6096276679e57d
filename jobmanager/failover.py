"""Failures and cancels reach the job's lifecycle: a lost TaskManager or a failed task fails the
job over (its lifecycle asks the restart strategy: restart, or fail it for good), ``weir cancel``
ends it; the executor carries out what the lifecycle decides (``weir.jobmanager.job_actions``).

``fail_over`` and ``taskmanager_lost`` are called with the JobManager's lock held; ``cancel`` takes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from weir.core.errors import UnknownJobError
from weir.core.failures import Failure
from weir.core.ids import TaskId
from weir.core.states import JobStatus
from weir.jobmanager.exception_history import ExceptionEntry
from weir.jobmanager.job_actions import JobActionExecutor
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.registry import RegisteredTaskManager, TaskManagerRegistry


class Failover:
    def __init__(
        self,
        jobs: Mapping[str, JobMaster],
        registry: TaskManagerRegistry,
        executor: JobActionExecutor,
        lock: threading.RLock,
        clock: Callable[[], float],
    ) -> None:
        self._jobs = jobs
        self._registry = registry
        self._executor = executor
        self._lock = lock
        self._clock = clock

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

    def fail_over(
        self,
        job: JobMaster,
        failure: Failure,
        now: float,
        *,
        cause: ExceptionEntry | None = None,
        task: TaskId | None = None,
    ) -> None:
        """The running job failed (``task``'s failure, or a lost TaskManager's): the lifecycle restarts
        it or fails it for good; ``cause`` is what the exception history keeps of the failure."""
        if job.status is not JobStatus.RUNNING:
            return
        job.record_failure(failure, now, cause=cause)
        self._executor.execute(job, job.lifecycle.task_failed(now, task, failure))

    def cancel(self, job_id: str) -> JobStatus:
        """Start cancelling the job (its lifecycle ends it once its sinks are resolved); answers its
        status after the request."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownJobError(job_id)
            self._executor.execute(job, job.lifecycle.cancel(self._clock()))
            return job.status
