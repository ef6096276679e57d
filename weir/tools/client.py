"""The JobManager client: the only module outside the JobManager that touches its gRPC types.

Every call answers plain frozen dataclasses and raises a :class:`~weir.core.errors.WeirError` subclass
with a one-line message; no ``_pb2`` object and no ``grpc.RpcError`` leaves this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, TypeVar

import grpc
from google.protobuf import any_pb2
from grpc_status import rpc_status

from weir.api.artifacts import JobArtifact
from weir.core.checkpointing import CheckpointKind, CheckpointStatus, SubtaskCheckpointTimeline
from weir.core.codec import (
    checkpoint_kind_from_proto,
    checkpoint_status_from_proto,
    job_status_from_proto,
    optional_failure_from_proto,
    optional_timeline_from_proto,
    task_state_from_proto,
)
from weir.core.errors import (
    AuthenticationError,
    ClusterUnavailableError,
    Fault,
    JobDefinitionError,
    JobManagerRequestError,
    NotEnoughSlotsError,
    PermissionDeniedError,
    UnknownCheckpointError,
    UnknownJobError,
    WeirError,
)
from weir.core.failures import Failure
from weir.core.grpc_security import open_channel
from weir.core.ids import CheckpointId, JobId, OperatorUid, SubtaskIndex, TaskManagerId
from weir.core.leader_link import LeaderLink
from weir.core.states import JobStatus, TaskState
from weir.core.transport_security import TransportSecurity
from weir.wire import common_pb2, jobmanager_pb2, jobmanager_pb2_grpc

CALL_TIMEOUT_S: Final = 10.0
SUBMIT_TIMEOUT_S: Final = 60.0
SAVEPOINT_POLL_S: Final = 0.2


class SavepointFailedError(WeirError):
    """A savepoint was triggered but did not complete (the job keeps running)."""

    fault: Fault = Fault.EXTERNAL


class RescaleFailedError(WeirError):
    """A rescale was accepted but did not complete (its checkpoint failed, or the job ended)."""

    fault: Fault = Fault.EXTERNAL


class CheckpointFailedError(WeirError):
    """A checkpoint was triggered on request but did not complete (the job keeps running)."""

    fault: Fault = Fault.EXTERNAL


TERMINAL_JOB_STATUSES: Final = frozenset(s.value for s in JobStatus if s.terminal)

# Reconnect quickly once a JobManager comes up: the CLI polls a starting cluster.
_CHANNEL_OPTIONS: Final = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)

_Response = TypeVar("_Response")


@dataclass(frozen=True)
class JobSummary:
    job_id: JobId
    job_name: str
    status: JobStatus
    submitted_at: float
    parallelism: int
    restarts: int

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_JOB_STATUSES


@dataclass(frozen=True)
class TaskStatus:
    vertex_uid: OperatorUid
    subtask: SubtaskIndex
    operator_names: str
    state: TaskState | None  # None: not reported yet
    taskmanager_id: TaskManagerId
    failure: Failure | None
    records_in: int
    records_out: int
    records_in_all_attempts: int = 0  # including records replayed after restores

    @property
    def name(self) -> str:
        return f"{self.vertex_uid}#{self.subtask}"


@dataclass(frozen=True)
class JobEnd:
    """An ending or ended job and the resolution of its sinks' transactions."""

    outcome: JobStatus
    ended: bool
    at: float
    nothing_to_resolve: bool  # every task FINISHED: the sinks committed through the final checkpoint
    resolution_decided: bool  # False: waits for a checkpoint being persisted
    as_of_checkpoint: CheckpointId | None
    attempts: int
    resolved: bool
    error: str
    retry_at: float | None

    @property
    def unresolved(self) -> bool:
        return not self.nothing_to_resolve and not self.resolved

    def describe(self) -> str:
        """One line: how the end's resolution stands."""
        if self.nothing_to_resolve:
            return "nothing to resolve: every task finished and committed through the final checkpoint"
        if not self.resolution_decided:
            return "waiting for a checkpoint being persisted before resolving the sinks"
        as_of = f"checkpoint {self.as_of_checkpoint}" if self.as_of_checkpoint is not None else "no checkpoint"
        if self.resolved:
            return f"sinks resolved as of {as_of}"
        state = f"sinks NOT resolved as of {as_of} after {self.attempts} attempt(s)"
        if self.error:
            state += f": {self.error}"
        return state + (" (retried)" if self.retry_at is not None or self.attempts == 0 else " (resolving)")


