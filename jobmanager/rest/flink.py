"""What makes Weir's REST API answer Apache Flink's clients (``docs/rest-api.md``, "Flink's clients"):
job ids in Flink's form, Flink's asynchronous operations (trigger ids, ``AsynchronousOperationResult``),
a job's execution result (``JobExecutionResultResponseBody``) and savepoint disposal. A failure goes
out as Flink's ``SerializedThrowable`` with its Java serialization (``java_serialization``), so Flink's
Java client reads it back.

Job ids: ``weir.jobmanager.rest.ids``.

Trigger ids. Flink answers a trigger with a 32-hex ``request-id`` and is asked for the outcome with it
(``TriggerId``). A savepoint's trigger id is its checkpoint id in hex, so the outcome is read from the
job's checkpoints and nothing is kept for it; a disposal's is random, its outcome kept (the last
``DISPOSALS_KEPT``) as Flink's ``CompletedOperationCache`` keeps one.
"""

from __future__ import annotations

import base64
import enum
import re
import threading
import uuid
from collections import OrderedDict
from typing import Final, assert_never

from pydantic import ConfigDict, Field

from weir.core.checkpointing import CheckpointKind, CheckpointStatus
from weir.core.errors import UnknownCheckpointError, WeirError
from weir.core.states import JobStatus
from weir.jobmanager.errors import SavepointDisposalError
from weir.jobmanager.messages import CheckpointsView, JobStatusView
from weir.jobmanager.rescaling import RescaleOperation, RescalePhase
from weir.jobmanager.rest import java_serialization
from weir.jobmanager.rest.ids import FLINK_ID_HEX, flink_job_id
from weir.jobmanager.rest.views import Model, _api, ms
from weir.jobmanager.savepoint_disposal import dispose_savepoint

DISPOSALS_KEPT: Final = 100
_HEX: Final = re.compile(r"[0-9a-f]+")


def savepoint_trigger_id(checkpoint_id: int) -> str:
    return f"{checkpoint_id:0{FLINK_ID_HEX}x}"


def checkpoint_of_trigger(job_id: str, trigger_id: str) -> int:
    """The checkpoint a savepoint's trigger id names; UnknownCheckpointError when it names none."""
    if len(trigger_id) != FLINK_ID_HEX or not _HEX.fullmatch(trigger_id.lower()):
        raise UnknownCheckpointError(job_id, -1)
    return int(trigger_id, 16)


# Requests ------------------------------------------------------------------------------------------


class SavepointFormatType(enum.StrEnum):
    """Flink's choice of format; Weir's savepoints have one (docs/formats.md), taken for either."""

    CANONICAL = "CANONICAL"
    NATIVE = "NATIVE"


class _Request(Model):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, validate_by_name=True, validate_by_alias=True)


class StopRequest(_Request):
    """``POST /jobs/{id}/stop``: Flink's ``StopWithSavepointRequestBody``."""

    target_directory: str | None = Field(default=None, alias="targetDirectory", min_length=1)
    drain: bool = False
    format_type: SavepointFormatType | None = Field(default=None, alias="formatType", strict=False)
    trigger_id: str | None = Field(default=None, alias="triggerId")


class CheckpointType(enum.StrEnum):
    """Flink's ``CheckpointType`` of a checkpoint on request: CONFIGURED (the job's own kind, here
    incremental), INCREMENTAL, or FULL (reuse no file of an earlier checkpoint)."""

    CONFIGURED = "CONFIGURED"
    INCREMENTAL = "INCREMENTAL"
    FULL = "FULL"


class CheckpointTriggerRequest(_Request):
    """``POST /jobs/{id}/checkpoints``: Flink's ``CheckpointTriggerRequestBody``."""

    checkpoint_type: CheckpointType = Field(default=CheckpointType.CONFIGURED, alias="checkpointType", strict=False)
    trigger_id: str | None = Field(default=None, alias="triggerId")

    @property
    def full(self) -> bool:
        match self.checkpoint_type:
            case CheckpointType.FULL:
                return True
            case CheckpointType.CONFIGURED | CheckpointType.INCREMENTAL:
                return False
            case _:
                assert_never(self.checkpoint_type)


