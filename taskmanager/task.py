"""One subtask: an operator chain run by one thread, fed by its input gate or by its source (Flink's
``StreamTask``).

The thread owns every operator of the chain: records, watermarks, barriers, checkpoint
notifications and cancellation are all handled on it, so operators never need locks. It runs one
loop (:class:`~weir.taskmanager.mailbox_processor.MailboxProcessor`) through the phases of its life,
each a default action of ``default_actions``; control mails and, for a task with inputs, the buffers
of its input gate wake it through the same signal. The task wires its collaborators and hands them
their work: the :class:`~weir.taskmanager.restorer.SubtaskRestorer` before the chain opens, the
:class:`~weir.taskmanager.input_processor.InputProcessor` for what its gate delivers, the
:class:`~weir.taskmanager.checkpointer.SubtaskCheckpointer` for every checkpoint.

A record's path: source or input gate -> :class:`~weir.taskmanager.chain.OperatorChain` -> a
:class:`~weir.taskmanager.network.writer.NetworkOutput` per edge -> its RecordWriter -> channels to
the consumers' input gates.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterable
from typing import assert_never

import structlog

from weir.connectors.object_storage import CheckpointStorage
from weir.core.checkpointing import CheckpointingMode
from weir.core.errors import ProtocolError, SerializationError
from weir.core.failures import Failure
from weir.core.ids import ChannelIndex, CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskId
from weir.core.keygroups import key_group_range_for_subtask
from weir.core.metrics import TaskMetrics
from weir.core.process_functions import Clock, wall_clock_ms
from weir.core.rejections import SourcePosition
from weir.core.state_schema import StoredSchema
from weir.core.states import TaskState
from weir.core.task_state import SubtaskLayout
from weir.core.task_time import TimeRatios, TimeTotals
from weir.core.watermarks import MAX_WATERMARK, WatermarkStatus
from weir.operators.base import OperatorContext
from weir.operators.keyed import KeyedOperator
from weir.operators.rejections import KafkaDeadLetters, RecordRejections
from weir.plan import JobPlan, Vertex
from weir.taskmanager.barrier_aligner import BarrierAligner
from weir.taskmanager.chain import ChainInput, OperatorChain
from weir.taskmanager.checkpointer import CheckpointTopology, SubtaskCheckpointer
from weir.taskmanager.default_actions import AwaitFinalCheckpoint, AwaitNotifications, PollSource, ProcessInput
from weir.taskmanager.duties import AlignmentTimeout, OutputFlush, ProcessingTimers
from weir.taskmanager.inflight import InputOrigin
from weir.taskmanager.input_processor import InputProcessor
from weir.taskmanager.mailbox import (
    Cancel,
    CheckpointAborted,
    CheckpointComplete,
    CheckpointRequest,
    Mail,
    Mailbox,
    RunInTask,
    TriggerCheckpoint,
)
from weir.taskmanager.mailbox_processor import Duty, MailboxProcessor
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.writer import RecordWriter, TaskOutputs
from weir.taskmanager.restorer import InflightReplay, SubtaskRestorer, TaskChannels, replay_outputs
from weir.taskmanager.snapshots import SnapshotError, TaskKeyedState
from weir.taskmanager.task_metrics import MetricsSync, TimeAccount, exported_watermark
from weir.taskmanager.task_types import Cancelled, Restore, TaskAddress, TaskCallbacks


def declared_state_schemas(operators: Iterable[KeyedOperator]) -> dict[str, tuple[StoredSchema, ...]]:
    """What the chain's keyed operators declare of their states, by uid: what its snapshots record."""
    return {op.ctx.uid: tuple(s.stored() for s in op.state_schemas()) for op in operators}


