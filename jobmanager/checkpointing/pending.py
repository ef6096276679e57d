"""One checkpoint in flight: which tasks still have to acknowledge it, and what they sent.

A ``PendingCheckpoint`` is a plain object without I/O; the coordinator creates it when it triggers
barriers and finalizes or aborts it. Acknowledgements answer with an ``AckResult`` instead of raising,
because late and duplicate acks are a normal part of the protocol.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from weir.core.checkpointing import CheckpointKind, SubtaskCheckpointTimeline
from weir.core.ids import CheckpointId, TaskId
from weir.jobmanager.errors import CheckpointProtocolError


class AckResult(enum.Enum):
    """How a pending checkpoint took one acknowledgement."""

    SUCCESS = "success"
    DUPLICATE = "duplicate"  # the task had already acknowledged this checkpoint
    UNKNOWN = "unknown"  # the task, or the checkpoint id, is not part of any checkpoint we know
    DISCARDED = "discarded"  # the checkpoint existed but already completed or was aborted


class PendingStatus(enum.Enum):
    IN_PROGRESS = "in_progress"
    FINALIZED = "finalized"
    ABORTED = "aborted"


class FailureKind(enum.Enum):
    """Why a checkpoint was aborted."""

    DECLINED = "declined"  # a task declined it (e.g. it could not snapshot)
    EXPIRED = "expired"  # not fully acknowledged before the timeout
    TASK_FAILURE = "task_failure"  # a task of the job failed while it was in flight
    SUBSUMED = "subsumed"  # a newer checkpoint completed first
    PERSIST_FAILED = "persist_failed"  # the metadata could not be written
    RELEASED_STATE = "released_state"  # a task reused an object that was already released
    JOB_STOPPED = "job_stopped"  # the job was cancelled or finished
    ID_NOT_RESERVED = "id_not_reserved"  # the checkpoint id reservation could not be persisted


@dataclass(frozen=True)
class AbortReason:
    kind: FailureKind
    message: str
    task_id: TaskId | None = None

    def __str__(self) -> str:
        where = f" (task {self.task_id})" if self.task_id is not None else ""
        return f"{self.kind.value}{where}: {self.message}"


@dataclass(frozen=True, order=True)
class StateObject:
    """One object in the checkpoint storage that a task's snapshot references.

    ``reused`` marks an object uploaded for an earlier, completed checkpoint (an incremental snapshot
    sharing a file); the others were uploaded for this checkpoint.
    """

    key: str
    size_bytes: int
    reused: bool = False

    def __post_init__(self) -> None:
        if not self.key:
            raise CheckpointProtocolError("a state object needs a non-empty key")
        if self.size_bytes < 0:
            raise CheckpointProtocolError(f"state object {self.key!r} has a negative size {self.size_bytes}")


@dataclass(frozen=True)
class TaskStateHandle:
    """What one task snapshotted for one checkpoint; opaque to the JobManager except for its keys.

    ``objects`` may include keys uploaded for earlier checkpoints (incremental snapshots share files),
    marked ``reused``: only keys of a checkpoint the task was told completed (or restored from). A
    reused key the JobManager already released makes the checkpoint abort. ``inline_payload`` carries
    small state such as source offsets; ``sink_precommit`` what a two-phase sink needs to commit (or
    re-commit on recovery).
    """

    task_id: TaskId
    objects: tuple[StateObject, ...] = ()
    inline_payload: bytes = b""
    sink_precommit: bytes = b""

    def __post_init__(self) -> None:
        keys = [o.key for o in self.objects]
        if len(set(keys)) != len(keys):
            raise CheckpointProtocolError(f"state handle of task {self.task_id} lists an object key twice")

    @property
    def object_keys(self) -> frozenset[str]:
        return frozenset(o.key for o in self.objects)

    @property
    def reused_keys(self) -> frozenset[str]:
        return frozenset(o.key for o in self.objects if o.reused)

    @property
    def size_bytes(self) -> int:
        return sum(o.size_bytes for o in self.objects) + len(self.inline_payload) + len(self.sink_precommit)

    @property
    def reused_bytes(self) -> int:
        """The bytes of the objects an earlier checkpoint uploaded (Flink's state size minus its
        checkpointed size)."""
        return sum(o.size_bytes for o in self.objects if o.reused)


def checkpoint_size_bytes(states: Iterable[TaskStateHandle]) -> int:
    """What the tasks' snapshots hold together: each object once, however many tasks reference it (a
    broadcast state's object is shared by the subtasks with the same copy), and each inline payload."""
    states = tuple(states)
    objects = {o.key: o.size_bytes for s in states for o in s.objects}
    return sum(objects.values()) + sum(len(s.inline_payload) + len(s.sink_precommit) for s in states)


@dataclass(frozen=True)
class TaskAckMetrics:
    """What a task reports with its acknowledgement; durations in seconds (as on the wire), and where
    its part of the checkpoint spent its time (None: the task sent no timeline)."""

    alignment_duration_s: float = 0.0
    start_delay_s: float = 0.0
    state_size_bytes: int = 0
    sync_duration_s: float = 0.0
    async_duration_s: float = 0.0
    unaligned: bool = False  # the task persisted in-flight records
    inflight_bytes: int = 0
    timeline: SubtaskCheckpointTimeline | None = None


