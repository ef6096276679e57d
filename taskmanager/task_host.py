"""The subtasks one process runs: deploys them, hosts their input gates, forwards the JobManager's
control calls to them and turns their callbacks into reports.

A TaskManager runs its tasks either in its own process (one :class:`TaskHost`, served by the
TaskManager's gRPC server) or in one slot worker process per slot (``slot_worker``: each worker has
a :class:`TaskHost` of its own, served by the worker's data-plane server). Either way the host is the
same; what differs is where its reports go (:class:`~weir.taskmanager.reporter.ReportSink`: the
JobManager reporter, or the worker's link to its TaskManager) and who owns the job directories.
In Flink's terms this is the ``TaskSlotTable`` and the ``Task`` factory of a ``TaskExecutor``.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Final

import grpc
import structlog

from weir.api.job_code import JobCode, SourceCode, load_job, prepare_artifact
from weir.connectors.object_storage import CheckpointStorage, open_storage
from weir.core.codec import (
    checkpoint_kind_from_proto,
    checkpointing_mode_from_proto,
    failure_to_proto,
    set_task_load,
    task_state_to_proto,
)
from weir.core.config import PythonJobSettings
from weir.core.errors import ProtocolError
from weir.core.failures import Failure
from weir.core.grpc_security import open_channel
from weir.core.ids import CheckpointId, JobId, SubtaskIndex, TaskManagerId
from weir.core.keygroups import KeyEncoder
from weir.core.metrics import STATE_SIZE_BYTES, TASKS_RUNNING
from weir.core.paths import CheckpointPaths
from weir.core.rejections import FAIL
from weir.core.states import TaskState
from weir.core.task_state import decode_task_state
from weir.core.transport_security import TransportSecurity
from weir.graph import LogicalGraph
from weir.operators.rejections import KafkaDeadLetters, RecordRejections, forget_job_series
from weir.plan import JobPlan, NetworkEdge, build_plan
from weir.taskmanager.mailbox import CheckpointRequest
from weir.taskmanager.network.gate import InputGate
from weir.taskmanager.network.output_channels import LocalOutputChannel, OutputChannel, RemoteOutputChannel
from weir.taskmanager.network.server import ChannelServer
from weir.taskmanager.network.writer import KeyRejected, RecordWriter
from weir.taskmanager.partitioners import create_partitioner
from weir.taskmanager.reporter import (
    CheckpointAcknowledger,
    ReportSink,
    StateReport,
    decline_report,
    input_ended_report,
    task_ref,
)
from weir.taskmanager.snapshots import TaskKeyedState, keyed_state_from_document
from weir.taskmanager.task import Task
from weir.taskmanager.task_types import ChainRestore, InheritedRestore, Restore, TaskAddress, TaskCallbacks
from weir.wire import common_pb2, jobmanager_pb2, taskmanager_pb2

log = structlog.get_logger("weir.taskmanager")

BACKPRESSURE_SAMPLE_S = 0.5
FAILURE_REPORT_WAIT_S: Final = 10.0
"""The longest a failed task waits for its report to reach the JobManager before its outputs close."""
REPORTED_STATES: Final = (TaskState.DEPLOYING, TaskState.RUNNING)  # a heartbeat carries these tasks
UNIX_ADDRESS_PREFIX: Final = "unix:"
"""A slot worker's data-plane address: a Unix socket only this host's processes reach."""


def key_rejected(rejections: RecordRejections, graph: LogicalGraph, edge: NetworkEdge) -> KeyRejected:
    """What a keyed edge's record writer does when the key selector raises: the keyed operator the
    edge feeds (its head) handles the record as its ``on_error`` says (default: fail)."""
    consumer = graph.transformations[edge.consumer_vertex]
    handling = consumer.on_error() if consumer.on_error is not None else FAIL
    return partial(rejections.reject, consumer.uid, handling, edge.key_selector)


def restore_of(addr: TaskAddress, req: taskmanager_pb2.DeployTaskRequest) -> Restore | None:
    """What a subtask restores from (None: fresh start): its own task-state document after a
    restart of its job, or the documents it inherits from another job's retained checkpoint."""
    if req.restore_state_handle and req.inherited_task_states:
        raise ProtocolError(f"task {addr}: a deployment may restore its own state or inherit another job's, not both")
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


def task_address(req: taskmanager_pb2.DeployTaskRequest) -> TaskAddress:
    return TaskAddress(req.task.job_id, req.task.vertex_uid, req.task.subtask, req.attempt)


def security_for(address: str, security: TransportSecurity) -> TransportSecurity:
    """How to reach ``address``: a slot worker's Unix socket is this host's own (no TLS: its name is
    no host a certificate could name; the token still goes along), anything else as configured."""
    if address.startswith(UNIX_ADDRESS_PREFIX):
        return security.without_tls()
    return security


