"""The JobManager service's own enums on the wire (``weir/wire/jobmanager.proto``): a job's status and
a checkpoint's status. The enums shared by every service (task state, checkpoint kind, fault) are in
``weir.codec``. The servicer and ``weir.client`` convert here and nowhere else."""

from __future__ import annotations

from typing import assert_never

from jobmanager.checkpointing.coordinator import CheckpointStatus
from weir.errors import ProtocolError
from weir.states import JobStatus
from weir.wire import jobmanager_pb2

# Job status ----------------------------------------------------------------------------------------


def job_status_to_proto(status: JobStatus) -> jobmanager_pb2.JobStatus:
    match status:
        case JobStatus.CREATED:
            return jobmanager_pb2.JOB_STATUS_CREATED
        case JobStatus.RUNNING:
            return jobmanager_pb2.JOB_STATUS_RUNNING
        case JobStatus.RESTARTING:
            return jobmanager_pb2.JOB_STATUS_RESTARTING
        case JobStatus.FINISHED:
            return jobmanager_pb2.JOB_STATUS_FINISHED
        case JobStatus.FAILED:
            return jobmanager_pb2.JOB_STATUS_FAILED
        case JobStatus.CANCELLING:
            return jobmanager_pb2.JOB_STATUS_CANCELLING
        case JobStatus.CANCELED:
            return jobmanager_pb2.JOB_STATUS_CANCELED
        case _:
            assert_never(status)


_JOB_STATUSES_BACK: dict[jobmanager_pb2.JobStatus, JobStatus] = {
    job_status_to_proto(status): status for status in JobStatus
}


def job_status_from_proto(value: jobmanager_pb2.JobStatus) -> JobStatus:
    status = _JOB_STATUSES_BACK.get(value)
    if status is None:
        raise ProtocolError(
            f"a job without a known status ({_enum_name(jobmanager_pb2.JobStatus, value)}): "
            "the JobManager and this client run different versions"
        )
    return status


# Checkpoint status ---------------------------------------------------------------------------------


def checkpoint_status_to_proto(status: CheckpointStatus) -> jobmanager_pb2.CheckpointStatus:
    match status:
        case CheckpointStatus.IN_PROGRESS:
            return jobmanager_pb2.CHECKPOINT_STATUS_IN_PROGRESS
        case CheckpointStatus.COMPLETED:
            return jobmanager_pb2.CHECKPOINT_STATUS_COMPLETED
        case CheckpointStatus.FAILED:
            return jobmanager_pb2.CHECKPOINT_STATUS_FAILED
        case _:
            assert_never(status)


_CHECKPOINT_STATUSES_BACK: dict[jobmanager_pb2.CheckpointStatus, CheckpointStatus] = {
    checkpoint_status_to_proto(status): status for status in CheckpointStatus
}


def checkpoint_status_from_proto(value: jobmanager_pb2.CheckpointStatus) -> CheckpointStatus:
    status = _CHECKPOINT_STATUSES_BACK.get(value)
    if status is None:
        raise ProtocolError(
            f"a checkpoint without a known status ({_enum_name(jobmanager_pb2.CheckpointStatus, value)}): "
            "the JobManager and this client run different versions"
        )
    return status


def _enum_name(enum_type: object, value: int) -> str:
    try:
        return str(enum_type.Name(value))  # type: ignore[attr-defined]
    except ValueError:
        return str(value)