@dataclass(frozen=True)
class JobDetails:
    summary: JobSummary
    tasks: tuple[TaskStatus, ...]
    failure: Failure | None
    last_completed_checkpoint: CheckpointId | None
    last_restore_at: float | None
    end: JobEnd | None = None  # None: neither ending nor ended

    @property
    def records_in(self) -> int:
        return sum(t.records_in for t in self.tasks)

    @property
    def records_out(self) -> int:
        return sum(t.records_out for t in self.tasks)


@dataclass(frozen=True)
class TaskCheckpointStats:
    vertex_uid: OperatorUid
    subtask: SubtaskIndex
    alignment_duration_s: float
    start_delay_s: float
    state_size_bytes: int
    unaligned: bool = False  # the task persisted in-flight records (checkpointing.unaligned)
    inflight_bytes: int = 0
    sync_duration_s: float = 0.0
    async_duration_s: float = 0.0
    acked_at: float | None = None  # when the acknowledgement reached the JobManager
    timeline: SubtaskCheckpointTimeline | None = None  # only from checkpoint_detail

    @property
    def name(self) -> str:
        return f"{self.vertex_uid}#{self.subtask}"


@dataclass(frozen=True)
class RescaleInfo:
    """A rescale's progress (``weir rescale``): ``phase`` CHECKPOINTING, REDEPLOYING, COMPLETED or FAILED."""

    trigger_id: str
    phase: str
    from_parallelism: int
    to_parallelism: int
    checkpoint_id: int  # 0: not triggered yet
    failure: str
    requested_at: float
    finished_at: float  # 0: not finished

    @property
    def finished(self) -> bool:
        return self.phase in ("COMPLETED", "FAILED")


@dataclass(frozen=True)
class CheckpointInfo:
    checkpoint_id: CheckpointId
    status: CheckpointStatus
    kind: CheckpointKind
    trigger_time: float
    duration_s: float
    size_bytes: int
    failure: str
    tasks: tuple[TaskCheckpointStats, ...]
    external_path: str = ""  # set while retained: what `weir run --from-checkpoint` takes
    full: bool = False  # a full checkpoint (`weir checkpoint --full`): it reuses no earlier checkpoint's file

    @property
    def unaligned(self) -> bool:
        """Some task persisted in-flight records in it (an unaligned checkpoint)."""
        return any(t.unaligned for t in self.tasks)

    @property
    def inflight_bytes(self) -> int:
        return sum(t.inflight_bytes for t in self.tasks)


@dataclass(frozen=True)
class CheckpointDetail:
    """One checkpoint with every acknowledged subtask's stats and timeline (``checkpoint.tasks``) and
    the subtasks that had not acknowledged it (``pending``, as (vertex uid, subtask))."""

    checkpoint: CheckpointInfo
    pending: tuple[tuple[OperatorUid, SubtaskIndex], ...]


@dataclass(frozen=True)
class TaskManagerInfo:
    taskmanager_id: TaskManagerId
    address: str
    slots_total: int
    slots_free: int
    last_heartbeat_age_s: float
    alive: bool


@dataclass(frozen=True)
class ClusterStatus:
    taskmanagers: tuple[TaskManagerInfo, ...]

    @property
    def alive_taskmanagers(self) -> tuple[TaskManagerInfo, ...]:
        return tuple(tm for tm in self.taskmanagers if tm.alive)