class TaskHost:
    """The deployed tasks of one process; see the module.

    ``address``: what an output channel's ``consumer_address`` is when its consumer runs in this
    process (so it is connected in memory when ``local_channels``). ``owns_job_directories``: this
    host deletes a job's directory under ``jobs/`` once the job is over here and removes what earlier
    processes left at its start (a TaskManager running its own tasks); a slot worker shares the
    directory with the other workers, whose TaskManager owns it.
    """

    def __init__(
        self,
        taskmanager_id: str,
        address: str,
        taskmanager_dir: Path,
        reports: ReportSink,
        *,
        storage: CheckpointStorage,
        security: TransportSecurity,
        local_channels: bool = True,
        owns_job_directories: bool = True,
    ) -> None:
        self.id = taskmanager_id
        self.address = address
        self.local_channels = local_channels
        self._security = security
        self._owns_job_directories = owns_job_directories
        # Each keyed task attempt has its own RocksDB under jobs/<job>/; none survives a process start:
        # state of earlier runs comes back only through a restore.
        self._jobs_dir = taskmanager_dir / "jobs"
        if owns_job_directories:
            shutil.rmtree(self._jobs_dir, ignore_errors=True)
        self._storage = storage
        self._paths = CheckpointPaths()
        self.tasks: dict[TaskAddress, Task] = {}
        self._lock = threading.Condition()
        self._channels: dict[str, grpc.Channel] = {}
        self._jobs: dict[str, tuple[Any, JobPlan]] = {}
        self._artifact_files: dict[str, frozenset[str]] = {}  # artifact id -> its modules' file names
        self._stopping = threading.Event()
        # The server half of the channels into this process's tasks (their input gates).
        self.channels = ChannelServer(taskmanager_id)
        self.reports = reports
        self.acknowledger = CheckpointAcknowledger(self._storage, self._paths, reports, self._show_state_size)
        self._tasks_running = TASKS_RUNNING.labels(taskmanager_id)
        self._tasks_running.set(0)
        self._sampler = threading.Thread(target=self._sample_backpressure, name="backpressure-sampler", daemon=True)
        self._sampler.start()

    # Deployment -----------------------------------------------------------------------------------

    def _load(self, req: taskmanager_pb2.DeployTaskRequest) -> tuple[Any, JobPlan]:
        key = hashlib.sha256(
            (req.artifact_id.encode() or req.job_source)
            + repr(sorted(req.parameters.items())).encode()
            + str(req.parallelism).encode()
        ).hexdigest()
        cached = self._jobs.get(key)
        if cached is None:
            code: JobCode = SourceCode(req.job_file_name, req.job_source)
            if req.artifact_id:  # read by its hash from beside the job record, unpacked into the cache once
                data = self._storage.get_bytes(self._paths.job_artifact(JobId(req.task.job_id)))
                prepared = prepare_artifact(
                    data, expected_id=req.artifact_id, timeout_s=PythonJobSettings.from_env().job_load_timeout
                )
                # An exception raised through any of the job's modules is the user's (Failure.from_exception).
                self._artifact_files[req.artifact_id] = frozenset(str(p) for p in prepared.directory.rglob("*.py")) | {
                    prepared.manifest.entry_name
                }
                code = prepared
            loaded = load_job(code, dict(req.parameters), req.parallelism, req.job_name)
            cached = (loaded, build_plan(loaded.graph))
            self._jobs[key] = cached
        return cached

    def _grpc_channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = open_channel(address, security_for(address, self._security))
                self._channels[address] = channel
            return channel

    def deploy(self, req: taskmanager_pb2.DeployTaskRequest) -> None:
        addr = task_address(req)
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
            KafkaDeadLetters(dict(req.parameters)),
            log.bind(job_id=addr.job_id, task=addr.vertex_uid, subtask=addr.subtask, attempt=addr.attempt),
            metric_labels=(addr.job_id, req.job_name, self.id),
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
                    channels.append(LocalOutputChannel(header, cancelled, self.channels.attach_local))
                else:
                    channels.append(RemoteOutputChannel(self._grpc_channel(spec.consumer_address), header, cancelled))
            consumer = plan.vertices[edge.consumer_vertex]
            partitioner = create_partitioner(
                edge.partitioning,
                subtask=SubtaskIndex(req.task.subtask),
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
        restore = restore_of(addr, req)
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
                on_checkpoint=self.acknowledger.acknowledge,
                on_decline=self._on_decline,
                on_input_ended=self._on_input_ended,
            ),
            taskmanager_id=self.id,
            restore=restore,
            restore_checkpoint_id=req.restore_checkpoint_id,
            mode=checkpointing_mode_from_proto(req.checkpointing_mode),
            aligned_checkpoint_timeout_s=req.aligned_checkpoint_timeout_ms / 1000,
            user_code_files=frozenset({req.job_file_name}) | self._artifact_files.get(req.artifact_id, frozenset()),
            cancelled=cancelled,
            restore_storage=self._storage_at(req.restore_storage_uri),
            open_keyed_state=lambda: self._open_keyed_state(addr),
            rejections=rejections,
        )
        with self._lock:
            self.tasks[addr] = task
        if gate is not None:
            self.channels.register(addr, gate)
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

    def _storage_at(self, uri: str) -> CheckpointStorage:
        """The storage restored state is read from: this TaskManager's own, or the one at ``uri``."""
        if not uri or uri == self._storage.uri:
            return self._storage
        return open_storage(uri)

    def _open_keyed_state(self, addr: TaskAddress) -> TaskKeyedState:
        """The RocksDB of one task attempt: ``jobs/<job>/<vertex>-<subtask>-<attempt>``."""
        directory = self._jobs_dir / addr.job_id / f"{addr.vertex_uid}-{addr.subtask}-{addr.attempt}"
        return TaskKeyedState(directory, self._storage, self._paths, TaskManagerId(self.id))

    # Control from the JobManager --------------------------------------------------------------------

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
        if self._owns_job_directories:
            shutil.rmtree(self._jobs_dir / job_id, ignore_errors=True)
        forget_job_series(job_id)
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
            self._count_running_tasks()
        self.channels.forget_attempts(job_id, matches)

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
            CheckpointRequest(
                CheckpointId(req.checkpoint_id),
                req.timestamp,
                kind,
                req.final,
                req.drain,
                aligned=req.aligned,
                full=req.full,
            )
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

    # Reports, off the task threads -------------------------------------------------------------------

    def _on_task_state(self, addr: TaskAddress, state: TaskState, failure: Failure | None) -> None:
        with self._lock:
            task = self.tasks.get(addr)
            self._count_running_tasks()
        records_in = task.records_in if task is not None else 0
        records_out = task.records_emitted() if task is not None else 0
        request = jobmanager_pb2.ReportTaskStateRequest(
            task=task_ref(addr),
            state=task_state_to_proto(state),
            attempt=addr.attempt,
            records_in=records_in,
            records_out=records_out,
        )
        if failure is not None:
            request.failure.CopyFrom(failure_to_proto(failure))
        # A failed task's report goes first, its output channels close after: its consumers then lose
        # their input only once the JobManager knows why (else a consumer's "lost its producer" could
        # reach it first and stand as the job's failure). A bounded wait: an unreachable JobManager
        # must not hold the task's end.
        sent = threading.Event() if state is TaskState.FAILED else None
        self.reports.put(StateReport(request, sent))
        if state.terminal:
            self.channels.unregister(addr)
            with self._lock:
                finished = state is TaskState.FINISHED and all(
                    t.state is TaskState.FINISHED for a, t in self.tasks.items() if a.job_id == addr.job_id
                )
            if finished:  # the job's last task here finished: it has nothing more to do here
                threading.Thread(target=self._forget_finished, args=(addr.job_id,), daemon=True).start()
        if sent is not None and not sent.wait(FAILURE_REPORT_WAIT_S):
            log.warning(
                "task_failure_report_unconfirmed",
                job_id=addr.job_id,
                task=f"{addr.vertex_uid}#{addr.subtask}",
                attempt=addr.attempt,
                waited_s=FAILURE_REPORT_WAIT_S,
            )

    def _on_input_ended(self, addr: TaskAddress) -> None:
        self.reports.put(input_ended_report(addr))

    def _on_decline(self, addr: TaskAddress, checkpoint_id: int, reason: str) -> None:
        self.reports.put(decline_report(addr, checkpoint_id, reason))

    def _show_state_size(self) -> None:
        """After an acknowledgement: the size of every live database here (``weir_state_size_bytes``)."""
        with self._lock:
            databases = [t.keyed_state for t in self.tasks.values() if t.keyed_state is not None]
        STATE_SIZE_BYTES.labels(self.id).set(sum(d.live_sst_bytes() for d in databases))

    def _sample_backpressure(self) -> None:
        """A task blocked in a send for credit cannot update its own metrics: twice a second, move the
        time its channels have waited so far into weir_backpressured_seconds_total."""
        while not self._stopping.wait(BACKPRESSURE_SAMPLE_S):
            with self._lock:
                running = [t for t in self.tasks.values() if t.state is TaskState.RUNNING]
            for task in running:
                task.sync_backpressure()

    # Heartbeats ----------------------------------------------------------------------------------------

    def progress(self) -> list[jobmanager_pb2.TaskProgress]:
        """The heartbeat's entries: every deploying or running task's counters, its time shares since
        the last heartbeat and its input watermark."""
        with self._lock:
            tasks = [(a, t) for a, t in self.tasks.items() if t.state in REPORTED_STATES]
        entries = []
        for address, task in tasks:
            entry = jobmanager_pb2.TaskProgress(
                task=task_ref(address),
                attempt=address.attempt,
                records_in=task.records_in,
                records_out=task.records_emitted(),
            )
            set_task_load(entry, task.time_ratios(), task.time_totals(), task.input_watermark())
            entries.append(entry)
        return entries

    def stop(self) -> None:
        """Cancel every task, wait for them (5 s each at most), send what is still being acknowledged."""
        self._stopping.set()
        self.channels.stop()
        with self._lock:
            tasks = list(self.tasks.values())
            self._lock.notify_all()
        for t in tasks:
            t.cancel()
        for t in tasks:
            t.join(5)
        self.acknowledger.shutdown()  # acknowledgements still being stored are queued first
        with self._lock:
            keyed = [t.keyed_state for t in tasks if t.keyed_state is not None]
        for state in keyed:  # a task still running after its join: its database goes anyway
            state.discard()
