"""The JobManager's periodic duties, one ``tick`` at a time: declare silent TaskManagers lost,
restart jobs whose restart delay is over, tick each job's lifecycle (its checkpoints' triggers and
timeouts, the final checkpoint, an end's resolution retried), refresh job records."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Final

import structlog

from weir.core.errors import NotEnoughSlotsError
from weir.core.states import JobStatus
from weir.jobmanager import metrics
from weir.jobmanager.deployment import Deployer
from weir.jobmanager.errors import JobManagerError
from weir.jobmanager.failover import Failover
from weir.jobmanager.job_actions import JobActionExecutor
from weir.jobmanager.jobs import DeployCommand, JobMaster
from weir.jobmanager.record_store import JobRecordStore
from weir.jobmanager.registry import TaskManagerRegistry

log = structlog.get_logger("weir.jobmanager")

TICK_INTERVAL_S: Final = 0.2
RECORD_REFRESH_S: Final = 2.0
RESTART_RETRY_S: Final = 1.0  # a restart that found no slots tries again after this


class Monitor:
    def __init__(
        self,
        jobs: Mapping[str, JobMaster],
        registry: TaskManagerRegistry,
        failover: Failover,
        deployer: Deployer,
        executor: JobActionExecutor,
        records: JobRecordStore,
        lock: threading.RLock,
        clock: Callable[[], float],
    ) -> None:
        self._jobs = jobs
        self._registry = registry
        self._failover = failover
        self._deployer = deployer
        self._executor = executor
        self._records = records
        self._lock = lock
        self._clock = clock

    def run(self, stopping: threading.Event) -> None:
        while not stopping.wait(TICK_INTERVAL_S):
            try:
                self.tick()
            except Exception:  # the monitor must survive any single bad tick
                log.exception("monitor_tick_failed")

    def tick(self) -> None:
        now = self._clock()
        deploys: list[tuple[JobMaster, DeployCommand, Future[bool]]] = []
        with self._lock:
            for tm, why in self._registry.silent(now):
                self._failover.taskmanager_lost(tm, why)
            for job in self._jobs.values():
                if job.lifecycle.restart_due(now):
                    try:
                        deploys.append((job, *self._deployer.schedule(job, now)))
                    except (JobManagerError, NotEnoughSlotsError) as exc:
                        # Wait for slots (a TaskManager may come back) or for a persist to end.
                        self._executor.execute(job, job.lifecycle.restart_later(now + RESTART_RETRY_S))
                        log.warning("restart_waiting", job_id=job.job_id, reason=str(exc))
                else:
                    self._executor.execute(job, job.lifecycle.tick(now))
                if job.status is JobStatus.RUNNING and now - job.record_saved_at > RECORD_REFRESH_S:
                    self._records.save(job)  # keeps the progress counters for a restarted JobManager
                metrics.job_status(job)
            offers = {offer.taskmanager_id: offer.free_slots for offer in self._registry.offers()}
            metrics.taskmanagers(
                (tm.slots, offers.get(tm.taskmanager_id, 0)) for tm in self._registry.taskmanagers.values() if tm.alive
            )
        for job, command, saved in deploys:
            self._deployer.start(job, command, saved)