class DisposalRequest(_Request):
    """``POST /savepoint-disposal``: Flink's ``SavepointDisposalRequest``."""

    savepoint_path: str = Field(alias="savepoint-path", min_length=1)


# Answers -------------------------------------------------------------------------------------------


class QueueStatusId(enum.StrEnum):
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"


class QueueStatus(Model):
    id: QueueStatusId


class FailureCause(Model):
    """Flink's ``SerializedThrowable`` as its serializer writes it: ``class``, ``stack-trace`` and
    ``serialized-throwable``, the base64 of the Java serialization of a ``SerializedThrowable`` that
    Flink's Java client reads back (``weir.jobmanager.rest.java_serialization``). Made by
    :func:`failure_cause`."""

    class_name: str = _api("class")
    stack_trace: str = _api("stack-trace")
    serialized_throwable: str = _api("serialized-throwable")


def failure_cause(class_name: str, message: str, stack_trace: str = "") -> FailureCause:
    """A failure in Flink's shape: its class, its message, the trace printed for it (the message
    when it has none)."""
    trace = stack_trace or (f"{class_name}: {message}" if class_name else message)
    encoded = java_serialization.serialized_throwable(class_name, message, trace)
    return FailureCause(
        class_name=class_name, stack_trace=trace, serialized_throwable=base64.b64encode(encoded).decode("ascii")
    )


class OperationInfo(Model):
    """The union of Flink's ``SavepointInfo``, ``CheckpointInfo`` and ``AsynchronousOperationInfo``."""

    location: str | None = None  # a savepoint's path
    checkpoint_id: int | None = Field(default=None, validation_alias="checkpointId", serialization_alias="checkpointId")
    failure_cause: FailureCause | None = Field(
        default=None, validation_alias="failure-cause", serialization_alias="failure-cause"
    )


class OperationResult(Model):
    """Flink's ``AsynchronousOperationResult``: ``operation`` is absent while IN_PROGRESS."""

    status: QueueStatus
    operation: OperationInfo | None = None


IN_PROGRESS: Final = OperationResult(status=QueueStatus(id=QueueStatusId.IN_PROGRESS))


def savepoint_status(view: CheckpointsView, checkpoint_id: int) -> OperationResult:
    """A savepoint's outcome as Flink reports it: IN_PROGRESS until it completed and was placed (its
    path known), COMPLETED with its ``location``, or COMPLETED with a ``failure-cause``."""
    found = next((c for c in view.checkpoints if c.checkpoint_id == checkpoint_id), None)
    if found is None or found.kind is not CheckpointKind.SAVEPOINT:
        raise UnknownCheckpointError(view.job_id, checkpoint_id)
    match found.status:
        case CheckpointStatus.IN_PROGRESS:
            return IN_PROGRESS
        case CheckpointStatus.COMPLETED:
            location = view.external_paths.get(found.checkpoint_id)
            if location is None:
                return IN_PROGRESS  # completed, still being copied to its target directory
            return OperationResult(
                status=QueueStatus(id=QueueStatusId.COMPLETED), operation=OperationInfo(location=location)
            )
        case CheckpointStatus.FAILED:
            reason = str(found.failure) if found.failure is not None else "failed"
            return failed("SavepointFailedError", f"savepoint {checkpoint_id} of job {view.job_id}: {reason}")


def checkpoint_status(view: CheckpointsView, checkpoint_id: int) -> OperationResult:
    """A checkpoint on request's outcome as Flink reports it (``CheckpointInfo``): IN_PROGRESS, then
    COMPLETED with its ``checkpointId``, or with a ``failure-cause`` as well when it failed."""
    found = next((c for c in view.checkpoints if c.checkpoint_id == checkpoint_id), None)
    if found is None or found.kind is not CheckpointKind.CHECKPOINT:
        raise UnknownCheckpointError(view.job_id, checkpoint_id)
    match found.status:
        case CheckpointStatus.IN_PROGRESS:
            return IN_PROGRESS
        case CheckpointStatus.COMPLETED:
            return OperationResult(
                status=QueueStatus(id=QueueStatusId.COMPLETED), operation=OperationInfo(checkpoint_id=checkpoint_id)
            )
        case CheckpointStatus.FAILED:
            reason = str(found.failure) if found.failure is not None else "failed"
            message = f"checkpoint {checkpoint_id} of job {view.job_id}: {reason}"
            cause = failure_cause("CheckpointFailedError", message, message)
            return OperationResult(
                status=QueueStatus(id=QueueStatusId.COMPLETED),
                operation=OperationInfo(checkpoint_id=checkpoint_id, failure_cause=cause),
            )


