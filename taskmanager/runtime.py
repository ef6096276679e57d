"""The TaskManager process: deploys subtasks, hosts their input gates, reports to the JobManager."""

from __future__ import annotations

import hashlib
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Final, assert_never

import grpc
import structlog

from weir.api import load_job_source
from weir.connectors.object_storage import CheckpointStorage, open_storage
from weir.core.checkpointing import CheckpointingMode, CheckpointKind
from weir.core.codec import (
    checkpoint_kind_from_proto,
    checkpointing_mode_from_proto,
    failure_to_proto,
    set_task_load,
    task_state_to_proto,
    timeline_to_proto,
)
from weir.core.config import checkpoint_dir
from weir.core.errors import ProtocolError, WeirError
from weir.core.failures import Failure
from weir.core.grpc_security import open_channel
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskManagerId
from weir.core.keygroups import KeyEncoder
from weir.core.metrics import STATE_SIZE_BYTES, TASKS_RUNNING
from weir.core.paths import CheckpointPaths
from weir.core.rejections import FAIL
from weir.core.states import TaskState
from weir.core.task_state import (
    INFLIGHT_STATE_NAME,
    INLINE_STATE_LIMIT_BYTES,
    InlineOperatorState,
    OperatorStateHandle,
    StoredOperatorState,
    TaskStateDocument,
    decode_task_state,
    encode_task_state,
    pack_operator_states,
    relative_operator_state,
)
from weir.core.transport import MAX_MESSAGE_BYTES
from weir.core.transport_security import TransportSecurity
from weir.graph import LogicalGraph
from weir.operators.rejections import KafkaDeadLetters, RecordRejections
from weir.plan import JobPlan, NetworkEdge, build_plan
from weir.taskmanager.barrier_aligner import AlignmentMode
from weir.taskmanager.mailbox import CheckpointRequest
from weir.taskmanager.network import (
    GATE_WAIT_S,
    InputGate,
    KeyRejected,
    LocalOutputChannel,
    OutputChannel,
    RecordWriter,
    RemoteOutputChannel,
)
from weir.taskmanager.partitioners import create_partitioner
from weir.taskmanager.snapshots import (
    TaskKeyedState,
    keyed_state_from_document,
    keyed_state_to_document,
    relative_handle,
)
from weir.taskmanager.task import (
    ChainRestore,
    CheckpointAck,
    InheritedRestore,
    Restore,
    Task,
    TaskAddress,
    TaskCallbacks,
)
from weir.wire import common_pb2, jobmanager_pb2, jobmanager_pb2_grpc, taskmanager_pb2

log = structlog.get_logger("weir.taskmanager")

BACKPRESSURE_SAMPLE_S = 0.5
ACK_HEADROOM_BYTES: Final = 64 * 1024
_REPORTED_STATES: Final = (TaskState.DEPLOYING, TaskState.RUNNING)  # a heartbeat carries these tasks
"""Room left below the gRPC message limit for the acknowledgement's own fields."""


@dataclass(frozen=True)
class StateReport:
    """A task's state (or its end of input) for the JobManager."""

    kind: ClassVar[str] = "state"
    request: jobmanager_pb2.ReportTaskStateRequest


@dataclass(frozen=True)
class AckReport:
    kind: ClassVar[str] = "ack"
    request: jobmanager_pb2.AcknowledgeCheckpointRequest


@dataclass(frozen=True)
class DeclineReport:
    kind: ClassVar[str] = "decline"
    request: jobmanager_pb2.DeclineCheckpointRequest


@dataclass(frozen=True)
class StopReporting:
    """The TaskManager stops: the reporter ends."""


Report = StateReport | AckReport | DeclineReport | StopReporting


def alignment_for(mode: CheckpointingMode) -> AlignmentMode:
    """How a task aligns barriers under the job's checkpointing mode."""
    match mode:
        case CheckpointingMode.EXACTLY_ONCE:
            return AlignmentMode.EXACTLY_ONCE
        case CheckpointingMode.AT_LEAST_ONCE:
            return AlignmentMode.AT_LEAST_ONCE
        case CheckpointingMode.UNALIGNED:
            return AlignmentMode.UNALIGNED
        case _:
            assert_never(mode)


