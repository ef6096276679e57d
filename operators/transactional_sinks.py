"""Exactly-once sinks: a transactional Kafka sink and a two-phase-commit PostgreSQL sink.

Both keep their bookkeeping in a :class:`~weir.operators.twophase.TwoPhaseCommitLedger`: one transaction
per checkpoint epoch, pre-committed at the checkpoint's barrier, committed when a checkpoint at or after
it completes, and re-resolved on recovery from the restored snapshot. Each sink proves its own commits
in the transaction it commits (a marker record in ``weir-sink-commits``, a row in ``weir_sink_commits``);
two sinks are never one atomic transaction. ``docs/sinks.md`` has the protocol and every recovery case.

At most one transaction per sink subtask is open in the external system at a time: librdkafka allows
one open transaction per producer, and a second prepared PostgreSQL transaction could wait forever on
the row locks of the first. An epoch pre-committed while an older one still waits for its commit stays
in memory, and in the snapshot, until the older one commits.
"""

from __future__ import annotations

import abc
import hashlib
import json
import re
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from weir.connectors import kafka
from weir.core.changelog import Delete, KeyedChanges
from weir.core.config import Endpoints, run_dir
from weir.core.crashpoints import (
    AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT,
    AFTER_PRE_COMMIT,
    AFTER_SINK_END_OF_INPUT,
    BETWEEN_SINK_COMMITS,
    crash_point,
)
from weir.core.descriptors import DEFAULT_TRANSACTION_TIMEOUT_MS
from weir.core.errors import Fault, JobDefinitionError, SerializationError, ServiceUnavailableError, WeirError
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.core.kafka_config import Properties, kafka_client_config
from weir.core.metrics import SinkMetrics
from weir.core.rejections import FAIL, OnRecordError
from weir.core.serde import loads_value
from weir.operators.base import (
    NO_PARAMETERS,
    NO_SIDE_OUTPUTS,
    InheritedState,
    OperatorContext,
    Output,
    SideOutputs,
    StreamOperator,
)
from weir.operators.epoch_spill import (
    DEFAULT_EPOCH_MEMORY_BYTES,
    EpochRecords,
    EpochSpill,
    StreamedList,
    dumps_streaming,
)
from weir.operators.twophase import LedgerSnapshot, PendingTransaction, TransactionId, TwoPhaseCommitLedger

if TYPE_CHECKING:  # psycopg is imported when a PostgreSQL sink first talks to the server (in each
    # method that does): building a job's sinks (weir test, weir info, a Kafka sink) never loads it
    from weir.connectors import postgres

COMMIT_MARKER_TOPIC: Final = "weir-sink-commits"
"""The prefix of every Kafka sink's marker topic (``marker_topic_name``). Before each sink had its own,
all markers went to this one topic, into partition ``crc32(marker key) % partitions``: recovery still
looks there for the markers of a snapshot taken then."""
MARKER_TOPIC_CONFIG: Final = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}
"""A marker topic keeps every marker for ever: recovery's answer must never depend on retention (a
marker aged out would read as "not committed" and its epoch would be produced twice)."""
DEFAULT_MARKER_REPLICATION_FACTOR: Final = 3
"""The replication factor of a marker topic a sink creates: this, or the broker count if smaller."""
MAX_TOPIC_NAME: Final = 249
_MARKER_TOPIC_HASH: Final = 10  # hex digits of sha256(job id, operator uid) ending a marker topic's name
_MARKER_TOPIC_BODY: Final = MAX_TOPIC_NAME - 1 - _MARKER_TOPIC_HASH
_TOPIC_UNSAFE: Final = re.compile(r"[^a-zA-Z0-9._-]")
DEFAULT_COMMIT_TIMEOUT_S: Final = 60.0
DEFAULT_RECOVERY_TIMEOUT_S: Final = 120.0
DEFAULT_LOCK_TIMEOUT_S: Final = 10.0
RECONNECT_WINDOW_S: Final = 30.0
"""How long a PostgreSQL sink subtask opening (after a restart) waits for an unreachable server."""
DEFAULT_CLAIM_TIMEOUT_S: Final = 30.0
SNAPSHOT_FORMAT: Final = 2
"""2: a PostgreSQL sink's epochs hold its changes (``KeyedChanges.encode``: upserts and deletes); 1:
upserted rows only. Kafka epochs are the same in both. This version reads both."""
READABLE_SNAPSHOT_FORMATS: Final = (1, 2)
_POLL_EVERY: Final = 500  # records produced between two polls for delivery reports (flush serves the rest)

NO_TOMBSTONES: Final = (
    "the serializer returned None for a record without a key: a null value is a tombstone (a delete of its "
    "key in a compacted topic), which needs a key; return the value's bytes or give the sink a key function"
)
Record = tuple[bytes | None, bytes | None, int | None]
"""A Kafka record as the sink keeps it: ``(key, value, event timestamp ms)``; a None value is a tombstone."""


class SinkTransactionLostError(WeirError):
    """A transaction the restored checkpoint says was prepared is neither prepared nor committed any
    more: something outside this job rolled it back. Its output is lost for this sink."""

    fault: Fault = Fault.EXTERNAL


class CommitMarkerLostError(WeirError):
    """A commit marker that recovery needs is no longer in its partition (below the log start offset:
    deleted by retention or DeleteRecords, or the topic was recreated): whether its epoch committed
    cannot be told, so recovery stops instead of guessing (duplicates or lost output)."""

    fault: Fault = Fault.EXTERNAL


class MarkerTopicError(WeirError):
    """A marker topic exists with settings under which markers could be deleted, and this sink could
    not change them: it must not produce markers that may age out."""

    fault: Fault = Fault.EXTERNAL


class EndOfInputNotCheckpointedError(WeirError):
    """A transactional sink reached its end of input holding output that no checkpoint its task
    acknowledged covers. Weir's protocol rules this out (the final checkpoint's barrier is forced
    aligned and follows every record; the task waits for its notification before the end of input),
    so this is a bug in Weir, not the job's: a restart cannot be trusted to mend it."""

    fault: Fault = Fault.INTERNAL


class Deadline:
    """One time budget for a multi-step commit (flush, commit, confirm), not a timeout per call."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._end = clock() + seconds

    def remaining(self, at_least: float = 0.1) -> float:
        return max(at_least, self._end - self._clock())

    @property
    def expired(self) -> bool:
        return self._clock() >= self._end


# Names and markers --------------------------------------------------------------------------------


MARKER_CONFIG_PROPAGATION_S = 15.0
"""How long an altered marker topic's config may take to show in a describe (seconds)."""


def transactional_id(task: TaskId) -> str:
    """The Kafka ``transactional.id`` of a sink subtask; the same across restarts of the same job."""
    return f"weir-{task.job_id}-{task.operator_uid}-{task.subtask}"


def marker_key(task: TaskId) -> bytes:
    return f"{task.job_id}/{task.operator_uid}/{task.subtask}".encode()


def _topic_safe(text: str) -> str:
    return _TOPIC_UNSAFE.sub("_", text)


def marker_topic_name(job_id: str, operator_uid: str) -> str:
    """The marker topic of one sink of one job: ``weir-sink-commits.{operator uid}.{job id}.{hash}``,
    the ids reduced to Kafka's ``[a-zA-Z0-9._-]`` and cut to fit 249 characters; the hash of the raw
    ids keeps two sinks apart whose ids read the same once reduced. Partition i holds subtask i's
    markers, written by its transactional producer only."""
    digest = hashlib.sha256(f"{job_id}\x00{operator_uid}".encode()).hexdigest()[:_MARKER_TOPIC_HASH]
    body = f"{COMMIT_MARKER_TOPIC}.{_topic_safe(operator_uid)}.{_topic_safe(job_id)}"[:_MARKER_TOPIC_BODY]
    return f"{body}.{digest}"


def marker_topic_prefix(operator_uid: str) -> str:
    """What the marker topic of this sink uid starts with, in every job (sinks whose reduced uids
    share it share the prefix too: tell them apart by the markers' values)."""
    return f"{COMMIT_MARKER_TOPIC}.{_topic_safe(operator_uid)}."[:_MARKER_TOPIC_BODY]


