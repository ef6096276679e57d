"""The JobManager's checkpoint coordinator: the protocol as a state machine that returns actions.

The coordinator does no I/O and holds no lock; the caller serializes calls and passes the time in.
Every method answers with action values (``TriggerBarriers``, ``PersistCheckpoint``, ``NotifyComplete``,
``NotifyAborted``, ``DeleteObjects``) that a thin I/O layer executes in order. Trigger decisions live in
``trigger``, acknowledgement tracking in ``pending``, retention in ``store``; statistics are kept by
``CheckpointStatsTracker`` below.

A fully acknowledged checkpoint is handed out as ``PersistCheckpoint``, one at a time and in id order.
The I/O layer writes the metadata object last and atomically, then calls ``checkpoint_persisted`` (or
``checkpoint_persist_failed`` when the metadata is surely not written). Only then is the checkpoint
completed: added to the store, tasks notified, subsumed objects deleted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from weir.core.checkpointing import CheckpointStatus, SubtaskCheckpointTimeline
from weir.core.ids import CheckpointId, JobId, TaskId
from weir.core.paths import CheckpointPaths
from weir.jobmanager.checkpointing.orphans import Orphans, StoredObject, find_orphans
from weir.jobmanager.checkpointing.pending import (
    AbortReason,
    AckResult,
    CheckpointKind,
    FailureKind,
    PendingCheckpoint,
    TaskAckMetrics,
    TaskStateHandle,
    checkpoint_size_bytes,
)
from weir.jobmanager.checkpointing.store import CompletedCheckpoint, CompletedCheckpointStore
from weir.jobmanager.checkpointing.trigger import (
    CheckpointConfig,
    CheckpointIdCounter,
    CheckpointTriggerDecider,
    TriggerLater,
    TriggerNow,
    TriggerState,
)
from weir.jobmanager.errors import CheckpointProtocolError, CheckpointRejectedError, SavepointRejectedError

MetadataKeyFn = Callable[[JobId, CheckpointId, CheckpointKind], str]
_ROOT_PATHS = CheckpointPaths()


def default_metadata_key(job_id: JobId, checkpoint_id: CheckpointId, kind: CheckpointKind) -> str:
    """``<job>/checkpoints/chk-<zero-padded id>/_metadata`` (``savepoints/sp-...`` for savepoints), as
    ``weir.core.paths`` names it at the storage's root."""
    return _ROOT_PATHS.metadata(job_id, checkpoint_id, kind)


# ---------------------------------------------------------------------------------------------------
# Actions for the I/O layer


@dataclass(frozen=True)
class TriggerBarriers:
    """Ask every source task to inject a barrier for this checkpoint."""

    checkpoint_id: CheckpointId
    timestamp: float
    source_tasks: tuple[TaskId, ...]
    kind: CheckpointKind
    reserve_ids_through: CheckpointId | None = None
    """Persist this id reservation before any barrier goes out (then ``ids_reserved`` or, if it
    failed, ``id_reservation_failed``); None: the id was reserved before."""
    final: bool = False
    """The job's final checkpoint: every source ended (set by ``weir.jobmanager.lifecycle``)."""
    drain: bool = False
    """A stop-with-savepoint --drain: the sources emit the end of event time first (set by the lifecycle)."""
    aligned: bool = False
    """Forced aligned in every mode: a rescale's checkpoint (set by the lifecycle)."""
    full: bool = False
    """A full checkpoint (``weir checkpoint --full``): its barriers tell every RocksDB snapshot to upload
    all its files anew, reusing none of an earlier checkpoint (Flink's FULL checkpoint type)."""


@dataclass(frozen=True)
class PersistCheckpoint:
    """Write the checkpoint's metadata (last, atomically), then call ``checkpoint_persisted``."""

    completed: CompletedCheckpoint


@dataclass(frozen=True)
class NotifyComplete:
    """Tell the tasks the checkpoint completed: two-phase sinks commit now."""

    checkpoint_id: CheckpointId
    tasks: tuple[TaskId, ...]
    kind: CheckpointKind
    attempt: int = 0
    """The deployment attempt the tasks run as (set by ``weir.jobmanager.lifecycle``)."""


