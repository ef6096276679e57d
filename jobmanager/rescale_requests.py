"""``weir rescale`` and ``PATCH /jobs/:jobid/rescaling``, thin: gather the facts, let
``weir.jobmanager.rescaling.decide_rescale`` accept or refuse, then hand the job's lifecycle the
rescale (``JobLifecycle.trigger_rescale``), whose actions the executor carries out. Called without the
JobManager's lock; takes it."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import assert_never

import structlog

from weir.connectors.object_storage import CheckpointStorage
from weir.core.errors import JobDefinitionError, UnknownJobError, WeirError
from weir.core.states import JobStatus
from weir.core.task_state import TaskStateDocument
from weir.graph import LogicalGraph
from weir.jobmanager import rescaling as rs
from weir.jobmanager.deployment import redistribute
from weir.jobmanager.errors import RescaleRejectedError, UnknownRescaleError
from weir.jobmanager.job_actions import JobActionExecutor
from weir.jobmanager.jobs import JobMaster
from weir.jobmanager.registry import TaskManagerRegistry
from weir.operators.base import StreamOperator

log = structlog.get_logger("weir.jobmanager")


def per_subtask_state(
    graph: LogicalGraph, documents: Iterable[TaskStateDocument], moved_vertices: Collection[str]
) -> list[str]:
    """The operators with state in ``documents`` of a vertex in ``moved_vertices`` (whose parallelism
    the rescale changes) whose state belongs to one subtask index (they keep
    ``StreamOperator.restore_inherited_state``'s default, which refuses another parallelism on the
    TaskManager): a rescale would redeploy the job into a restore that fails. A vertex whose
    parallelism is its own (a source pinned at 1) keeps it, and its subtasks their own state."""
    uids = sorted(
        {
            uid
            for d in documents
            if d.vertex_uid in moved_vertices
            for uid in d.operator_state_uids
            if uid in graph.transformations
        }
    )
    pinned = []
    for uid in uids:
        operator = graph.transformations[uid].factory()
        if type(operator).restore_inherited_state is StreamOperator.restore_inherited_state:
            pinned.append(uid)
    return pinned


def new_trigger_id() -> str:
    """Flink's ``TriggerId``: 32 hex digits."""
    return uuid.uuid4().hex


