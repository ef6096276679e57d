"""The TaskManager's gRPC servicer: thin, everything is delegated to TaskManagerRuntime."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

from weir.core.errors import JobDefinitionError, ProtocolError, WeirError
from weir.core.log_files import LogFiles, LogSelector, process_log_files, read_chunks
from weir.core.transport import LEADER_TERM_METADATA
from weir.taskmanager.leader_fence import LeaderTermFence, StaleLeaderError, term_of
from weir.taskmanager.runtime import TaskManagerRuntime
from weir.taskmanager.slot_link import SlotWorkerError
from weir.wire import taskmanager_pb2, taskmanager_pb2_grpc

_LOG_SELECTORS: dict[int, LogSelector] = {
    taskmanager_pb2.LOG_SELECTOR_LOG: LogSelector.LOG,
    taskmanager_pb2.LOG_SELECTOR_STDOUT: LogSelector.STDOUT,
    taskmanager_pb2.LOG_SELECTOR_NAMED: LogSelector.NAMED,
}


class TaskManagerServicer(taskmanager_pb2_grpc.TaskManagerServiceServicer):
    def __init__(
        self,
        runtime: TaskManagerRuntime,
        fence: LeaderTermFence | None = None,
        log_files: Callable[[], LogFiles] = process_log_files,
    ) -> None:
        """``log_files``: where this process's standard error and output are written (ListLogs)."""
        self._runtime = runtime
        self._fence = fence if fence is not None else LeaderTermFence()
        self._log_files = log_files

    def _admit(self, context: grpc.ServicerContext, what: str) -> None:
        """Refuse (FAILED_PRECONDITION) a call from a deposed JobManager: ``weir.taskmanager.leader_fence``."""
        try:
            self._fence.admit(term_of(context.invocation_metadata(), LEADER_TERM_METADATA), what)
        except StaleLeaderError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    def DeployTask(
        self, request: taskmanager_pb2.DeployTaskRequest, context: grpc.ServicerContext
    ) -> taskmanager_pb2.DeployTaskResponse:  # noqa: N802,E501
        self._admit(context, "deploy of job " + request.task.job_id)
        try:
            self._runtime.deploy(request)
        except JobDefinitionError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except ProtocolError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except SlotWorkerError as exc:  # its message names the error the worker raised
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except WeirError as exc:  # e.g. a restore handle that cannot be read: said, not UNKNOWN
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{type(exc).__name__}: {exc}")
        return taskmanager_pb2.DeployTaskResponse()

    def CancelJobTasks(
        self, request: taskmanager_pb2.CancelJobTasksRequest, context: grpc.ServicerContext
    ) -> taskmanager_pb2.CancelJobTasksResponse:  # noqa: N802,E501
        self._admit(context, "cancel of job " + request.job_id)
        self._runtime.cancel_attempts_through(request.job_id, request.attempt, job_ended=request.job_ended)
        return taskmanager_pb2.CancelJobTasksResponse()

    def TriggerCheckpoint(
        self, request: taskmanager_pb2.TriggerCheckpointRequest, context: grpc.ServicerContext
    ) -> taskmanager_pb2.TriggerCheckpointResponse:  # noqa: N802,E501
        self._admit(context, "trigger checkpoint of job " + request.task.job_id)
        return taskmanager_pb2.TriggerCheckpointResponse(accepted=self._runtime.trigger_checkpoint(request))

    def NotifyCheckpointComplete(
        self, request: taskmanager_pb2.NotifyCheckpointCompleteRequest, context: grpc.ServicerContext
    ) -> taskmanager_pb2.NotifyCheckpointCompleteResponse:  # noqa: N802,E501
        self._admit(context, "notify checkpoint complete of job " + request.job_id)
        self._runtime.notify_checkpoint(request.job_id, request.attempt, request.checkpoint_id, complete=True)
        return taskmanager_pb2.NotifyCheckpointCompleteResponse()

    def NotifyCheckpointAborted(
        self, request: taskmanager_pb2.NotifyCheckpointAbortedRequest, context: grpc.ServicerContext
    ) -> taskmanager_pb2.NotifyCheckpointAbortedResponse:  # noqa: N802,E501
        self._admit(context, "notify checkpoint aborted of job " + request.job_id)
        self._runtime.notify_checkpoint(request.job_id, request.attempt, request.checkpoint_id, complete=False)
        return taskmanager_pb2.NotifyCheckpointAbortedResponse()

    def ThreadDump(
        self, request: taskmanager_pb2.ThreadDumpRequest, context: grpc.ServicerContext
    ) -> taskmanager_pb2.ThreadDumpResponse:  # noqa: N802,E501
        """Read-only: answered to any caller with the internal role, fenced or not."""
        threads = self._runtime.thread_dump()
        return taskmanager_pb2.ThreadDumpResponse(
            threads=[taskmanager_pb2.ThreadInfo(name=t.name, stack=t.stack) for t in threads]
        )

    def ListLogs(
        self, request: taskmanager_pb2.ListLogsRequest, context: grpc.ServicerContext
    ) -> taskmanager_pb2.ListLogsResponse:  # noqa: N802,E501
        """Read-only, as ThreadDump: the files this process's standard error and output go to."""
        return taskmanager_pb2.ListLogsResponse(
            logs=[
                taskmanager_pb2.LogFile(name=f.name, size=f.size, mtime_ms=int(f.mtime_s * 1000))
                for f in self._log_files().infos()
            ]
        )

    def ReadLog(
        self, request: taskmanager_pb2.ReadLogRequest, context: grpc.ServicerContext
    ) -> Iterator[taskmanager_pb2.LogChunk]:  # noqa: N802,E501
        """One of the files ListLogs lists, in chunks; NOT_FOUND for any other."""
        selector = _LOG_SELECTORS.get(request.selector)
        path = None if selector is None else self._log_files().selected(selector, request.name)
        if path is None or not path.is_file():
            what = f"log file {request.name!r}" if selector is LogSelector.NAMED else "such log file"
            context.abort(grpc.StatusCode.NOT_FOUND, f"the TaskManager has no {what}: it logs to a terminal or a pipe")
            return
        try:
            for chunk in read_chunks(path):
                yield taskmanager_pb2.LogChunk(data=chunk)
        except OSError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, f"the TaskManager's log {path.name} cannot be read: {exc}")

    def OpenChannel(
        self, request_iterator: Iterator[taskmanager_pb2.DataMessage], context: grpc.ServicerContext
    ) -> Iterator[taskmanager_pb2.CreditMessage]:  # noqa: N802,E501
        return self._runtime.channels.open_channel(request_iterator)


class _Handlers:
    """Stands in for a server to take the method handlers the generated code registers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service, self.handlers = service, dict(handlers)


def add_to_server(runtime: TaskManagerRuntime, server: grpc.Server) -> None:
    """Serve the TaskManager's service. With slot processes, ``OpenChannel`` takes and answers raw
    bytes: the stream is relayed to the consumer's worker without decoding its buffers."""
    servicer = TaskManagerServicer(runtime)
    slots = runtime.slot_processes
    if slots is None:
        taskmanager_pb2_grpc.add_TaskManagerServiceServicer_to_server(servicer, server)
        return
    taken = _Handlers()
    taskmanager_pb2_grpc.add_TaskManagerServiceServicer_to_server(servicer, taken)
    taken.handlers["OpenChannel"] = grpc.stream_stream_rpc_method_handler(slots.open_channel)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(taken.service, taken.handlers),))
    server.add_registered_method_handlers(taken.service, taken.handlers)
