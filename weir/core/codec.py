"""The one codec between Weir's domain values and their protobuf messages and enums.

Servicers and clients convert here and nowhere else, so that no meaning travels as a string and a
new enum value fails loudly (``assert_never``) instead of falling through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, assert_never

from weir.core.checkpointing import (
    BarrierAlignment,
    ChannelBarrierTime,
    CheckpointingMode,
    CheckpointKind,
    CheckpointStatus,
    SubtaskCheckpointTimeline,
)
from weir.core.errors import Fault, ProtocolError
from weir.core.failures import Failure
from weir.core.states import JobStatus, TaskState
from weir.core.task_time import TimeRatios, TimeTotals
from weir.wire import common_pb2, jobmanager_pb2

_V = TypeVar("_V")

# Fault ---------------------------------------------------------------------------------------------


def fault_to_proto(fault: Fault) -> common_pb2.Fault:
    match fault:
        case Fault.USER:
            return common_pb2.FAULT_USER
        case Fault.EXTERNAL:
            return common_pb2.FAULT_EXTERNAL
        case Fault.INTERNAL:
            return common_pb2.FAULT_INTERNAL
        case _:
            assert_never(fault)


def fault_from_proto(value: common_pb2.Fault) -> Fault:
    if value == common_pb2.FAULT_USER:
        return Fault.USER
    if value == common_pb2.FAULT_EXTERNAL:
        return Fault.EXTERNAL
    if value == common_pb2.FAULT_INTERNAL:
        return Fault.INTERNAL
    raise ProtocolError(f"a failure without a known fault ({common_pb2.Fault.Name(value)})")


# Failure -------------------------------------------------------------------------------------------


def failure_to_proto(failure: Failure) -> common_pb2.Failure:
    return common_pb2.Failure(
        type=failure.type,
        message=failure.message,
        fault=fault_to_proto(failure.fault),
        retriable=failure.retriable,
        stacktrace=failure.stacktrace,
    )


def failure_from_proto(message: common_pb2.Failure) -> Failure:
    return Failure(
        message.type, message.message, fault_from_proto(message.fault), message.retriable, message.stacktrace
    )


def optional_failure_from_proto(owner: object, field: str) -> Failure | None:
    """The failure in ``owner.field`` (a message with an optional ``Failure`` field), None when unset."""
    if not owner.HasField(field):  # type: ignore[attr-defined]
        return None
    return failure_from_proto(getattr(owner, field))


# A running task's load on the heartbeat ------------------------------------------------------------


def set_task_load(
    progress: jobmanager_pb2.TaskProgress, ratios: TimeRatios | None, totals: TimeTotals, watermark_ms: int | None
) -> None:
    """Put a task's time shares, time totals and input watermark on its heartbeat entry (unset when unknown)."""
    progress.busy_seconds = totals.busy_s
    progress.backpressured_seconds = totals.backpressured_s
    progress.idle_seconds = totals.idle_s
    if ratios is not None:
        progress.busy_ratio = ratios.busy
        progress.backpressured_ratio = ratios.backpressured
        progress.idle_ratio = ratios.idle
    if watermark_ms is not None:
        progress.input_watermark_ms = watermark_ms


def task_ratios_from_proto(progress: jobmanager_pb2.TaskProgress) -> TimeRatios | None:
    """The time shares on a heartbeat entry; None unless all three are set."""
    if not (
        progress.HasField("busy_ratio") and progress.HasField("backpressured_ratio") and progress.HasField("idle_ratio")
    ):
        return None
    return TimeRatios(progress.busy_ratio, progress.backpressured_ratio, progress.idle_ratio)


def task_totals_from_proto(progress: jobmanager_pb2.TaskProgress) -> TimeTotals | None:
    """The time totals on a heartbeat entry; None unless all three are set (an older TaskManager)."""
    if not (
        progress.HasField("busy_seconds")
        and progress.HasField("backpressured_seconds")
        and progress.HasField("idle_seconds")
    ):
        return None
    return TimeTotals(progress.busy_seconds, progress.backpressured_seconds, progress.idle_seconds)


def task_watermark_from_proto(progress: jobmanager_pb2.TaskProgress) -> int | None:
    return progress.input_watermark_ms if progress.HasField("input_watermark_ms") else None


# Checkpointing mode --------------------------------------------------------------------------------


def checkpointing_mode_to_proto(mode: CheckpointingMode) -> common_pb2.CheckpointingMode:
    match mode:
        case CheckpointingMode.EXACTLY_ONCE:
            return common_pb2.CHECKPOINTING_MODE_EXACTLY_ONCE
        case CheckpointingMode.AT_LEAST_ONCE:
            return common_pb2.CHECKPOINTING_MODE_AT_LEAST_ONCE
        case CheckpointingMode.UNALIGNED:
            return common_pb2.CHECKPOINTING_MODE_UNALIGNED
        case _:
            assert_never(mode)


def checkpointing_mode_from_proto(value: common_pb2.CheckpointingMode) -> CheckpointingMode:
    """Refuses UNSPECIFIED: a deployment that does not say its mode must not default to one."""
    if value == common_pb2.CHECKPOINTING_MODE_EXACTLY_ONCE:
        return CheckpointingMode.EXACTLY_ONCE
    if value == common_pb2.CHECKPOINTING_MODE_AT_LEAST_ONCE:
        return CheckpointingMode.AT_LEAST_ONCE
    if value == common_pb2.CHECKPOINTING_MODE_UNALIGNED:
        return CheckpointingMode.UNALIGNED
    raise ProtocolError(
        f"a deployment without a known checkpointing mode ({common_pb2.CheckpointingMode.Name(value)}): "
        "the JobManager and this TaskManager run different versions"
    )


# Checkpoint kind -----------------------------------------------------------------------------------


