"""Rescaling a running job (``weir rescale JOB_ID -p N``, Flink's ``PATCH /jobs/:jobid/rescaling``), as
pure decisions: whether to accept a request, and where each rescale operation stands.

A rescale is savepoint-free: the job takes a checkpoint whose barriers are forced aligned in every
mode (no in-flight records to redistribute), its sinks commit through it, its tasks are cancelled, and
it is redeployed at the new parallelism from that checkpoint, under the same job id: the keyed state
by key groups, the Kafka source's partition positions and the operators' other state by
``weir.core.rescale``, the sinks' transactions resolved as of the checkpoint by the JobManager before
the new attempt runs (``weir.jobmanager.deployment``). The job's lifecycle carries it out
(``weir.jobmanager.lifecycle``: ``trigger_rescale``); the executor keeps the operations' books here.

Flink's ``RescalingHandlers`` (REST API v1, removed in Flink 1.9 and reborn as the adaptive
scheduler's ``PUT /jobs/:jobid/resource-requirements``) took a savepoint and restarted from it; Weir
takes a regular checkpoint, forced aligned, which its retention deletes like any other.

Decisions::

    decide_rescale(facts) -> RescaleAccepted | RescaleRefused(reason)     (before the job is touched)
    reactive_target(parallelism, max parallelism, slots) -> N | None      (scheduler-mode: reactive)
    decide_requirements(facts, bounds) -> RescaleWithin(N) | RequirementsMet | RequirementsRefused
                                        (Flink's PUT /jobs/:jobid/resource-requirements)

    CHECKPOINTING ──checkpoint completed──▶ REDEPLOYING ──every task of the new attempt runs──▶ COMPLETED
         │                                        │
         └──checkpoint aborted, job ended─────────┴──job ended──▶ FAILED
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final, assert_never

from weir.core.states import JobStatus

RESCALES_KEPT: Final = 100
"""Finished rescale operations the JobManager keeps for their status (Flink's completed operation cache)."""


# ---------------------------------------------------------------------------------------------------
# Accepting a request


@dataclass(frozen=True)
class RescaleFacts:
    """What the JobManager knows of the job when a rescale is asked for."""

    job_id: str
    status: JobStatus
    parallelism: int  # the job's parallelism now
    requested: int
    max_parallelism: int
    rescale_in_progress: str | None  # the trigger id of the rescale under way
    stopping: bool  # a stop-with-savepoint is under way
    finishing: bool  # every bounded source read all its input
    slots_needed: int  # the shared slots the job needs at ``requested``
    slots_available: int  # the cluster's free slots plus those the job holds now


@dataclass(frozen=True)
class RescaleAccepted:
    parallelism: int


@dataclass(frozen=True)
class RescaleRefused:
    reason: str  # one line, naming the job; says what to do


RescaleDecision = RescaleAccepted | RescaleRefused


def decide_rescale(facts: RescaleFacts) -> RescaleDecision:
    """Accept the request, or refuse it with one clear line before anything of the job changes."""
    job, n = facts.job_id, facts.requested
    if n < 1:
        return RescaleRefused(f"job {job}: parallelism must be at least 1, got {n}")
    if n > facts.max_parallelism:
        return RescaleRefused(
            f"job {job}: parallelism {n} is above the job's max parallelism {facts.max_parallelism} "
            "(its number of key groups, fixed for the job's life: set max_parallelism when submitting)"
        )
    if facts.status is not JobStatus.RUNNING:
        return RescaleRefused(f"job {job} is {facts.status.value}: only a RUNNING job can be rescaled")
    if facts.rescale_in_progress is not None:
        return RescaleRefused(
            f"job {job} is already being rescaled (request {facts.rescale_in_progress}); wait for it to end"
        )
    if facts.stopping:
        return RescaleRefused(f"job {job} is stopping with a savepoint")
    if facts.finishing:
        return RescaleRefused(f"job {job} read all its input and is finishing with its final checkpoint")
    if n == facts.parallelism:
        return RescaleRefused(f"job {job} already runs at parallelism {n}")
    if facts.slots_needed > facts.slots_available:
        return RescaleRefused(
            f"job {job}: parallelism {n} needs {facts.slots_needed} slots, the cluster has "
            f"{facts.slots_available} for it (free ones and the job's own {facts.parallelism}); add TaskManagers "
            "or ask for less"
        )
    return RescaleAccepted(n)


def reactive_target(parallelism: int, max_parallelism: int, slots_available: int) -> int | None:
    """``scheduler-mode: reactive``: the parallelism the job should run at, given the slots it could
    use (the cluster's free ones plus its own), up to its max parallelism; None: stay as it is."""
    target = min(max_parallelism, slots_available)
    if target < 1 or target == parallelism:
        return None
    return target


# ---------------------------------------------------------------------------------------------------
# Resource requirements: Flink's adaptive scheduler's per-vertex parallelism bounds


@dataclass(frozen=True)
class ParallelismBounds:
    """A vertex's parallelism bounds as Flink's ``PUT /jobs/:jobid/resource-requirements`` gives them,
    validated (both at least 1, lower <= upper <= the max parallelism: Flink's rules, checked by the
    REST API before it asks)."""

    lower: int
    upper: int

    def __contains__(self, parallelism: object) -> bool:
        return isinstance(parallelism, int) and self.lower <= parallelism <= self.upper


@dataclass(frozen=True)
class RequirementsVertex:
    uid: str  # its head operator's
    parallelism: int
    own: bool  # its parallelism is set in the job's code: a rescale keeps it


@dataclass(frozen=True)
class RequirementsFacts:
    job_id: str
    status: JobStatus
    parallelism: int  # the job's now: every vertex that is not ``own`` runs at it
    vertices: tuple[RequirementsVertex, ...]
    slots_available: int  # the cluster's free slots plus those the job holds now


@dataclass(frozen=True)
class RescaleWithin:
    """Rescale the job to ``parallelism``: the highest the bounds and the slots allow."""

    parallelism: int


@dataclass(frozen=True)
class RequirementsMet:
    """The job runs within the bounds at the parallelism they lead to: nothing to do."""

    parallelism: int


@dataclass(frozen=True)
class RequirementsRefused:
    reason: str  # one line, naming the job; says what to do


RequirementsDecision = RescaleWithin | RequirementsMet | RequirementsRefused


def decide_requirements(facts: RequirementsFacts, bounds: Mapping[str, ParallelismBounds]) -> RequirementsDecision:
    """Map per-vertex bounds (by vertex uid) onto Weir's one rescalable number, the job's parallelism.

    Flink's adaptive scheduler runs each vertex at the highest parallelism within its bounds that the
    slots allow. Weir's vertices that follow the job's parallelism move together, so theirs is the
    highest within every one of their bounds (their intersection) that the slots the job could use allow;
    a vertex whose parallelism is its own (set in the job's code) keeps it, so its bounds must include it.
    A vertex the bounds do not name keeps its parallelism."""
    job = facts.job_id
    if facts.status.terminal:
        return RequirementsRefused(f"job {job} is {facts.status.value}: an ended job has no resource requirements")
    lower, upper, together = 1, None, []
    for vertex in facts.vertices:
        wanted = bounds.get(vertex.uid, ParallelismBounds(vertex.parallelism, vertex.parallelism))
        if vertex.own:
            if vertex.parallelism not in wanted:
                return RequirementsRefused(
                    f"job {job}: vertex {vertex.uid!r} runs at its own parallelism {vertex.parallelism}, set in the "
                    f"job's code, which Weir does not change: its bounds [{wanted.lower}, {wanted.upper}] must "
                    f"include {vertex.parallelism}"
                )
            continue
        together.append(f"{vertex.uid!r} [{wanted.lower}, {wanted.upper}]")
        lower = max(lower, wanted.lower)
        upper = wanted.upper if upper is None else min(upper, wanted.upper)
    if upper is None:  # every vertex keeps its own parallelism
        return RequirementsMet(facts.parallelism)
    if lower > upper:
        return RequirementsRefused(
            f"job {job}: the vertices {', '.join(together)} run at the job's parallelism, one number for all of "
            "them in Weir, and their bounds have none in common"
        )
    target = min(upper, facts.slots_available)
    if target < lower:
        return RequirementsRefused(
            f"job {job}: its bounds ask for parallelism {lower} at least, the cluster has {facts.slots_available} "
            "slots for it (free ones and the job's own); add TaskManagers or lower the bound"
        )
    if target == facts.parallelism:
        return RequirementsMet(target)
    return RescaleWithin(target)


# ---------------------------------------------------------------------------------------------------
# One rescale operation


class RescalePhase(enum.StrEnum):
    CHECKPOINTING = "CHECKPOINTING"  # waiting for the aligned checkpoint to be triggered and complete
    REDEPLOYING = "REDEPLOYING"  # the checkpoint completed, the tasks are being cancelled and placed at N
    COMPLETED = "COMPLETED"  # every task of the attempt at N runs
    FAILED = "FAILED"  # nothing changed (the checkpoint failed) or the job ended meanwhile

    @property
    def finished(self) -> bool:
        return self in (RescalePhase.COMPLETED, RescalePhase.FAILED)


@dataclass(frozen=True)
class RescaleOperation:
    trigger_id: str
    job_id: str
    from_parallelism: int
    to_parallelism: int
    requested_at: float
    phase: RescalePhase = RescalePhase.CHECKPOINTING
    checkpoint_id: int | None = None  # the aligned checkpoint, once triggered
    failure: str = ""
    finished_at: float | None = None


@dataclass(frozen=True)
class CheckpointTriggered:
    checkpoint_id: int


@dataclass(frozen=True)
class CheckpointCompleted:
    checkpoint_id: int


@dataclass(frozen=True)
class Redeployed:
    """Every task of the attempt at the new parallelism runs."""


@dataclass(frozen=True)
class RescaleFailed:
    reason: str


RescaleEvent = CheckpointTriggered | CheckpointCompleted | Redeployed | RescaleFailed


def advance(op: RescaleOperation, event: RescaleEvent, now: float) -> RescaleOperation:
    """The operation after ``event``; a finished one stays as it is, an event out of turn changes nothing."""
    if op.phase.finished:
        return op
    match event:
        case CheckpointTriggered(checkpoint_id=checkpoint_id):
            if op.phase is RescalePhase.CHECKPOINTING:
                return replace(op, checkpoint_id=checkpoint_id)
            return op
        case CheckpointCompleted(checkpoint_id=checkpoint_id):
            if op.phase is RescalePhase.CHECKPOINTING:
                return replace(op, phase=RescalePhase.REDEPLOYING, checkpoint_id=checkpoint_id)
            return op
        case Redeployed():
            if op.phase is RescalePhase.REDEPLOYING:
                return replace(op, phase=RescalePhase.COMPLETED, finished_at=now)
            return op
        case RescaleFailed(reason=reason):
            return replace(op, phase=RescalePhase.FAILED, failure=reason, finished_at=now)
        case _:
            assert_never(event)


class RescaleOperations:
    """The JobManager's rescale operations: at most one under way per job, the latest finished ones
    kept (``RESCALES_KEPT``) for their status."""

    def __init__(self, kept: int = RESCALES_KEPT) -> None:
        self._kept = kept
        self._active: dict[str, RescaleOperation] = {}  # job id -> its rescale under way
        self._finished: OrderedDict[tuple[str, str], RescaleOperation] = OrderedDict()

    def active(self, job_id: str) -> RescaleOperation | None:
        return self._active.get(job_id)

    def get(self, job_id: str, trigger_id: str) -> RescaleOperation | None:
        op = self._active.get(job_id)
        if op is not None and op.trigger_id == trigger_id:
            return op
        return self._finished.get((job_id, trigger_id))

    def start(self, op: RescaleOperation) -> None:
        if op.job_id in self._active:
            raise ValueError(f"job {op.job_id} already has rescale {self._active[op.job_id].trigger_id} under way")
        self._active[op.job_id] = op

    def on(self, job_id: str, event: RescaleEvent, now: float) -> RescaleOperation | None:
        """Apply ``event`` to the job's rescale under way (None: it has none); a finished one moves to
        the kept ones."""
        op = self._active.get(job_id)
        if op is None:
            return None
        op = advance(op, event, now)
        if op.phase.finished:
            del self._active[job_id]
            self._finished[(job_id, op.trigger_id)] = op
            while len(self._finished) > self._kept:
                self._finished.popitem(last=False)
        else:
            self._active[job_id] = op
        return op