def marker_replication_factor(requested: int | None, brokers: int) -> int:
    """The replication factor of a marker topic: ``requested``, else min(3, brokers)."""
    if requested is None:
        return max(1, min(DEFAULT_MARKER_REPLICATION_FACTOR, brokers))
    if requested < 1 or requested > brokers:
        raise JobDefinitionError(
            f"marker_replication_factor = {requested} must be between 1 and the Kafka cluster's broker count "
            f"({brokers}): lower it, or leave it unset for min({DEFAULT_MARKER_REPLICATION_FACTOR}, brokers)"
        )
    return requested


@dataclass(frozen=True)
class MarkerLocation:
    """The partition a sink subtask's commit markers go to."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


def gid_prefix(task: TaskId) -> str:
    """What every PostgreSQL gid of this sink subtask starts with."""
    gid = TransactionId.for_task(task, CheckpointId(0)).gid
    return gid[: gid.rindex(":") + 1]


@dataclass(frozen=True)
class CommitMarker:
    """The record a Kafka sink transaction writes to its marker topic with its output."""

    job_id: str
    operator_uid: str
    subtask: int
    checkpoint_id: int
    records: int
    transactional_id: str

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "job_id": self.job_id,
                "operator_uid": self.operator_uid,
                "subtask": self.subtask,
                "checkpoint_id": self.checkpoint_id,
                "records": self.records,
                "transactional_id": self.transactional_id,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def parse(cls, value: bytes | None) -> CommitMarker | None:
        """The marker in ``value``; None for anything else."""
        try:
            doc = json.loads(value or b"")
            return cls(
                str(doc["job_id"]),
                str(doc["operator_uid"]),
                int(doc["subtask"]),
                int(doc["checkpoint_id"]),
                int(doc["records"]),
                str(doc["transactional_id"]),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def belongs_to(self, task: TaskId) -> bool:
        return (self.job_id, self.operator_uid, self.subtask) == (task.job_id, task.operator_uid, task.subtask)


def last_committed_checkpoint(
    candidates: Iterable[tuple[int, CheckpointId]], committed: Callable[[int], bool]
) -> CheckpointId | None:
    """The newest checkpoint whose marker was committed, given this subtask's markers for the
    restored pending checkpoints as ``(offset, checkpoint id)`` and a check of one offset.

    One producer at a time commits a subtask's transactions, oldest first, into one partition: the
    newest committed marker (by offset) is that of the newest committed checkpoint, and everything
    pending before it committed too. Checks run newest first and stop at the first commit."""
    for offset, checkpoint_id in sorted(candidates, reverse=True):
        if committed(offset):
            return checkpoint_id
    return None


# Snapshots ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkSnapshot:
    """A transactional sink's operator state: its ledger and the output of the epochs whose commit
    may have to be redone from it (by pre-commit checkpoint id). An epoch's output is any iterable:
    ``to_bytes`` writes it as a list, reading it while writing (a spilled epoch streams from its
    file); ``from_bytes`` gives lists."""

    ledger: LedgerSnapshot
    epochs: Mapping[CheckpointId, Iterable[Any]]
    marker_floor: int | None = None  # Kafka: no marker of a pending epoch lies below this offset
    marker_topic: str | None = None  # Kafka: where marker_floor is; None in snapshots taken before
    marker_partition: int | None = None
    format: int = SNAPSHOT_FORMAT  # the format it was read in: how a PostgreSQL sink reads its epochs

    def to_bytes(self) -> bytes:
        return dumps_streaming(
            {
                "format": SNAPSHOT_FORMAT,
                "ledger": self.ledger.to_bytes(),
                "epochs": [
                    (int(cid), rows if isinstance(rows, list) else StreamedList(rows))
                    for cid, rows in sorted(self.epochs.items())
                ],
                "marker_floor": self.marker_floor,
                "marker_topic": self.marker_topic,
                "marker_partition": self.marker_partition,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> SinkSnapshot:
        document = loads_value(data)
        if not isinstance(document, dict) or document.get("format") not in READABLE_SNAPSHOT_FORMATS:
            found = document.get("format") if isinstance(document, dict) else type(document).__name__
            raise SerializationError(
                f"transactional sink snapshot has format {found!r}, this version reads "
                f"{' and '.join(map(str, READABLE_SNAPSHOT_FORMATS))}"
            )
        return cls(
            LedgerSnapshot.from_bytes(document["ledger"]),
            {CheckpointId(cid): rows for cid, rows in document["epochs"]},
            document["marker_floor"],
            document.get("marker_topic"),
            document.get("marker_partition"),
            document["format"],
        )


# Common parts -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UncommittedEpoch:
    """Output a sink still holds uncommitted: epoch ``epoch``'s records, pre-committed at checkpoint
    ``pre_committed_at`` (None: still open, its barrier never came)."""

    epoch: CheckpointId
    records: int
    pre_committed_at: CheckpointId | None

    def __str__(self) -> str:
        state = "open" if self.pre_committed_at is None else f"pre-committed at checkpoint {self.pre_committed_at}"
        return f"epoch {self.epoch}: {self.records} record(s), {state}"


@dataclass
class _Epoch:
    """The output of one ledger transaction, from its first record to its commit: Kafka records in
    order (``EpochRecords``, a list when restored), or PostgreSQL changes by key (``KeyedChanges``)."""

    txn: TransactionId
    items: Any
    timestamps: array[int] = field(default_factory=lambda: array("q"))
    checkpoint_id: CheckpointId | None = None  # the barrier it was pre-committed at

    @property
    def size(self) -> int:
        return len(self.items)


class _TransactionalSink(StreamOperator, abc.ABC):
    """Ledger, epochs, metrics and crash-point context shared by both sinks. A subclass pre-commits,
    commits and snapshots; this class decides when."""

    _ledger: TwoPhaseCommitLedger
    _metrics: SinkMetrics
    _kind: ClassVar[str]  # the external system, for messages: kafka or postgres

    def setup(self, ctx: OperatorContext, output: Output, side_outputs: SideOutputs = NO_SIDE_OUTPUTS) -> None:
        super().setup(ctx, output, side_outputs)
        self._task = TaskId(JobId(ctx.job_id), OperatorUid(ctx.uid), SubtaskIndex(ctx.subtask))
        self._ledger = TwoPhaseCommitLedger(self._task)
        self._taskmanager = str(getattr(ctx.metrics, "taskmanager", ""))
        self._metrics = SinkMetrics(ctx.job_id, ctx.job_name, ctx.uid, ctx.subtask, self._taskmanager)
        self._current: _Epoch | None = None
        self._pending: dict[TransactionId, _Epoch] = {}  # pre-committed, oldest first
        self._restored: SinkSnapshot | None = None
        self._endpoints = Endpoints.from_env()

    def _context(self, **extra: Any) -> dict[str, Any]:
        return {
            "job_id": self.ctx.job_id,
            "operator_uid": self.ctx.uid,
            "subtask": self.ctx.subtask,
            "taskmanager": self._taskmanager,
            **extra,
        }

    @abc.abstractmethod
    def _begin_epoch(self) -> _Epoch: ...

    def _close_epoch(self, checkpoint_id: CheckpointId) -> _Epoch | None:
        """The ledger's pre-commit at this barrier: the current epoch (if any) becomes pending."""
        pre = self._ledger.pre_commit(checkpoint_id)
        if pre is None:
            return None
        epoch = self._current
        assert epoch is not None and epoch.txn == pre.txn
        self._current = None
        epoch.checkpoint_id = checkpoint_id
        self._pending[epoch.txn] = epoch
        return epoch

    @abc.abstractmethod
    def _pre_commit(self, checkpoint_id: CheckpointId) -> _Epoch | None:
        """Close the current epoch and pre-commit it in the external system if nothing older waits."""
        ...

    @abc.abstractmethod
    def _snapshot(self) -> SinkSnapshot: ...

    @abc.abstractmethod
    def _commit(self, epoch: _Epoch) -> None:
        """Commit a pending epoch, pre-committed in the external system or not."""
        ...

    @abc.abstractmethod
    def _catch_up(self) -> None:
        """After commits: pre-commit the oldest epoch still waiting, now that nothing older is open."""
        ...

    @abc.abstractmethod
    def _transaction_name(self, epoch: _Epoch) -> dict[str, Any]:
        """How the external system names the epoch's transaction, for the logs."""
        ...

    @abc.abstractmethod
    def _in_external_system(self, epoch: _Epoch) -> bool:
        """The epoch's transaction is open or prepared in the external system (not waiting in memory)."""
        ...

    def snapshot_state(self, checkpoint_id: int) -> bytes | None:
        epoch = self._pre_commit(CheckpointId(checkpoint_id))
        if epoch is not None:
            self.ctx.log.info(
                "sink_transaction_precommitted",
                checkpoint_id=checkpoint_id,
                records=epoch.size,
                waiting_for_older=not self._in_external_system(epoch),
                **self._transaction_name(epoch),
            )
            crash_point(AFTER_PRE_COMMIT, **self._context(checkpoint_id=checkpoint_id))
        return self._snapshot().to_bytes()

    def restore_inherited_state(self, states: Sequence[InheritedState]) -> None:
        """A sink inherits no transactions: those in the checkpoint belong to the old job's subtasks,
        and the JobManager resolved them as of the checkpoint (committed what it covers, aborted or
        rolled back the rest) before this job started (``weir.jobmanager.restoring``)."""
        if states:
            self.ctx.log.info(
                "sink_state_not_inherited",
                old_subtasks=len(states),
                reason="the old job's transactions were resolved by the JobManager before this job started",
            )

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._commit_through(CheckpointId(checkpoint_id), crash_points=True)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """The transaction stays pending (open or prepared): the next completed checkpoint commits it."""
        self._ledger.on_checkpoint_aborted(CheckpointId(checkpoint_id))

    def end_input(self) -> None:
        """A bounded input ended. Nothing is committed here: everything this sink wrote lies in
        checkpoints its task acknowledged and was committed on their notifications, which the task
        waits for before its end of input (Flink's final checkpoint, FLIP-147). The final checkpoint's
        barrier is forced aligned and follows every record, so no record reaches the sink after it.
        A commit now would lie outside every checkpoint: a failover before the job FINISHED restores
        the final checkpoint and writes those records again (Kafka), or the next attempt's checkpoint
        id collides with the one made up for them (PostgreSQL). Output left here fails the task."""
        left = self._uncommitted()
        if left:
            raise self._not_checkpointed(left)
        crash_point(AFTER_SINK_END_OF_INPUT, **self._context(checkpoint_id=self._ledger.last_completed))

    def _uncommitted(self) -> list[UncommittedEpoch]:
        """The output this sink holds uncommitted: its pending epochs, oldest first, then the open one."""
        left = [
            UncommittedEpoch(epoch.txn.checkpoint_id, epoch.size, epoch.checkpoint_id)
            for epoch in self._pending.values()
        ]
        if self._current is not None:
            left.append(UncommittedEpoch(self._current.txn.checkpoint_id, self._current.size, None))
        return left

    def _not_checkpointed(self, left: Sequence[UncommittedEpoch]) -> EndOfInputNotCheckpointedError:
        task, ledger = self._task, self._ledger
        records = sum(epoch.records for epoch in left)
        pre_committed, completed = ledger.last_pre_commit, ledger.last_completed
        last = (
            "no checkpoint yet"
            if pre_committed is None
            else f"last checkpoint {pre_committed} (last committed: {completed if completed is not None else 'none'})"
        )
        self.ctx.log.error(
            "sink_end_of_input_not_checkpointed",
            records=records,
            epochs=[str(epoch) for epoch in left],
            last_checkpoint=pre_committed,
            last_committed_checkpoint=completed,
            **self._sink_transactions(),
        )
        return EndOfInputNotCheckpointedError(
            f"{self._kind} sink {task.operator_uid!r} of job {task.job_id} subtask {task.subtask} (attempt "
            f"{self.ctx.attempt}): end of input with {records} record(s) no checkpoint covers "
            f"({'; '.join(str(epoch) for epoch in left)}); {last}. Every record must be pre-committed at a "
            "checkpoint the task acknowledged, the final one at the latest, and committed on its notification "
            "before the end of input; committing them now would put them outside every checkpoint, so none of "
            "them is committed and the task fails. This is a bug in Weir: report it with this task's log"
        )

    @abc.abstractmethod
    def _sink_transactions(self) -> dict[str, Any]:
        """How the external system names this sink subtask's transactions, for the logs."""
        ...

    def _commit_through(self, checkpoint_id: CheckpointId, crash_points: bool) -> None:
        commits = self._ledger.on_checkpoint_complete(checkpoint_id)
        if not commits:
            return
        if crash_points:
            self._before_commits(self._context(checkpoint_id=checkpoint_id))
        for commit in commits:
            self._commit(self._pending.pop(commit.txn))
            self._ledger.committed(commit.txn)
        self._catch_up()

    def _before_commits(self, context: dict[str, Any]) -> None:
        crash_point(AFTER_CHECKPOINT_COMPLETE_BEFORE_COMMIT, **context)

    def _observe_commit(self, epoch: _Epoch, started: float, records: int) -> None:
        duration_s = time.perf_counter() - started
        self._metrics.on_commit(duration_s, records, epoch.timestamps, time.time() * 1000.0)
        self.ctx.log.info(
            "sink_transaction_committed",
            checkpoint_id=epoch.checkpoint_id,
            duration_s=round(duration_s, 4),
            records=records,
            **self._transaction_name(epoch),
        )

    def close(self) -> None:
        metrics = getattr(self, "_metrics", None)
        if metrics is not None:
            metrics.remove()