@dataclass(frozen=True)
class TaskAck:
    """One acknowledgement as recorded: the metrics, and when it arrived (``None``: not given)."""

    metrics: TaskAckMetrics
    acked_at: float | None


class PendingCheckpoint:
    """Tracks the acknowledgements of one triggered checkpoint or savepoint."""

    def __init__(
        self,
        checkpoint_id: CheckpointId,
        trigger_timestamp: float,
        tasks_to_ack: Iterable[TaskId],
        kind: CheckpointKind = CheckpointKind.CHECKPOINT,
        *,
        full: bool = False,
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.trigger_timestamp = trigger_timestamp
        self.kind = kind
        self.full = full  # a full checkpoint: its snapshots reuse no file of an earlier checkpoint
        self._tasks_to_ack: frozenset[TaskId] = frozenset(tasks_to_ack)
        if not self._tasks_to_ack:
            raise CheckpointProtocolError(f"checkpoint {checkpoint_id} has no task to acknowledge it")
        self._not_yet_acked: set[TaskId] = set(self._tasks_to_ack)
        self._states: dict[TaskId, TaskStateHandle] = {}
        self._referenced: set[str] = set()  # the object keys of ``_states``, kept as acks come in
        self._acks: dict[TaskId, TaskAck] = {}
        self._status = PendingStatus.IN_PROGRESS
        self._abort_reason: AbortReason | None = None

    @property
    def status(self) -> PendingStatus:
        return self._status

    @property
    def is_savepoint(self) -> bool:
        return self.kind is CheckpointKind.SAVEPOINT

    @property
    def tasks_to_ack(self) -> frozenset[TaskId]:
        return self._tasks_to_ack

    @property
    def not_yet_acknowledged(self) -> frozenset[TaskId]:
        return frozenset(self._not_yet_acked)

    def awaits(self, task_id: TaskId) -> bool:
        """Whether ``task_id`` is still to acknowledge (``not_yet_acknowledged`` without the copy)."""
        return task_id in self._not_yet_acked

    @property
    def acknowledged_count(self) -> int:
        return len(self._states)

    @property
    def is_fully_acknowledged(self) -> bool:
        return self._status is PendingStatus.IN_PROGRESS and not self._not_yet_acked

    @property
    def is_discarded(self) -> bool:
        return self._status is not PendingStatus.IN_PROGRESS

    @property
    def abort_reason(self) -> AbortReason | None:
        return self._abort_reason

    @property
    def states(self) -> Mapping[TaskId, TaskStateHandle]:
        """The state handles received so far, by task."""
        return MappingProxyType(self._states)

    @property
    def acks(self) -> Mapping[TaskId, TaskAck]:
        """Per-task acknowledgement metrics received so far."""
        return MappingProxyType(self._acks)

    def referenced_keys(self) -> frozenset[str]:
        """Object keys referenced by the state handles received so far."""
        return frozenset(self._referenced)

    def references(self, key: str) -> bool:
        """Whether a state handle received so far references ``key`` (one lookup, not the whole set)."""
        return key in self._referenced

    def deadline(self, timeout_s: float) -> float:
        return self.trigger_timestamp + timeout_s

    def acknowledge(
        self,
        task_id: TaskId,
        state_handle: TaskStateHandle,
        metrics: TaskAckMetrics | None = None,
        *,
        acked_at: float | None = None,
    ) -> AckResult:
        """Record one task's acknowledgement."""
        if state_handle.task_id != task_id:
            raise CheckpointProtocolError(
                f"checkpoint {self.checkpoint_id}: task {task_id} sent the state handle of {state_handle.task_id}"
            )
        if self._status is not PendingStatus.IN_PROGRESS:
            return AckResult.DISCARDED
        if task_id not in self._tasks_to_ack:
            return AckResult.UNKNOWN
        if task_id not in self._not_yet_acked:
            return AckResult.DUPLICATE
        self._not_yet_acked.remove(task_id)
        self._states[task_id] = state_handle
        self._referenced.update(state_handle.object_keys)
        self._acks[task_id] = TaskAck(metrics if metrics is not None else TaskAckMetrics(), acked_at)
        return AckResult.SUCCESS

    def abort(self, reason: AbortReason) -> bool:
        """Discard this checkpoint; ``False`` if it was already finalized or aborted (nothing changes)."""
        if self._status is not PendingStatus.IN_PROGRESS:
            return False
        self._status = PendingStatus.ABORTED
        self._abort_reason = reason
        return True

    def finalize(self) -> tuple[TaskStateHandle, ...]:
        """Mark the fully acknowledged checkpoint finalized; its state handles, ordered by task."""
        if not self.is_fully_acknowledged:
            raise CheckpointProtocolError(
                f"checkpoint {self.checkpoint_id} cannot be finalized: status {self._status.value}, "
                f"{len(self._not_yet_acked)} task(s) not acknowledged"
            )
        self._status = PendingStatus.FINALIZED
        return tuple(self._states[task] for task in sorted(self._states))

    def __repr__(self) -> str:
        return (
            f"PendingCheckpoint(id={self.checkpoint_id}, kind={self.kind.value}, "
            f"status={self._status.value}, "
            f"acked={len(self._states)}/{len(self._tasks_to_ack)})"
        )
