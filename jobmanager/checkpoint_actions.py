"""Carries out the checkpoint coordinator's actions (``jobmanager.checkpointing.coordinator``).

The coordinator decides; this executor does the I/O: it reserves checkpoint ids in the job record
before a barrier carries one, asks the source tasks to inject barriers, writes a completed
checkpoint's metadata (last, one PUT), notifies the tasks, deletes subsumed objects. ``execute`` is
called with the JobManager's lock held; every call to a TaskManager or to storage runs on a worker
thread, which takes the lock again to hand the outcome back to the coordinator.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import assert_never

import structlog

from connectors.object_storage import CheckpointStorage, copy_folder, open_storage
from jobmanager import metrics
from jobmanager.checkpointing import coordinator as cc
from jobmanager.checkpointing.metadata import encode_metadata
from jobmanager.checkpointing.store import CompletedCheckpoint
from jobmanager.errors import TaskManagerCallError
from jobmanager.gateway import TaskManagerGateway
from jobmanager.jobs import JobMaster
from jobmanager.record_store import JobRecordStore
from jobmanager.registry import TaskManagerRegistry
from weir.core.checkpointing import CheckpointKind
from weir.core.errors import WeirError
from weir.core.ids import CheckpointId, TaskId
from weir.core.paths import external_path, metadata_folder
from weir.core.states import JobStatus

log = structlog.get_logger("weir.jobmanager")


class CheckpointActionExecutor:
    def __init__(
        self,
        registry: TaskManagerRegistry,
        gateway: TaskManagerGateway,
        storage: CheckpointStorage,
        records: JobRecordStore,
        io: Executor,
        lock: threading.RLock,
        clock: Callable[[], float],
    ) -> None:
        self._registry = registry
        self._gateway = gateway
        self._storage = storage
        self._records = records
        self._io = io
        self._lock = lock
        self._clock = clock
        self.on_stop: Callable[[JobMaster], None] = lambda job: None
        """Ends a job whose stop-with-savepoint completed (set by the JobManager to cancel it)."""

    def execute(self, job: JobMaster, actions: Iterable[cc.Action]) -> None:
        """Carry out the coordinator's decisions; I/O runs on worker threads, never under the lock."""
        for action in actions:
            match action:
                case cc.TriggerBarriers():
                    self._trigger_barriers(job, action)
                case cc.PersistCheckpoint(completed=completed):
                    self._io.submit(self._persist, job, completed)
                case cc.NotifyComplete(checkpoint_id=checkpoint_id, tasks=tasks):
                    stop = checkpoint_id == job.stop_savepoint_id
                    if stop:
                        job.stopped_with_savepoint = True
                        log.info("job_stopping_at_savepoint", job_id=job.job_id, checkpoint_id=checkpoint_id)
                    # The sinks commit through it on this notification; a stopped job then ends (its end
                    # resolves as of this savepoint whatever a sink did not commit yet).
                    self._notify(
                        job, checkpoint_id, tasks, complete=True, then=(lambda: self.on_stop(job)) if stop else None
                    )
                case cc.NotifyAborted(checkpoint_id=checkpoint_id, tasks=tasks, reason=reason):
                    if checkpoint_id == job.final_checkpoint_id:
                        job.final_checkpoint_id = None  # the final checkpoint failed: trigger another
                    if checkpoint_id == job.stop_savepoint_id:
                        job.stop_savepoint_id = None  # the savepoint failed: the job keeps running
                    metrics.CHECKPOINTS_FAILED.labels(job.job_id).inc()
                    log.warning(
                        "checkpoint_aborted", job_id=job.job_id, checkpoint_id=checkpoint_id, reason=reason.message
                    )
                    self._notify(job, checkpoint_id, tasks, complete=False, reason=reason.message)
                case cc.DeleteObjects():
                    self._io.submit(self._delete, action)
                case _:
                    assert_never(action)

    def trigger_final_checkpoint(self, job: JobMaster, now: float) -> None:
        """Once every bounded source has ended, one more checkpoint lets the sinks commit the rest."""
        if job.status is not JobStatus.RUNNING or not job.needs_final_checkpoint():
            return
        trigger = job.coordinator.trigger_now(now)
        if trigger is not None:
            self.execute(job, (trigger,))  # _trigger_barriers marks it final

    def _trigger_barriers(self, job: JobMaster, action: cc.TriggerBarriers) -> None:
        if action.reserve_ids_through is not None and not self._records.save(job).result():
            # No barrier may carry an id a JobManager taking over could hand out again.
            self.execute(
                job,
                job.coordinator.id_reservation_failed(
                    self._clock(), action.checkpoint_id, "the job record could not be written"
                ),
            )
            return
        if action.kind is CheckpointKind.CHECKPOINT and job.needs_final_checkpoint():
            # Every bounded source ended and waits for a final checkpoint: this one is it, whether it
            # came from the interval or from trigger_final_checkpoint (with a periodic checkpoint
            # always in flight, the latter would never get its turn).
            job.final_checkpoint_id = action.checkpoint_id
            log.info("final_checkpoint_triggered", job_id=job.job_id, checkpoint_id=action.checkpoint_id)
        metrics.CHECKPOINTS_TRIGGERED.labels(job.job_id).inc()
        log.info("checkpoint_triggered", job_id=job.job_id, checkpoint_id=action.checkpoint_id, kind=action.kind.value)
        self._io.submit(self._trigger, job, job.attempt, action)

    def _trigger(self, job: JobMaster, attempt: int, action: cc.TriggerBarriers) -> None:
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
                        final=action.checkpoint_id == job.final_checkpoint_id,
                        drain=action.checkpoint_id == job.drain_savepoint_id,
                    )
                except TaskManagerCallError as exc:
                    log.warning("trigger_failed", job_id=job.job_id, task=str(task), code=exc.code)
            if not accepted:
                with self._lock:
                    if job.attempt == attempt:
                        self.execute(
                            job,
                            job.coordinator.receive_decline(
                                self._clock(), action.checkpoint_id, task, "source task did not accept the trigger"
                            ),
                        )
                return

    def _persist(self, job: JobMaster, completed: CompletedCheckpoint) -> None:
        """Write the metadata (last, atomically: one PUT), copy a savepoint to where it was asked for,
        then let the coordinator notify the tasks."""
        try:
            self._storage.put_bytes(completed.metadata_key, encode_metadata(completed))
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
                    job, job.coordinator.checkpoint_persist_failed(self._clock(), completed.checkpoint_id, str(exc))
                )
            return
        with self._lock:
            now = self._clock()
            actions = job.coordinator.checkpoint_persisted(now, completed.checkpoint_id)
            summary = job.coordinator.latest_completed
            if summary is None or summary.checkpoint_id != completed.checkpoint_id:
                raise AssertionError(f"checkpoint {completed.checkpoint_id} persisted but not the latest completed")
            metrics.checkpoint_completed(job.job_id, summary)
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
        *,
        complete: bool,
        reason: str = "",
        then: Callable[[], None] | None = None,
    ) -> None:
        taskmanager_ids = {job.taskmanager_of(t) for t in tasks if (t.operator_uid, t.subtask) in job.tasks}
        addresses = [tm.address for tm_id in taskmanager_ids if (tm := self._registry.live(tm_id)) is not None]
        attempt = job.attempt

        def send() -> None:
            for address in addresses:
                try:
                    if complete:
                        self._gateway.notify_checkpoint_complete(address, job.job_id, attempt, checkpoint_id)
                    else:
                        self._gateway.notify_checkpoint_aborted(address, job.job_id, attempt, checkpoint_id, reason)
                except TaskManagerCallError as exc:
                    log.warning("notify_failed", job_id=job.job_id, checkpoint_id=checkpoint_id, code=exc.code)
            if then is not None:
                then()

        self._io.submit(send)

    def _delete(self, action: cc.DeleteObjects) -> None:
        try:
            self._storage.delete(action.metadata_keys)
            self._storage.delete(action.object_keys)
        except WeirError as exc:
            log.warning("checkpoint_cleanup_failed", error=str(exc), objects=len(action.object_keys))
