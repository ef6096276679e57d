"""The TaskManagers the JobManager knows: registration (by incarnation), heartbeats, liveness, slots.

A TaskManager registers under its name with an incarnation, new for every process start. Another
incarnation under a known name means the old process is gone with its tasks (``on_lost`` is called:
its jobs fail over); the same incarnation registering again keeps its tasks. A heartbeat carries the
running tasks' counters and is answered with the attempts that must stop there (older attempts,
ended or unknown jobs). Every method is called with the JobManager's lock held.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import structlog

from weir.core.hardware import Hardware
from weir.core.states import JobStatus
from weir.jobmanager import metrics
from weir.jobmanager.gateway import TaskManagerGateway
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.messages import Heartbeat, HeartbeatAnswer, JobAttempt
from weir.jobmanager.scheduler import SlotOffer

log = structlog.get_logger("weir.jobmanager")

HEARTBEAT_INTERVAL_S: Final = 1.0
HEARTBEAT_TIMEOUT_S: Final = 6.0


@dataclass
class RegisteredTaskManager:
    taskmanager_id: str
    address: str
    slots: int
    metrics_port: int
    last_heartbeat: float
    incarnation: str = ""  # the TaskManager process's own id, new for every start
    alive: bool = True
    hardware: Hardware | None = None  # as it reported it at registration; None: not reported


class TaskManagerRegistry:
    def __init__(
        self,
        jobs: Mapping[str, JobMaster],
        gateway: TaskManagerGateway,
        clock: Callable[[], float],
        on_lost: Callable[[RegisteredTaskManager, str], None],
    ) -> None:
        self.taskmanagers: dict[str, RegisteredTaskManager] = {}
        self._jobs = jobs
        self._gateway = gateway
        self._clock = clock
        self._on_lost = on_lost
        self.wake_monitor: Callable[[], None] = lambda: None  # set by the monitor: new slots for a waiting restart

    def register(
        self,
        tm_id: str,
        address: str,
        slots: int,
        metrics_port: int,
        incarnation: str,
        *,
        hardware: Hardware | None = None,
    ) -> None:
        """A TaskManager (re-)registers. Another process under the same name (a new incarnation, at
        the same address or not) means the old one is gone with its tasks: the jobs it ran fail over.
        The same process registering again (it lost the JobManager for a moment) keeps its tasks."""
        previous = self.taskmanagers.get(tm_id)
        if previous is not None and previous.alive and previous.incarnation != incarnation:
            self._on_lost(previous, "restarted: registered again as a new process")
        if previous is not None and previous.alive and previous.incarnation == incarnation:
            previous.last_heartbeat = self._clock()
            log.info("taskmanager_reregistered", taskmanager_id=tm_id, address=address, incarnation=incarnation)
            return
        self._gateway.connect(address)
        self.taskmanagers[tm_id] = RegisteredTaskManager(
            tm_id, address, slots, metrics_port, self._clock(), incarnation, hardware=hardware
        )
        log.info("taskmanager_registered", taskmanager_id=tm_id, address=address, slots=slots, incarnation=incarnation)
        self.wake_monitor()

    def heartbeat(self, heartbeat: Heartbeat) -> HeartbeatAnswer:
        tm = self.taskmanagers.get(heartbeat.taskmanager_id)
        if tm is None or not tm.alive:
            return HeartbeatAnswer(reregister=True)
        tm.last_heartbeat = self._clock()
        cancel: set[tuple[str, int]] = set()
        for progress in heartbeat.running_tasks:
            job = self._jobs.get(progress.job_id)
            if job is None or job.status is not JobStatus.RUNNING or progress.attempt != job.attempt:
                # Only that attempt stops: a lingering task of an older attempt must not take the
                # current attempt's tasks on the same TaskManager down with it.
                cancel.add((progress.job_id, progress.attempt))
                continue
            job.on_progress(progress, tm.last_heartbeat)
        return HeartbeatAnswer(
            reregister=False,
            cancel=tuple(JobAttempt(job_id, attempt) for job_id, attempt in sorted(cancel)),
        )

    def mark_lost(self, tm: RegisteredTaskManager, why: str) -> None:
        tm.alive = False
        metrics.TASKMANAGERS_LOST.inc()
        log.warning("taskmanager_lost", taskmanager_id=tm.taskmanager_id, reason=why)

    def silent(self, now: float) -> list[tuple[RegisteredTaskManager, str]]:
        """The live TaskManagers whose last heartbeat is older than the timeout, with why they are lost."""
        return [
            (tm, f"no heartbeat for {now - tm.last_heartbeat:.1f}s")
            for tm in self.taskmanagers.values()
            if tm.alive and now - tm.last_heartbeat > HEARTBEAT_TIMEOUT_S
        ]

    def alive_at(self, address: str) -> list[RegisteredTaskManager]:
        return [tm for tm in self.taskmanagers.values() if tm.address == address and tm.alive]

    def live(self, taskmanager_id: str) -> RegisteredTaskManager | None:
        tm = self.taskmanagers.get(taskmanager_id)
        return tm if tm is not None and tm.alive else None

    def offers(self) -> list[SlotOffer]:
        used: dict[str, int] = {}
        for job in self._jobs.values():
            for tm_id in set(job.slots):
                used[tm_id] = used.get(tm_id, 0) + job.slots_used_on(tm_id)
        return [
            SlotOffer(tm.taskmanager_id, tm.slots - used.get(tm.taskmanager_id, 0))
            for tm in self.taskmanagers.values()
            if tm.alive
        ]

    def addresses(self) -> dict[str, str]:
        return {tm.taskmanager_id: tm.address for tm in self.taskmanagers.values() if tm.alive}
