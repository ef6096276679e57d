"""The JobManager's calls to TaskManagers: one interface, one gRPC adapter.

``TaskManagerGateway`` is what the deployer, the fail-over and the checkpoint-action executor call;
``GrpcTaskManagerGateway`` is the only place besides the codec that builds ``taskmanager_pb2``
requests. Every failed call raises ``TaskManagerCallError``; no ``grpc`` type leaves this module.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final, Protocol, TypeVar

import grpc

from weir.core.checkpointing import CheckpointKind
from weir.core.codec import checkpoint_kind_to_proto, checkpointing_mode_to_proto
from weir.core.grpc_security import open_channel
from weir.core.ids import TaskId
from weir.core.log_files import LogFileInfo, LogSelector
from weir.core.thread_dump import ThreadInfo
from weir.core.transport import LEADER_TERM_METADATA
from weir.core.transport_security import TransportSecurity
from weir.jobmanager.errors import TaskManagerCallError
from weir.jobmanager.jobs import TaskDeployment
from weir.jobmanager.leader_election import NO_TERM, LeaderTerm
from weir.wire import common_pb2, taskmanager_pb2, taskmanager_pb2_grpc

DEPLOY_TIMEOUT_S: Final = 30.0
CANCEL_TIMEOUT_S: Final = 15.0
THREAD_DUMP_TIMEOUT_S: Final = 10.0
LOG_CALL_TIMEOUT_S: Final = 60.0  # a log file read whole, in chunks, within it
CHECKPOINT_CALL_TIMEOUT_S: Final = 10.0

_Response = TypeVar("_Response")
_Response_co = TypeVar("_Response_co", covariant=True)


class TaskManagerGateway(Protocol):
    """The TaskManagers as the JobManager calls them, by address."""

    def connect(self, address: str) -> None:
        """A TaskManager (re-)registered at ``address``: open a new connection to it."""

    def reachable(self, address: str, timeout_s: float) -> bool:
        """Whether a server accepts connections at ``address`` (answers within ``timeout_s``)."""

    def deploy_task(self, address: str, deployment: TaskDeployment) -> None: ...

    def cancel_job_tasks(self, address: str, job_id: str, attempt: int, *, job_ended: bool) -> None: ...

    def trigger_checkpoint(
        self,
        address: str,
        task: TaskId,
        attempt: int,
        checkpoint_id: int,
        timestamp: float,
        kind: CheckpointKind,
        *,
        final: bool,
        drain: bool = False,
        aligned: bool = False,
        full: bool = False,
    ) -> bool:
        """Ask a source task to inject a barrier (after the end of event time with ``drain``; forced
        aligned in every mode with ``aligned``); answers whether it accepted."""

    def notify_checkpoint_complete(self, address: str, job_id: str, attempt: int, checkpoint_id: int) -> None: ...

    def thread_dump(self, address: str) -> tuple[ThreadInfo, ...]:
        """The TaskManager's threads (its process's and its slot workers')."""
        ...

    def list_logs(self, address: str) -> tuple[LogFileInfo, ...]:
        """The TaskManager's log files (its standard error and output, when they are files)."""
        ...

    def read_log(self, address: str, selector: LogSelector, name: str = "") -> Iterator[bytes]:
        """One of them, in chunks (TaskManagerCallError NOT_FOUND before any chunk when it has none)."""
        ...

    def notify_checkpoint_aborted(
        self, address: str, job_id: str, attempt: int, checkpoint_id: int, reason: str
    ) -> None: ...


def channel_connects(channel: grpc.Channel, timeout_s: float) -> bool:
    """Whether the channel's server accepts a connection: True once READY, False as soon as the
    attempt fails (a refused connection: the process is gone) or after ``timeout_s`` (no answer)."""
    outcome: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def on_state(state: grpc.ChannelConnectivity) -> None:
        if state is grpc.ChannelConnectivity.READY:
            outcome.put(True)
        elif state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN):
            outcome.put(False)

    channel.subscribe(on_state, try_to_connect=True)
    try:
        return outcome.get(timeout=timeout_s)
    except queue.Empty:
        return False
    finally:
        channel.unsubscribe(on_state)


