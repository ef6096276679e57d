"""Transaction bookkeeping of a two-phase-commit sink subtask, pure: no I/O.

The Kafka and PostgreSQL sink adapters drive a ``TwoPhaseCommitLedger`` and carry out what it
answers. One transaction per checkpoint interval:

    begin()                     open (writes go into it)
    pre_commit(N)               pre-committed at checkpoint N: the adapter prepares it
                                (PREPARE TRANSACTION / flush), then the snapshot records it
    on_checkpoint_complete(M)   M >= N completed: commit issued (CommitTxn)
    committed(txn)              the adapter confirmed the commit: forgotten

A pre-committed transaction stays pending until a checkpoint at or after its own completes. A lost
completion notification is covered by the next one (completing M commits everything pre-committed at
M or before), and an aborted checkpoint keeps its transaction pending, as Flink does: the data was
prepared, and the next completed checkpoint's snapshot still lists it, so it commits then.

Why a commit can be retried blindly: the adapter prepares a transaction before the snapshot that
records it is taken, and Weir rolls back only in-doubt transactions that the restored snapshot does
not list. So a transaction the ledger asks to commit was prepared, and only a commit can have removed
it: when the external system answers "no such prepared transaction" (PostgreSQL's COMMIT PREPARED
with an unknown gid), the adapter treats it as already committed. This holds as long as the adapter
fails the task when a prepare fails (the checkpoint must not be acknowledged) and recovery restores
the latest completed checkpoint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from urllib.parse import quote, unquote

from weir.core.errors import Fault, WeirError
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId

GID_SCHEME = "weir"
MAX_GID_LENGTH = 199
"""PostgreSQL wants a prepared transaction's identifier shorter than 200 bytes."""

FIRST_CHECKPOINT_ID = CheckpointId(1)

_GID_PATTERN = re.compile(r"weir:([^:]+):([^:]+):(0|[1-9][0-9]*):([0-9]{20})")


class LedgerStateError(WeirError):
    """The sink adapter called the ledger out of order (a bug in the adapter): fail the task."""

    fault: Fault = Fault.INTERNAL


@dataclass(frozen=True, order=True)
class TransactionId:
    """A sink subtask's transaction, named by its epoch: the checkpoint it expects to be pre-committed
    at. If that checkpoint never reaches the sink (aborted in advance) it is pre-committed at a later
    one; epochs still never repeat within a run, as each is above the last pre-commit checkpoint."""

    job_id: JobId
    operator_uid: OperatorUid
    subtask: SubtaskIndex
    checkpoint_id: CheckpointId

    def __post_init__(self) -> None:
        if not self.job_id or not self.operator_uid:
            raise ValueError(f"transaction {self!r}: job id and operator uid must not be empty")
        if self.subtask < 0 or self.checkpoint_id < 0:
            raise ValueError(f"transaction {self!r}: subtask and checkpoint id must not be negative")
        if len(self.gid) > MAX_GID_LENGTH:
            raise ValueError(
                f"transaction id {self.gid!r} is longer than {MAX_GID_LENGTH} characters: "
                f"shorten the job id or the uid of operator {self.operator_uid!r}"
            )

    @classmethod
    def for_task(cls, task: TaskId, epoch: CheckpointId) -> TransactionId:
        return cls(task.job_id, task.operator_uid, task.subtask, epoch)

    @property
    def task(self) -> TaskId:
        return TaskId(self.job_id, self.operator_uid, self.subtask)

    @property
    def gid(self) -> str:
        """``weir:{job}:{operator}:{subtask}:{checkpoint:020d}``, job and operator percent-encoded so
        that no ``:`` in them can make two sinks' identifiers collide."""
        job = quote(self.job_id, safe="")
        operator = quote(self.operator_uid, safe="")
        return f"{GID_SCHEME}:{job}:{operator}:{self.subtask}:{self.checkpoint_id:020d}"

    @classmethod
    def parse(
        cls,
        gid: str,
        *,
        job_id: JobId,
        operator_uid: OperatorUid,
        subtask: SubtaskIndex | None = None,
    ) -> TransactionId | None:
        """The transaction named ``gid`` if it belongs to this sink (and subtask, if given); None for
        anything else: other jobs, other sinks, other systems' identifiers, malformed strings."""
        match = _GID_PATTERN.fullmatch(gid)
        if match is None:
            return None
        job, operator, subtask_text, checkpoint_text = match.groups()
        if unquote(job) != job_id or unquote(operator) != operator_uid:
            return None
        if subtask is not None and int(subtask_text) != subtask:
            return None
        try:
            subtask_index, epoch = SubtaskIndex(int(subtask_text)), CheckpointId(int(checkpoint_text))
            txn = cls(job_id, operator_uid, subtask_index, epoch)
        except ValueError:
            return None
        return txn if txn.gid == gid else None

    def __str__(self) -> str:
        return self.gid