# Kafka --------------------------------------------------------------------------------------------


class TransactionalKafkaSinkOperator(_TransactionalSink):
    """Exactly-once Kafka sink: one Kafka transaction per checkpoint epoch, with a commit marker.

    Records are produced into the open transaction as they arrive while no older transaction waits
    for its commit, else kept in memory until it has committed. Every pending epoch's records are also
    in the snapshot, since librdkafka cannot resume a transaction after a crash: recovery fences the
    old producer (which aborts its open transaction), reads which checkpoints the marker topic shows
    committed, and re-produces the others from the snapshot.

    Pending records are held in memory up to ``epoch_memory_bytes`` for all epochs of the subtask
    together; past it, an epoch's records go to an append-only file of its own under
    ``spill_directory`` (default: ``epoch-spill`` in the run directory), removed once it commits
    (``operators/epoch_spill.py``). A snapshot streams them from there.

    Each sink of a job has its own marker topic (``marker_topic_name``), kept for ever, and each
    subtask its own partition of it (partition = subtask index), which only its own transactional
    producer writes to: a subtask's recovery waits on no other subtask's or job's transaction."""

    _kind = "kafka"

    def __init__(
        self,
        topic: str,
        serializer: Callable[[Any], bytes | None],
        key: Callable[[Any], bytes | str | None] | None,
        *,
        transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS,
        marker_topic: str | None = None,
        marker_replication_factor: int | None = None,
        commit_timeout_s: float = DEFAULT_COMMIT_TIMEOUT_S,
        recovery_timeout_s: float = DEFAULT_RECOVERY_TIMEOUT_S,
        epoch_memory_bytes: int = DEFAULT_EPOCH_MEMORY_BYTES,
        spill_directory: Path | None = None,
        on_error: OnRecordError = FAIL,
        properties: Properties = (),
    ) -> None:
        """``marker_topic`` overrides the sink's own marker topic (tests; subtask i still writes to
        partition i). ``marker_replication_factor`` applies when the sink creates its marker topic:
        default min(3, brokers). ``epoch_memory_bytes`` bounds the pending records held in memory
        (0: every epoch on disk); ``spill_directory`` is where the rest go. ``properties``: the sink's
        own Kafka settings over the job's, for its producer and its marker topic's clients
        (``weir.core.kafka_config``)."""
        if marker_replication_factor is not None and marker_replication_factor < 1:
            raise JobDefinitionError(
                f"kafka sink on {topic!r}: marker_replication_factor must be at least 1, got "
                f"{marker_replication_factor}; leave it unset for min({DEFAULT_MARKER_REPLICATION_FACTOR}, brokers)"
            )
        if epoch_memory_bytes < 0:
            raise JobDefinitionError(
                f"kafka sink on {topic!r}: epoch_memory_bytes must be at least 0, got {epoch_memory_bytes}; "
                f"leave it unset for {DEFAULT_EPOCH_MEMORY_BYTES} bytes"
            )
        self._topic = topic
        self._serializer = serializer
        self._key = key
        self.on_error = on_error
        self.transaction_timeout_ms = transaction_timeout_ms
        self._marker_topic_override = marker_topic
        self.marker_replication_factor = marker_replication_factor
        self._commit_timeout_s = commit_timeout_s
        self._recovery_timeout_s = recovery_timeout_s
        self.epoch_memory_bytes = epoch_memory_bytes
        self.spill_directory = spill_directory
        self.properties = properties
        self._producer: kafka.TransactionalProducer | None = None
        self._in_kafka: _Epoch | None = None  # the epoch whose Kafka transaction is open
        self._in_kafka_since: float | None = None
        self._produced = 0  # records of that epoch handed to the producer so far
        self._markers: dict[TransactionId, kafka.Delivery] = {}  # where pending epochs' markers landed
        self._marker_watermark = 0  # no marker this subtask produces from now on lands below this offset
        self._fence_s = 0.0  # how long fencing the previous producer took (init_transactions)
        self._fencing: Future[kafka.TransactionalProducer] | None = None  # started by prepare_restore

    @property
    def transactional_id(self) -> str:
        return transactional_id(self._task)

    def setup(self, ctx: OperatorContext, output: Output, side_outputs: SideOutputs = NO_SIDE_OUTPUTS) -> None:
        super().setup(ctx, output, side_outputs)
        self._marker_key = marker_key(self._task)
        self._marker_topic = self._marker_topic_override or marker_topic_name(ctx.job_id, ctx.uid)
        self._marker_partition = ctx.subtask
        self._marker = MarkerLocation(self._marker_topic, self._marker_partition)
        self._cluster = kafka_client_config(self._endpoints, ctx.parameters, self.properties)
        root = self.spill_directory if self.spill_directory is not None else run_dir() / "epoch-spill"
        self._spill = EpochSpill(self._task, root, self.epoch_memory_bytes, ctx.log)

    def validate_at_submit(self, endpoints: Endpoints, parameters: Mapping[str, str] = NO_PARAMETERS) -> None:
        """At submit, before anything runs: the output topic exists and the marker replication factor
        fits the cluster, reached as the job's tasks will reach it. Creates nothing;
        ServiceUnavailableError when Kafka does not answer, JobDefinitionError naming the broker's
        error when it refuses the job's credentials."""
        lookup = kafka.require_topic(kafka_client_config(endpoints, parameters, self.properties), self._topic)
        try:
            marker_replication_factor(self.marker_replication_factor, lookup.brokers)
        except JobDefinitionError as exc:
            raise JobDefinitionError(f"kafka sink on {self._topic!r}: {exc}") from exc

    # Start and recovery ---------------------------------------------------------------------------

    def prepare_restore(self) -> None:
        """Start fencing on a thread while the subtask's keyed state is restored: the broker aborts
        the killed predecessor's open transaction, and librdkafka asks again for the producer id only
        500 ms later (once or twice: 0.5-1 s), time the keyed restore spends anyway. Fencing early is
        as safe as fencing in ``restore_state``: a cancelled attempt that fences after its successor
        fails that successor's next transactional call, and the attempt after it recovers from the
        checkpoint and the markers as always (Flink's sinks fence in ``initializeState`` likewise)."""
        if self._producer is not None or self._fencing is not None:
            return
        fencing: Future[kafka.TransactionalProducer] = Future()

        def fence() -> None:
            try:
                fencing.set_result(self._new_fenced_producer())
            except BaseException as exc:  # handed to the task thread by _fence
                fencing.set_exception(exc)

        threading.Thread(target=fence, name=f"fence-{self.transactional_id}", daemon=True).start()
        self._fencing = fencing

    def restore_state(self, data: bytes) -> None:
        """Load the snapshot and fence at once: every operator of a chain restores before any opens,
        so no sink of the chain reads the marker topic while another one's old transaction is open."""
        self._restored = SinkSnapshot.from_bytes(data)
        self._fence()

    def _fence(self) -> kafka.TransactionalProducer:
        if self._producer is None:
            fencing, self._fencing = self._fencing, None
            self._producer = self._new_fenced_producer() if fencing is None else fencing.result()
        return self._producer

    def _new_fenced_producer(self) -> kafka.TransactionalProducer:
        started = time.perf_counter()
        producer = kafka.TransactionalProducer(self._cluster, self.transactional_id, self.transaction_timeout_ms)
        producer.init(self._recovery_timeout_s)
        self._fence_s = time.perf_counter() - started
        return producer

    def open(self) -> None:
        started = time.perf_counter()
        kafka.partition_count(self._cluster, self._topic)  # a missing topic fails at open
        self._spill.remove_abandoned()  # a crashed predecessor's spill files: never read again
        self._ensure_marker_topic()
        self._fence()
        self._marker_watermark = kafka.partition_range(self._cluster, self._marker_topic, self._marker_partition)[1]
        self._metrics.track_open_transaction_age(self._open_transaction_age)
        if self._restored is not None:
            self._recover(self._restored, prepared_s=time.perf_counter() - started)
            self._restored = None

    def _ensure_marker_topic(self) -> None:
        """Create the marker topic if missing (unlimited retention, one partition per subtask), grow
        it to this sink's parallelism (never shrink it), and make sure it keeps markers for ever."""
        cluster, topic = self._cluster, self._marker_topic
        needed = max(self.ctx.parallelism, self.ctx.subtask + 1)
        lookup = kafka.lookup_topic(cluster, topic)
        replication = marker_replication_factor(self.marker_replication_factor, lookup.brokers)
        if lookup.topic is None:
            if kafka.create_topic(cluster, topic, needed, replication, MARKER_TOPIC_CONFIG):
                self.ctx.log.info(
                    "kafka_sink_marker_topic_created",
                    marker_topic=topic,
                    partitions=needed,
                    replication_factor=replication,
                    transactional_id=self.transactional_id,
                )
            partitions = kafka.wait_for_partitions(cluster, topic, 1)
        else:
            partitions = lookup.topic.partitions
            if lookup.topic.replication_factor < replication:
                self.ctx.log.warning(
                    "kafka_sink_marker_topic_under_replicated",
                    marker_topic=topic,
                    replication_factor=lookup.topic.replication_factor,
                    wanted=replication,
                    transactional_id=self.transactional_id,
                )
        if partitions < needed:
            kafka.grow_partitions(cluster, topic, needed)
            self.ctx.log.info(
                "kafka_sink_marker_topic_grown",
                marker_topic=topic,
                partitions_before=partitions,
                partitions=needed,
                transactional_id=self.transactional_id,
            )
        self._require_unlimited_retention()

    def _require_unlimited_retention(self) -> None:
        """An existing marker topic with finite retention (or compaction) is altered to keep markers
        for ever; if that fails the sink fails, in one line saying what to set."""
        cluster, topic = self._cluster, self._marker_topic

        def wrong() -> dict[str, str | None]:
            found = kafka.topic_configs(cluster, topic, MARKER_TOPIC_CONFIG)
            return {name: found.get(name) for name, value in MARKER_TOPIC_CONFIG.items() if found.get(name) != value}

        before = wrong()
        if not before:
            return
        needed = ",".join(f"{name}={value}" for name, value in MARKER_TOPIC_CONFIG.items())
        what = (
            f"kafka sink {self.ctx.uid!r} of job {self.ctx.job_id}: marker topic {topic!r} has "
            + ", ".join(f"{name}={value}" for name, value in before.items())
            + ", so commit markers could be deleted and recovery would produce committed epochs again"
        )
        try:
            kafka.set_topic_configs(cluster, topic, {name: MARKER_TOPIC_CONFIG[name] for name in before})
        except ServiceUnavailableError as exc:
            raise MarkerTopicError(
                f"{what}; altering it failed ({exc}): set {needed} on it "
                f"(kafka-configs.sh --alter --entity-type topics --entity-name {topic} --add-config {needed})"
            ) from exc
        # the broker answers the alter once the controller took it; a describe served from a broker's
        # metadata cache may show the old value for a moment: poll until it shows, within a deadline
        deadline = time.monotonic() + MARKER_CONFIG_PROPAGATION_S
        after = wrong()
        while after and time.monotonic() < deadline:
            time.sleep(0.2)
            after = wrong()
        if after:
            raise MarkerTopicError(f"{what}; after altering it still shows {after}: set {needed} on it by hand")
        self.ctx.log.warning(
            "kafka_sink_marker_topic_retention_fixed",
            marker_topic=topic,
            was=before,
            now={name: MARKER_TOPIC_CONFIG[name] for name in before},
            transactional_id=self.transactional_id,
        )

    def _recover(self, snapshot: SinkSnapshot, *, prepared_s: float) -> None:
        """The old producer is fenced: its open transaction is aborted, a requested commit completed.
        Commit what the restored checkpoint lists and the marker topic does not show committed.
        ``prepared_s``: how long ``open`` took before (topics checked, marker topic ensured), for the
        recovery's timeline in the ``kafka_sink_recovered`` event."""
        started = time.perf_counter()
        plan = self._ledger.recover(snapshot.ledger, ())
        pending = sorted(snapshot.ledger.pending)
        if not pending:
            return
        done = self._last_committed(pending, self._marker_sources(snapshot), Deadline(self._recovery_timeout_s))
        reproduced: list[int] = []
        for entry in pending:
            if done is None or entry.checkpoint_id > done:
                records = list(snapshot.epochs[entry.checkpoint_id])
                stamps = array("q", (ts for _key, _value, ts in records if ts is not None))
                epoch = _Epoch(entry.txn, records, stamps, entry.checkpoint_id)
                self._produce_and_commit(epoch, Deadline(self._commit_timeout_s))
                reproduced.append(entry.checkpoint_id)
            self._ledger.committed(entry.txn)
        self.ctx.log.info(
            "kafka_sink_recovered",
            checkpoint_id=plan.checkpoint_id,
            pending=[entry.checkpoint_id for entry in pending],
            last_committed=done,
            reproduced=reproduced,
            marker_topic=self._marker_topic,
            marker_partition=self._marker_partition,
            transactional_id=self.transactional_id,
            fence_s=round(self._fence_s, 4),
            open_s=round(prepared_s, 4),
            recover_s=round(time.perf_counter() - started, 4),
        )

    def _marker_sources(self, snapshot: SinkSnapshot) -> list[tuple[MarkerLocation, int | None]]:
        """Where the markers of the snapshot's pending epochs can be, newest first, each with the
        offset no such marker lies below (None: unknown, read the whole partition). Usually just this
        subtask's partition from the snapshot's marker floor; for a snapshot taken with another marker
        topic (or before sinks had their own), that one too, after the markers a recovery from the
        same snapshot may have written here since."""
        current = self._marker
        if snapshot.marker_topic is not None and snapshot.marker_partition is not None:
            taken = MarkerLocation(snapshot.marker_topic, snapshot.marker_partition)
        elif snapshot.marker_floor is not None:
            taken = self._legacy_marker_location(snapshot.marker_floor)
        else:
            return [(current, None)]  # no pending epoch had reached Kafka: only a recovery's markers
        if taken == current:
            return [(current, snapshot.marker_floor)]
        return [(current, None), (taken, snapshot.marker_floor)]

    def _legacy_marker_location(self, floor: int) -> MarkerLocation:
        """Where a snapshot taken before sinks had their own marker topic put its markers."""
        layout = kafka.lookup_topic(self._cluster, COMMIT_MARKER_TOPIC).topic
        if layout is None:
            raise CommitMarkerLostError(
                f"{self._what()}: the restored checkpoint's commit markers are in topic {COMMIT_MARKER_TOPIC!r} from "
                f"offset {floor}, and that topic no longer exists: recovery cannot tell which checkpoints committed "
                "and will not guess (duplicates or lost output); restore from a checkpoint taken after the upgrade"
            )
        return MarkerLocation(COMMIT_MARKER_TOPIC, kafka.stable_partition(self._marker_key, layout.partitions))

    def _what(self) -> str:
        return f"kafka sink {self.ctx.uid!r} of job {self.ctx.job_id} subtask {self.ctx.subtask}"

    def _last_committed(
        self,
        pending: Sequence[PendingTransaction],
        sources: Sequence[tuple[MarkerLocation, int | None]],
        deadline: Deadline,
    ) -> CheckpointId | None:
        wanted = {entry.checkpoint_id for entry in pending}
        for location, floor in sources:
            topic, partition = location.topic, location.partition
            low, high = kafka.partition_range(self._cluster, topic, partition)
            if floor is not None and not low <= floor <= high:
                raise self._marker_lost(location, floor, low, high, pending)
            candidates: list[tuple[int, CheckpointId]] = []
            start = low if floor is None else floor
            for offset, key, value in kafka.scan_partition(
                self._cluster, topic, partition, start, high, deadline.remaining()
            ):
                marker = CommitMarker.parse(value) if key == self._marker_key else None
                if marker is not None and marker.belongs_to(self._task) and marker.checkpoint_id in wanted:
                    candidates.append((offset, CheckpointId(marker.checkpoint_id)))
            done = last_committed_checkpoint(candidates, self._committed_check(location, deadline))
            if done is not None:
                return done
        return None

    def _committed_check(self, location: MarkerLocation, deadline: Deadline) -> Callable[[int], bool]:
        """Whether the marker at an offset of ``location`` was committed (waits for its outcome)."""

        def committed(offset: int) -> bool:
            return kafka.is_committed(self._cluster, location.topic, location.partition, offset, deadline.remaining())

        return committed

    def _marker_lost(
        self, location: MarkerLocation, floor: int, low: int, high: int, pending: Sequence[PendingTransaction]
    ) -> CommitMarkerLostError:
        checkpoints = [int(entry.checkpoint_id) for entry in pending]
        where = (
            f"below the partition's log start offset {low} (deleted by retention or DeleteRecords)"
            if floor < low
            else f"past the partition's end {high} (the topic was deleted and created again)"
        )
        self.ctx.log.error(
            "kafka_sink_commit_marker_lost",
            marker_topic=location.topic,
            marker_partition=location.partition,
            marker_floor=floor,
            log_start_offset=low,
            high_watermark=high,
            pending=checkpoints,
            transactional_id=self.transactional_id,
        )
        return CommitMarkerLostError(
            f"{self._what()}: the commit markers of restored checkpoint(s) {checkpoints} are at {location} from "
            f"offset {floor}, {where}: recovery cannot tell whether they committed and will not guess (duplicates or "
            "lost output); restore the job from a later checkpoint, or rebuild the sink topic from the job's input"
        )

    # Records and barriers -------------------------------------------------------------------------

    def _begin_epoch(self) -> _Epoch:
        txn = self._ledger.begin()
        epoch = self._current = _Epoch(txn, self._spill.epoch(txn.checkpoint_id))
        if self._in_kafka is None:
            self._begin_in_kafka(epoch)
        return epoch

    def process(self, value: Any, timestamp: int | None) -> None:
        # encode_for_kafka, inline (once per record): only the user's functions inside ``try``.
        key_of = self._key
        try:
            key = key_of(value) if key_of is not None else None
        except Exception as exc:
            self.reject(key_of, exc, value, timestamp)
            return
        serializer = self._serializer
        try:
            data = serializer(value)
            if data is None and key is None:  # a tombstone deletes a key: it needs one
                raise TypeError(NO_TOMBSTONES)
        except Exception as exc:
            self.reject(serializer, exc, value, timestamp)
            return
        if isinstance(key, str):
            key = key.encode()
        epoch = self._current if self._current is not None else self._begin_epoch()
        epoch.items.append((key, data, timestamp))
        if timestamp is not None:
            epoch.timestamps.append(timestamp)
        if self._in_kafka is epoch:  # its transaction is open: straight to the producer
            producer = self._producer
            assert producer is not None
            producer.produce(self._topic, data, key, timestamp)
            self._produced += 1
            if self._produced % _POLL_EVERY == 0:
                producer.poll()

    def _begin_in_kafka(self, epoch: _Epoch) -> None:
        assert self._producer is not None and self._in_kafka is None
        self._producer.begin()
        self._in_kafka, self._in_kafka_since, self._produced = epoch, time.monotonic(), 0
        self._produce_records(epoch)

    def _produce_records(self, epoch: _Epoch) -> None:
        """Hand the epoch's records so far to the producer (its just opened transaction)."""
        producer = self._producer
        assert producer is not None and self._produced == 0
        topic = self._topic
        for key, value, timestamp in epoch.items:
            producer.produce(topic, value, key, timestamp)
            self._produced += 1
            if self._produced % _POLL_EVERY == 0:
                producer.poll()
        producer.poll()

    def _pre_commit_in_kafka(self, epoch: _Epoch, deadline: Deadline) -> None:
        """End writing into the epoch's transaction: its marker, then every record acknowledged. The
        transaction stays open until a covering checkpoint completes."""
        producer = self._producer
        assert producer is not None and self._in_kafka is epoch and epoch.checkpoint_id is not None
        marker = CommitMarker(
            self._task.job_id,
            self._task.operator_uid,
            self._task.subtask,
            epoch.checkpoint_id,
            epoch.size,
            self.transactional_id,
        )
        delivery = kafka.Delivery()
        producer.produce(
            self._marker_topic, marker.to_json(), self._marker_key, partition=self._marker_partition, delivery=delivery
        )
        producer.flush(deadline.remaining())
        self._markers[epoch.txn] = delivery
        if delivery.offset is not None:
            self._marker_watermark = max(self._marker_watermark, delivery.offset + 1)

    def _pre_commit(self, checkpoint_id: CheckpointId) -> _Epoch | None:
        epoch = self._close_epoch(checkpoint_id)
        if epoch is not None and self._in_kafka is epoch:
            self._pre_commit_in_kafka(epoch, Deadline(self._commit_timeout_s))
        return epoch

    def _snapshot(self) -> SinkSnapshot:
        offsets = [
            delivery.offset
            for txn in self._pending
            if (delivery := self._markers.get(txn)) is not None and delivery.offset is not None
        ]
        return SinkSnapshot(
            self._ledger.snapshot_state(),
            {epoch.checkpoint_id: epoch.items for epoch in self._pending.values() if epoch.checkpoint_id is not None},
            min(offsets, default=self._marker_watermark),  # a later recovery's markers land at or above it
            self._marker_topic,
            self._marker_partition,
        )

    # Commits --------------------------------------------------------------------------------------

    def _commit(self, epoch: _Epoch) -> None:
        deadline = Deadline(self._commit_timeout_s)
        if self._in_kafka is epoch:
            self._commit_in_kafka(epoch, deadline)
        else:
            self._produce_and_commit(epoch, deadline)
        self._markers.pop(epoch.txn, None)
        if isinstance(epoch.items, EpochRecords):
            epoch.items.discard()  # its spill file, if any, goes now

    def _produce_and_commit(self, epoch: _Epoch, deadline: Deadline) -> None:
        self._begin_in_kafka(epoch)
        self._pre_commit_in_kafka(epoch, deadline)
        self._commit_in_kafka(epoch, deadline)

    def _commit_in_kafka(self, epoch: _Epoch, deadline: Deadline) -> None:
        producer = self._producer
        assert producer is not None and self._in_kafka is epoch
        started = time.perf_counter()
        producer.commit(deadline.remaining())
        self._in_kafka, self._in_kafka_since = None, None
        self._observe_commit(epoch, started, epoch.size)

    def _catch_up(self) -> None:
        """With no Kafka transaction open, open one for the oldest epoch waiting: a pending one is
        pre-committed in Kafka now; the current one goes on producing as its records arrive."""
        if self._in_kafka is not None:
            return
        if self._pending:
            oldest = next(iter(self._pending.values()))
            self._begin_in_kafka(oldest)
            self._pre_commit_in_kafka(oldest, Deadline(self._commit_timeout_s))
        elif self._current is not None:
            self._begin_in_kafka(self._current)

    def _open_transaction_age(self) -> float:
        since = self._in_kafka_since
        return 0.0 if since is None else time.monotonic() - since

    def _uncommitted(self) -> list[UncommittedEpoch]:
        """Also the epochs the spill still holds: an epoch's records stay there until it commits."""
        left = super()._uncommitted()
        known = {epoch.epoch for epoch in left}
        spilled = self._spill.held_epochs()
        return left + [UncommittedEpoch(epoch, n, None) for epoch, n in spilled.items() if epoch not in known]

    def _transaction_name(self, epoch: _Epoch) -> dict[str, Any]:
        return self._sink_transactions()

    def _sink_transactions(self) -> dict[str, Any]:
        return {"transactional_id": self.transactional_id}

    def _in_external_system(self, epoch: _Epoch) -> bool:
        return self._in_kafka is epoch

    def close(self) -> None:
        fencing, self._fencing = self._fencing, None
        if fencing is not None:  # started, never taken (cancelled or failed before restore_state)
            fencing.add_done_callback(_close_fenced_producer)
        producer = self._producer
        if producer is not None:
            epoch = self._in_kafka
            if epoch is not None:
                try:
                    producer.abort(5.0)
                    self._metrics.aborted.inc()
                    self.ctx.log.info(
                        "sink_transaction_aborted",
                        checkpoint_id=epoch.checkpoint_id,
                        epoch=epoch.txn.checkpoint_id,
                        records=epoch.size,
                        reason="closed with the transaction open",
                        transactional_id=self.transactional_id,
                    )
                except WeirError as exc:  # fenced or unreachable: fencing or its timeout ends it
                    self.ctx.log.warning("kafka_sink_abort_on_close_failed", error=str(exc))
                self._in_kafka = None
            producer.close()
            self._producer = None
        spill = getattr(self, "_spill", None)
        if spill is not None:
            spill.close()
        super().close()