def key_rejected(rejections: RecordRejections, graph: LogicalGraph, edge: NetworkEdge) -> KeyRejected:
    """What a keyed edge's record writer does when the key selector raises: the keyed operator the
    edge feeds (its head) handles the record as its ``on_error`` says (default: fail)."""
    consumer = graph.transformations[edge.consumer_vertex]
    handling = consumer.on_error() if consumer.on_error is not None else FAIL
    return partial(rejections.reject, consumer.uid, handling, edge.key_selector)


def oversized_ack_reason(size_bytes: int, limit_bytes: int, checkpoint_id: int) -> str | None:
    """Why an acknowledgement of ``size_bytes`` cannot be sent under a ``limit_bytes`` message limit;
    None when it fits. The checkpoint is declined with this reason instead of timing out."""
    if size_bytes + ACK_HEADROOM_BYTES <= limit_bytes:
        return None
    return (
        f"the acknowledgement of checkpoint {checkpoint_id} is {size_bytes:,} bytes, over the "
        f"{limit_bytes - ACK_HEADROOM_BYTES:,}-byte limit of a control message: the task's inline state (e.g. "
        "a transactional sink's pending output) is too large; checkpoint more often or lower the sink's backlog"
    )


class TaskManagerRuntime:
    def __init__(
        self,
        taskmanager_id: str,
        advertised_address: str,
        jobmanager_address: str,
        slots: int,
        run_dir: Path,
        *,
        local_channels: bool = True,
        security: TransportSecurity | None = None,
    ) -> None:
        """``security``: how this TaskManager reaches the JobManager and its peers (default: from the
        environment)."""
        self.id = taskmanager_id
        self._security = security if security is not None else TransportSecurity.from_env()
        self.address = advertised_address
        # A producer whose consumer runs here hands it buffers in memory (network.LocalOutputChannel).
        self.local_channels = local_channels
        self.slots = slots
        self.incarnation = uuid.uuid4().hex  # this process: a restart registers as a new incarnation
        self._run_dir = run_dir / taskmanager_id
        self._run_dir.mkdir(parents=True, exist_ok=True)
        # Each keyed task attempt has its own RocksDB under jobs/<job>/; none survives a process start:
        # state of earlier runs comes back only through a restore.
        self._jobs_dir = self._run_dir / "jobs"
        shutil.rmtree(self._jobs_dir, ignore_errors=True)
        self._storage = open_storage(checkpoint_dir())
        self._paths = CheckpointPaths()
        # The async phase of a task's operator state: its object written, then the acknowledgement.
        self._state_writes = ThreadPoolExecutor(4, thread_name_prefix="operator-state-write")
        self.tasks: dict[TaskAddress, Task] = {}
        self._gates: dict[TaskAddress, InputGate] = {}
        self._awaiting_gates: dict[TaskAddress, list[LocalOutputChannel]] = {}  # local producers, by consumer
        self._lock = threading.Condition()
        self._channels: dict[str, grpc.Channel] = {}
        self._jobs: dict[str, tuple[Any, JobPlan]] = {}
        self._jm_channel = open_channel(jobmanager_address, self._security)
        self.jobmanager = jobmanager_pb2_grpc.JobManagerServiceStub(self._jm_channel)
        self._reports: queue.SimpleQueue[Report] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._reporter = threading.Thread(target=self._report_loop, name="reporter", daemon=True)
        self._reporter.start()
        self._tasks_running = TASKS_RUNNING.labels(taskmanager_id)
        self._tasks_running.set(0)
        self._sampler = threading.Thread(target=self._sample_backpressure, name="backpressure-sampler", daemon=True)
        self._sampler.start()

    # Deployment -----------------------------------------------------------------------------------

    def _load(self, req: taskmanager_pb2.DeployTaskRequest) -> tuple[Any, JobPlan]:
        key = hashlib.sha256(
            req.job_source + repr(sorted(req.parameters.items())).encode() + str(req.parallelism).encode()
        ).hexdigest()
        cached = self._jobs.get(key)
        if cached is None:
            loaded = load_job_source(
                req.job_source, req.job_file_name, dict(req.parameters), req.parallelism, req.job_name
            )
            cached = (loaded, build_plan(loaded.graph))
            self._jobs[key] = cached
        return cached

    def _grpc_channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = open_channel(address, self._security)
                self._channels[address] = channel
            return channel

    def deploy(self, req: taskmanager_pb2.DeployTaskRequest) -> None:
        addr = TaskAddress(req.task.job_id, req.task.vertex_uid, req.task.subtask, req.attempt)
        loaded, plan = self._load(req)
        vertex = plan.vertices[req.task.vertex_uid]
        graph = plan.graph
        inputs = sorted(req.inputs, key=lambda s: s.channel)
        gate = InputGate([s.gate for s in inputs]) if inputs else None
        writers: list[RecordWriter] = []
        cancelled = threading.Event()
        # Set by the JobManager from execution.buffer-timeout; an older JobManager leaves it out.
        buffer_timeout_s = (req.buffer_timeout_ms if req.HasField("buffer_timeout_ms") else 100) / 1000
        rejections = RecordRejections(
            addr.job_id,
            addr.subtask,
            KafkaDeadLetters(),
            log.bind(job_id=addr.job_id, task=addr.vertex_uid, subtask=addr.subtask, attempt=addr.attempt),
            metric_labels=(addr.job_id, self.id),
        )
        for edge_index, edge in enumerate(vertex.outputs):
            specs = sorted((s for s in req.outputs if s.output == edge_index), key=lambda s: s.channel)
            channels: list[OutputChannel] = []
            for spec in specs:
                header = taskmanager_pb2.ChannelHeader(
                    producer=req.task,
                    consumer=spec.consumer,
                    consumer_channel=spec.consumer_channel,
                    attempt=req.attempt,
                )
                if self.local_channels and spec.consumer_address == self.address:
                    channels.append(LocalOutputChannel(header, cancelled, self._attach_local))
                else:
                    channels.append(RemoteOutputChannel(self._grpc_channel(spec.consumer_address), header, cancelled))
            consumer = plan.vertices[edge.consumer_vertex]
            partitioner = create_partitioner(
                edge.partitioning,
                subtask=req.task.subtask,
                upstream_parallelism=vertex.parallelism,
                downstream_parallelism=consumer.parallelism,
                max_parallelism=graph.max_parallelism,
            )
            key_selector = edge.key_selector if edge.key_selector is not None and len(channels) > 1 else None
            writers.append(
                RecordWriter(
                    channels,
                    partitioner,
                    key_selector,
                    KeyEncoder(graph.max_parallelism).key_group,
                    flush_interval_s=buffer_timeout_s,
                    columnar=edge.side_output is None and graph.transformations[edge.producer_operator].columnar,
                    max_parallelism=graph.max_parallelism,
                    key_rejected=None if key_selector is None else key_rejected(rejections, graph, edge),
                )
            )
        restore = self._restore_of(addr, req)
        task = Task(
            address=addr,
            plan=plan,
            vertex=vertex,
            job_name=req.job_name,
            parameters=dict(req.parameters),
            writers=writers,
            gate=gate,
            callbacks=TaskCallbacks(
                on_state=self._on_task_state,
                on_checkpoint=self._on_checkpoint,
                on_decline=self._on_decline,
                on_input_ended=self._on_input_ended,
            ),
            taskmanager_id=self.id,
            restore=restore,
            restore_checkpoint_id=req.restore_checkpoint_id,
            alignment=alignment_for(checkpointing_mode_from_proto(req.checkpointing_mode)),
            aligned_checkpoint_timeout_s=req.aligned_checkpoint_timeout_ms / 1000,
            user_code_files=frozenset({req.job_file_name}),
            cancelled=cancelled,
            restore_storage=self._storage_at(req.restore_storage_uri),
            open_keyed_state=lambda: self._open_keyed_state(addr),
            rejections=rejections,
        )
        with self._lock:
            self.tasks[addr] = task
        if gate is not None:
            self._register_gate(addr, gate)
        for w in writers:
            for ch in w.channels:
                ch.open()
        log.info(
            "task_deployed",
            job_id=addr.job_id,
            task=addr.vertex_uid,
            subtask=addr.subtask,
            attempt=addr.attempt,
            inputs=len(inputs),
            outputs=sum(len(w.channels) for w in writers),
            local_outputs=sum(isinstance(ch, LocalOutputChannel) for w in writers for ch in w.channels),
        )
        task.start()

    def _register_gate(self, addr: TaskAddress, gate: InputGate) -> None:
        """Make a deployed task's gate reachable by its producers: remote ones (``open_channel`` waits
        for it) and local ones (connected now if they opened first)."""
        with self._lock:
            self._gates[addr] = gate
            producers = self._awaiting_gates.pop(addr, [])
            self._lock.notify_all()
        for producer in producers:
            producer.connect(gate)

    def _attach_local(self, channel: LocalOutputChannel) -> None:
        """Connect a local output channel to its consumer's gate, now or once the consumer is deployed
        (as ``open_channel`` waits for a remote producer's consumer)."""
        header = channel.header
        addr = TaskAddress(header.consumer.job_id, header.consumer.vertex_uid, header.consumer.subtask, header.attempt)
        with self._lock:
            gate = self._gates.get(addr)
            if gate is None:
                self._awaiting_gates.setdefault(addr, []).append(channel)
                return
        channel.connect(gate)

    def _storage_at(self, uri: str) -> CheckpointStorage:
        """The storage restored state is read from: this TaskManager's own, or the one at ``uri``."""
        if not uri or uri == self._storage.uri:
            return self._storage
        return open_storage(uri)

    def _open_keyed_state(self, addr: TaskAddress) -> TaskKeyedState:
        """The RocksDB of one task attempt: ``jobs/<job>/<vertex>-<subtask>-<attempt>``."""
        directory = self._jobs_dir / addr.job_id / f"{addr.vertex_uid}-{addr.subtask}-{addr.attempt}"
        return TaskKeyedState(directory, self._storage, self._paths, TaskManagerId(self.id))

    def _restore_of(self, addr: TaskAddress, req: taskmanager_pb2.DeployTaskRequest) -> Restore | None:
        """What a subtask restores from (None: fresh start): its own task-state document after a
        restart of its job, or the documents it inherits from another job's retained checkpoint."""
        if req.restore_state_handle and req.inherited_task_states:
            raise ProtocolError(
                f"task {addr}: a deployment may restore its own state or inherit another job's, not both"
            )
        where = f"of task {addr} in checkpoint {req.restore_checkpoint_id}"
        if req.inherited_task_states:
            documents = tuple(
                decode_task_state(data, f"inherited by task {addr} from checkpoint {req.restore_checkpoint_id}")
                for data in req.inherited_task_states
            )
            return InheritedRestore(req.restore_checkpoint_id, documents)
        if not req.restore_state_handle:
            return None
        document = decode_task_state(req.restore_state_handle, where)
        keyed = keyed_state_from_document(document.keyed_state, where) if document.keyed_state is not None else None
        return ChainRestore(req.restore_checkpoint_id, document.operator_state, keyed, document.layout)

    def cancel_attempts_through(
        self, job_id: str, attempt: int, *, job_ended: bool = False, wait_s: float = 10.0
    ) -> None:
        """The JobManager ended attempts up to ``attempt`` of the job (a fail-over or a cancel);
        ``job_ended``: the job is over, so nothing of it is kept here."""
        self._cancel(job_id, lambda a: a <= attempt, wait_s)
        if job_ended:
            self.forget_job(job_id)

    def forget_job(self, job_id: str) -> None:
        """The job is over here (unless a task of it still runs): delete its local state directory.
        Each task deletes its own database when it ends; this removes what a task that never ran left."""
        with self._lock:
            if any(a.job_id == job_id for a in self.tasks):
                return
        shutil.rmtree(self._jobs_dir / job_id, ignore_errors=True)
        log.info("job_forgotten", job_id=job_id, taskmanager_id=self.id)

    def cancel_attempt(self, job_id: str, attempt: int, wait_s: float = 10.0) -> None:
        """Stop the tasks of exactly this attempt (a heartbeat named it as stale); the job's other
        attempts here, the current one above all, go on."""
        self._cancel(job_id, lambda a: a == attempt, wait_s)

    def _cancel(self, job_id: str, matches: Callable[[int], bool], wait_s: float) -> None:
        with self._lock:
            doomed = [t for a, t in self.tasks.items() if a.job_id == job_id and matches(a.attempt)]
        for t in doomed:
            t.cancel()
        deadline = time.monotonic() + wait_s
        for t in doomed:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            for t in doomed:
                self.tasks.pop(t.address, None)
                self._gates.pop(t.address, None)
            for a in [a for a in self._awaiting_gates if a.job_id == job_id and matches(a.attempt)]:
                del self._awaiting_gates[a]
            self._count_running_tasks()

    def _forget_finished(self, job_id: str) -> None:
        with self._lock:
            done = [t for a, t in self.tasks.items() if a.job_id == job_id]
        for task in done:
            task.join(10.0)
        with self._lock:
            for task in done:
                if task.state is TaskState.FINISHED:
                    self.tasks.pop(task.address, None)
        self.forget_job(job_id)

    def _count_running_tasks(self) -> None:
        """Set weir_taskmanager_tasks_running; called with the lock held, so that concurrent state
        changes set it in order and the last one counts them all."""
        self._tasks_running.set(sum(t.state is TaskState.RUNNING for t in self.tasks.values()))

    def tasks_of_job(self, job_id: str, attempt: int) -> list[Task]:
        with self._lock:
            return [t for a, t in self.tasks.items() if a.job_id == job_id and a.attempt == attempt]

    def trigger_checkpoint(self, req: taskmanager_pb2.TriggerCheckpointRequest) -> bool:
        addr = TaskAddress(req.task.job_id, req.task.vertex_uid, req.task.subtask, req.attempt)
        with self._lock:
            task = self.tasks.get(addr)
        if task is None or task.state is not TaskState.RUNNING:
            return False
        kind = checkpoint_kind_from_proto(req.kind or common_pb2.CHECKPOINT_KIND_CHECKPOINT)
        task.trigger_checkpoint(
            CheckpointRequest(CheckpointId(req.checkpoint_id), req.timestamp, kind, req.final, req.drain)
        )
        return True

    def notify_checkpoint(self, job_id: str, attempt: int, checkpoint_id: int, complete: bool) -> None:
        for task in self.tasks_of_job(job_id, attempt):
            if task.keyed_state is not None:
                snapshotter, cid = task.keyed_state.snapshotter, CheckpointId(checkpoint_id)
                if complete:
                    snapshotter.notify_checkpoint_complete(JobId(job_id), cid, attempt=attempt)
                else:
                    snapshotter.notify_checkpoint_aborted(JobId(job_id), cid, attempt=attempt)
            if complete:
                task.notify_checkpoint_complete(checkpoint_id)
            else:
                task.notify_checkpoint_aborted(checkpoint_id)

    # Data plane -----------------------------------------------------------------------------------

    def open_channel(self, requests: Iterator[taskmanager_pb2.DataMessage]) -> Iterator[taskmanager_pb2.CreditMessage]:
        try:
            first = next(requests)
        except StopIteration:
            return
        header = first.header
        addr = TaskAddress(header.consumer.job_id, header.consumer.vertex_uid, header.consumer.subtask, header.attempt)
        deadline = time.monotonic() + GATE_WAIT_S
        with self._lock:
            while addr not in self._gates:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopping.is_set():
                    yield taskmanager_pb2.CreditMessage(error=f"no task {addr} on {self.id}")
                    return
                self._lock.wait(min(remaining, 1.0))
            gate = self._gates[addr]
        channel = header.consumer_channel
        try:
            initial = gate.connect(channel)
        except WeirError as exc:
            yield taskmanager_pb2.CreditMessage(error=str(exc))
            return

        def pump() -> None:
            try:
                for msg in requests:
                    gate.push(channel, msg)
            except grpc.RpcError as exc:  # server side: a bare RpcError, often without a code()
                code = exc.code() if callable(getattr(exc, "code", None)) else None
                gate.producer_gone(channel, f"producer stream cut ({code.name if code else type(exc).__name__})")
            except WeirError as exc:
                gate.producer_gone(channel, str(exc))
            else:
                gate.producer_gone(channel, "stream closed")

        threading.Thread(target=pump, name=f"channel-in-{addr}-{channel}", daemon=True).start()
        yield taskmanager_pb2.CreditMessage(credits=initial)
        announcements = gate.channels[channel].announcements
        while True:
            grant = announcements.get()
            if grant is None:
                return
            yield taskmanager_pb2.CreditMessage(credits=grant)

    # Reports to the JobManager, off the task threads -----------------------------------------------

    def _task_ref(self, addr: TaskAddress) -> common_pb2.TaskRef:
        return common_pb2.TaskRef(job_id=addr.job_id, vertex_uid=addr.vertex_uid, subtask=addr.subtask)

    def _on_task_state(self, addr: TaskAddress, state: TaskState, failure: Failure | None) -> None:
        with self._lock:
            task = self.tasks.get(addr)
            self._count_running_tasks()
        records_in = task.records_in if task is not None else 0
        records_out = task.records_emitted() if task is not None else 0
        request = jobmanager_pb2.ReportTaskStateRequest(
            task=self._task_ref(addr),
            state=task_state_to_proto(state),
            attempt=addr.attempt,
            records_in=records_in,
            records_out=records_out,
        )
        if failure is not None:
            request.failure.CopyFrom(failure_to_proto(failure))
        self._reports.put(StateReport(request))
        if state.terminal:
            with self._lock:
                self._gates.pop(addr, None)
                finished = state is TaskState.FINISHED and all(
                    t.state is TaskState.FINISHED for a, t in self.tasks.items() if a.job_id == addr.job_id
                )
            if finished:  # the job's last task here finished: it has nothing more to do here
                threading.Thread(target=self._forget_finished, args=(addr.job_id,), daemon=True).start()

    def _on_checkpoint(self, addr: TaskAddress, ack: CheckpointAck) -> None:
        """Store the task's operator state (inline below ``INLINE_STATE_LIMIT_BYTES``, else as one
        object written on a background thread), then acknowledge with the task-state document."""
        states = ack.snapshot.operator_states
        if sum(len(b) for b in states.values()) < INLINE_STATE_LIMIT_BYTES:
            self._acknowledge(addr, ack, InlineOperatorState(dict(states)), write_s=0.0)
            return
        self._state_writes.submit(self._store_and_acknowledge, addr, ack)

    def _store_and_acknowledge(self, addr: TaskAddress, ack: CheckpointAck) -> None:
        snapshot = ack.snapshot
        cid = CheckpointId(snapshot.checkpoint_id)
        key = self._paths.task_state(
            JobId(addr.job_id), cid, OperatorUid(addr.vertex_uid), SubtaskIndex(addr.subtask), snapshot.kind
        )
        started = time.perf_counter()
        handle, blob = pack_operator_states(snapshot.operator_states, key)
        try:
            self._storage.put_bytes(key, blob)
        except Exception as exc:  # the checkpoint cannot complete without it; the next one may
            log.warning("operator_state_write_failed", task=str(addr), checkpoint_id=cid, key=key, error=str(exc))
            self._on_decline(addr, cid, f"writing the operator state to {key} failed: {exc}")
            return
        write_s = time.perf_counter() - started
        log.info("operator_state_written", task=str(addr), checkpoint_id=cid, key=key, bytes=len(blob))
        if ack.timeline is not None:  # the asynchronous part ends with this write
            ack = replace(ack, timeline=replace(ack.timeline, async_end_at=max(ack.timeline.async_end_at, time.time())))
        self._acknowledge(addr, ack, handle, write_s=write_s)

    def _acknowledge(
        self, addr: TaskAddress, ack: CheckpointAck, operator_state: OperatorStateHandle, write_s: float
    ) -> None:
        snapshot = ack.snapshot
        keyed = snapshot.keyed_state
        objects = [
            jobmanager_pb2.StateObjectRef(key=f.key, size_bytes=f.size_bytes, reused=f.reused)
            for f in (keyed.objects if keyed is not None else ())
        ]
        if isinstance(operator_state, StoredOperatorState):
            objects.append(jobmanager_pb2.StateObjectRef(key=operator_state.key, size_bytes=operator_state.size_bytes))
        if snapshot.kind is CheckpointKind.SAVEPOINT:
            # A savepoint is relocatable: its document's keys are relative to its folder (docs/formats.md);
            # the acknowledgement's objects keep the full keys the JobManager accounts for.
            folder = self._paths.checkpoint_dir(JobId(addr.job_id), CheckpointId(snapshot.checkpoint_id), snapshot.kind)
            keyed = relative_handle(keyed, folder) if keyed is not None else None
            operator_state = relative_operator_state(operator_state, folder)
        document = TaskStateDocument(
            job_id=addr.job_id,
            vertex_uid=addr.vertex_uid,
            subtask=addr.subtask,
            attempt=addr.attempt,
            checkpoint_id=CheckpointId(snapshot.checkpoint_id),
            layout=snapshot.layout,
            operator_state=operator_state,
            keyed_state=keyed_state_to_document(keyed) if keyed is not None else None,
        )
        payload = encode_task_state(document)
        request = jobmanager_pb2.AcknowledgeCheckpointRequest(
            task=self._task_ref(addr),
            checkpoint_id=snapshot.checkpoint_id,
            attempt=addr.attempt,
            state_handle=payload,
            alignment_duration_s=ack.alignment_s,
            start_delay_s=ack.start_delay_s,
            state_size_bytes=len(payload) + sum(o.size_bytes for o in objects),
            objects=objects,
            sync_duration_s=ack.sync_s,
            async_duration_s=ack.async_s + write_s,
            unaligned=INFLIGHT_STATE_NAME in snapshot.operator_states,
            inflight_bytes=ack.inflight_bytes,
        )
        if ack.timeline is not None:
            request.timeline.CopyFrom(timeline_to_proto(ack.timeline))
        too_large = oversized_ack_reason(request.ByteSize(), MAX_MESSAGE_BYTES, snapshot.checkpoint_id)
        if too_large is not None:
            log.warning(
                "checkpoint_ack_too_large",
                task=str(addr),
                checkpoint_id=snapshot.checkpoint_id,
                bytes=request.ByteSize(),
            )
            self._on_decline(addr, snapshot.checkpoint_id, too_large)
            return
        self._reports.put(AckReport(request))
        with self._lock:
            databases = [t.keyed_state for t in self.tasks.values() if t.keyed_state is not None]
        STATE_SIZE_BYTES.labels(self.id).set(sum(d.live_sst_bytes() for d in databases))

    def _on_input_ended(self, addr: TaskAddress) -> None:
        self._reports.put(
            StateReport(
                jobmanager_pb2.ReportTaskStateRequest(
                    task=self._task_ref(addr),
                    state=task_state_to_proto(TaskState.RUNNING),
                    attempt=addr.attempt,
                    input_ended=True,
                )
            )
        )

    def _on_decline(self, addr: TaskAddress, checkpoint_id: int, reason: str) -> None:
        self._reports.put(
            DeclineReport(
                jobmanager_pb2.DeclineCheckpointRequest(
                    task=self._task_ref(addr), checkpoint_id=checkpoint_id, attempt=addr.attempt, reason=reason
                )
            )
        )

    def _send(self, report: StateReport | AckReport | DeclineReport) -> None:
        """One report to the JobManager; raises grpc.RpcError."""
        match report:
            case StateReport(request=request):
                self.jobmanager.ReportTaskState(request, timeout=10)
            case AckReport(request=request):
                self.jobmanager.AcknowledgeCheckpoint(request, timeout=10)
            case DeclineReport(request=request):
                self.jobmanager.DeclineCheckpoint(request, timeout=10)
            case _:
                assert_never(report)

    def _report_loop(self) -> None:
        while not self._stopping.is_set():
            report = self._reports.get()
            if isinstance(report, StopReporting):
                return
            delay = 0.2
            while not self._stopping.is_set():
                try:
                    self._send(report)
                    break
                except grpc.RpcError as exc:
                    if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        self._stopping.wait(delay)
                        delay = min(delay * 2, 5.0)
                        continue
                    log.warning("report_rejected", kind=report.kind, code=exc.code().name, details=exc.details())
                    # An acknowledgement refused (e.g. too large for the JobManager): decline it, never drop it.
                    if isinstance(report, AckReport):
                        request = report.request
                        self._reports.put(
                            DeclineReport(
                                jobmanager_pb2.DeclineCheckpointRequest(
                                    task=request.task,
                                    checkpoint_id=request.checkpoint_id,
                                    attempt=request.attempt,
                                    reason=(
                                        "the JobManager refused the acknowledgement: "
                                        f"{exc.code().name}: {exc.details()}"
                                    ),
                                ),
                            )
                        )
                    break

    def _sample_backpressure(self) -> None:
        """A task blocked in a send for credit cannot update its own metrics: twice a second, move the
        time its channels have waited so far into weir_backpressured_seconds_total."""
        while not self._stopping.wait(BACKPRESSURE_SAMPLE_S):
            with self._lock:
                running = [t for t in self.tasks.values() if t.state is TaskState.RUNNING]
            for task in running:
                task.sync_backpressure()

    # Registration and heartbeats ------------------------------------------------------------------

    def register(self, metrics_port: int) -> float:
        response = self.jobmanager.RegisterTaskManager(
            jobmanager_pb2.RegisterTaskManagerRequest(
                taskmanager_id=self.id,
                address=self.address,
                slots=self.slots,
                metrics_port=metrics_port,
                incarnation=self.incarnation,
            ),
            timeout=5,
        )
        log.info("registered_with_jobmanager", taskmanager_id=self.id, address=self.address, slots=self.slots)
        return response.heartbeat_interval_s or 1.0

    def _progress(self, address: TaskAddress, task: Task) -> jobmanager_pb2.TaskProgress:
        """A running task's heartbeat entry: its counters, its time shares since the last heartbeat
        and its input watermark."""
        progress = jobmanager_pb2.TaskProgress(
            task=self._task_ref(address),
            attempt=address.attempt,
            records_in=task.records_in,
            records_out=task.records_emitted(),
        )
        set_task_load(progress, task.time_ratios(), task.input_watermark())
        return progress

    def heartbeat_loop(self, metrics_port: int) -> None:
        interval = 1.0
        registered = False
        refused: grpc.StatusCode | None = None
        while not self._stopping.is_set():
            try:
                if not registered:
                    interval = self.register(metrics_port)
                    registered = True
                with self._lock:
                    running = [self._progress(a, t) for a, t in self.tasks.items() if t.state in _REPORTED_STATES]
                response = self.jobmanager.Heartbeat(
                    jobmanager_pb2.HeartbeatRequest(taskmanager_id=self.id, running_tasks=running), timeout=5
                )
                if response.reregister:
                    registered = False
                    continue
                for stale in response.cancel:
                    threading.Thread(
                        target=self.cancel_attempt, args=(stale.job_id, stale.attempt), daemon=True
                    ).start()
            except grpc.RpcError as exc:
                if registered:
                    log.warning("jobmanager_unreachable", code=exc.code().name)
                elif exc.code() != refused:  # once per cause: e.g. a certificate or token the JobManager refuses
                    refused = exc.code()
                    details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                    log.warning("jobmanager_registration_failed", code=refused.name, details=details)
                registered = registered and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            self._stopping.wait(interval)

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            tasks = list(self.tasks.values())
            self._lock.notify_all()
        for t in tasks:
            t.cancel()
        for t in tasks:
            t.join(5)
        self._state_writes.shutdown(wait=True)  # acknowledgements still being stored go out first
        self._reports.put(StopReporting())
        with self._lock:
            keyed = [t.keyed_state for t in tasks if t.keyed_state is not None]
        for state in keyed:  # a task still running after its join: its database goes anyway
            state.discard()
