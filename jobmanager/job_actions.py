"""Carries out a job's lifecycle and checkpoint actions (``weir.jobmanager.lifecycle``,
``weir.jobmanager.checkpointing.coordinator``).

The lifecycle decides; this executor does the I/O: it reserves checkpoint ids in the job record
before a barrier carries one, asks the source tasks to inject barriers, writes a completed
checkpoint's metadata (last, one PUT), notifies the tasks, deletes subsumed objects, stops a failed
attempt's tasks, resolves an ended job's sink transactions, and writes the job record when its
status changes. ``execute`` is called with the JobManager's lock held; every call to a TaskManager,
to storage or to an external system runs on a worker thread, which takes the lock again to hand the
outcome back to the lifecycle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from dataclasses import replace
from typing import assert_never

import structlog

from weir.connectors.object_storage import CheckpointStorage, copy_folder, open_storage
from weir.core.errors import WeirError
from weir.core.ids import CheckpointId, TaskId
from weir.core.paths import external_path, metadata_folder
from weir.core.states import JobStatus
from weir.jobmanager import lifecycle as lc
from weir.jobmanager import metrics
from weir.jobmanager import rescaling as rs
from weir.jobmanager.checkpointing import coordinator as cc
from weir.jobmanager.checkpointing.metadata import encode_metadata
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.ending import ResolutionReport, release_source_slots, resolve_sink_transactions
from weir.jobmanager.errors import TaskManagerCallError
from weir.jobmanager.gateway import TaskManagerGateway
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.record_store import JobRecordStore
from weir.jobmanager.registry import TaskManagerRegistry

log = structlog.get_logger("weir.jobmanager")

ResolveTransactions = Callable[[JobMaster, int, CompletedCheckpoint | None, JobStatus], ResolutionReport]


def resolve_job_transactions(
    job: JobMaster, attempt: int, latest: CompletedCheckpoint | None, outcome: JobStatus
) -> ResolutionReport:
    """The sinks' transactions resolved, then the sources' replication slots released."""
    report = resolve_sink_transactions(job.loaded.graph, job.plan, job.submission, attempt, latest)
    release_source_slots(job.loaded.graph, job.job_id, outcome)
    return report


class JobActionExecutor:
    def __init__(
        self,
        registry: TaskManagerRegistry,
        gateway: TaskManagerGateway,
        storage: CheckpointStorage,
        records: JobRecordStore,
        io: Executor,
        lock: threading.RLock,
        clock: Callable[[], float],
        *,
        resolve: ResolveTransactions = resolve_job_transactions,
        rescales: rs.RescaleOperations | None = None,
        leader_term: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.rescales = rescales if rescales is not None else rs.RescaleOperations()
        self._leader_term = leader_term  # named in each checkpoint's metadata (0: no high availability)
        self._registry = registry
        self._gateway = gateway
        self._storage = storage
        self._records = records
        self._io = io
        self._lock = lock
        self._clock = clock
        self._resolve = resolve
        self._notified: dict[str, Future[None]] = {}  # job id -> its latest completion notices
        self._saved: dict[str, Future[bool]] = {}  # job id -> its latest record write the lifecycle asked for

    def execute(self, job: JobMaster, actions: Iterable[lc.Action]) -> None:
        """Carry out the lifecycle's decisions in order; I/O runs on worker threads, never under the lock."""
        for action in actions:
            match action:
                case cc.TriggerBarriers():
                    self._trigger_barriers(job, action)
                case cc.PersistCheckpoint(completed=completed):
                    self._io.submit(self._persist, job, completed)
                case cc.NotifyComplete(checkpoint_id=checkpoint_id, tasks=tasks, attempt=attempt):
                    self._notified[job.job_id] = self._notify(job, checkpoint_id, tasks, attempt, complete=True)
                case cc.NotifyAborted(checkpoint_id=checkpoint_id, tasks=tasks, reason=reason, attempt=attempt):
                    metrics.checkpoint_failed(job)
                    log.warning(
                        "checkpoint_aborted", job_id=job.job_id, checkpoint_id=checkpoint_id, reason=reason.message
                    )
                    self._notify(job, checkpoint_id, tasks, attempt, complete=False, reason=reason.message)
                case cc.DeleteObjects():
                    self._io.submit(self._delete, action)
                case lc.CancelTasks(attempt=attempt):
                    job.tasks_stopped()
                    self._io.submit(self.cancel_tasks, job, attempt)
                case lc.ResolveSinks():
                    job.tasks_stopped()
                    saved = self._records.save(job)  # with the resolution's attempt: it fences every earlier one
                    # After the completion notices sent before it: the tasks commit through them first,
                    # as they would have without the end (the resolution commits what they did not).
                    notified = self._notified.pop(job.job_id, None)
                    if notified is None:
                        self._io.submit(self._resolve_end, job, action, saved)
                    else:
                        notified.add_done_callback(self._resolve_after(job, action, saved))
                case lc.StatusChanged(before=before, after=after, reason=reason):
                    log.info(
                        "job_status_changed",
                        job_id=job.job_id,
                        attempt=job.attempt,
                        before=before.value,
                        status=after.value,
                        reason=reason,
                    )
                    metrics.job_status(job)
                    self._saved[job.job_id] = self._records.save(job)
                case lc.SaveRecord():
                    metrics.job_status(job)
                    self._saved[job.job_id] = self._records.save(job)
                case lc.RescaleTriggered() | lc.Rescale() | lc.RescaleDeployed() | lc.RescaleAborted():
                    self._rescale(job, action)
                case _:
                    assert_never(action)

    # Rescales -------------------------------------------------------------------------------------

    def _rescale(self, job: JobMaster, action: lc.RescaleAction) -> None:
        """Keep the rescale operation's books; a completed checkpoint rebuilds the job's plan at the
        new parallelism (before the status change that follows writes the job record)."""
        now = self._clock()
        event: rs.RescaleEvent
        match action:
            case lc.RescaleTriggered(checkpoint_id=checkpoint_id):
                event = rs.CheckpointTriggered(checkpoint_id)
            case lc.Rescale(parallelism=parallelism, checkpoint_id=checkpoint_id):
                before = job.submission.parallelism
                job.rescale(parallelism)
                log.info(
                    "job_rescaling",
                    job_id=job.job_id,
                    checkpoint_id=checkpoint_id,
                    from_parallelism=before,
                    to_parallelism=parallelism,
                )
                event = rs.CheckpointCompleted(checkpoint_id)
            case lc.RescaleDeployed():
                event = rs.Redeployed()
            case lc.RescaleAborted(reason=reason):
                event = rs.RescaleFailed(reason)
            case _:
                assert_never(action)
        op = self.rescales.on(job.job_id, event, now)
        if op is None or not op.phase.finished:
            return
        if op.phase is rs.RescalePhase.COMPLETED:
            metrics.rescale_ended(job, "completed")
            log.info(
                "job_rescaled",
                job_id=job.job_id,
                trigger_id=op.trigger_id,
                checkpoint_id=op.checkpoint_id,
                from_parallelism=op.from_parallelism,
                to_parallelism=op.to_parallelism,
                duration_s=round(now - op.requested_at, 3),
            )
        else:
            metrics.rescale_ended(job, "failed")
            log.warning(
                "job_rescale_failed",
                job_id=job.job_id,
                trigger_id=op.trigger_id,
                to_parallelism=op.to_parallelism,
                reason=op.failure,
            )

    # Checkpoints ----------------------------------------------------------------------------------

    def _trigger_barriers(self, job: JobMaster, action: cc.TriggerBarriers) -> None:
        if action.reserve_ids_through is not None and not self._records.save(job).result():
            # No barrier may carry an id a JobManager taking over could hand out again.
            self.execute(
                job,
                job.lifecycle.id_reservation_failed(
                    self._clock(), action.checkpoint_id, "the job record could not be written"
                ),
            )
            return
        metrics.checkpoint_triggered(job)
        log.info(
            "checkpoint_triggered",
            job_id=job.job_id,
            checkpoint_id=action.checkpoint_id,
            kind=action.kind.value,
            final=action.final,
            drain=action.drain,
            full=action.full,
        )
        self._io.submit(self._trigger, job, job.attempt, action, self._saved.pop(job.job_id, None))

    def _trigger(self, job: JobMaster, attempt: int, action: cc.TriggerBarriers, saved: Future[bool] | None) -> None:
        """Ask the source tasks to inject the barrier, once the record the lifecycle wrote before it
        (a stop's) is durable; a source that does not take it declines the checkpoint."""
        if saved is not None and not saved.result():
            with self._lock:
                if job.attempt == attempt:
                    reason = "the job record could not be written before the barrier"
                    decline = job.lifecycle.receive_decline(
                        self._clock(), action.checkpoint_id, action.source_tasks[0], reason
                    )
                    self.execute(job, decline)
            return
        for task in action.source_tasks:
            with self._lock:
                tm = self._registry.live(job.taskmanager_of(task))
            accepted = False
            if tm is not None:
                try:
                    accepted = self._gateway.trigger_checkpoint(
                        tm.address,
                        task,
                        attempt,
                        action.checkpoint_id,
                        action.timestamp,
                        action.kind,
                        final=action.final,
                        drain=action.drain,
                        aligned=action.aligned,
                        full=action.full,
                    )
                except TaskManagerCallError as exc:
                    log.warning("trigger_failed", job_id=job.job_id, task=str(task), code=exc.code)
            if not accepted:
                with self._lock:
                    if job.attempt == attempt:
                        self.execute(
                            job,
                            job.lifecycle.receive_decline(
                                self._clock(), action.checkpoint_id, task, "source task did not accept the trigger"
                            ),
                        )
                return

    def _persist(self, job: JobMaster, completed: CompletedCheckpoint) -> None:
        """Write the metadata (last, atomically: one PUT), copy a savepoint to where it was asked for,
        then let the lifecycle complete the checkpoint."""
        try:
            stamped = replace(completed, leader_term=self._leader_term() or 0)
            self._storage.put_bytes(completed.metadata_key, encode_metadata(stamped))
            if completed.is_savepoint:
                path = self._place_savepoint(job, completed)
                with self._lock:
                    job.savepoint_paths[completed.checkpoint_id] = path
        except Exception as exc:  # any failure fails this checkpoint, never leaves it persisting for ever
            log.warning(
                "checkpoint_persist_failed",
                job_id=job.job_id,
                checkpoint_id=completed.checkpoint_id,
                error=f"{type(exc).__name__}: {exc}",
            )
            with self._lock:
                self.execute(
                    job, job.lifecycle.checkpoint_persist_failed(self._clock(), completed.checkpoint_id, str(exc))
                )
            return
        with self._lock:
            now = self._clock()
            actions = job.lifecycle.checkpoint_persisted(now, completed.checkpoint_id)
            summary = job.coordinator.latest_completed
            if summary is None or summary.checkpoint_id != completed.checkpoint_id:
                raise AssertionError(f"checkpoint {completed.checkpoint_id} persisted but not the latest completed")
            if not metrics.ended(job):
                metrics.checkpoint_completed(metrics.JobLabels.of(job), summary)
            log.info(
                "checkpoint_completed",
                job_id=job.job_id,
                checkpoint_id=completed.checkpoint_id,
                duration_s=round(now - completed.trigger_timestamp, 3),
                size_bytes=completed.total_size_bytes,
                unaligned=any(t.unaligned for t in summary.tasks),
                inflight_bytes=sum(t.inflight_bytes for t in summary.tasks),
            )
            self.execute(job, actions)

    def _place_savepoint(self, job: JobMaster, completed: CompletedCheckpoint) -> str:
        """The savepoint's external path: its folder in the cluster's storage, or a copy of it in the
        folder it was asked for (``--path``, ``savepoints.dir``); a failed copy fails the savepoint."""
        folder = metadata_folder(completed.metadata_key)
        target = job.savepoint_targets.get(completed.checkpoint_id)
        if target is None:
            return external_path(self._storage.uri, completed.metadata_key)
        copied = copy_folder(self._storage, folder, open_storage(target))
        log.info(
            "savepoint_copied", job_id=job.job_id, checkpoint_id=completed.checkpoint_id, target=target, bytes=copied
        )
        return target.rstrip("/") + "/"

    def _notify(
        self,
        job: JobMaster,
        checkpoint_id: CheckpointId,
        tasks: tuple[TaskId, ...],
        attempt: int,
        *,
        complete: bool,
        reason: str = "",
    ) -> Future[None]:
        """Tell the TaskManagers running ``tasks`` as ``attempt`` how the checkpoint ended."""
        taskmanager_ids = {job.taskmanager_of(t) for t in tasks if (t.operator_uid, t.subtask) in job.tasks}
        addresses = [tm.address for tm_id in taskmanager_ids if (tm := self._registry.live(tm_id)) is not None]

        def send() -> None:
            for address in addresses:
                try:
                    if complete:
                        self._gateway.notify_checkpoint_complete(address, job.job_id, attempt, checkpoint_id)
                    else:
                        self._gateway.notify_checkpoint_aborted(address, job.job_id, attempt, checkpoint_id, reason)
                except TaskManagerCallError as exc:
                    log.warning("notify_failed", job_id=job.job_id, checkpoint_id=checkpoint_id, code=exc.code)

        return self._io.submit(send)

    def _delete(self, action: cc.DeleteObjects) -> None:
        try:
            self._storage.delete(action.metadata_keys)
            self._storage.delete(action.object_keys)
        except WeirError as exc:
            log.warning("checkpoint_cleanup_failed", error=str(exc), objects=len(action.object_keys))

    # Tasks and the end ----------------------------------------------------------------------------

    def cancel_tasks(self, job: JobMaster, attempt: int, *, job_ended: bool = False) -> None:
        """Stop the job's tasks of attempts up to ``attempt`` on every TaskManager that may run one."""
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

    def _resolve_after(
        self, job: JobMaster, action: lc.ResolveSinks, saved: Future[bool]
    ) -> Callable[[Future[None]], None]:
        """The end's resolution, to run once the completion notices went out."""

        def resolve(_notified: Future[None]) -> None:
            self._io.submit(self._resolve_end, job, action, saved)

        return resolve

    def _resolve_end(self, job: JobMaster, action: lc.ResolveSinks, saved: Future[bool]) -> None:
        """Stop every task of the job, then resolve its sinks' transactions as of the action's
        checkpoint (commit what it pre-committed, roll back or abort the rest) as the resolution's
        attempt, above every attempt that ran; hand the outcome to the lifecycle."""
        as_of = action.as_of.checkpoint_id if action.as_of is not None else None
        error = ""
        if not saved.result():
            error = "the job record with the resolution's attempt could not be written"
        else:
            self.cancel_tasks(job, action.resolution_attempt, job_ended=True)
            try:
                report = self._resolve(job, action.resolution_attempt, action.as_of, action.outcome)
            except WeirError as exc:
                error = str(exc)
            else:
                log.info(
                    "job_transactions_resolved",
                    job_id=job.job_id,
                    attempt=action.resolution_attempt,
                    checkpoint_id=as_of,
                    sink_subtasks=report.sink_subtasks,
                )
        with self._lock:
            now = self._clock()
            if error:
                log.warning(
                    "job_transactions_not_resolved",
                    job_id=job.job_id,
                    attempt=action.resolution_attempt,
                    checkpoint_id=as_of,
                    error=error,
                    action="retried with back-off",
                )
                self.execute(job, job.lifecycle.resolution_failed(now, error))
            else:
                self.execute(job, job.lifecycle.resolution_succeeded(now))
