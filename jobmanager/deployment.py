"""Placing and deploying an attempt: restore the latest completed checkpoint, place the subtasks on
free slots, write the job record with the new attempt, probe the TaskManagers, then deploy every
task through the gateway, one vertex after the other from the sinks back (consumers first, so that
their input gates exist when producers connect), the subtasks of each vertex at once (Flink's
``DefaultExecutionDeployer`` deploys an attempt's tasks concurrently too). A TaskManager found gone
fails the job over elsewhere.

``schedule`` is called with the JobManager's lock held; ``deploy`` runs on a worker thread.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from typing import Final, assert_never

import structlog

from weir.core.failures import Failure
from weir.core.paths import metadata_folder
from weir.core.states import JobStatus
from weir.jobmanager import metrics
from weir.jobmanager.checkpointing import coordinator as cc
from weir.jobmanager.errors import JobManagerError, TaskManagerCallError
from weir.jobmanager.exception_history import ExceptionEntry
from weir.jobmanager.failover import Failover
from weir.jobmanager.gateway import TaskManagerGateway
from weir.jobmanager.job_actions import JobActionExecutor
from weir.jobmanager.jobs import DeployCommand, JobMaster, TaskDeployment
from weir.jobmanager.record_store import JobRecordStore
from weir.jobmanager.registry import TaskManagerRegistry

log = structlog.get_logger("weir.jobmanager")

PROBE_TIMEOUT_S: Final = 1.0
RECORD_RETRY_DELAY_S: Final = 1.0  # an attempt whose record was not written is placed again after this
DEPLOY_CALLS: Final = 8  # deploy calls in flight at once (a vertex's subtasks)


class Deployer:
    def __init__(
        self,
        registry: TaskManagerRegistry,
        gateway: TaskManagerGateway,
        failover: Failover,
        executor: JobActionExecutor,
        records: JobRecordStore,
        io: Executor,
        lock: threading.RLock,
        clock: Callable[[], float],
        storage_uri: str,
        *,
        calls: Executor | None = None,
    ) -> None:
        """``storage_uri``: the cluster's checkpoint storage (a savepoint restored lies in it);
        ``calls``: where the deploy calls of one vertex run at once (default: a pool of its own)."""
        self._storage_uri = storage_uri
        self._calls = calls if calls is not None else ThreadPoolExecutor(DEPLOY_CALLS, thread_name_prefix="jm-deploy")
        self.wake_monitor: Callable[[], None] = lambda: None  # set by the monitor
        self._registry = registry
        self._gateway = gateway
        self._failover = failover
        self._executor = executor
        self._records = records
        self._io = io
        self._lock = lock
        self._clock = clock

    def schedule(self, job: JobMaster, now: float) -> tuple[DeployCommand, Future[bool]]:
        """Restore the latest completed checkpoint (if any) and place a new attempt; answers the
        deployment and the write of the job record that carries its attempt number, which must be
        durable before any task of the attempt is deployed. Raises NotEnoughSlotsError, and
        JobManagerError while a checkpoint is still being persisted."""
        decision = job.lifecycle.restore_decision(now)
        match decision:
            case cc.WaitForPersist(checkpoint_ids=ids):
                raise JobManagerError(f"checkpoints {ids} are still being persisted")
            case cc.RestoreFrom(checkpoint=completed):
                job.restore = {
                    (handle.task_id.operator_uid, handle.task_id.subtask): handle.inline_payload
                    for handle in completed.task_states
                }
                job.inherited = {}
                # A savepoint's keys are relative to its folder (docs/formats.md).
                job.restore_storage_uri = (
                    f"{self._storage_uri.rstrip('/')}/{metadata_folder(completed.metadata_key)}"
                    if completed.is_savepoint
                    else ""
                )
                job.restore_checkpoint_id = completed.checkpoint_id
                job.last_restore_at = now
                metrics.restored(job)
                log.info("job_restoring", job_id=job.job_id, checkpoint_id=completed.checkpoint_id)
            case cc.StartFresh() if job.initial_state is not None:
                # No checkpoint of its own yet: every attempt starts from the other job's checkpoint.
                initial = job.initial_state.checkpoint
                job.restore = {}
                job.inherited = dict(job.initial_state.by_vertex)
                job.restore_storage_uri = job.initial_state.storage_uri
                job.restore_checkpoint_id = initial.checkpoint_id
                log.info(
                    "job_restoring_from_retained_checkpoint",
                    job_id=job.job_id,
                    checkpoint_id=initial.checkpoint_id,
                    from_job_id=initial.job_id,
                    metadata_key=initial.metadata_key,
                )
            case cc.StartFresh():
                pass
            case _:
                assert_never(decision)
        command, actions = job.schedule(self._registry.offers(), self._registry.addresses(), now)
        self._executor.execute(job, actions)  # the new attempt's status; writes the job record first
        return command, self._records.save(job)

    def start(self, job: JobMaster, command: DeployCommand, saved: Future[bool]) -> None:
        """Deploy on a worker thread (call without the lock held or with it: it only submits)."""
        self._io.submit(self.deploy, job, command, saved)

    def deploy(self, job: JobMaster, command: DeployCommand, saved: Future[bool]) -> None:
        if not saved.result():
            # A JobManager taking over must know this attempt number, or it would deploy it again.
            with self._lock:
                if job.attempt == command.attempt and job.status is JobStatus.RUNNING:
                    now = self._clock()
                    why = "the job record with the new attempt could not be written"
                    self._executor.execute(job, job.lifecycle.replace(now, now + RECORD_RETRY_DELAY_S, why))
                    job.tasks_stopped()
            return
        addresses = sorted({a for a, _ in command.requests})
        probes = [self._calls.submit(self._reachable, a) for a in addresses]
        unreachable = [a for a, probe in zip(addresses, probes, strict=True) if not probe.result()]
        if unreachable:
            with self._lock:
                if job.attempt == command.attempt and job.status is JobStatus.RUNNING:
                    now = self._clock()
                    why = f"TaskManager(s) at {', '.join(sorted(unreachable))} unreachable"
                    self._executor.execute(job, job.lifecycle.replace(now, now, why))
                    job.tasks_stopped()
                for address in sorted(unreachable):
                    self._failover.taskmanagers_lost_at(address, "unreachable before deployment")
            self.wake_monitor()  # placed again at once
            return
        for _vertex, wave in itertools.groupby(command.requests, key=lambda request: request[1].vertex_uid):
            if job.attempt != command.attempt or job.status is not JobStatus.RUNNING:
                return
            if not self._deploy_wave(job, list(wave)):
                return

    def _deploy_wave(self, job: JobMaster, wave: Sequence[tuple[str, TaskDeployment]]) -> bool:
        """Deploy one vertex's subtasks at once; answers whether every call succeeded (a failed one
        fails the job over: the rest of the attempt is not deployed)."""
        calls = [(address, d, self._calls.submit(self._gateway.deploy_task, address, d)) for address, d in wave]
        wait([call for _, _, call in calls])
        for address, deployment, call in calls:
            exc = call.exception()
            if exc is None:
                continue
            if not isinstance(exc, TaskManagerCallError):
                raise exc
            with self._lock:
                reason = Failure.internal(
                    f"deploying {deployment.vertex_uid}#{deployment.subtask} to "
                    f"{address} failed: {exc.code}: {exc.details}"
                )
                if exc.unavailable:
                    # The TaskManager is gone (it re-registers when it comes back): schedule the
                    # restart on the others rather than on it again.
                    self._failover.taskmanagers_lost_at(address, "unreachable at deployment")
                now = self._clock()
                task = job.tasks.get((deployment.vertex_uid, deployment.subtask))
                placed_on = task.taskmanager_id if task is not None else ""
                cause = ExceptionEntry(
                    reason, now, deployment.attempt, deployment.vertex_uid, deployment.subtask, placed_on or None
                )
                self._failover.fail_over(job, reason, now, cause=cause)
            return False
        return True

    def _reachable(self, address: str) -> bool:
        """A TaskManager that died within the last heartbeat timeout still looks alive: probe it."""
        return self._gateway.reachable(address, PROBE_TIMEOUT_S)