# PostgreSQL ---------------------------------------------------------------------------------------


class SinkFencedError(WeirError):
    """A newer attempt of the job owns this sink subtask: this (older) attempt must stop without
    preparing, committing or rolling back any of the subtask's transactions."""

    fault: Fault = Fault.INTERNAL


def sink_fenced_error(task: TaskId, attempt: int, owner_attempt: int) -> SinkFencedError:
    from weir.connectors import postgres

    return SinkFencedError(
        f"postgres sink {task.operator_uid!r} of job {task.job_id} subtask {task.subtask}: attempt {attempt} is "
        f"fenced, attempt {owner_attempt} owns the subtask's transactions now ({postgres.SINK_OWNER_TABLE}): this "
        "task is left over from a cancelled attempt and stops without touching them; nothing to do"
    )


def validate_postgres_sink(
    endpoints: Endpoints, table: str, columns: Sequence[str], key_columns: Sequence[str], *, two_phase: bool
) -> None:
    """Submit-time check of a PostgreSQL sink, in one read-only session (creates nothing): the server
    answers (ServiceUnavailableError naming the dsn without its password), the table has the columns
    and a unique key on exactly the key columns, and, for the two-phase sink, the server can prepare
    transactions (JobDefinitionError, one line each)."""
    from weir.connectors import postgres

    with postgres.connect(endpoints, autocommit=True, read_only=True) as conn:
        postgres.require_table(conn, table, columns, key_columns)
        if two_phase:
            postgres.check_prepared_transactions(
                postgres.max_prepared_transactions(conn),
                sink=f"postgres sink on {table!r}",
                server=postgres.server_name(conn),
            )