class JobManagerClient:
    """A blocking client of one JobManager (or of the leader among ``a:1,b:2``). Use it as a context
    manager, or call :meth:`close`."""

    def __init__(
        self, address: str, *, timeout_s: float = CALL_TIMEOUT_S, security: TransportSecurity | None = None
    ) -> None:
        """``security``: token and TLS of the calls (default: from ``WEIR_AUTH_*``, ``WEIR_TLS_*``)."""
        self.address = address
        self._timeout_s = timeout_s
        transport = security if security is not None else TransportSecurity.from_env()
        # "a:1,b:2": the leader and its standbys; a call that finds no leader is retried by the
        # caller and goes to the next one (weir.core.leader_link).
        self._link = LeaderLink(
            [a.strip() for a in address.split(",") if a.strip()],
            lambda a: open_channel(a, transport, _CHANNEL_OPTIONS),
            jobmanager_pb2_grpc.JobManagerServiceStub,
        )
        self._stub: jobmanager_pb2_grpc.JobManagerServiceStub = self._link.stub

    def __enter__(self) -> JobManagerClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._link.close()

    def submit_job(
        self,
        job_file: Path | None,
        parameters: Mapping[str, str] | None = None,
        parallelism: int | None = None,
        *,
        job_name: str | None = None,
        from_checkpoint: str | None = None,
        allow_non_restored_state: bool = False,
        artifact: JobArtifact | None = None,
    ) -> JobId:
        """Ship the job file's source, or the job's artifact (``weir.api.artifacts``: the job file, if
        any, is in it), to the JobManager; ``parallelism`` None keeps the job's default.
        ``from_checkpoint``: the external path of a retained checkpoint the job starts from."""
        source = b""
        if artifact is None:
            if job_file is None:
                raise JobDefinitionError("a job without an artifact needs its job file")
            try:
                source = job_file.read_bytes()
            except OSError as exc:
                raise JobDefinitionError(f"job file {job_file} cannot be read: {exc.strerror}") from exc
        file_name = job_file.name if job_file is not None else artifact.manifest.entry_name if artifact else ""
        request = jobmanager_pb2.SubmitJobRequest(
            job_name=job_name or (job_file.stem if job_file is not None else ""),
            job_file_name=file_name,
            job_source=source,
            job_artifact=artifact.data if artifact is not None else b"",
            parameters=dict(parameters or {}),
            parallelism=parallelism or 0,
            from_checkpoint=from_checkpoint or "",
            allow_non_restored_state=allow_non_restored_state,
        )
        response = self._call(self._stub.SubmitJob, request, timeout_s=max(SUBMIT_TIMEOUT_S, self._timeout_s))
        return JobId(response.job_id)

    def list_jobs(self) -> tuple[JobSummary, ...]:
        response = self._call(self._stub.ListJobs, jobmanager_pb2.ListJobsRequest())
        return tuple(_summary(j) for j in response.jobs)

    def job_status(self, job_id: str) -> JobDetails:
        response = self._call(self._stub.GetJobStatus, jobmanager_pb2.GetJobStatusRequest(job_id=job_id), job_id=job_id)
        return JobDetails(
            summary=_summary(response.summary),
            tasks=tuple(_task_status(t) for t in response.tasks),
            failure=optional_failure_from_proto(response, "failure"),
            last_completed_checkpoint=CheckpointId(response.last_completed_checkpoint)
            if response.last_completed_checkpoint
            else None,
            last_restore_at=response.last_restore_at or None,
            end=_end(response.end) if response.HasField("end") else None,
        )

    def trigger_savepoint(
        self, job_id: str, target_directory: str | None = None, *, stop: bool = False, drain: bool = False
    ) -> CheckpointId:
        """Start a savepoint (``stop``: the job ends once it completed); answers its id. Its outcome
        and path show in ``list_checkpoints`` (``wait_for_savepoint``)."""
        response = self._call(
            self._stub.TriggerSavepoint,
            jobmanager_pb2.TriggerSavepointRequest(
                job_id=job_id, target_directory=target_directory or "", stop=stop, drain=drain
            ),
            job_id=job_id,
        )
        return CheckpointId(response.savepoint_id)

    def wait_for_savepoint(self, job_id: str, savepoint_id: int, timeout_s: float) -> CheckpointInfo:
        """Poll until the savepoint completed (answers it, with its external path) or failed
        (SavepointFailedError with the reason); SavepointFailedError too after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [c for c in self.list_checkpoints(job_id) if c.checkpoint_id == savepoint_id]
            if found and found[0].status is CheckpointStatus.COMPLETED and found[0].external_path:
                return found[0]
            if found and found[0].status is CheckpointStatus.FAILED:
                raise SavepointFailedError(f"savepoint {savepoint_id} of job {job_id} failed: {found[0].failure}")
            if time.monotonic() > deadline:
                raise SavepointFailedError(
                    f"savepoint {savepoint_id} of job {job_id} did not complete within {timeout_s:g}s; "
                    f"see `weir checkpoints {job_id}`"
                )
            time.sleep(SAVEPOINT_POLL_S)

    def trigger_checkpoint(self, job_id: str, *, full: bool = False) -> CheckpointId:
        """Start a checkpoint now (``weir checkpoint``, Flink's ``flink checkpoint``); answers its id.
        ``full``: a checkpoint that reuses no file of an earlier one."""
        response = self._call(
            self._stub.TriggerJobCheckpoint,
            jobmanager_pb2.TriggerJobCheckpointRequest(job_id=job_id, full=full),
            job_id=job_id,
        )
        return CheckpointId(response.checkpoint_id)

    def rescale(self, job_id: str, parallelism: int) -> str:
        """Start rescaling a running job (``weir rescale``); answers the request's trigger id. A refusal
        (not running, out of range, not enough slots, ...) raises JobManagerRequestError with its reason."""
        response = self._call(
            self._stub.RescaleJob,
            jobmanager_pb2.RescaleJobRequest(job_id=job_id, parallelism=parallelism),
            job_id=job_id,
        )
        return str(response.trigger_id)

    def rescale_status(self, job_id: str, trigger_id: str) -> RescaleInfo:
        r = self._call(
            self._stub.GetRescaleStatus,
            jobmanager_pb2.GetRescaleStatusRequest(job_id=job_id, trigger_id=trigger_id),
        )  # no job_id: a NOT_FOUND names an unknown job or an unknown rescale, in the JobManager's words
        return RescaleInfo(
            r.trigger_id,
            r.phase,
            r.from_parallelism,
            r.to_parallelism,
            r.checkpoint_id,
            r.failure,
            r.requested_at,
            r.finished_at,
        )

    def wait_for_rescale(self, job_id: str, trigger_id: str, timeout_s: float) -> RescaleInfo:
        """Poll until the rescale COMPLETED (answers it) or FAILED (RescaleFailedError with the reason);
        RescaleFailedError too after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            info = self.rescale_status(job_id, trigger_id)
            if info.phase == "FAILED":
                raise RescaleFailedError(f"rescale {trigger_id} of job {job_id} failed: {info.failure}")
            if info.phase == "COMPLETED":
                return info
            if time.monotonic() > deadline:
                raise RescaleFailedError(
                    f"rescale {trigger_id} of job {job_id} is still {info.phase} after {timeout_s:g}s; "
                    f"see `weir status {job_id}`"
                )
            time.sleep(SAVEPOINT_POLL_S)

    def wait_for_checkpoint(self, job_id: str, checkpoint_id: int, timeout_s: float) -> CheckpointInfo:
        """Poll until the checkpoint completed (answers it) or failed (CheckpointFailedError with the
        reason); CheckpointFailedError too after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [c for c in self.list_checkpoints(job_id) if c.checkpoint_id == checkpoint_id]
            if found and found[0].status is CheckpointStatus.COMPLETED:
                return found[0]
            if found and found[0].status is CheckpointStatus.FAILED:
                raise CheckpointFailedError(f"checkpoint {checkpoint_id} of job {job_id} failed: {found[0].failure}")
            if time.monotonic() > deadline:
                raise CheckpointFailedError(
                    f"checkpoint {checkpoint_id} of job {job_id} did not complete within {timeout_s:g}s; "
                    f"see `weir checkpoints {job_id}`"
                )
            time.sleep(SAVEPOINT_POLL_S)

    def cancel_job(self, job_id: str) -> JobStatus:
        """Cancel a job; answers the job's status after the request (e.g. CANCELING or CANCELED)."""
        response = self._call(self._stub.CancelJob, jobmanager_pb2.CancelJobRequest(job_id=job_id), job_id=job_id)
        return job_status_from_proto(response.status)

    def list_checkpoints(self, job_id: str) -> tuple[CheckpointInfo, ...]:
        response = self._call(
            self._stub.ListCheckpoints, jobmanager_pb2.ListCheckpointsRequest(job_id=job_id), job_id=job_id
        )
        return tuple(_checkpoint(c) for c in response.checkpoints)

    def checkpoint_detail(self, job_id: str, checkpoint_id: int) -> CheckpointDetail:
        """UnknownJobError or UnknownCheckpointError when the JobManager knows neither."""
        response = self._call(
            self._stub.GetCheckpointDetail,
            jobmanager_pb2.GetCheckpointDetailRequest(job_id=job_id, checkpoint_id=checkpoint_id),
            job_id=job_id,
            checkpoint_id=checkpoint_id,
        )
        return CheckpointDetail(
            checkpoint=_checkpoint(response.checkpoint),
            pending=tuple((OperatorUid(t.vertex_uid), SubtaskIndex(t.subtask)) for t in response.pending_tasks),
        )

    def cluster_status(self) -> ClusterStatus:
        response = self._call(self._stub.GetClusterStatus, jobmanager_pb2.GetClusterStatusRequest())
        return ClusterStatus(taskmanagers=tuple(_taskmanager(tm) for tm in response.taskmanagers))

    def _call(
        self,
        method: Callable[..., _Response],
        request: object,
        *,
        timeout_s: float | None = None,
        job_id: str | None = None,
        checkpoint_id: int | None = None,
    ) -> _Response:
        try:
            return method(request, timeout=timeout_s or self._timeout_s)
        except grpc.RpcError as exc:
            raise self._error(exc, job_id, checkpoint_id) from None

    def _error(self, exc: grpc.RpcError, job_id: str | None, checkpoint_id: int | None = None) -> WeirError:
        code: grpc.StatusCode = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = " ".join(str(exc.details() if isinstance(exc, grpc.Call) else exc).split())
        if code is grpc.StatusCode.UNAUTHENTICATED:
            return AuthenticationError(f"the JobManager at {self.address} refused the call: {details}")
        if code is grpc.StatusCode.PERMISSION_DENIED:
            return PermissionDeniedError(f"the JobManager at {self.address} refused the call: {details}")
        if code is grpc.StatusCode.UNAVAILABLE and _reason(exc) == jobmanager_pb2.ERROR_REASON_NOT_READY:
            return ClusterUnavailableError(f"the JobManager at {self.address}: {details}")
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return ClusterUnavailableError(f"no JobManager at {self.address}: start the cluster with `weir cluster up`")
        if code is grpc.StatusCode.NOT_FOUND and job_id is not None and checkpoint_id is not None:
            if _reason(exc) == jobmanager_pb2.ERROR_REASON_UNKNOWN_CHECKPOINT:
                return UnknownCheckpointError(job_id, checkpoint_id)
        if code is grpc.StatusCode.NOT_FOUND:
            return (
                UnknownJobError(job_id)
                if job_id is not None
                else JobManagerRequestError(details or "not found", code=code.name, fault="user")
            )
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            return JobDefinitionError(details or "the JobManager rejected the job")
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            return NotEnoughSlotsError(details or "not enough free task slots")
        if code is grpc.StatusCode.FAILED_PRECONDITION:
            return JobManagerRequestError(
                details or "the request does not fit the job's state", code=code.name, fault="user"
            )
        return JobManagerRequestError(
            f"the JobManager at {self.address} answered {code.name}: {details or 'no details'}", code=code.name
        )


def _reason(exc: grpc.RpcError) -> jobmanager_pb2.ErrorReason:
    """The ``ErrorDetail`` reason in the call's status details; UNSPECIFIED when it carries none."""
    status = rpc_status.from_call(exc) if isinstance(exc, grpc.Call) else None
    details: Sequence[any_pb2.Any] = status.details if status is not None else ()
    for detail in details:
        unpacked = jobmanager_pb2.ErrorDetail()
        if detail.Unpack(unpacked):  # False: a detail of another type
            return unpacked.reason
    return jobmanager_pb2.ERROR_REASON_UNSPECIFIED


def _end(m: jobmanager_pb2.JobEnd) -> JobEnd:
    return JobEnd(
        outcome=job_status_from_proto(m.outcome),
        ended=m.ended,
        at=m.at,
        nothing_to_resolve=m.nothing_to_resolve,
        resolution_decided=m.resolution_decided,
        as_of_checkpoint=CheckpointId(m.as_of_checkpoint) if m.HasField("as_of_checkpoint") else None,
        attempts=m.attempts,
        resolved=m.resolved,
        error=m.error,
        retry_at=m.retry_at if m.HasField("retry_at") else None,
    )


def _summary(m: jobmanager_pb2.JobSummary) -> JobSummary:
    return JobSummary(
        job_id=JobId(m.job_id),
        job_name=m.job_name,
        status=job_status_from_proto(m.status),
        submitted_at=m.submitted_at,
        parallelism=m.parallelism,
        restarts=m.restarts,
    )


def _task_status(m: jobmanager_pb2.TaskStatus) -> TaskStatus:
    return TaskStatus(
        vertex_uid=OperatorUid(m.task.vertex_uid),
        subtask=SubtaskIndex(m.task.subtask),
        operator_names=m.operator_names,
        state=task_state_from_proto(m.state) if m.state != common_pb2.TASK_STATE_UNSPECIFIED else None,
        taskmanager_id=TaskManagerId(m.taskmanager_id),
        failure=optional_failure_from_proto(m, "failure"),
        records_in=m.records_in,
        records_out=m.records_out,
        records_in_all_attempts=m.records_in_all_attempts,
    )


def _checkpoint(m: jobmanager_pb2.CheckpointInfo) -> CheckpointInfo:
    return CheckpointInfo(
        checkpoint_id=CheckpointId(m.checkpoint_id),
        status=checkpoint_status_from_proto(m.status),
        kind=checkpoint_kind_from_proto(m.kind),
        trigger_time=m.trigger_time,
        duration_s=m.duration_s,
        size_bytes=m.size_bytes,
        failure=m.failure,
        tasks=tuple(
            TaskCheckpointStats(
                vertex_uid=OperatorUid(t.task.vertex_uid),
                subtask=SubtaskIndex(t.task.subtask),
                alignment_duration_s=t.alignment_duration_s,
                start_delay_s=t.start_delay_s,
                state_size_bytes=t.state_size_bytes,
                unaligned=t.unaligned,
                inflight_bytes=t.inflight_bytes,
                sync_duration_s=t.sync_duration_s,
                async_duration_s=t.async_duration_s,
                acked_at=t.acked_at if t.HasField("acked_at") else None,
                timeline=optional_timeline_from_proto(t, "timeline"),
            )
            for t in m.tasks
        ),
        full=m.full,
        external_path=m.external_path,
    )


def _taskmanager(m: jobmanager_pb2.TaskManagerInfo) -> TaskManagerInfo:
    return TaskManagerInfo(
        taskmanager_id=TaskManagerId(m.taskmanager_id),
        address=m.address,
        slots_total=m.slots_total,
        slots_free=m.slots_free,
        last_heartbeat_age_s=m.last_heartbeat_age_s,
        alive=m.alive,
    )


__all__ = [
    "CALL_TIMEOUT_S",
    "SUBMIT_TIMEOUT_S",
    "TERMINAL_JOB_STATUSES",
    "CheckpointDetail",
    "CheckpointFailedError",
    "CheckpointInfo",
    "ClusterStatus",
    "JobManagerClient",
    "JobDetails",
    "JobSummary",
    "TaskCheckpointStats",
    "TaskManagerInfo",
    "TaskStatus",
]