def failed(class_name: str, message: str) -> OperationResult:
    return OperationResult(
        status=QueueStatus(id=QueueStatusId.COMPLETED),
        operation=OperationInfo(failure_cause=failure_cause(class_name, message, message)),
    )


class TriggerResponse(Model):
    request_id: str = _api("request-id")


def rescale_status(op: RescaleOperation) -> OperationResult:
    """A rescale's outcome as Flink's ``GET /jobs/:jobid/rescaling/:triggerid`` reports it
    (``AsynchronousOperationInfo``): IN_PROGRESS while its checkpoint or the redeployment is under way,
    then COMPLETED (with the ``checkpointId`` it was redeployed from, Weir's addition), or COMPLETED
    with a ``failure-cause``."""
    match op.phase:
        case RescalePhase.CHECKPOINTING | RescalePhase.REDEPLOYING:
            return IN_PROGRESS
        case RescalePhase.COMPLETED:
            return OperationResult(
                status=QueueStatus(id=QueueStatusId.COMPLETED), operation=OperationInfo(checkpoint_id=op.checkpoint_id)
            )
        case RescalePhase.FAILED:
            return failed(
                "RescaleFailedError", f"rescale of job {op.job_id} to parallelism {op.to_parallelism}: {op.failure}"
            )
        case _:
            assert_never(op.phase)


# A job's execution result ------------------------------------------------------------------------


class ApplicationStatus(enum.StrEnum):
    """Flink's ``ApplicationStatus``, the ended job's outcome in its ``JobResult``."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"
    UNKNOWN = "UNKNOWN"


def application_status(status: JobStatus) -> ApplicationStatus:
    """Flink's ``ApplicationStatus.fromJobStatus``: FINISHED succeeded; a status that is no end, unknown."""
    match status:
        case JobStatus.FINISHED:
            return ApplicationStatus.SUCCEEDED
        case JobStatus.FAILED:
            return ApplicationStatus.FAILED
        case JobStatus.CANCELED:
            return ApplicationStatus.CANCELED
        case JobStatus.CREATED | JobStatus.RUNNING | JobStatus.RESTARTING | JobStatus.CANCELLING:
            return ApplicationStatus.UNKNOWN
        case _:
            assert_never(status)


class JobResult(Model):
    """Flink's ``JobResult`` as its ``JobResultSerializer`` (Flink 2.2) writes it: the job's id,
    outcome, accumulators (Weir has none: ``{}``), the ms from its submission to its end, and for a
    FAILED job the failure that ended it."""

    id: str
    application_status: ApplicationStatus = _api("application-status")
    accumulator_results: dict[str, str] = _api("accumulator-results")
    net_runtime: int = _api("net-runtime")
    failure_cause: FailureCause | None = Field(
        default=None, validation_alias="failure-cause", serialization_alias="failure-cause"
    )


class JobExecutionResult(Model):
    """Flink's ``JobExecutionResultResponseBody``: IN_PROGRESS until the job ended, then COMPLETED with
    its ``job-execution-result`` (what ``flink run`` in attached mode polls for)."""

    status: QueueStatus
    job_execution_result: JobResult | None = Field(
        default=None, validation_alias="job-execution-result", serialization_alias="job-execution-result"
    )


JOB_FAILURE_CLASS: Final = "JobFailure"
"""The class a FAILED job's failure is given when Weir decided on it (a failure of no exception type)."""