@dataclass(frozen=True)
class NotifyAborted:
    """Tell the tasks the checkpoint was aborted: they drop its alignment and pending uploads."""

    checkpoint_id: CheckpointId
    tasks: tuple[TaskId, ...]
    reason: AbortReason
    kind: CheckpointKind
    attempt: int = 0
    """The deployment attempt the tasks run as (set by ``weir.jobmanager.lifecycle``)."""


@dataclass(frozen=True)
class DeleteObjects:
    """Delete ``metadata_keys`` first, then ``object_keys``; deleting a missing object is not an error."""

    metadata_keys: tuple[str, ...]
    object_keys: tuple[str, ...]


Action = TriggerBarriers | PersistCheckpoint | NotifyComplete | NotifyAborted | DeleteObjects


@dataclass(frozen=True)
class AckOutcome:
    result: AckResult
    actions: tuple[Action, ...] = ()


@dataclass(frozen=True)
class RestoreFrom:
    """Deploy the tasks with the states of this checkpoint."""

    checkpoint: CompletedCheckpoint


@dataclass(frozen=True)
class StartFresh:
    """No checkpoint was completed: deploy the tasks without state."""


@dataclass(frozen=True)
class WaitForPersist:
    """A checkpoint is being persisted; restore once ``checkpoint_persisted`` or ``..._failed`` is in."""

    checkpoint_ids: tuple[CheckpointId, ...]


RestoreDecision = RestoreFrom | StartFresh | WaitForPersist


# ---------------------------------------------------------------------------------------------------
# Statistics


@dataclass(frozen=True)
class TaskCheckpointStats:
    task_id: TaskId
    acked_at: float | None
    alignment_duration_s: float
    start_delay_s: float
    state_size_bytes: int
    sync_duration_s: float
    async_duration_s: float
    unaligned: bool = False
    inflight_bytes: int = 0
    timeline: SubtaskCheckpointTimeline | None = None  # the task's; ``acked_at`` ends it on the JobManager
    checkpointed_size_bytes: int = 0  # uploaded for this checkpoint: its state without the objects it reused


@dataclass(frozen=True)
class CheckpointSummary:
    """One checkpoint as ``weir checkpoints`` shows it; ``tasks``: those that acknowledged it,
    ``pending_tasks``: those that had not when it ended (or have not yet)."""

    checkpoint_id: CheckpointId
    kind: CheckpointKind
    status: CheckpointStatus
    trigger_timestamp: float
    end_timestamp: float | None
    acknowledged: int
    total_tasks: int
    state_size_bytes: int
    failure: AbortReason | None
    tasks: tuple[TaskCheckpointStats, ...]
    checkpointed_size_bytes: int = 0  # uploaded for it: ``state_size_bytes`` without the objects it reused
    pending_tasks: tuple[TaskId, ...] = ()
    full: bool = False  # a full checkpoint (``weir checkpoint --full``), also when read back from its metadata

    @property
    def duration_s(self) -> float | None:
        return None if self.end_timestamp is None else self.end_timestamp - self.trigger_timestamp


@dataclass(frozen=True)
class CheckpointStats:
    """A snapshot of the coordinator's counters and recent checkpoints, newest first."""

    triggered: int
    completed: int
    failed: int
    in_progress: int
    latest_completed: CheckpointSummary | None
    latest_failed: CheckpointSummary | None
    restored_from: CheckpointId | None
    restored_at: float | None
    history: tuple[CheckpointSummary, ...]
    restores: int = 0  # how many times the job's tasks were deployed to restore a checkpoint (this JobManager)


