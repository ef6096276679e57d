"""Placing and deploying an attempt: restore the latest completed checkpoint, place the subtasks on
free slots, write the job record with the new attempt, probe the TaskManagers, then deploy every
task through the gateway, one vertex after the other from the sinks back (consumers first, so that
their input gates exist when producers connect), the subtasks of each vertex at once (Flink's
``DefaultExecutionDeployer`` deploys an attempt's tasks concurrently too). A TaskManager found gone
fails the job over elsewhere.

A checkpoint taken at another parallelism than the job's now (a rescale's, ``weir.jobmanager.rescaling``,
or the latest before it while the job has none at the new one) is restored as a new job restores
another job's: its task states are redistributed (``weir.jobmanager.restoring.plan_initial_state``:
key groups, the Kafka source's partitions, the operators' own state), and before any task is deployed
the checkpoint's sink subtasks, all of them (also those the new parallelism lacks), have their
transactions resolved as of it, as an attempt reserved between the last one and the new one: the
new attempt's sinks inherit no transaction, and nothing of the old subtasks stays open or prepared.

``schedule`` is called with the JobManager's lock held; ``deploy`` runs on a worker thread.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Final, assert_never

import structlog

from weir.connectors.object_storage import CheckpointStorage, open_storage
from weir.core.errors import WeirError
from weir.core.failures import Failure
from weir.core.paths import metadata_folder
from weir.core.states import JobStatus
from weir.graph import LogicalGraph
from weir.jobmanager import metrics
from weir.jobmanager.checkpointing import coordinator as cc
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.errors import JobManagerError, TaskManagerCallError
from weir.jobmanager.exception_history import ExceptionEntry
from weir.jobmanager.failover import Failover
from weir.jobmanager.gateway import TaskManagerGateway
from weir.jobmanager.job_actions import JobActionExecutor
from weir.jobmanager.jobs import DeployCommand, InheritedResolution, JobMaster, TaskDeployment
from weir.jobmanager.record_store import JobRecordStore
from weir.jobmanager.records import JobSubmission
from weir.jobmanager.registry import TaskManagerRegistry
from weir.jobmanager.restoring import InitialState, RetainedState, plan_initial_state
from weir.plan import JobPlan

log = structlog.get_logger("weir.jobmanager")

PROBE_TIMEOUT_S: Final = 1.0
RECORD_RETRY_DELAY_S: Final = 1.0  # an attempt whose record was not written is placed again after this
DEPLOY_CALLS: Final = 8  # deploy calls in flight at once (a vertex's subtasks)

ResolveRedistributed = Callable[[LogicalGraph, InitialState, JobSubmission, int], None]
"""Resolve a checkpoint's sink transactions as of it before a restore at another parallelism
(``weir.jobmanager.submission.resolve_inherited``)."""


def redistribute(
    storage: CheckpointStorage, checkpoint: CompletedCheckpoint, graph: LogicalGraph, plan: JobPlan
) -> InitialState:
    """A job's own checkpoint, taken at another parallelism, assigned to the tasks of ``plan``
    (StateAssignmentError, SerializationError when it cannot be)."""
    if checkpoint.is_savepoint:  # its keys are relative to its folder (docs/formats.md)
        storage = open_storage(f"{storage.uri.rstrip('/')}/{metadata_folder(checkpoint.metadata_key)}")
    return plan_initial_state(RetainedState(storage, checkpoint), graph, plan, allow_non_restored_state=False)


def restores_at_its_parallelism(job: JobMaster, checkpoint: CompletedCheckpoint) -> bool:
    """The checkpoint holds one task state for each of the job's tasks now (else it was taken at
    another parallelism: a rescale's)."""
    return {(h.task_id.operator_uid, h.task_id.subtask) for h in checkpoint.task_states} == set(job.tasks)


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
        storage: CheckpointStorage | None = None,
        resolve_redistributed: ResolveRedistributed | None = None,
    ) -> None:
        """``storage_uri``: the cluster's checkpoint storage (a savepoint restored lies in it);
        ``calls``: where the deploy calls of one vertex run at once (default: a pool of its own);
        ``storage`` and ``resolve_redistributed``: to restore a checkpoint at another parallelism
        (without them such a restore is refused)."""
        self._storage_uri = storage_uri
        self._storage = storage
        self._resolve_redistributed = resolve_redistributed
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
        resolution: InheritedResolution | None = None
        match decision:
            case cc.WaitForPersist(checkpoint_ids=ids):
                raise JobManagerError(f"checkpoints {ids} are still being persisted")
            case cc.RestoreFrom(checkpoint=completed) if not restores_at_its_parallelism(job, completed):
                redistributed = self._redistributed(job, completed)
                job.restore = {}
                job.inherited = dict(redistributed.by_vertex)
                job.restore_storage_uri = redistributed.storage_uri
                job.restore_checkpoint_id = completed.checkpoint_id
                job.last_restore_at = now
                resolution = InheritedResolution(redistributed, job.lifecycle.reserve_attempt())
                metrics.restored(job)
                log.info(
                    "job_restoring_redistributed",
                    job_id=job.job_id,
                    checkpoint_id=completed.checkpoint_id,
                    old_subtasks=len(completed.task_states),
                    parallelism=job.submission.parallelism,
                    resolution_attempt=resolution.attempt,
                )
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
        if resolution is not None:
            command = replace(command, resolution=resolution)
        self._executor.execute(job, actions)  # the new attempt's status; writes the job record first
        return command, self._records.save(job)

    def _redistributed(self, job: JobMaster, checkpoint: CompletedCheckpoint) -> InitialState:
        """The job's own checkpoint, taken at another parallelism, assigned to its tasks now."""
        if self._storage is None or self._resolve_redistributed is None:
            raise JobManagerError(
                f"job {job.job_id}: checkpoint {checkpoint.checkpoint_id} was taken at another parallelism and "
                "this deployer cannot redistribute it"
            )
        try:
            return redistribute(self._storage, checkpoint, job.loaded.graph, job.plan)
        except WeirError as exc:  # the restart waits (logged), as for a checkpoint still persisting
            raise JobManagerError(
                f"job {job.job_id}: checkpoint {checkpoint.checkpoint_id} cannot be redistributed to parallelism "
                f"{job.submission.parallelism}: {exc}"
            ) from exc

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
        if command.resolution is not None and not self._resolve(job, command):
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

    def _resolve(self, job: JobMaster, command: DeployCommand) -> bool:
        """Resolve the redistributed checkpoint's sink transactions before any task of the attempt
        runs; a failure places the attempt again a little later (nothing of it was deployed)."""
        resolution = command.resolution
        assert resolution is not None and self._resolve_redistributed is not None
        checkpoint_id = resolution.initial.checkpoint.checkpoint_id
        try:
            self._resolve_redistributed(job.loaded.graph, resolution.initial, job.submission, resolution.attempt)
        except WeirError as exc:
            with self._lock:
                log.warning(
                    "redistributed_transactions_not_resolved",
                    job_id=job.job_id,
                    checkpoint_id=checkpoint_id,
                    attempt=resolution.attempt,
                    error=str(exc),
                    action=f"placed again in {RECORD_RETRY_DELAY_S:g}s",
                )
                if job.attempt == command.attempt and job.status is JobStatus.RUNNING:
                    now = self._clock()
                    why = f"the sinks' transactions as of checkpoint {checkpoint_id} could not be resolved: {exc}"
                    self._executor.execute(job, job.lifecycle.replace(now, now + RECORD_RETRY_DELAY_S, why))
                    job.tasks_stopped()
            return False
        return True

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
