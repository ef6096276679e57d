"""The values a subtask and its collaborators share: who the task is, what it snapshotted, what it
restores from, what it acknowledges, how it reports. Below the task, its checkpointer, its restorer
and the network's server half, so that none of them imports ``weir.taskmanager.task``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from weir.core.checkpointing import CheckpointKind, SubtaskCheckpointTimeline
from weir.core.failures import Failure
from weir.core.states import TaskState
from weir.core.task_state import OperatorStateHandle, SubtaskLayout, TaskStateDocument
from weir.taskmanager.snapshots import KeyedStateHandle


class Cancelled(Exception):
    """Raised inside a task's thread when the task is being cancelled."""


@dataclass(frozen=True)
class TaskAddress:
    """One attempt of one subtask of a job's vertex."""

    job_id: str
    vertex_uid: str
    subtask: int
    attempt: int

    def __str__(self) -> str:
        return f"{self.job_id}/{self.vertex_uid}#{self.subtask}@{self.attempt}"


@dataclass(frozen=True)
class ChainSnapshot:
    """What one subtask contributes to a checkpoint: each operator's own state by uid, and the handle
    of its keyed state in RocksDB (None when the chain has no keyed operator). The TaskManager stores
    the operator states (inline or as an object, ``weir.core.task_state``) before it acknowledges."""

    task: TaskAddress
    checkpoint_id: int
    operator_states: dict[str, bytes]
    layout: SubtaskLayout
    keyed_state: KeyedStateHandle | None = None
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    broadcast_operator_uids: frozenset[str] = frozenset()
    """The operators in ``operator_states`` whose state is broadcast state: each stored as a
    content-addressed object that the subtasks with the same copy share (``weir.core.broadcast_state``)."""


@dataclass(frozen=True)
class ChainRestore:
    """What a subtask restores from after a restart of its job: its operator states' handle (read on
    the task thread), the handle of its keyed state (None when the checkpoint holds none for it) and
    the layout it was snapshotted with (its state schemas; None: not known, not checked)."""

    checkpoint_id: int
    operator_state: OperatorStateHandle
    keyed_state: KeyedStateHandle | None = None
    layout: SubtaskLayout | None = None


@dataclass(frozen=True)
class InheritedRestore:
    """A retained checkpoint of another job restored into this one (``weir run --from-checkpoint``),
    at the same or another parallelism: the task-state documents of every old subtask that ran one of
    this chain's operators (``weir.core.rescale``)."""

    checkpoint_id: int
    documents: tuple[TaskStateDocument, ...]


Restore = ChainRestore | InheritedRestore


@dataclass(frozen=True)
class CheckpointAck:
    """A subtask's acknowledgement of a checkpoint, with where its time went."""

    snapshot: ChainSnapshot
    alignment_s: float
    start_delay_s: float
    sync_s: float
    async_s: float
    timeline: SubtaskCheckpointTimeline | None = None  # None: not recorded (the task always records it)
    inflight_bytes: int = 0  # of the in-flight buffers an unaligned checkpoint persisted (not their document)


@dataclass(frozen=True)
class TaskCallbacks:
    """How a task reports to its TaskManager (which forwards to the JobManager)."""

    on_state: Callable[[TaskAddress, TaskState, Failure | None], None]
    on_checkpoint: Callable[[TaskAddress, CheckpointAck], None]
    on_decline: Callable[[TaskAddress, int, str], None]
    on_input_ended: Callable[[TaskAddress], None]