def _task_stats(pending: PendingCheckpoint) -> tuple[TaskCheckpointStats, ...]:
    out = []
    for task_id in sorted(pending.acks):
        ack = pending.acks[task_id]
        m: TaskAckMetrics = ack.metrics
        out.append(
            TaskCheckpointStats(
                task_id=task_id,
                acked_at=ack.acked_at,
                alignment_duration_s=m.alignment_duration_s,
                start_delay_s=m.start_delay_s,
                state_size_bytes=m.state_size_bytes,
                sync_duration_s=m.sync_duration_s,
                async_duration_s=m.async_duration_s,
                unaligned=m.unaligned,
                inflight_bytes=m.inflight_bytes,
                timeline=m.timeline,
                checkpointed_size_bytes=max(0, m.state_size_bytes - pending.states[task_id].reused_bytes),
            )
        )
    return tuple(out)


def _summarize(
    pending: PendingCheckpoint, status: CheckpointStatus, end: float | None, failure: AbortReason | None
) -> CheckpointSummary:
    return CheckpointSummary(
        checkpoint_id=pending.checkpoint_id,
        kind=pending.kind,
        status=status,
        trigger_timestamp=pending.trigger_timestamp,
        end_timestamp=end,
        acknowledged=pending.acknowledged_count,
        total_tasks=len(pending.tasks_to_ack),
        state_size_bytes=checkpoint_size_bytes(pending.states.values()),
        failure=failure,
        tasks=_task_stats(pending),
        checkpointed_size_bytes=sum(s.size_bytes - s.reused_bytes for s in pending.states.values()),
        pending_tasks=tuple(sorted(pending.not_yet_acknowledged)),
        full=pending.full,
    )


class CheckpointStatsTracker:
    """Counts and remembers the last ``history_size`` ended checkpoints."""

    def __init__(self, history_size: int = 20) -> None:
        self._history: deque[CheckpointSummary] = deque(maxlen=history_size)
        self._triggered = 0
        self._completed = 0
        self._failed = 0
        self._latest_completed: CheckpointSummary | None = None
        self._latest_failed: CheckpointSummary | None = None
        self._restored_from: CheckpointId | None = None
        self._restored_at: float | None = None
        self._restores = 0

    @property
    def latest_completed(self) -> CheckpointSummary | None:
        return self._latest_completed

    def on_triggered(self) -> None:
        self._triggered += 1

    def on_completed(self, pending: PendingCheckpoint, now: float) -> None:
        self._completed += 1
        summary = _summarize(pending, CheckpointStatus.COMPLETED, now, None)
        self._latest_completed = summary
        self._history.appendleft(summary)

    def on_failed(self, pending: PendingCheckpoint, reason: AbortReason, now: float) -> None:
        self._failed += 1
        summary = _summarize(pending, CheckpointStatus.FAILED, now, reason)
        self._latest_failed = summary
        self._history.appendleft(summary)

    def on_restored(self, checkpoint_id: CheckpointId | None, now: float) -> None:
        self._restored_from = checkpoint_id
        self._restored_at = now
        if checkpoint_id is not None:
            self._restores += 1

    def snapshot(self, in_flight: Iterable[PendingCheckpoint]) -> CheckpointStats:
        live = sorted(in_flight, key=lambda p: p.checkpoint_id, reverse=True)
        current = tuple(_summarize(p, CheckpointStatus.IN_PROGRESS, None, None) for p in live)
        return CheckpointStats(
            triggered=self._triggered,
            completed=self._completed,
            failed=self._failed,
            in_progress=len(current),
            latest_completed=self._latest_completed,
            latest_failed=self._latest_failed,
            restored_from=self._restored_from,
            restored_at=self._restored_at,
            history=current + tuple(self._history),
            restores=self._restores,
        )


# ---------------------------------------------------------------------------------------------------
# The coordinator


@dataclass(frozen=True)
class _Persisting:
    completed: CompletedCheckpoint
    pending: PendingCheckpoint
    keys: frozenset[str]  # ``completed.object_keys``, taken once


class CheckpointCoordinator:
    """Triggers, tracks, completes and aborts the checkpoints of one job."""

    def __init__(
        self,
        job_id: JobId,
        config: CheckpointConfig,
        store: CompletedCheckpointStore,
        *,
        counter: CheckpointIdCounter | None = None,
        metadata_key: MetadataKeyFn = default_metadata_key,
        remembered_ids: int = 64,
        stats_history: int = 20,
    ) -> None:
        self._job_id = job_id
        self._config = config
        self._store = store
        self._counter = counter if counter is not None else CheckpointIdCounter()
        self._decider = CheckpointTriggerDecider(config, self._counter)
        self._metadata_key = metadata_key
        self._stats = CheckpointStatsTracker(stats_history)

        self._running = False
        self._tasks: frozenset[TaskId] = frozenset()
        self._sources: tuple[TaskId, ...] = ()
        self._schedule_origin = 0.0
        self._restored = False
        self._last_periodic_trigger_at: float | None = None
        self._last_end_at: float | None = None

        self._pending: dict[CheckpointId, PendingCheckpoint] = {}
        self._persisting: dict[CheckpointId, _Persisting] = {}
        self._persist_in_flight: CheckpointId | None = None
        self._recently_ended: deque[CheckpointId] = deque(maxlen=remembered_ids)
        self._deferred_deletes: set[str] = set()

    # -- read-only views ----------------------------------------------------------------------------

    @property
    def job_id(self) -> JobId:
        return self._job_id

    @property
    def store(self) -> CompletedCheckpointStore:
        return self._store

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def pending_ids(self) -> tuple[CheckpointId, ...]:
        """Checkpoints waiting for acknowledgements, oldest first."""
        return tuple(sorted(self._pending))

    @property
    def persisting_ids(self) -> tuple[CheckpointId, ...]:
        """Fully acknowledged checkpoints whose metadata is not yet persisted, oldest first."""
        return tuple(sorted(self._persisting))

    @property
    def in_flight_count(self) -> int:
        return len(self._pending) + len(self._persisting)

    @property
    def deferred_deletes(self) -> frozenset[str]:
        """Released keys still referenced by a checkpoint in flight; deleted once it ends."""
        return frozenset(self._deferred_deletes)

    def pending(self, checkpoint_id: CheckpointId) -> PendingCheckpoint | None:
        return self._pending.get(checkpoint_id)

    @property
    def latest_completed(self) -> CheckpointSummary | None:
        """The stats of the checkpoint ``checkpoint_persisted`` completed last, with its tasks' acks."""
        return self._stats.latest_completed

    def stats(self) -> CheckpointStats:
        return self._stats.snapshot([*self._pending.values(), *(p.pending for p in self._persisting.values())])

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(
        self, now: float, tasks: Iterable[TaskId], source_tasks: Iterable[TaskId], *, restored: bool = False
    ) -> tuple[Action, ...]:
        """The job's tasks are running: periodic checkpoints start one interval from ``now``, or at
        ``now`` when the tasks ``restored`` state (``TriggerState.restored``)."""
        task_set = frozenset(tasks)
        sources = tuple(sorted(set(source_tasks)))
        if not sources:
            raise CheckpointProtocolError(f"job {self._job_id}: checkpoints need at least one source task")
        if not task_set.issuperset(sources):
            raise CheckpointProtocolError(f"job {self._job_id}: every source task must be one of the tasks")
        redeployed = AbortReason(FailureKind.JOB_STOPPED, "the job's tasks were redeployed")
        actions = self._abort_all(now, redeployed)
        self._tasks = task_set
        self._sources = sources
        self._running = True
        self._schedule_origin = now
        self._restored = restored
        return actions

    def stop(self, now: float, reason: str) -> tuple[Action, ...]:
        """The job was cancelled or finished: abort what is pending; persisting checkpoints still complete."""
        self._running = False
        return self._abort_all(now, AbortReason(FailureKind.JOB_STOPPED, reason))

    def task_failed(self, now: float, task_id: TaskId, cause: str = "") -> tuple[Action, ...]:
        """A task failed: abort every pending checkpoint and stop triggering until ``start``.

        The I/O layer drops failure reports of earlier execution attempts before calling this.
        """
        self._running = False
        message = f"task {task_id} failed" + (f": {cause}" if cause else "")
        return self._abort_all(now, AbortReason(FailureKind.TASK_FAILURE, message, task_id))

    # -- triggering ---------------------------------------------------------------------------------

    def tick(self, now: float, *, periodic: bool = True) -> tuple[Action, ...]:
        """Abort expired checkpoints, then trigger a periodic checkpoint if one is due and ``periodic``
        (the job's lifecycle turns periodic triggers off while a stop-with-savepoint is under way and
        once the final checkpoint completed, as Flink stops its checkpoint scheduler)."""
        actions: list[Action] = []
        for pending in sorted(self._pending.values(), key=lambda p: p.checkpoint_id):
            if now >= pending.deadline(self._config.timeout_s):
                reason = AbortReason(
                    FailureKind.EXPIRED,
                    f"not acknowledged by {len(pending.not_yet_acknowledged)} task(s) within "
                    f"{self._config.timeout_s:g}s",
                )
                actions.extend(self._abort(now, pending, reason))
        if not periodic:
            return tuple(actions)
        decision = self._decider.decide(now, self._trigger_state())
        if isinstance(decision, TriggerNow):
            actions.append(self._trigger(now, CheckpointKind.CHECKPOINT))
            self._last_periodic_trigger_at = now
        return tuple(actions)

    def next_tick_at(self, now: float) -> float | None:
        """When ``tick`` next has something to do (a trigger or a timeout); ``None``: nothing scheduled."""
        candidates = [p.deadline(self._config.timeout_s) for p in self._pending.values()]
        decision = self._decider.decide(now, self._trigger_state())
        if isinstance(decision, TriggerNow):
            candidates.append(now)
        elif isinstance(decision, TriggerLater):
            candidates.append(decision.at)
        return min(candidates) if candidates else None

    def trigger_savepoint(self, now: float) -> TriggerBarriers:
        """Start a savepoint now, regardless of the interval, pause and concurrency limits."""
        if not self._running:
            raise SavepointRejectedError(
                f"job {self._job_id} is not running; trigger the savepoint once its tasks run", fault="user"
            )
        busy = [p.checkpoint_id for p in self._in_flight() if p.is_savepoint]
        if busy:
            raise SavepointRejectedError(
                f"job {self._job_id}: savepoint {busy[0]} is still in progress; wait for it to end"
            )
        return self._trigger(now, CheckpointKind.SAVEPOINT)

    def trigger_checkpoint(self, now: float, *, full: bool = False) -> TriggerBarriers:
        """A checkpoint on request (Flink's ``flink checkpoint``): now, regardless of the interval and
        the pause, but never beside another one in flight (its barriers would queue behind them).
        ``full``: a full checkpoint (Flink's ``-full``), which references no file of an earlier one."""
        if not self._running:
            raise CheckpointRejectedError(
                f"job {self._job_id} is not running; trigger the checkpoint once its tasks run", fault="user"
            )
        busy = [p.checkpoint_id for p in self._in_flight()]
        if busy:
            raise CheckpointRejectedError(
                f"job {self._job_id}: checkpoint {busy[0]} is still in progress; try again once it ended"
            )
        return self._trigger(now, CheckpointKind.CHECKPOINT, full=full)

    def trigger_now(self, now: float) -> TriggerBarriers | None:
        """A checkpoint now, outside the interval (e.g. the final one once every bounded source ended);
        None while the job is not running or another checkpoint is in flight (call again later)."""
        if not self._running or self.in_flight_count > 0:
            return None
        return self._trigger(now, CheckpointKind.CHECKPOINT)

    def _trigger(self, now: float, kind: CheckpointKind, *, full: bool = False) -> TriggerBarriers:
        checkpoint_id, reserve_through = self._counter.next()
        self._pending[checkpoint_id] = PendingCheckpoint(checkpoint_id, now, self._tasks, kind, full=full)
        self._stats.on_triggered()
        return TriggerBarriers(checkpoint_id, now, self._sources, kind, reserve_through, full=full)

    @property
    def ids_reserved_through(self) -> CheckpointId:
        """The highest checkpoint id reserved: the job record persists it."""
        return self._counter.reserved_through

    def id_reservation_failed(self, now: float, checkpoint_id: CheckpointId, reason: str) -> tuple[Action, ...]:
        """The id reservation of ``checkpoint_id`` could not be persisted: no barrier went out; the
        checkpoint aborts and the next trigger reserves again."""
        self._counter.reservation_failed(checkpoint_id)
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            return ()
        reason_value = AbortReason(FailureKind.ID_NOT_RESERVED, f"checkpoint id not reserved: {reason}")
        return self._abort(now, pending, reason_value)

    def _trigger_state(self) -> TriggerState:
        return TriggerState(
            running=self._running,
            in_flight=self.in_flight_count,
            savepoint_in_flight=any(p.is_savepoint for p in self._in_flight()),
            schedule_origin=self._schedule_origin,
            last_periodic_trigger_at=self._last_periodic_trigger_at,
            last_end_at=self._last_end_at,
            restored=self._restored,
        )

    def _in_flight(self) -> list[PendingCheckpoint]:
        return [*self._pending.values(), *(p.pending for p in self._persisting.values())]

    # -- messages from tasks ------------------------------------------------------------------------

    def receive_ack(
        self,
        now: float,
        checkpoint_id: CheckpointId,
        task_id: TaskId,
        state_handle: TaskStateHandle,
        metrics: TaskAckMetrics | None = None,
    ) -> AckOutcome:
        """A task acknowledged a checkpoint with its state handle."""
        if state_handle.task_id != task_id:
            raise CheckpointProtocolError(
                f"checkpoint {checkpoint_id}: task {task_id} sent the state handle of {state_handle.task_id}"
            )
        pending = self._pending.get(checkpoint_id)
        if pending is None:
            if checkpoint_id in self._persisting or checkpoint_id in self._recently_ended:
                # The late snapshot belongs to nothing retained: drop what only it references.
                return AckOutcome(AckResult.DISCARDED, self._release(state_handle.object_keys))
            return AckOutcome(AckResult.UNKNOWN)
        if pending.awaits(task_id):
            # Only this snapshot's reused keys are looked up, never the set of every live key: one
            # ack's cost stays that of its own state handle, whatever the job's size (as in Flink's
            # PendingCheckpoint.acknowledgeTask).
            released = sorted(k for k in state_handle.reused_keys if not self._is_live(k))
            if released:
                reason = AbortReason(
                    FailureKind.RELEASED_STATE,
                    f"the snapshot reuses {len(released)} object(s) already released, e.g. {released[0]!r}; "
                    "the task must upload them again",
                    task_id,
                )
                actions = self._abort(now, pending, reason) + self._release(state_handle.object_keys)
                return AckOutcome(AckResult.DISCARDED, actions)
        result = pending.acknowledge(task_id, state_handle, metrics, acked_at=now)
        if result is AckResult.SUCCESS and pending.is_fully_acknowledged:
            return AckOutcome(result, self._finalize(now, pending))
        return AckOutcome(result)

    def receive_decline(
        self, now: float, checkpoint_id: CheckpointId, task_id: TaskId, reason: str
    ) -> tuple[Action, ...]:
        """A task could not take part in a checkpoint: abort it (late declines are ignored)."""
        pending = self._pending.get(checkpoint_id)
        if pending is None or task_id not in pending.tasks_to_ack:
            return ()
        return self._abort(now, pending, AbortReason(FailureKind.DECLINED, reason, task_id))

    # -- completion ---------------------------------------------------------------------------------

    def _finalize(self, now: float, pending: PendingCheckpoint) -> tuple[Action, ...]:
        states = pending.finalize()
        del self._pending[pending.checkpoint_id]
        completed = CompletedCheckpoint(
            checkpoint_id=pending.checkpoint_id,
            job_id=self._job_id,
            trigger_timestamp=pending.trigger_timestamp,
            completion_timestamp=now,
            task_states=states,
            metadata_key=self._metadata_key(self._job_id, pending.checkpoint_id, pending.kind),
            kind=pending.kind,
            full=pending.full,
        )
        self._persisting[pending.checkpoint_id] = _Persisting(completed, pending, completed.object_keys)
        actions: list[Action] = []
        for older in sorted(self._pending.values(), key=lambda p: p.checkpoint_id):
            if older.checkpoint_id < pending.checkpoint_id:
                reason = AbortReason(FailureKind.SUBSUMED, f"checkpoint {pending.checkpoint_id} completed first")
                actions.extend(self._abort(now, older, reason))
        actions.extend(self._next_persist())
        return tuple(actions)

    def _next_persist(self) -> tuple[Action, ...]:
        if self._persist_in_flight is not None or not self._persisting:
            return ()
        self._persist_in_flight = min(self._persisting)
        return (PersistCheckpoint(self._persisting[self._persist_in_flight].completed),)

    def _take_persisting(self, checkpoint_id: CheckpointId) -> _Persisting:
        if checkpoint_id != self._persist_in_flight:
            raise CheckpointProtocolError(
                f"job {self._job_id}: checkpoint {checkpoint_id} is not being persisted "
                f"(in flight: {self._persist_in_flight})"
            )
        self._persist_in_flight = None
        return self._persisting.pop(checkpoint_id)

    def checkpoint_persisted(self, now: float, checkpoint_id: CheckpointId) -> tuple[Action, ...]:
        """The metadata of ``checkpoint_id`` is durably written: the checkpoint is complete."""
        entry = self._take_persisting(checkpoint_id)
        completed = entry.completed
        added = self._store.add(completed)
        self._ended(now, checkpoint_id)
        self._stats.on_completed(entry.pending, now)
        actions: list[Action] = [NotifyComplete(checkpoint_id, tuple(sorted(completed.tasks)), completed.kind)]
        actions.extend(self._release(added.unreferenced_keys, metadata_keys=[c.metadata_key for c in added.subsumed]))
        actions.extend(self._next_persist())
        return tuple(actions)

    def checkpoint_persist_failed(self, now: float, checkpoint_id: CheckpointId, reason: str) -> tuple[Action, ...]:
        """The metadata of ``checkpoint_id`` could not be written: abort it and drop its objects."""
        entry = self._take_persisting(checkpoint_id)
        abort = AbortReason(FailureKind.PERSIST_FAILED, reason)
        self._ended(now, checkpoint_id)
        self._stats.on_failed(entry.pending, abort, now)
        actions: list[Action] = [
            NotifyAborted(checkpoint_id, tuple(sorted(entry.completed.tasks)), abort, entry.completed.kind)
        ]
        completed = entry.completed
        actions.extend(self._release(completed.object_keys, metadata_keys=[completed.metadata_key]))
        actions.extend(self._next_persist())
        return tuple(actions)

    # -- aborting -----------------------------------------------------------------------------------

    def _abort_all(self, now: float, reason: AbortReason) -> tuple[Action, ...]:
        actions: list[Action] = []
        for pending in sorted(self._pending.values(), key=lambda p: p.checkpoint_id):
            actions.extend(self._abort(now, pending, reason))
        return tuple(actions)

    def _abort(self, now: float, pending: PendingCheckpoint, reason: AbortReason) -> tuple[Action, ...]:
        pending.abort(reason)
        del self._pending[pending.checkpoint_id]
        self._ended(now, pending.checkpoint_id)
        self._stats.on_failed(pending, reason, now)
        tasks = tuple(sorted(pending.tasks_to_ack))
        notify = NotifyAborted(pending.checkpoint_id, tasks, reason, pending.kind)
        return (notify, *self._release(pending.referenced_keys()))

    def _ended(self, now: float, checkpoint_id: CheckpointId) -> None:
        self._recently_ended.append(checkpoint_id)
        self._last_end_at = now

    # -- object release -----------------------------------------------------------------------------

    def _in_flight_keys(self) -> set[str]:
        keys: set[str] = set()
        for p in self._pending.values():
            keys |= p.referenced_keys()
        for entry in self._persisting.values():
            keys |= entry.keys
        return keys

    def _live_keys(self) -> set[str]:
        """Keys not deleted: referenced by a retained or in-flight checkpoint, or waiting to be deleted."""
        return self._in_flight_keys() | self._deferred_deletes | self._store.referenced_keys()

    def _is_live(self, key: str) -> bool:
        """``key in self._live_keys()``, answered without building that set."""
        return (
            key in self._deferred_deletes
            or self._store.is_referenced(key)
            or any(p.references(key) for p in self._pending.values())
            or any(key in entry.keys for entry in self._persisting.values())
        )

    def _release(self, candidates: Iterable[str], metadata_keys: Iterable[str] = ()) -> tuple[Action, ...]:
        """Delete the candidate and deferred keys that nothing retained or in flight references."""
        in_flight = self._in_flight_keys()
        keys = {k for k in (*candidates, *self._deferred_deletes) if not self._store.is_referenced(k)}
        self._deferred_deletes = keys & in_flight
        deletable = tuple(sorted(keys - in_flight))
        metadata = tuple(sorted(metadata_keys))
        if not deletable and not metadata:
            return ()
        return (DeleteObjects(metadata, deletable),)

    def find_orphans(self, paths: CheckpointPaths, listing: Iterable[StoredObject]) -> Orphans:
        """Which objects of this job's folder (``listing``) nothing retained or in flight needs:
        uploads of checkpoints that never completed (see ``weir.jobmanager.checkpointing.orphans``)."""
        in_flight = (*self._pending, *self._persisting)
        return find_orphans(paths, self._job_id, listing, self._store.all(), in_flight, self._live_keys())

    # -- recovery -----------------------------------------------------------------------------------

    def restore_latest(self, now: float) -> RestoreDecision:
        """What to deploy the tasks with after a failure; ids continue after the restored checkpoint."""
        if self._running or self._pending:
            raise CheckpointProtocolError(
                f"job {self._job_id}: call task_failed or stop before restoring (pending: {self.pending_ids})"
            )
        if self._persisting:
            return WaitForPersist(self.persisting_ids)
        latest = self._store.latest()
        self._stats.on_restored(latest.checkpoint_id if latest is not None else None, now)
        if latest is None:
            return StartFresh()
        self._counter.restore_after(latest.checkpoint_id)
        return RestoreFrom(latest)

    def load_completed(
        self, checkpoints: Iterable[CompletedCheckpoint], highest_seen_id: CheckpointId | None = None
    ) -> tuple[Action, ...]:
        """Fill a fresh coordinator with the checkpoints listed from storage (JobManager restart).

        Retention applies as they are added; the answer deletes what it subsumes. ``highest_seen_id``
        (e.g. the highest id found in storage) keeps ids of aborted checkpoints from being reused.
        """
        if self._pending or self._persisting or self._store.all():
            raise CheckpointProtocolError(f"job {self._job_id}: load_completed needs a fresh coordinator")
        subsumed_keys: set[str] = set()
        subsumed_metadata: list[str] = []
        for checkpoint in sorted(checkpoints, key=lambda c: c.checkpoint_id):
            if checkpoint.job_id != self._job_id:
                raise CheckpointProtocolError(
                    f"checkpoint {checkpoint.checkpoint_id} belongs to job {checkpoint.job_id}, not {self._job_id}"
                )
            added = self._store.add(checkpoint)
            subsumed_keys |= added.unreferenced_keys
            subsumed_metadata.extend(c.metadata_key for c in added.subsumed)
            self._counter.restore_after(checkpoint.checkpoint_id)
            self._recently_ended.append(checkpoint.checkpoint_id)
        if highest_seen_id is not None:
            self._counter.restore_after(highest_seen_id)
        return self._release(subsumed_keys, metadata_keys=subsumed_metadata)