def checkpoint_kind_to_proto(kind: CheckpointKind) -> common_pb2.CheckpointKind:
    match kind:
        case CheckpointKind.CHECKPOINT:
            return common_pb2.CHECKPOINT_KIND_CHECKPOINT
        case CheckpointKind.SAVEPOINT:
            return common_pb2.CHECKPOINT_KIND_SAVEPOINT
        case _:
            assert_never(kind)


def checkpoint_kind_from_proto(value: common_pb2.CheckpointKind) -> CheckpointKind:
    if value == common_pb2.CHECKPOINT_KIND_CHECKPOINT:
        return CheckpointKind.CHECKPOINT
    if value == common_pb2.CHECKPOINT_KIND_SAVEPOINT:
        return CheckpointKind.SAVEPOINT
    raise ProtocolError(
        f"a barrier or trigger without a known checkpoint kind ({common_pb2.CheckpointKind.Name(value)})"
    )


# Barrier alignment ---------------------------------------------------------------------------------


def barrier_alignment_to_proto(alignment: BarrierAlignment) -> common_pb2.BarrierAlignment:
    match alignment:
        case BarrierAlignment.BY_MODE:
            return common_pb2.BARRIER_ALIGNMENT_BY_MODE
        case BarrierAlignment.FORCED_ALIGNED:
            return common_pb2.BARRIER_ALIGNMENT_FORCED_ALIGNED
        case _:
            assert_never(alignment)


def barrier_alignment_from_proto(value: common_pb2.BarrierAlignment) -> BarrierAlignment:
    """Refuses UNSPECIFIED: a barrier that does not say how it aligns must not be taken as one that may
    overtake records (a final checkpoint's would leave records outside every checkpoint)."""
    if value == common_pb2.BARRIER_ALIGNMENT_BY_MODE:
        return BarrierAlignment.BY_MODE
    if value == common_pb2.BARRIER_ALIGNMENT_FORCED_ALIGNED:
        return BarrierAlignment.FORCED_ALIGNED
    raise ProtocolError(
        f"a barrier without a known alignment ({common_pb2.BarrierAlignment.Name(value)}): the producing "
        "TaskManager runs another version"
    )


# Task state ----------------------------------------------------------------------------------------

_TASK_STATES: dict[TaskState, common_pb2.TaskState] = {
    TaskState.DEPLOYING: common_pb2.TASK_STATE_DEPLOYING,
    TaskState.RUNNING: common_pb2.TASK_STATE_RUNNING,
    TaskState.FINISHED: common_pb2.TASK_STATE_FINISHED,
    TaskState.CANCELED: common_pb2.TASK_STATE_CANCELED,
    TaskState.FAILED: common_pb2.TASK_STATE_FAILED,
}
_TASK_STATES_BACK = {wire: state for state, wire in _TASK_STATES.items()}


def task_state_to_proto(state: TaskState) -> common_pb2.TaskState:
    return _TASK_STATES[state]


def task_state_from_proto(value: common_pb2.TaskState) -> TaskState:
    state = _TASK_STATES_BACK.get(value)
    if state is None:
        raise ProtocolError(f"a task report without a known state ({common_pb2.TaskState.Name(value)})")
    return state


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
    return _decode(_JOB_STATUSES_BACK, value, jobmanager_pb2.JobStatus, "a job without a known status")


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
    return _decode(
        _CHECKPOINT_STATUSES_BACK, value, jobmanager_pb2.CheckpointStatus, "a checkpoint without a known status"
    )


# Checkpoint timeline -------------------------------------------------------------------------------


def timeline_to_proto(timeline: SubtaskCheckpointTimeline) -> jobmanager_pb2.CheckpointTimeline:
    message = jobmanager_pb2.CheckpointTimeline(
        first_barrier_at=timeline.first_barrier_at,
        alignment_end_at=timeline.alignment_end_at,
        sync_end_at=timeline.sync_end_at,
        async_end_at=timeline.async_end_at,
    )
    for c in timeline.channels:
        channel = message.channels.add(
            channel=c.channel, upstream_vertex=c.upstream_vertex, upstream_subtask=c.upstream_subtask
        )
        if c.barrier_at is not None:
            channel.barrier_at = c.barrier_at
    return message


def timeline_from_proto(message: jobmanager_pb2.CheckpointTimeline) -> SubtaskCheckpointTimeline:
    return SubtaskCheckpointTimeline(
        first_barrier_at=message.first_barrier_at,
        channels=tuple(
            ChannelBarrierTime(
                channel=c.channel,
                upstream_vertex=c.upstream_vertex,
                upstream_subtask=c.upstream_subtask,
                barrier_at=c.barrier_at if c.HasField("barrier_at") else None,
            )
            for c in message.channels
        ),
        alignment_end_at=message.alignment_end_at,
        sync_end_at=message.sync_end_at,
        async_end_at=message.async_end_at,
    )


def optional_timeline_from_proto(owner: object, field: str) -> SubtaskCheckpointTimeline | None:
    """The timeline in ``owner.field``, None when unset (a TaskManager that sends none)."""
    if not owner.HasField(field):  # type: ignore[attr-defined]
        return None
    return timeline_from_proto(getattr(owner, field))


def _decode(back: Mapping[Any, _V], value: int, enum_type: object, what: str) -> _V:
    """The domain value of a wire enum value; ProtocolError (the peer runs another version) if none."""
    found = back.get(value)
    if found is None:
        raise ProtocolError(
            f"{what} ({_enum_name(enum_type, value)}): the JobManager and this client run different versions"
        )
    return found


def _enum_name(enum_type: object, value: int) -> str:
    try:
        return str(enum_type.Name(value))  # type: ignore[attr-defined]
    except ValueError:
        return str(value)
