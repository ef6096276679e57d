"""The JobManager's gRPC servicer: thin. It converts requests into ``weir.jobmanager.messages`` values,
calls the ``JobManager``, converts the answers back and maps WeirError onto gRPC status codes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import status_pb2
from grpc_status import rpc_status

from weir.core.codec import (
    checkpoint_kind_to_proto,
    checkpoint_status_to_proto,
    failure_to_proto,
    job_status_to_proto,
    optional_failure_from_proto,
    optional_timeline_from_proto,
    task_ratios_from_proto,
    task_state_from_proto,
    task_state_to_proto,
    task_totals_from_proto,
    task_watermark_from_proto,
    timeline_to_proto,
)
from weir.core.errors import (
    JobDefinitionError,
    NotEnoughSlotsError,
    ServiceUnavailableError,
    StorageAuthenticationError,
    UnknownCheckpointError,
    UnknownJobError,
    WeirError,
)
from weir.core.hardware import Hardware
from weir.jobmanager.checkpointing.coordinator import CheckpointSummary
from weir.jobmanager.checkpointing.pending import StateObject, TaskAckMetrics
from weir.jobmanager.errors import JobManagerNotReadyError
from weir.jobmanager.manager import JobManager
from weir.jobmanager.messages import (
    CheckpointAck,
    CheckpointDecline,
    CheckpointDetailView,
    CheckpointsView,
    ClusterView,
    Heartbeat,
    HeartbeatAnswer,
    JobStatusView,
    JobSummaryView,
    TaskProgress,
    TaskStateReport,
)
from weir.jobmanager.registry import HEARTBEAT_INTERVAL_S
from weir.jobmanager.rescaling import RescaleOperation
from weir.jobmanager.submission import SubmitRequest
from weir.wire import common_pb2, jobmanager_pb2, jobmanager_pb2_grpc

_Answer = TypeVar("_Answer")

_STATUS_OF: dict[type[WeirError], grpc.StatusCode] = {
    UnknownJobError: grpc.StatusCode.NOT_FOUND,
    UnknownCheckpointError: grpc.StatusCode.NOT_FOUND,
    NotEnoughSlotsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    JobDefinitionError: grpc.StatusCode.INVALID_ARGUMENT,
    ServiceUnavailableError: grpc.StatusCode.FAILED_PRECONDITION,  # e.g. the job's input topic is missing
    StorageAuthenticationError: grpc.StatusCode.FAILED_PRECONDITION,  # a checkpoint object without the cluster's MAC
}


# What a NOT_FOUND names, in the status details (``ErrorDetail``): a client tells the cases apart by it.
_REASON_OF: dict[type[WeirError], jobmanager_pb2.ErrorReason] = {
    UnknownJobError: jobmanager_pb2.ERROR_REASON_UNKNOWN_JOB,
    UnknownCheckpointError: jobmanager_pb2.ERROR_REASON_UNKNOWN_CHECKPOINT,
    JobManagerNotReadyError: jobmanager_pb2.ERROR_REASON_NOT_READY,  # UNAVAILABLE, yet it answered
}


def _abort(context: grpc.ServicerContext, exc: WeirError) -> None:
    code = next((c for kind, c in _STATUS_OF.items() if isinstance(exc, kind)), None)
    if code is None:
        code = getattr(grpc.StatusCode, getattr(exc, "grpc_code", "INTERNAL"))
    reason = next((r for kind, r in _REASON_OF.items() if isinstance(exc, kind)), None)
    if reason is None:
        context.abort(code, str(exc))
    detail = any_pb2.Any()
    detail.Pack(jobmanager_pb2.ErrorDetail(reason=reason))
    status = status_pb2.Status(code=code.value[0], message=str(exc), details=[detail])
    context.abort_with_status(rpc_status.to_status(status))


# Requests into messages ----------------------------------------------------------------------------


def submit_request(m: jobmanager_pb2.SubmitJobRequest) -> SubmitRequest:
    return SubmitRequest(
        job_name=m.job_name,
        job_file_name=m.job_file_name,
        job_source=m.job_source,
        job_artifact=m.job_artifact,
        parameters=dict(m.parameters),
        parallelism=m.parallelism,
        from_checkpoint=m.from_checkpoint,
        allow_non_restored_state=m.allow_non_restored_state,
    )


def heartbeat_from_proto(m: jobmanager_pb2.HeartbeatRequest) -> Heartbeat:
    return Heartbeat(
        taskmanager_id=m.taskmanager_id,
        running_tasks=tuple(
            TaskProgress(
                p.task.job_id,
                p.task.vertex_uid,
                p.task.subtask,
                p.attempt,
                p.records_in,
                p.records_out,
                ratios=task_ratios_from_proto(p),
                watermark=task_watermark_from_proto(p),
                totals=task_totals_from_proto(p),
            )
            for p in m.running_tasks
        ),
    )


def heartbeat_answer_to_proto(answer: HeartbeatAnswer) -> jobmanager_pb2.HeartbeatResponse:
    return jobmanager_pb2.HeartbeatResponse(
        reregister=answer.reregister,
        cancel=[common_pb2.JobAttempt(job_id=c.job_id, attempt=c.attempt) for c in answer.cancel],
    )


def task_state_report(m: jobmanager_pb2.ReportTaskStateRequest) -> TaskStateReport:
    return TaskStateReport(
        job_id=m.task.job_id,
        vertex_uid=m.task.vertex_uid,
        subtask=m.task.subtask,
        attempt=m.attempt,
        state=task_state_from_proto(m.state),
        failure=optional_failure_from_proto(m, "failure"),
        records_in=m.records_in,
        records_out=m.records_out,
        input_ended=m.input_ended,
    )


def checkpoint_ack(m: jobmanager_pb2.AcknowledgeCheckpointRequest) -> CheckpointAck:
    return CheckpointAck(
        job_id=m.task.job_id,
        vertex_uid=m.task.vertex_uid,
        subtask=m.task.subtask,
        attempt=m.attempt,
        checkpoint_id=m.checkpoint_id,
        objects=tuple(StateObject(o.key, o.size_bytes, o.reused) for o in m.objects),
        inline_payload=m.state_handle,
        metrics=TaskAckMetrics(
            alignment_duration_s=m.alignment_duration_s,
            start_delay_s=m.start_delay_s,
            state_size_bytes=m.state_size_bytes,
            sync_duration_s=m.sync_duration_s,
            async_duration_s=m.async_duration_s,
            unaligned=m.unaligned,
            inflight_bytes=m.inflight_bytes,
            timeline=optional_timeline_from_proto(m, "timeline"),
        ),
    )


def checkpoint_decline(m: jobmanager_pb2.DeclineCheckpointRequest) -> CheckpointDecline:
    return CheckpointDecline(
        job_id=m.task.job_id,
        vertex_uid=m.task.vertex_uid,
        subtask=m.task.subtask,
        attempt=m.attempt,
        checkpoint_id=m.checkpoint_id,
        reason=m.reason,
    )


# Answers into responses ----------------------------------------------------------------------------


def summary_to_proto(view: JobSummaryView) -> jobmanager_pb2.JobSummary:
    return jobmanager_pb2.JobSummary(
        job_id=view.job_id,
        job_name=view.job_name,
        status=job_status_to_proto(view.status),
        submitted_at=view.submitted_at,
        parallelism=view.parallelism,
        restarts=view.restarts,
    )


def job_status_response(view: JobStatusView) -> jobmanager_pb2.GetJobStatusResponse:
    response = jobmanager_pb2.GetJobStatusResponse(
        summary=summary_to_proto(view.summary),
        last_completed_checkpoint=view.last_completed_checkpoint,
        last_restore_at=view.last_restore_at,
    )
    if view.failure is not None:
        response.failure.CopyFrom(failure_to_proto(view.failure))
    if view.end is not None:
        end = view.end
        response.end.CopyFrom(
            jobmanager_pb2.JobEnd(
                outcome=job_status_to_proto(end.outcome),
                ended=end.ended,
                at=end.at,
                nothing_to_resolve=end.nothing_to_resolve,
                resolution_decided=end.resolution_decided,
                as_of_checkpoint=end.as_of_checkpoint,
                attempts=end.attempts,
                resolved=end.resolved,
                error=end.error,
                retry_at=end.retry_at,
            )
        )
    for t in view.tasks:
        task = response.tasks.add(
            task=common_pb2.TaskRef(job_id=view.summary.job_id, vertex_uid=t.vertex_uid, subtask=t.subtask),
            operator_names=t.operator_names,
            state=task_state_to_proto(t.state) if t.state is not None else common_pb2.TASK_STATE_UNSPECIFIED,
            taskmanager_id=t.taskmanager_id,
            records_in=t.records_in,
            records_out=t.records_out,
            records_in_all_attempts=t.records_in_all_attempts,
        )
        if t.failure is not None:
            task.failure.CopyFrom(failure_to_proto(t.failure))
    return response


def _checkpoint_to_proto(
    job_id: str,
    summary: CheckpointSummary,
    external_path: str | None,
    info: jobmanager_pb2.CheckpointInfo,
    *,
    timelines: bool = False,
) -> None:
    """``timelines``: with each task's timeline (a checkpoint's detail; the list leaves them out)."""
    info.checkpoint_id = summary.checkpoint_id
    info.status = checkpoint_status_to_proto(summary.status)
    info.trigger_time = summary.trigger_timestamp
    info.duration_s = summary.duration_s or 0.0
    info.size_bytes = summary.state_size_bytes
    info.failure = summary.failure.message if summary.failure is not None else ""
    info.kind = checkpoint_kind_to_proto(summary.kind)
    info.full = summary.full
    info.external_path = external_path or ""
    for t in summary.tasks:
        task = info.tasks.add(
            task=common_pb2.TaskRef(job_id=job_id, vertex_uid=t.task_id.operator_uid, subtask=t.task_id.subtask),
            alignment_duration_s=t.alignment_duration_s,
            start_delay_s=t.start_delay_s,
            state_size_bytes=t.state_size_bytes,
            unaligned=t.unaligned,
            inflight_bytes=t.inflight_bytes,
            sync_duration_s=t.sync_duration_s,
            async_duration_s=t.async_duration_s,
        )
        if t.acked_at is not None:
            task.acked_at = t.acked_at
        if timelines and t.timeline is not None:
            task.timeline.CopyFrom(timeline_to_proto(t.timeline))


def checkpoints_response(view: CheckpointsView) -> jobmanager_pb2.ListCheckpointsResponse:
    response = jobmanager_pb2.ListCheckpointsResponse()
    for summary in view.checkpoints:
        external = view.external_paths.get(summary.checkpoint_id)
        _checkpoint_to_proto(view.job_id, summary, external, response.checkpoints.add())
    return response


def checkpoint_detail_response(view: CheckpointDetailView) -> jobmanager_pb2.GetCheckpointDetailResponse:
    response = jobmanager_pb2.GetCheckpointDetailResponse(
        pending_tasks=[
            common_pb2.TaskRef(job_id=view.job_id, vertex_uid=t.operator_uid, subtask=t.subtask)
            for t in view.checkpoint.pending_tasks
        ]
    )
    _checkpoint_to_proto(view.job_id, view.checkpoint, view.external_path, response.checkpoint, timelines=True)
    return response


def rescale_status_response(op: RescaleOperation) -> jobmanager_pb2.GetRescaleStatusResponse:
    return jobmanager_pb2.GetRescaleStatusResponse(
        trigger_id=op.trigger_id,
        phase=op.phase.value,
        from_parallelism=op.from_parallelism,
        to_parallelism=op.to_parallelism,
        checkpoint_id=op.checkpoint_id or 0,
        failure=op.failure,
        requested_at=op.requested_at,
        finished_at=op.finished_at or 0.0,
    )


def cluster_response(view: ClusterView) -> jobmanager_pb2.GetClusterStatusResponse:
    return jobmanager_pb2.GetClusterStatusResponse(
        taskmanagers=[
            jobmanager_pb2.TaskManagerInfo(
                taskmanager_id=tm.taskmanager_id,
                address=tm.address,
                slots_total=tm.slots_total,
                slots_free=tm.slots_free,
                last_heartbeat_age_s=tm.last_heartbeat_age_s,
                alive=tm.alive,
            )
            for tm in view.taskmanagers
        ]
    )


class JobManagerServicer(jobmanager_pb2_grpc.JobManagerServiceServicer):
    """Thin: translate requests, call JobManager, map WeirError onto gRPC status codes."""

    def __init__(self, jm: JobManager) -> None:
        self._jm = jm

    def _call(self, context: grpc.ServicerContext, fn: Callable[[], _Answer]) -> _Answer:
        try:
            return fn()
        except WeirError as exc:
            _abort(context, exc)
            raise  # context.abort raises; never reached

    def SubmitJob(  # noqa: N802
        self, request: jobmanager_pb2.SubmitJobRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.SubmitJobResponse:
        job_id = self._call(context, lambda: self._jm.submit(submit_request(request)))
        return jobmanager_pb2.SubmitJobResponse(job_id=job_id)

    def ListJobs(  # noqa: N802
        self, request: jobmanager_pb2.ListJobsRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.ListJobsResponse:
        return jobmanager_pb2.ListJobsResponse(jobs=[summary_to_proto(s) for s in self._jm.list_jobs()])

    def GetJobStatus(  # noqa: N802
        self, request: jobmanager_pb2.GetJobStatusRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.GetJobStatusResponse:
        return job_status_response(self._call(context, lambda: self._jm.job_status(request.job_id)))

    def CancelJob(  # noqa: N802
        self, request: jobmanager_pb2.CancelJobRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.CancelJobResponse:
        status = self._call(context, lambda: self._jm.cancel(request.job_id))
        return jobmanager_pb2.CancelJobResponse(status=job_status_to_proto(status))

    def TriggerSavepoint(  # noqa: N802
        self, request: jobmanager_pb2.TriggerSavepointRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.TriggerSavepointResponse:
        savepoint_id = self._call(
            context,
            lambda: self._jm.trigger_savepoint(
                request.job_id, request.target_directory, stop=request.stop, drain=request.drain
            ),
        )
        return jobmanager_pb2.TriggerSavepointResponse(savepoint_id=savepoint_id)

    def TriggerJobCheckpoint(  # noqa: N802
        self, request: jobmanager_pb2.TriggerJobCheckpointRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.TriggerJobCheckpointResponse:
        checkpoint_id = self._call(context, lambda: self._jm.trigger_checkpoint(request.job_id, full=request.full))
        return jobmanager_pb2.TriggerJobCheckpointResponse(checkpoint_id=checkpoint_id)

    def RescaleJob(  # noqa: N802
        self, request: jobmanager_pb2.RescaleJobRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.RescaleJobResponse:
        trigger_id = self._call(context, lambda: self._jm.rescale(request.job_id, request.parallelism))
        return jobmanager_pb2.RescaleJobResponse(trigger_id=trigger_id)

    def GetRescaleStatus(  # noqa: N802
        self, request: jobmanager_pb2.GetRescaleStatusRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.GetRescaleStatusResponse:
        return rescale_status_response(
            self._call(context, lambda: self._jm.rescale_status(request.job_id, request.trigger_id))
        )

    def ListCheckpoints(  # noqa: N802
        self, request: jobmanager_pb2.ListCheckpointsRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.ListCheckpointsResponse:
        return checkpoints_response(self._call(context, lambda: self._jm.list_checkpoints(request.job_id)))

    def GetCheckpointDetail(  # noqa: N802
        self, request: jobmanager_pb2.GetCheckpointDetailRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.GetCheckpointDetailResponse:
        return checkpoint_detail_response(
            self._call(context, lambda: self._jm.checkpoint_detail(request.job_id, request.checkpoint_id))
        )

    def GetClusterStatus(  # noqa: N802
        self, request: jobmanager_pb2.GetClusterStatusRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.GetClusterStatusResponse:
        return cluster_response(self._jm.cluster_status())

    def RegisterTaskManager(  # noqa: N802
        self, request: jobmanager_pb2.RegisterTaskManagerRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.RegisterTaskManagerResponse:
        hardware = (
            Hardware(request.cpu_cores, request.physical_memory_bytes) if request.cpu_cores > 0 else None
        )  # None: an older TaskManager, which does not report it
        self._jm.register_taskmanager(
            request.taskmanager_id,
            request.address,
            request.slots,
            request.metrics_port,
            request.incarnation,
            hardware=hardware,
        )
        return jobmanager_pb2.RegisterTaskManagerResponse(heartbeat_interval_s=HEARTBEAT_INTERVAL_S)

    def Heartbeat(  # noqa: N802
        self, request: jobmanager_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.HeartbeatResponse:
        return heartbeat_answer_to_proto(self._jm.heartbeat(heartbeat_from_proto(request)))

    def ReportTaskState(  # noqa: N802
        self, request: jobmanager_pb2.ReportTaskStateRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.ReportTaskStateResponse:
        self._call(context, lambda: self._jm.report_task_state(task_state_report(request)))
        return jobmanager_pb2.ReportTaskStateResponse()

    def AcknowledgeCheckpoint(  # noqa: N802
        self, request: jobmanager_pb2.AcknowledgeCheckpointRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.AcknowledgeCheckpointResponse:
        self._call(context, lambda: self._jm.acknowledge_checkpoint(checkpoint_ack(request)))
        return jobmanager_pb2.AcknowledgeCheckpointResponse()

    def DeclineCheckpoint(  # noqa: N802
        self, request: jobmanager_pb2.DeclineCheckpointRequest, context: grpc.ServicerContext
    ) -> jobmanager_pb2.DeclineCheckpointResponse:
        self._call(context, lambda: self._jm.decline_checkpoint(checkpoint_decline(request)))
        return jobmanager_pb2.DeclineCheckpointResponse()


SERVICE = jobmanager_pb2.DESCRIPTOR.services_by_name["JobManagerService"].full_name
NOT_LEADER_MESSAGE = "this JobManager is not the leader (deposed): call another of WEIR_JOBMANAGER_ADDRESSES"


class LeaderOnlyInterceptor(grpc.ServerInterceptor):
    """While this JobManager does not lead (its lease time is over, before the process starts over as
    a standby), every JobManagerService call ends UNAVAILABLE, as from a JobManager that is down: the
    TaskManagers and clients move on to the next address (``weir.core.leader_link``). Health checks
    still answer."""

    def __init__(self, leads: Callable[[], bool]) -> None:
        self._leads = leads

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(details)
        if handler is None or self._leads() or not details.method.startswith(f"/{SERVICE}/"):
            return handler

        def refuse(_request: object, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNAVAILABLE, NOT_LEADER_MESSAGE)

        return grpc.unary_unary_rpc_method_handler(
            refuse, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )
