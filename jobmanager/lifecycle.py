"""A job's life in the JobManager, as a pure, typed state machine beside the checkpoint coordinator.

The coordinator (``weir.jobmanager.checkpointing.coordinator``) decides about checkpoints; this machine
decides about the job around them, at the edges where the two meet: the end of input and the final
checkpoint, stop with a savepoint (with and without ``--drain``) and a savepoint that fails, cancel,
a task failure and the restart strategy's answer, the end-of-job resolution of the sinks'
transactions, and a JobManager taking a job over from its record. Every coordinator call goes
through it, so it sees each checkpoint's outcome and adds its own decisions to the coordinator's
actions. It does no I/O, holds no lock and reads no clock: the executor (``weir.jobmanager.job_actions``)
calls it under the JobManager's lock with ``now`` and carries out the actions it answers, in order,
matched exhaustively.

States (Flink's scheduler states, ``AdaptiveScheduler``'s ``Executing`` / ``StopWithSavepoint`` /
``Restarting`` / ``Canceling`` / ``Failing`` / ``Finished``, folded into five)::

    Created ──deployed──▶ Running ◀──deployed── Restarting
                            │  ▲ stop's savepoint failed (no drain)
                            │  └─ Running(stop=…) ── savepoint failed with --drain ──▶ Restarting
                            ├── task failed ──▶ Restarting (the restart strategy restarts)
                            │                └▶ Ending(FAILED)  (it gave up)
                            ├── cancel ──▶ Ending(CANCELED)
                            ├── stop's savepoint completed ──▶ Ending(FINISHED)
                            └── every task FINISHED ──▶ Ended(FINISHED, nothing to resolve)
    Ending ── resolved ──▶ Ended(resolved)      Ending ── deadline passed ──▶ Ended(unresolved, retried)

The rules this machine keeps (``tests/unit/jobmanager/test_lifecycle_model.py`` checks them after
every step of seeded random runs):

- The end of a job is resolved as of the latest *completed* checkpoint, and only once no checkpoint
  is being persisted: a checkpoint whose metadata write is under way may still complete, and its
  sinks' pre-committed transactions must then be committed, not rolled back.
- Nothing is triggered once a stop's savepoint was triggered (until it fails), nor beside or after the
  final checkpoint: the sinks never commit past the savepoint the job stops at, and nothing is
  pre-committed after the final checkpoint that no checkpoint would complete. A savepoint is refused
  once every source ended.
- The first checkpoint triggered after every source ended is the final one (``final``); its
  barriers are aligned on the TaskManagers, so everything the sinks write lies inside it.
- A stop whose savepoint fails leaves the job as it was: running and reading; with ``--drain`` the
  sources already emitted the end of event time (every window fired), so the job restarts from its
  latest completed checkpoint instead, not counted against the restart strategy (Flink fails over
  globally when a drained stop-with-savepoint fails).
- An end whose resolution fails is retried with back-off for as long as the JobManager runs, also
  after the job is reported ended, and by a JobManager that takes the job over (``needs_takeover``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final, assert_never

from weir.core.checkpointing import CheckpointKind
from weir.core.failures import Failure
from weir.core.ids import CheckpointId, JobId, TaskId
from weir.core.states import JobStatus
from weir.jobmanager.checkpointing import coordinator as cc
from weir.jobmanager.checkpointing.pending import TaskAckMetrics, TaskStateHandle
from weir.jobmanager.checkpointing.store import CompletedCheckpoint
from weir.jobmanager.errors import (
    CheckpointProtocolError,
    CheckpointRejectedError,
    RescaleRejectedError,
    SavepointRejectedError,
)
from weir.jobmanager.restart import GiveUp, RestartAfter, RestartStrategy

RESOLUTION_DEADLINE_S: Final = 300.0
"""How long an ending job waits for its sinks' resolution before it is reported ended (unresolved,
still retried)."""
RESOLUTION_FIRST_DELAY_S: Final = 1.0
RESOLUTION_MAX_DELAY_S: Final = 30.0

# ---------------------------------------------------------------------------------------------------
# States


@dataclass(frozen=True)
class StopRequest:
    """``weir stop``: the savepoint the job stops at once it completes."""

    savepoint_id: CheckpointId
    drain: bool


@dataclass(frozen=True)
class RescaleRequest:
    """``weir rescale``: redeploy at ``parallelism`` once its forced aligned checkpoint completed
    (``checkpoint_id`` None: not triggered yet, another checkpoint is in flight)."""

    parallelism: int
    checkpoint_id: CheckpointId | None = None


@dataclass(frozen=True)
class Resolution:
    """The end-of-job resolution of the sinks' transactions: commit what ``as_of`` pre-committed,
    roll back or abort everything else (``weir.jobmanager.ending``)."""

    as_of: CheckpointId | None  # the latest completed checkpoint when it was decided (None: none)
    attempts: int = 0  # resolutions tried so far
    running: bool = False  # one is under way; its outcome is not in yet
    resolved: bool = False
    error: str = ""  # why the last one failed
    retry_at: float | None = None  # when the next one is due (not running, not resolved)


@dataclass(frozen=True)
class Created:
    """Submitted, never deployed."""


@dataclass(frozen=True)
class Running:
    attempt: int
    sources_ended: frozenset[TaskId] = frozenset()  # bounded sources that read all their input
    final_checkpoint: CheckpointId | None = None  # triggered after every source ended, in flight
    final_completed: bool = False  # it completed: the tasks finish, nothing more is triggered
    stop: StopRequest | None = None
    rescale: RescaleRequest | None = None


@dataclass(frozen=True)
class Restarting:
    attempt: int  # the attempt that ended
    restart_at: float


@dataclass(frozen=True)
class Ending:
    """The tasks are being stopped and the sinks resolved; ``resolution`` is None while a checkpoint
    is still being persisted (the resolution waits for its outcome)."""

    outcome: JobStatus  # CANCELED, FAILED or FINISHED (a stop's savepoint completed)
    attempt: int  # the last attempt deployed; its tasks are cancelled first
    since: float
    resolution: Resolution | None = None


@dataclass(frozen=True)
class Ended:
    """``resolution`` None: nothing to resolve (every task FINISHED, its sinks committed through the
    final checkpoint)."""

    outcome: JobStatus
    at: float
    resolution: Resolution | None = None


LifecycleState = Created | Running | Restarting | Ending | Ended

# ---------------------------------------------------------------------------------------------------
# Actions (beside the coordinator's)


@dataclass(frozen=True)
class CancelTasks:
    """Stop every task of ``attempt`` (a failover: the job restarts)."""

    attempt: int


@dataclass(frozen=True)
class ResolveSinks:
    """Write the job record (its attempt is ``resolution_attempt``: it fences every earlier attempt),
    stop every task of the job, then resolve the sinks' transactions as of ``as_of`` as
    ``resolution_attempt``, and release what the job's sources hold outside Weir (a CDC source's
    replication slot) as ``outcome`` says; report ``resolution_succeeded`` or ``resolution_failed``."""

    as_of: CompletedCheckpoint | None
    resolution_attempt: int
    outcome: JobStatus  # CANCELED, FAILED or FINISHED (a stop's savepoint completed)


@dataclass(frozen=True)
class StatusChanged:
    """The job's status changed: log, update the metrics, write the job record."""

    before: JobStatus
    after: JobStatus
    reason: str


@dataclass(frozen=True)
class SaveRecord:
    """Something a JobManager taking over needs changed (the end's resolution): write the job record."""


@dataclass(frozen=True)
class RescaleTriggered:
    """The rescale's forced aligned checkpoint was triggered."""

    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class Rescale:
    """The rescale's checkpoint completed (its sinks were told to commit it) and the tasks are being
    cancelled: rebuild the job's plan at ``parallelism`` before the job record is written; the restart
    (due now, not counted against the restart strategy) restores from the checkpoint at it."""

    parallelism: int
    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class RescaleDeployed:
    """Every task of the first attempt at the new parallelism runs: the rescale is done."""


@dataclass(frozen=True)
class RescaleAborted:
    reason: str


RescaleAction = RescaleTriggered | Rescale | RescaleDeployed | RescaleAborted

Action = cc.Action | CancelTasks | ResolveSinks | StatusChanged | SaveRecord | RescaleAction


@dataclass(frozen=True)
class AckOutcome:
    result: cc.AckResult
    actions: tuple[Action, ...] = ()


@dataclass(frozen=True)
class RecordedEnd:
    """What the job record keeps of an end (``weir.jobmanager.records``), for a JobManager taking over."""

    outcome: JobStatus
    ended: bool  # Ended (else Ending)
    at: float
    resolution: Resolution | None


# ---------------------------------------------------------------------------------------------------
# The machine


def _status_of(state: LifecycleState) -> JobStatus:
    match state:
        case Created():
            return JobStatus.CREATED
        case Running():
            return JobStatus.RUNNING
        case Restarting():
            return JobStatus.RESTARTING
        case Ending(outcome=outcome):
            # A failed job is FAILED at once (Flink's FAILING is not a status of Weir's); a cancelled
            # or stopped one is CANCELLING until its sinks are resolved.
            return JobStatus.FAILED if outcome is JobStatus.FAILED else JobStatus.CANCELLING
        case Ended(outcome=outcome):
            return outcome
        case _:
            assert_never(state)


class JobLifecycle:
    """Decides a job's lifecycle; owns its checkpoint coordinator and its restart strategy."""

    def __init__(
        self,
        job_id: JobId,
        coordinator: cc.CheckpointCoordinator,
        restart_strategy: RestartStrategy,
        sources: Iterable[TaskId],
        *,
        resolution_deadline_s: float = RESOLUTION_DEADLINE_S,
    ) -> None:
        self._job_id = job_id
        self._coordinator = coordinator
        self._restart_strategy = restart_strategy
        self._sources = frozenset(sources)
        self._resolution_deadline_s = resolution_deadline_s
        self._state: LifecycleState = Created()
        self._attempt = 0  # the highest attempt used: deployments and resolutions
        self._deployed = 0  # the attempt the tasks were last deployed as (a resolution's attempt is above it)
        self._rescale_deploying = False  # a rescale's checkpoint completed; its attempt does not run yet

    # -- read-only views ----------------------------------------------------------------------------

    @property
    def state(self) -> LifecycleState:
        return self._state

    @property
    def status(self) -> JobStatus:
        return _status_of(self._state)

    @property
    def attempt(self) -> int:
        return self._attempt

    @property
    def coordinator(self) -> cc.CheckpointCoordinator:
        """For reads (stats, the store, orphans); every call that changes it goes through this machine."""
        return self._coordinator

    @property
    def restart_strategy(self) -> RestartStrategy:
        return self._restart_strategy

    @property
    def stop_request(self) -> StopRequest | None:
        return self._state.stop if isinstance(self._state, Running) else None

    @property
    def rescale_request(self) -> RescaleRequest | None:
        return self._state.rescale if isinstance(self._state, Running) else None

    @property
    def finishing(self) -> bool:
        """Every bounded source read all its input: the job finishes with its final checkpoint."""
        state = self._state
        if not isinstance(state, Running):
            return False
        return state.final_checkpoint is not None or state.final_completed or self._all_sources_ended(state)

    @property
    def rescale_deploying(self) -> bool:
        """A rescale's checkpoint completed and the job is being redeployed at the new parallelism."""
        return self._rescale_deploying

    @property
    def restart_at(self) -> float | None:
        return self._state.restart_at if isinstance(self._state, Restarting) else None

    @property
    def resolution(self) -> Resolution | None:
        match self._state:
            case Ending(resolution=resolution) | Ended(resolution=resolution):
                return resolution
            case Created() | Running() | Restarting():
                return None
            case _:
                assert_never(self._state)

    @property
    def unresolved_end(self) -> bool:
        """The job ended (or is ending) and its sinks are not resolved yet."""
        match self._state:
            case Ending():
                return True
            case Ended(resolution=resolution):
                return resolution is not None and not resolution.resolved
            case Created() | Running() | Restarting():
                return False
            case _:
                assert_never(self._state)

    def recorded_end(self) -> RecordedEnd | None:
        match self._state:
            case Ending(outcome=outcome, since=since, resolution=resolution):
                return RecordedEnd(outcome, False, since, resolution)
            case Ended(outcome=outcome, at=at, resolution=resolution):
                return RecordedEnd(outcome, True, at, resolution)
            case Created() | Running() | Restarting():
                return None
            case _:
                assert_never(self._state)

    def restart_due(self, now: float) -> bool:
        return isinstance(self._state, Restarting) and now >= self._state.restart_at

    # -- deployment ---------------------------------------------------------------------------------

    def restore_decision(self, now: float) -> cc.RestoreDecision:
        """What a new attempt restores (the coordinator's answer)."""
        return self._coordinator.restore_latest(now)

    def deploying(self, now: float) -> tuple[int, tuple[Action, ...]]:
        """A new attempt is placed (Created or Restarting → Running); answers its number."""
        if not isinstance(self._state, Created | Restarting):
            raise CheckpointProtocolError(f"job {self._job_id}: cannot deploy an attempt while {self.status.value}")
        before = self.status
        self._attempt += 1
        self._deployed = self._attempt
        self._state = Running(self._attempt)
        return self._attempt, (StatusChanged(before, JobStatus.RUNNING, f"attempt {self._attempt} deployed"),)

    def reserve_attempt(self) -> int:
        """An attempt number for a deployment's transaction resolution (a restore at another
        parallelism resolves the old subtasks' transactions first): above every attempt that ran,
        below the attempt deployed next."""
        if not isinstance(self._state, Created | Restarting):
            raise CheckpointProtocolError(f"job {self._job_id}: cannot reserve an attempt while {self.status.value}")
        self._attempt += 1
        return self._attempt

    def restart_later(self, at: float) -> tuple[Action, ...]:
        """The restart could not be placed now (no slots, a checkpoint still persisting): try at ``at``."""
        if isinstance(self._state, Restarting):
            self._state = replace(self._state, restart_at=at)
        return ()

    def replace(self, now: float, at: float, reason: str) -> tuple[Action, ...]:
        """The attempt never ran (its record was not written, a TaskManager turned out gone before
        anything was deployed): place it again at ``at``, without counting a restart."""
        if not isinstance(self._state, Running):
            return ()
        dropped = self._drop_rescale(f"the job restarts: {reason}")
        actions = self._absorb(now, self._coordinator.task_failed(now, min(self._sources), reason))
        self._state = Restarting(self._state.attempt, at)
        return (*dropped, *actions, StatusChanged(JobStatus.RUNNING, JobStatus.RESTARTING, reason))

    # -- task events (of the current attempt; the caller drops the others) --------------------------

    def tasks_running(self, now: float, tasks: Iterable[TaskId], *, restored: bool) -> tuple[Action, ...]:
        """Every task of the attempt runs: periodic checkpoints start (a rescale's attempt is done)."""
        if not isinstance(self._state, Running):
            return ()
        done: tuple[Action, ...] = ()
        if self._rescale_deploying:
            self._rescale_deploying = False
            done = (RescaleDeployed(),)
        if self._coordinator.is_running or self._state.final_completed:
            return done
        return (*done, *self._absorb(now, self._coordinator.start(now, tasks, self._sources, restored=restored)))

    def set_sources(self, sources: Iterable[TaskId]) -> None:
        """The job's source tasks after a rescale rebuilt its plan (while it restarts)."""
        if not isinstance(self._state, Created | Restarting):
            raise CheckpointProtocolError(f"job {self._job_id}: its sources change only while it restarts")
        self._sources = frozenset(sources)

    def source_ended(self, now: float, task: TaskId) -> tuple[Action, ...]:
        """A bounded source read all its input; once every source did, the next checkpoint is final."""
        state = self._state
        if not isinstance(state, Running) or task not in self._sources:
            return ()
        self._state = state = replace(state, sources_ended=state.sources_ended | {task})
        dropped: tuple[Action, ...] = ()
        if self._all_sources_ended(state) and state.rescale is not None and state.rescale.checkpoint_id is None:
            dropped = self._drop_rescale(f"job {self._job_id} read all its input: it finishes instead")
        return (*dropped, *self._trigger_final(now))

    def task_finished(self, now: float, task: TaskId, *, all_finished: bool) -> tuple[Action, ...]:
        """A task finished (after the final checkpoint); once every task did, the job is FINISHED."""
        if not isinstance(self._state, Running):
            return ()
        # A finished task takes part in no later checkpoint.
        actions = self._absorb(now, self._coordinator.stop(now, f"task {task} finished"))
        if not all_finished:
            return actions
        self._state = Ended(JobStatus.FINISHED, now)
        return (*actions, StatusChanged(JobStatus.RUNNING, JobStatus.FINISHED, "every task finished"))

    def task_failed(self, now: float, task: TaskId | None, failure: Failure) -> tuple[Action, ...]:
        """A task failed or its TaskManager was lost: restart after the strategy's delay, or fail the job."""
        state = self._state
        if not isinstance(state, Running):
            return ()
        culprit = task if task is not None else min(self._sources)
        actions = list(self._drop_rescale(f"the job failed: {failure.message}"))
        actions += self._absorb(now, self._coordinator.task_failed(now, culprit, failure.message))
        decision = self._restart_strategy.on_failure(now, failure)
        match decision:
            case RestartAfter(delay_s=delay_s):
                self._state = Restarting(state.attempt, now + delay_s)
                actions += (
                    CancelTasks(state.attempt),
                    StatusChanged(JobStatus.RUNNING, JobStatus.RESTARTING, failure.message),
                )
            case GiveUp(reason=reason):
                actions += self._end(now, JobStatus.FAILED, f"{failure.message} ({reason})")
            case _:
                assert_never(decision)
        return tuple(actions)

    # -- requests -----------------------------------------------------------------------------------

    def cancel(self, now: float) -> tuple[Action, ...]:
        """``weir cancel``: end the job CANCELED (a stop under way is cancelled with it)."""
        match self._state:
            case Created() | Restarting() | Running():
                return self._end(now, JobStatus.CANCELED, "cancelled")
            case Ending() | Ended():
                return ()
            case _:
                assert_never(self._state)

    def trigger_savepoint(self, now: float, *, stop: bool, drain: bool) -> tuple[CheckpointId, tuple[Action, ...]]:
        """A savepoint now (``weir savepoint``), or the one to stop at (``weir stop``); raises
        SavepointRejectedError when the job cannot take it."""
        state = self._state
        if not isinstance(state, Running):
            raise SavepointRejectedError(
                f"job {self._job_id} is {self.status.value}: a savepoint needs a RUNNING job", fault="user"
            )
        if state.stop is not None:
            raise SavepointRejectedError(
                f"job {self._job_id} is already stopping with savepoint {state.stop.savepoint_id}", fault="user"
            )
        if self._all_sources_ended(state):
            raise SavepointRejectedError(
                f"job {self._job_id} read all its input and is finishing with its final checkpoint", fault="user"
            )
        if state.rescale is not None:
            raise SavepointRejectedError(f"job {self._job_id} is being rescaled; try again once it runs", fault="user")
        if drain and not stop:
            raise SavepointRejectedError(f"job {self._job_id}: --drain applies to a stop-with-savepoint only")
        trigger = self._coordinator.trigger_savepoint(now)
        if not stop:
            return trigger.checkpoint_id, self._absorb(now, (trigger,))
        self._state = replace(state, stop=StopRequest(trigger.checkpoint_id, drain))
        # The stop is in the job record before its barrier goes out: a JobManager taking over ends the
        # job at the savepoint if it completed, rather than restart from it.
        return trigger.checkpoint_id, (SaveRecord(), *self._absorb(now, (replace(trigger, drain=drain),)))

    def trigger_rescale(self, now: float, parallelism: int) -> tuple[Action, ...]:
        """``weir rescale``: take a forced aligned checkpoint now (or as soon as the one in flight
        ended), then redeploy at ``parallelism`` from it; raises RescaleRejectedError when the job
        cannot be rescaled now (``weir.jobmanager.rescaling.decide_rescale`` refuses it first)."""
        state = self._state
        if not isinstance(state, Running):
            raise RescaleRejectedError(f"job {self._job_id} is {self.status.value}: only a RUNNING job can be rescaled")
        if state.rescale is not None or self._rescale_deploying:
            raise RescaleRejectedError(f"job {self._job_id} is already being rescaled")
        if state.stop is not None:
            raise RescaleRejectedError(f"job {self._job_id} is stopping with savepoint {state.stop.savepoint_id}")
        if state.final_checkpoint is not None or state.final_completed or self._all_sources_ended(state):
            raise RescaleRejectedError(
                f"job {self._job_id} read all its input and is finishing with its final checkpoint"
            )
        self._state = replace(state, rescale=RescaleRequest(parallelism))
        return self._trigger_rescale(now)

    def trigger_checkpoint(self, now: float, *, full: bool) -> tuple[CheckpointId, tuple[Action, ...]]:
        """A checkpoint now (``weir checkpoint``); raises CheckpointRejectedError when the job cannot
        take it. ``full`` (``--full``): its barriers tell every task's RocksDB snapshot to upload all
        its files anew, so it references no file of an earlier checkpoint."""
        state = self._state
        if not isinstance(state, Running):
            raise CheckpointRejectedError(
                f"job {self._job_id} is {self.status.value}: a checkpoint needs a RUNNING job", fault="user"
            )
        if state.stop is not None:
            raise CheckpointRejectedError(
                f"job {self._job_id} is stopping with savepoint {state.stop.savepoint_id}", fault="user"
            )
        if state.rescale is not None:
            raise CheckpointRejectedError(f"job {self._job_id} is being rescaled", fault="user")
        if state.final_checkpoint is not None or self._all_sources_ended(state):
            raise CheckpointRejectedError(
                f"job {self._job_id} read all its input and is finishing with its final checkpoint", fault="user"
            )
        trigger = self._coordinator.trigger_checkpoint(now, full=full)
        return trigger.checkpoint_id, self._absorb(now, (trigger,))

    # -- checkpoint events --------------------------------------------------------------------------

    def tick(self, now: float) -> tuple[Action, ...]:
        """Expire checkpoints; trigger a periodic (or the final) checkpoint when due; retry a resolution."""
        match self._state:
            case Running(stop=stop, final_checkpoint=final, final_completed=final_completed, rescale=rescale):
                # After every source ended the final checkpoint is the only one (sinks write nothing after it);
                # a rescale's checkpoint is the next one, and the last of this attempt.
                periodic = stop is None and final is None and not final_completed and rescale is None
                actions = self._absorb(now, self._coordinator.tick(now, periodic=periodic))
                return (*actions, *self._trigger_final(now), *self._trigger_rescale(now))
            case Ending() | Ended():
                return self._retry_resolution(now)
            case Created() | Restarting():
                return ()
            case _:
                assert_never(self._state)

    def receive_ack(
        self,
        now: float,
        checkpoint_id: CheckpointId,
        task: TaskId,
        handle: TaskStateHandle,
        metrics: TaskAckMetrics | None = None,
    ) -> AckOutcome:
        outcome = self._coordinator.receive_ack(now, checkpoint_id, task, handle, metrics)
        return AckOutcome(outcome.result, self._absorb(now, outcome.actions))

    def receive_decline(self, now: float, checkpoint_id: CheckpointId, task: TaskId, reason: str) -> tuple[Action, ...]:
        return self._absorb(now, self._coordinator.receive_decline(now, checkpoint_id, task, reason))

    def id_reservation_failed(self, now: float, checkpoint_id: CheckpointId, reason: str) -> tuple[Action, ...]:
        return self._absorb(now, self._coordinator.id_reservation_failed(now, checkpoint_id, reason))

    def checkpoint_persisted(self, now: float, checkpoint_id: CheckpointId) -> tuple[Action, ...]:
        """The checkpoint completed; an ending job waiting for it resolves its end as of it."""
        actions = self._absorb(now, self._coordinator.checkpoint_persisted(now, checkpoint_id))
        return (*actions, *self._start_resolution(now))

    def checkpoint_persist_failed(self, now: float, checkpoint_id: CheckpointId, reason: str) -> tuple[Action, ...]:
        actions = self._absorb(now, self._coordinator.checkpoint_persist_failed(now, checkpoint_id, reason))
        return (*actions, *self._start_resolution(now))

    # -- the end's resolution -----------------------------------------------------------------------

    def resolution_succeeded(self, now: float) -> tuple[Action, ...]:
        resolution = self.resolution
        if resolution is None or not resolution.running:
            return ()
        done = replace(resolution, running=False, resolved=True, error="", retry_at=None)
        match self._state:
            case Ending(outcome=outcome):
                self._state = Ended(outcome, now, done)
                return (StatusChanged(self.status_before_end(outcome), outcome, "sinks resolved"),)
            case Ended():
                self._state = replace(self._state, resolution=done)
                return (SaveRecord(),)
            case Created() | Running() | Restarting():
                return ()
            case _:
                assert_never(self._state)

    def resolution_failed(self, now: float, error: str) -> tuple[Action, ...]:
        resolution = self.resolution
        if resolution is None or not resolution.running:
            return ()
        delay = min(RESOLUTION_FIRST_DELAY_S * 2 ** (resolution.attempts - 1), RESOLUTION_MAX_DELAY_S)
        failed = replace(resolution, running=False, error=error, retry_at=now + delay)
        match self._state:
            case Ending(outcome=outcome, since=since):
                if now - since >= self._resolution_deadline_s:
                    self._state = Ended(outcome, now, failed)
                    return (
                        StatusChanged(
                            self.status_before_end(outcome), outcome, f"sinks not resolved (retried): {error}"
                        ),
                    )
                self._state = replace(self._state, resolution=failed)
                return ()
            case Ended():
                self._state = replace(self._state, resolution=failed)
                return (SaveRecord(),)
            case Created() | Running() | Restarting():
                return ()
            case _:
                assert_never(self._state)

    @staticmethod
    def status_before_end(outcome: JobStatus) -> JobStatus:
        return JobStatus.FAILED if outcome is JobStatus.FAILED else JobStatus.CANCELLING

    # -- a JobManager taking over -------------------------------------------------------------------

    def take_over(
        self,
        now: float,
        status: JobStatus,
        attempt: int,
        end: RecordedEnd | None,
        restart_at: float,
        stop: StopRequest | None = None,
    ) -> None:
        """Continue the job as its record left it (the coordinator was loaded with its checkpoints):
        a running one restarts at ``restart_at``, an ending one resolves its sinks again, an ended one
        whose end is unresolved retries it; a resolution that was under way is tried again. A running
        one whose stop's savepoint completed (its metadata written before the JobManager died) ends
        FINISHED as of it: restarting from a drained savepoint would go on from windows fired early."""
        self._attempt = self._deployed = attempt
        if end is not None:
            resolution = end.resolution
            if resolution is not None and not resolution.resolved:
                resolution = replace(resolution, running=False, retry_at=now)
            if end.ended:
                self._state = Ended(end.outcome, end.at, resolution)
            else:
                self._state = Ending(end.outcome, attempt, end.at, resolution)
            return
        if status is JobStatus.CANCELLING:  # a record without its end (an older Weir's)
            self._state = Ending(JobStatus.CANCELED, attempt, now)
        elif status.terminal:
            self._state = Ended(status, now)
        elif (
            stop is not None
            and (latest := self._coordinator.store.latest()) is not None
            and (latest.checkpoint_id == stop.savepoint_id)
        ):
            self._state = Ending(JobStatus.FINISHED, attempt, now)
        else:
            self._state = Restarting(attempt, restart_at)

    def legacy_unresolved(self, now: float) -> None:
        """An older record's ended job whose transactions were not resolved: resolve them now."""
        if isinstance(self._state, Ended):
            self._state = replace(self._state, resolution=Resolution(None, retry_at=now))

    # -- internals ----------------------------------------------------------------------------------

    def _end(self, now: float, outcome: JobStatus, reason: str) -> tuple[Action, ...]:
        """Stop triggering, abort what is pending; the resolution starts once nothing is persisting."""
        before = self.status
        dropped = self._drop_rescale(f"the job ended: {reason}", ending=True)
        match self._state:
            case Running(attempt=attempt) | Restarting(attempt=attempt):
                pass
            case Created():
                attempt = self._attempt
            case Ending() | Ended():
                return ()
            case _:
                assert_never(self._state)
        self._state = Ending(outcome, attempt, now)
        actions = [*dropped, *self._absorb(now, self._coordinator.stop(now, reason))]
        actions.append(StatusChanged(before, self.status, reason))
        actions.extend(self._start_resolution(now))
        return tuple(actions)

    def _start_resolution(self, now: float) -> tuple[Action, ...]:
        """An ending job whose resolution is not decided yet: decide it once no checkpoint persists."""
        state = self._state
        if not isinstance(state, Ending) or state.resolution is not None:
            return ()
        if self._coordinator.persisting_ids:
            return ()  # the persist's outcome decides which checkpoint the end is resolved as of
        latest = self._coordinator.store.latest()
        resolution = Resolution(latest.checkpoint_id if latest is not None else None)
        self._state = replace(state, resolution=resolution)
        return self._run_resolution(latest)

    def _retry_resolution(self, now: float) -> tuple[Action, ...]:
        resolution = self.resolution
        if resolution is None:
            return self._start_resolution(now)
        if resolution.resolved or resolution.running or resolution.retry_at is None or now < resolution.retry_at:
            return ()
        latest = self._coordinator.store.latest()
        if latest is not None and latest.checkpoint_id != resolution.as_of:
            # Only a taken-over record's legacy resolution has no checkpoint: use the latest.
            resolution = replace(resolution, as_of=latest.checkpoint_id)
        self._set_resolution(resolution)
        return self._run_resolution(latest)

    def _run_resolution(self, latest: CompletedCheckpoint | None) -> tuple[Action, ...]:
        resolution = self.resolution
        assert resolution is not None
        self._attempt += 1
        self._set_resolution(replace(resolution, attempts=resolution.attempts + 1, running=True, retry_at=None))
        match self._state:
            case Ending(outcome=outcome) | Ended(outcome=outcome):
                return (ResolveSinks(latest, self._attempt, outcome),)
            case Created() | Running() | Restarting():
                raise CheckpointProtocolError(f"job {self._job_id}: a resolution while {self.status.value}")
            case _:
                assert_never(self._state)

    def _set_resolution(self, resolution: Resolution) -> None:
        match self._state:
            case Ending() | Ended():
                self._state = replace(self._state, resolution=resolution)
            case Created() | Running() | Restarting():
                raise CheckpointProtocolError(f"job {self._job_id}: a resolution while {self.status.value}")
            case _:
                assert_never(self._state)

    def _trigger_final(self, now: float) -> tuple[Action, ...]:
        """Every source ended and no final checkpoint is under way: trigger one now if nothing is in
        flight (else the next checkpoint triggered is the final one, see ``_absorb``)."""
        state = self._state
        if not isinstance(state, Running) or not self._all_sources_ended(state) or state.stop is not None:
            return ()
        if state.final_checkpoint is not None or state.final_completed:
            return ()
        trigger = self._coordinator.trigger_now(now)
        return self._absorb(now, (trigger,)) if trigger is not None else ()

    def _trigger_rescale(self, now: float) -> tuple[Action, ...]:
        """A rescale waits for its checkpoint: trigger it now, forced aligned, unless one is in flight."""
        state = self._state
        if not isinstance(state, Running) or state.rescale is None or state.rescale.checkpoint_id is not None:
            return ()
        trigger = self._coordinator.trigger_now(now)
        if trigger is None:
            return ()
        self._state = replace(state, rescale=replace(state.rescale, checkpoint_id=trigger.checkpoint_id))
        return (*self._absorb(now, (replace(trigger, aligned=True),)), RescaleTriggered(trigger.checkpoint_id))

    def _drop_rescale(self, reason: str, *, ending: bool = False) -> tuple[Action, ...]:
        """The job fails over, or ``ending``: a rescale waiting for its checkpoint failed (nothing
        changed). One being redeployed goes on through failovers (the job is at the new parallelism
        already); only the job's end fails it."""
        state = self._state
        if isinstance(state, Running) and state.rescale is not None:
            self._state = replace(state, rescale=None)
            return (RescaleAborted(reason),)
        if ending and self._rescale_deploying:
            self._rescale_deploying = False
            return (RescaleAborted(reason),)
        return ()

    def _all_sources_ended(self, state: Running) -> bool:
        return bool(self._sources) and self._sources <= state.sources_ended

    def _absorb(self, now: float, actions: Iterable[cc.Action]) -> tuple[Action, ...]:
        """The coordinator's actions, with this machine's decisions about each checkpoint's outcome."""
        out: list[Action] = []
        for action in actions:
            match action:
                case cc.TriggerBarriers():
                    out.append(self._mark_final(action))
                case cc.NotifyComplete(checkpoint_id=checkpoint_id):
                    # To the tasks as they run: the end's resolution may take a newer attempt meanwhile.
                    out.append(replace(action, attempt=self._deployed))
                    out.extend(self._completed(now, checkpoint_id))
                case cc.NotifyAborted(checkpoint_id=checkpoint_id, reason=reason):
                    out.append(replace(action, attempt=self._deployed))
                    out.extend(self._aborted(now, checkpoint_id, reason.message))
                case cc.PersistCheckpoint() | cc.DeleteObjects():
                    out.append(action)
                case _:
                    assert_never(action)
        return tuple(out)

    def _mark_final(self, trigger: cc.TriggerBarriers) -> cc.TriggerBarriers:
        """The first checkpoint triggered after every source ended, periodic or not, is their final one
        (with a periodic checkpoint always in flight, an extra trigger would never get its turn)."""
        state = self._state
        if (
            isinstance(state, Running)
            and trigger.kind is CheckpointKind.CHECKPOINT
            and self._all_sources_ended(state)
            and state.final_checkpoint is None
            and not state.final_completed
        ):
            self._state = replace(state, final_checkpoint=trigger.checkpoint_id)
            return replace(trigger, final=True)
        return trigger

    def _completed(self, now: float, checkpoint_id: CheckpointId) -> tuple[Action, ...]:
        state = self._state
        if not isinstance(state, Running):
            return ()
        if state.stop is not None and state.stop.savepoint_id == checkpoint_id:
            # The savepoint the job stops at: nothing after it may commit (nothing was triggered after
            # it), and the end resolves the sinks as of it.
            return self._end(now, JobStatus.FINISHED, f"stopped with savepoint {checkpoint_id}")
        if state.final_checkpoint == checkpoint_id:
            self._state = replace(state, final_checkpoint=None, final_completed=True)
        if state.rescale is not None and state.rescale.checkpoint_id == checkpoint_id:
            # The sinks were just told to commit it; the tasks stop, and the job restarts at once at the
            # new parallelism from it (not a restart of the strategy's).
            parallelism = state.rescale.parallelism
            message = f"rescaling to parallelism {parallelism} from checkpoint {checkpoint_id}"
            self._state = replace(state, rescale=None)
            actions = self._absorb(now, self._coordinator.task_failed(now, min(self._sources), message))
            self._state = Restarting(state.attempt, now)
            self._rescale_deploying = True
            return (
                *actions,
                CancelTasks(state.attempt),
                Rescale(parallelism, checkpoint_id),
                StatusChanged(JobStatus.RUNNING, JobStatus.RESTARTING, message),
            )
        return ()

    def _aborted(self, now: float, checkpoint_id: CheckpointId, reason: str) -> tuple[Action, ...]:
        state = self._state
        if not isinstance(state, Running):
            return ()
        if state.final_checkpoint == checkpoint_id:
            self._state = state = replace(state, final_checkpoint=None)  # the next trigger is final
        if state.rescale is not None and state.rescale.checkpoint_id == checkpoint_id:
            # Its forced aligned barrier quiesced the tasks' processing-time timers (as a final
            # checkpoint's does): the attempt cannot go on as it was. It restarts from its latest
            # completed checkpoint at the parallelism it had (not a restart of the strategy's).
            message = (
                f"rescale to parallelism {state.rescale.parallelism} failed: its checkpoint {checkpoint_id} "
                f"aborted ({reason}); the job restarts from its latest completed checkpoint as it was"
            )
            self._state = replace(state, rescale=None)
            actions = self._absorb(now, self._coordinator.task_failed(now, min(self._sources), message))
            self._state = Restarting(state.attempt, now)
            return (
                RescaleAborted(message),
                *actions,
                CancelTasks(state.attempt),
                StatusChanged(JobStatus.RUNNING, JobStatus.RESTARTING, message),
            )
        if state.stop is None or state.stop.savepoint_id != checkpoint_id:
            return ()
        if not state.stop.drain:
            self._state = replace(state, stop=None)  # the job goes on as it was; periodic triggers resume
            return ()
        # --drain: the sources emitted the end of event time and stopped reading; the job restarts from
        # its latest completed checkpoint, as it was before the stop (not a restart of the strategy's).
        message = f"stop with --drain failed: savepoint {checkpoint_id} aborted ({reason})"
        actions = self._absorb(now, self._coordinator.task_failed(now, min(self._sources), message))
        self._state = Restarting(state.attempt, now)
        return (*actions, CancelTasks(state.attempt), StatusChanged(JobStatus.RUNNING, JobStatus.RESTARTING, message))
