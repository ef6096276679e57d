"""One subtask: an operator chain run by one thread, fed by its input gate or by its source.

The thread owns every operator of the chain: records, watermarks, barriers, checkpoint
notifications and cancellation are all handled on it, so operators never need locks. It waits on
one mailbox: control mails and, for a task with inputs, the buffers of its input gate wake it
through the same signal (Flink's MailboxProcessor).

A record's path: source or input gate -> :class:`~weir.taskmanager.chain.OperatorChain` -> a
:class:`NetworkOutput` per edge -> its RecordWriter -> channels to the consumers' input gates.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, assert_never

import pyarrow as pa
import structlog

from weir.connectors.object_storage import CheckpointStorage
from weir.core.checkpointing import BarrierAlignment, ChannelBarrierTime, CheckpointKind, SubtaskCheckpointTimeline
from weir.core.columnar import BatchKeys, FieldKey, is_batch
from weir.core.crashpoints import crash_point
from weir.core.errors import Fault, SerializationError, WeirError
from weir.core.failures import Failure
from weir.core.ids import ChannelIndex, CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.core.keygroups import KeyEncoder, KeyGroupRange, key_group_range_for_subtask
from weir.core.metrics import TaskMetrics
from weir.core.process_functions import Clock, wall_clock_ms
from weir.core.rejections import SourcePosition
from weir.core.rescale import key_group_sources
from weir.core.state_schema import StoredSchema, merge_stored_schemas
from weir.core.states import TaskState
from weir.core.task_state import (
    INFLIGHT_REDISTRIBUTION_REFUSED,
    OperatorStateHandle,
    SubtaskLayout,
    TaskStateDocument,
    read_operator_states,
)
from weir.core.task_time import TimeRatios, TimeTotals, ratios_between
from weir.core.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    ReportsWatermarkStatus,
    WatermarkStatus,
)
from weir.graph import Partitioning
from weir.operators.base import InheritedState, OperatorContext, SourceOperator
from weir.operators.keyed import KeyedOperator
from weir.operators.rejections import KafkaDeadLetters, RecordRejections
from weir.plan import JobPlan, Vertex
from weir.taskmanager import barrier_aligner as ba
from weir.taskmanager.barrier_aligner import AlignmentMode, BarrierAligner
from weir.taskmanager.chain import ChainInput, OperatorChain
from weir.taskmanager.inflight import (
    INFLIGHT_STATE_NAME,
    InflightCapture,
    InflightState,
    InputOrigin,
    OutputTarget,
    decode_inflight,
    encode_inflight,
    parse_message,
)
from weir.taskmanager.mailbox import (
    Cancel,
    CheckpointAborted,
    CheckpointComplete,
    CheckpointRequest,
    Mail,
    Mailbox,
    TriggerCheckpoint,
)
from weir.taskmanager.network import (
    Barrier,
    CancelBarrier,
    Cancelled,
    ChannelBuffer,
    ChannelEvent,
    EndOfStream,
    InputGate,
    ReceivedBuffer,
    RecordWriter,
    WatermarkActive,
    WatermarkEvent,
    WatermarkIdle,
    barrier_message,
    cancel_barrier_message,
    encode_into,
    encode_records,
    end_of_stream_message,
    message_of,
    read_buffer,
    watermark_message,
    watermark_status_message,
)
from weir.taskmanager.snapshots import KeyedStateHandle, SnapshotError, TaskKeyedState, keyed_state_from_document
from weir.wire.taskmanager_pb2 import DataMessage

SOURCE_BATCH = 500
SOURCE_IDLE_WAIT_MAX_S = 0.05
"""Longest wait between two polls of a source that had nothing to read (a mail ends it at once)."""
METRICS_SYNC_S = 0.5
FINAL_NOTIFICATION_TIMEOUT_S = 120.0


class CheckpointNotificationTimeout(WeirError):
    """A finished task never learnt whether its last checkpoints completed; the job restarts from the
    latest completed checkpoint (retriable)."""

    retriable = True
    fault = Fault.INTERNAL


class InflightStateNotRedistributable(WeirError):
    """A restore met in-flight records of an unaligned checkpoint that it cannot place (documented
    limits: another operator chain, a broadcast edge at another parallelism, output buffers named by
    index only in a task that now has several outputs): restore from a savepoint."""

    retriable = False
    fault = Fault.USER


@dataclass(frozen=True)
class _InflightReplay:
    """What a restore feeds in before any new input, from an unaligned checkpoint's in-flight state:
    output buffers sent as they were (``sends``: output, channel, buffer) or, at another parallelism,
    their records emitted anew (``emits``: output, buffer), then input buffers into the chain by channel."""

    checkpoint_id: CheckpointId
    sends: tuple[tuple[int, int, DataMessage], ...] = ()
    emits: tuple[tuple[int, DataMessage], ...] = ()
    inputs: tuple[tuple[ChannelIndex, DataMessage], ...] = ()
    redistributed: bool = False


@dataclass(frozen=True)
class _KeyGroupFilter:
    """Which records (or rows of a record batch) of a keyed edge belong to the key groups ``owned``."""

    key_selector: Callable[[Any], Any]
    key_group_of: Callable[[Any], int]
    owned: KeyGroupRange
    max_parallelism: int

    def record(self, value: Any) -> bool:
        return self.key_group_of(self.key_selector(value)) in self.owned

    def rows(self, batch: Any) -> Any:
        if not isinstance(self.key_selector, FieldKey):
            raise SnapshotError(f"a columnar keyed edge keyed by {self.key_selector!r}, not by a field")
        groups = BatchKeys(self.key_selector.field, self.max_parallelism).key_groups(batch)
        return (groups >= self.owned.start) & (groups <= self.owned.end)


def _owned_by(
    key_selector: Callable[[Any], Any] | None,
    key_group_of: Callable[[Any], int],
    owned: KeyGroupRange,
    max_parallelism: int,
) -> _KeyGroupFilter:
    """Whether a record of a keyed edge belongs to the key groups ``owned``."""
    if key_selector is None:
        raise SnapshotError("a keyed edge without a key selector")
    return _KeyGroupFilter(key_selector, key_group_of, owned, max_parallelism)


def _records_where(message: DataMessage, keep: _KeyGroupFilter) -> DataMessage | None:
    """A buffer of the records of ``message`` that ``keep`` accepts (no event); None if none."""
    buffer = read_buffer(message)
    if buffer.values and is_batch(buffer.values[0]):
        batches = [b.filter(pa.array(keep.rows(b))) for b in buffer.values]
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return None
        msg = DataMessage()
        encode_into(msg, batches, [None] * len(batches))
        return msg
    kept = [(v, t) for v, t in zip(buffer.values, buffer.timestamps, strict=True) if keep.record(v)]
    if not kept:
        return None
    return DataMessage(records=encode_records([v for v, _ in kept], [t for _, t in kept]), record_count=len(kept))


class _UnalignedAck:
    """Joins the two halves of an unaligned checkpoint's acknowledgement, which finish on different
    threads: the snapshot's (after its keyed upload, on the snapshotter's thread) and the in-flight
    capture's (on the task thread, once the last barrier arrived). The ack goes out when both are in."""

    __slots__ = ("_ack", "_buffer_bytes", "_channels", "_dropped", "_inflight", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ack: CheckpointAck | None = None
        self._inflight: bytes | None = None
        self._buffer_bytes = 0
        self._channels: tuple[ChannelBarrierTime, ...] = ()  # every channel's barrier, known at the capture's end
        self._dropped = False

    def snapshot_done(self, ack: CheckpointAck) -> CheckpointAck | None:
        with self._lock:
            self._ack = ack
            return self._ready()

    def inflight_done(
        self, inflight: bytes, buffer_bytes: int, channels: tuple[ChannelBarrierTime, ...]
    ) -> CheckpointAck | None:
        with self._lock:
            self._inflight = inflight
            self._buffer_bytes = buffer_bytes
            self._channels = channels
            return self._ready()

    def drop(self) -> None:
        with self._lock:
            self._dropped = True

    def _ready(self) -> CheckpointAck | None:
        ack, inflight = self._ack, self._inflight
        if self._dropped or ack is None or inflight is None:
            return None
        self._dropped = True  # sent once
        states = {**ack.snapshot.operator_states, INFLIGHT_STATE_NAME: inflight}
        timeline = replace(ack.timeline, channels=self._channels) if ack.timeline is not None else None
        return replace(
            ack,
            snapshot=replace(ack.snapshot, operator_states=states),
            timeline=timeline,
            inflight_bytes=self._buffer_bytes,
        )


@dataclass(frozen=True)
class TaskAddress:
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
    snapshot: ChainSnapshot
    alignment_s: float
    start_delay_s: float
    sync_s: float
    async_s: float
    timeline: SubtaskCheckpointTimeline | None = None  # None: not recorded (the task always records it)
    inflight_bytes: int = 0  # of the in-flight buffers an unaligned checkpoint persisted (not their document)


@dataclass(frozen=True)
class _BarrierTimes:
    """When a checkpoint's barriers reached the task, up to its snapshot (epoch seconds): the first
    barrier (at a source, the trigger), each channel's so far, the alignment's end."""

    first_barrier_at: float
    alignment_end_at: float
    barriers: tuple[ba.BarrierArrival, ...] = ()


@dataclass(frozen=True)
class TaskCallbacks:
    """How a task reports to its TaskManager (which forwards to the JobManager)."""

    on_state: Callable[[TaskAddress, TaskState, Failure | None], None]
    on_checkpoint: Callable[[TaskAddress, CheckpointAck], None]
    on_decline: Callable[[TaskAddress, int, str], None]
    on_input_ended: Callable[[TaskAddress], None]


class NetworkOutput:
    """An edge out of the chain into its RecordWriter; watermarks ride along with the next flush."""

    __slots__ = ("pending_watermark", "writer")

    def __init__(self, writer: RecordWriter) -> None:
        self.writer = writer
        self.pending_watermark: int | None = None

    def emit(self, value: Any, timestamp: int | None) -> None:
        self.writer.emit(value, timestamp)

    def emit_watermark(self, watermark: int) -> None:
        self.pending_watermark = watermark

    def end_of_stream(self) -> None:
        self.flush()
        self.writer.broadcast_event(end_of_stream_message())

    def flush_deadline(self) -> float | None:
        """When the buffer timeout of what waits here runs out; None when nothing waits."""
        if self.pending_watermark is None and not self.writer.buffered():
            return None
        return self.writer.flush_deadline()

    def maybe_flush(self, now: float) -> None:
        """Flush once the buffer timeout passed since the last flush."""
        if self.writer.flush_due(now):
            self.flush()

    def flush(self) -> None:
        wm = self.pending_watermark
        if wm is not None:
            self.pending_watermark = None
            self.writer.broadcast_event(watermark_message(wm))
        else:
            self.writer.flush()


def barrier_alignment_of(request: CheckpointRequest) -> BarrierAlignment:
    """The alignment of the barrier a source sends for a triggered checkpoint: a final checkpoint's
    is forced aligned in every mode (FLIP-147), so that every record before it reaches the sinks
    before they pre-commit at it and nothing lies in flight behind it; any other as the mode says."""
    return BarrierAlignment.FORCED_ALIGNED if request.final else BarrierAlignment.BY_MODE


def exported_watermark(watermark: int | None) -> int | None:
    """The watermark the gauge may show: never MIN or MAX (the end of input), which would break
    ``now - watermark`` on the dashboards; the gauge keeps the last finite value instead."""
    if watermark is None or watermark <= MIN_WATERMARK or watermark >= MAX_WATERMARK:
        return None
    return watermark


def declared_state_schemas(operators: Iterable[KeyedOperator]) -> dict[str, tuple[StoredSchema, ...]]:
    """What the chain's keyed operators declare of their states, by uid: what its snapshots record."""
    return {op.ctx.uid: tuple(s.stored() for s in op.state_schemas()) for op in operators}


def check_state_schemas(operators: Iterable[KeyedOperator], layouts: Iterable[SubtaskLayout]) -> None:
    """Before any keyed state is restored: tell each keyed operator the schemas its state was stored
    with (the layouts of the old subtasks that hold some of it); a state it cannot read raises
    StateSchemaError (the user's, not retriable: the job fails at once with that line), one of an
    older version is migrated when the operator opens (``KeyedOperator.migrate_from``)."""
    stored = tuple(layouts)
    for op in operators:
        uid = op.ctx.uid
        records = [layout.state_schemas.get(uid, ()) for layout in stored if uid in layout.keyed_operator_uids]
        if records:
            op.migrate_from(merge_stored_schemas(uid, records))


class Task:
    _output_status = WatermarkStatus.ACTIVE  # what this subtask last announced downstream (Flink's WatermarkStatus)

    def __init__(
        self,
        address: TaskAddress,
        plan: JobPlan,
        vertex: Vertex,
        job_name: str,
        parameters: dict[str, str],
        writers: list[RecordWriter],
        gate: InputGate | None,
        callbacks: TaskCallbacks,
        taskmanager_id: str,
        restore: Restore | None,
        restore_checkpoint_id: int,
        alignment: AlignmentMode = AlignmentMode.EXACTLY_ONCE,
        user_code_files: frozenset[str] = frozenset(),
        cancelled: threading.Event | None = None,
        restore_storage: CheckpointStorage | None = None,
        open_keyed_state: Callable[[], TaskKeyedState] | None = None,
        aligned_checkpoint_timeout_s: float = 0.0,
        clock: Clock = wall_clock_ms,
        rejections: RecordRejections | None = None,
    ) -> None:
        self.address = address
        self._clock = clock  # processing time (epoch ms): when the chain's processing-time timers are due
        self._plan = plan
        self._vertex = vertex
        self._job_name = job_name
        self._parameters = parameters
        self._writers = writers
        self._gate = gate
        self._callbacks = callbacks
        self._restore = restore
        self._restore_checkpoint_id = restore_checkpoint_id
        self._restore_storage = restore_storage  # where the restored state's keys are
        self._drained = False  # weir stop --drain reached this source
        self._user_code_files = user_code_files  # the job file: an exception raised through it is the user's
        self._mailbox = Mailbox(gate.condition if gate is not None else None)
        self.cancelled = cancelled if cancelled is not None else threading.Event()  # also read by the channels
        self.state = TaskState.DEPLOYING
        self.failure: Failure | None = None
        self.records_in = 0
        self.records_out = 0
        self._taskmanager_id = taskmanager_id
        self._log = structlog.get_logger("weir.task").bind(
            job_id=address.job_id,
            task=vertex.uid,
            subtask=address.subtask,
            attempt=address.attempt,
            taskmanager=taskmanager_id,
        )
        self.metrics = TaskMetrics(address.job_id, vertex.uid, address.subtask, taskmanager_id)
        graph = plan.graph
        self.key_group_range = key_group_range_for_subtask(
            graph.max_parallelism, vertex.parallelism, SubtaskIndex(address.subtask)
        )
        self._network_outputs = [NetworkOutput(w) for w in writers]
        # Records its user functions raise on: failed with the record named, or dead-lettered (its
        # record writers' key selectors report to the same one).
        if rejections is None:
            rejections = RecordRejections(
                address.job_id,
                address.subtask,
                KafkaDeadLetters(),
                self._log,
                metric_labels=(address.job_id, taskmanager_id),
            )
        self.rejections = rejections
        rejections.locate_with(self._position_in_flight)
        self._alignment = alignment
        # Unaligned mode with checkpointing.aligned-checkpoint-timeout: checkpoints start aligned.
        self._aligned_timeout_s = aligned_checkpoint_timeout_s if alignment is AlignmentMode.UNALIGNED else 0.0
        for w in writers:
            for ch in w.channels:
                ch.set_wakeup(self._mailbox.notify)
        self.chain = OperatorChain(
            vertex, lambda uid: graph.transformations[uid].factory(), self._network_outputs, self._context_of
        )
        self.layout = SubtaskLayout(
            parallelism=vertex.parallelism,
            max_parallelism=graph.max_parallelism,
            key_group_range=self.key_group_range,
            operator_uids=tuple(self.chain.by_uid),
            keyed_operator_uids=tuple(op.ctx.uid for op in self.chain.keyed_operators),
            state_schemas=declared_state_schemas(self.chain.keyed_operators),
        )
        # A chain with keyed operators gets a RocksDB of its own, deleted when the task ends.
        self.keyed_state: TaskKeyedState | None = None
        if self.chain.keyed_operators:
            if open_keyed_state is None:
                raise SnapshotError(f"task {address}: its chain has keyed operators but it was given no state backend")
            self.keyed_state = open_keyed_state()
            for op in self.chain.operators:
                op.ctx.state = self.keyed_state.backend
        self._input: ChainInput | None = None
        self._aligner: BarrierAligner | None = None
        if gate is not None:
            self._input = ChainInput(
                self.chain,
                [ch.gate for ch in gate.channels],
                announce=self._announce_watermark_status,
                watermark_advanced=self._show_watermark,
            )
            self._aligner = BarrierAligner(
                TaskId(JobId(address.job_id), OperatorUid(vertex.uid), SubtaskIndex(address.subtask)),
                len(gate.channels),
                alignment,
                aligned_start=self._aligned_timeout_s > 0,
            )
        self._input_ended = False  # every input channel delivered its end of stream
        self._capture: InflightCapture | None = None  # the in-flight records of the pending unaligned checkpoint
        self._unaligned_acks: dict[CheckpointId, _UnalignedAck] = {}  # awaiting their snapshot or capture
        self._replay: _InflightReplay | None = None  # restored in-flight data, fed before any new input
        input_channels = plan.input_channels(vertex.uid, address.subtask)
        self._input_origins = {ChannelIndex(c.channel): InputOrigin(c.gate, c.producer_vertex) for c in input_channels}
        self._output_targets = {index: edge.target for index, edge in enumerate(vertex.outputs)}  # as writers
        self._upstream = {  # each input channel's producer subtask, for the checkpoint timeline
            ChannelIndex(c.channel): (c.producer_vertex, c.producer_subtask) for c in input_channels
        }
        self._barrier_times: dict[CheckpointId, float] = {}  # the trigger time each pending barrier carries
        self._unconfirmed: set[int] = set()  # checkpoints snapshotted here, not yet notified complete/aborted
        self._final_checkpoints: set[int] = set()  # final checkpoints this source took part in
        self._final_completed = False
        # A final checkpoint's barrier went out: no record follows it, and no processing-time timer
        # fires any more (Flink quiesces the processing-time service before the final checkpoint):
        # what it emitted would reach the sinks after they pre-committed at the final checkpoint.
        self._final_barrier_sent = False
        self._synced: dict[str, float] = {}
        self._source: SourceOperator | None = None  # a source task's source: its records read are a metric
        # Time accounting, moved into the counters by _sync_metrics: idle = waiting for input or for a
        # mail; backpressured = waiting for credit (the channels measure it); busy = the rest.
        self._idle_s = 0.0
        self._busy_s = 0.0
        self._time_mark: tuple[float, float, float] | None = None  # (monotonic, idle, backpressured) at the last sync
        self._backpressure_lock = threading.Lock()  # the task thread and the TaskManager's sampler sync it
        self._backpressure_synced = 0.0
        self._backpressured_s = 0.0  # waits for output availability that ended
        self._backpressured_since: float | None = None  # monotonic start of the wait going on, if any
        # The same as of the last sync, as one value (other threads read it), and as of the last heartbeat.
        self._time_totals = TimeTotals()
        self._heartbeat_totals = TimeTotals()  # the heartbeat's thread only
        self._heartbeat_ratios: TimeRatios | None = None
        self._overtaken: tuple[ChannelBuffer, ...] = ()  # what the priority barrier being handled overtook
        self._metrics_removed = False
        self._thread = threading.Thread(target=self._run, name=f"task-{address}", daemon=True)

    def _context_of(self, uid: str) -> OperatorContext:
        address, graph = self.address, self._plan.graph
        return OperatorContext(
            job_id=address.job_id,
            job_name=self._job_name,
            uid=uid,
            subtask=address.subtask,
            parallelism=self._vertex.parallelism,
            max_parallelism=graph.max_parallelism,
            attempt=address.attempt,
            key_group_range=self.key_group_range,
            parameters=self._parameters,
            state=None,  # the task's keyed state backend, bound once the chain is built
            log=self._log.bind(operator_uid=uid),
            metrics=self.metrics,
            rejections=self.rejections,
        )

    def _position_in_flight(self) -> SourcePosition | None:
        """Where the record a chained operator rejects was read: known from the chain's own Kafka
        source while it emits the record; None across a network exchange."""
        source = self.chain.source
        return source.position_in_flight() if source is not None else None

    # Control, from other threads: mails -----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self.cancelled.set()
        self._mailbox.put(Cancel())

    def trigger_checkpoint(self, request: CheckpointRequest) -> None:
        self._mailbox.put(TriggerCheckpoint(request))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._mailbox.put(CheckpointComplete(CheckpointId(checkpoint_id)))

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._mailbox.put(CheckpointAborted(CheckpointId(checkpoint_id)))

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    # The task thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self.cancelled.is_set():
                raise Cancelled()
            if self._restore is not None:
                try:
                    self._restore_state(self._restore)
                except SerializationError as exc:  # damaged, or written by another Weir: a restart cannot help
                    raise SerializationError(
                        f"task {self.address} cannot restore checkpoint {self._restore_checkpoint_id}: {exc}"
                    ) from exc
            # A cancelled attempt must not reach its operators' open(): a sink's recovery there would
            # resolve transactions that by now belong to a newer attempt.
            if self.cancelled.is_set():
                raise Cancelled()
            self.chain.open()
            self._set_state(TaskState.RUNNING)
            self._time_mark = (time.monotonic(), self._idle_s, self._backpressured_total())
            self._replay_inflight_outputs()
            source = self.chain.source
            if source is not None:
                self._run_source(source)
            else:
                self._replay_inflight()
                self._run_input()
            if self.cancelled.is_set():
                raise Cancelled()
            self._finish()
            self._set_state(TaskState.FINISHED)
        except Cancelled:
            self._set_state(TaskState.CANCELED)
        except Exception as exc:
            if self.cancelled.is_set():
                self._set_state(TaskState.CANCELED)
            else:
                self.failure = Failure.from_exception(exc, self._user_code_files)
                self._log.error(
                    "task_failed",
                    error=str(self.failure),
                    fault=self.failure.fault.value,
                    retriable=self.failure.retriable,
                    traceback=traceback.format_exc(limit=8),
                )
                self._set_state(TaskState.FAILED, self.failure)
        finally:
            self.chain.close(self._close_failed)
            for w in self._writers:  # a finished task's last buffers (its end of stream) still go out
                w.close(drain=self.state is TaskState.FINISHED)
            if self._gate is not None:
                self._gate.close()
            self._discard_keyed_state()
            self._close_rejections()
            self._sync_metrics()
            with self._backpressure_lock:  # this attempt's series go; a sampler must not bring them back
                self._metrics_removed = True
                self.metrics.remove()

    def _close_rejections(self) -> None:
        try:
            self.rejections.close()
        except Exception as exc:  # a dead-letter producer failing to close must not hide the task's outcome
            self._log.warning("dead_letter_close_failed", error=str(exc))

    def _close_failed(self, uid: str, exc: Exception) -> None:
        self._log.warning("operator_close_failed", operator_uid=uid, error=str(exc))

    def _keyed_ranges(self) -> list[tuple[OperatorUid, KeyGroupRange]]:
        return [(OperatorUid(op.ctx.uid), self.key_group_range) for op in self.chain.keyed_operators]

    def _discard_keyed_state(self) -> None:
        """The task is over: its database goes (after the uploads of its snapshots in flight)."""
        if self.keyed_state is None:
            return
        try:
            self.keyed_state.discard()
        except Exception as exc:
            self._log.warning("keyed_state_discard_failed", error=str(exc))

    def _restore_state(self, restore: Restore) -> None:
        """Keyed state back into RocksDB (only this subtask's key groups), then each operator's own
        state, read from checkpoint storage when it was too large to stay inline."""
        match restore:
            case ChainRestore():
                check_state_schemas(self.chain.keyed_operators, [restore.layout] if restore.layout is not None else [])
                keyed = [restore.keyed_state] if restore.keyed_state is not None else []
                restored_entries = self._restore_keyed(keyed, adopt=True)
                if self.cancelled.is_set():  # the keyed restore may take long: a sink's restore fences producers
                    raise Cancelled()
                states = read_operator_states(restore.operator_state, self._read_stored_state)
                inflight = states.pop(INFLIGHT_STATE_NAME, None)
                if inflight is not None:
                    self._replay = self._restored_inflight(inflight)
                self.chain.restore(states)
                state_bytes = sum(len(b) for b in states.values())
                inherited_from = 0
            case InheritedRestore(documents=documents):
                self._replay = self._redistributed_inflight(documents)
                check_state_schemas(self.chain.keyed_operators, [d.layout for d in documents])
                restored_entries = self._restore_keyed(self._inherited_keyed_handles(documents), adopt=False)
                if self.cancelled.is_set():
                    raise Cancelled()
                inherited = self._inherited_operator_states(documents)
                self.chain.restore_inherited(inherited)
                state_bytes = sum(len(s.data) for states in inherited.values() for s in states)
                inherited_from = len(documents)
            case _:
                assert_never(restore)
        self._log.info(
            "task_restored",
            checkpoint_id=self._restore_checkpoint_id,
            keyed_entries=restored_entries,
            operator_state_bytes=state_bytes,
            inherited_from_subtasks=inherited_from,
        )

    def _restored_inflight(self, data: bytes) -> _InflightReplay:
        """This task's own in-flight state (same job, same parallelism), to replay as it was: each
        output's buffers into the output of the edge they name, or, in a document that names none
        (format 2), into the output of their index, which this job's plan, the one that wrote them,
        gives the same edge."""
        where = f"of task {self.address} in checkpoint {self._restore_checkpoint_id}"
        state = decode_inflight(data, where)
        inputs = len(self._gate.channels) if self._gate is not None else 0
        if any(channel >= inputs for channel in state.channels):
            raise InflightStateNotRedistributable(
                f"task {self.address}: the in-flight state {where} names input channels {sorted(state.channels)}, "
                f"this task has {inputs}: {INFLIGHT_REDISTRIBUTION_REFUSED}"
            )
        outputs = [len(w.channels) for w in self._writers]
        routed = {
            edge: self._output_index(state.targets[edge]) if state.targets_named else edge for edge, _ in state.outputs
        }
        misplaced = sorted(
            (edge, channel)
            for edge, channel in state.outputs
            if (new := routed[edge]) is None or new >= len(outputs) or channel >= outputs[new]
        )
        if misplaced:
            named = ", ".join(str(state.targets[edge]) for edge in sorted({e for e, _ in misplaced}))
            raise InflightStateNotRedistributable(
                f"task {self.address}: the in-flight state {where} names output channels {misplaced} "
                f"({named or 'by index only'}), this task has {outputs} per output "
                f"({', '.join(map(str, self._output_targets.values()))}): {INFLIGHT_REDISTRIBUTION_REFUSED}"
            )
        return _InflightReplay(
            state.checkpoint_id,
            sends=tuple(
                (edge, channel, parse_message(b, where))
                for (old, channel), b in state.replay_outputs()
                if (edge := routed[old]) is not None
            ),
            inputs=tuple((channel, parse_message(b, where)) for channel, b in state.replay()),
        )

    def _output_index(self, target: OutputTarget) -> int | None:
        """The index of this task's output that is the edge ``target`` names; None if it has none."""
        return next((index for index, mine in self._output_targets.items() if mine == target), None)

    def _redistributed_inflight(self, documents: tuple[TaskStateDocument, ...]) -> _InflightReplay | None:
        """The in-flight state of the old subtasks of this chain, restored at another parallelism or
        into another job: the input records of a keyed edge go to the subtask owning their key group
        now (every new subtask filters each old one's); the rest of old subtask j's input, and its
        output records, go to new subtask j mod parallelism, which emits the output records anew
        through the partitioner of the output whose edge they were queued on (by consumer, never by
        position: the new job may connect its outputs in another order). Output records of an edge
        the new job lacks are dropped with a warning (the JobManager allowed it: non-restored state).
        Watermarks in flight are dropped (the sources emit them again)."""
        olds = sorted(
            (d for d in documents if d.vertex_uid == self._vertex.uid and INFLIGHT_STATE_NAME in d.operator_state_uids),
            key=lambda d: d.subtask,
        )
        if not olds:
            return None
        channel_of: dict[InputOrigin, ChannelIndex] = {}
        for own_channel, own_origin in sorted(self._input_origins.items()):
            channel_of.setdefault(own_origin, own_channel)
        edge_of = {InputOrigin(e.input_index, e.producer_vertex): e for e in self._vertex.inputs}
        key_group_of = KeyEncoder(self._plan.graph.max_parallelism).key_group
        inputs: list[tuple[ChannelIndex, DataMessage]] = []
        emits: list[tuple[int, DataMessage]] = []
        for old in olds:
            where = f"of task {old.vertex_uid}#{old.subtask} in checkpoint {old.checkpoint_id}"
            data = read_operator_states(old.operator_state, self._read_stored_state)[INFLIGHT_STATE_NAME]
            state = decode_inflight(data, where)
            takes_whole = old.subtask % self._vertex.parallelism == self.address.subtask

            def refuse(why: str, where: str = where) -> InflightStateNotRedistributable:
                return InflightStateNotRedistributable(
                    f"task {self.address}: the in-flight state {where} {why}: {INFLIGHT_REDISTRIBUTION_REFUSED}"
                )

            for channel, blobs in sorted(state.channels.items()):
                messages = [m for b in blobs if (m := parse_message(b, where)).record_count]
                origin = state.origins.get(channel)
                if origin is None:
                    raise refuse(f"does not say where input channel {channel} comes from (an older format)")
                edge, new_channel = edge_of.get(origin), channel_of.get(origin)
                if edge is None or new_channel is None:
                    raise refuse(
                        f"has records from {origin.producer_vertex} on input {origin.gate}, which this job lacks"
                    )
                match edge.partitioning:
                    case Partitioning.HASH:
                        owned = _owned_by(
                            edge.key_selector, key_group_of, self.key_group_range, self._plan.graph.max_parallelism
                        )
                        for message in messages:
                            kept = _records_where(message, owned)
                            if kept is not None:
                                inputs.append((new_channel, kept))
                    case Partitioning.FORWARD | Partitioning.REBALANCE:
                        if takes_whole:
                            inputs += [(new_channel, m) for m in messages]
                    case Partitioning.BROADCAST:
                        if messages:
                            raise refuse(f"holds records of the broadcast input from {origin.producer_vertex}")
                    case _:
                        assert_never(edge.partitioning)
            if not takes_whole:
                continue
            for (old_edge, old_channel), blobs in sorted(state.outputs.items()):
                messages = [m for b in blobs if (m := parse_message(b, where)).record_count]
                if not messages:
                    continue
                output = self._inherited_output(state, old_edge, where)
                if output is None:  # the JobManager let it through: --allow-non-restored-state
                    self._log.warning(
                        "inflight_records_dropped",
                        checkpoint_id=old.checkpoint_id,
                        old_subtask=old.subtask,
                        consumer=state.targets[old_edge].consumer,
                        edge=str(state.targets[old_edge]),
                        records=sum(m.record_count for m in messages),
                        reason="their consumer is not connected to this task in the new job, and the restore "
                        "allows non-restored state",
                    )
                    continue
                if self._vertex.outputs[output].partitioning is Partitioning.BROADCAST:
                    raise refuse(f"holds records of broadcast output {old_edge} (channel {old_channel})")
                emits += [(output, m) for m in messages]
        return _InflightReplay(olds[0].checkpoint_id, emits=tuple(emits), inputs=tuple(inputs), redistributed=True)

    def _inherited_output(self, state: InflightState, old_edge: int, where: str) -> int | None:
        """The output of this task that the old task's output ``old_edge`` is now: the one of the edge it
        names (None: this job does not connect it). A document that names none (format 2) says only the
        index, which means the same edge in another job only when this task has that one output."""
        if state.targets_named:
            return self._output_index(state.targets[old_edge])
        if old_edge == 0 and len(self._writers) == 1:
            return 0
        outputs = f"{len(self._writers)} output" + ("" if len(self._writers) == 1 else "s")
        raise InflightStateNotRedistributable(
            f"task {self.address}: the in-flight state {where} holds output buffers named by output index only "
            f"(written before output buffers named their consumer), and {self._vertex.uid} has {outputs} in this "
            f"job, so which consumer output {old_edge} was queued for is unknown: take a savepoint of the old job "
            "(always aligned) and restore from it"
        )

    def _replay_inflight_outputs(self) -> None:
        """The restored output buffers an unaligned barrier overtook, sent before anything else (their
        consumers read them after replaying their own in-flight input, as they would have); at another
        parallelism their records are emitted anew through the partitioners."""
        replay = self._replay
        if replay is None or not (replay.sends or replay.emits):
            return
        for edge, channel, message in replay.sends:
            self._writers[edge].channels[channel].send(message)
        for edge, message in replay.emits:
            buffer = read_buffer(message)
            writer = self._writers[edge]
            for value, timestamp in zip(buffer.values, buffer.timestamps, strict=True):
                writer.emit(value, timestamp)
        for writer in self._writers:
            writer.flush()
        self._log.info(
            "inflight_outputs_replayed",
            checkpoint_id=replay.checkpoint_id,
            buffers_sent=len(replay.sends),
            buffers_emitted=len(replay.emits),
            redistributed=replay.redistributed,
        )

    def _replay_inflight(self) -> None:
        """The restored in-flight input into the chain, channel by channel, before any new input: it
        was sent before the checkpoint's barrier but read after the snapshot."""
        replay, gate = self._replay, self._gate
        self._replay = None
        if replay is None or gate is None:
            return
        before = self.records_in
        for channel, message in replay.inputs:
            self._on_buffer(ReceivedBuffer(channel, gate.channels[channel].gate, message))
        self._log.info(
            "inflight_records_replayed",
            checkpoint_id=replay.checkpoint_id,
            records=self.records_in - before,
            buffers=len(replay.inputs),
            channels=sorted({channel for channel, _ in replay.inputs}),
            redistributed=replay.redistributed,
        )

    def _restore_keyed(self, handles: list[KeyedStateHandle], *, adopt: bool) -> int:
        """Restore this subtask's key groups from ``handles``; ``adopt``: they are this job's own, so
        their files may be reused by the next snapshot (another job's never are)."""
        if self.keyed_state is None:
            return 0
        snapshotter = self.keyed_state.snapshotter
        snapshotter.start_attempt(JobId(self.address.job_id), self.address.attempt, handles if adopt else [])
        if not handles:
            return 0
        entries = snapshotter.restore(handles, self._keyed_ranges(), self._restore_storage).entries
        snapshotter.clear_restore_cache()
        return entries

    def _inherited_keyed_handles(self, documents: tuple[TaskStateDocument, ...]) -> list[KeyedStateHandle]:
        """The keyed state handles of the old subtasks whose key groups overlap this subtask's, for
        each old vertex that ran one of this chain's keyed operators."""
        mine = {op.ctx.uid for op in self.chain.keyed_operators}
        by_vertex: dict[str, dict[int, TaskStateDocument]] = {}
        for d in documents:
            if mine & set(d.layout.keyed_operator_uids):
                by_vertex.setdefault(d.vertex_uid, {})[d.subtask] = d
        handles: list[KeyedStateHandle] = []
        for vertex_uid, subtasks in sorted(by_vertex.items()):
            sources = key_group_sources(self.key_group_range, {s: d.key_group_range for s, d in subtasks.items()})
            for source in sources:
                document = subtasks[source.old_subtask]
                if document.keyed_state is not None:
                    where = f"of task {vertex_uid}#{source.old_subtask} in checkpoint {document.checkpoint_id}"
                    handles.append(keyed_state_from_document(document.keyed_state, where))
        return handles

    def _inherited_operator_states(self, documents: tuple[TaskStateDocument, ...]) -> dict[str, list[InheritedState]]:
        """Each operator's state in every old subtask that holds some, by operator uid (a union)."""
        mine = set(self.chain.by_uid)
        inherited: dict[str, list[InheritedState]] = {}
        for d in documents:
            if not mine & set(d.operator_state_uids):
                continue
            for uid, data in read_operator_states(d.operator_state, self._read_stored_state).items():
                if uid in mine:
                    inherited.setdefault(uid, []).append(
                        InheritedState(d.subtask, d.layout.parallelism, d.key_group_range, data)
                    )
        return inherited

    def _read_stored_state(self, key: str) -> bytes:
        if self._restore_storage is None:
            raise SnapshotError(
                f"task {self.address}: checkpoint {self._restore_checkpoint_id} stores its operator state "
                f"in {key}, but this task was given no checkpoint storage to read it from"
            )
        return self._restore_storage.get_bytes(key)

    def _set_state(self, state: TaskState, failure: Failure | None = None) -> None:
        self.state = state
        self._callbacks.on_state(self.address, state, failure)

    # Mails -----------------------------------------------------------------------------------------

    def _on_mail(self, mail: Mail) -> None:
        match mail:
            case TriggerCheckpoint(request=request):
                if request.final:
                    self._final_checkpoints.add(request.checkpoint_id)
                if request.drain:
                    self._drain()
                self._log.info(
                    "checkpoint_triggered_at_source", checkpoint_id=request.checkpoint_id, final=request.final
                )
                now = time.time()
                self._checkpoint(
                    request,
                    alignment_s=0.0,
                    start_delay_s=max(0.0, now - request.timestamp),
                    times=_BarrierTimes(first_barrier_at=now, alignment_end_at=now),
                    alignment=barrier_alignment_of(request),
                )
            case CheckpointComplete(checkpoint_id=checkpoint_id):
                self.chain.notify_checkpoint_complete(checkpoint_id)
                self._unconfirmed = {c for c in self._unconfirmed if c > checkpoint_id}
                self._final_completed = self._final_completed or any(
                    c <= checkpoint_id for c in self._final_checkpoints
                )
            case CheckpointAborted(checkpoint_id=checkpoint_id):
                self.chain.notify_checkpoint_aborted(checkpoint_id)
                self._unconfirmed.discard(checkpoint_id)

                if self._aligner is not None:
                    self._apply(self._aligner.abort(checkpoint_id))
                self._drop_unaligned(checkpoint_id)  # e.g. its capture complete, its upload not yet
            case Cancel():
                raise Cancelled()
            case _:
                assert_never(mail)

    def _drain(self) -> None:
        """weir stop --drain: the source emits the end of event time, so every window downstream fires
        before the barrier that follows, and reads nothing more (the job stops at that savepoint)."""
        self._log.info("source_drained", reason="stop with savepoint and --drain")
        self._drained = True
        tap = self.chain.source_tap
        if tap is not None:
            tap.emit_watermark(MAX_WATERMARK)

    def _drain_mails(self) -> None:
        """Handle every mail queued now, without waiting."""
        while (mail := self._mailbox.take()) is not None:
            self._on_mail(mail)

    def _idle_until(self, deadline: float) -> None:
        """Wait, as idle time, for a mail until ``deadline`` (monotonic); handle it if one came."""
        started = time.monotonic()
        mail = self._mailbox.wait_for_mail(deadline)
        self._idle_s += time.monotonic() - started
        if mail is not None:
            self._on_mail(mail)

    def _next_timer(self, last_sync: float) -> float:
        """When the task must wake without input: the earliest buffer timeout of its outputs, the
        chain's next processing-time timer, or the next metrics sync."""
        deadlines = [d for net in self._network_outputs if (d := net.flush_deadline()) is not None]
        processing = None if self._final_barrier_sent else self.chain.next_processing_time()
        if processing is not None:
            deadlines.append(time.monotonic() + (processing - self._clock()) / 1000.0)
        if self._aligned_timeout_s > 0 and self._gate is not None:
            queued = self._gate.queued_barrier_times()
            if queued:  # the aligned-checkpoint timeout of the oldest barrier still queued
                deadlines.append(time.monotonic() + min(queued.values()) + self._aligned_timeout_s - time.time())
        return min([*deadlines, last_sync + METRICS_SYNC_S])

    def _fire_processing_timers(self) -> None:
        """Fire the chain's processing-time timers the clock has passed (overdue ones after a restore too);
        none once a final checkpoint's barrier went out."""
        if self._final_barrier_sent:
            return
        due = self.chain.next_processing_time()
        if due is not None and due <= (now := self._clock()):
            self.chain.on_processing_time(now)

    def _time_out_alignment(self) -> None:
        """checkpointing.aligned-checkpoint-timeout: a barrier still queued that long after its
        checkpoint's trigger becomes a priority one, which overtakes its queue and switches the
        checkpoint to unaligned (``BarrierAligner``)."""
        gate = self._gate
        if self._aligned_timeout_s <= 0 or gate is None:
            return
        now = time.time()
        for checkpoint_id, triggered_at in gate.queued_barrier_times().items():
            if now - triggered_at >= self._aligned_timeout_s:
                turned = gate.prioritize(checkpoint_id)
                self._log.info(
                    "aligned_checkpoint_timed_out",
                    checkpoint_id=checkpoint_id,
                    barriers=turned,
                    timeout_s=self._aligned_timeout_s,
                )

    # A source task ---------------------------------------------------------------------------------

    def _run_source(self, source: SourceOperator) -> None:
        self._source = source
        last_sync = time.monotonic()
        status_of = source.watermark_status if isinstance(source, ReportsWatermarkStatus) else None
        while True:
            self._drain_mails()
            if self._drained:  # stopping at a drained savepoint: read nothing more
                self._idle_until(time.monotonic() + SOURCE_IDLE_WAIT_MAX_S)
                continue
            if not self._outputs_available():
                # Backpressured: wait for credit, a mail or a timer; the timers must advance here too,
                # or their passed deadlines would turn the wait into a spin.
                now = time.monotonic()
                for net in self._network_outputs:
                    net.maybe_flush(now)
                if now - last_sync > METRICS_SYNC_S:
                    self._sync_metrics()
                    last_sync = now
                self._await_outputs(self._next_timer(last_sync))
                continue
            before, read = self.records_emitted(), source.records_polled
            polled = time.monotonic()
            more = source.poll(source.poll_records or SOURCE_BATCH)
            now = time.monotonic()
            if source.records_polled == read:  # the poll waited for input that did not come
                self._idle_s += now - polled
            if status_of is not None:
                self._announce_watermark_status(status_of())
            self._fire_processing_timers()
            for net in self._network_outputs:
                net.maybe_flush(now)
            if now - last_sync > METRICS_SYNC_S:
                self._sync_metrics()
                last_sync = now
            if not more:
                self._await_final_checkpoint()
                return
            if self.records_emitted() == before:
                wait = source.idle_wait_s()
                if wait > 0:
                    self._idle_until(min(now + min(wait, SOURCE_IDLE_WAIT_MAX_S), self._next_timer(last_sync)))

    def _await_final_checkpoint(self) -> None:
        """A bounded source read all its input: tell the JobManager, which triggers a final checkpoint;
        end the stream only once that checkpoint completed, so that two-phase sinks commit everything
        through checkpoints (Flink's end-of-data protocol). Other checkpoints may come and go meanwhile."""
        for net in self._network_outputs:
            net.flush()
        self._callbacks.on_input_ended(self.address)
        self._log.info("source_input_ended", awaiting="final checkpoint")
        last_sync = time.monotonic()
        while not self._final_completed:
            self._idle_until(last_sync + METRICS_SYNC_S)
            self._drain_mails()
            if time.monotonic() - last_sync >= METRICS_SYNC_S:
                self._sync_metrics()
                last_sync = time.monotonic()

    def _outputs_available(self) -> bool:
        """Whether no output channel queues too much to take more input (``network.OUTPUT_QUEUE_LIMIT``)."""
        return all(w.available() for w in self._writers)

    def _start_backpressure(self, now: float) -> None:
        with self._backpressure_lock:
            self._backpressured_since = now

    def _end_backpressure(self, now: float) -> None:
        with self._backpressure_lock:
            since, self._backpressured_since = self._backpressured_since, None
            if since is not None:
                self._backpressured_s += now - since

    def _await_outputs(self, deadline: float) -> None:
        """Wait, as backpressured time, until every output is available, a mail comes (handled here)
        or ``deadline`` (monotonic) passes."""
        started = time.monotonic()
        self._start_backpressure(started)

        def available() -> bool | None:
            return True if self._outputs_available() else None

        item = self._mailbox.wait(available, deadline)
        self._end_backpressure(time.monotonic())
        match item:
            case bool() | None:  # available, or the deadline passed
                pass
            case TriggerCheckpoint() | CheckpointComplete() | CheckpointAborted() | Cancel():
                self._on_mail(item)
            case _:
                assert_never(item)

    def records_emitted(self) -> int:
        return sum(w.records_out for w in self._writers) + self.records_out

    # A task with inputs ----------------------------------------------------------------------------

    def _run_input(self) -> None:
        gate = self._gate
        assert gate is not None
        last_sync = time.monotonic()

        def take() -> ReceivedBuffer | None:  # a backpressured task takes only priority events
            return gate.take() if self._outputs_available() else gate.take_priority()

        while not self._input_ended:
            self._time_out_alignment()
            waiting = time.monotonic()
            backpressured = not self._outputs_available()
            if backpressured:
                self._start_backpressure(waiting)
            item = self._mailbox.wait(take, self._next_timer(last_sync))
            now = time.monotonic()
            if backpressured:
                self._end_backpressure(now)
            else:
                self._idle_s += now - waiting
            match item:
                case None:  # a buffer timeout or the metrics sync is due
                    pass
                case ReceivedBuffer():
                    self._on_buffer(item)
                case TriggerCheckpoint() | CheckpointComplete() | CheckpointAborted() | Cancel():
                    self._on_mail(item)
                case _:
                    assert_never(item)
            self._fire_processing_timers()
            for net in self._network_outputs:
                net.maybe_flush(now)
            if now - last_sync >= METRICS_SYNC_S:
                self._sync_metrics()
                last_sync = now

    def _on_buffer(self, received: ReceivedBuffer) -> None:
        chain_input = self._input
        assert chain_input is not None
        buffer = read_buffer(received.message)
        capture = self._capture
        if capture is not None:
            capture.add(received.channel, received.message)
        if buffer.values:
            self.records_in += message_of(received.message).record_count
            self.metrics.bytes_in.inc(buffer.size_bytes)
            chain_input.records(received.channel, buffer.values, buffer.timestamps)
        if buffer.event is not None:
            self._overtaken = received.overtaken
            try:
                self._on_event(received.channel, buffer.event, priority=message_of(received.message).priority)
            finally:
                self._overtaken = ()

    def _on_event(self, channel: ChannelIndex, event: ChannelEvent, *, priority: bool = False) -> None:
        chain_input, aligner = self._input, self._aligner
        assert chain_input is not None and aligner is not None
        match event:
            case WatermarkEvent(watermark=watermark):
                chain_input.watermark(channel, watermark)
            case WatermarkIdle():
                chain_input.idle(channel)
            case WatermarkActive():
                chain_input.active(channel)
            case EndOfStream():
                chain_input.end_of_stream(channel)
                self._apply(aligner.on_end_of_stream(channel, now=time.time()))
            case Barrier(checkpoint_id=checkpoint_id, timestamp=timestamp, kind=kind):
                self._log.info(
                    "checkpoint_barrier_received",
                    checkpoint_id=checkpoint_id,
                    channel=channel,
                    priority=priority,
                    alignment=event.alignment.value,
                    overtaken_buffers=len(self._overtaken),
                )
                self._barrier_times.setdefault(checkpoint_id, timestamp)
                self._apply(
                    aligner.on_barrier(
                        channel, checkpoint_id, kind, now=time.time(), priority=priority, alignment=event.alignment
                    )
                )
            case CancelBarrier(checkpoint_id=checkpoint_id):
                self._apply(aligner.on_cancellation(channel, checkpoint_id))
            case _:
                assert_never(event)

    def _show_watermark(self, watermark: int) -> None:
        if exported_watermark(watermark) is not None:
            self.metrics.watermark.set(watermark)

    def _announce_watermark_status(self, status: WatermarkStatus) -> None:
        """Tell every consumer when this subtask goes idle or active: after the records and the
        watermark already emitted, so they arrive in order. Chained operators share the status."""
        if status is self._output_status:
            return
        self._output_status = status
        for net in self._network_outputs:
            net.flush()
        message = watermark_status_message(status)
        for w in self._writers:
            w.broadcast_event(message)
        match status:
            case WatermarkStatus.IDLE:
                self._log.info("subtask_idle", watermark=self.input_watermark())
            case WatermarkStatus.ACTIVE:
                self._log.info("subtask_active", watermark=self.input_watermark())
            case _:
                assert_never(status)

    def input_watermark(self) -> int | None:
        """The task's current input watermark (a source's: the one it emits), in ms; None before the
        first one and at the end of input. Any thread may ask."""
        if self._input is not None:
            return exported_watermark(self._input.tracker.current)
        tap = self.chain.source_tap
        return exported_watermark(tap.watermark) if tap is not None else None

    def _apply(self, actions: Iterable[ba.Action]) -> None:
        """Carry out what the barrier aligner decided, every action in order."""
        gate = self._gate
        assert gate is not None
        for action in actions:
            match action:
                case ba.BlockChannel(channel=channel):
                    gate.block(channel)
                case ba.UnblockChannels(channels=channels):
                    gate.unblock(channels)
                case ba.TriggerSnapshot(checkpoint_id=checkpoint_id, kind=kind):
                    timestamp = self._barrier_times.pop(checkpoint_id, time.time())
                    alignment_s = action.alignment_duration
                    if action.capture_inflight:
                        self._capture = InflightCapture(checkpoint_id, self._input_origins, self._output_targets)
                        self._unaligned_acks[checkpoint_id] = _UnalignedAck()
                    self._checkpoint(
                        CheckpointRequest(checkpoint_id, timestamp, kind),
                        alignment_s=alignment_s,
                        start_delay_s=max(0.0, time.time() - timestamp - alignment_s),
                        times=_BarrierTimes(action.alignment_started_at, action.triggered_at, action.barriers),
                        alignment=action.alignment,
                    )
                case ba.ForwardCancellation(checkpoint_id=checkpoint_id):
                    for w in self._writers:
                        w.broadcast_event(cancel_barrier_message(checkpoint_id))
                case ba.AbortedCheckpoint(checkpoint_id=checkpoint_id, reason=reason):
                    self._barrier_times.pop(checkpoint_id, None)
                    self._drop_unaligned(checkpoint_id)
                    self._log.info("checkpoint_alignment_aborted", checkpoint_id=checkpoint_id, reason=reason.value)
                    if reason is not ba.AbortReason.ABORTED_BY_JOBMANAGER:
                        self._callbacks.on_decline(self.address, checkpoint_id, reason.value)
                case ba.StartCapture(channel=channel, checkpoint_id=checkpoint_id):
                    self._capture_of(checkpoint_id).start(channel)
                case ba.StopCapture(channel=channel, checkpoint_id=checkpoint_id):
                    self._capture_of(checkpoint_id).stop(channel)
                case ba.CaptureQueued(channel=channel, checkpoint_id=checkpoint_id):
                    self._capture_of(checkpoint_id).add_queued(channel, self._overtaken)
                case ba.InflightCaptureComplete(checkpoint_id=checkpoint_id, barriers=barriers):
                    self._complete_capture(checkpoint_id, barriers)
                case ba.AllChannelsEnded():
                    self._input_ended = True
                case _:
                    assert_never(action)

    def _capture_of(self, checkpoint_id: CheckpointId) -> InflightCapture:
        capture = self._capture
        if capture is None or capture.checkpoint_id != checkpoint_id:
            raise ba.InputProtocolError(
                f"task {self.address}: the aligner named checkpoint {checkpoint_id}'s in-flight capture, but "
                f"the capture under way is {capture.checkpoint_id if capture is not None else 'none'}"
            )
        return capture

    def _channel_times(self, barriers: Iterable[ba.BarrierArrival]) -> tuple[ChannelBarrierTime, ...]:
        """Every input channel with its barrier's arrival, None for one whose barrier has not come."""
        arrived = {b.channel: b.at for b in barriers}
        return tuple(
            ChannelBarrierTime(channel, vertex, subtask, arrived.get(channel))
            for channel, (vertex, subtask) in sorted(self._upstream.items())
        )

    def _complete_capture(self, checkpoint_id: CheckpointId, barriers: tuple[ba.BarrierArrival, ...]) -> None:
        """Every barrier of the unaligned checkpoint arrived: its in-flight records join its operator
        state; the ack goes out once the snapshot's upload is done too."""
        state = self._capture_of(checkpoint_id).complete()
        self._capture = None
        join = self._unaligned_acks.pop(checkpoint_id, None)
        self._log.info(
            "inflight_capture_complete",
            checkpoint_id=checkpoint_id,
            buffers=state.buffer_count,
            inflight_bytes=state.size_bytes,
            channels=sorted(state.channels),
        )
        if join is None:  # aborted meanwhile
            return
        ack = join.inflight_done(encode_inflight(state), state.size_bytes, self._channel_times(barriers))
        if ack is not None:
            self._send_ack(ack)

    def _drop_unaligned(self, checkpoint_id: CheckpointId) -> None:
        """The checkpoint was given up: its capture and its half-joined ack go."""
        if self._capture is not None and self._capture.checkpoint_id == checkpoint_id:
            self._capture = None
        join = self._unaligned_acks.pop(checkpoint_id, None)
        if join is not None:
            join.drop()

    def _deliver_ack(self, ack: CheckpointAck, join: _UnalignedAck | None) -> None:
        """The snapshot half is done (any thread): send it, or for an unaligned checkpoint hand it to
        its join (taken when the snapshot began), which sends it once the in-flight capture is complete
        as well, and never if the checkpoint was given up meanwhile."""
        if join is not None:
            ack_now = join.snapshot_done(ack)
            if ack_now is None:
                return
            ack = ack_now
        self._send_ack(ack)

    def _send_ack(self, ack: CheckpointAck) -> None:
        self._callbacks.on_checkpoint(self.address, ack)
        self._log.info(
            "checkpoint_acknowledged",
            checkpoint_id=ack.snapshot.checkpoint_id,
            sync_s=round(ack.sync_s, 4),
            inflight_bytes=ack.inflight_bytes,
        )

    def _checkpoint(
        self,
        request: CheckpointRequest,
        alignment_s: float,
        start_delay_s: float,
        times: _BarrierTimes,
        alignment: BarrierAlignment,
    ) -> None:
        """Snapshot every operator (sinks pre-commit, keyed operators flush their caches), forward the
        barrier with ``alignment``, take the RocksDB snapshot; its upload runs in the background and
        the ack follows it."""
        cid = request.checkpoint_id
        join = self._unaligned_acks.get(cid)  # an unaligned checkpoint's: the ack also waits for its capture
        started = time.perf_counter()
        states = self.chain.snapshot(cid)
        for net in self._network_outputs:
            net.flush()
        barrier = barrier_message(cid, request.timestamp, request.kind, alignment)
        capture = self._capture if self._capture is not None and self._capture.checkpoint_id == cid else None
        if alignment is BarrierAlignment.FORCED_ALIGNED:
            self._final_barrier_sent = True
        if self._unaligned_snapshot(request, capture, alignment):
            # The barrier overtakes what the outputs queue; that belongs to the checkpoint (FLIP-76).
            own = capture if capture is not None else InflightCapture(cid, targets=self._output_targets)
            for edge, w in enumerate(self._writers):
                for channel, overtaken in enumerate(w.broadcast_priority(barrier)):
                    own.add_outputs((edge, channel), overtaken)
            if capture is None:  # a source: no input to capture, its in-flight state is complete
                states = {**states, INFLIGHT_STATE_NAME: encode_inflight(own.complete())}
        else:
            for w in self._writers:
                w.broadcast_event(barrier)
        self._unconfirmed.add(cid)
        ranges = self._keyed_ranges()
        operators_s = time.perf_counter() - started
        self._log.info("checkpoint_barrier_forwarded", checkpoint_id=cid, alignment_s=round(alignment_s, 4))

        def timeline(sync_end_at: float, async_end_at: float) -> SubtaskCheckpointTimeline:
            return SubtaskCheckpointTimeline(
                first_barrier_at=times.first_barrier_at,
                channels=self._channel_times(times.barriers),
                alignment_end_at=times.alignment_end_at,
                sync_end_at=sync_end_at,
                async_end_at=async_end_at,
            )

        if not ranges or self.keyed_state is None:
            snapshot = ChainSnapshot(self.address, cid, states, self.layout, None, request.kind)
            done = time.time()
            ack = CheckpointAck(snapshot, alignment_s, start_delay_s, operators_s, 0.0, timeline(done, done))
            self._deliver_ack(ack, join)
            return
        future = self.keyed_state.snapshotter.begin(
            JobId(self.address.job_id), cid, ranges, request.kind, attempt=self.address.attempt
        )
        sync_end_at = time.time()

        def uploaded(done: Any) -> None:
            try:
                result = done.result()
            except Exception as exc:  # the upload failed: the checkpoint cannot complete
                self._log.warning("snapshot_upload_failed", checkpoint_id=cid, error=str(exc))
                self._callbacks.on_decline(self.address, cid, f"snapshot upload failed: {exc}")
                return
            crash_point(
                "during_snapshot_upload",
                task=str(self.address),
                checkpoint_id=cid,
                taskmanager=self._taskmanager_id,
                subtask=self.address.subtask,
            )
            self._log.info(
                "snapshot_uploaded",
                checkpoint_id=cid,
                uploaded_bytes=result.uploaded_bytes,
                files=result.uploaded_files,
                async_s=round(result.async_duration_s, 4),
            )
            snapshot = ChainSnapshot(self.address, cid, states, self.layout, result.handle, request.kind)
            self._deliver_ack(
                CheckpointAck(
                    snapshot,
                    alignment_s,
                    start_delay_s,
                    operators_s + result.sync_duration_s,
                    result.async_duration_s,
                    timeline(sync_end_at, max(sync_end_at, time.time())),
                ),
                join,
            )

        future.add_done_callback(uploaded)

    def _unaligned_snapshot(
        self, request: CheckpointRequest, capture: InflightCapture | None, alignment: BarrierAlignment
    ) -> bool:
        """Whether this snapshot is unaligned, so its barrier goes out as a priority event: in unaligned
        mode, a checkpoint (not a savepoint, not a forced aligned final checkpoint) unless it starts
        aligned (aligned-checkpoint-timeout) and this task did not switch it (it captures nothing in
        flight: a source, or aligned to the end). An aligned barrier that then waits in a consumer's
        queue past the timeout is turned there (never a forced aligned one)."""
        if self._alignment is not AlignmentMode.UNALIGNED or request.kind is not CheckpointKind.CHECKPOINT:
            return False
        match alignment:
            case BarrierAlignment.FORCED_ALIGNED:
                if capture is not None:
                    raise ba.InputProtocolError(
                        f"task {self.address}: checkpoint {request.checkpoint_id} is forced aligned but captured "
                        "records in flight"
                    )
                return False
            case BarrierAlignment.BY_MODE:
                return capture is not None or self._aligned_timeout_s <= 0
            case _:
                assert_never(alignment)

    def _finish(self) -> None:
        """End of input: wait for the notifications of the checkpoints this task acknowledged (their
        sink transactions commit then), every operator flushes in chain order, then end-of-stream."""
        deadline = time.monotonic() + FINAL_NOTIFICATION_TIMEOUT_S
        while self._unconfirmed:
            started = time.monotonic()
            mail = self._mailbox.wait_for_mail(deadline)
            self._idle_s += time.monotonic() - started
            if mail is None:
                raise CheckpointNotificationTimeout(
                    f"task {self.address}: no completion notice for checkpoint(s) {sorted(self._unconfirmed)} "
                    f"within {FINAL_NOTIFICATION_TIMEOUT_S:.0f}s of the end of input"
                )
            self._on_mail(mail)
        self.chain.end_input()
        self._drain_mails()

    def _backpressured_total(self) -> float:
        """Seconds spent waiting for output availability, the wait going on included; never decreases."""
        with self._backpressure_lock:
            since = self._backpressured_since
            ongoing = time.monotonic() - since if since is not None else 0.0
            return self._backpressured_s + ongoing

    def sync_backpressure(self) -> float:
        """Move the time this task waited for credit, a wait still going on included, into
        ``weir_backpressured_seconds_total``; answers the total. Thread-safe: the TaskManager's sampler
        calls it while the task thread may be blocked in a send, where it cannot sync itself."""
        total = self._backpressured_total()
        with self._backpressure_lock:
            if not self._metrics_removed and total > self._backpressure_synced:
                self.metrics.backpressured.inc(total - self._backpressure_synced)
                self._backpressure_synced = total
        return total

    def time_ratios(self) -> TimeRatios | None:
        """The shares of busy, backpressured and idle time since the previous call (the heartbeat's
        thread calls it once per heartbeat), measured at the task's metrics syncs; the previous shares
        when no sync came in between, None before the first."""
        totals = self._time_totals
        ratios = ratios_between(self._heartbeat_totals, totals)
        if ratios is None:
            return self._heartbeat_ratios
        self._heartbeat_totals, self._heartbeat_ratios = totals, ratios
        return ratios

    def _sync_metrics(self) -> None:
        """Move the task's plain counters into its Prometheus metrics (twice a second, not per record)."""
        m = self.metrics
        now = time.monotonic()
        backpressured = self.sync_backpressure()
        if self._time_mark is not None:
            since, idle, waited = self._time_mark
            self._busy_s += max(0.0, (now - since) - (self._idle_s - idle) - (backpressured - waited))
            self._time_mark = (now, self._idle_s, backpressured)
            self._time_totals = TimeTotals(self._busy_s, backpressured, self._idle_s)
        channels = [ch for w in self._writers for ch in w.channels]
        totals = {
            "records_in": float(self.records_in),
            "records_out": float(sum(w.records_out for w in self._writers)),
            "source_records_read": float(self._source.records_polled) if self._source is not None else 0.0,
            "bytes_out": float(sum(ch.bytes_sent for ch in channels)),
            "busy": self._busy_s,
            "idle": self._idle_s,
        }
        for name, total in totals.items():
            delta = total - self._synced.get(name, 0.0)
            if delta > 0:
                getattr(m, name).inc(delta)
            self._synced[name] = total
        m.output_credits.set(sum(ch.credits for ch in channels))
        if self._gate is not None:
            m.input_buffer_usage.set(self._gate.queued_buffers() / max(1, self._gate.capacity()))
        tap = self.chain.source_tap
        if tap is not None:
            watermark = exported_watermark(tap.watermark)
            if watermark is not None:
                m.watermark.set(watermark)