def deploy_request(deployment: TaskDeployment) -> taskmanager_pb2.DeployTaskRequest:
    d = deployment
    request = taskmanager_pb2.DeployTaskRequest(
        task=common_pb2.TaskRef(job_id=d.job_id, vertex_uid=d.vertex_uid, subtask=d.subtask),
        attempt=d.attempt,
        job_name=d.job_name,
        job_source=d.job_source,
        job_file_name=d.job_file_name,
        artifact_id=d.artifact_id,
        parameters=dict(d.parameters),
        parallelism=d.parallelism,
        restore_state_handle=d.restore_state_handle,
        restore_checkpoint_id=d.restore_checkpoint_id,
        inherited_task_states=list(d.inherited_task_states),
        restore_storage_uri=d.restore_storage_uri,
        checkpointing_mode=checkpointing_mode_to_proto(d.checkpointing_mode),
        buffer_timeout_ms=d.buffer_timeout_ms,
        aligned_checkpoint_timeout_ms=d.aligned_checkpoint_timeout_ms,
    )
    for i in d.inputs:
        request.inputs.add(
            gate=i.gate,
            channel=i.channel,
            producer=common_pb2.TaskRef(job_id=d.job_id, vertex_uid=i.producer_vertex, subtask=i.producer_subtask),
        )
    for o in d.outputs:
        request.outputs.add(
            output=o.output,
            channel=o.channel,
            consumer=common_pb2.TaskRef(job_id=d.job_id, vertex_uid=o.consumer_vertex, subtask=o.consumer_subtask),
            consumer_address=o.consumer_address,
            consumer_channel=o.consumer_channel,
        )
    return request