def job_execution_result(status: JobStatusView) -> JobExecutionResult:
    """The job's result once it ended (FINISHED, CANCELED or FAILED, its sinks resolved), in Flink's shape."""
    summary = status.summary
    if not summary.status.terminal:
        return JobExecutionResult(status=QueueStatus(id=QueueStatusId.IN_PROGRESS))
    ended_at = status.finished_at if status.finished_at is not None else status.now
    cause = None
    if summary.status is JobStatus.FAILED:
        failure = status.failure
        if failure is None:
            cause = failure_cause(JOB_FAILURE_CLASS, f"job {summary.job_id} failed")
        else:
            cause = failure_cause(failure.type or JOB_FAILURE_CLASS, failure.message, failure.stacktrace)
    result = JobResult(
        id=flink_job_id(summary.job_id),
        application_status=application_status(summary.status),
        accumulator_results={},
        net_runtime=max(0, ms(ended_at) - ms(summary.submitted_at)),
        failure_cause=cause,
    )
    return JobExecutionResult(status=QueueStatus(id=QueueStatusId.COMPLETED), job_execution_result=result)


# Savepoint disposal --------------------------------------------------------------------------------


class _CompletedOperations:
    """Outcomes of operations done at once, by trigger id, the last ``DISPOSALS_KEPT`` (Flink's
    ``CompletedOperationCache``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: OrderedDict[str, OperationResult] = OrderedDict()

    def _keep(self, result: OperationResult) -> str:
        trigger_id = uuid.uuid4().hex
        with self._lock:
            self._results[trigger_id] = result
            while len(self._results) > DISPOSALS_KEPT:
                self._results.popitem(last=False)
        return trigger_id

    def status(self, trigger_id: str) -> OperationResult | None:
        with self._lock:
            return self._results.get(trigger_id)


class Disposals(_CompletedOperations):
    """The outcomes of savepoint disposals by trigger id."""

    def dispose(self, path: str) -> str:
        """Dispose now (a savepoint is a few objects) and keep the outcome under a new trigger id. A
        refusal (not a savepoint) raises, as Flink's answers 400 before it triggers anything."""
        try:
            dispose_savepoint(path)  # weir.jobmanager.savepoint_disposal, as weir savepoint --dispose
            result = OperationResult(status=QueueStatus(id=QueueStatusId.COMPLETED), operation=OperationInfo())
        except SavepointDisposalError:
            raise
        except WeirError as exc:
            result = failed(type(exc).__name__, str(exc))
        return self._keep(result)


# Cluster datasets ----------------------------------------------------------------------------------
# Flink's cluster datasets are a batch job's intermediate results kept on the TaskManagers for a later
# job (``DataStream#cache``). Weir's jobs are streaming and keep none: the list is empty, and a deletion
# is what Flink does for a dataset its ResourceManager does not track: triggered (202 with a
# ``request-id``), then COMPLETED without a failure, nothing released.


class DataSetEntry(Model):
    """Flink's ``ClusterDataSetEntry``."""

    id: str
    is_complete: bool = _api("isComplete")


class DataSetList(Model):
    """Flink's ``ClusterDataSetListResponseBody``."""

    data_sets: list[DataSetEntry] = _api("dataSets")


def data_set_id(text: str) -> str:
    """A dataset id as Flink's ``IntermediateDataSetID`` path parameter takes it (32 hex digits);
    ValueError with a one-line message otherwise (400, as Flink's)."""
    lowered = text.lower()
    if len(lowered) != FLINK_ID_HEX or not _HEX.fullmatch(lowered):
        raise ValueError(f"dataset id {text!r} is not {FLINK_ID_HEX} hex digits (Flink's IntermediateDataSetID)")
    return lowered


class DataSetDeletions(_CompletedOperations):
    """The outcomes of dataset deletions by trigger id."""

    def delete(self, dataset_id: str) -> str:
        """Weir holds no dataset, so there is nothing to release: completed at once, as Flink's for a
        dataset it does not track."""
        return self._keep(OperationResult(status=QueueStatus(id=QueueStatusId.COMPLETED), operation=OperationInfo()))


# Client heartbeat -----------------------------------------------------------------------------------


class ClientHeartbeatRequest(Model):
    """Flink's ``JobClientHeartbeatRequestBody``: an attached client's promise to beat again before
    ``expiredTimestamp`` (epoch ms). Flink cancels a job submitted with
    ``execution.shutdown-on-attached-exit`` whose client stops beating; Weir has no such setting: it
    accepts the beat for a known job and keeps running it whatever the client does."""

    expired_timestamp: int = _api("expiredTimestamp")