class TxnStatus(Enum):
    PRE_COMMITTED = "pre_committed"
    """Prepared; waits for its checkpoint, or a later one, to complete."""
    COMMITTING = "committing"
    """A covering checkpoint completed; the commit was handed to the adapter, not yet confirmed."""


@dataclass(frozen=True, order=True)
class PendingTransaction:
    """A prepared, not yet confirmed transaction and the checkpoint it was pre-committed at."""

    checkpoint_id: CheckpointId
    txn: TransactionId


@dataclass(frozen=True)
class PreCommitted:
    """Prepare this transaction now, before the operator's snapshot is taken."""

    txn: TransactionId
    checkpoint_id: CheckpointId


@dataclass(frozen=True)
class CommitTxn:
    """Commit this transaction, then call ``committed(txn)``. "Not found" means already committed."""

    txn: TransactionId
    pre_committed_at: CheckpointId
    completed_checkpoint_id: CheckpointId


@dataclass(frozen=True)
class LedgerSnapshot:
    """The ledger's part of the sink operator's checkpoint N: every transaction pre-committed at or
    before N that was not confirmed committed when the snapshot was taken."""

    task: TaskId
    checkpoint_id: CheckpointId
    pending: tuple[PendingTransaction, ...]

    def __post_init__(self) -> None:
        distinct = len({entry.txn for entry in self.pending}) == len(self.pending)
        if not distinct or list(self.pending) != sorted(self.pending):
            raise ValueError(
                f"ledger snapshot of {self.task} at checkpoint {self.checkpoint_id}: pending transactions "
                "must be sorted and distinct"
            )
        for entry in self.pending:
            if entry.txn.task != self.task:
                raise ValueError(
                    f"ledger snapshot of {self.task} at checkpoint {self.checkpoint_id} "
                    f"lists transaction {entry.txn} of another subtask"
                )
            if not entry.txn.checkpoint_id <= entry.checkpoint_id <= self.checkpoint_id:
                raise ValueError(
                    f"ledger snapshot of {self.task} at checkpoint {self.checkpoint_id} lists transaction "
                    f"{entry.txn} as pre-committed at checkpoint {entry.checkpoint_id}"
                )

    def to_bytes(self) -> bytes:
        document = {
            "task": [self.task.job_id, self.task.operator_uid, self.task.subtask],
            "checkpoint_id": self.checkpoint_id,
            "pending": [[entry.checkpoint_id, entry.txn.checkpoint_id] for entry in self.pending],
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LedgerSnapshot:
        document = json.loads(data)
        job_id, operator_uid, subtask = document["task"]
        task = TaskId(JobId(job_id), OperatorUid(operator_uid), SubtaskIndex(subtask))
        pending = tuple(
            PendingTransaction(CheckpointId(at), TransactionId.for_task(task, CheckpointId(epoch)))
            for at, epoch in document["pending"]
        )
        return cls(task, CheckpointId(document["checkpoint_id"]), pending)


@dataclass(frozen=True)
class RecoveryPlan:
    """What a sink subtask restoring checkpoint N does before writing: commit what the snapshot of N
    lists (N completed, so its pre-committed transactions are part of it; committing one twice is
    harmless), and roll back every other in-doubt transaction of the subtask (pre-committed after N,
    or never recorded by a completed checkpoint). Run the rollbacks before the first ``begin()``:
    epochs after N are reused."""

    checkpoint_id: CheckpointId | None
    commit: tuple[TransactionId, ...]
    rollback: tuple[TransactionId, ...]


def plan_recovery(task: TaskId, snapshot: LedgerSnapshot | None, in_doubt: Iterable[TransactionId]) -> RecoveryPlan:
    """The recovery of ``task`` from a restored snapshot (None: no completed checkpoint, start over),
    given the transactions the external system still holds prepared for it."""
    in_doubt = frozenset(in_doubt)
    for txn in in_doubt:
        if txn.task != task:
            raise ValueError(f"recovery of {task}: in-doubt transaction {txn} belongs to another subtask")
    if snapshot is None:
        return RecoveryPlan(None, (), tuple(sorted(in_doubt)))
    if snapshot.task != task:
        raise ValueError(f"recovery of {task}: the snapshot is of {snapshot.task}")
    commit = tuple(entry.txn for entry in snapshot.pending)
    rollback = tuple(sorted(in_doubt - set(commit)))
    return RecoveryPlan(snapshot.checkpoint_id, commit, rollback)


@dataclass
class _Entry:
    checkpoint_id: CheckpointId
    status: TxnStatus


class TwoPhaseCommitLedger:
    """Transactions of one two-phase-commit sink subtask, from open to confirmed commit."""

    def __init__(self, task: TaskId, *, first_epoch: CheckpointId = FIRST_CHECKPOINT_ID) -> None:
        self._task = task
        self._next_epoch = first_epoch
        self._open: TransactionId | None = None
        self._last_pre_commit: CheckpointId | None = None
        self._last_completed: CheckpointId | None = None
        self._pending: dict[TransactionId, _Entry] = {}

    @property
    def task(self) -> TaskId:
        return self._task

    @property
    def open_transaction(self) -> TransactionId | None:
        return self._open

    @property
    def pending(self) -> tuple[PendingTransaction, ...]:
        return tuple(PendingTransaction(entry.checkpoint_id, txn) for txn, entry in self._pending.items())

    @property
    def last_pre_commit(self) -> CheckpointId | None:
        """The last checkpoint whose barrier reached the sink (or the restored one)."""
        return self._last_pre_commit

    @property
    def last_completed(self) -> CheckpointId | None:
        """The last checkpoint whose completion committed through the ledger (or the restored one)."""
        return self._last_completed

    def status(self, txn: TransactionId) -> TxnStatus | None:
        entry = self._pending.get(txn)
        return entry.status if entry is not None else None

    def begin(self) -> TransactionId:
        """Open the transaction the next writes go into (call on the first write after a pre-commit)."""
        if self._open is not None:
            raise LedgerStateError(f"sink {self._task}: transaction {self._open} is already open")
        self._open = TransactionId.for_task(self._task, self._next_epoch)
        return self._open

    def pre_commit(self, checkpoint_id: CheckpointId) -> PreCommitted | None:
        """The barrier of ``checkpoint_id`` reached the sink: close the open transaction and record it
        as pending for this checkpoint. None when nothing was written since the last barrier."""
        if self._last_pre_commit is not None and checkpoint_id <= self._last_pre_commit:
            raise LedgerStateError(
                f"sink {self._task}: barrier {checkpoint_id} after barrier {self._last_pre_commit}; "
                "barriers reach a sink in increasing order"
            )
        txn = self._open
        if txn is not None and txn.checkpoint_id > checkpoint_id:
            raise LedgerStateError(f"sink {self._task}: transaction {txn} pre-committed at {checkpoint_id}")
        self._open = None
        self._last_pre_commit = checkpoint_id
        self._next_epoch = CheckpointId(checkpoint_id + 1)
        if txn is None:
            return None
        self._pending[txn] = _Entry(checkpoint_id, TxnStatus.PRE_COMMITTED)
        return PreCommitted(txn, checkpoint_id)

    def snapshot_state(self) -> LedgerSnapshot:
        """The ledger's state for the checkpoint just pre-committed (call right after ``pre_commit``)."""
        if self._last_pre_commit is None:
            raise LedgerStateError(f"sink {self._task}: snapshot before any pre-commit")
        return LedgerSnapshot(self._task, self._last_pre_commit, tuple(sorted(self.pending)))

    def on_checkpoint_complete(self, checkpoint_id: CheckpointId) -> tuple[CommitTxn, ...]:
        """Commit every transaction pre-committed at this checkpoint or before, oldest first. A
        notification older than the last one, or for a checkpoint the sink never saw, commits nothing."""
        if self._last_completed is not None and checkpoint_id <= self._last_completed:
            return ()
        if self._last_pre_commit is None or checkpoint_id > self._last_pre_commit:
            return ()
        self._last_completed = checkpoint_id
        commits: list[CommitTxn] = []
        for txn, entry in self._pending.items():
            if entry.status is TxnStatus.PRE_COMMITTED and entry.checkpoint_id <= checkpoint_id:
                entry.status = TxnStatus.COMMITTING
                commits.append(CommitTxn(txn, entry.checkpoint_id, checkpoint_id))
        return tuple(commits)

    def on_checkpoint_aborted(self, checkpoint_id: CheckpointId) -> None:
        """Nothing to undo: a transaction pre-committed at an aborted checkpoint stays pending and
        commits with the next completed checkpoint, whose snapshot lists it."""

    def committed(self, txn: TransactionId) -> None:
        """The adapter committed ``txn`` (or found it already committed)."""
        entry = self._pending.get(txn)
        if entry is None or entry.status is not TxnStatus.COMMITTING:
            raise LedgerStateError(f"sink {self._task}: commit of {txn} confirmed, but it was not committing")
        del self._pending[txn]

    def recover(self, snapshot: LedgerSnapshot | None, in_doubt: Iterable[TransactionId]) -> RecoveryPlan:
        """Restore a fresh ledger from the snapshot of the restored (completed) checkpoint. The
        snapshot's transactions become committing: confirm each with ``committed`` once the plan's
        commit ran; a checkpoint taken meanwhile still lists them."""
        if self._open is not None or self._last_pre_commit is not None or self._pending:
            raise LedgerStateError(f"sink {self._task}: recover() is for a fresh ledger only")
        plan = plan_recovery(self._task, snapshot, in_doubt)
        if snapshot is not None:
            self._last_pre_commit = self._last_completed = snapshot.checkpoint_id
            self._next_epoch = CheckpointId(snapshot.checkpoint_id + 1)
            for entry in snapshot.pending:
                self._pending[entry.txn] = _Entry(entry.checkpoint_id, TxnStatus.COMMITTING)
        return plan
