"""One subtask: a chain of operators run by one thread, fed by its input gate or by its source.

The thread owns every operator of the chain: records, watermarks, barriers, checkpoint
notifications and cancellation are all handled on it, so operators never need locks.
"""

from __future__ import annotations

import collections
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, assert_never

import structlog

from operators.base import ChainOutput, OperatorContext, SourceOperator, StreamOperator
from operators.keyed import KeyedOperator
from taskmanager import barrier_aligner as ba
from taskmanager.barrier_aligner import AlignmentMode, BarrierAligner
from taskmanager.network import (
    Cancelled,
    Event,
    InputGate,
    RecordWriter,
    barrier_message,
    cancel_barrier_message,
    decode_records,
    end_of_stream_message,
    watermark_message,
    watermark_status_message,
)
from taskmanager.snapshots import KeyedStateHandle, RocksDBSnapshotter
from weir.crashpoints import crash_point
from weir.errors import Fault, WeirError
from weir.failures import Failure
from weir.ids import ChannelIndex, CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.keygroups import KeyGroupRange, key_group_range_for_subtask, state_namespace
from weir.metrics import TaskMetrics
from weir.plan import JobPlan, Vertex
from weir.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    ReportsWatermarkStatus,
    StatusWatermarkValve,
    ValveOutput,
    WatermarkStatus,
    WatermarkTracker,
)
from weir.wire import common_pb2

SOURCE_BATCH = 500
POLL_TIMEOUT_S = 0.05
FINAL_NOTIFICATION_TIMEOUT_S = 120.0


class CheckpointNotificationTimeout(WeirError):
    """A finished task never learnt whether its last checkpoints completed; the job restarts from the
    latest completed checkpoint (retriable)."""

    retriable = True
    fault = Fault.INTERNAL


@dataclass(frozen=True)
class TaskAddress:
    job_id: str
    vertex_uid: str
    subtask: int
    attempt: int

    def __str__(self) -> str:
        return f"{self.job_id}/{self.vertex_uid}#{self.subtask}@{self.attempt}"


@dataclass(frozen=True)
class CheckpointRequest:
    checkpoint_id: int
    timestamp: float
    kind: int
    final: bool = False  # the job's final checkpoint: every bounded source has ended


@dataclass(frozen=True)
class ChainSnapshot:
    """What one subtask contributes to a checkpoint: each operator's own state by uid, and the handle
    of its keyed state in RocksDB (None when the chain has no keyed operator)."""

    task: TaskAddress
    checkpoint_id: int
    operator_states: dict[str, bytes]
    key_group_range: tuple[int, int]
    keyed_state: KeyedStateHandle | None = None


@dataclass(frozen=True)
class CheckpointAck:
    snapshot: ChainSnapshot
    alignment_s: float
    start_delay_s: float
    sync_s: float
    async_s: float


@dataclass
class TaskCallbacks:
    """How a task reports to its TaskManager (which forwards to the JobManager)."""

    on_state: Callable[[TaskAddress, int, Failure | None], None]
    on_checkpoint: Callable[[TaskAddress, CheckpointAck], None]
    on_decline: Callable[[TaskAddress, int, str], None]
    on_input_ended: Callable[[TaskAddress], None]


class MultiOutput:
    """Fan-out of one operator's output to chained successors and network writers."""

    def __init__(self, outputs: list[Any]) -> None:
        self._outputs = outputs

    def emit(self, value: Any, timestamp: int | None) -> None:
        for o in self._outputs:
            o.emit(value, timestamp)

    def emit_watermark(self, watermark: int) -> None:
        for o in self._outputs:
            o.emit_watermark(watermark)


class NetworkOutput:
    """An operator's output into a RecordWriter; watermarks ride along with the next flush."""

    def __init__(self, writer: RecordWriter) -> None:
        self.writer = writer
        self.emit = writer.emit
        self.pending_watermark: int | None = None

    def emit_watermark(self, watermark: int) -> None:
        self.pending_watermark = watermark

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


class SourceWatermarkTap:
    """The output of a task's head source: records go straight through, the last watermark it
    emitted is kept for the task's watermark gauge (set when the task syncs its metrics)."""

    __slots__ = ("_inner", "emit", "watermark")

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.emit = inner.emit
        self.watermark: int | None = None

    def emit_watermark(self, watermark: int) -> None:
        self.watermark = watermark
        self._inner.emit_watermark(watermark)