class Task:
    """One subtask attempt: built (chain, outputs, collaborators) by the TaskManager's deploy, run on
    a thread of its own by :meth:`start`, driven from other threads only through mails."""

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
        mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE,
        user_code_files: frozenset[str] = frozenset(),
        cancelled: threading.Event | None = None,
        restore_storage: CheckpointStorage | None = None,
        open_keyed_state: Callable[[], TaskKeyedState] | None = None,
        aligned_checkpoint_timeout_s: float = 0.0,
        clock: Clock = wall_clock_ms,
        rejections: RecordRejections | None = None,
    ) -> None:
        self.address = address
        self._plan = plan
        self._vertex = vertex
        self._job_name = job_name
        self._parameters = parameters
        self._gate = gate
        self._callbacks = callbacks
        self._restore = restore
        self._restore_checkpoint_id = restore_checkpoint_id
        self._restore_storage = restore_storage  # where the restored state's keys are
        self._user_code_files = user_code_files  # the job file: an exception raised through it is the user's
        self._mailbox = Mailbox(gate.condition if gate is not None else None)
        self.cancelled = cancelled if cancelled is not None else threading.Event()  # also read by the channels
        self.state = TaskState.DEPLOYING
        self.failure: Failure | None = None
        self._log = structlog.get_logger("weir.task").bind(
            job_id=address.job_id,
            task=vertex.uid,
            subtask=address.subtask,
            attempt=address.attempt,
            taskmanager=taskmanager_id,
        )
        self.metrics = TaskMetrics(address.job_id, job_name, vertex.uid, address.subtask, taskmanager_id)
        graph = plan.graph
        self.key_group_range = key_group_range_for_subtask(
            graph.max_parallelism, vertex.parallelism, SubtaskIndex(address.subtask)
        )
        self.outputs = TaskOutputs(writers)
        # Records its user functions raise on: failed with the record named, or dead-lettered (its
        # record writers' key selectors report to the same one).
        if rejections is None:
            rejections = RecordRejections(
                address.job_id,
                address.subtask,
                KafkaDeadLetters(parameters),
                self._log,
                metric_labels=(address.job_id, job_name, taskmanager_id),
            )
        self.rejections = rejections
        rejections.locate_with(self._position_in_flight)
        # Unaligned mode with checkpointing.aligned-checkpoint-timeout: checkpoints start aligned.
        aligned_timeout_s = aligned_checkpoint_timeout_s if mode is CheckpointingMode.UNALIGNED else 0.0
        for channel in self.outputs.channels:
            channel.set_wakeup(self._mailbox.notify)
        self.chain = OperatorChain(
            vertex, lambda uid: graph.transformations[uid].factory(), list(self.outputs.edges), self._context_of
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
        input_channels = plan.input_channels(vertex.uid, address.subtask)
        origins = {ChannelIndex(c.channel): InputOrigin(c.gate, c.producer_vertex) for c in input_channels}
        targets = {index: edge.target for index, edge in enumerate(vertex.outputs)}  # as the writers
        self._channels = TaskChannels(
            origins, targets, len(gate.channels) if gate is not None else 0, [len(w.channels) for w in writers]
        )
        self.checkpointer = SubtaskCheckpointer(
            address=address,
            taskmanager_id=taskmanager_id,
            log=self._log,
            mode=mode,
            aligned_timeout_s=aligned_timeout_s,
            snapshot_operators=self.chain.snapshot,
            outputs=self.outputs,
            layout=self.layout,
            broadcast_operator_uids=self.chain.broadcast_operator_uids,
            keyed_state=self.keyed_state,
            keyed_ranges=[(OperatorUid(op.ctx.uid), self.key_group_range) for op in self.chain.keyed_operators],
            topology=CheckpointTopology(
                origins,
                targets,
                {ChannelIndex(c.channel): (c.producer_vertex, c.producer_subtask) for c in input_channels},
            ),
            callbacks=callbacks,
        )
        self.input: InputProcessor | None = None
        if gate is not None:
            chain_input = ChainInput(
                self.chain,
                [ch.gate for ch in gate.channels],
                announce=self._announce_watermark_status,
                watermark_advanced=self._show_watermark,
            )
            aligner = BarrierAligner(
                TaskId(JobId(address.job_id), OperatorUid(vertex.uid), SubtaskIndex(address.subtask)),
                len(gate.channels),
                mode,
                aligned_start=aligned_timeout_s > 0,
            )
            self.input = InputProcessor(gate, chain_input, aligner, self.checkpointer, self.metrics, self._log)
        self.time = TimeAccount(self.metrics)
        self._metrics_sync = MetricsSync(
            self.metrics,
            self.time,
            self.outputs,
            gate,
            lambda: self.records_in,
            self._source_watermark,
            self._source_records_read,
        )
        self.timers = ProcessingTimers(self.chain, clock, lambda: self.checkpointer.final_barrier_sent)
        duties: list[Duty] = [self.timers, OutputFlush(self.outputs)]
        if aligned_timeout_s > 0 and gate is not None:
            duties.append(AlignmentTimeout(gate, aligned_timeout_s, self._log))
        duties.append(self._metrics_sync)
        self.loop = MailboxProcessor(self._mailbox, self._on_mail, self.outputs.available, duties, self.time)
        self._source_action: PollSource | None = None
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
            mailbox_executor=self._run_in_task,
        )

    def _run_in_task(self, action: Callable[[], None]) -> None:
        """From any thread: ``action`` runs on this task's thread, as a mail (an operator's ``mailbox_executor``)."""
        self._mailbox.put(RunInTask(action))

    def _position_in_flight(self) -> SourcePosition | None:
        """Where the record a chained operator rejects was read: known from the chain's own Kafka
        source while it emits the record; None across a network exchange."""
        source = self.chain.source
        return source.position_in_flight() if source is not None else None

    def restorer(self) -> SubtaskRestorer:
        """What restores this subtask from ``restore_checkpoint_id`` (read from ``restore_storage``)."""
        return SubtaskRestorer(
            address=self.address,
            checkpoint_id=self._restore_checkpoint_id,
            vertex=self._vertex,
            max_parallelism=self._plan.graph.max_parallelism,
            key_group_range=self.key_group_range,
            channels=self._channels,
            storage=self._restore_storage,
            cancelled=self.cancelled,
            log=self._log,
        )

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

    # What other threads read ----------------------------------------------------------------------

    @property
    def records_in(self) -> int:
        return self.input.records_in if self.input is not None else 0

    def records_emitted(self) -> int:
        return self.outputs.records_out

    def _source_records_read(self) -> int:
        """The records a source task's source read (``weir_source_records_read_total``), 0 elsewhere."""
        source = self.chain.source
        return source.records_polled if source is not None else 0

    def sync_backpressure(self) -> float:
        """Move the time this task waited for its outputs into ``weir_backpressured_seconds_total``;
        answers the total. Thread-safe (the TaskManager's sampler calls it)."""
        return self.time.sync_backpressure()

    def time_ratios(self) -> TimeRatios | None:
        """The shares of busy, backpressured and idle time since the previous call (the heartbeat's)."""
        return self.time.time_ratios()

    def time_totals(self) -> TimeTotals:
        """The busy, backpressured and idle seconds of this attempt so far (the heartbeat's)."""
        return self.time.time_totals()

    def input_watermark(self) -> int | None:
        """The task's current input watermark (a source's: the one it emits), in ms; None before the
        first one and at the end of input. Any thread may ask."""
        if self.input is not None:
            return exported_watermark(self.input.chain_input.tracker.current)
        return exported_watermark(self._source_watermark())

    # The task thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self.cancelled.is_set():
                raise Cancelled()
            replay: InflightReplay | None = None
            if self._restore is not None:
                try:
                    replay = self.restorer().restore(self._restore, self.chain, self.keyed_state)
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
            self.time.begin()
            replay_outputs(replay, self.outputs, self._log)
            self._process(replay)
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
            self.outputs.close(drain=self.state is TaskState.FINISHED)  # a finished task's end of stream goes out
            if self._gate is not None:
                self._gate.close()
            self._discard_keyed_state()
            self._close_rejections()
            self._metrics_sync.sync()
            self.time.retire()  # this attempt's series go; a sampler must not bring them back

    def _process(self, replay: InflightReplay | None) -> None:
        """The task's life after its chain opened, as default actions of its one loop: poll the source
        (then wait for the final checkpoint) or take input from the gate (the replayed in-flight input
        first); then wait for the last notifications; then end the chain's input."""
        source = self.chain.source
        if source is not None:
            self._source_action = PollSource(source, self.time, self.records_emitted, self._announce_watermark_status)
            self.loop.run(self._source_action)
            self._end_source_input()
            self.loop.run(AwaitFinalCheckpoint(self.checkpointer))
        else:
            processor = self.input
            if processor is None:
                raise ProtocolError(f"task {self.address}: its chain has no source and it was given no input gate")
            processor.replay(replay)
            self.loop.run(ProcessInput(processor))
        if self.cancelled.is_set():
            raise Cancelled()
        self.loop.run(AwaitNotifications(self.checkpointer, self.address))
        self.chain.end_input()  # every operator flushes in chain order, then the end of stream
        self.loop.drain()

    def _end_source_input(self) -> None:
        """A bounded source read all its input: tell the JobManager, which triggers a final checkpoint;
        the stream ends only once that checkpoint completed (Flink's end-of-data protocol)."""
        self.outputs.flush()
        self._callbacks.on_input_ended(self.address)
        self._log.info("source_input_ended", awaiting="final checkpoint")

    def _close_rejections(self) -> None:
        try:
            self.rejections.close()
        except Exception as exc:  # a dead-letter producer failing to close must not hide the task's outcome
            self._log.warning("dead_letter_close_failed", error=str(exc))

    def _close_failed(self, uid: str, exc: Exception) -> None:
        self._log.warning("operator_close_failed", operator_uid=uid, error=str(exc))

    def _discard_keyed_state(self) -> None:
        """The task is over: its database goes (after the uploads of its snapshots in flight)."""
        if self.keyed_state is None:
            return
        try:
            self.keyed_state.discard()
        except Exception as exc:
            self._log.warning("keyed_state_discard_failed", error=str(exc))

    def _set_state(self, state: TaskState, failure: Failure | None = None) -> None:
        self.state = state
        self._callbacks.on_state(self.address, state, failure)

    # Mails -----------------------------------------------------------------------------------------

    def _on_mail(self, mail: Mail) -> None:
        match mail:
            case TriggerCheckpoint(request=request):
                if request.drain:
                    self._drain()
                self.checkpointer.trigger(request)
            case CheckpointComplete(checkpoint_id=checkpoint_id):
                self.chain.notify_checkpoint_complete(checkpoint_id)
                self.checkpointer.notify_complete(checkpoint_id)
            case CheckpointAborted(checkpoint_id=checkpoint_id):
                self.chain.notify_checkpoint_aborted(checkpoint_id)
                if self.input is not None:
                    self.input.abort(checkpoint_id)
                self.checkpointer.notify_aborted(checkpoint_id)  # e.g. its capture complete, its upload not yet
            case Cancel():
                raise Cancelled()
            case RunInTask(action=action):
                action()
            case _:
                assert_never(mail)

    def _drain(self) -> None:
        """weir stop --drain: the source emits the end of event time, so every window downstream fires
        before the barrier that follows, and reads nothing more (the job stops at that savepoint)."""
        self._log.info("source_drained", reason="stop with savepoint and --drain")
        if self._source_action is not None:
            self._source_action.drain()
        tap = self.chain.source_tap
        if tap is not None:
            tap.emit_watermark(MAX_WATERMARK)

    # Watermarks ------------------------------------------------------------------------------------

    def _source_watermark(self) -> int | None:
        tap = self.chain.source_tap
        return tap.watermark if tap is not None else None

    def _show_watermark(self, watermark: int) -> None:
        if exported_watermark(watermark) is not None:
            self.metrics.show_watermark(watermark)

    def _announce_watermark_status(self, status: WatermarkStatus) -> None:
        """Tell every consumer when this subtask goes idle or active. Chained operators share the status."""
        if not self.outputs.announce(status):
            return
        match status:
            case WatermarkStatus.IDLE:
                self._log.info("subtask_idle", watermark=self.input_watermark())
            case WatermarkStatus.ACTIVE:
                self._log.info("subtask_active", watermark=self.input_watermark())
            case _:
                assert_never(status)