class RescaleRequests:
    def __init__(
        self,
        jobs: Mapping[str, JobMaster],
        registry: TaskManagerRegistry,
        executor: JobActionExecutor,
        lock: threading.RLock,
        clock: Callable[[], float],
        storage: CheckpointStorage,
        *,
        new_id: Callable[[], str] = new_trigger_id,
    ) -> None:
        """``storage``: the cluster's checkpoint storage (a request is refused when the job's latest
        checkpoint cannot be redistributed to the new parallelism)."""
        self._storage = storage
        self._refused: dict[str, int] = {}  # job id -> the reactive target refused last
        self._jobs = jobs
        self._registry = registry
        self._executor = executor
        self._lock = lock
        self._clock = clock
        self._new_id = new_id

    def rescale(self, job_id: str, parallelism: int) -> str:
        """Start rescaling a running job to ``parallelism``; answers the request's trigger id.
        RescaleRejectedError (one line) when it is refused; the job is then untouched."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownJobError(job_id)
            now = self._clock()
            facts = self._facts(job, parallelism)
            decision = rs.decide_rescale(facts)
            match decision:
                case rs.RescaleRefused(reason=reason):
                    log.info("rescale_refused", job_id=job_id, parallelism=parallelism, reason=reason)
                    raise RescaleRejectedError(reason)
                case rs.RescaleAccepted():
                    pass
                case _:
                    assert_never(decision)
            actions = job.lifecycle.trigger_rescale(now, parallelism)  # raises before anything changed
            trigger_id = self._new_id()
            self._executor.rescales.start(
                rs.RescaleOperation(trigger_id, job_id, facts.parallelism, parallelism, requested_at=now)
            )
            log.info(
                "rescale_requested",
                job_id=job_id,
                trigger_id=trigger_id,
                from_parallelism=facts.parallelism,
                to_parallelism=parallelism,
                slots_needed=facts.slots_needed,
                slots_available=facts.slots_available,
            )
            self._executor.execute(job, actions)
            return trigger_id

    def rescale_within(self, job_id: str, bounds: Mapping[str, rs.ParallelismBounds]) -> str | None:
        """Flink's ``PUT /jobs/:jobid/resource-requirements``: bounds (validated, by vertex uid) mapped
        onto the job's parallelism (``rescaling.decide_requirements``); answers the trigger id of the
        rescale it started, None when the job runs within them already. RescaleRejectedError (one
        line) when Weir cannot run the job within them; the job is then untouched."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise UnknownJobError(job_id)
            transformations = job.loaded.graph.transformations
            held = len(job.slots) if job.status is JobStatus.RUNNING else 0
            free = sum(max(0, offer.free_slots) for offer in self._registry.offers())
            facts = rs.RequirementsFacts(
                job_id=job_id,
                status=job.status,
                parallelism=job.submission.parallelism,
                vertices=tuple(
                    rs.RequirementsVertex(uid, vertex.parallelism, own=transformations[uid].parallelism is not None)
                    for uid, vertex in job.plan.vertices.items()
                ),
                slots_available=free + held,
            )
            decision = rs.decide_requirements(facts, bounds)
            match decision:
                case rs.RequirementsRefused(reason=reason):
                    log.info("resource_requirements_refused", job_id=job_id, reason=reason)
                    raise RescaleRejectedError(reason)
                case rs.RequirementsMet(parallelism=parallelism):
                    log.info("resource_requirements_met", job_id=job_id, parallelism=parallelism)
                    return None
                case rs.RescaleWithin(parallelism=parallelism):
                    return self.rescale(job_id, parallelism)
                case _:
                    assert_never(decision)

    def react(self, job: JobMaster) -> str | None:
        """``scheduler-mode: reactive`` (called with the lock held, each monitor tick): a running job
        whose every task runs is rescaled to the slots it could use now, when that differs; answers
        the trigger id. A target refused once is not asked for again until the slots change."""
        if not job.execution_settings.reactive or job.status is not JobStatus.RUNNING or not job.all_running():
            return None
        if self._executor.rescales.active(job.job_id) is not None or job.lifecycle.rescale_deploying:
            return None
        held = len(job.slots)
        free = sum(max(0, offer.free_slots) for offer in self._registry.offers())
        target = rs.reactive_target(job.submission.parallelism, job.loaded.graph.max_parallelism, free + held)
        if target is None or self._refused.get(job.job_id) == target:
            return None
        try:
            trigger_id = self.rescale(job.job_id, target)
        except RescaleRejectedError as exc:
            self._refused[job.job_id] = target
            log.info("reactive_rescale_refused", job_id=job.job_id, parallelism=target, reason=str(exc))
            return None
        self._refused.pop(job.job_id, None)
        log.info("reactive_rescale", job_id=job.job_id, trigger_id=trigger_id, parallelism=target, slots=free + held)
        return trigger_id

    def shrink_to_slots(self, job: JobMaster, now: float) -> bool:
        """``scheduler-mode: reactive``: a restarting job that found too few slots (a TaskManager was
        lost) runs at what is left instead of waiting; answers whether its parallelism changed. Its
        restart restores the latest checkpoint redistributed (``weir.jobmanager.deployment``)."""
        if not job.execution_settings.reactive or job.status is not JobStatus.RESTARTING:
            return False
        free = sum(max(0, offer.free_slots) for offer in self._registry.offers())
        target = rs.reactive_target(job.submission.parallelism, job.loaded.graph.max_parallelism, free)
        if target is None or target > job.submission.parallelism:
            return False
        try:
            job.rescale(target)
        except JobDefinitionError as exc:
            log.warning("reactive_rescale_refused", job_id=job.job_id, parallelism=target, reason=str(exc))
            return False
        log.info("reactive_rescale", job_id=job.job_id, parallelism=target, slots=free, restarting=True)
        self._executor.execute(job, job.lifecycle.restart_later(now))
        return True

    def status(self, job_id: str, trigger_id: str) -> rs.RescaleOperation:
        with self._lock:
            if job_id not in self._jobs:
                raise UnknownJobError(job_id)
            op = self._executor.rescales.get(job_id, trigger_id)
            if op is None:
                raise UnknownRescaleError(
                    f"job {job_id} has no rescale {trigger_id} (this JobManager keeps the latest "
                    f"{rs.RESCALES_KEPT} it ran; a JobManager that took the job over knows none of before)"
                )
            return op

    def _facts(self, job: JobMaster, parallelism: int) -> rs.RescaleFacts:
        max_parallelism = job.loaded.graph.max_parallelism
        slots_needed = 0
        if 1 <= parallelism <= max_parallelism:
            try:
                loaded, plan = job.rescaled_plan(parallelism)
            except JobDefinitionError as exc:
                raise RescaleRejectedError(f"job {job.job_id}: parallelism {parallelism}: {exc}") from exc
            slots_needed = plan.max_parallelism_over_vertices
            latest = job.coordinator.store.latest()
            if latest is not None:  # the rescale's checkpoint will hold the same operators' state
                try:
                    redistributed = redistribute(self._storage, latest, loaded.graph, plan)
                except WeirError as exc:
                    raise RescaleRejectedError(
                        f"job {job.job_id}: its state cannot be redistributed to parallelism {parallelism}: {exc}"
                    ) from exc
                before = Counter(str(h.task_id.operator_uid) for h in latest.task_states)
                moved = {uid for uid, vertex in plan.vertices.items() if vertex.parallelism != before[uid]}
                pinned = per_subtask_state(loaded.graph, redistributed.documents, moved)
                if pinned:
                    raise RescaleRejectedError(
                        f"job {job.job_id}: operator(s) {', '.join(pinned)} keep per-subtask state that cannot be "
                        f"redistributed to parallelism {parallelism}: the job runs at "
                        f"{job.submission.parallelism} only"
                    )
        held = len(job.slots) if job.status is JobStatus.RUNNING else 0
        free = sum(max(0, offer.free_slots) for offer in self._registry.offers())
        active = self._executor.rescales.active(job.job_id)
        return rs.RescaleFacts(
            job_id=job.job_id,
            status=job.status,
            parallelism=job.submission.parallelism,
            requested=parallelism,
            max_parallelism=max_parallelism,
            rescale_in_progress=active.trigger_id if active is not None else None,
            stopping=job.lifecycle.stop_request is not None,
            finishing=job.lifecycle.finishing,
            slots_needed=slots_needed,
            slots_available=free + held,
        )
