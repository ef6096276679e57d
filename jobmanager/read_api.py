"""What the JobManager answers about its jobs and TaskManagers (``weir status``, ``list``,
``checkpoints``, ``cluster status``, and the REST API), as plain values (``weir.jobmanager.messages``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.errors import UnknownCheckpointError, UnknownJobError
from weir.core.ids import CheckpointId
from weir.core.paths import external_path
from weir.jobmanager.checkpointing.coordinator import CheckpointSummary
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.exception_history import ExceptionHistory
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.messages import (
    CheckpointCounts,
    CheckpointDetailView,
    CheckpointsView,
    ClusterView,
    InputEdgeView,
    JobConfigView,
    JobEndView,
    JobPlanView,
    JobStatusView,
    JobSummaryView,
    OperatorView,
    PlacedTaskView,
    RestoredCheckpointView,
    TaskManagerView,
    TaskView,
    VertexView,
)
from weir.jobmanager.registry import TaskManagerRegistry


def retained_summary(checkpoint: CompletedCheckpoint) -> CheckpointSummary:
    """A retained checkpoint as ``weir checkpoints`` shows it, from its metadata alone."""
    return CheckpointSummary(
        checkpoint_id=checkpoint.checkpoint_id,
        kind=checkpoint.kind,
        status=CheckpointStatus.COMPLETED,
        trigger_timestamp=checkpoint.trigger_timestamp,
        end_timestamp=checkpoint.completion_timestamp,
        acknowledged=len(checkpoint.task_states),
        total_tasks=len(checkpoint.task_states),
        state_size_bytes=sum({o.key: o.size_bytes for t in checkpoint.task_states for o in t.objects}.values()),
        failure=None,
        tasks=(),
        checkpointed_size_bytes=sum(o.size_bytes for t in checkpoint.task_states for o in t.objects if not o.reused),
        full=checkpoint.full,
    )


def summary_of(job: JobMaster) -> JobSummaryView:
    sub = job.submission
    return JobSummaryView(
        job_id=sub.job_id,
        job_name=sub.job_name,
        status=job.status,
        submitted_at=sub.submitted_at,
        parallelism=sub.parallelism,
        restarts=job.restarts,
    )


def end_view(job: JobMaster) -> JobEndView | None:
    end = job.lifecycle.recorded_end()
    if end is None:
        return None
    resolution = end.resolution
    decided = resolution is not None or end.ended
    return JobEndView(
        outcome=end.outcome,
        ended=end.ended,
        at=end.at,
        nothing_to_resolve=end.ended and resolution is None,
        resolution_decided=decided,
        as_of_checkpoint=resolution.as_of if resolution is not None else None,
        attempts=resolution.attempts if resolution is not None else 0,
        resolved=resolution is not None and resolution.resolved,
        error=resolution.error if resolution is not None else "",
        retry_at=resolution.retry_at if resolution is not None else None,
    )


class ReadApi:
    def __init__(
        self,
        jobs: Mapping[str, JobMaster],
        registry: TaskManagerRegistry,
        lock: threading.RLock,
        clock: Callable[[], float],
        storage_uri: str,
    ) -> None:
        """``storage_uri``: the checkpoint storage's, which external paths start with."""
        self._storage_uri = storage_uri
        self._jobs = jobs
        self._registry = registry
        self._lock = lock
        self._clock = clock

    def job_status(self, job_id: str) -> JobStatusView:
        with self._lock:
            job = self._job(job_id)
            latest = job.coordinator.store.latest()
            return JobStatusView(
                summary=summary_of(job),
                tasks=tuple(
                    TaskView(
                        vertex_uid=uid,
                        subtask=s,
                        operator_names=t.operator_names,
                        state=t.state,
                        taskmanager_id=t.taskmanager_id,
                        failure=t.failure,
                        records_in=t.records_in,
                        records_out=t.records_out,
                        records_in_all_attempts=t.records_in_all_attempts,
                        attempt=t.attempt,
                        ratios=t.ratios,
                        watermark=t.watermark,
                        progress_at=t.progress_at,
                        rates=t.rates,
                        time_totals=t.totals,
                    )
                    for (uid, s), t in sorted(job.tasks.items())
                ),
                failure=job.failure,
                last_completed_checkpoint=latest.checkpoint_id if latest is not None else 0,
                last_restore_at=job.last_restore_at,
                finished_at=job.finished_at if job.status.terminal else None,
                now=self._clock(),
                end=end_view(job),
            )

    def job_plan(self, job_id: str) -> JobPlanView:
        """The job's vertices (chains of operators) in topological order, with their input edges."""
        with self._lock:
            job = self._job(job_id)
        transformations = job.loaded.graph.transformations  # the plan and graph never change: no lock
        return JobPlanView(
            job_id=job.job_id,
            job_name=job.submission.job_name,
            vertices=tuple(
                VertexView(
                    uid=v.uid,
                    parallelism=v.parallelism,
                    operators=tuple(OperatorView(u, transformations[u].name) for u in v.operator_uids),
                    inputs=tuple(
                        InputEdgeView(
                            producer_vertex=e.producer_vertex,
                            partitioning=e.partitioning,
                            side_output=e.side_output.name if e.side_output is not None else None,
                        )
                        for e in v.inputs
                    ),
                )
                for v in job.plan.vertices.values()
            ),
            max_parallelism=job.loaded.graph.max_parallelism,
        )

    def job_config(self, job_id: str) -> JobConfigView:
        with self._lock:
            job = self._job(job_id)
        sub = job.submission  # the submission and its parsed settings never change: no lock
        return JobConfigView(
            job_id=sub.job_id,
            job_name=sub.job_name,
            parallelism=sub.parallelism,
            max_parallelism=job.loaded.graph.max_parallelism,
            parameters=dict(sub.parameters),
            checkpointing=job.checkpoint_settings,
            restart_strategy=job.lifecycle.restart_strategy.name,
            buffer_timeout_s=job.execution_settings.buffer_timeout_s,
            checkpoint_storage=self._storage_uri,
        )

    def exception_history(self, job_id: str) -> ExceptionHistory:
        with self._lock:
            return self._job(job_id).exceptions

    def list_jobs(self) -> tuple[JobSummaryView, ...]:
        with self._lock:
            return tuple(summary_of(j) for j in self._jobs.values())

    def list_checkpoints(self, job_id: str) -> CheckpointsView:
        """The job's recent checkpoints, and every retained one with its external path (those a
        JobManager recovered from storage appear though its statistics never saw them)."""
        with self._lock:
            coordinator = self._job(job_id).coordinator
            stats = coordinator.stats()
            retained = coordinator.store.all()
            savepoint_paths = dict(self._job(job_id).savepoint_paths)
        seen = {c.checkpoint_id for c in stats.history}
        recovered = tuple(retained_summary(c) for c in reversed(retained) if c.checkpoint_id not in seen)
        history = tuple(sorted(stats.history + recovered, key=lambda c: c.checkpoint_id, reverse=True))
        paths = {c.checkpoint_id: external_path(self._storage_uri, c.metadata_key) for c in retained}
        # Where each savepoint was put, also after a checkpoint replaced it.
        paths.update({CheckpointId(cid): path for cid, path in savepoint_paths.items()})
        restored = None
        if stats.restored_from is not None and stats.restored_at is not None:
            kinds = {c.checkpoint_id: c.kind for c in retained} | {c.checkpoint_id: c.kind for c in history}
            restored = RestoredCheckpointView(
                stats.restored_from, stats.restored_at, kinds.get(stats.restored_from, CheckpointKind.CHECKPOINT)
            )
        counts = CheckpointCounts(
            triggered=stats.triggered,
            completed=stats.completed,
            failed=stats.failed,
            in_progress=stats.in_progress,
            restores=stats.restores,
        )
        return CheckpointsView(
            job_id=job_id, checkpoints=history, external_paths=paths, counts=counts, restored=restored
        )

    def checkpoint_detail(self, job_id: str, checkpoint_id: int) -> CheckpointDetailView:
        """One checkpoint of the job (in progress, recent, or retained) with its subtasks' stats and
        timelines; UnknownCheckpointError if it is none of those."""
        view = self.list_checkpoints(job_id)
        found = next((c for c in view.checkpoints if c.checkpoint_id == checkpoint_id), None)
        if found is None:
            raise UnknownCheckpointError(job_id, checkpoint_id)
        return CheckpointDetailView(job_id, found, view.external_paths.get(found.checkpoint_id))

    def cluster_status(self) -> ClusterView:
        now = self._clock()
        with self._lock:
            free = {o.taskmanager_id: o.free_slots for o in self._registry.offers()}
            placed: dict[str, list[PlacedTaskView]] = {}
            for job in self._jobs.values():
                if job.status.terminal:
                    continue
                for (uid, s), t in sorted(job.tasks.items()):
                    if t.taskmanager_id and t.attempt == job.attempt:
                        placed.setdefault(t.taskmanager_id, []).append(
                            PlacedTaskView(job.job_id, uid, s, t.attempt, t.state)
                        )
            return ClusterView(
                taskmanagers=tuple(
                    TaskManagerView(
                        taskmanager_id=tm.taskmanager_id,
                        address=tm.address,
                        slots_total=tm.slots,
                        slots_free=free.get(tm.taskmanager_id, 0),
                        last_heartbeat_age_s=now - tm.last_heartbeat,
                        alive=tm.alive,
                        tasks=tuple(placed.get(tm.taskmanager_id, ())) if tm.alive else (),
                        metrics_port=tm.metrics_port,
                        hardware=tm.hardware,
                    )
                    for tm in sorted(self._registry.taskmanagers.values(), key=lambda t: t.taskmanager_id)
                )
            )

    def _job(self, job_id: str) -> JobMaster:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJobError(job_id)
        return job