def _close_fenced_producer(fencing: Future[kafka.TransactionalProducer]) -> None:
    if fencing.exception() is None:
        fencing.result().close()


class TwoPhasePostgresSinkOperator(_TransactionalSink):
    """Exactly-once PostgreSQL sink: per checkpoint epoch one transaction, prepared at the barrier
    (``PREPARE TRANSACTION`` under the ledger's gid) and committed (``COMMIT PREPARED``) when a covering
    checkpoint completes. A record upserts its row by the key columns or deletes a key (the ``row``
    function returns ``Delete(key)``); an epoch's changes are collapsed per key to the one write with
    the effect of applying them in order (``KeyedChanges``), deletes written before upserts.

    Fencing: every attempt of the job claims the subtask in ``weir_sink_owners`` at open, before its
    recovery touches anything, and keeps the claim in its session (an advisory lock). A newer attempt's
    claim ends an older attempt's session; an older attempt's claim fails (``SinkFencedError``). So an
    attempt that was cancelled but still runs can neither roll back nor commit nor prepare anything of
    the attempt that replaced it."""

    _kind = "postgres"

    def __init__(
        self,
        table: str,
        columns: Sequence[str],
        key_columns: Sequence[str],
        to_row: Callable[[Any], tuple[Any, ...] | Delete],
        *,
        version_column: str | None = None,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        claim_timeout_s: float = DEFAULT_CLAIM_TIMEOUT_S,
        on_error: OnRecordError = FAIL,
    ) -> None:
        self._table = table
        self._columns = tuple(columns)
        self._key_columns = tuple(key_columns)
        self._to_row = to_row
        self.on_error = on_error
        self._version_column = version_column
        self._lock_timeout_s = lock_timeout_s
        self._claim_timeout_s = claim_timeout_s
        self._key_index, self._version_index = row_key_indexes(table, columns, key_columns, version_column)
        self._prepared: _Epoch | None = None  # the epoch prepared in PostgreSQL, waiting for its commit
        self._conn: Any = None  # the owning session (psycopg.Connection), from open() on

    def _what(self, checkpoint_id: int | None = None) -> str:
        at = f" checkpoint {checkpoint_id}" if checkpoint_id is not None else ""
        return f"postgres sink {self.ctx.uid!r} of job {self.ctx.job_id} subtask {self.ctx.subtask}{at}"

    def validate_at_submit(self, endpoints: Endpoints, parameters: Mapping[str, str] = NO_PARAMETERS) -> None:
        """At submit, before any task runs (no ``setup``): PostgreSQL answers, the table has the columns
        and a unique key on exactly the key columns, and max_prepared_transactions > 0. Creates nothing."""
        validate_postgres_sink(endpoints, self._table, self._columns, self._key_columns, two_phase=True)

    # Start and recovery ---------------------------------------------------------------------------

    def restore_state(self, data: bytes) -> None:
        self._restored = SinkSnapshot.from_bytes(data)

    def open(self) -> None:
        # A restarted or restarting server is waited for (with back-off) rather than failing the task
        # at once: every restart that finds it still down is one more failover, and a fixed-delay
        # strategy would spin through its attempts while the server comes up.
        from weir.connectors import postgres

        conn = postgres.connect(self._endpoints, autocommit=True, retry_for_s=RECONNECT_WINDOW_S)
        self._conn = conn
        postgres.require_table(conn, self._table, self._columns, self._key_columns)
        postgres.check_prepared_transactions(
            postgres.max_prepared_transactions(conn), sink=self._what(), server=postgres.server_name(conn)
        )
        postgres.ensure_commit_proof_table(conn)
        postgres.ensure_sink_owner_table(conn)
        self._claim()
        self._plan = postgres.upsert_plan(conn, self._table, self._columns, self._key_columns, self._version_column)
        self._recover(self._restored)
        self._restored = None

    # Ownership (fencing) --------------------------------------------------------------------------

    def _owner(self) -> postgres.SinkOwner:
        from weir.connectors import postgres

        task = self._task
        return postgres.SinkOwner(task.job_id, task.operator_uid, task.subtask, self.ctx.attempt)

    def _owner_fields(self, **extra: Any) -> dict[str, Any]:
        return {
            "job_id": self.ctx.job_id,
            "operator_uid": self.ctx.uid,
            "subtask": self.ctx.subtask,
            "attempt": self.ctx.attempt,
            **extra,
        }

    def _claim(self) -> None:
        """Own the subtask before anything of it is read or resolved; a newer owner fences this attempt."""
        from weir.connectors import postgres

        try:
            claim = postgres.claim_sink_owner(
                self._conn, self._owner(), timeout_s=self._claim_timeout_s, what=self._what()
            )
        except WeirError:
            self._release()  # a session that may hold the lock without being recorded as the owner
            raise
        if claim.fenced:
            assert claim.recorded_attempt is not None
            self._release()
            self.ctx.log.warning("postgres_sink_fenced", **self._owner_fields(owner_attempt=claim.recorded_attempt))
            raise sink_fenced_error(self._task, self.ctx.attempt, claim.recorded_attempt)
        self.ctx.log.info(
            "postgres_sink_owner_claimed",
            **self._owner_fields(previous_attempt=claim.recorded_attempt, ended_sessions=list(claim.ended_sessions)),
        )

    @contextmanager
    def _as_owner(self) -> Iterator[None]:
        """Statements of the owning session. When the session ended under them and a newer attempt
        is recorded as the owner, this attempt was fenced: SinkFencedError instead of the bare failure."""
        from weir.connectors import postgres

        try:
            yield
        except ServiceUnavailableError as exc:
            conn = self._conn
            if conn is None or not postgres.session_lost(conn):
                raise
            owner_attempt = self._recorded_owner()
            if owner_attempt is None or owner_attempt <= self.ctx.attempt:
                raise
            self.ctx.log.warning("postgres_sink_fenced", **self._owner_fields(owner_attempt=owner_attempt))
            raise sink_fenced_error(self._task, self.ctx.attempt, owner_attempt) from exc

    def _recorded_owner(self) -> int | None:
        """The attempt recorded as the owner, read in a fresh session (None if that fails too)."""
        from weir.connectors import postgres

        task = self._task
        try:
            with postgres.connect(self._endpoints, autocommit=True, read_only=True) as conn:
                return postgres.sink_owner_attempt(conn, task.job_id, task.operator_uid, task.subtask)
        except (WeirError, OSError):
            return None

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()  # ends the session: its advisory lock goes; a prepared transaction stays

    def _recover(self, snapshot: SinkSnapshot | None) -> None:
        """Resolve this subtask's prepared transactions: roll back those the restored checkpoint does
        not list, commit those it lists; write an epoch the snapshot holds that never reached PostgreSQL.
        Runs as the owner (claimed just before): a newer attempt's claim ends it at its next statement."""
        with self._as_owner():
            self._resolve(snapshot)

    def _resolve(self, snapshot: SinkSnapshot | None) -> None:
        from weir.connectors import postgres

        task = self._task
        in_doubt = set()
        for gid in postgres.prepared_gids(self._conn, gid_prefix(task)):
            txn = TransactionId.parse(gid, job_id=task.job_id, operator_uid=task.operator_uid, subtask=task.subtask)
            if txn is not None:
                in_doubt.add(txn)
        plan = self._ledger.recover(snapshot.ledger if snapshot is not None else None, in_doubt)
        for txn in plan.rollback:
            if postgres.rollback_prepared(self._conn, txn.gid):
                self._metrics.aborted.inc()
                self.ctx.log.info(
                    "sink_transaction_aborted",
                    gid=txn.gid,
                    epoch=txn.checkpoint_id,
                    reason="prepared, but not in the restored checkpoint",
                )
        resolved: dict[str, list[int]] = {"committed_prepared": [], "already_committed": [], "written": []}
        pending = sorted(snapshot.ledger.pending) if snapshot is not None else []
        unprepared = snapshot.epochs if snapshot is not None else {}
        for entry in pending:
            if entry.txn in in_doubt:
                started = time.perf_counter()
                postgres.commit_prepared(self._conn, entry.txn.gid)
                duration_s = time.perf_counter() - started
                rows = self._committed_rows(entry.checkpoint_id) or 0
                self._metrics.on_commit(duration_s, rows, (), 0.0)
                self.ctx.log.info(
                    "sink_transaction_committed",
                    checkpoint_id=entry.checkpoint_id,
                    duration_s=round(duration_s, 4),
                    records=rows,
                    gid=entry.txn.gid,
                    recovered=True,
                )
                resolved["committed_prepared"].append(entry.checkpoint_id)
            elif self._committed_rows(entry.checkpoint_id) is not None:
                resolved["already_committed"].append(entry.checkpoint_id)
            elif entry.checkpoint_id in unprepared:
                assert snapshot is not None
                changes = KeyedChanges.decode(
                    unprepared[entry.checkpoint_id], snapshot.format, self._key_index, self._version_index
                )
                self._write(_Epoch(entry.txn, changes, checkpoint_id=entry.checkpoint_id), prepare=False)
                resolved["written"].append(entry.checkpoint_id)
            else:
                raise self._lost(entry.txn, entry.checkpoint_id)
            self._ledger.committed(entry.txn)
        self.ctx.log.info(
            "postgres_sink_recovered",
            checkpoint_id=plan.checkpoint_id,
            rolled_back=[txn.gid for txn in plan.rollback],
            **resolved,
        )

    def _committed_rows(self, checkpoint_id: int) -> int | None:
        from weir.connectors import postgres

        task = self._task
        return postgres.committed_rows(self._conn, task.job_id, task.operator_uid, task.subtask, checkpoint_id)

    def _lost(self, txn: TransactionId, checkpoint_id: CheckpointId) -> SinkTransactionLostError:
        from weir.connectors import postgres

        return SinkTransactionLostError(
            f"{self._what(checkpoint_id)}: transaction {txn.gid} was prepared, but it is no longer prepared and "
            f"{postgres.COMMIT_PROOF_TABLE} shows no commit of it: it was rolled back outside this run (by hand, "
            "or by another run of the same job id restored from an older checkpoint), so its rows are missing "
            f"from {self._table!r}; rerun the job's input from before checkpoint {checkpoint_id} to rewrite them"
        )

    # Records and barriers -------------------------------------------------------------------------

    def _begin_epoch(self) -> _Epoch:
        epoch = self._current = _Epoch(self._ledger.begin(), KeyedChanges(self._key_index, self._version_index))
        return epoch

    def process(self, value: Any, timestamp: int | None) -> None:
        change = row_for_postgres(self, self._to_row, len(self._columns), len(self._key_columns), value, timestamp)
        if change is None:
            return
        epoch = self._current if self._current is not None else self._begin_epoch()
        epoch.items.add(change)
        if timestamp is not None:
            epoch.timestamps.append(timestamp)

    def _proof(self, checkpoint_id: int, rows: int) -> postgres.ProofRow:
        from weir.connectors import postgres

        return postgres.ProofRow(self._task.job_id, self._task.operator_uid, self._task.subtask, checkpoint_id, rows)

    def _write(self, epoch: _Epoch, prepare: bool) -> None:
        """The epoch's changes and proof row in one transaction: prepared under its gid, or committed.
        The proof counts the keys changed (upserted or deleted), so ``weir verify`` counts deletes too."""
        from weir.connectors import postgres

        assert epoch.checkpoint_id is not None
        changes: KeyedChanges = epoch.items
        written = len(changes)
        started = time.perf_counter()
        with self._as_owner():
            postgres.write_transaction(
                self._conn,
                self._plan,
                changes.deletes(),
                changes.upserts(),
                self._proof(epoch.checkpoint_id, written),
                prepare_as=epoch.txn.gid if prepare else None,
                lock_timeout_s=self._lock_timeout_s,
                what=self._what(epoch.checkpoint_id),
            )
        if prepare:
            self._prepared = epoch
            self._metrics.prepared.set(1)
        else:
            self._observe_commit(epoch, started, written)

    def _pre_commit(self, checkpoint_id: CheckpointId) -> _Epoch | None:
        epoch = self._close_epoch(checkpoint_id)
        if epoch is not None and self._prepared is None and next(iter(self._pending.values())) is epoch:
            self._write(epoch, prepare=True)
        return epoch

    def _snapshot(self) -> SinkSnapshot:
        unprepared = {
            epoch.checkpoint_id: epoch.items.encode()
            for epoch in self._pending.values()
            if epoch is not self._prepared and epoch.checkpoint_id is not None
        }
        return SinkSnapshot(self._ledger.snapshot_state(), unprepared)

    # Commits --------------------------------------------------------------------------------------

    def _before_commits(self, context: dict[str, Any]) -> None:
        crash_point(BETWEEN_SINK_COMMITS, **context)
        super()._before_commits(context)

    def _commit(self, epoch: _Epoch) -> None:
        from weir.connectors import postgres

        if self._prepared is not epoch:
            self._write(epoch, prepare=False)
            return
        assert epoch.checkpoint_id is not None
        started = time.perf_counter()
        with self._as_owner():
            found = postgres.commit_prepared(self._conn, epoch.txn.gid)
            self._prepared = None
            self._metrics.prepared.set(0)
            if not found and self._committed_rows(epoch.checkpoint_id) is None:
                raise self._lost(epoch.txn, epoch.checkpoint_id)
        self._observe_commit(epoch, started, epoch.size)

    def _catch_up(self) -> None:
        if self._prepared is None and self._pending:
            self._write(next(iter(self._pending.values())), prepare=True)

    def _transaction_name(self, epoch: _Epoch) -> dict[str, Any]:
        return {"gid": epoch.txn.gid}

    def _sink_transactions(self) -> dict[str, Any]:
        return {"gid_prefix": gid_prefix(self._task)}

    def _in_external_system(self, epoch: _Epoch) -> bool:
        return self._prepared is epoch

    def close(self) -> None:
        self._release()  # a prepared transaction outlives the session; an unprepared one rolls back
        super().close()