class GrpcTaskManagerGateway:
    """One channel per registered TaskManager address, opened anew at each registration; an address
    nobody registered gets a channel of its own per call."""

    def __init__(
        self, security: TransportSecurity | None = None, term: Callable[[], LeaderTerm | None] | None = None
    ) -> None:
        """``security``: how to reach the TaskManagers (default: from the environment). ``term``: the
        leader term to send with every call, None once this JobManager must not act (the call is
        then not made); default: ``NO_TERM`` (no high availability)."""
        self._security = security if security is not None else TransportSecurity.from_env()
        self._term = term if term is not None else lambda: NO_TERM
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def connect(self, address: str) -> None:
        channel = open_channel(address, self._security)
        with self._lock:
            self._channels[address] = channel

    def reachable(self, address: str, timeout_s: float) -> bool:
        return channel_connects(self._channel(address), timeout_s)

    def deploy_task(self, address: str, deployment: TaskDeployment) -> None:
        self._call(address, lambda stub: stub.DeployTask(deploy_request(deployment), timeout=DEPLOY_TIMEOUT_S))

    def cancel_job_tasks(self, address: str, job_id: str, attempt: int, *, job_ended: bool) -> None:
        request = taskmanager_pb2.CancelJobTasksRequest(job_id=job_id, attempt=attempt, job_ended=job_ended)
        self._call(address, lambda stub: stub.CancelJobTasks(request, timeout=CANCEL_TIMEOUT_S))

    def trigger_checkpoint(
        self,
        address: str,
        task: TaskId,
        attempt: int,
        checkpoint_id: int,
        timestamp: float,
        kind: CheckpointKind,
        *,
        final: bool,
        drain: bool = False,
        aligned: bool = False,
        full: bool = False,
    ) -> bool:
        request = taskmanager_pb2.TriggerCheckpointRequest(
            task=common_pb2.TaskRef(job_id=task.job_id, vertex_uid=task.operator_uid, subtask=task.subtask),
            attempt=attempt,
            checkpoint_id=checkpoint_id,
            timestamp=timestamp,
            kind=checkpoint_kind_to_proto(kind),
            final=final,
            drain=drain,
            aligned=aligned,
            full=full,
        )
        response = self._call(address, lambda stub: stub.TriggerCheckpoint(request, timeout=CHECKPOINT_CALL_TIMEOUT_S))
        return bool(response.accepted)

    def notify_checkpoint_complete(self, address: str, job_id: str, attempt: int, checkpoint_id: int) -> None:
        request = taskmanager_pb2.NotifyCheckpointCompleteRequest(
            job_id=job_id, attempt=attempt, checkpoint_id=checkpoint_id
        )
        self._call(address, lambda stub: stub.NotifyCheckpointComplete(request, timeout=CHECKPOINT_CALL_TIMEOUT_S))

    def notify_checkpoint_aborted(
        self, address: str, job_id: str, attempt: int, checkpoint_id: int, reason: str
    ) -> None:
        request = taskmanager_pb2.NotifyCheckpointAbortedRequest(
            job_id=job_id, attempt=attempt, checkpoint_id=checkpoint_id, reason=reason
        )
        self._call(address, lambda stub: stub.NotifyCheckpointAborted(request, timeout=CHECKPOINT_CALL_TIMEOUT_S))

    def list_logs(self, address: str) -> tuple[LogFileInfo, ...]:
        response = self._call(
            address, lambda stub: stub.ListLogs(taskmanager_pb2.ListLogsRequest(), timeout=LOG_CALL_TIMEOUT_S)
        )
        return tuple(LogFileInfo(f.name, f.size, f.mtime_ms / 1000) for f in response.logs)

    def read_log(self, address: str, selector: LogSelector, name: str = "") -> Iterator[bytes]:
        request = taskmanager_pb2.ReadLogRequest(selector=_LOG_SELECTOR_OF[selector], name=name)
        stream = self._call(address, lambda stub: stub.ReadLog(request, timeout=LOG_CALL_TIMEOUT_S))
        first = self._call(address, lambda _stub: next(stream, None))  # NOT_FOUND is raised here, before any byte
        return self._chunks(address, stream, first)

    def _chunks(self, address: str, stream: Any, first: Any) -> Iterator[bytes]:
        chunk = first
        while chunk is not None:
            yield chunk.data
            chunk = self._call(address, lambda _stub: next(stream, None))

    def thread_dump(self, address: str) -> tuple[ThreadInfo, ...]:
        request = taskmanager_pb2.ThreadDumpRequest()
        response = self._call(address, lambda stub: stub.ThreadDump(request, timeout=THREAD_DUMP_TIMEOUT_S))
        return tuple(ThreadInfo(t.name, t.stack) for t in response.threads)

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
        return channel if channel is not None else open_channel(address, self._security)

    def _call(self, address: str, call: _StubCall[_Response]) -> _Response:
        term = self._term()
        if term is None:  # deposed, or its lease time is over: it must not act
            raise TaskManagerCallError(address, "FAILED_PRECONDITION", "this JobManager is not the leader")
        stub = _FencedStub(taskmanager_pb2_grpc.TaskManagerServiceStub(self._channel(address)), term)
        try:
            return call(stub)  # type: ignore[arg-type]
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise TaskManagerCallError(address, code.name, details or "") from None


_LOG_SELECTOR_OF: Final = {
    LogSelector.LOG: taskmanager_pb2.LOG_SELECTOR_LOG,
    LogSelector.STDOUT: taskmanager_pb2.LOG_SELECTOR_STDOUT,
    LogSelector.NAMED: taskmanager_pb2.LOG_SELECTOR_NAMED,
}


class _FencedStub:
    """The stub with the leader term in every call's metadata (each call site stays as it is)."""

    def __init__(self, stub: taskmanager_pb2_grpc.TaskManagerServiceStub, term: LeaderTerm) -> None:
        self._stub = stub
        self._metadata = ((LEADER_TERM_METADATA, str(term)),)

    def __getattr__(self, name: str) -> Callable[..., object]:
        method = getattr(self._stub, name)
        return lambda request, **kwargs: method(request, metadata=self._metadata, **kwargs)


class _StubCall(Protocol[_Response_co]):
    def __call__(self, stub: taskmanager_pb2_grpc.TaskManagerServiceStub, /) -> _Response_co: ...
