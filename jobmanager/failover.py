"""Failures and cancels reach the job's lifecycle: a lost TaskManager or a failed task fails the
job over (its lifecycle asks the restart strategy: restart, or fail it for good), ``weir cancel``
ends it; the executor carries out what the lifecycle decides (``weir.jobmanager.job_actions``).

A failed task is most often the first sign of a lost TaskManager: its data streams from a killed
process break at once, seconds before the heartbeat timeout. So every failover probes the
TaskManagers the failed attempt ran on (a refused connection answers in milliseconds) and declares
the unreachable ones lost before the restart is placed, which then avoids them (Flink's
``JobMaster.disconnectTaskManager`` on a lost connection plays that part).

``fail_over`` and ``taskmanager_lost`` are called with the JobManager's lock held; ``cancel`` takes it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Final

import structlog

from weir.core.errors import UnknownJobError
from weir.core.failures import Failure
from weir.core.ids import TaskId
from weir.core.states import JobStatus
from weir.jobmanager.exception_history import ExceptionEntry
from weir.jobmanager.gateway import TaskManagerGateway
from weir.jobmanager.job_actions import JobActionExecutor
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.registry import RegisteredTaskManager, TaskManagerRegistry

log = structlog.get_logger("weir.jobmanager")

PROBE_TIMEOUT_S: Final = 1.0  # as the deployer's probe


class Failover:
    def __init__(
        self,
        jobs: Mapping[str, JobMaster],
        registry: TaskManagerRegistry,
        executor: JobActionExecutor,
        lock: threading.RLock,
        clock: Callable[[], float],
        *,
        gateway: TaskManagerGateway | None = None,
        io: Executor | None = None,
    ) -> None:
        """``gateway`` and ``io``: probe the failed attempt's TaskManagers on ``io`` (none: no probes)."""
        self._jobs = jobs
        self._registry = registry
        self._executor = executor
        self._lock = lock
        self._clock = clock
        self._gateway = gateway
        self._io = io
        self.wake_monitor: Callable[[], None] = lambda: None  # set by the monitor

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
        hosts = sorted({tm.address for tm_id in job.taskmanagers_in_use() if (tm := self._registry.live(tm_id))})
        job.record_failure(failure, now, cause=cause)
        self._executor.execute(job, job.lifecycle.task_failed(now, task, failure))
        self.wake_monitor()  # the restart may be due before the next tick
        if self._gateway is not None and self._io is not None:
            for address in hosts:
                self._io.submit(self._probe, address, job.job_id)

    def _probe(self, address: str, job_id: str) -> None:
        """Declare the TaskManager at ``address`` lost if it no longer accepts connections."""
        assert self._gateway is not None
        if self._gateway.reachable(address, PROBE_TIMEOUT_S):
            return
        with self._lock:
            lost = self._registry.alive_at(address)
            self.taskmanagers_lost_at(address, f"unreachable after job {job_id} failed")
        if lost:
            self.wake_monitor()

    def cancel(self, job_id: str) -> JobStatus:
        """Start cancelling the job (its lifecycle ends it once its sinks are resolved); answers its
        status after the request."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownJobError(job_id)
            self._executor.execute(job, job.lifecycle.cancel(self._clock()))
            return job.status