def encode_for_kafka(
    sink: StreamOperator,
    serializer: Callable[[Any], bytes | None],
    key: Callable[[Any], bytes | str | None] | None,
    value: Any,
    timestamp: int | None,
) -> tuple[bytes | str | None, bytes | None] | None:
    """A Kafka sink's record, by its user functions: the key (``key``, else None) and the value
    bytes (``serializer``; None with a key: a tombstone). None: one of them raised and ``sink.reject``
    dead-lettered the record (else it raised). Only these calls are inside ``try``: the producer's own
    errors pass up as they are."""
    try:
        record_key = key(value) if key is not None else None
    except Exception as exc:
        sink.reject(key, exc, value, timestamp)
        return None
    try:
        data = serializer(value)
        if data is None and record_key is None:  # a tombstone deletes a key: it needs one
            raise TypeError(NO_TOMBSTONES)
    except Exception as exc:
        sink.reject(serializer, exc, value, timestamp)
        return None
    return record_key, data


def row_for_postgres(
    sink: StreamOperator,
    to_row: Callable[[Any], tuple[Any, ...] | Delete],
    width: int,
    key_width: int,
    value: Any,
    timestamp: int | None,
) -> tuple[Any, ...] | Delete | None:
    """A PostgreSQL sink's change of ``value`` by its ``to_row``: a row of ``width`` values (one per
    column) to upsert, or ``Delete`` of a key of ``key_width`` values (one per key column). None:
    ``to_row`` raised (or gave another number of values) and ``sink.reject`` dead-lettered the record
    (else it raised). PostgreSQL's own errors are not caught here."""
    try:
        given = to_row(value)
        if isinstance(given, Delete):
            if len(given.key) != key_width:
                raise TypeError(f"the Delete key has {len(given.key)} values for {key_width} key columns")
            return given
        row = tuple(given)
        if len(row) != width:
            raise TypeError(f"the row has {len(row)} values for {width} columns")
    except Exception as exc:
        sink.reject(to_row, exc, value, timestamp)
        return None
    return row


def row_key_indexes(
    table: str, columns: Sequence[str], key_columns: Sequence[str], version_column: str | None
) -> tuple[tuple[int, ...], int | None]:
    """Positions of the key columns and of the version column in a row of ``columns``."""
    missing = [c for c in (*key_columns, *([version_column] if version_column else [])) if c not in columns]
    if missing or not key_columns:
        raise JobDefinitionError(
            f"postgres sink on {table!r}: key columns {list(key_columns)} (and the version column, if any) must "
            f"be among the columns {list(columns)}; missing: {missing or 'key columns'}"
        )
    columns = list(columns)
    return tuple(columns.index(c) for c in key_columns), (columns.index(version_column) if version_column else None)
