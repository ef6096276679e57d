"""Completed checkpoints and the store that retains the last N of them.

Object keys can be shared between checkpoints (incremental snapshots reuse files), so the store counts
references: adding a checkpoint that subsumes older ones answers which keys no retained checkpoint
references any more. The caller deletes those; the store itself does no I/O.

A savepoint is self-contained and belongs to the user: its objects are never counted, so they are
never released for deletion. It stays in the store as the job's latest restore point (its sinks
committed through it) until a newer checkpoint completes, then leaves the store, untouched.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from weir.core.ids import CheckpointId, JobId, TaskId
from weir.jobmanager.checkpointing.pending import CheckpointKind, TaskStateHandle, checkpoint_size_bytes
from weir.jobmanager.errors import CheckpointProtocolError, ConfigError


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A checkpoint every task acknowledged; ``metadata_key`` is where its metadata object lives."""

    checkpoint_id: CheckpointId
    job_id: JobId
    trigger_timestamp: float
    completion_timestamp: float
    task_states: tuple[TaskStateHandle, ...]
    metadata_key: str
    kind: CheckpointKind = CheckpointKind.CHECKPOINT
    leader_term: int = 0
    """The leader term whose JobManager wrote its metadata (0: without high availability); see
    ``weir.jobmanager.checkpointing.term_fences``."""
    full: bool = False
    """A full checkpoint (``weir checkpoint --full``): its snapshots reuse no file of an earlier one."""

    def __post_init__(self) -> None:
        tasks = [s.task_id for s in self.task_states]
        if len(set(tasks)) != len(tasks):
            raise CheckpointProtocolError(f"checkpoint {self.checkpoint_id} holds two states for one task")

    @property
    def is_savepoint(self) -> bool:
        return self.kind is CheckpointKind.SAVEPOINT

    @property
    def total_size_bytes(self) -> int:
        return checkpoint_size_bytes(self.task_states)

    @property
    def duration_s(self) -> float:
        return self.completion_timestamp - self.trigger_timestamp

    @property
    def object_keys(self) -> frozenset[str]:
        return frozenset(key for s in self.task_states for key in s.object_keys)

    @property
    def tasks(self) -> frozenset[TaskId]:
        return frozenset(s.task_id for s in self.task_states)

    def state_of(self, task_id: TaskId) -> TaskStateHandle | None:
        for state in self.task_states:
            if state.task_id == task_id:
                return state
        return None


@dataclass(frozen=True)
class StoreAddResult:
    """What adding a checkpoint released: the subsumed checkpoints and keys nothing retained references."""

    subsumed: tuple[CompletedCheckpoint, ...] = ()
    unreferenced_keys: frozenset[str] = field(default_factory=frozenset)


class CompletedCheckpointStore(abc.ABC):
    """Retains the latest N completed checkpoints, and the savepoints newer than all of them."""

    @abc.abstractmethod
    def add(self, checkpoint: CompletedCheckpoint) -> StoreAddResult:
        """Add a checkpoint newer than all retained ones; subsume the oldest beyond the retention."""

    @abc.abstractmethod
    def latest(self) -> CompletedCheckpoint | None:
        """The retained checkpoint or savepoint with the highest id."""

    @abc.abstractmethod
    def all(self) -> tuple[CompletedCheckpoint, ...]:
        """Every retained checkpoint and savepoint, oldest first."""

    @abc.abstractmethod
    def referenced_keys(self) -> frozenset[str]:
        """Every object key some retained checkpoint references."""

    def is_referenced(self, key: str) -> bool:
        return key in self.referenced_keys()


class InMemoryCompletedCheckpointStore(CompletedCheckpointStore):
    """The store as plain data; also what the I/O layer fills from the metadata it lists on recovery."""

    def __init__(self, max_retained: int = 1) -> None:
        if max_retained < 1:
            raise ConfigError("checkpointing.retained", f"must be at least 1, got {max_retained}")
        self._max_retained = max_retained
        self._retained: list[CompletedCheckpoint] = []
        self._refcounts: Counter[str] = Counter()
        self._savepoint_keys: set[str] = set()  # objects of every savepoint added: the user's, never released

    @property
    def max_retained(self) -> int:
        return self._max_retained

    def add(self, checkpoint: CompletedCheckpoint) -> StoreAddResult:
        latest = self.latest()
        if latest is not None and checkpoint.checkpoint_id <= latest.checkpoint_id:
            raise CheckpointProtocolError(
                f"checkpoint {checkpoint.checkpoint_id} of job {checkpoint.job_id} is not newer than the "
                f"latest retained checkpoint {latest.checkpoint_id}"
            )
        if checkpoint.is_savepoint:
            self._savepoint_keys |= checkpoint.object_keys
        else:
            # The newer checkpoint is the restore point now: older savepoints leave the store (not storage).
            self._retained = [c for c in self._retained if not c.is_savepoint]
            self._refcounts.update(checkpoint.object_keys)
        self._retained.append(checkpoint)
        subsumed = self._subsume_beyond_retention()
        released: set[str] = set()
        for old in subsumed:
            for key in old.object_keys:
                self._refcounts[key] -= 1
                if self._refcounts[key] == 0:
                    del self._refcounts[key]
                    if key not in self._savepoint_keys:  # a checkpoint never releases a savepoint's file
                        released.add(key)
        return StoreAddResult(subsumed=subsumed, unreferenced_keys=frozenset(released))

    def _subsume_beyond_retention(self) -> tuple[CompletedCheckpoint, ...]:
        checkpoints = [c for c in self._retained if not c.is_savepoint]
        excess = len(checkpoints) - self._max_retained
        if excess <= 0:
            return ()
        subsumed = tuple(checkpoints[:excess])
        gone = {c.checkpoint_id for c in subsumed}
        self._retained = [c for c in self._retained if c.checkpoint_id not in gone]
        return subsumed

    def add_all(self, checkpoints: Iterable[CompletedCheckpoint]) -> StoreAddResult:
        """Add several in id order (recovery from listed metadata); the releases of all of them."""
        subsumed: list[CompletedCheckpoint] = []
        released: set[str] = set()
        for checkpoint in sorted(checkpoints, key=lambda c: c.checkpoint_id):
            result = self.add(checkpoint)
            subsumed.extend(result.subsumed)
            released |= result.unreferenced_keys
        released -= self._refcounts.keys() | self._savepoint_keys
        return StoreAddResult(subsumed=tuple(subsumed), unreferenced_keys=frozenset(released))

    def latest(self) -> CompletedCheckpoint | None:
        return self._retained[-1] if self._retained else None

    def all(self) -> tuple[CompletedCheckpoint, ...]:
        return tuple(self._retained)

    def referenced_keys(self) -> frozenset[str]:
        """Keys of retained checkpoints, and of every savepoint added (never to be deleted)."""
        return frozenset(self._refcounts) | self._savepoint_keys

    def is_referenced(self, key: str) -> bool:
        return key in self._refcounts or key in self._savepoint_keys