def exported_watermark(watermark: int | None) -> int | None:
    """The watermark the gauge may show: never MIN or MAX (the end of input), which would break
    ``now - watermark`` on the dashboards; the gauge keeps the last finite value instead."""
    if watermark is None or watermark <= MIN_WATERMARK or watermark >= MAX_WATERMARK:
        return None
    return watermark


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
        state_backend: Any,
        snapshotter: RocksDBSnapshotter,
        callbacks: TaskCallbacks,
        taskmanager_id: str,
        restore: ChainSnapshot | None,
        restore_checkpoint_id: int,
        alignment: AlignmentMode = AlignmentMode.EXACTLY_ONCE,
        user_code_files: frozenset[str] = frozenset(),
    ) -> None:
        self.address = address
        self._plan = plan
        self._vertex = vertex
        self._writers = writers
        self._gate = gate
        self._callbacks = callbacks
        self._restore = restore
        self._restore_checkpoint_id = restore_checkpoint_id
        self._user_code_files = user_code_files  # the job file: an exception raised through it is the user's
        self._snapshotter = snapshotter
        self._state_backend = state_backend
        self._control: collections.deque[tuple[str, Any]] = collections.deque()
        self._control_signal = threading.Event()
        self.cancelled = threading.Event()
        self.state = common_pb2.TASK_STATE_DEPLOYING
        self.failure: Failure | None = None
        self.records_in = 0
        self.records_out = 0
        graph = plan.graph
        self._taskmanager_id = taskmanager_id
        self._log = structlog.get_logger("weir.task").bind(
            job_id=address.job_id,
            task=vertex.uid,
            subtask=address.subtask,
            attempt=address.attempt,
            taskmanager=taskmanager_id,
        )
        self.metrics = TaskMetrics(address.job_id, vertex.uid, address.subtask, taskmanager_id)
        kg_range = key_group_range_for_subtask(graph.max_parallelism, vertex.parallelism, address.subtask)
        self.key_group_range = kg_range
        self.operators: list[StreamOperator] = []
        by_uid: dict[str, StreamOperator] = {}
        for uid in vertex.operator_uids:
            op = graph.transformations[uid].factory()
            by_uid[uid] = op
            self.operators.append(op)
        self._network_outputs: list[NetworkOutput] = []
        self._source_tap: SourceWatermarkTap | None = None
        for uid, op in by_uid.items():
            outs: list[Any] = [ChainOutput(by_uid[s]) for s in vertex.chained.get(uid, [])]
            for edge_index, edge in enumerate(vertex.outputs):
                if edge.producer_operator == uid:
                    net = NetworkOutput(writers[edge_index])
                    self._network_outputs.append(net)
                    outs.append(net)
            output: Any = outs[0] if len(outs) == 1 else MultiOutput(outs)
            if uid == vertex.operator_uids[0] and isinstance(op, SourceOperator):
                output = self._source_tap = SourceWatermarkTap(output)
            ctx = OperatorContext(
                job_id=address.job_id,
                job_name=job_name,
                uid=uid,
                subtask=address.subtask,
                parallelism=vertex.parallelism,
                max_parallelism=graph.max_parallelism,
                attempt=address.attempt,
                key_group_range=kg_range,
                parameters=parameters,
                state=state_backend,
                log=self._log.bind(operator_uid=uid),
                metrics=self.metrics,
            )
            op.setup(ctx, output)
        self.head = self.operators[0]
        self._tracker = WatermarkTracker(len(gate.channels)) if gate is not None else None
        self._valve = StatusWatermarkValve(self._tracker) if self._tracker is not None else None
        if gate is not None:
            self._aligner: BarrierAligner | None = BarrierAligner(
                TaskId(JobId(address.job_id), OperatorUid(vertex.uid), SubtaskIndex(address.subtask)),
                len(gate.channels),
                alignment,
            )
        else:
            self._aligner = None
        self._barrier_times: dict[int, tuple[float, int]] = {}
        self._unconfirmed: set[int] = set()  # checkpoints snapshotted here, not yet notified complete/aborted
        self._final_checkpoints: set[int] = set()  # final checkpoints this source took part in
        self._final_completed = False
        self._synced: dict[str, float] = {}
        # Time accounting, moved into the counters by _sync_metrics: idle = waiting for input or for a
        # control message; backpressured = waiting for credit (the channels measure it); busy = the rest.
        self._idle_s = 0.0
        self._busy_s = 0.0
        self._time_mark: tuple[float, float, float] | None = None  # (monotonic, idle, backpressured) at the last sync
        self._backpressure_lock = threading.Lock()  # the task thread and the TaskManager's sampler sync it
        self._backpressure_synced = 0.0
        self._metrics_removed = False
        self._thread = threading.Thread(target=self._run, name=f"task-{address}", daemon=True)

    # Control, from other threads -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self.cancelled.set()
        self._control_signal.set()

    def trigger_checkpoint(self, request: CheckpointRequest) -> None:
        self._control.append(("trigger", request))
        self._control_signal.set()

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self._control.append(("complete", checkpoint_id))
        self._control_signal.set()

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        self._control.append(("aborted", checkpoint_id))
        self._control_signal.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    # The task thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        addr = self.address
        try:
            if self.cancelled.is_set():
                raise Cancelled()
            if self._restore is not None:
                self._restore_state(self._restore)
            else:
                self._clear_keyed_state()
            # A cancelled attempt must not reach its operators' open(): a sink's recovery there would
            # resolve transactions that by now belong to a newer attempt.
            if self.cancelled.is_set():
                raise Cancelled()
            for op in reversed(self.operators):
                op.open()
            self._set_state(common_pb2.TASK_STATE_RUNNING)
            self._time_mark = (time.monotonic(), self._idle_s, self._backpressured_total())
            if isinstance(self.head, SourceOperator):
                self._run_source(self.head)
            else:
                self._run_input()
            if self.cancelled.is_set():
                raise Cancelled()
            self._finish()
            self._set_state(common_pb2.TASK_STATE_FINISHED)
        except Cancelled:
            self._set_state(common_pb2.TASK_STATE_CANCELED)
        except Exception as exc:
            if self.cancelled.is_set():
                self._set_state(common_pb2.TASK_STATE_CANCELED)
            else:
                self.failure = Failure.from_exception(exc, self._user_code_files)
                self._log.error(
                    "task_failed",
                    error=str(self.failure),
                    fault=self.failure.fault.value,
                    retriable=self.failure.retriable,
                    traceback=traceback.format_exc(limit=8),
                )
                self._set_state(common_pb2.TASK_STATE_FAILED, self.failure)
        finally:
            for op in self.operators:
                try:
                    op.close()
                except Exception as exc:  # closing must not hide the task's real outcome
                    self._log.warning("operator_close_failed", operator_uid=op.ctx.uid, error=str(exc))
            for w in self._writers:
                w.close()
            if self._gate is not None:
                self._gate.close()
            self._sync_metrics()
            with self._backpressure_lock:  # this attempt's series go; a sampler must not bring them back
                self._metrics_removed = True
                self.metrics.remove()
            del addr

    def _keyed_ranges(self) -> list[tuple[OperatorUid, KeyGroupRange]]:
        return [
            (OperatorUid(state_namespace(op.ctx.job_id, op.ctx.uid)), self.key_group_range)
            for op in self.operators
            if isinstance(op, KeyedOperator)
        ]

    def _clear_keyed_state(self) -> None:
        """A fresh start: state an earlier attempt of this job left in the shared database must not leak
        into this one (a restore deletes and rewrites the same ranges instead)."""
        for namespace, key_groups in self._keyed_ranges():
            self._state_backend.keyed_store(namespace).clear_key_groups(key_groups.start, key_groups.end)

    def _restore_state(self, snapshot: ChainSnapshot) -> None:
        """Keyed state back into RocksDB (only this subtask's key groups), then each operator's own state."""
        restored_entries = 0
        if snapshot.keyed_state is not None:
            result = self._snapshotter.restore([snapshot.keyed_state], self._keyed_ranges())
            restored_entries = result.entries
        if self.cancelled.is_set():  # the keyed restore may take long: a sink's restore fences producers
            raise Cancelled()
        for op in self.operators:
            blob = snapshot.operator_states.get(op.ctx.uid)
            if blob is not None:
                op.restore_state(blob)
        self._log.info("task_restored", checkpoint_id=self._restore_checkpoint_id, keyed_entries=restored_entries)

    def _set_state(self, state: int, failure: Failure | None = None) -> None:
        self.state = state
        self._callbacks.on_state(self.address, state, failure)

    def _drain_control(self) -> None:
        while self._control:
            kind, arg = self._control.popleft()
            if kind == "trigger":
                if arg.final:
                    self._final_checkpoints.add(arg.checkpoint_id)
                self._log.info("checkpoint_triggered_at_source", checkpoint_id=arg.checkpoint_id, final=arg.final)
                self._checkpoint(arg, alignment_s=0.0, start_delay_s=max(0.0, time.time() - arg.timestamp))
            elif kind == "complete":
                for op in self.operators:
                    op.notify_checkpoint_complete(arg)
                self._unconfirmed = {c for c in self._unconfirmed if c > arg}
                self._final_completed = self._final_completed or any(c <= arg for c in self._final_checkpoints)
            elif kind == "aborted":
                for op in self.operators:
                    op.notify_checkpoint_aborted(arg)
                self._unconfirmed.discard(arg)
                if self._aligner is not None:
                    self._apply(self._aligner.abort(arg))
        if self.cancelled.is_set():
            raise Cancelled()

    def _run_source(self, source: SourceOperator) -> None:
        signal = self._control_signal
        last_sync = time.monotonic()
        status_of = source.watermark_status if isinstance(source, ReportsWatermarkStatus) else None
        while True:
            if self._control or self.cancelled.is_set():
                signal.clear()
                self._drain_control()
            before, read = self.records_emitted(), source.records_polled
            polled = time.monotonic()
            more = source.poll(SOURCE_BATCH)
            now = time.monotonic()
            if source.records_polled == read:  # the poll waited for input that did not come
                self._idle_s += now - polled
            if status_of is not None:
                self._announce_watermark_status(status_of())
            for net in self._network_outputs:
                net.maybe_flush(now)
            if now - last_sync > 0.5:
                self._sync_metrics()
                last_sync = now
            if not more:
                self._await_final_checkpoint()
                return
            if self.records_emitted() == before:
                wait = source.idle_wait_s()
                if wait > 0:
                    self._idle_wait(min(wait, POLL_TIMEOUT_S))

    def _idle_wait(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for a control message (checkpoint, notification, cancel), as idle time."""
        started = time.monotonic()
        self._control_signal.wait(timeout_s)
        self._idle_s += time.monotonic() - started

    def _await_final_checkpoint(self) -> None:
        """A bounded source read all its input: tell the JobManager, which triggers a final checkpoint;
        end the stream only once that checkpoint completed, so that two-phase sinks commit everything
        through checkpoints (Flink's end-of-data protocol). Other checkpoints may come and go meanwhile."""
        for net in self._network_outputs:
            net.flush()
        self._callbacks.on_input_ended(self.address)
        self._log.info("source_input_ended", awaiting="final checkpoint")
        signal = self._control_signal
        last_sync = time.monotonic()
        while not self._final_completed:
            self._idle_wait(POLL_TIMEOUT_S)
            signal.clear()
            self._drain_control()
            if time.monotonic() - last_sync > 0.5:
                self._sync_metrics()
                last_sync = time.monotonic()

    def records_emitted(self) -> int:
        return sum(w.records_out for w in self._writers) + self.records_out

    def _run_input(self) -> None:
        gate, valve = self._gate, self._valve
        assert gate is not None and valve is not None
        head = self.head
        two_inputs = len({ch.gate for ch in gate.channels}) > 1
        last_sync = time.monotonic()
        while not gate_all_ended(gate):
            if self._control or self.cancelled.is_set():
                self._control_signal.clear()
                self._drain_control()
            waiting = time.monotonic()
            item = gate.poll(POLL_TIMEOUT_S)
            now = time.monotonic()
            self._idle_s += now - waiting
            if item is not None:
                channel, gate_index, msg = item
                if msg.record_count:
                    self._on_valve(valve.on_records(ChannelIndex(channel)))  # a record ends the channel's idleness
                    values, timestamps = decode_records(msg.records)
                    self.records_in += len(values)
                    self.metrics.bytes_in.inc(len(msg.records))
                    if two_inputs:
                        for value, ts in zip(values, timestamps, strict=True):
                            head.process_input(gate_index, value, ts)
                    else:
                        process = head.process
                        for value, ts in zip(values, timestamps, strict=True):
                            process(value, ts)
                if msg.event:
                    self._on_event(channel, msg)
            for net in self._network_outputs:
                net.maybe_flush(now)
            if now - last_sync > 0.5:
                self._sync_metrics()
                last_sync = now

    def _on_event(self, channel: int, msg: Any) -> None:
        valve, aligner = self._valve, self._aligner
        assert valve is not None and aligner is not None
        now = time.monotonic()
        match msg.event:
            case Event.EVENT_KIND_WATERMARK:
                self._on_valve(valve.on_watermark(ChannelIndex(channel), msg.watermark))
            case Event.EVENT_KIND_WATERMARK_IDLE:
                self._on_valve(valve.on_idle(ChannelIndex(channel)))
            case Event.EVENT_KIND_WATERMARK_ACTIVE:
                self._on_valve(valve.on_active(ChannelIndex(channel)))
            case Event.EVENT_KIND_END_OF_STREAM:
                self._on_valve(valve.on_end_of_stream(ChannelIndex(channel)))
                self._apply(aligner.on_end_of_stream(channel, now=now))
            case Event.EVENT_KIND_BARRIER:
                self._log.info("checkpoint_barrier_received", checkpoint_id=msg.checkpoint_id, channel=channel)
                self._barrier_times.setdefault(msg.checkpoint_id, (msg.checkpoint_timestamp, msg.checkpoint_kind))
                kind = (
                    ba.CheckpointKind.SAVEPOINT
                    if msg.checkpoint_kind == common_pb2.CHECKPOINT_KIND_SAVEPOINT
                    else ba.CheckpointKind.CHECKPOINT
                )
                self._apply(aligner.on_barrier(channel, msg.checkpoint_id, kind, now=now))
            case Event.EVENT_KIND_CANCEL_BARRIER:
                self._apply(aligner.on_cancellation(channel, msg.checkpoint_id))
            case _:
                raise ba.InputProtocolError(f"task {self.address}: unknown event kind {msg.event} on channel {channel}")

    def _on_valve(self, change: ValveOutput) -> None:
        """Forward what an input event changed: going active is announced before the watermark it
        may bring, going idle after the last watermark."""
        if change.status is WatermarkStatus.ACTIVE:
            self._announce_watermark_status(change.status)
        advanced = change.watermark
        if advanced is not None:
            if exported_watermark(advanced) is not None:
                self.metrics.watermark.set(advanced)
            self.head.process_watermark(advanced)
        if change.status is WatermarkStatus.IDLE:
            self._announce_watermark_status(change.status)

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
        watermark: int | None
        if self._tracker is not None:
            watermark = self._tracker.current
        else:
            watermark = self._source_tap.watermark if self._source_tap is not None else None
        match status:
            case WatermarkStatus.IDLE:
                self._log.info("subtask_idle", watermark=exported_watermark(watermark))
            case WatermarkStatus.ACTIVE:
                self._log.info("subtask_active", watermark=exported_watermark(watermark))
            case _:
                assert_never(status)

    def _apply(self, actions: Any) -> None:
        """Carry out what the barrier aligner decided."""
        gate = self._gate
        assert gate is not None
        for action in actions:
            if isinstance(action, ba.BlockChannel):
                gate.block(action.channel)
            elif isinstance(action, ba.UnblockChannels):
                gate.unblock(action.channels)
            elif isinstance(action, ba.TriggerSnapshot):
                ts, kind = self._barrier_times.pop(action.checkpoint_id, (time.time(), 0))
                self._checkpoint(
                    CheckpointRequest(action.checkpoint_id, ts, kind),
                    alignment_s=action.alignment_duration,
                    start_delay_s=max(0.0, time.time() - ts - action.alignment_duration),
                )
            elif isinstance(action, ba.ForwardCancellation):
                for w in self._writers:
                    w.broadcast_event(cancel_barrier_message(action.checkpoint_id))
            elif isinstance(action, ba.AbortedCheckpoint):
                self._barrier_times.pop(action.checkpoint_id, None)
                self._log.info(
                    "checkpoint_alignment_aborted", checkpoint_id=action.checkpoint_id, reason=action.reason.value
                )
                if action.reason is not ba.AbortReason.ABORTED_BY_JOBMANAGER:
                    self._callbacks.on_decline(self.address, action.checkpoint_id, action.reason.value)

    def _checkpoint(self, request: CheckpointRequest, alignment_s: float, start_delay_s: float) -> None:
        """Snapshot every operator (sinks pre-commit, keyed operators flush their caches), forward the
        barrier, take the RocksDB snapshot; its upload runs in the background and the ack follows it."""
        cid = request.checkpoint_id
        started = time.perf_counter()
        states: dict[str, bytes] = {}
        for op in self.operators:
            blob = op.snapshot_state(cid)
            if blob is not None:
                states[op.ctx.uid] = blob
        for net in self._network_outputs:
            net.flush()
        barrier = barrier_message(cid, request.timestamp, request.kind)
        for w in self._writers:
            w.broadcast_event(barrier)
        self._unconfirmed.add(cid)
        kg = (self.key_group_range.start, self.key_group_range.end)
        ranges = self._keyed_ranges()
        operators_s = time.perf_counter() - started
        self._log.info("checkpoint_barrier_forwarded", checkpoint_id=cid, alignment_s=round(alignment_s, 4))
        if not ranges:
            snapshot = ChainSnapshot(self.address, cid, states, kg, None)
            self._callbacks.on_checkpoint(
                self.address, CheckpointAck(snapshot, alignment_s, start_delay_s, operators_s, 0.0)
            )
            self._log.info("checkpoint_acknowledged", checkpoint_id=cid, sync_s=round(operators_s, 4))
            return
        kind = "savepoint" if request.kind == common_pb2.CHECKPOINT_KIND_SAVEPOINT else "checkpoint"
        future = self._snapshotter.begin(
            JobId(self.address.job_id), CheckpointId(cid), ranges, kind, attempt=self.address.attempt
        )

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
            snapshot = ChainSnapshot(self.address, cid, states, kg, result.handle)
            self._callbacks.on_checkpoint(
                self.address,
                CheckpointAck(
                    snapshot, alignment_s, start_delay_s, operators_s + result.sync_duration_s, result.async_duration_s
                ),
            )

        future.add_done_callback(uploaded)

    def _finish(self) -> None:
        """End of input: wait for the notifications of the checkpoints this task acknowledged (their
        sink transactions commit then), every operator flushes in chain order, then end-of-stream."""
        deadline = time.monotonic() + FINAL_NOTIFICATION_TIMEOUT_S
        while self._unconfirmed:
            if time.monotonic() > deadline:
                raise CheckpointNotificationTimeout(
                    f"task {self.address}: no completion notice for checkpoint(s) {sorted(self._unconfirmed)} "
                    f"within {FINAL_NOTIFICATION_TIMEOUT_S:.0f}s of the end of input"
                )
            self._idle_wait(POLL_TIMEOUT_S)
            self._control_signal.clear()
            self._drain_control()
        for op in self.operators:
            op.end_input()
        for net in self._network_outputs:
            net.flush()
        eos = end_of_stream_message()
        for w in self._writers:
            w.broadcast_event(eos)
        self._drain_control()

    def _backpressured_total(self) -> float:
        return sum(ch.backpressured_total() for w in self._writers for ch in w.channels)

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

    def _sync_metrics(self) -> None:
        """Move the task's plain counters into its Prometheus metrics (twice a second, not per record)."""
        m = self.metrics
        now = time.monotonic()
        backpressured = self.sync_backpressure()
        if self._time_mark is not None:
            since, idle, waited = self._time_mark
            self._busy_s += max(0.0, (now - since) - (self._idle_s - idle) - (backpressured - waited))
            self._time_mark = (now, self._idle_s, backpressured)
        channels = [ch for w in self._writers for ch in w.channels]
        totals = {
            "records_in": float(self.records_in),
            "records_out": float(sum(w.records_out for w in self._writers)),
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
        if self._source_tap is not None:
            watermark = exported_watermark(self._source_tap.watermark)
            if watermark is not None:
                m.watermark.set(watermark)


def gate_all_ended(gate: InputGate) -> bool:
    return all(ch.ended for ch in gate.channels)
