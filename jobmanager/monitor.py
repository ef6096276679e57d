"""The JobManager's periodic duties, one ``tick`` at a time: declare silent TaskManagers lost,
restart jobs whose restart delay is over, tick each job's lifecycle (its checkpoints' triggers and
timeouts, the final checkpoint, an end's resolution retried), refresh job records.

A tick runs every ``TICK_INTERVAL_S``, and sooner when a restart falls due in between or someone
wakes the monitor (``wake``: a failover, an attempt to place again at once, a TaskManager that
registered while a restart waits for slots), so that a restart is placed when it is due rather than
up to a tick later (Flink's scheduler runs a restart as soon as its delay is over)."""

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
from weir.jobmanager.rescale_requests import RescaleRequests

log = structlog.get_logger("weir.jobmanager")

TICK_INTERVAL_S: Final = 0.2
RECORD_REFRESH_S: Final = 2.0
RESTART_RETRY_S: Final = TICK_INTERVAL_S  # a restart that found no slots tries again after this (or on a wake)


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
        *,
        rescales: RescaleRequests | None = None,
    ) -> None:
        """``rescales``: rescales jobs in ``scheduler-mode: reactive`` to the slots (None: none are)."""
        self._rescales = rescales
        self._jobs = jobs
        self._registry = registry
        self._failover = failover
        self._deployer = deployer
        self._executor = executor
        self._records = records
        self._lock = lock
        self._clock = clock
        self._woken = threading.Event()
        self._slots_offered = threading.Event()
        self._waiting: dict[str, str] = {}  # job id -> why its restart waits for slots (logged once per reason)
        failover.wake_monitor = deployer.wake_monitor = self.wake
        registry.wake_monitor = self.slots_offered

    def wake(self) -> None:
        """Tick now (from any thread): a restart may have become due."""
        self._woken.set()

    def slots_offered(self) -> None:
        """A TaskManager registered (from any thread): a restart waiting for slots tries again now."""
        self._slots_offered.set()
        self._woken.set()

    def run(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            self._woken.wait(self.next_tick_in())
            self._woken.clear()
            if stopping.is_set():
                return
            try:
                self.tick()
            except Exception:  # the monitor must survive any single bad tick
                log.exception("monitor_tick_failed")

    def next_tick_in(self) -> float:
        """Seconds until the next tick: the tick interval, or less when a restart falls due sooner."""
        with self._lock:
            now = self._clock()
            due = [job.lifecycle.restart_at for job in self._jobs.values()]
        soonest = min((at for at in due if at is not None), default=now + TICK_INTERVAL_S)
        return min(TICK_INTERVAL_S, max(0.0, soonest - now))

    def tick(self) -> None:
        now = self._clock()
        deploys: list[tuple[JobMaster, DeployCommand, Future[bool]]] = []
        retry_waiting = self._slots_offered.is_set()
        self._slots_offered.clear()
        with self._lock:
            for tm, why in self._registry.silent(now):
                self._failover.taskmanager_lost(tm, why)
            for job in self._jobs.values():
                if job.lifecycle.restart_at is None:
                    self._waiting.pop(job.job_id, None)
                waiting = retry_waiting and job.job_id in self._waiting and job.lifecycle.restart_at is not None
                if job.lifecycle.restart_due(now) or waiting:
                    try:
                        deploys.append((job, *self._deployer.schedule(job, now)))
                        self._waiting.pop(job.job_id, None)
                    except (JobManagerError, NotEnoughSlotsError) as exc:
                        if (
                            isinstance(exc, NotEnoughSlotsError)
                            and self._rescales is not None
                            and self._rescales.shrink_to_slots(job, now)
                        ):
                            continue  # reactive: placed at what is left on the next tick
                        # Wait for slots (a TaskManager may come back) or for a persist to end.
                        self._executor.execute(job, job.lifecycle.restart_later(now + RESTART_RETRY_S))
                        if self._waiting.get(job.job_id) != str(exc):
                            self._waiting[job.job_id] = str(exc)
                            log.warning("restart_waiting", job_id=job.job_id, reason=str(exc))
                else:
                    self._executor.execute(job, job.lifecycle.tick(now))
                    if self._rescales is not None:
                        self._rescales.react(job)
                if job.status is JobStatus.RUNNING and now - job.record_saved_at > RECORD_REFRESH_S:
                    self._records.save(job)  # keeps the progress counters for a restarted JobManager
                metrics.job_status(job)
            offers = {offer.taskmanager_id: offer.free_slots for offer in self._registry.offers()}
            metrics.taskmanagers(
                (tm.slots, offers.get(tm.taskmanager_id, 0)) for tm in self._registry.taskmanagers.values() if tm.alive
            )
        for job, command, saved in deploys:
            self._deployer.start(job, command, saved)
